#!/usr/bin/env python3
"""Table and file size over retention cycles: does retention reuse room?

Each cycle sends N new keys through the release gateway (512-byte JSON
requests, answered 201 with a 512-byte JSON body by a small upstream), then
waits until the sweeper has deleted them (`retention` short, the sweeper
every second), and reads the store's size. With DELETE-based retention the
room of deleted rows must be reused by the next cycle's rows, so the size
after cycle 3 should equal the size after cycle 1.

- PostgreSQL: a private cluster started by this script with the server's
  defaults (autovacuum on, unlike the machine's shared server), so what
  autovacuum does counts: records table size (heap, TOAST, indexes), dead
  rows and autovacuum runs after each cycle.
- SQLite: the database file and its log after each cycle.

Usage: python3 bench/retention_cycles.py [N] [CYCLES]  (defaults 50000 and
3; writes bench/results/<date>-retention-cycles.md). Build first:
cargo build --release --locked --bin idemgate.
"""

import datetime
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_bytes as rb  # noqa: E402  (the gateway, upstream and load helpers)
import scale  # noqa: E402  (the private PostgreSQL cluster)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
CYCLES = int(sys.argv[2]) if len(sys.argv) > 2 else 3
RETENTION = "10s"
rb.N = N


def gateway(store_url, upstream_port, work):
    """rb.gateway with a short retention and a sweeper every second."""
    sweeper = 'sweep_interval = "1s"\nsweep_batch = 1000\n'
    return rb.gateway(store_url, upstream_port, work, store_extra=sweeper, retention=RETENTION)


def cycles(store_url, upstream, work, remaining, measure):
    proc, port = gateway(store_url, upstream, work)
    rows = []
    try:
        for cycle in range(1, CYCLES + 1):
            started = time.monotonic()
            rb.load(port, f"c{cycle}")
            loaded = time.monotonic() - started
            deadline = time.monotonic() + 300
            while remaining() > 0:
                if time.monotonic() > deadline:
                    raise SystemExit(f"cycle {cycle}: records not swept within 300 s")
                time.sleep(1)
            rows.append((cycle, N / loaded, measure()))
            print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def postgres(upstream, work):
    # The server's defaults (autovacuum on), listening on loopback.
    pg = scale.Cluster(work, {"listen_addresses": "127.0.0.1"})
    sql = pg.sql

    def remaining():
        return int(sql("SELECT count(*) FROM idemgate_records"))

    def measure():
        total, heap, index, dead, autovacuums = sql(
            "SELECT pg_total_relation_size(relid), pg_relation_size(relid), "
            "pg_indexes_size(relid), n_dead_tup, autovacuum_count "
            "FROM pg_stat_user_tables WHERE relname = 'idemgate_records'").split("|")
        return (f"records table {int(total) / 2**20:.1f} MiB (heap {int(heap) / 2**20:.1f}, "
                f"indexes {int(index) / 2**20:.1f}); dead rows {int(dead):,}; "
                f"autovacuum runs so far {autovacuums}")

    try:
        return cycles(pg.url, upstream, work, remaining, measure)
    finally:
        pg.stop()


def sqlite(upstream, work):
    path = os.path.join(work, "cycles.db")
    url = f"sqlite://{path}"

    def remaining():
        out = subprocess.run(["python3", "-c", (
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=30); "
            "print(c.execute('SELECT count(*) FROM idemgate_records').fetchone()[0])"), path],
            capture_output=True, text=True, check=True).stdout
        return int(out)

    def measure():
        size = os.path.getsize(path)
        wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        return f"file {size / 2**20:.1f} MiB, log {wal / 2**20:.1f} MiB"

    return cycles(url, upstream, work, remaining, measure)


def main():
    if not os.path.exists(rb.BIN):
        raise SystemExit("build first: cargo build --release --locked --bin idemgate")
    upstream = rb.start_upstream().server_address[1]
    results = {}
    for name, run in (("PostgreSQL (private cluster, autovacuum on)", postgres),
                      ("SQLite", sqlite)):
        with tempfile.TemporaryDirectory(prefix="idemgate-cycles-") as work:
            results[name] = run(upstream, work)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=rb.ROOT,
                            capture_output=True, text=True).stdout.strip()
    lines = [f"# Retention cycles — {datetime.date.today()}", "",
             f"Commit {commit}. `python3 bench/retention_cycles.py {N} {CYCLES}`: each cycle sends "
             f"{N:,} new keys through the release gateway (512-byte requests and recorded bodies, "
             f"retention {RETENTION}, the sweeper every second, 1,000 rows per DELETE), then waits "
             "until the sweeper has deleted them all, and reads the store's size.", ""]
    for name, rows in results.items():
        lines += [f"## {name}", "", "| cycle | new keys/s | after the sweep |", "|---|---|---|"]
        lines += [f"| {c} | {rate:,.0f} | {what} |" for c, rate, what in rows]
        lines.append("")
    out = os.path.join(rb.ROOT, "bench", "results", f"{datetime.date.today()}-retention-cycles.md")
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
