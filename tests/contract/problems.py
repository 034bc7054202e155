"""The proxy's problem answers against the OpenAPI document's schemas.

Run by tests/contract/schemathesis.sh with the venv's python (it has
jsonschema_rs, a schemathesis dependency):

    problems.py DOCUMENT PROXY_URL ADMIN_URL TOKEN

Sends requests that the proxy answers itself (no route, missing key,
reused key, unreachable upstream), and one `keys show --json` for the
record it seeded, and validates each body against the document
(`ProxyProblem`, `RecordInfo`); with controls: a body altered to carry
the wrong status for its type, or a refusal's without its `expires`, must
not validate.
"""

import json
import sys
import urllib.error
import urllib.request

import jsonschema_rs

document_path, proxy, admin, token = sys.argv[1:5]
document = json.load(open(document_path))


def validator(name):
    schema = dict(document)
    schema["$ref"] = f"#/components/schemas/{name}"
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


def send(url, method="GET", body=None, headers=None):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers, refused.read()


problem = validator("ProxyProblem")
failures = []
keyed = {"Idempotency-Key": "order-1", "Content-Type": "application/json"}
cases = [
    ("no-route", send(f"{proxy}/nowhere")),
    ("missing-key", send(f"{proxy}/v1/payments/x", "POST", b"{}")),
    ("key-reused", send(f"{proxy}/v1/payments/x", "POST", b'{"amount": 2}', keyed)),
    ("upstream-unreachable", send(f"{proxy}/v1/down/x", "POST", b"{}", {"Idempotency-Key": "d-1"})),
]
for slug, (status, headers, body) in cases:
    kind = headers.get("Content-Type")
    if kind != "application/problem+json":
        failures.append(f"{slug}: content type {kind}")
        continue
    value = json.loads(body)
    errors = [e.message for e in problem.iter_errors(value)]
    if errors or value.get("type") != f"urn:idemgate:problem:{slug}" or value["status"] != status:
        failures.append(f"{slug}: {status} {value} does not match ProxyProblem: {errors[:3]}")
    print(f"contract: proxy problem {slug} ({status}) matches ProxyProblem")
    # The control: the same body with another type's status must not validate.
    wrong = dict(value, status=418 if status != 418 else 400)
    if problem.is_valid(wrong):
        failures.append(f"control: {slug} with status {wrong['status']} validated")
    if "expires" in value:
        # A refusal about a record says when it expires, in the header too;
        # the control: without the member it must not validate.
        if not headers.get("Idempotency-Expires"):
            failures.append(f"{slug}: expires {value['expires']} but no Idempotency-Expires")
        bare = {k: v for k, v in value.items() if k != "expires"}
        if problem.is_valid(bare):
            failures.append(f"control: {slug} without expires validated")
        print(f"contract: proxy problem {slug} says its record expires {value['expires']}")

status, headers, body = send(
    f"{admin}/keys",
    "POST",
    json.dumps({"show": {"route": "payments", "key": "order-1", "json": True}}).encode(),
    {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
)
if status != 200 or headers.get("Content-Type") != "application/json":
    failures.append(f"keys show --json: {status} {headers.get('Content-Type')} {body[:200]!r}")
else:
    errors = [e.message for e in validator("RecordInfo").iter_errors(json.loads(body))]
    if errors:
        failures.append(f"keys show --json does not match RecordInfo: {errors[:3]}")
    print("contract: keys show --json matches RecordInfo")

for failure in failures:
    print(f"contract: FAILED: {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
