"""The plain SQLite ceiling for a new key: an INSERT of an in-flight record
and the UPDATE that completes it, as two autocommit statements, on a file
with idemgate's settings (WAL journal, synchronous = FULL) and idemgate's
table (migrations/sqlite/0001_records.sql), by CLIENTS threads with a
connection each, for DURATION seconds. Prints pairs per second.

SQLite runs one writer at a time (the others wait in its busy handler), so
this is the rate of the commit path itself; idemgate's claim also reads the
record and takes a token in the same transaction.

    python3 bench/sqlite_ceiling.py FILE CLIENTS DURATION
"""

import os
import sqlite3
import sys
import threading
import time

path, clients, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
schema = open(os.path.join(os.path.dirname(__file__), "..", "migrations", "sqlite", "0001_records.sql")).read()
BODY = b'{"id":"pay_1","status":"succeeded"}'


def connect():
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


setup = connect()
if setup.execute("PRAGMA user_version").fetchone()[0] == 0:
    setup.executescript(schema)
    setup.execute("PRAGMA user_version = 1")
setup.close()

done = [0] * clients
run = f"{os.getpid()}-{time.time_ns()}"  # a file may be reused: keys of this run only
stop = time.monotonic() + duration


def client(i):
    conn = connect()
    n = 0
    while time.monotonic() < stop:
        key = f"ceil-{run}-{i}-{n}"
        now = int(time.time() * 1e6)
        conn.execute(
            "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, attempt,"
            " lease_until, expires_at, created_at, updated_at)"
            " VALUES ('ceiling', x'', ?, zeroblob(32), 'in_flight', ?, 1, ?, ?, ?, ?)",
            (key, n, now + 30_000_000, now + 86_400_000_000, now, now),
        )
        conn.execute(
            "UPDATE idemgate_records SET state = 'completed', status = 201, headers = x'', body = ?,"
            " lease_until = NULL, held_reason = NULL, updated_at = ?"
            " WHERE route = 'ceiling' AND scope = x'' AND key = ? AND token = ?",
            (BODY, now, key, n),
        )
        n += 1
    done[i] = n
    conn.close()


threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
started = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
print(int(sum(done) / (time.monotonic() - started)))
