# Part distance of bench/run.sh (`ONLY=distance bash bench/run.sh`): the
# store another host away. Sourced by run.sh after its services, gateways
# and the peer are up; uses its functions (start_gateway, start_peer,
# measure, preload, ceiling_setup, pgbench_tps, redis_rps, start_delay_line) and writes
# bench/results/<date>-distance.md.
#
# One delay line (bench/delay-line) in front of the bench's PostgreSQL and
# one in front of its Redis; every client of the store at a distance goes
# through them, the gateways and the ceiling tools alike (pgbench,
# redis-benchmark, the peer), so all pay the same distance. The delay each
# way is read from a file, so one set of gateways and connections serves
# every delay in DELAYS (each way; a round trip costs twice). Per delay:
#   RTT     redis-benchmark PING through the line, one connection (the
#           round trip actually paid, the line's own cost included)
#   new     a new key per request at c = DIST_C: PostgreSQL, Redis, the
#           PostgreSQL + Redis front pair, the peer
#   hot     replays of the hot set at c = DIST_C: PostgreSQL and Redis with
#           the replay cache on ("5s") and off ("0s"), the peer
#   first   one connection, one request at a time (no queueing): a
#           pass-through through the PostgreSQL gateway, then a new key on
#           each store and the peer; p50 minus the pass-through's is what a
#           first request adds; beside them pgbench's plain pair from one
#           client (its mean latency: two round trips and two commits)
#   ceil    pgbench's plain pair (INSERT ON CONFLICT DO NOTHING + UPDATE)
#           and idemgate's claim + complete statements, CEIL_C clients;
#           redis-benchmark's claim and complete scripts, CEIL_C clients
# CEIL_C (32) is the gateways' pool_size: the ceilings hold as many store
# connections as a gateway may. The gateways' clients (DIST_C, 128) are
# more: a client is not a store connection, and batching shares one round
# trip among many clients' keys, where a per-statement client needs a
# connection for each key in flight.
# Rows of one delay run interleaved as in the other parts; the line's CPU
# is recorded per delay (its cost belongs to neither side).

DELAYS="${DELAYS:-0us 250us 500us 1ms 2ms}"
DIST_C="${DIST_C:-128}"
CEIL_C="${CEIL_C:-32}"
echo 0us > "$WORK/delay"
start_delay_line "$PGPORT" "$WORK/delay" "$WORK/delay-line-pg.log"; XPG_PORT="$DL_PORT"; XPG_LINE="$DL_PID"
start_delay_line "$REDISPORT" "$WORK/delay" "$WORK/delay-line-redis.log"; XRD_PORT="$DL_PORT"; XRD_LINE="$DL_PID"
log "part distance: delay lines :$XPG_PORT -> PostgreSQL, :$XRD_PORT -> Redis"
XPG_URL="postgres://postgres@127.0.0.1:$XPG_PORT/postgres"
XRD_URL="redis://127.0.0.1:$XRD_PORT"

start_gateway x-postgres "$XPG_URL" 5s; XP="$GW_PORT $GW_PID"; XP_ADMIN="$GW_ADMIN"
start_gateway x-postgres-nocache "$XPG_URL" 0s; XPN="$GW_PORT $GW_PID"
start_gateway x-redis "$XRD_URL/0" 5s; XR="$GW_PORT $GW_PID"
start_gateway x-redis-nocache "$XRD_URL/0" 0s; XRN="$GW_PORT $GW_PID"
start_gateway x-front "$XPG_URL" 5s "$BIN" warn "$XRD_URL/4"; XF="$GW_PORT $GW_PID"
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$GW_ADMIN/metrics" | grep -q '^idemgate_front_up 1' && break
    sleep 0.1
done
XPEER=""
if [ -n "$PEER_BIN" ]; then
    PEER_REDIS_PORT="$XRD_PORT" PEER_DIR="$WORK/peer-x" start_peer
    XPEER="$PEER_PORT $PEER_PID"
fi
ceiling_setup
for g in "$XP" "$XR" "$XF"; do preload "${g%% *}"; done
[ -n "$XPEER" ] && preload "${XPEER%% *}" /URL_API

dist_ping() { # -> "avg p50 p99" (ms) of PING through the Redis line
    redis-benchmark -p "$XRD_PORT" -c 1 -n "${1:-2000}" -t ping --csv 2>/dev/null \
        | awk -F'"' '/PING_MBULK/ {print $6, $10, $14}'
}
dist_batches() { # -> "batches operations" the PostgreSQL gateway sent so far
    curl -sf "http://127.0.0.1:$XP_ADMIN/metrics" | awk '/^idemgate_store_batches_total/ {b += $NF}
        /^idemgate_store_batched_operations_total/ {o += $NF} END {printf "%d %d", b, o}'
}
for delay in $DELAYS; do
    echo "$delay" > "$WORK/delay"
    sleep 0.3 # the lines re-read the file every 100 ms
    log "part distance: $delay each way"
    d="dist-$delay"
    lines_before="$(( $(cpu_ticks "$XPG_LINE") + $(cpu_ticks "$XRD_LINE") ))"; t0="$(date +%s.%N)"
    for i in $(seq 1 "$REPEATS"); do echo "$d $(dist_ping)" >> "$WORK/dist_ping"; done
    specs=("$d-new-postgres ${XP% *} new ${XP#* }" "$d-new-redis ${XR% *} new ${XR#* }"
           "$d-new-front ${XF% *} new ${XF#* }")
    [ -n "$XPEER" ] && specs+=("$d-new-peer ${XPEER% *} new ${XPEER#* } /URL_API")
    batches_before="$(dist_batches)"
    ONLY_C="$DIST_C" measure "${specs[@]}"
    echo "$d $batches_before $(dist_batches)" >> "$WORK/dist_batches"
    specs=("$d-hot-postgres ${XP% *} hot ${XP#* }" "$d-hot-postgres-nocache ${XPN% *} hot ${XPN#* }"
           "$d-hot-redis ${XR% *} hot ${XR#* }" "$d-hot-redis-nocache ${XRN% *} hot ${XRN#* }")
    [ -n "$XPEER" ] && specs+=("$d-hot-peer ${XPEER% *} hot ${XPEER#* } /URL_API")
    ONLY_C="$DIST_C" measure "${specs[@]}"
    specs=("$d-first-pass ${XP% *} none ${XP#* }" "$d-first-postgres ${XP% *} new ${XP#* }"
           "$d-first-redis ${XR% *} new ${XR#* }" "$d-first-front ${XF% *} new ${XF#* }")
    [ -n "$XPEER" ] && specs+=("$d-first-peer ${XPEER% *} new ${XPEER#* } /URL_API")
    ONLY_C=1 measure "${specs[@]}"
    for i in $(seq 1 "$REPEATS"); do
        # The plain pair from one client, one at a time: two round trips
        # and two commits, what a first request's store work costs at least.
        "$PGBIN/pgbench" -n -h 127.0.0.1 -p "$XPG_PORT" -U postgres -c 1 -j 1 -T "$DURATION" -f "$WORK/plain_pair.sql" postgres 2>/dev/null \
            | awk -v n="$d-first-pg-plain-pair" '/^latency average/ {lat = $4} /^tps/ {tps = int($3)} END {if (lat) print n, 1, tps, lat, lat, 0, "-"}' >> "$WORK/raw"
        ceil_row "$d-ceil-pg-plain-pair" "$CEIL_C" "$(pgbench_tps "$WORK/plain_pair.sql" "$CEIL_C" "$XPG_PORT")"
        ceil_row "$d-ceil-pg-claim-complete" "$CEIL_C" "$(pgbench_tps "$WORK/claim_complete.sql" "$CEIL_C" "$XPG_PORT")"
        # As many scripts as DURATION seconds take at this distance, at most 200,000.
        n="$(python3 -c "print(min(200000, max(2000, int($CEIL_C * $DURATION / ($(dist_ping 200 | awk '{print $1}') / 1000 + 0.0001)))))")"
        ceil_row "$d-ceil-redis-claim" "$CEIL_C" "$(REDIS_AT="$XRD_PORT" REDIS_N="$n" redis_rps "$CEIL_C" EVALSHA "$CLAIM_SHA" 4 "ceil:rec:__rand_int__" ceil:token ceil:due ceil:inq fingerprint 30000 86400000 0 1 "$FOREVER" 0 "" "")"
        ceil_row "$d-ceil-redis-complete" "$CEIL_C" "$(REDIS_AT="$XRD_PORT" REDIS_N="$n" redis_rps "$CEIL_C" EVALSHA "$COMPLETE_SHA" 3 ceil:done ceil:due ceil:inq "$TOKEN" 201 "" "$RESPONSE" 86400000 "" "")"
    done
    lines_after="$(( $(cpu_ticks "$XPG_LINE") + $(cpu_ticks "$XRD_LINE") ))"
    python3 -c "import os,sys; print(sys.argv[1], f'{(int(sys.argv[3])-int(sys.argv[2]))/os.sysconf(\"SC_CLK_TCK\"):.1f}', f'{float(sys.argv[5])-float(sys.argv[4]):.0f}')" \
        "$d" "$lines_before" "$lines_after" "$t0" "$(date +%s.%N)" >> "$WORK/dist_lines"
done
echo 0us > "$WORK/delay"

DIST_RESULTS="${DIST_RESULTS:-bench/results/$(date -u +%Y-%m-%d)-distance.md}"
grep '^dist-' "$WORK/raw" > "$WORK/dist_raw" || true
python3 bench/distance_report.py "$WORK" "$DIST_RESULTS" "$DURATION" "$REPEATS" "$(git rev-parse --short HEAD)" \
    "$DELAYS" "$DIST_C" "$CEIL_C" "${PEER_BIN:+$PEER_VERSION}"
log "wrote $DIST_RESULTS"
