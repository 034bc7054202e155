#!/usr/bin/env bash
# idemgate benchmark: one command on a fresh machine of this kind.
#
#   bash bench/run.sh                      # full matrix: c = 8 32 64, 3 repeats, 5 s each
#   CONCURRENCY="32" REPEATS=1 bash bench/run.sh   # a quick look
#   ONLY="B peer" bash bench/run.sh        # a subset (default: A B C D F peer log memory ceil)
#   BASELINE=f22ed98 bash bench/run.sh     # also that revision's A, B and C-postgres rows ("-before")
#   ONLY=wait CONCURRENCY=32 bash bench/run.sh   # what [store] replicas = 1 costs (not in the default)
#
# Installs wrk, nginx-light and redis-server from apt if missing, starts its
# own throwaway PostgreSQL (initdb, free port) and Redis (free port), two nginx
# servers (a static 201 upstream, and a plain proxy_pass in front of it) and a
# small counting upstream (storms), builds idemgate (profile dist), installs
# the peer (crates.io idempotent-proxy-server, once, into $BENCH_CACHE), and
# measures, on one fixed 512-byte JSON POST:
#   A  pass-through (no key): direct vs nginx proxy_pass vs idemgate
#   B  a new key per request: idemgate on PostgreSQL, on Redis, on SQLite; the peer
#   C  replays of a hot set of 100 completed keys: PostgreSQL, Redis (replay
#      cache on and off), SQLite; the peer
#   D  same-key storms: 2, 8, 32 and 64 requests per key (at c = 64), against
#      an upstream that counts executions per key; idemgate and the peer
#   F  PostgreSQL alone vs PostgreSQL with a Redis front ([store.front]), two
#      gateways per store sharing it, the load split across both: same-key
#      storms (8 16 32 64), cross-instance replays of a hot set (replay cache
#      off and on), new keys; PostgreSQL statements per request from
#      pg_stat_statements (its own PostgreSQL server), a Redis PING for scale
#   log  pass-through and replay with idemgate's default log level (info)
#      next to the same with RUST_LOG=warn
#   trace  new keys (PostgreSQL) and replays (Redis) with OpenTelemetry
#      tracing on (every request sampled, exported over OTLP/HTTP to a local
#      sink that answers 200) next to the same gateways with tracing off
#   seal  sealed records ([store] encryption_keys, compressed) vs plain, on
#      Redis with the replay cache off, the upstream answering a 2 KiB
#      PaymentIntent (crates/store/src/seal/fixture.rs): new keys, and
#      replays (each opened)
#   wait  (not in the default) what [store] replicas = 1 costs: a Redis
#      replica of the bench's Redis, and gateways on the same Redis database
#      with replicas = 1 (WAIT 1 100 after each claim that takes a key and
#      each record) next to the replicas = 0 ones: new keys, and replays with
#      the replay cache off; runs last, so no other row has the replica
#   memory  10,000 idle HTTP/1.1 and HTTP/2 connections (bench/memory.py,
#      idle-h1 and idle-h2)
#   ceilings: pgbench running idemgate's own claim + complete statements, a
#   plain INSERT ON CONFLICT DO NOTHING + UPDATE pair per key, and
#   its replay claim; redis-benchmark running idemgate's own claim, complete
#   and replay (claim on a completed record) scripts; plain SQLite INSERT +
#   UPDATE pairs in autocommit on idemgate's table and settings
#   (bench/sqlite_ceiling.py)
# Rows compared with each other run interleaved (per repeat: one row, then
# the next), not all of one then all of the other.
# Writes bench/results/<date>.md with medians (min–max) and the ratios.
# idemgate runs with RUST_LOG=warn (no per-request log line) except in the
# log rows; see bench/README.md for every row and option.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DURATION="${DURATION:-5}"
REPEATS="${REPEATS:-3}"
CONCURRENCY="${CONCURRENCY:-8 32 64}"
HOT=100
STORMS="${STORMS:-2 8 32 64}"
STORM_C="${STORM_C:-64}"
RESULTS="${RESULTS:-bench/results/$(date -u +%Y-%m-%d).md}"
ONLY="${ONLY:-A B C D F peer log trace seal memory ceil}"
F_STORMS="${F_STORMS:-8 16 32 64}"
BASELINE="${BASELINE:-}"
BENCH_CACHE="${BENCH_CACHE:-$HOME/.cache/idemgate-bench}"
PEER_VERSION=1.2.2
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

log() { printf '==> %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
want() { case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for part in $ONLY; do
    case "$part" in A|B|C|D|F|peer|log|trace|seal|wait|memory|ceil|distance|overload) ;; *) log "ONLY: unknown part '$part' (A B C D F peer log trace seal wait memory ceil distance overload)"; exit 2 ;; esac
done

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
    [ -f "$WORK/nginx-f.pid" ] && kill "$(cat "$WORK/nginx-f.pid")" 2>/dev/null || true
    [ -d "$WORK/pg" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
    [ -d "$WORK/pgf" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pgf" -m immediate stop >/dev/null 2>&1 || true
    [ -d "$WORK/baseline-src" ] && git worktree remove --force "$WORK/baseline-src" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---- builds --------------------------------------------------------------------
# The shipped binary's profile (Cargo.toml: `dist`, fat LTO, what the image
# runs); PROFILE=release measures what `cargo run --release` builds.
PROFILE="${PROFILE:-dist}"
log "building idemgate (profile $PROFILE)"
# The package's two binaries only: an example, test or bench target would
# give them the dev-dependencies' features (the test-only failpoints).
cargo build --profile "$PROFILE" --locked --quiet -p idemgate --bin idemgate --bin demo_upstream
BIN="$TARGET_DIR/$PROFILE/idemgate"

# BASELINE: that revision, built once in a temporary worktree with its own
# target directory under the cache (keyed by the full commit id).
BASE_BIN=""
if [ -n "$BASELINE" ] && { want A || want B || want C; }; then
    BASE_REV="$(git rev-parse --verify "$BASELINE^{commit}")"
    BASE_DIR="$BENCH_CACHE/baseline/$BASE_REV"
    BASE_BIN="$BASE_DIR/idemgate"
    if [ ! -x "$BASE_BIN" ]; then
        log "building baseline ${BASE_REV:0:12} (release) in a temporary worktree"
        mkdir -p "$BASE_DIR"
        git worktree add --quiet --detach "$WORK/baseline-src" "$BASE_REV"
        (cd "$WORK/baseline-src" && CARGO_TARGET_DIR="$BASE_DIR/target" nice -n 10 cargo build --release --locked --quiet --bin idemgate)
        cp "$BASE_DIR/target/release/idemgate" "$BASE_BIN.tmp" && mv "$BASE_BIN.tmp" "$BASE_BIN"
        git worktree remove --force "$WORK/baseline-src"
    fi
fi

# The peer: crates.io idempotent-proxy-server, built once into the cache with
# its own CARGO_HOME (its source then sits in $PEER_ROOT/cargo/registry/src).
PEER_BIN=""
if want peer || want distance; then
    PEER_ROOT="$BENCH_CACHE/idempotent-proxy-server-$PEER_VERSION"
    PEER_BIN="$PEER_ROOT/bin/idempotent-proxy-server"
    if [ ! -x "$PEER_BIN" ]; then
        log "installing idempotent-proxy-server $PEER_VERSION into $PEER_ROOT (once)"
        mkdir -p "$PEER_ROOT"
        env -u CARGO_TARGET_DIR CARGO_HOME="$PEER_ROOT/cargo" nice -n 10 \
            cargo install idempotent-proxy-server --locked --quiet --version "$PEER_VERSION" --root "$PEER_ROOT"
    fi
fi

# ---- services ------------------------------------------------------------------
start_pg() { # directory port [extra server options]: a private cluster, trust auth
    local dir="$1" port="$2" extra="${3:-}"
    mkdir "$dir" && chown postgres:postgres "$dir"
    runuser -u postgres -- "$PGBIN/initdb" -D "$dir" -A trust -U postgres >/dev/null
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir" -l "$dir/log" -w \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c shared_buffers=256MB $extra" start >/dev/null
}
PGPORT="$(free_port)"
log "PostgreSQL on 127.0.0.1:$PGPORT"
start_pg "$WORK/pg" "$PGPORT" "-c max_connections=300"
PGURL="postgres://postgres@127.0.0.1:$PGPORT/postgres"

REDISPORT="$(free_port)"
log "Redis on 127.0.0.1:$REDISPORT"
redis-server --port "$REDISPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/dev/null &
REDIS_PID=$!
PIDS+=("$REDIS_PID")

UP="$(free_port)"; NGX="$(free_port)"
# The seal part's answer: the sealing tests' PaymentIntent (about 2 KiB of
# JSON; it has no quote, backslash or dollar sign for nginx to read).
PAYMENT_OBJECT="$(python3 -c '
import sys
s = open("crates/store/src/seal/fixture.rs").read()
sys.stdout.write(s[s.index("r#\"") + 3:s.index("\"#;")].replace("{marker}", "bench"))')"
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
        location /v1/payment-objects { default_type application/json; return 201 '$PAYMENT_OBJECT'; }
    }
    upstream up { server 127.0.0.1:$UP; keepalive 64; }
    server {
        listen 127.0.0.1:$NGX;
        location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
EOF
nginx -c "$WORK/nginx.conf" -p "$WORK"

# The storm upstream: answers like the nginx upstream and counts the requests
# that reach it per Idempotency-Key; GET /__stats answers "keys executions
# max_per_key keys_executed_more_than_once" and resets the counts.
CNT="$(free_port)"
log "counting upstream on :$CNT"
cat > "$WORK/count_upstream.py" <<'PY'
import asyncio, collections, sys
counts = collections.Counter()
BODY = b'{"id":"pay_1","status":"succeeded"}'
RESP = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
class Conn(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                stop = self.buf.find(b"\r\n0\r\n\r\n", end)
                if stop < 0:
                    return
                self.buf = self.buf[stop + 7:]
            else:
                n = int(headers.get("content-length", "0"))
                if len(self.buf) < end + 4 + n:
                    return
                self.buf = self.buf[end + 4 + n:]
            if lines[0].startswith("GET /__stats"):
                body = ("%d %d %d %d" % (len(counts), sum(counts.values()), max(counts.values(), default=0),
                                         sum(1 for v in counts.values() if v > 1))).encode()
                counts.clear()
                self.t.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                counts[headers.get("idempotency-key", "")] += 1
                self.t.write(RESP)
async def main():
    server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await server.serve_forever()
asyncio.run(main())
PY
python3 "$WORK/count_upstream.py" "$CNT" 2>"$WORK/count_upstream.log" &
PIDS+=($!)
counts() { curl -sf "http://127.0.0.1:$CNT/__stats"; }

# Every gateway, current or baseline, gets this config (only the store URL,
# the replay cache, the listeners, part F's [store.front] and part wait's
# STORE_EXTRA differ by gateway): route "api" to the nginx upstream, "storm"
# and "storm-wait" (concurrent = "wait") to the counting upstream.
# STORE_EXTRA (env, optional): lines added to [store] as they are.
start_gateway() { # name store_url [replay_cache_ttl] [binary] [log: warn|default] [front_url] [otlp_endpoint] -> sets GW_PORT, GW_PID, GW_ADMIN
    local name="$1" url="$2" cache="${3:-}" bin="${4:-$BIN}" level="${5:-warn}" front="${6:-}" otlp="${7:-}" admin
    GW_PORT="$(free_port)"; admin="$(free_port)"; GW_ADMIN="$admin"
    {
        echo "listen = \"127.0.0.1:$GW_PORT\""
        echo "admin_listen = \"127.0.0.1:$admin\""
        if [ -n "${GW_TOP:-}" ]; then printf '%s\n' "$GW_TOP"; fi
        echo "[store]"
        echo "url = \"$url\""
        echo "prefix = \"bench:\""
        echo "pool_size = 32"
        [ -n "$cache" ] && echo "replay_cache_ttl = \"$cache\""
        if [ -n "${STORE_EXTRA:-}" ]; then printf '%s\n' "$STORE_EXTRA"; fi
        if [ -n "$front" ]; then
            echo "[store.front]"
            echo "url = \"$front\""
        fi
        cat <<EOF
[[routes]]
name = "api"
match = "/*"
upstream = "http://127.0.0.1:$UP"
key_required = false
[[routes]]
name = "storm"
match = "/storm/*"
upstream = "http://127.0.0.1:$CNT"
key_required = false
[[routes]]
name = "storm-wait"
match = "/storm-wait/*"
upstream = "http://127.0.0.1:$CNT"
key_required = false
concurrent = "wait"
EOF
    } > "$WORK/$name.toml"
    if [ "$level" = warn ]; then
        env ${otlp:+OTEL_EXPORTER_OTLP_ENDPOINT=$otlp} RUST_LOG=warn "$bin" serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" &
    else
        env -u RUST_LOG ${otlp:+OTEL_EXPORTER_OTLP_ENDPOINT=$otlp} "$bin" serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" &
    fi
    GW_PID=$!
    PIDS+=("$GW_PID")
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "gateway $name did not become ready"; cat "$WORK/$name.log" >&2; exit 1
}

# The peer on the same Redis (its keys are "ANON:POST:<key>", idemgate's
# "bench:…"), the same nginx upstream (/URL_API) and the counting upstream
# (/URL_STORM). REQUEST_TIMEOUT is its lock TTL, its result TTL and its
# upstream timeout at once: one day, like idemgate's retention, so the hot
# set stays completed for the whole run. POLL_INTERVAL = 10 ms, its minimum:
# how often a duplicate in flight polls Redis for the first answer.
start_peer() { # -> sets PEER_PORT, PEER_PID (env PEER_REDIS_PORT, PEER_DIR: another Redis port, directory)
    local dir="${PEER_DIR:-$WORK/peer}"
    PEER_PORT="$(free_port)"
    mkdir -p "$dir"
    cat > "$dir/.env" <<EOF
SERVER_ADDR=127.0.0.1:$PEER_PORT
REDIS_URL=redis://127.0.0.1:${PEER_REDIS_PORT:-$REDISPORT}/0
URL_API=http://127.0.0.1:$UP/v1/payments
URL_STORM=http://127.0.0.1:$CNT/storm
REQUEST_TIMEOUT=86400000
POLL_INTERVAL=10
EOF
    (cd "$dir" && exec env -u LOG -u LOG_LEVEL RUST_LOG=warn "$PEER_BIN") >"$dir.log" 2>&1 &
    PEER_PID=$!
    PIDS+=("$PEER_PID")
    for _ in $(seq 1 100); do
        # Up when it answers at all (400: no key).
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PEER_PORT/URL_API" || true)" != 000 ] && return 0
        sleep 0.1
    done
    log "the peer did not start"; cat "$dir.log" >&2; exit 1
}

# start_delay_line TARGET_PORT DELAY_FILE LOG: bench/delay-line (built once)
# from a free port to 127.0.0.1:TARGET_PORT, its delay read from DELAY_FILE
# (which must hold one); sets DL_PORT, DL_PID. Parts distance and overload.
start_delay_line() {
    if [ -z "${DL_BIN:-}" ]; then
        log "building bench/delay-line"
        cargo build --release --locked --quiet --manifest-path bench/delay-line/Cargo.toml
        DL_BIN="${CARGO_TARGET_DIR:-$PWD/bench/delay-line/target}/release/delay-line"
    fi
    DL_PORT="$(free_port)"
    "$DL_BIN" --listen "127.0.0.1:$DL_PORT" --to "127.0.0.1:$1" --delay "$(cat "$2")" \
        --delay-file "$2" > "$3" 2>&1 &
    DL_PID=$!
    PIDS+=("$DL_PID")
    for _ in $(seq 1 50); do
        grep -q '^listening' "$3" 2>/dev/null && return 0
        sleep 0.1
    done
    log "the delay line to :$1 did not start"; cat "$3" >&2; exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wrk once: prints "rps p50_ms p99_ms non2xx requests socket_errors"
wrk_once() { # port mode conns [path]
    local out
    out="$(MODE="$2" HOT="$HOT" STORM="${STORM:-64}" RUN="r$RANDOM$RANDOM" wrk -t"$(( $3 < 2 ? $3 : 2 ))" -c"$3" -d"${DURATION}s" --latency \
        -s bench/post.lua "http://127.0.0.1:$1${4:-/v1/payments}")"
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
errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
errors = sum(int(x) for x in errors.groups()) if errors else 0
print(f"{rps:.0f} {ms('50%'):.3f} {ms('99%'):.3f} {non2xx.group(1) if non2xx else 0} {reqs} {errors}")
PY
}

# measure SPEC...: each SPEC is "NAME PORT MODE [PID [PATH]]" (PID "-": no
# CPU figure). For each concurrency (or $ONLY_C) and each repeat it runs every
# SPEC in turn, so the rows of one call are interleaved. Appends "NAME c rps
# p50 p99 non2xx cpu_us_per_req" lines to $WORK/raw, and for storms "NAME c
# requests socket_errors keys executions max_per_key keys_executed_twice_or_more"
# (the last four from the counting upstream) to $WORK/storms.
measure() {
    local c i spec name port mode pid path before after line cpu stats
    for c in ${ONLY_C:-$CONCURRENCY}; do
        for i in $(seq 1 "$REPEATS"); do
            for spec in "$@"; do
                read -r name port mode pid path <<<"$spec"
                pid="${pid:--}"
                [ "$mode" = storm ] && counts >/dev/null
                [ "$pid" != - ] && before="$(cpu_ticks "$pid")"
                line="$(wrk_once "$port" "$mode" "$c" "$path")"
                cpu="-"
                if [ "$pid" != - ]; then
                    after="$(cpu_ticks "$pid")"
                    cpu="$(python3 -c "import os,sys; t=($after-$before)/os.sysconf('SC_CLK_TCK'); r=int(sys.argv[1]); print(f'{t*1e6/max(r,1):.1f}')" "$(echo "$line" | awk '{print $5}')")"
                fi
                echo "$name $c $(echo "$line" | awk '{print $1, $2, $3, $4}') $cpu" >> "$WORK/raw"
                if [ "$mode" = storm ]; then
                    sleep 0.5 # requests the gateway had already forwarded when wrk stopped
                    stats="$(counts)"
                    echo "$name $c $(echo "$line" | awk '{print $5, $6}') $stats" >> "$WORK/storms"
                    log "$name c=$c #$i: $line cpu_us/req=$cpu upstream(keys executions max dup_keys)=$stats"
                else
                    log "$name c=$c #$i: $line cpu_us/req=$cpu"
                fi
            done
        done
    done
}

# The hot set: HOT completed keys, created through the gateway at PORT.
BODY="$(python3 -c 'print("{\"amount\":1200,\"currency\":\"eur\",\"pad\":\"" + "x"*471 + "\"}", end="")')"
preload() { # port [path]
    local n
    for n in $(seq 0 $((HOT - 1))); do
        curl -s -o /dev/null -X POST "http://127.0.0.1:$1${2:-/v1/payments}" -H "Content-Type: application/json" \
            -H "Idempotency-Key: $(printf 'hot-%012d' "$n")" --data-binary "$BODY"
    done
}

: > "$WORK/raw"; : > "$WORK/storms"; : > "$WORK/rss"; : > "$WORK/rss.pids"

# ---- gateways ------------------------------------------------------------------------
# Replay cache: "5s" is idemgate's default (src/config/defaults.rs); written
# out so the results say which rows have it.
start_gateway pg "$PGURL" 5s; PG_PORT="$GW_PORT"; PG_PID="$GW_PID"
if want B; then
    # The same, serving on the shared runtime (server_threads = 0): what
    # serving threads cost new keys on PostgreSQL (B-postgres-shared).
    GW_TOP="server_threads = 0" start_gateway pg-shared "$PGURL" 5s; PS_PORT="$GW_PORT"; PS_PID="$GW_PID"
fi
start_gateway redis "redis://127.0.0.1:$REDISPORT/" 5s; RD_PORT="$GW_PORT"; RD_PID="$GW_PID"; RD_ADMIN="$GW_ADMIN"
start_gateway sqlite "sqlite://$WORK/idemgate.db" 5s; SQ_PORT="$GW_PORT"; SQ_PID="$GW_PID"
printf 'idemgate-postgres %s\nidemgate-redis %s\nidemgate-sqlite %s\n' "$PG_PID" "$RD_PID" "$SQ_PID" > "$WORK/rss.pids"
if want C || want peer || want wait; then
    start_gateway redis-nocache "redis://127.0.0.1:$REDISPORT/" 0s; RN_PORT="$GW_PORT"; RN_PID="$GW_PID"; RN_ADMIN="$GW_ADMIN"
fi
if want log; then
    start_gateway redis-info "redis://127.0.0.1:$REDISPORT/" 5s "$BIN" default; RI_PORT="$GW_PORT"; RI_PID="$GW_PID"
fi
if want trace; then
    # An OTLP/HTTP sink: takes every export, answers 200 with an empty
    # ExportTraceServiceResponse, counts requests and bytes.
    SINK="$(free_port)"
    cat > "$WORK/otlp_sink.py" <<'PYSINK'
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
seen = {"requests": 0, "bytes": 0}
lock = threading.Lock()
class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        with lock:
            seen["requests"] += 1; seen["bytes"] += n
        self.send_response(200); self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0"); self.end_headers()
    def do_GET(self):
        body = f'{seen["requests"]} {seen["bytes"]}'.encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PYSINK
    python3 "$WORK/otlp_sink.py" "$SINK" 2>"$WORK/otlp_sink.log" &
    PIDS+=("$!")
    log "OTLP sink on :$SINK"
    start_gateway pg-traced "$PGURL" 5s "$BIN" warn "" "http://127.0.0.1:$SINK"; PT_PORT="$GW_PORT"; PT_PID="$GW_PID"; PT_ADMIN="$GW_ADMIN"
    start_gateway redis-traced "redis://127.0.0.1:$REDISPORT/" 5s "$BIN" warn "" "http://127.0.0.1:$SINK"; RT_PORT="$GW_PORT"; RT_PID="$GW_PID"; RT_ADMIN="$GW_ADMIN"
fi
if want seal; then
    # Two gateways on the bench's Redis, each on a database of its own (the
    # hot set's keys are the other rows' too), replay cache off; the second
    # seals its records under a key made for the run.
    SEAL_KEY="$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')"
    start_gateway redis-plain "redis://127.0.0.1:$REDISPORT/4" 0s; RP_PORT="$GW_PORT"; RP_PID="$GW_PID"
    STORE_EXTRA="encryption_keys = [\"b1:$SEAL_KEY\"]" start_gateway redis-sealed "redis://127.0.0.1:$REDISPORT/5" 0s
    RS_PORT="$GW_PORT"; RS_PID="$GW_PID"
fi
if [ -n "$PEER_BIN" ]; then
    start_peer
    echo "peer $PEER_PID" >> "$WORK/rss.pids"
fi
if [ -n "$BASE_BIN" ]; then
    # Same config; its own PostgreSQL database and Redis database (its schema
    # and migrations may differ from the current build's).
    psql "$PGURL" -qc "CREATE DATABASE before" >/dev/null
    start_gateway pg-before "postgres://postgres@127.0.0.1:$PGPORT/before" 5s "$BASE_BIN"; PGB_PORT="$GW_PORT"; PGB_PID="$GW_PID"
    start_gateway redis-before "redis://127.0.0.1:$REDISPORT/1" 5s "$BASE_BIN"; RDB_PORT="$GW_PORT"; RDB_PID="$GW_PID"
fi

# ---- A: pass-through ------------------------------------------------------------
if want A; then
    specs=("A-direct $UP none" "A-nginx $NGX none" "A-idemgate $PG_PORT none $PG_PID")
    [ -n "$BASE_BIN" ] && specs+=("A-idemgate-before $PGB_PORT none $PGB_PID")
    measure "${specs[@]}"
fi

# ---- B: new key per request --------------------------------------------------------
if want B || want peer; then
    specs=()
    want B && specs+=("B-postgres $PG_PORT new $PG_PID" "B-postgres-shared $PS_PORT new $PS_PID")
    [ -n "$BASE_BIN" ] && want B && specs+=("B-postgres-before $PGB_PORT new $PGB_PID")
    specs+=("B-redis $RD_PORT new $RD_PID")
    [ -n "$BASE_BIN" ] && want B && specs+=("B-redis-before $RDB_PORT new $RDB_PID")
    [ -n "$PEER_BIN" ] && specs+=("B-peer $PEER_PORT new $PEER_PID /URL_API")
    want B && specs+=("B-sqlite $SQ_PORT new $SQ_PID")
    measure "${specs[@]}"
fi

# ---- C: replays of a hot set ----------------------------------------------------------
# idemgate-redis and idemgate-redis-nocache share one Redis, prefix and
# route: one preload serves both (and the log and wait rows).
if want C || want peer || want log || want trace || want wait; then
    preload "$RD_PORT"
fi
if want C || want peer; then
    specs=()
    if want C; then
        preload "$PG_PORT"; preload "$SQ_PORT"
        specs+=("C-postgres $PG_PORT hot $PG_PID")
        [ -n "$BASE_BIN" ] && { preload "$PGB_PORT"; specs+=("C-postgres-before $PGB_PORT hot $PGB_PID"); }
    fi
    specs+=("C-redis $RD_PORT hot $RD_PID" "C-redis-nocache $RN_PORT hot $RN_PID")
    [ -n "$PEER_BIN" ] && { preload "$PEER_PORT" /URL_API; specs+=("C-peer $PEER_PORT hot $PEER_PID /URL_API"); }
    want C && specs+=("C-sqlite $SQ_PORT hot $SQ_PID")
    measure "${specs[@]}"
fi

# ---- log: idemgate's per-request log line -------------------------------------------
# The same config on the same Redis; idemgate-redis-info runs without
# RUST_LOG (the default level, info: one line per request, to a file).
if want log; then
    measure "log-A-warn $RD_PORT none $RD_PID" "log-A-info $RI_PORT none $RI_PID" \
            "log-C-warn $RD_PORT hot $RD_PID" "log-C-info $RI_PORT hot $RI_PID"
    echo "$(wc -l < "$WORK/redis-info.log") $(wc -c < "$WORK/redis-info.log")" > "$WORK/loglines"
fi

# ---- trace: OpenTelemetry on (every request sampled) vs off ---------------------------
# The same configs on the same stores; the traced gateways export to the
# sink. Their dropped-span counters and what the sink took are recorded.
if want trace; then
    measure "trace-B-off $PG_PORT new $PG_PID" "trace-B-on $PT_PORT new $PT_PID" \
            "trace-C-off $RD_PORT hot $RD_PID" "trace-C-on $RT_PORT hot $RT_PID"
    sleep 6 # the last scheduled export
    for admin in "$PT_ADMIN" "$RT_ADMIN"; do
        curl -sf "http://127.0.0.1:$admin/metrics" | grep '^idemgate_trace_spans_dropped_total' | awk '{s += $2} END {printf "%d ", s}'
    done > "$WORK/traces"
    curl -sf "http://127.0.0.1:$SINK/" >> "$WORK/traces"
fi

# ---- seal: sealed vs plain records ------------------------------------------------------
# Replay cache off on both, so every replay reads the store and opens the
# record; the answer is the 2 KiB payment object, compressed when sealed.
if want seal; then
    preload "$RP_PORT" /v1/payment-objects; preload "$RS_PORT" /v1/payment-objects
    measure "seal-B-off $RP_PORT new $RP_PID /v1/payment-objects" "seal-B-on $RS_PORT new $RS_PID /v1/payment-objects" \
            "seal-C-off $RP_PORT hot $RP_PID /v1/payment-objects" "seal-C-on $RS_PORT hot $RS_PID /v1/payment-objects"
fi

# ---- D: same-key storms ------------------------------------------------------------
# STORM consecutive requests of a wrk thread share a key; at c = 64 (32
# connections per thread) they are in flight together. The upstream counts
# the requests that reach it per key. STORM_C: another concurrency (the peer
# stalls above ~10 duplicates in flight: see bench/README.md).
if want D || want peer; then
    for size in $STORMS; do
        specs=()
        want D && specs+=("D-postgres-s$size $PG_PORT storm $PG_PID /storm/payments")
        specs+=("D-redis-s$size $RD_PORT storm $RD_PID /storm/payments")
        specs+=("D-redis-wait-s$size $RD_PORT storm $RD_PID /storm-wait/payments")
        [ -n "$PEER_BIN" ] && specs+=("D-peer-s$size $PEER_PORT storm $PEER_PID /URL_STORM")
        want D && specs+=("D-sqlite-s$size $SQ_PORT storm $SQ_PID /storm/payments")
        STORM="$size" ONLY_C="$STORM_C" measure "${specs[@]}"
    done
fi

# ---- F: PostgreSQL alone vs PostgreSQL with a Redis front --------------------------
# Two gateways per store, sharing it: "postgres" (PostgreSQL alone) and
# "front" ([store.front] on the same Redis server, its own database), each
# with the replay cache on ("5s") and off ("0s"): four pairs, each pair on
# its own database of a PostgreSQL server started for this part with
# pg_stat_statements, so that every row's statements are counted in its
# pair's database only. The load is split across the two gateways of a pair:
#   new, hot: one wrk, its two threads (half the connections each) on the two
#     gateways (post.lua's ADDRS): one run, one latency histogram for both;
#   storm: one wrk through an nginx round-robin (proxy_pass, keepalive, no
#     retries) over the pair, so each key's consecutive requests alternate
#     between the gateways and race each other (the D mechanism otherwise:
#     STORM consecutive requests of a wrk thread share a key).
# PostgreSQL statements per request: the pair's database's pg_stat_statements
# calls (top level: idemgate_batch, idemgate_claim, the relay's statements,
# BEGIN/COMMIT) over the row, minus the idle rate (relay polls, sweeper)
# measured before the rows times the row's wall time, divided by the
# requests wrk got answers to.
if want F; then
    FPGPORT="$(free_port)"
    log "part F: PostgreSQL with pg_stat_statements on 127.0.0.1:$FPGPORT"
    start_pg "$WORK/pgf" "$FPGPORT" \
        "-c max_connections=400 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
    FPG="postgres://postgres@127.0.0.1:$FPGPORT"
    FPG_PM="$(head -n 1 "$WORK/pgf/postmaster.pid")"
    psql "$FPG/postgres" -qc "CREATE EXTENSION pg_stat_statements" >/dev/null
    declare -A F_DB F_ADDRS F_PORT1 F_PIDS F_LB F_ADMINS
    f_pair() { # pair database replay_cache_ttl [front redis url]
        local pair="$1" db="$2" cache="$3" front="${4:-}" n admin
        psql "$FPG/postgres" -qc "CREATE DATABASE $db" >/dev/null
        F_DB[$pair]="$db"; F_ADDRS[$pair]=""; F_PIDS[$pair]=""; F_ADMINS[$pair]=""
        for n in 1 2; do
            start_gateway "f-$pair-$n" "$FPG/$db" "$cache" "$BIN" warn "$front"
            F_ADDRS[$pair]+="127.0.0.1:$GW_PORT "; F_PIDS[$pair]+="$GW_PID "; F_ADMINS[$pair]+="$GW_ADMIN "
            [ "$n" = 1 ] && F_PORT1[$pair]="$GW_PORT"
            echo "idemgate-f-$pair-$n $GW_PID" >> "$WORK/rss.pids"
            if [ -n "$front" ]; then # ready is PostgreSQL's; wait until this gateway uses the front
                admin="$GW_ADMIN"
                for _ in $(seq 1 100); do
                    curl -sf "http://127.0.0.1:$admin/metrics" | grep -q '^idemgate_front_up 1' && break
                    sleep 0.1
                done
                curl -sf "http://127.0.0.1:$admin/metrics" | grep -q '^idemgate_front_up 1' \
                    || { log "gateway f-$pair-$n: the front is not up"; exit 1; }
            fi
        done
    }
    f_pair postgres f_postgres 5s
    f_pair postgres-nocache f_postgres_nocache 0s
    f_pair front f_front 5s "redis://127.0.0.1:$REDISPORT/2"
    f_pair front-nocache f_front_nocache 0s "redis://127.0.0.1:$REDISPORT/3"

    # The storms' round-robin over each pair with the replay cache on.
    F_LB[postgres]="$(free_port)"; F_LB[front]="$(free_port)"
    {
        echo "worker_processes 1; pid $WORK/nginx-f.pid; error_log $WORK/nginx-f.err;"
        echo "events { worker_connections 4096; }"
        echo "http { access_log off;"
        echo "  client_body_temp_path $WORK; proxy_temp_path $WORK; fastcgi_temp_path $WORK; uwsgi_temp_path $WORK; scgi_temp_path $WORK;"
        for pair in postgres front; do
            echo "  upstream f_$pair { $(for a in ${F_ADDRS[$pair]}; do printf 'server %s; ' "$a"; done) keepalive 64; }"
            echo "  server { listen 127.0.0.1:${F_LB[$pair]}; location / { proxy_pass http://f_$pair; proxy_http_version 1.1;"
            echo "    proxy_set_header Connection \"\"; proxy_next_upstream off; } }"
        done
        echo "}"
    } > "$WORK/nginx-f.conf"
    nginx -c "$WORK/nginx-f.conf" -p "$WORK"
    log "part F: round-robin nginx on :${F_LB[postgres]} (postgres pair), :${F_LB[front]} (front pair)"

    f_stmts() { # database -> top-level statements executed in it so far
        psql "$FPG/postgres" -tAc "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '$1'"
    }
    f_wal() { psql "$FPG/postgres" -tAc "SELECT pg_current_wal_lsn() - '0/0'"; } # WAL bytes written so far (the whole server)
    f_ticks() { # pid... -> "pid:ticks ..." (processes that are gone are skipped)
        local p t
        for p in "$@"; do t="$(cpu_ticks "$p" 2>/dev/null)" && echo -n "$p:$t "; done
    }
    f_pg_ticks() { f_ticks "$FPG_PM" $(pgrep -P "$FPG_PM"); }
    # Per gateway of a pair, from its /metrics: "requests,front_answers,
    # front_misses,front_errors,front_outages ..." (requests: all outcomes).
    f_metrics() { # admin ports
        local a
        for a in "$@"; do
            curl -sf "http://127.0.0.1:$a/metrics" | awk '/^idemgate_requests_total/ {r += $NF} /^idemgate_front_answers_total/ {an += $NF}
                /^idemgate_front_misses_total/ {m += $NF} /^idemgate_front_errors_total/ {e += $NF} /^idemgate_front_outages_total/ {o += $NF}
                END {printf "%d,%d,%d,%d,%d ", r, an, m, e, o}'
        done
    }
    # Deltas of two f_metrics snapshots: "share_of_first_gateway
    # front_answered_fraction (-1: no front) front_errors front_outages".
    f_metrics_delta() { # before after
        python3 -c '
import sys
b = [[int(x) for x in g.split(",")] for g in sys.argv[1].split()]
a = [[int(x) for x in g.split(",")] for g in sys.argv[2].split()]
d = [[y - x for x, y in zip(gb, ga)] for gb, ga in zip(b, a)]
req = [g[0] for g in d]
ans, miss, err, out = (sum(g[i] for g in d) for i in (1, 2, 3, 4))
print(f"{req[0] / max(sum(req), 1):.3f} {ans / (ans + miss) if ans + miss else -1:.3f} {err} {out}")' "$1" "$2"
    }
    # CPU µs per request between two f_ticks snapshots: every process of the
    # second, less what the first had (a process born in between counts whole).
    f_cpu_us() { # before after requests
        python3 -c '
import os, sys
b = dict(x.split(":") for x in sys.argv[1].split())
a = dict(x.split(":") for x in sys.argv[2].split())
t = sum(int(v) - int(b.get(p, 0)) for p, v in a.items()) / os.sysconf("SC_CLK_TCK")
print(f"{t * 1e6 / max(int(sys.argv[3]), 1):.1f}")' "$1" "$2" "$3"
    }

    # The idle rate of each pair's database (statements/s with no load: the
    # front's relays poll every 50 ms per gateway, the sweepers), subtracted
    # from every row.
    sleep 2
    declare -A F_IDLE
    F_IDLE_S=5
    for pair in postgres postgres-nocache front front-nocache; do F_IDLE[$pair]="$(f_stmts "${F_DB[$pair]}")"; done
    t0="$(date +%s.%N)"; sleep "$F_IDLE_S"; t1="$(date +%s.%N)"
    for pair in postgres postgres-nocache front front-nocache; do
        F_IDLE[$pair]="$(python3 -c "print(f'{($(f_stmts "${F_DB[$pair]}") - ${F_IDLE[$pair]}) / ($t1 - $t0):.2f}')")"
        echo "$pair ${F_DB[$pair]} ${F_IDLE[$pair]}" >> "$WORK/f_idle"
        log "part F: idle statements/s in ${F_DB[$pair]}: ${F_IDLE[$pair]}"
    done

    # measure_pair SPEC...: each SPEC is "NAME PAIR MODE [PATH]"; like
    # measure (interleaved per concurrency and repeat), onto $WORK/f_rows:
    # "NAME c rps p50 p99 non2xx requests socket_errors gateways_cpu_us
    # pg_cpu_us redis_cpu_us statements_per_request statements_raw", and for
    # storms "NAME c requests socket_errors keys executions max_per_key
    # keys_executed_twice_or_more" onto $WORK/f_storms.
    measure_pair() {
        local c i spec name pair mode path port addrs line reqs s0 s1 t0 t1 g0 g1 p0 p1 r0 r1 m0 m1 md w0 w1 stmts stats
        for c in ${ONLY_C:-$CONCURRENCY}; do
            for i in $(seq 1 "$REPEATS"); do
                for spec in "$@"; do
                    read -r name pair mode path <<<"$spec"
                    if [ "$mode" = storm ]; then
                        counts >/dev/null; port="${F_LB[$pair]}"; addrs=""
                    else
                        port="${F_PORT1[$pair]}"; addrs="${F_ADDRS[$pair]}"
                    fi
                    s0="$(f_stmts "${F_DB[$pair]}")"; w0="$(f_wal)"; t0="$(date +%s.%N)"
                    g0="$(f_ticks ${F_PIDS[$pair]})"; p0="$(f_pg_ticks)"; r0="$(f_ticks "$REDIS_PID")"; m0="$(f_metrics ${F_ADMINS[$pair]})"
                    line="$(ADDRS="$addrs" wrk_once "$port" "$mode" "$c" "$path")"
                    [ "$mode" = storm ] && sleep 0.5 # requests already forwarded when wrk stopped
                    sleep 0.2 # the relay's last outbox rows
                    g1="$(f_ticks ${F_PIDS[$pair]})"; p1="$(f_pg_ticks)"; r1="$(f_ticks "$REDIS_PID")"; m1="$(f_metrics ${F_ADMINS[$pair]})"
                    s1="$(f_stmts "${F_DB[$pair]}")"; w1="$(f_wal)"; t1="$(date +%s.%N)"
                    reqs="$(echo "$line" | awk '{print $5}')"
                    stmts="$(python3 -c "print(f'{($s1 - $s0 - ${F_IDLE[$pair]} * ($t1 - $t0)) / max($reqs, 1):.3f} {($s1 - $s0) / max($reqs, 1):.3f}')")"
                    md="$(f_metrics_delta "$m0" "$m1")"
                    echo "$name $c $line $(f_cpu_us "$g0" "$g1" "$reqs") $(f_cpu_us "$p0" "$p1" "$reqs") $(f_cpu_us "$r0" "$r1" "$reqs") $stmts $md $(python3 -c "print(round(($w1 - $w0) / max($reqs, 1)))")" >> "$WORK/f_rows"
                    if [ "$mode" = storm ]; then
                        stats="$(counts)"
                        echo "$name $c $(echo "$line" | awk '{print $5, $6}') $stats" >> "$WORK/f_storms"
                        log "$name c=$c #$i: $line pg_stmts/req(net raw)=$stmts gw1_share/front_answered/front_errors/outages=$md upstream(keys executions max dup_keys)=$stats"
                    else
                        log "$name c=$c #$i: $line pg_stmts/req(net raw)=$stmts gw1_share/front_answered/front_errors/outages=$md"
                    fi
                done
            done
        done
    }

    # 1. Same-key storms, on the storm route (concurrent = "reject": an
    #    in-flight duplicate gets 409), at STORM_C through the round-robin.
    for size in $F_STORMS; do
        STORM="$size" ONLY_C="$STORM_C" measure_pair \
            "F-storm-postgres-s$size postgres storm /storm/payments" \
            "F-storm-front-s$size front storm /storm/payments"
    done

    # 2. Cross-instance replays: the hot set completed through each pair's
    #    first gateway, replayed through both.
    for pair in postgres postgres-nocache front front-nocache; do preload "${F_PORT1[$pair]}"; done
    sleep 0.5
    measure_pair "F-hot-postgres-nocache postgres-nocache hot" "F-hot-front-nocache front-nocache hot" \
                 "F-hot-postgres postgres hot" "F-hot-front front hot"

    # 3. New keys, then one Redis round trip for scale (redis-benchmark PING,
    #    one connection, one request at a time).
    measure_pair "F-new-postgres postgres new" "F-new-front front new"
    # The same with one connection per gateway: no queueing, the added
    # latency itself.
    ONLY_C=2 measure_pair "F-new-postgres postgres new" "F-new-front front new"
    for i in $(seq 1 "$REPEATS"); do
        redis-benchmark -p "$REDISPORT" -c 1 -n 20000 -t ping --csv 2>/dev/null \
            | awk -F'"' '/PING_MBULK/ {print "redis-ping", $6, $10, $14}' >> "$WORK/f_ping" # avg p50 p99 (ms)
    done
fi

while read -r name pid; do
    echo "$name $(awk '/VmHWM/ {print $2}' "/proc/$pid/status")" >> "$WORK/rss"
done < "$WORK/rss.pids"

# ---- memory: 10,000 idle connections ------------------------------------------------
# bench/memory.py's idle-h1 scenario as it is (its own fresh gateway on a
# memory:// store and the demo upstream; steps 1,000, 5,000, 10,000): the
# report takes its 10,000 row.
if want memory; then
    log "memory: 10,000 idle HTTP/1.1 and HTTP/2 connections (bench/memory.py --only idle-h1,idle-h2)"
    scenarios=idle-h1,idle-h2
    python3 -c "import h2" 2>/dev/null || pip install -q h2 >&2 || pip install -q --break-system-packages h2 >&2 \
        || { log "no Python h2 module: idle HTTP/2 not measured"; scenarios=idle-h1; }
    (ulimit -n 20000 2>/dev/null || true
     IDEMGATE="$BIN" UPSTREAM="$TARGET_DIR/$PROFILE/demo_upstream" \
         python3 bench/memory.py --only "$scenarios") > "$WORK/memory.md"
fi

# ---- ceilings (ONLY ceil) -----------------------------------------------------------
# ceiling_setup: what the ceilings and part distance run, after a preload
# through the PostgreSQL gateway (for a hot key's fingerprint): pgbench
# scripts (idemgate's claim + complete, the plain pair, its replay claim)
# and idemgate's own Redis claim and complete scripts, loaded into the
# bench's Redis (CLAIM_SHA, COMPLETE_SHA; TOKEN of one completed record).
ceiling_setup() {
preload "$PG_PORT"
FP="$(psql "$PGURL" -tAc "SELECT encode(fingerprint, 'hex') FROM idemgate_records WHERE key = 'hot-000000000000'")"
cat > "$WORK/claim_complete.sql" <<EOF
\set k random(1, 2000000000)
SELECT o_token AS tok FROM idemgate_claim('ceiling', ''::bytea, :client_id || '-' || :k, decode('$FP', 'hex'), 30000, 86400000, false) \gset
UPDATE idemgate_records SET state = 'completed', status = 201, headers = ''::bytea, body = convert_to('{"id":"pay_1","status":"succeeded"}', 'UTF8'), lease_until = NULL, held_reason = NULL, expires_at = clock_timestamp() + 86400000 * INTERVAL '1 millisecond', updated_at = clock_timestamp() WHERE route = 'ceiling' AND scope = ''::bytea AND key = :client_id || '-' || :k AND token = :tok AND state IN ('in_flight', 'completed');
EOF
# The plain pair: what any application would send per key to record it
# (INSERT ON CONFLICT DO NOTHING, then the completion's UPDATE), two
# autocommit statements on the same table and indexes, no function.
cat > "$WORK/plain_pair.sql" <<EOF
\set k random(1, 2000000000)
INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, attempt, lease_until, expires_at) VALUES ('plain', ''::bytea, :client_id || '-' || :k, decode('$FP', 'hex'), 'in_flight', :k, :k, clock_timestamp() + INTERVAL '30 seconds', clock_timestamp() + INTERVAL '1 day') ON CONFLICT DO NOTHING;
UPDATE idemgate_records SET state = 'completed', status = 201, headers = ''::bytea, body = convert_to('{"id":"pay_1","status":"succeeded"}', 'UTF8'), lease_until = NULL, updated_at = clock_timestamp() WHERE route = 'plain' AND scope = ''::bytea AND key = :client_id || '-' || :k AND token = :k;
EOF
cat > "$WORK/replay.sql" <<EOF
\set k random(0, $((HOT - 1)))
SELECT * FROM idemgate_claim('api', ''::bytea, 'hot-' || lpad(:k::text, 12, '0'), decode('$FP', 'hex'), 30000, 86400000, false);
EOF
python3 - "$WORK" <<'PY'
import re, sys
src = open("crates/store/src/redis/scripts.rs").read()
# Each script is format!("{NOW}{INQUIRING}...{}", r#"body"#): its prefixes
# are the file's string constants of those names, as the store sends them.
consts = {m.group(1): m.group(2).replace("\\n", "\n")
          for m in re.finditer(r'const (\w+): &str =\s*"(.*?)";', src, re.S)}
for name in ["CLAIM", "COMPLETE"]:
    m = re.search(r'static %s: .*?format!\(\s*"((?:\{\w+\})*)\{\}",\s*r#"(.*?)"#' % name, src, re.S)
    prefix = "".join(consts[c] for c in re.findall(r"\{(\w+)\}", m.group(1)))
    open(f"{sys.argv[1]}/{name.lower()}.lua", "w").write(prefix + m.group(2))
PY
CLAIM_SHA="$(redis-cli -p "$REDISPORT" SCRIPT LOAD "$(cat "$WORK/claim.lua")")"
COMPLETE_SHA="$(redis-cli -p "$REDISPORT" SCRIPT LOAD "$(cat "$WORK/complete.lua")")"
# One completed record, ceil:done, for the complete and replay ceilings: a
# completion by its own token of a completed record rewrites it in full, as
# a first completion does.
# Claim: KEYS record, token counter, due questions and inquiring records
# (status inquiry; an unscoped record has no scope set); ARGV fingerprint,
# lease, retention, on unknown outcome (0: hold), attempt id, the instant
# it must run by (ms since the epoch; here far ahead), the route's inquiry
# after (ms), then the wake-up channel and id (empty: the route does not
# wait).
FOREVER=99999999999999
# Complete: KEYS record, due questions, inquiring records; ARGV token,
# status, headers, body, retention, then the same pair.
TOKEN="$(redis-cli -p "$REDISPORT" EVALSHA "$CLAIM_SHA" 4 ceil:done ceil:token ceil:due ceil:inq fingerprint 30000 86400000 0 1 "$FOREVER" 0 "" "" | tail -n 1)"
RESPONSE='{"id":"pay_1","status":"succeeded"}'
redis-cli -p "$REDISPORT" EVALSHA "$COMPLETE_SHA" 3 ceil:done ceil:due ceil:inq "$TOKEN" 201 "" "$RESPONSE" 86400000 "" "" >/dev/null
}
ceil_row() { # name clients value: a ceiling's row (a ceiling that failed is said, not recorded)
    if [ -n "$3" ]; then echo "$1 $2 $3 - - - -" >> "$WORK/raw"; else log "ceiling $1 c=$2 failed: no figure"; fi
}
pgbench_tps() { # script clients [port]
    "$PGBIN/pgbench" -n -h 127.0.0.1 -p "${3:-$PGPORT}" -U postgres -c "$2" -j 2 -T "$DURATION" -f "$1" postgres 2>/dev/null \
        | awk '/^tps/ {print int($3)}'
}
redis_rps() { # clients, command... (REDIS_AT: another port than the bench's Redis)
    local c="$1"; shift
    redis-benchmark -p "${REDIS_AT:-$REDISPORT}" -c "$c" -n "${REDIS_N:-200000}" -r 1000000000 -q "$@" \
        | grep -o '[0-9.]* requests per second' | awk '{print int($1)}' | tail -n 1
}
if want ceil; then
ceiling_setup
log "pgbench ceilings"
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        ceil_row ceil-pg-claim-complete $c "$(pgbench_tps "$WORK/claim_complete.sql" "$c")"
        ceil_row ceil-pg-plain-pair $c "$(pgbench_tps "$WORK/plain_pair.sql" "$c")"
        ceil_row ceil-pg-replay $c "$(pgbench_tps "$WORK/replay.sql" "$c")"
    done
done

log "redis-benchmark ceilings (idemgate's own claim and complete scripts)"
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        ceil_row ceil-redis-claim $c "$(redis_rps "$c" EVALSHA "$CLAIM_SHA" 4 "ceil:rec:__rand_int__" ceil:token ceil:due ceil:inq fingerprint 30000 86400000 0 1 "$FOREVER" 0 "" "")"
        ceil_row ceil-redis-complete $c "$(redis_rps "$c" EVALSHA "$COMPLETE_SHA" 3 ceil:done ceil:due ceil:inq "$TOKEN" 201 "" "$RESPONSE" 86400000 "" "")"
        ceil_row ceil-redis-replay $c "$(redis_rps "$c" EVALSHA "$CLAIM_SHA" 4 ceil:done ceil:token ceil:due ceil:inq fingerprint 30000 86400000 0 1 "$FOREVER" 0 "" "")"
    done
done

log "SQLite ceiling (plain INSERT + UPDATE pairs, autocommit, WAL, synchronous = FULL)"
for c in $CONCURRENCY; do
    for i in $(seq 1 "$REPEATS"); do
        ceil_row ceil-sqlite-insert-update $c "$(python3 bench/sqlite_ceiling.py "$WORK/ceiling.db" "$c" "$DURATION")"
    done
done
for i in $(seq 1 "$REPEATS"); do
    echo "ceil-sqlite-serial 1 $(python3 bench/sqlite_ceiling.py "$WORK/ceiling.db" 1 "$DURATION") - - - -" >> "$WORK/raw"
done

fi # ceil

# ---- distance: the store another host away (bench/distance.sh) ------------------------
if want distance; then
    source bench/distance.sh
    grep -v '^dist-' "$WORK/raw" > "$WORK/raw.main" || true
    mv "$WORK/raw.main" "$WORK/raw"
fi

# ---- overload: past the sustainable rate (bench/overload.sh) ---------------------------
if want overload; then
    source bench/overload.sh
fi

# ---- wait: what [store] replicas = 1 costs ------------------------------------------
# Last, so that no other row runs with a replica attached. A replica of the
# bench's Redis (no persistence), then two gateways identical to
# idemgate-redis and idemgate-redis-nocache (the same Redis database 0 and
# prefix: the hot set preloaded through idemgate-redis serves all four) but
# with replicas = 1: a record and a hold are pipelined with WAIT 1 100, a
# claim that took its key is followed by it in a second round trip. WAIT waits for the replication offset, which is the server's, so the
# shared database changes nothing. The primary must report the replica
# connected and online before and after the rows, or the part fails.
if want wait; then
    REPLPORT="$(free_port)"
    mkdir -p "$WORK/replica"
    log "wait: Redis replica of :$REDISPORT on 127.0.0.1:$REPLPORT"
    redis-server --port "$REPLPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
        --replicaof 127.0.0.1 "$REDISPORT" --dir "$WORK/replica" >"$WORK/replica.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 1 300); do
        redis-cli -p "$REPLPORT" INFO replication 2>/dev/null | grep -q '^master_link_status:up' && break
        sleep 0.1
    done
    wait_replica_check() { # when: exits non-zero unless the primary has exactly one replica, online
        local info
        info="$(redis-cli -p "$REDISPORT" INFO replication | tr -d '\r' || true)"
        if ! grep -qx 'connected_slaves:1' <<<"$info" || ! grep -q '^slave0:.*state=online' <<<"$info"; then
            log "wait: $1: the primary (:$REDISPORT) has no connected, online replica; INFO replication:"
            printf '%s\n' "$info" >&2
            [ -f "$WORK/replica.log" ] && tail -n 20 "$WORK/replica.log" >&2
            exit 1
        fi
    }
    W_EXTRA=$'replicas = 1\nreplica_timeout = "100ms"'
    STORE_EXTRA="$W_EXTRA" start_gateway redis-wait1 "redis://127.0.0.1:$REDISPORT/" 5s
    W1_PORT="$GW_PORT"; W1_PID="$GW_PID"; W1_ADMIN="$GW_ADMIN"
    STORE_EXTRA="$W_EXTRA" start_gateway redis-wait1-nocache "redis://127.0.0.1:$REDISPORT/" 0s
    W1N_PORT="$GW_PORT"; W1N_PID="$GW_PID"; W1N_ADMIN="$GW_ADMIN"
    # Per gateway, from its /metrics: "requests store_error_answers
    # store_op_errors store_ops_over_64ms" (idemgate_requests_total, its
    # outcome="store_error", idemgate_store_duration_seconds_count with
    # result="error", and the operations above its 0.064 s bucket: a WAIT
    # near its 100 ms timeout shows there).
    w_metrics() { # admin port
        curl -sf "http://127.0.0.1:$1/metrics" | awk '/^idemgate_requests_total/ {r += $NF}
            /^idemgate_requests_total.*outcome="store_error"/ {e += $NF}
            /^idemgate_store_duration_seconds_count.*result="error"/ {o += $NF}
            /^idemgate_store_duration_seconds_bucket\{le="\+Inf"/ {s += $NF}
            /^idemgate_store_duration_seconds_bucket\{le="0.064"/ {s -= $NF}
            END {printf "%d %d %d %d", r, e, o, s}'
    }
    w_waits() { # -> WAIT calls and their total µs on the primary so far
        redis-cli -p "$REDISPORT" INFO commandstats | tr -d '\r' \
            | awk -F'[:=,]' '/^cmdstat_wait:/ {c = $3; u = $5} END {printf "%d %d", c, u}'
    }
    wait_replica_check "before the rows"
    declare -A W_M0
    for gw in "redis $RD_ADMIN" "redis-nocache $RN_ADMIN" "redis-wait1 $W1_ADMIN" "redis-wait1-nocache $W1N_ADMIN"; do
        read -r name admin <<<"$gw"; W_M0[$name]="$(w_metrics "$admin")"
    done
    W_WAIT0="$(w_waits)"
    measure "wait-B-0 $RD_PORT new $RD_PID" "wait-B-1 $W1_PORT new $W1_PID" \
            "wait-C-0 $RN_PORT hot $RN_PID" "wait-C-1 $W1N_PORT hot $W1N_PID"
    sleep 0.5 # records still being written when wrk stopped
    wait_replica_check "after the rows"
    W_WAIT1="$(w_waits)"
    for gw in "redis $RD_ADMIN" "redis-nocache $RN_ADMIN" "redis-wait1 $W1_ADMIN" "redis-wait1-nocache $W1N_ADMIN"; do
        read -r name admin <<<"$gw"
        # name replicas requests store_error_answers store_op_errors store_ops_over_64ms
        # (deltas over the rows) log_lines (its whole life, RUST_LOG=warn)
        echo "$name $(case "$name" in *wait1*) echo 1 ;; *) echo 0 ;; esac) $(python3 -c 'import sys; print(*(int(a) - int(b) for a, b in zip(sys.argv[2].split(), sys.argv[1].split())))' \
            "${W_M0[$name]}" "$(w_metrics "$admin")") $(wc -l < "$WORK/$name.log")" >> "$WORK/wait_gateways"
    done
    echo "$W_WAIT0 $W_WAIT1" > "$WORK/wait_cmds"
    redis-cli -p "$REDISPORT" INFO replication | tr -d '\r' | grep -E '^(connected_slaves|slave0|master_repl_offset):' > "$WORK/wait_replication" || true

    # One connection, one command at a time, no other load: SET, and SET
    # pipelined with WAIT 1 100 (what the gateway sends), alternately; the
    # median round trip of each (the machine's other load shows in means).
    cat > "$WORK/wait_rtt.py" <<'PY'
import socket, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
def cmd(*a):
    return b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in a)
WAIT = cmd(b"WAIT", b"1", b"100")
short, t = 0, {False: [], True: []}
for i in range(n + 500):
    for wait in (False, True):
        t0 = time.perf_counter()
        s.sendall(cmd(b"SET", b"bench-rtt:%d" % (i % 100), b"%d" % i) + (WAIT if wait else b""))
        assert f.readline() == b"+OK\r\n"
        if wait and f.readline() != b":1\r\n":
            short += 1
        if i >= 500: # warm-up
            t[wait].append(time.perf_counter() - t0)
print(f"{statistics.median(t[False]) * 1e6:.1f} {statistics.median(t[True]) * 1e6:.1f} {short}")
PY
    for i in $(seq 1 "$REPEATS"); do
        python3 "$WORK/wait_rtt.py" "$REDISPORT" 5000 >> "$WORK/wait_rtt"
    done
    log "wait: SET vs SET+WAIT round trips (µs, shortfalls): $(tr '\n' ';' < "$WORK/wait_rtt")"
fi

# ---- report --------------------------------------------------------------------------
# Parts with their own results file (distance, overload) leave the main one alone.
[ -z "$(echo " $ONLY " | sed 's/ distance / /g; s/ overload / /g' | tr -d ' ')" ] && exit 0
mkdir -p "$(dirname "$RESULTS")"
python3 - "$WORK" "$RESULTS" "$DURATION" "$REPEATS" "$(git rev-parse --short HEAD)" "$ONLY" "${BASE_REV:-}" "${PEER_BIN:+$PEER_VERSION}" <<'PY'
import statistics, sys, collections, datetime, os, re
work, out, duration, repeats, commit, only, baseline, peer_version = sys.argv[1:]
baseline = baseline[:12]
rows = collections.defaultdict(list)
for line in open(f"{work}/raw"):
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
def storm_key(n):
    base, size = n.rsplit("-s", 1)
    order = ["D-postgres", "D-redis", "D-redis-wait", "D-peer", "D-sqlite"]
    return (int(size), order.index(base) if base in order else 99, base)
storms = sorted({n for n, _ in rows if n.startswith("D-")}, key=storm_key)
# Redis runs one script at a time: a request's two calls cost the sum of
# their times, so the pair ceiling is 1 / (1/claim + 1/complete).
for c in {c for _, c in rows}:
    a, b = rows.get(("ceil-redis-claim", c), []), rows.get(("ceil-redis-complete", c), [])
    for x, y in zip(a, b):
        rows[("ceil-redis-claim+complete", c)].append((1 / (1 / x[0] + 1 / y[0]), "-", "-", "-", "-"))
names = ["A-direct", "A-nginx", "A-idemgate", "A-idemgate-before",
         "B-postgres", "B-postgres-shared", "B-postgres-before", "B-redis", "B-redis-before", "B-peer", "B-sqlite",
         "C-postgres", "C-postgres-before", "C-redis", "C-redis-nocache", "C-peer", "C-sqlite",
         "log-A-warn", "log-A-info", "log-C-warn", "log-C-info",
         "trace-B-off", "trace-B-on", "trace-C-off", "trace-C-on",
         "seal-B-off", "seal-B-on", "seal-C-off", "seal-C-on",
         "wait-B-0", "wait-B-1", "wait-C-0", "wait-C-1"] + storms + [
         "ceil-pg-claim-complete", "ceil-pg-plain-pair", "ceil-pg-replay", "ceil-redis-claim", "ceil-redis-complete",
         "ceil-redis-claim+complete", "ceil-redis-replay", "ceil-sqlite-insert-update", "ceil-sqlite-serial"]
measured = [n for n in names if not n.startswith("ceil-")]
L = [f"# idemgate benchmark — {datetime.date.today()}", "",
     f"Commit {commit}" + (f", baseline {baseline} (rows `-before`: the same config, its own PostgreSQL and Redis database)" if baseline else "") + f". Parts: {only}.",
     "2 cores shared by everything (wrk -t2, nginx 1 worker each, PostgreSQL, Redis, the gateways).",
     f"{duration} s per run, {repeats} runs per cell, compared rows interleaved; requests/s as median (min–max). 512-byte JSON POST;",
     "upstream: nginx returning a static 201 (storms: a Python upstream counting requests per key).",
     "idemgate with RUST_LOG=warn (no per-request log line) except `log-*-info`, replay_cache_ttl = \"5s\" (its default)",
     "except `C-redis-nocache` (\"0s\"); PostgreSQL with synchronous_commit on (its default), Redis without persistence,",
     "SQLite with WAL and synchronous = FULL (idemgate's settings)."]
if peer_version:
    L += [f"Peer: idempotent-proxy-server {peer_version} (crates.io) on the same Redis and upstreams, RUST_LOG=warn,",
          "REQUEST_TIMEOUT=86400000 (lock and result TTL), POLL_INTERVAL=10 (ms; a duplicate in flight polls Redis until the answer)."]
if cs:
    L += ["", "## Throughput (requests/s)", "", "| run | " + " | ".join(f"c={c}" for c in cs) + " |",
         "|---|" + "---|" * len(cs)]
for n in names:
    if any((n, c) in rows for c in cs):
        L.append(f"| {n} | " + " | ".join(cell(n, c) for c in cs) + " |")
if cs:
    L += ["", "## Latency and CPU (medians)", "", "| run | c | p50 ms | p99 ms | non-2xx | gateway CPU µs/req |", "|---|---|---|---|---|---|"]
for n in measured:
    for c in cs:
        if (n, c) in rows:
            L.append(f"| {n} | {c} | {med(n,c,1):.2f} | {med(n,c,2):.2f} | {med(n,c,3):.0f} | {('%.1f' % med(n,c,4)) if med(n,c,4) is not None else '—'} |")
st = collections.defaultdict(list)
for line in open(f"{work}/storms"):
    f = line.split()
    if len(f) == 8:
        st[f[0]].append([int(x) for x in f[1:]])
STORM_HEAD = ["| {} | c | requests | socket errors | keys | executions | executions per key | max per key | keys executed more than once | non-2xx |",
              "|---|---|---|---|---|---|---|---|---|---|"]
def storm_rows(names, counts, runs):
    """One line per storm row: its upstream counts summed over the runs
    (counts[n]: c requests socket_errors keys executions max_per_key
    keys_more_than_once) and its non-2xx answers from runs[(n, c)]."""
    out = []
    for n in names:
        if n in counts:
            c = counts[n][0][0]
            reqs, errs, keys, ex, dup = (sum(r[i] for r in counts[n]) for i in (1, 2, 3, 4, 6))
            mx = max(r[5] for r in counts[n])
            non2xx = sum(int(r[3]) for r in runs.get((n, c), []))
            out.append(f"| {n} | {c} | {reqs:,} | {errs:,} | {keys:,} | {ex:,} | {ex / keys if keys else 0:.3f} | {mx} | {dup} | {non2xx:,} |")
    return out
if st:
    L += ["", "## Same-key storms: executions per key (all runs summed)", "",
          "Requests: answered to wrk (any status); socket errors: wrk's (timeouts: no answer within 2 s); keys: distinct keys",
          "that reached the upstream; executions: requests that reached it (1.000 per key: exactly once).",
          "", STORM_HEAD[0].format("run"), STORM_HEAD[1]]
    L += storm_rows(storms, st, rows)
if cs:
    L += ["", "## Ratios (medians)", "", "| ratio | " + " | ".join(f"c={c}" for c in cs) + " | target |", "|---|" + "---|" * len(cs) + "---|"]
def ratio(a, b, c):
    x, y = med(a, c), med(b, c)
    return f"{x / y:.2f}" if x and y else "—"
for label, a, b, target in [
    ("B postgres ÷ pgbench claim+complete", "B-postgres", "ceil-pg-claim-complete", "≥ 1.0 (stretch 2.0)"),
    ("B postgres ÷ pgbench plain pair (INSERT ON CONFLICT DO NOTHING + UPDATE)", "B-postgres", "ceil-pg-plain-pair", "≥ 1.0"),
    ("B postgres ÷ B redis (PostgreSQL as fast as Redis)", "B-postgres", "B-redis", "≥ 0.9"),
    ("B postgres, serving threads ÷ shared runtime (server_threads = 0)", "B-postgres", "B-postgres-shared", "≥ 1.0"),
    ("C postgres ÷ pgbench replay", "C-postgres", "ceil-pg-replay", "≥ 0.8"),
    ("B redis ÷ redis claim ⊕ complete scripts", "B-redis", "ceil-redis-claim+complete", "≥ 0.8"),
    ("B sqlite ÷ plain SQLite insert+update pairs", "B-sqlite", "ceil-sqlite-insert-update", "—"),
    ("C redis ÷ redis replay (claim script on a completed record)", "C-redis", "ceil-redis-replay", "—"),
    ("A idemgate ÷ nginx proxy", "A-idemgate", "A-nginx", "—"),
    ("A idemgate with its default info log (log-A-info) ÷ nginx proxy", "log-A-info", "A-nginx", "≥ 1.0"),
    ("replay (C postgres) ÷ static upstream direct", "C-postgres", "A-direct", "≥ 0.8"),
    ("replay (C redis) ÷ static upstream direct", "C-redis", "A-direct", "≥ 0.8"),
    ("replay at the default info log (log-C-info) ÷ static upstream direct", "log-C-info", "A-direct", "≥ 0.8"),
    ("A idemgate ÷ direct", "A-idemgate", "A-direct", "—"),
    ("keyed (B postgres) ÷ unkeyed (A idemgate)", "B-postgres", "A-idemgate", "—"),
    ("keyed (B redis) ÷ unkeyed (A idemgate)", "B-redis", "A-idemgate", "≥ 0.6"),
    ("new keys: idemgate Redis (B redis) ÷ peer (B peer)", "B-redis", "B-peer", "≥ 1.5"),
    ("replays: idemgate Redis, cache on (C redis) ÷ peer (C peer)", "C-redis", "C-peer", "—"),
    ("replays: idemgate Redis, cache off (C redis-nocache) ÷ peer (C peer)", "C-redis-nocache", "C-peer", "—"),
    ("replay cache on ÷ off (C redis ÷ C redis-nocache)", "C-redis", "C-redis-nocache", "—"),
    ("before→after: A idemgate", "A-idemgate", "A-idemgate-before", "—"),
    ("before→after: B postgres", "B-postgres", "B-postgres-before", "—"),
    ("before→after: B redis", "B-redis", "B-redis-before", "—"),
    ("before→after: C postgres", "C-postgres", "C-postgres-before", "—"),
    ("log info ÷ warn: pass-through", "log-A-info", "log-A-warn", "—"),
    ("log info ÷ warn: replay", "log-C-info", "log-C-warn", "—"),
    ("tracing on ÷ off: new keys (PostgreSQL)", "trace-B-on", "trace-B-off", "—"),
    ("tracing on ÷ off: replays (Redis)", "trace-C-on", "trace-C-off", "—"),
    ("sealed ÷ plain: new keys (Redis, 2 KiB answer)", "seal-B-on", "seal-B-off", "within a few %"),
    ("sealed ÷ plain: replays, replay cache off (Redis, 2 KiB answer)", "seal-C-on", "seal-C-off", "within a few %"),
    ("replicas = 1 ÷ 0: new keys (Redis)", "wait-B-1", "wait-B-0", "—"),
    ("replicas = 1 ÷ 0: replays, replay cache off (Redis)", "wait-C-1", "wait-C-0", "—"),
]:
    if any(med(a, c) and med(b, c) for c in cs):
        L.append(f"| {label} | " + " | ".join(ratio(a, b, c) for c in cs) + f" | {target} |")
def cpu_ratio(a, b, c):
    x, y = med(a, c, 4), med(b, c, 4)
    return f"{x / y:.2f}" if x and y else "—"
for label, a, b, target in [
    ("gateway CPU per new key (B postgres) ÷ per pass-through (A idemgate)", "B-postgres", "A-idemgate", "≤ 1.5"),
    ("gateway CPU per new key (B redis) ÷ per pass-through (A idemgate)", "B-redis", "A-idemgate", "≤ 1.5"),
    ("before→after gateway CPU: B postgres", "B-postgres", "B-postgres-before", "—"),
    ("before→after gateway CPU: C postgres", "C-postgres", "C-postgres-before", "—"),
    ("gateway CPU, replicas = 1 ÷ 0: new keys (Redis)", "wait-B-1", "wait-B-0", "—"),
    ("gateway CPU, replicas = 1 ÷ 0: replays, replay cache off (Redis)", "wait-C-1", "wait-C-0", "—"),
]:
    if any(med(a, c, 4) and med(b, c, 4) for c in cs):
        L.append(f"| {label} | " + " | ".join(cpu_ratio(a, b, c) for c in cs) + f" | {target} |")
# Gateway CPU µs per request of two rows side by side, with the difference.
for first, title, pairs in [
    ("log-A-info", "Per-request log line (default level info vs RUST_LOG=warn), gateway CPU µs per request, info − warn:",
     [("pass-through", "log-A-info", "log-A-warn"), ("replay", "log-C-info", "log-C-warn")]),
    ("trace-B-on", "Tracing on (every request sampled, exported) vs off, gateway CPU µs per request, on − off:",
     [("new keys (PostgreSQL)", "trace-B-on", "trace-B-off"), ("replays (Redis)", "trace-C-on", "trace-C-off")]),
    ("seal-B-on", "Sealed records vs plain (Redis, 2 KiB answer, replay cache off), gateway CPU µs per request, sealed − plain:",
     [("new keys", "seal-B-on", "seal-B-off"), ("replays", "seal-C-on", "seal-C-off")]),
]:
    if not any((first, c) in rows for c in cs):
        continue
    L += ["", title, ""]
    for kind, a, b in pairs:
        parts = [f"c={c}: {med(a,c,4):.1f} − {med(b,c,4):.1f} = {med(a,c,4) - med(b,c,4):+.1f}" for c in cs
                 if med(a, c, 4) is not None and med(b, c, 4) is not None]
        L.append(f"- {kind}: " + "; ".join(parts))
if os.path.exists(f"{work}/traces"):
    pg_dropped, redis_dropped, posts, size = open(f"{work}/traces").read().split()
    L.append(f"- spans dropped (idemgate_trace_spans_dropped_total): {int(pg_dropped):,} on PostgreSQL, {int(redis_dropped):,} on Redis; "
             f"the sink took {int(posts):,} exports, {int(size) / 2**20:.1f} MiB.")
if os.path.exists(f"{work}/loglines"):
    lines, size = open(f"{work}/loglines").read().split()
    L.append(f"- the info gateway's log file: {int(lines):,} lines, {int(size) / 2**20:.1f} MiB (one line per request).")
if any(("A-direct", c) in rows for c in cs):
    L += ["", "Added latency vs direct (p50 / p99, ms):", ""]
    for n in measured:
        if n == "A-direct" or n.startswith(("D-", "log-", "trace-", "wait-")):
            continue
        parts = []
        for c in cs:
            if (n, c) in rows and ("A-direct", c) in rows:
                parts.append(f"c={c}: {med(n,c,1) - med('A-direct',c,1):+.2f} / {med(n,c,2) - med('A-direct',c,2):+.2f}")
        if parts:
            L.append(f"- {n}: " + "; ".join(parts))
# Part wait: [store] replicas = 1 (WAIT after each claim and record) vs 0.
if os.path.exists(f"{work}/wait_gateways"):
    L += ["", "## wait: what `[store] replicas = 1` costs (Redis)", "",
          "A Redis replica of the bench's Redis (no persistence, same host) runs for this part only (it comes last). `wait-B-0`: new keys",
          "on idemgate-redis (replicas = 0, replay cache \"5s\"); `wait-B-1`: an identical gateway with `replicas = 1`,",
          "`replica_timeout = \"100ms\"` (a record and a hold pipelined with `WAIT 1 100`; a claim that takes its key followed by it in a second round trip).",
          "`wait-C-0`, `wait-C-1`: replays of the hot set on the same pair with the replay cache off (\"0s\"; with it on, replays",
          "do not reach Redis). All four gateways share Redis database 0 and prefix (WAIT waits for the server's replication",
          "offset, whatever the database); the replica is attached during all four rows, so the replicas = 0 rows pay the",
          "replication stream too, and only the WAIT differs. The primary reported one connected, online replica before and after the rows."]
    for kind, a, b in [("new keys", "wait-B-1", "wait-B-0"), ("replays, replay cache off", "wait-C-1", "wait-C-0")]:
        parts = [f"c={c}: {med(b,c):,.0f} → {med(a,c):,.0f} requests/s ({med(a,c) / med(b,c):.2f}×), p50 {med(b,c,1):.2f} → {med(a,c,1):.2f} ms, "
                 f"p99 {med(b,c,2):.2f} → {med(a,c,2):.2f} ms, CPU {med(b,c,4):.1f} → {med(a,c,4):.1f} µs/req"
                 for c in cs if med(a, c) and med(b, c) and med(a, c, 4) is not None and med(b, c, 4) is not None]
        if parts:
            L.append(f"- {kind}, replicas 0 → 1: " + "; ".join(parts))
    tot = {n: sum(int(r[3]) for c in cs for r in rows.get((n, c), [])) for n in ["wait-B-0", "wait-B-1", "wait-C-0", "wait-C-1"]}
    L.append("- non-2xx answers, all runs summed (a WAIT shortfall is a 503): " + ", ".join(f"{n} {v:,}" for n, v in tot.items()) + ".")
    gws = [l.split() for l in open(f"{work}/wait_gateways")]
    L.append("- per gateway over the rows (/metrics): " + "; ".join(
        f"{g[0]} (replicas {g[1]}): {int(g[2]):,} requests, {int(g[3]):,} store_error answers, {int(g[4]):,} failed store operations, "
        f"{int(g[5]):,} store operations over 64 ms, {int(g[6]):,} log lines at warn or above" for g in gws) + ".")
    c0, u0, c1, u1 = (int(x) for x in open(f"{work}/wait_cmds").read().split())
    w_reqs = {g[0]: int(g[2]) for g in gws}
    r1 = w_reqs.get("redis-wait1", 0) + w_reqs.get("redis-wait1-nocache", 0)
    if c1 > c0:
        L.append(f"- WAIT on the primary over the rows (INFO commandstats): {c1 - c0:,} calls, {(u1 - u0) / (c1 - c0):.2f} µs each "
                 f"(as commandstats counts it), {(c1 - c0) / max(r1, 1):.2f} per request "
                 "of the replicas = 1 gateways.")
    else:
        L.append("- WAIT on the primary over the rows (INFO commandstats): none — the replicas = 1 gateways did not wait.")
    if os.path.exists(f"{work}/wait_replication"):
        L.append("- the primary after the rows: " + ", ".join(f"`{l.strip()}`" for l in open(f"{work}/wait_replication")) + ".")
    if os.path.exists(f"{work}/wait_rtt"):
        rtt = [[float(x) for x in l.split()] for l in open(f"{work}/wait_rtt")]
        a, b = statistics.median(r[0] for r in rtt), statistics.median(r[1] for r in rtt)
        L.append(f"- one connection, one command at a time, no other load (Python; SET and SET + WAIT 1 100 pipelined, alternately, "
                 f"5,000 each per run; the median round trip, median of {len(rtt)} runs): SET {a:.1f} µs, SET + WAIT {b:.1f} µs "
                 f"({b - a:+.1f} µs: the replica's acknowledgement); WAIT shortfalls: {int(sum(r[2] for r in rtt))}.")
# Part F: PostgreSQL alone vs the Redis front, two gateways each.
frows = collections.defaultdict(list)
if os.path.exists(f"{work}/f_rows"):
    for line in open(f"{work}/f_rows"):
        f = line.split()
        # name c rps p50 p99 non2xx requests errors gw_cpu pg_cpu redis_cpu stmts stmts_raw
        #   share_gw1 front_answered front_errors front_outages wal_bytes
        frows[(f[0], int(f[1]))].append([float(x) for x in f[2:]])
if frows:
    def fmed(n, c, i):
        v = [r[i] for r in frows.get((n, c), [])]
        return statistics.median(v) if v else None
    fidle = [l.split() for l in open(f"{work}/f_idle")] if os.path.exists(f"{work}/f_idle") else []
    ping = [l.split()[1:] for l in open(f"{work}/f_ping")] if os.path.exists(f"{work}/f_ping") else []
    L += ["", "## F: PostgreSQL alone vs PostgreSQL with a Redis front (two gateways each)", "",
          "Pairs of gateways (the binary above), each pair sharing one database of a PostgreSQL server of its own for this part",
          "(pg_stat_statements loaded) and, for `front`, one database of the Redis server (`[store.front]`, timeout 250 ms):",
          "`postgres` and `front` with replay_cache_ttl = \"5s\", `postgres-nocache` and `front-nocache` with \"0s\".",
          "Load split: `new` and `hot` rows: one wrk, its two threads (half the connections each) on the two gateways;",
          "`storm` rows: one wrk through an nginx round-robin over the pair (each key's requests alternate between the gateways).",
          "PG statements/req: the pair's database's top-level pg_stat_statements calls over the row (the claim/complete batches,",
          "the relay's statements, BEGIN/COMMIT) minus its idle rate × the row's wall time, ÷ requests answered.",
          "Idle statements/s (subtracted): " + ", ".join(f"{d} {float(r):.1f}" for _, d, r in fidle) + ".",
          "CPU µs/req: both gateways; every PostgreSQL process of this part's server (all four databases); the Redis server.",
          "Medians over the runs; requests/s as median (min–max)."]
    fnames = sorted({n for n, _ in frows}, key=lambda n: (
        ["F-storm", "F-hot", "F-new"].index("-".join(n.split("-")[:2])),
        int(n.rsplit("-s", 1)[1]) if n.startswith("F-storm") else 0,
        0 if "nocache" in n else 1, 0 if "postgres" in n else 1))
    L += ["", "PG statements/req: net of the idle rate (raw in brackets). Split: the first gateway's share of the requests (from its",
          "`idemgate_requests_total`). Front answered: the share of the front gateways' claims the front answered",
          "(`idemgate_front_answers_total` ÷ answers + `idemgate_front_misses_total`); the replay cache answers before any claim.",
          "WAL bytes/req: `pg_current_wal_lsn()` over the row (the whole server; the idle pairs write none) ÷ requests answered.",
          "", "| row | c | requests/s | p50 ms | p99 ms | non-2xx | PG statements/req | WAL bytes/req | gateways CPU µs/req | PostgreSQL CPU µs/req | Redis CPU µs/req | split | front answered |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in fnames:
        for c in sorted({c for m, c in frows if m == n}):
            v = [r[0] for r in frows[(n, c)]]
            L.append(f"| {n} | {c} | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {fmed(n,c,1):.2f} | {fmed(n,c,2):.2f} | "
                     f"{fmed(n,c,3):,.0f} | {fmed(n,c,9):.3f} ({fmed(n,c,10):.3f}) | {fmed(n,c,15):,.0f} | {fmed(n,c,6):.1f} | {fmed(n,c,7):.1f} | {fmed(n,c,8):.1f} | "
                     f"{fmed(n,c,11):.2f} | {('%.3f' % fmed(n,c,12)) if fmed(n,c,12) >= 0 else '—'} |")
    fst = collections.defaultdict(list)
    if os.path.exists(f"{work}/f_storms"):
        for line in open(f"{work}/f_storms"):
            f = line.split()
            if len(f) == 8:
                fst[f[0]].append([int(x) for x in f[1:]])
    if fst:
        L += ["", "Storms: executions per key (all runs summed; the columns as in the storm table above; non-2xx: the 409s).", "",
              STORM_HEAD[0].format("row"), STORM_HEAD[1]]
        L += storm_rows(fnames, fst, frows)
    L += ["", "Front ÷ PostgreSQL alone (medians):", "",
          "| rows | c | requests/s front ÷ postgres | p99 ms postgres → front | PG statements/req postgres → front | PostgreSQL CPU µs/req postgres → front |",
          "|---|---|---|---|---|---|"]
    for n in fnames:
        if "-postgres" not in n:
            continue
        m = n.replace("-postgres", "-front")
        for c in sorted({c for x, c in frows if x == n}):
            if (m, c) in frows:
                L.append(f"| {n.replace('-postgres', '-*')} | {c} | {fmed(m,c,0) / fmed(n,c,0):.2f} | {fmed(n,c,2):.2f} → {fmed(m,c,2):.2f} | "
                         f"{fmed(n,c,9):.3f} → {fmed(m,c,9):.3f} | {fmed(n,c,7):.1f} → {fmed(m,c,7):.1f} |")
    if ping:
        avg, p50, p99 = (statistics.median(float(p[i]) for p in ping) for i in range(3))
        L += ["", f"One Redis round trip (redis-benchmark PING on the same Redis, one connection, no other bench load, median of {len(ping)}): "
              f"average {avg * 1000:.0f} µs, p50 {p50 * 1000:.0f} µs, p99 {p99 * 1000:.0f} µs."]
        L += ["", "New keys, what the front adds (front − postgres; mean latency by Little's law, c ÷ requests/s):", ""]
        for c in sorted({c for x, c in frows if x == "F-new-postgres"}):
            if ("F-new-front", c) in frows:
                mean = (c / fmed("F-new-front", c, 0) - c / fmed("F-new-postgres", c, 0)) * 1e6
                L.append(f"- c={c}: p50 {(fmed('F-new-front',c,1) - fmed('F-new-postgres',c,1)) * 1000:+.0f} µs, "
                         f"p99 {(fmed('F-new-front',c,2) - fmed('F-new-postgres',c,2)) * 1000:+.0f} µs, mean {mean:+.0f} µs "
                         f"(= {mean / (avg * 1000):+.1f} Redis PING round trips)")
    ferr = [(n, c, int(sum(r[13] for r in v)), int(sum(r[14] for r in v)), int(sum(r[5] for r in v)))
            for (n, c), v in frows.items()]
    bad = [x for x in ferr if x[2] or x[3] or x[4]]
    L += ["", "Front errors, front outages, wrk socket errors (all runs): " +
          ("; ".join(f"{n} c={c}: {e} / {o} / {s}" for n, c, e, o, s in bad) if bad else "none") + "."]

serial = [r[0] for r in rows.get(("ceil-sqlite-serial", 1), [])]
if serial:
    L += ["", f"Plain SQLite pairs from one connection (no lock contention): {statistics.median(serial):,.0f}/s."]
if os.path.exists(f"{work}/memory.md"):
    mem = open(f"{work}/memory.md").read()
    L += ["", "## Memory: 10,000 idle connections", ""]
    # One section per scenario (### its label), HTTP/1.1 then HTTP/2.
    for section, what in zip(mem.split("\n### ")[1:], ["HTTP/1.1 keep-alive", "HTTP/2 (h2c prior knowledge)"]):
        m = re.search(r"^\| 10000 \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.-]+) \| ([\d,–]+) \|", section, re.M)
        if m:
            L.append(f"- 10,000 idle {what} connections (one answered GET each; `bench/memory.py --only idle-h1,idle-h2`, "
                     f"a fresh gateway on `memory://`): VmRSS {m.group(3)} MiB, {m.group(4)} MiB over the gateway without "
                     f"connections, {m.group(5)} bytes per open connection ({m.group(1)} still open); target ≤ 64 MiB.")
    table = [l for l in mem.splitlines() if l.startswith("|") or l.startswith("answers:")]
    L += [""] + table
rss = [l.split() for l in open(f"{work}/rss")]
if rss:
    L += ["", "Peak RSS: " + ", ".join(f"{n} {int(k)//1024} MiB" for n, k in rss) + "."]
L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
log "wrote $RESULTS"
