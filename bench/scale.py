#!/usr/bin/env python3
"""Cost as records grow: new keys and replays at 0, 1 M, 10 M ... records
in PostgreSQL, then retention cycles at the top level, with retention by
generations (docs/src/design/retention.md).

Everything runs on a private PostgreSQL cluster started by this script with
production settings (autovacuum on, as the server ships it; shared_buffers
4 GB, max_wal_size 8 GB, every autovacuum logged), never on the machine's
shared server (autovacuum off there).

For each level, in ascending order:
1. Fill: rows are added by SQL on the server (one INSERT ... SELECT per
   500,000 rows) until the table holds the level: completed records with a
   512-byte body and about 140 bytes of headers, on the gateway's own route,
   laid out as a day of production leaves them: the older half expired, in
   the previous generation's partition; the newer half live, in the current
   one, expiring over the route's `RETENTION` (default 10m). Below
   `DISK_FLOOR_GB` (default 12) free on the cluster's disk the fill stops:
   the level is measured as reached, and the retention cycles are skipped.
2. Rounds: `ROUNDS` times, `SECONDS` of new keys (wrk -t2 -c32, a 512-byte
   JSON POST through the gateway to nginx, one new key per request), then
   `SECONDS` of replays of 20,000 keys that round created (replay cache off,
   so every replay reads the store). The gateway's generation is 24 h: no
   rotation runs during the levels. Per round: requests/s, p99, the table's
   size and dead rows (completions rewrite the row a claim inserted).

Then `CYCLES` retention cycles at the top level, once the levels' live rows
have expired, with the gateway restarted with a 30 s retention, a 40 s
generation and a 10 s sweep interval (a day compressed): each adds half the
level in rows the way the gateway writes them (a claim inserts the row in
flight, its completion rewrites it: one dead version per record), already
expired, into the current generation; then waits for the two rotations
that retire them, for autovacuum to be idle, measures one round and reads
the table's size. Retention holds if the size stays flat from cycle to
cycle.

With LEVEL_SETTLE=1, each level's rounds wait for autovacuum to be idle
after its fill (up to SETTLE_LIMIT s): the fill's inserts start passes
over the whole heap that records arriving over a day would not all at once.

Usage: LEVELS="0 1000000 10000000" ROUNDS=3 SECONDS=20 CYCLES=3 \
       CYCLE_ROWS=5000000 python3 bench/scale.py
(writes bench/results/<date>-scale.md; SCALE_DIR picks where the cluster's
files go, default /var/tmp). Needs about 0.6 GB of disk per million rows
(half of them live at once, 820 bytes of heap and 110 of indexes each), plus
max_wal_size.
Build first: cargo build --release --locked --bin idemgate.
"""

import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_bytes as rb  # noqa: E402  (free ports, the release binary)

LEVELS = [int(x) for x in os.environ.get("LEVELS", "0 1000000 10000000").split()]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECONDS = int(os.environ.get("SECONDS", "20"))
CYCLES = int(os.environ.get("CYCLES", "3"))
CYCLE_ROWS = int(os.environ.get("CYCLE_ROWS", "0"))  # rows per cycle; 0: half the top level
RETENTION = os.environ.get("RETENTION", "10m")  # the route's, during the levels
# The cycles' day, compressed: records kept 30 s (the shortest retention:
# the lease), a generation of 40 s.
CYCLE_STORE = 'generation = "40s"\nsweep_interval = "10s"\n'
CYCLE_RETENTION = "30s"
# Wait for autovacuum to be idle after each level's fill, before its rounds
# (the fill's own inserts start passes over the whole heap).
LEVEL_SETTLE = os.environ.get("LEVEL_SETTLE", "") == "1"
CHUNK = 500_000
SPAN = 10_000  # replayed keys per wrk thread
DISK_FLOOR = int(os.environ.get("DISK_FLOOR_GB", "12")) * 2**30  # the fill stops short of it
SETTINGS = {
    "shared_buffers": "4GB",
    "effective_cache_size": "12GB",
    "maintenance_work_mem": "1GB",
    "max_wal_size": "8GB",
    "log_autovacuum_min_duration": "0",
    "listen_addresses": "127.0.0.1",
}
POST_LUA = os.path.join(rb.ROOT, "bench", "post.lua")


def log(message):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


def tools():
    missing = [pkg for cmd, pkg in (("wrk", "wrk"), ("nginx", "nginx-light"))
               if shutil.which(cmd) is None]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq"] + missing, check=True,
                       stdout=subprocess.DEVNULL)


def as_postgres(args):
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--"] + args
    return subprocess.run(args, capture_output=True, text=True, check=True)


def pg_bin(tool):
    versions = sorted(os.listdir("/usr/lib/postgresql"), key=int)
    return f"/usr/lib/postgresql/{versions[-1]}/bin/{tool}"


class Cluster:
    """A private PostgreSQL cluster in `work`, with `settings` (`-c`
    options; by default [`SETTINGS`], production's). Also used by
    retention_cycles.py, with the server's defaults."""

    def __init__(self, work, settings=None):
        self.data = os.path.join(work, "pg")
        self.log = os.path.join(work, "pg.log")
        os.makedirs(self.data)
        if os.geteuid() == 0:
            shutil.chown(work, "postgres", "postgres")
            shutil.chown(self.data, "postgres", "postgres")
        as_postgres([pg_bin("initdb"), "-D", self.data, "-A", "trust", "-U", "postgres",
                     "--no-sync"])
        self.port = rb.free_port()
        settings = SETTINGS if settings is None else settings
        options = " ".join(f"-c {k}={v}" for k, v in settings.items())
        as_postgres([pg_bin("pg_ctl"), "-D", self.data, "-l", self.log, "-w",
                     "-o", f"-p {self.port} -k {work} {options}", "start"])
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def sql(self, query):
        return subprocess.run(["psql", self.url, "-XAtqc", query], capture_output=True,
                              text=True, check=True).stdout.strip()

    def stop(self):
        as_postgres([pg_bin("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"])

    def stats(self):
        # Both generations' partitions, summed.
        row = self.sql(
            "SELECT count(*), coalesce(sum(pg_relation_size(relid)), 0), "
            "coalesce(sum(pg_total_relation_size(relid) - pg_relation_size(relid) - "
            "pg_indexes_size(relid)), 0), coalesce(sum(pg_indexes_size(relid)), 0), "
            "coalesce(sum(n_live_tup), 0), coalesce(sum(n_dead_tup), 0), "
            "coalesce(sum(autovacuum_count), 0), coalesce(sum(autoanalyze_count), 0) "
            "FROM pg_stat_user_tables "
            "WHERE relname IN ('idemgate_records_0', 'idemgate_records_1')").split("|")
        if row[0] != "2":
            raise SystemExit(f"the records' two partitions are not there: {row}")
        row = row[1:]
        heap, toast, index, live, dead, vacuums, analyzes = (int(x) for x in row)
        return {"heap": heap, "toast": toast, "index": index, "live": live, "dead": dead,
                "autovacuums": vacuums, "autoanalyzes": analyzes}

    def current_slot(self):
        return int(self.sql("SELECT slot FROM idemgate_generation"))

    def rotation(self):
        """When the current generation began."""
        return self.sql("SELECT since FROM idemgate_generation")

    def count(self):
        return int(self.sql("SELECT count(*) FROM idemgate_records"))

    def vacuuming(self):
        return self.sql("SELECT count(*) FROM pg_stat_progress_vacuum") != "0"

    def autovacuum_lines(self):
        """One line per autovacuum of the records table: when, what it
        removed, and how long it took (from the server's log)."""
        with open(self.log, errors="replace") as f:
            text = f.read()
        runs = []
        for entry in re.split(r"\n(?=\d{4}-\d\d-\d\d )", text):
            if 'automatic vacuum of table "postgres.public.idemgate_records_' not in entry:
                continue
            when = entry[11:19]
            pages = re.search(r"pages: (.*)", entry)
            tuples = re.search(r"tuples: (\d+) removed, (\d+) remain", entry)
            elapsed = re.search(r"elapsed: ([\d.]+) s", entry)
            runs.append(f"{when}: {tuples.group(1) if tuples else '?'} dead rows removed, "
                        f"{tuples.group(2) if tuples else '?'} remain; "
                        f"{pages.group(1) if pages else ''}; "
                        f"{elapsed.group(1) if elapsed else '?'} s")
        return runs


# The headers a filled record carries: the gateway's encoding is not read
# back for them (their keys are never sent), only their size matters.
FILL = """
INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, lease_until,
                              expires_at, created_at, updated_at, status, headers, body, slot)
SELECT 'api', '\\x'::bytea, 'fill-' || i, sha256(convert_to(i::text, 'UTF8')), 'completed',
       i, NULL, {expires}, now(), now(), 201,
       convert_to(repeat('content-type: application/json; location: /v1/x/', 3), 'UTF8'),
       convert_to(repeat(md5(i::text), 16), 'UTF8'), {slot}
FROM generate_series({first}, {last}) AS i
"""


def free_disk(pg):
    return shutil.disk_usage(pg.data).free


def fill(pg, first, last, expires, slot):
    """Add rows `first`..`last` (inclusive) to generation `slot`, in chunks.
    Below `DISK_FLOOR` free bytes it stops, and returns the last row
    written."""
    for start in range(first, last + 1, CHUNK):
        if free_disk(pg) < DISK_FLOOR:
            log(f"stopping the fill at {start - 1:,} rows: "
                f"{free_disk(pg) / 2**30:.1f} GiB of disk left")
            return start - 1
        end = min(last, start + CHUNK - 1)
        pg.sql(FILL.format(first=start, last=end, expires=expires, slot=slot))
    return last


def fill_level(pg, have, level):
    """Fill the table from `have` filled rows to `level`: the older half of
    the new rows expired, in the previous generation; the newer half
    expiring over `RETENTION`, in the current one. Returns the rows filled
    (below `level` only if the disk ran out) and a note."""
    if level <= have:
        return have, ""
    started = time.monotonic()
    n = level - have
    middle = have + n // 2
    current = pg.current_slot()
    expired = f"now() - interval '1 hour' * ((i - {have + 1})::float8 / {n})"
    reached = fill(pg, have + 1, middle, expired, 1 - current)
    note = ""
    if reached < middle:
        note = " (the disk ran out before the middle)"
    else:
        live = (f"now() + interval '{RETENTION}' * "
                f"((i - {middle + 1})::float8 / {max(level - middle, 1)})")
        reached = fill(pg, middle + 1, level, live, current)
    log(f"filled {reached - have:,} rows in {time.monotonic() - started:.0f} s{note}")
    return reached, note


def cycle_rows(pg, first, last):
    """Rows written as the gateway writes them: claimed in flight (an
    INSERT into the current generation), then completed (an UPDATE of body,
    headers, expiry), already expired so that the rotations retire them.
    Stops short (returns False) below `DISK_FLOOR` free bytes."""
    for start in range(first, last + 1, 100_000):
        if free_disk(pg) < DISK_FLOOR:
            log(f"{free_disk(pg) / 2**30:.1f} GiB free: the retention cycles stop here")
            return False
        end = min(last, start + 99_999)
        pg.sql(
            "BEGIN; "
            "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, "
            "lease_until, expires_at, slot) "
            f"SELECT 'api', '\\x'::bytea, 'cycle-' || i, sha256(convert_to(i::text, 'UTF8')), "
            f"'in_flight', i, now() + interval '30 s', now() + interval '30 s', "
            "(SELECT slot FROM idemgate_generation) "
            f"FROM generate_series({start}, {end}) AS i; COMMIT; "
            "SET enable_seqscan = off; "
            "UPDATE idemgate_records SET state = 'completed', lease_until = NULL, status = 201, "
            "expires_at = now() - interval '1 s', updated_at = now(), "
            "headers = convert_to(repeat('content-type: application/json; location: /v1/x/', 3), 'UTF8'), "
            "body = convert_to(repeat(md5(g.i::text), 16), 'UTF8') "
            f"FROM generate_series({start}, {end}) AS g(i) "
            "WHERE route = 'api' AND scope = '\\x'::bytea AND key = 'cycle-' || g.i")
    return True


def start_nginx(work):
    port = rb.free_port()
    body = ('{"id":"pay_0000000000","status":"succeeded","pad":"' + "y" * 458 + '"}')
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx.err;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}; proxy_temp_path {work}; fastcgi_temp_path {work};
    uwsgi_temp_path {work}; scgi_temp_path {work};
    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type application/json;
            add_header Location /v1/payments/pay_0000000000;
            add_header X-Request-Id req_0123456789abcdef01234567;
            return 201 '{body}';
        }}
    }}
}}
""")
    subprocess.run(["nginx", "-c", conf, "-p", work], check=True)
    return port, os.path.join(work, "nginx.pid")


def start_gateway(work, store_url, upstream, retention, store_extra=""):
    port, admin = rb.free_port(), rb.free_port()
    config = os.path.join(work, "gateway.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:{admin}"\n'
                f'[store]\nurl = "{store_url}"\npool_size = 32\nreplay_cache_ttl = "0s"\n'
                f'{store_extra}'
                f'[[routes]]\nname = "api"\nmatch = "/*"\n'
                f'upstream = "http://127.0.0.1:{upstream}"\nretention = "{retention}"\n')
    env = dict(os.environ, RUST_LOG="warn")
    proc = subprocess.Popen([rb.BIN, "serve", "--config", config], env=env,
                            stderr=open(os.path.join(work, "gateway.log"), "a"))
    rb.wait_port(port, proc, "idemgate")
    # The port is bound before the store is open and migrated: ready is /readyz.
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200:
                return proc, port, admin
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit("idemgate exited")
        time.sleep(0.1)
    raise SystemExit("idemgate did not become ready")


def metric(text, pattern):
    match = re.search(r"^" + pattern + r" (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def scrape(admin):
    return urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()


def swept(admin):
    return metric(scrape(admin), "idemgate_records_swept_total")


def sweeper(admin):
    """Rows the sweeper deleted, its statements' seconds, and how many
    statements failed, so far."""
    text = scrape(admin)
    op = 'idemgate_store_duration_seconds_{}\\{{op="sweep",result="{}"\\}}'
    return (metric(text, "idemgate_records_swept_total"), metric(text, op.format("sum", "ok")),
            metric(text, op.format("count", "error")))


def wrk(port, mode, run, seconds):
    env = dict(os.environ, MODE=mode, RUN=run, SPAN=str(SPAN))
    out = subprocess.run(["wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", POST_LUA,
                          f"http://127.0.0.1:{port}/v1/payments"],
                         env=env, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+(\S+)", out).group(1))
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, to_ms(p99), int(errors.group(1)) if errors else 0


def to_ms(text):
    for unit, factor in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    raise ValueError(text)


def mib(n):
    return f"{n / 2**20:,.0f}"


def measure(pg, port, admin, label, rounds, rows):
    for r in range(1, rounds + 1):
        run = f"{re.sub('[^a-z0-9]', '', label)}-{r}-{time.time_ns()}"
        before, t0 = swept(admin), time.monotonic()
        new = wrk(port, "new", run, SECONDS)
        replay = wrk(port, "replay", run, SECONDS)
        rate = (swept(admin) - before) / (time.monotonic() - t0)
        s = pg.stats()
        rows.append((label, r, new, replay, rate, s, pg.vacuuming()))
        log(f"{label} round {r}: new {new[0]:,.0f}/s p99 {new[1]:.1f} ms ({new[2]} non-2xx); "
            f"replays {replay[0]:,.0f}/s p99 {replay[1]:.1f} ms ({replay[2]} non-2xx); "
            f"swept {rate:,.0f} rows/s; live {s['live']:,} dead {s['dead']:,}")


def settle(pg, limit=int(os.environ.get("SETTLE_LIMIT", "1800"))):
    """Wait until autovacuum is idle and the dead rows are below the count
    that starts it (50 + 20 % of the live rows at the server's defaults:
    what production leaves); returns the seconds waited, or None past
    `limit`."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        s = pg.stats()
        if not pg.vacuuming() and s["dead"] < 50 + s["live"] // 5:
            return time.monotonic() - started
        time.sleep(10)
    return None


def wait_expired(pg, limit=1800):
    """Wait until at most 10,000 rows are live (what one rotation moves);
    returns the seconds waited, or None past `limit`."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if int(pg.sql("SELECT count(*) FROM (SELECT 1 FROM idemgate_records "
                      "WHERE expires_at > now() LIMIT 10001) l")) <= 10_000:
            return time.monotonic() - started
        time.sleep(10)
    return None


def rotations(pg, n, limit=600):
    """Wait for `n` rotations of the generations; returns the seconds
    waited, or None past `limit`."""
    started, seen, since = time.monotonic(), 0, pg.rotation()
    while time.monotonic() - started < limit:
        now = pg.rotation()
        if now != since:
            seen, since = seen + 1, now
            if seen == n:
                return time.monotonic() - started
        time.sleep(2)
    return None


def main():
    if not os.path.exists(rb.BIN):
        raise SystemExit("build first: cargo build --release --locked --bin idemgate")
    tools()
    work = tempfile.mkdtemp(prefix="idemgate-scale-", dir=os.environ.get("SCALE_DIR", "/var/tmp"))
    os.chmod(work, 0o755)
    pg = Cluster(work)
    upstream, nginx_pid = start_nginx(work)
    gateway = None
    rows, sizes, cycles, sweeps = [], [], [], []
    try:
        gateway, port, admin = start_gateway(work, pg.url, upstream, RETENTION,
                                             'generation = "24h"\n')
        have = 0
        for level in LEVELS:
            started = time.monotonic()
            reached, waited = fill_level(pg, have, level)
            fill_s = time.monotonic() - started
            short = reached < level
            have = reached
            label = f"{reached:,}"
            sizes.append((label, "filled" + waited, fill_s, pg.stats()))
            if LEVEL_SETTLE and level:
                quiet = settle(pg)
                log(f"{label}: autovacuum idle after {quiet or 0:.0f} s"
                    if quiet is not None else f"{label}: autovacuum still busy; measuring")
                sizes.append((label, "autovacuum idle" if quiet is not None else "settle gave up",
                              quiet, pg.stats()))
            measure(pg, port, admin, label, ROUNDS, rows)
            sizes.append((label, "after the rounds", None, pg.stats()))
            sweeps.append((label, sweeper(admin)))
            if short:
                break
        top = have
        half = CYCLE_ROWS or max(top // 2, 100_000)
        cycles_run = 0 if short else CYCLES
        log(f"retention cycles: {cycles_run} x {half:,} rows"
            + (" (skipped: the fill ran out of disk)" if short else ""))
        if cycles_run:
            gateway.terminate()
            gateway.wait(30)
            gateway = None
            expired = wait_expired(pg)
            sizes.append((f"{top:,}", "the levels' rows expired", expired, pg.stats()))
            gateway, port, admin = start_gateway(work, pg.url, upstream, CYCLE_RETENTION,
                                                 CYCLE_STORE)
            sweeps.append(("the gateway restarted", None))
            waited = rotations(pg, 2)
            sizes.append((f"{top:,}", "after two rotations", waited, pg.stats()))
        for c in range(1, cycles_run + 1):
            started = time.monotonic()
            if not cycle_rows(pg, (c - 1) * half + 1, c * half):
                break
            written = time.monotonic() - started
            rotated = rotations(pg, 2)
            waited = settle(pg)
            s = pg.stats()
            cycles.append((c, half / written, rotated, waited, s))
            log(f"cycle {c}: wrote {half / written:,.0f} rows/s; retired after "
                f"{rotated if rotated is None else round(rotated)} s; heap {mib(s['heap'])} MiB, "
                f"indexes {mib(s['index'])} MiB")
            measure(pg, port, admin, f"cycle {c}", 1, rows)
            sweeps.append((f"cycle {c}", sweeper(admin)))
        autovacuums = pg.autovacuum_lines()
    finally:
        if gateway:
            gateway.terminate()
            gateway.wait(30)
        with open(nginx_pid) as f:
            os.kill(int(f.read().strip()), 15)
        pg.stop()
    report(rows, sizes, cycles, sweeps, autovacuums)
    shutil.rmtree(work, ignore_errors=True)


def table(title, columns, cells):
    """A markdown section: `title`, then a table of `columns` and `cells`."""
    lines = ["", f"## {title}", "", "| " + " | ".join(columns) + " |",
             "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in cells]


def report(rows, sizes, cycles, sweeps, autovacuums):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=rb.ROOT,
                            capture_output=True, text=True).stdout.strip()
    settings = ", ".join(f"{k} {v}" for k, v in SETTINGS.items() if k != "listen_addresses")
    lines = [
        f"# Records at scale: PostgreSQL — {datetime.date.today()}", "",
        f"Commit {commit}. `LEVELS=\"{' '.join(map(str, LEVELS))}\" ROUNDS={ROUNDS} "
        f"SECONDS={SECONDS} CYCLES={CYCLES} CYCLE_ROWS={CYCLE_ROWS} python3 bench/scale.py` (see its header for the "
        f"method). A private cluster, autovacuum on at its defaults; {settings}. "
        "2 cores shared by wrk (-t2 -c32), nginx, the gateway (RUST_LOG=warn, pool_size 32, "
        "replay cache off) and PostgreSQL.",
    ]
    lines += table("New keys and replays by level",
                   ["records", "round", "new keys/s", "p99 ms", "replays/s", "p99 ms",
                    "sweeper rows/s", "live", "dead", "autovacuum running"],
                   [[label, r, f"{new[0]:,.0f}", f"{new[1]:.1f}", f"{replay[0]:,.0f}",
                     f"{replay[1]:.1f}", f"{rate:,.0f}", f"{s['live']:,}", f"{s['dead']:,}",
                     "yes" if vacuuming else "no"]
                    for label, r, new, replay, rate, s, vacuuming in rows])
    lines += table("Table size",
                   ["records", "when", "seconds", "heap MiB", "TOAST MiB", "indexes MiB", "live",
                    "dead", "autovacuums"],
                   [[label, when, "" if secs is None else round(secs), mib(s["heap"]),
                     mib(s["toast"]), mib(s["index"]), f"{s['live']:,}", f"{s['dead']:,}",
                     s["autovacuums"]]
                    for label, when, secs, s in sizes])
    lines += table("Retention cycles",
                   ["cycle", "rows written/s", "two rotations after s", "settled after s",
                    "heap MiB", "indexes MiB", "live", "dead", "autovacuums"],
                   [[c, f"{rate:,.0f}", "not within the limit" if rotated is None else round(rotated),
                     "not within the limit" if waited is None else round(waited),
                     mib(s["heap"]), mib(s["index"]), f"{s['live']:,}", f"{s['dead']:,}",
                     s["autovacuums"]]
                    for c, rate, rotated, waited, s in cycles])
    lines += ["", "## The sweeper", "",
              "Its own metrics, from the start to the end of each level (fill and rounds) or cycle "
              "(they restart with the gateway before the cycles): records retired (estimated from "
              "the partition's statistics), the seconds its rotation checks took, and checks that "
              "failed.", "",
              "| until | records retired | seconds in checks | records/s while checking | failed checks |",
              "|---|---|---|---|---|"]
    before = (0.0, 0.0, 0.0)
    for label, now in sweeps:
        if now is None:  # a new gateway: its metrics start from zero
            before = (0.0, 0.0, 0.0)
            continue
        rows_, secs, failed = (a - b for a, b in zip(now, before))
        rate = f"{rows_ / secs:,.0f}" if secs > 0 else "—"
        lines.append(f"| {label} | {rows_:,.0f} | {secs:.1f} | {rate} | {failed:.0f} |")
        before = now
    lines += ["", f"## Autovacuum of the records table ({len(autovacuums)} runs logged)", ""]
    for line in autovacuums:
        lines.append(f"- {line}")
    lines.append("")
    out = os.environ.get("RESULTS") or os.path.join(
        rb.ROOT, "bench", "results", f"{datetime.date.today()}-scale.md")
    with open(out, "w") as f:
        f.write("\n".join(lines))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
