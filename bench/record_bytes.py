#!/usr/bin/env python3
"""Bytes per record on each shared store: what a completed key costs.

Puts the release gateway in front of a small upstream that answers every
POST 201 with a JSON body of about 512 bytes and typical headers
(Content-Type, Location, X-Request-Id), sends N new keys (each a JSON
request of about 512 bytes),
and reads what the store grew by:

- Redis (a private redis-server, no persistence): INFO memory's
  used_memory before and after (the record's hash, its key and its entries
  in the keyspace and expiry tables), and MEMORY USAGE ... SAMPLES 0 of one
  record key (the hash and its key only);
- PostgreSQL (a fresh database on the server bench/run.sh uses):
  pg_total_relation_size of idemgate_records (heap, TOAST and indexes),
  and its heap and index shares;
- SQLite (a fresh file): the database file after the gateway stopped
  (it checkpoints the log at a graceful stop).

Each store is measured for every case in CASES (default
"pad:plain payment:plain payment:sealed"): the answer, `pad` (the
508-byte body above, mostly one repeated letter) or `payment` (the sealing tests'
PaymentIntent, about 2 KiB of real-world shaped JSON,
crates/store/src/seal/fixture.rs), and the records, `plain` or `sealed`
(`[store] encryption_keys` set: compressed with the default codec, then
sealed), or `lz4` or `zstd` (sealed, `[store] compression` set to it).

Usage: python3 bench/record_bytes.py [N]   (default 20000; writes
bench/results/<date>-record-bytes.md, or OUT: another name there). Build
first: cargo build --release --locked --bin idemgate (BIN: another binary).
"""

import base64
import datetime
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("BIN", os.path.join(ROOT, "target", "release", "idemgate"))
PG = os.environ.get("IDEMGATE_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
BODY = json.dumps({"amount": 1000, "currency": "eur", "note": "x" * 470}).encode()
ANSWERS = {
    "pad": json.dumps({"id": "pay_0000000000", "status": "succeeded", "pad": "y" * 450}).encode()[:512],
}
with open(os.path.join(ROOT, "crates", "store", "src", "seal", "fixture.rs")) as _f:
    _fixture = _f.read()
ANSWERS["payment"] = (_fixture[_fixture.index('r#"') + 3:_fixture.index('"#;')]
                      .replace("{marker}", "bench").encode())
CASES = [tuple(c.split(":")) for c in
         os.environ.get("CASES", "pad:plain payment:plain payment:sealed").split()]
# The answer of the case being measured (the upstream reads it per request).
ANSWER = [ANSWERS["pad"]]
# A record key for the sealed cases, made for the run.
SEAL_KEY = base64.b64encode(os.urandom(32)).decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Location", "/v1/payments/pay_0000000000")
        self.send_header("X-Request-Id", "req_0123456789abcdef01234567")
        self.send_header("Content-Length", str(len(ANSWER[0])))
        self.end_headers()
        self.wfile.write(ANSWER[0])

    def log_message(self, *args):
        pass


def start_upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_port(port, proc, what):
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


def gateway(store_url, upstream_port, work, store_extra="", retention="24h"):
    """The release gateway on `store_url` in front of the upstream; the
    `[store]` lines `store_extra` added, and the route's `retention`."""
    port = free_port()
    config = os.path.join(work, "gateway.toml")
    with open(config, "w") as f:
        f.write(
            f'listen = "127.0.0.1:{port}"\n'
            f'admin_listen = "127.0.0.1:{free_port()}"\n'
            f'[store]\nurl = "{store_url}"\nprefix = "bytes:"\nreplay_cache_ttl = "0s"\n'
            f'{store_extra}'
            f'[[routes]]\nname = "payments"\nmatch = "/*"\nlease = "5s"\n'
            f'upstream = "http://127.0.0.1:{upstream_port}"\nretention = "{retention}"\n'
        )
    env = dict(os.environ, RUST_LOG="warn")
    proc = subprocess.Popen([BIN, "serve", "--config", config], env=env,
                            stderr=open(os.path.join(work, "gateway.log"), "a"))
    wait_port(port, proc, "idemgate")
    return proc, port


def load(port, run):
    def send(keys):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in keys:
            conn.request("POST", "/v1/payments", BODY, {
                "Idempotency-Key": f"{run}-{i:08d}-0123456789abcdef",
                "Content-Type": "application/json",
            })
            response = conn.getresponse()
            response.read()
            if response.status != 201:
                raise SystemExit(f"key {i}: {response.status}")
        conn.close()

    chunks = [range(k, N, 8) for k in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, chunks))


def stop(proc):
    proc.terminate()
    proc.wait(30)


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, check=True).stdout


def used_memory(port):
    info = redis_cli(port, "INFO", "memory")
    return int(next(l.split(":")[1] for l in info.splitlines() if l.startswith("used_memory:")))


def store_lines(records):
    """The `[store]` lines of a case's records."""
    if records == "plain":
        return ""
    keys = f'encryption_keys = ["b1:{SEAL_KEY}"]\n'
    if records == "sealed":
        return keys
    if records in ("lz4", "zstd"):
        return keys + f'compression = "{records}"\n'
    raise SystemExit(f"records: plain, sealed, lz4 or zstd, not {records!r}")


def measure_redis(upstream, work, records):
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", work],
                              stdout=subprocess.DEVNULL)
    wait_port(port, server, "redis-server")
    try:
        proc, gw = gateway(f"redis://127.0.0.1:{port}/", upstream, work, store_lines(records))
        before = used_memory(port)
        load(gw, "redis")
        stop(proc)
        after = used_memory(port)
        key = redis_cli(port, "--scan", "--pattern", "bytes:rec:*").split()[0]
        one = int(redis_cli(port, "MEMORY", "USAGE", key, "SAMPLES", "0").strip())
        keys = int(redis_cli(port, "DBSIZE").strip())
        return {"store": "Redis", "per_record": (after - before) / N,
                "detail": f"used_memory +{after - before:,} B for {N:,} records ({keys:,} keys); "
                          f"MEMORY USAGE of one record key: {one} B"}
    finally:
        server.kill()


def psql(db, sql):
    return subprocess.run(["psql", f"{PG}/{db}", "-XAtqc", sql], capture_output=True,
                          text=True, check=True).stdout.strip()


def measure_postgres(upstream, work, records):
    db = f"record_bytes_{os.getpid()}"
    psql("postgres", f"DROP DATABASE IF EXISTS {db}")
    psql("postgres", f"CREATE DATABASE {db}")
    try:
        proc, gw = gateway(f"{PG}/{db}", upstream, work, store_lines(records))
        load(gw, "pg")
        stop(proc)
        rows = int(psql(db, "SELECT count(*) FROM idemgate_records"))
        # The records live in one partition per generation (migration 0012).
        total, heap, index, dead = (int(v) for v in psql(
            db, "SELECT sum(pg_total_relation_size(t.relid)), sum(pg_relation_size(t.relid)), "
                "sum(pg_indexes_size(t.relid)), coalesce(sum(s.n_dead_tup), 0) "
                "FROM pg_partition_tree('idemgate_records') t "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid WHERE t.isleaf").split("|"))
        return {"store": "PostgreSQL", "per_record": total / rows,
                "detail": f"idemgate_records {total:,} B for {rows:,} rows: heap {heap / rows:.0f} B, "
                          f"indexes {index / rows:.0f} B, TOAST and maps the rest; {dead:,} dead row "
                          "versions (a completion leaves its claim's) not vacuumed yet"}
    finally:
        psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def measure_sqlite(upstream, work, records):
    path = os.path.join(work, "bytes.db")
    proc, gw = gateway(f"sqlite://{path}", upstream, work, store_lines(records))
    load(gw, "sqlite")
    stop(proc)
    size = os.path.getsize(path)
    wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
    return {"store": "SQLite", "per_record": (size + wal) / N,
            "detail": f"file {size:,} B and log {wal:,} B after a graceful stop"}


def main():
    if not os.path.exists(BIN):
        raise SystemExit("build first: cargo build --release --locked --bin idemgate")
    upstream = start_upstream()
    rows = []
    for answer, records in CASES:
        ANSWER[0] = ANSWERS[answer]
        for measure in (measure_redis, measure_postgres, measure_sqlite):
            with tempfile.TemporaryDirectory(prefix="idemgate-bytes-") as work:
                row = measure(upstream.server_address[1], work, records)
                row["case"] = f"{answer}, {records}"
                rows.append(row)
                print(rows[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    lines = [f"# Bytes per record — {datetime.date.today()}", "",
             f"Commit {commit}. `python3 bench/record_bytes.py {N}`: {N:,} new keys through the release "
             "gateway for each store and case, each a JSON request of about 512 bytes answered 201 with "
             "Content-Type, Location and X-Request-Id headers and a JSON body: `pad`, "
             f"{len(ANSWERS['pad'])} bytes, mostly one repeated letter; `payment`, the sealing tests' "
             f"PaymentIntent, {len(ANSWERS['payment']):,} bytes of real-world shaped JSON. Records "
             "`plain`, `sealed` (`[store] encryption_keys`: compressed with the default codec, then "
             "sealed), or `lz4` or `zstd` (sealed, `[store] compression` set to it). "
             f"Cases: `CASES=\"{' '.join(':'.join(c) for c in CASES)}\"`.", "",
             "| store | case | bytes per record | how it was read |", "|---|---|---|---|"]
    lines += [f"| {r['store']} | {r['case']} | {r['per_record']:,.0f} | {r['detail']} |" for r in rows]
    name = os.environ.get("OUT", f"{datetime.date.today()}-record-bytes.md")
    out = os.path.join(ROOT, "bench", "results", name)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
