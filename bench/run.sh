#!/usr/bin/env bash
# idemgate benchmark: one command on a fresh machine of this kind.
#
#   bash bench/run.sh                      # full matrix: c = 8 32 64, 3 repeats, 5 s each
#   CONCURRENCY="32" REPEATS=1 bash bench/run.sh   # a quick look
#
# Installs wrk and nginx-light from apt if missing, starts its own throwaway
# PostgreSQL (initdb, free port) and Redis (free port) and two nginx servers
# (a static 201 upstream, and a plain proxy_pass in front of it), builds
# idemgate in release mode, and measures, on one fixed 512-byte JSON POST:
#   A  pass-through (no key): direct vs nginx proxy_pass vs idemgate
#   B  a new key per request: idemgate on PostgreSQL, on Redis, on SQLite
#   C  replays of a hot set of 100 completed keys: PostgreSQL, Redis, SQLite
#   D  same-key storms: 2, 8, 32 and 64 requests per key (at c = 64)
#   ceilings: pgbench running idemgate's own claim + complete statements and
#   its replay claim; redis-benchmark running idemgate's own claim, complete
#   and replay (claim on a completed record) scripts; plain SQLite INSERT +
#   UPDATE pairs in autocommit on idemgate's table and settings
#   (bench/sqlite_ceiling.py)
# Writes bench/results/<date>.md with medians (min–max) and the ratios.
# idemgate runs with RUST_LOG=warn (no per-request log line); see the results.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DURATION="${DURATION:-5}"
REPEATS="${REPEATS:-3}"
CONCURRENCY="${CONCURRENCY:-8 32 64}"
HOT=100
STORMS="${STORMS:-2 8 32 64}"
RESULTS="${RESULTS:-bench/results/$(date -u +%Y-%m-%d).md}"

log() { printf '==> %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---- tools ---------------------------------------------------------------------
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
PGBIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"

WORK="$(mktemp -d /tmp/idemgate-bench.XXXXXX)"
chmod 755 "$WORK"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    [ -d "$WORK/pg" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---- services ------------------------------------------------------------------
log "building idemgate (release)"
cargo build --release --locked --quiet
BIN="$PWD/target/release/idemgate"

PGPORT="$(free_port)"
log "PostgreSQL on 127.0.0.1:$PGPORT"
mkdir "$WORK/pg" && chown postgres:postgres "$WORK/pg"
runuser -u postgres -- "$PGBIN/initdb" -D "$WORK/pg" -A trust -U postgres >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/log" -w \
    -o "-p $PGPORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=256MB" start >/dev/null
PGURL="postgres://postgres@127.0.0.1:$PGPORT/postgres"

REDISPORT="$(free_port)"
log "Redis on 127.0.0.1:$REDISPORT"
redis-server --port "$REDISPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/dev/null &
PIDS+=($!)

UP="$(free_port)"; NGX="$(free_port)"
log "nginx upstream on :$UP, nginx proxy on :$NGX"
cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK; proxy_temp_path $WORK; fastcgi_temp_path $WORK; uwsgi_temp_path $WORK; scgi_temp_path $WORK;
    server {
        listen 127.0.0.1:$UP;
        location / { default_type application/json; return 201 '{"id":"pay_1","status":"succeeded"}'; }
    }
    upstream up { server 127.0.0.1:$UP; keepalive 64; }
    server {
        listen 127.0.0.1:$NGX;
        location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
EOF
nginx -c "$WORK/nginx.conf" -p "$WORK"

start_gateway() { # name store_url -> sets GW_PORT, GW_PID
    local name="$1" url="$2" admin
    GW_PORT="$(free_port)"; admin="$(free_port)"
    cat > "$WORK/$name.toml" <<EOF
listen = "127.0.0.1:$GW_PORT"
admin_listen = "127.0.0.1:$admin"
[store]
url = "$url"
prefix = "bench:"
pool_size = 32
[[routes]]
name = "api"
match = "/*"
upstream = "http://127.0.0.1:$UP"
key_required = false
EOF
    RUST_LOG=warn "$BIN" serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" &
    GW_PID=$!
    PIDS+=("$GW_PID")
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "gateway $name did not become ready"; cat "$WORK/$name.log" >&2; exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wrk once: prints "rps p50_ms p99_ms non2xx requests"
wrk_once() { # port mode conns
    local out
    out="$(MODE="$2" HOT="$HOT" STORM="${STORM:-64}" RUN="r$RANDOM$RANDOM" wrk -t2 -c"$3" -d"${DURATION}s" --latency \
        -s bench/post.lua "http://127.0.0.1:$1/v1/payments")"
    python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
def ms(label):
    m = re.search(r"^\s*%s\s+([\d.]+)(us|ms|s)\s*$" % label, out, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
reqs = int(re.search(r"(\d+) requests in", out).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
print(f"{rps:.0f} {ms('50%'):.3f} {ms('99%'):.3f} {non2xx.group(1) if non2xx else 0} {reqs}")
PY
}

# measure NAME PORT MODE [PID]: REPEATS runs at each concurrency (or at
# $ONLY_C); appends "NAME c rps p50 p99 non2xx cpu_us_per_req" lines to $WORK/raw
measure() {
    local name="$1" port="$2" mode="$3" pid="${4:-}" c i before after line
    for c in ${ONLY_C:-$CONCURRENCY}; do
        for i in $(seq 1 "$REPEATS"); do
            [ -n "$pid" ] && before="$(cpu_ticks "$pid")"
            line="$(wrk_once "$port" "$mode" "$c")"
            local cpu="-"
            if [ -n "$pid" ]; then
                after="$(cpu_ticks "$pid")"
                cpu="$(python3 -c "import os,sys; t=($after-$before)/os.sysconf('SC_CLK_TCK'); r=int(sys.argv[1]); print(f'{t*1e6/max(r,1):.1f}')" "$(echo "$line" | awk '{print $5}')")"
            fi
            echo "$name $c $(echo "$line" | awk '{print $1, $2, $3, $4}') $cpu" >> "$WORK/raw"
            log "$name c=$c #$i: $line cpu_us/req=$cpu"
        done
    done
}

: > "$WORK/raw"

# ---- A: pass-through ------------------------------------------------------------
start_gateway pg "$PGURL"; PG_PORT="$GW_PORT"; PG_PID="$GW_PID"
start_gateway redis "redis://127.0.0.1:$REDISPORT/"; RD_PORT="$GW_PORT"; RD_PID="$GW_PID"
start_gateway sqlite "sqlite://$WORK/idemgate.db"; SQ_PORT="$GW_PORT"; SQ_PID="$GW_PID"
measure A-direct "$UP" none
measure A-nginx "$NGX" none
measure A-idemgate "$PG_PORT" none "$PG_PID"

# ---- B: new key per request --------------------------------------------------------
measure B-postgres "$PG_PORT" new "$PG_PID"
measure B-redis "$RD_PORT" new "$RD_PID"
measure B-sqlite "$SQ_PORT" new "$SQ_PID"

# ---- C: replays of a hot set ----------------------------------------------------------
BODY="$(python3 -c 'print("{\"amount\":1200,\"currency\":\"eur\",\"pad\":\"" + "x"*471 + "\"}", end="")')"
for port in "$PG_PORT" "$RD_PORT" "$SQ_PORT"; do
    for n in $(seq 0 $((HOT - 1))); do
        curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/payments" -H "Content-Type: application/json" \
            -H "Idempotency-Key: $(printf 'hot-%012d' "$n")" --data-binary "$BODY"
    done
done
measure C-postgres "$PG_PORT" hot "$PG_PID"
measure C-redis "$RD_PORT" hot "$RD_PID"
measure C-sqlite "$SQ_PORT" hot "$SQ_PID"

# ---- D: same-key storms ------------------------------------------------------------
# STORM consecutive requests of a wrk thread share a key; at c = 64 (32
# connections per thread) they are in flight together.
for size in $STORMS; do
    STORM="$size" ONLY_C=64 measure "D-postgres-s$size" "$PG_PORT" storm "$PG_PID"
    STORM="$size" ONLY_C=64 measure "D-redis-s$size" "$RD_PORT" storm "$RD_PID"
    STORM="$size" ONLY_C=64 measure "D-sqlite-s$size" "$SQ_PORT" storm "$SQ_PID"
done

PG_RSS="$(awk '/VmHWM/ {print $2}' "/proc/$PG_PID/status")"
RD_RSS="$(awk '/VmHWM/ {print $2}' "/proc/$RD_PID/status")"
SQ_RSS="$(awk '/VmHWM/ {print $2}' "/proc/$SQ_PID/status")"

# ---- ceilings ----------------------------------------------------------------------
log "pgbench ceilings"
FP="$(psql "$PGURL" -tAc "SELECT encode(fingerprint, 'hex') FROM idemgate_records WHERE key = 'hot-000000000000'")"
cat > "$WORK/claim_complete.sql" <<EOF
\set k random(1, 2000000000)
SELECT o_token AS tok FROM idemgate_claim('ceiling', ''::bytea, :client_id || '-' || :k, decode('$FP', 'hex'), 30000, 86400000, false) \gset
UPDATE idemgate_records SET state = 'completed', status = 201, headers = ''::bytea, body = convert_to('{"id":"pay_1","status":"succeeded"}', 'UTF8'), lease_until = NULL, held_reason = NULL, expires_at = clock_timestamp() + 86400000 * INTERVAL '1 millisecond', updated_at = clock_timestamp() WHERE route = 'ceiling' AND scope = ''::bytea AND key = :client_id || '-' || :k AND token = :tok AND state IN ('in_flight', 'completed');
EOF
cat > "$WORK/replay.sql" <<EOF
\set k random(0, $((HOT - 1)))
SELECT * FROM idemgate_claim('api', ''::bytea, 'hot-' || lpad(:k::text, 12, '0'), decode('$FP', 'hex'), 30000, 86400000, false);
EOF
pgbench_tps() { # script clients
    "$PGBIN/pgbench" -n -h 127.0.0.1 -p "$PGPORT" -U postgres -c "$2" -j 2 -T "$DURATION" -f "$1" postgres 2>/dev/null \
        | awk '/^tps/ {print int($3)}'
}
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        echo "ceil-pg-claim-complete $c $(pgbench_tps "$WORK/claim_complete.sql" "$c") - - - -" >> "$WORK/raw"
        echo "ceil-pg-replay $c $(pgbench_tps "$WORK/replay.sql" "$c") - - - -" >> "$WORK/raw"
    done
done

log "redis-benchmark ceilings (idemgate's own claim and complete scripts)"
python3 - "$WORK" <<'PY'
import re, sys
src = open("src/store/redis/scripts.rs").read()
now = re.search(r'const NOW: &str =\s*"(.*?)";', src, re.S).group(1).replace("\\n", "\n")
for name in ["CLAIM", "COMPLETE"]:
    body = re.search(r'static %s: .*?r#"(.*?)"#' % name, src, re.S).group(1)
    open(f"{sys.argv[1]}/{name.lower()}.lua", "w").write(now + body)
PY
CLAIM_SHA="$(redis-cli -p "$REDISPORT" SCRIPT LOAD "$(cat "$WORK/claim.lua")")"
COMPLETE_SHA="$(redis-cli -p "$REDISPORT" SCRIPT LOAD "$(cat "$WORK/complete.lua")")"
# One completed record, ceil:done, for the complete and replay ceilings: a
# completion by its own token of a completed record rewrites it in full, as
# a first completion does.
# Claim: fingerprint, lease, retention, release-lapsed, attempt id, then the
# wake-up channel and id (empty: the route does not wait). Complete: token,
# status, headers, body, retention, then the same pair.
TOKEN="$(redis-cli -p "$REDISPORT" EVALSHA "$CLAIM_SHA" 2 ceil:done ceil:token fingerprint 30000 86400000 0 1 "" "" | tail -n 1)"
RESPONSE='{"id":"pay_1","status":"succeeded"}'
redis-cli -p "$REDISPORT" EVALSHA "$COMPLETE_SHA" 1 ceil:done "$TOKEN" 201 "" "$RESPONSE" 86400000 "" "" >/dev/null
redis_rps() { # clients, command...
    local c="$1"; shift
    redis-benchmark -p "$REDISPORT" -c "$c" -n 200000 -r 1000000000 -q "$@" \
        | grep -o '[0-9.]* requests per second' | awk '{print int($1)}' | tail -n 1
}
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        echo "ceil-redis-claim $c $(redis_rps "$c" EVALSHA "$CLAIM_SHA" 2 "ceil:rec:__rand_int__" ceil:token fingerprint 30000 86400000 0 1 "" "") - - - -" >> "$WORK/raw"
        echo "ceil-redis-complete $c $(redis_rps "$c" EVALSHA "$COMPLETE_SHA" 1 ceil:done "$TOKEN" 201 "" "$RESPONSE" 86400000 "" "") - - - -" >> "$WORK/raw"
        echo "ceil-redis-replay $c $(redis_rps "$c" EVALSHA "$CLAIM_SHA" 2 ceil:done ceil:token fingerprint 30000 86400000 0 1 "" "") - - - -" >> "$WORK/raw"
    done
done

log "SQLite ceiling (plain INSERT + UPDATE pairs, autocommit, WAL, synchronous = FULL)"
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        echo "ceil-sqlite-insert-update $c $(python3 bench/sqlite_ceiling.py "$WORK/ceiling.db" "$c" "$DURATION") - - - -" >> "$WORK/raw"
    done
done
for i in $(seq 1 "$REPEATS"); do
    echo "ceil-sqlite-serial 1 $(python3 bench/sqlite_ceiling.py "$WORK/ceiling.db" 1 "$DURATION") - - - -" >> "$WORK/raw"
done

# ---- report --------------------------------------------------------------------------
mkdir -p bench/results
python3 - "$WORK/raw" "$RESULTS" "$DURATION" "$REPEATS" "$PG_RSS" "$RD_RSS" "$SQ_RSS" "$(git rev-parse --short HEAD)" <<'PY'
import statistics, sys, collections, datetime
raw, out, duration, repeats, pg_rss, rd_rss, sq_rss, commit = sys.argv[1:]
rows = collections.defaultdict(list)
for line in open(raw):
    name, c, rps, p50, p99, non2xx, cpu = line.split()
    rows[(name, int(c))].append((float(rps), p50, p99, non2xx, cpu))
def med(name, c, i=0):
    vals = [float(r[i]) for r in rows.get((name, c), []) if r[i] != "-"]
    return statistics.median(vals) if vals else None
def cell(name, c):
    vals = [r[0] for r in rows.get((name, c), [])]
    if not vals: return "—"
    return f"{statistics.median(vals):,.0f} ({min(vals):,.0f}–{max(vals):,.0f})"
cs = sorted({c for n, c in rows if n != "ceil-sqlite-serial"})
storms = sorted({n for n, _ in rows if n.startswith("D-")}, key=lambda n: (n.rsplit("-s", 1)[0], int(n.rsplit("-s", 1)[1])))
# Redis runs one script at a time: a request's two calls cost the sum of
# their times, so the pair ceiling is 1 / (1/claim + 1/complete).
for c in {c for _, c in rows}:
    a, b = rows.get(("ceil-redis-claim", c), []), rows.get(("ceil-redis-complete", c), [])
    for x, y in zip(a, b):
        rows[("ceil-redis-claim+complete", c)].append((1 / (1 / x[0] + 1 / y[0]), "-", "-", "-", "-"))
names = ["A-direct", "A-nginx", "A-idemgate", "B-postgres", "B-redis", "B-sqlite", "C-postgres", "C-redis", "C-sqlite"] + storms + [
         "ceil-pg-claim-complete", "ceil-pg-replay", "ceil-redis-claim", "ceil-redis-complete",
         "ceil-redis-claim+complete", "ceil-redis-replay", "ceil-sqlite-insert-update", "ceil-sqlite-serial"]
measured = [n for n in names if not n.startswith("ceil-")]
L = [f"# idemgate benchmark — {datetime.date.today()}", "",
     f"Commit {commit}. 2 cores shared by everything (wrk -t2, nginx 1 worker each, PostgreSQL, Redis, idemgate).",
     f"{duration} s per run, {repeats} runs per cell; requests/s as median (min–max). 512-byte JSON POST;",
     "upstream: nginx returning a static 201. idemgate with RUST_LOG=warn (no per-request log line),",
     "PostgreSQL with synchronous_commit on (its default), Redis without persistence,",
     "SQLite with WAL and synchronous = FULL (idemgate's settings).", "",
     "## Throughput (requests/s)", "", "| run | " + " | ".join(f"c={c}" for c in cs) + " |",
     "|---|" + "---|" * len(cs)]
for n in names:
    if any((n, c) in rows for c in cs):
        L.append(f"| {n} | " + " | ".join(cell(n, c) for c in cs) + " |")
L += ["", "## Latency and CPU (medians)", "", "| run | c | p50 ms | p99 ms | non-2xx | idemgate CPU µs/req |", "|---|---|---|---|---|---|"]
for n in measured:
    for c in cs:
        if (n, c) in rows:
            r = rows[(n, c)]
            L.append(f"| {n} | {c} | {med(n,c,1):.2f} | {med(n,c,2):.2f} | {med(n,c,3):.0f} | {('%.1f' % med(n,c,4)) if med(n,c,4) is not None else '—'} |")
L += ["", "## Ratios (medians)", "", "| ratio | " + " | ".join(f"c={c}" for c in cs) + " | target |", "|---|" + "---|" * len(cs) + "---|"]
def ratio(a, b, c):
    x, y = med(a, c), med(b, c)
    return f"{x / y:.2f}" if x and y else "—"
for label, a, b, target in [
    ("B postgres ÷ pgbench claim+complete", "B-postgres", "ceil-pg-claim-complete", "≥ 0.8"),
    ("C postgres ÷ pgbench replay", "C-postgres", "ceil-pg-replay", "≥ 0.8"),
    ("B redis ÷ redis claim ⊕ complete scripts", "B-redis", "ceil-redis-claim+complete", "—"),
    ("B sqlite ÷ plain SQLite insert+update pairs", "B-sqlite", "ceil-sqlite-insert-update", "—"),
    ("C redis ÷ redis replay (claim script on a completed record)", "C-redis", "ceil-redis-replay", "—"),
    ("A idemgate ÷ nginx proxy", "A-idemgate", "A-nginx", "≥ 1.0"),
    ("A idemgate ÷ direct", "A-idemgate", "A-direct", "—"),
    ("keyed (B postgres) ÷ unkeyed (A idemgate)", "B-postgres", "A-idemgate", "—"),
    ("keyed (B redis) ÷ unkeyed (A idemgate)", "B-redis", "A-idemgate", "—"),
]:
    L.append(f"| {label} | " + " | ".join(ratio(a, b, c) for c in cs) + f" | {target} |")
L += ["", "Added latency vs direct (p50 / p99, ms):", ""]
for n in ["A-nginx", "A-idemgate", "B-postgres", "B-redis", "B-sqlite", "C-postgres", "C-redis", "C-sqlite"]:
    parts = []
    for c in cs:
        if (n, c) in rows and ("A-direct", c) in rows:
            parts.append(f"c={c}: +{med(n,c,1) - med('A-direct',c,1):.2f} / +{med(n,c,2) - med('A-direct',c,2):.2f}")
    L.append(f"- {n}: " + "; ".join(parts))
serial = [r[0] for r in rows.get(("ceil-sqlite-serial", 1), [])]
if serial:
    L += ["", f"Plain SQLite pairs from one connection (no lock contention): {statistics.median(serial):,.0f}/s."]
L += ["", f"Peak RSS: idemgate on PostgreSQL {int(pg_rss)//1024} MiB, on Redis {int(rd_rss)//1024} MiB, on SQLite {int(sq_rss)//1024} MiB.", ""]
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
log "wrote $RESULTS"
