#!/usr/bin/env bash
# The admin API's contract, checked against the running gateway: start the
# real `idemgate` (debug build, memory:// store, an admin token, one route)
# on free loopback ports and run schemathesis against the OpenAPI document
# it serves (GET /openapi.json, docs/src/reference/openapi.json):
#
#   1. with the token (tests/contract/schemathesis.toml): every operation,
#      positive and negative (schema-violating) data, --checks all;
#   2. without it: the same, every guarded operation must refuse (401);
#   3. against a gateway with no admin_token: the guarded ones answer 403.
#   4. the negative controls: a copy of the document with one answer
#      altered on purpose (POST /keys documents 402 where the gateway says
#      401; problems said to require an `instance` member) must make
#      schemathesis fail; this script fails if either passes.
#
#   bash tests/contract/schemathesis.sh
#
# Before them, tests/contract/problems.py checks proxy problem answers
# (no-route, missing-key, key-reused, upstream-unreachable) and a record's
# JSON against the document's ProxyProblem and RecordInfo, with a control.
#
# Python: a venv with schemathesis $PIN, kept under
# $IDEMGATE_CONTRACT_VENV (default ~/.cache/idemgate-contract/venv-$PIN),
# so repeated runs install nothing. Needs python3 with venv (CI installs
# python3-venv when missing) and the PyPI registry on the first run.
# SCHEMATHESIS_EXAMPLES (default 40) bounds the cases per operation and
# phase; SCHEMATHESIS_SEED (default 20241129) makes runs repeatable.
set -euo pipefail

PIN=4.32.5
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
venv=${IDEMGATE_CONTRACT_VENV:-$HOME/.cache/idemgate-contract/venv-$PIN}
examples=${SCHEMATHESIS_EXAMPLES:-40}
seed=${SCHEMATHESIS_SEED:-20241129}
token=contract-admin-token-0123456789
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
say() { printf 'contract: %s\n' "$*"; }
die() { printf 'contract: FAILED: %s\n' "$*" >&2; exit 1; }

# --- schemathesis, once
if ! "$venv/bin/st" --version 2>/dev/null | grep -q "$PIN"; then
    say "installing schemathesis $PIN into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" || die "python3 -m venv failed (apt-get install python3-venv)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$PIN" \
        || die "pip install schemathesis==$PIN failed"
fi
say "$("$venv/bin/st" --version)"

# --- the gateway, and the demo upstream behind it
say "building idemgate and demo_upstream"
cargo build --locked --quiet --bin idemgate --bin demo_upstream
bin="${CARGO_TARGET_DIR:-$root/target}/debug/idemgate"
[ -x "$bin" ] || die "no binary at $bin"
upstream_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${bin%/*}/demo_upstream" --listen "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=("$!")

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME TOKEN: a gateway on free ports (retried if a port was taken
# meanwhile) with a route to the demo upstream and one to a closed port;
# sets $admin and $proxy to its addresses.
start() {
    local name=$1 admin_token=$2 dir="$work/$1"
    mkdir -p "$dir"
    for _ in 1 2 3 4 5; do
        local port admin_port
        port=$(free_port)
        admin_port=$(free_port)
        cat >"$dir/gateway.toml" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin_port"
admin_token = "$admin_token"
log_format = "json"

[store]
url = "memory://"

[[routes]]
name = "payments"
match = "/v1/payments/*"
upstream = "http://127.0.0.1:$upstream_port"

[[routes]]
name = "down"
match = "/v1/down/*"
upstream = "http://127.0.0.1:9"
TOML
        "$bin" --config "$dir/gateway.toml" serve >"$dir/log" 2>&1 &
        local pid=$!
        for _ in $(seq 1 100); do
            if curl -fsS "http://127.0.0.1:$admin_port/healthz" >/dev/null 2>&1; then
                pids+=("$pid")
                admin="127.0.0.1:$admin_port"
                proxy="127.0.0.1:$port"
                say "$name gateway up, admin listener at $admin"
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    cat "$dir/log" >&2
    die "the $name gateway did not start"
}

# run LABEL CONFIG LOCATION [ARGS…]: one schemathesis run; its output in
# $work/LABEL.out; returns its exit status.
run() {
    local label=$1 config=$2 location=$3
    shift 3
    say "schemathesis: $label"
    local started=$SECONDS status=0
    # In $work: schemathesis keeps a cache of failures (.schemathesis/)
    # in its working directory, and a run must not inherit another's.
    mkdir -p "$work/$label"
    (cd "$work/$label" && IDEMGATE_ADMIN_TOKEN=$token "$venv/bin/st" --config-file "$config" \
        run "$location" --checks all --mode all --max-examples "$examples" --seed "$seed" \
        --generation-database none --no-color --output-truncate true \
        "$@") >"$work/$label.out" 2>&1 || status=$?
    say "$label: exit $status after $((SECONDS - started)) s"
    sed -n '/^Test cases:/,/^$/p' "$work/$label.out" | sed 's/^/    /' 
    return "$status"
}

with_token="$root/tests/contract/schemathesis.toml"
no_auth="$work/no-auth.toml"
printf '# no auth: the default expected statuses\n' >"$no_auth"

start tokened "$token"
tokened=$admin
# A record for the examples' key (order-1): show, list and delete meet it.
curl -fsS -o /dev/null -X POST -H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \
    -d '{"amount": 1}' "http://$proxy/v1/payments/x" || die "the seeding request failed"
"$venv/bin/python" tests/contract/problems.py docs/src/reference/openapi.json \
    "http://$proxy" "http://$tokened" "$token" || die "the proxy's problems disagree with the document"
start untokened ""
untokened=$admin

# The guarded operations refuse a caller without the token, or with a wrong
# one, whatever schemathesis makes of them (its run without a token would
# pass a gateway that let everyone in: 200 is documented too).
for path in /keys /config/reload; do
    for auth in "" "Authorization: Bearer wrong-token"; do
        status=$(curl -sS -o /dev/null -w '%{http_code}' -X POST ${auth:+-H "$auth"} \
            -H 'Content-Type: application/json' -d '{"command": "list"}' "http://$tokened$path")
        [ "$status" = 401 ] || die "POST $path ${auth:-without a token} answered $status, not 401"
    done
done
say "the guarded operations refuse a missing or wrong token (401)"

failed=()
run with-token "$with_token" "http://$tokened/openapi.json" || failed+=(with-token)
run without-token "$no_auth" "http://$tokened/openapi.json" || failed+=(without-token)
# With no admin_token the guarded operations are off for everyone: 403
# whether or not a token is sent (sending one would not help, so not 401),
# which missing_required_header (it wants 401 for a missing Authorization)
# does not allow for.
run admin-off "$no_auth" "http://$untokened/openapi.json" \
    --exclude-checks missing_required_header || failed+=(admin-off)
for label in "${failed[@]}"; do
    cat "$work/$label.out" >&2
done
[ "${#failed[@]}" -eq 0 ] || die "schemathesis found the gateway and its document disagree: ${failed[*]}"

# --- the negative controls: one answer documented wrongly, each way
# control EDIT EXPECTED: the token run against a copy of the document
# altered by the python statement EDIT (on `doc`) must fail, on EXPECTED.
control() {
    local label=$1 edit=$2 expected=$3
    python3 -c "import json, sys
doc = json.load(open(sys.argv[1]))
$edit
json.dump(doc, open(sys.argv[2], 'w'))" docs/src/reference/openapi.json "$work/$label.json"
    if run "$label" "$with_token" "$work/$label.json" --url "http://$tokened"; then
        cat "$work/$label.out" >&2
        die "control $label passed: a document that misstates an answer went unnoticed"
    fi
    grep -q "$expected" "$work/$label.out" || {
        cat "$work/$label.out" >&2
        die "control $label failed, but not with '$expected'"
    }
    say "control $label flagged ($expected), as it must"
}
# A status: POST /keys documents 402 where the gateway says 401.
control control-status \
    'r = doc["paths"]["/keys"]["post"]["responses"]; r["402"] = r.pop("401")' \
    "Undocumented status code"
# A required member: admin problems said to carry `instance` too.
control control-schema \
    'doc["components"]["schemas"]["Problem"]["required"].append("instance")' \
    "Response violates schema"
say "all passed"
