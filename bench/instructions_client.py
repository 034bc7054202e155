"""Send exactly N 512-byte JSON POSTs to /v1/payments on 4 keep-alive
connections and print what came back (bench/instructions.sh).

usage: instructions_client.py PORT KIND N PREFIX
KIND: A (no key), B (a new key per request), C (keys hot-000..099 in turn).
"""
import http.client
import json
import sys
import threading

port, kind, count, prefix = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
body = {"amount": 1000, "currency": "EUR", "pad": ""}
body["pad"] = "x" * (512 - len(json.dumps(body)))
BODY = json.dumps(body).encode()
CONNS = 4
seen = {}
lock = threading.Lock()


def worker(first):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for i in range(first, count, CONNS):
        headers = {"Content-Type": "application/json"}
        if kind == "B":
            headers["Idempotency-Key"] = f"{prefix}-{i:08d}"
        elif kind == "C":
            headers["Idempotency-Key"] = f"hot-{i % 100:03d}"
        conn.request("POST", "/v1/payments", body=BODY, headers=headers)
        reply = conn.getresponse()
        reply.read()
        replayed = reply.getheader("idempotent-replayed") == "true"
        with lock:
            seen[str(reply.status)] = seen.get(str(reply.status), 0) + 1
            seen["replayed"] = seen.get("replayed", 0) + replayed
    conn.close()


threads = [threading.Thread(target=worker, args=(t,)) for t in range(min(CONNS, count))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(seen, sort_keys=True))
# Every request answered 201; replays replayed (after the warm-up's first 100).
if seen.get("201") != count or (kind == "C" and prefix.startswith("run") and seen["replayed"] != count):
    sys.exit(f"unexpected answers: {seen}")
