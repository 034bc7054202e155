# Part overload of bench/run.sh (`ONLY=overload bash bench/run.sh`): past
# capacity (issue 47, section 2). Sourced by run.sh after its services are
# up; uses its functions and variables (start_gateway, start_delay_line, wrk_once, free_port,
# cpu_ticks, log, PIDS, WORK, PGURL, PGPORT, DURATION) and writes
# bench/results/<date>-overload.md (OVERLOAD_RESULTS) through
# bench/overload_report.py.
#
# One gateway of its own on the bench's PostgreSQL, new keys only:
#   peak    wrk's closed loop at OVER_C connections for DURATION: the
#           sustainable new-key rate, and its p99 (the reference latency)
#   levels  bench/loadgen, open loop, at each of OVER_LEVELS × the peak for
#           DURATION, then 0.5 × for OVER_RECOVER seconds (through its rate
#           file): goodput, p99 of the accepted, what the rejected got (503
#           with or without Retry-After, timeouts, resets), the gateway's
#           CPU, its VmRSS and idemgate_forwards_in_flight (claimed forwards;
#           not the claims waiting for the store) every 100 ms, its
#           VmHWM, its requests by outcome, and the recovery after the drop
#   slow    when bench/delay-line is there: a second gateway whose store is
#           behind a delay line at 1 ms each way, its own peak measured
#           through it, then loadgen at 1.0 × that peak while the delay goes
#           1 ms -> OVER_SLOW_DELAY (DURATION) -> 1 ms (OVER_RECOVER)
# Every loadgen run writes each request's due instant, latency and result
# (--log); the report cuts the runs into phases from those.

OVER_C="${OVER_C:-32}"
OVER_LEVELS="${OVER_LEVELS:-1.0 1.5 3}"
OVER_RECOVER="${OVER_RECOVER:-5}"
OVER_CONNECTIONS="${OVER_CONNECTIONS:-4000}"
OVER_TIMEOUT="${OVER_TIMEOUT:-2s}"
OVER_SLOW_DELAY="${OVER_SLOW_DELAY:-20ms}"
OV="$WORK/overload"
mkdir -p "$OV"
# loadgen opens a connection per request in flight, the gateway as many.
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

log "part overload: building bench/loadgen"
cargo build --release --locked --quiet --manifest-path bench/loadgen/Cargo.toml
LG_BIN="${CARGO_TARGET_DIR:-$PWD/bench/loadgen/target}/release/loadgen"

over_outcomes() { # admin port: "outcome count" per line, summed over routes
    curl -sf "http://127.0.0.1:$1/metrics" \
        | sed -n 's/^idemgate_requests_total{.*outcome="\([a-z_]*\)".*} \([0-9]*\).*/\1 \2/p' \
        | awk '{n[$1] += $2} END {for (k in n) print k, n[k]}'
}

over_sample() { # pid admin file: "unix_s VmRSS_KiB forwards_in_flight" every 100 ms while pid lives
    local flight
    while [ -r "/proc/$1/status" ]; do
        flight="$(curl -s --max-time 0.5 "http://127.0.0.1:$2/metrics" | awk '/^idemgate_forwards_in_flight / {print $2}')"
        echo "$EPOCHREALTIME $(awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null) ${flight:--}"
        sleep 0.1
    done > "$3"
}

# over_run NAME PORT PID ADMIN RATE SECONDS [STEP...]: loadgen at RATE for
# SECONDS against the gateway at PORT, its RSS and forwards in flight
# sampled ($OV/NAME.rss); each STEP
# "AFTER_S FILE VALUE" writes VALUE to FILE AFTER_S seconds into the run
# and records when ($OV/NAME.steps: "unix_s file value"). Leaves
# $OV/NAME.json (loadgen's lines), $OV/NAME.log (every request) and
# $OV/NAME.gw ("cpu_s vmhwm_kib" of the gateway over the run) and
# $OV/NAME.outcomes (the gateway's requests by outcome, before and after:
# what it did, the work for clients that had given up included).
over_run() {
    local name="$1" port="$2" pid="$3" admin="$4" rate="$5" seconds="$6" ticks sampler at file value start left
    shift 6
    over_outcomes "$admin" | sed 's/^/before /' > "$OV/$name.outcomes"
    : > "$OV/$name.steps"
    echo "$rate" > "$OV/$name.rate"
    ticks="$(cpu_ticks "$pid")"
    over_sample "$pid" "$admin" "$OV/$name.rss" &
    sampler=$!
    PIDS+=("$sampler")
    "$LG_BIN" --url "http://127.0.0.1:$port/v1/payments" --rate "$rate" --duration "$seconds" \
        --rate-file "$OV/$name.rate" --connections-max "$OVER_CONNECTIONS" --timeout "$OVER_TIMEOUT" \
        --json --log "$OV/$name.log" > "$OV/$name.json" 2> "$OV/$name.err" &
    local lg=$!
    PIDS+=("$lg")
    # Each step at its offset from the launch, by the shell's own clock (no
    # process to start: on a busy machine that alone can take a second).
    start="${EPOCHREALTIME/./}"
    for step in "$@"; do
        read -r at file value <<<"$step"
        left=$(( start + ${at%.*} * 1000000 - ${EPOCHREALTIME/./} ))
        [ "$left" -gt 0 ] && sleep "$((left / 1000000)).$(printf '%06d' $((left % 1000000)))"
        echo "$value" > "$file"
        echo "$EPOCHREALTIME $(basename "$file") $value" >> "$OV/$name.steps"
    done
    wait "$lg" || log "loadgen $name exited with $?: $(tail -n 3 "$OV/$name.err")"
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    echo "$(python3 -c "import os; print(($(cpu_ticks "$pid") - $ticks) / os.sysconf('SC_CLK_TCK'))") $(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")" > "$OV/$name.gw"
    log "part overload: $name: $(python3 bench/overload_report.py --line "$OV/$name.json")"
    # What the gateway still holds (claims waiting for the store, forwards
    # for clients that gave up) drains before the next run and is counted.
    sleep 2
    over_outcomes "$admin" | sed 's/^/after /' >> "$OV/$name.outcomes"
}

start_gateway ov-pg "$PGURL" 5s; OV_PORT="$GW_PORT"; OV_PID="$GW_PID"; OV_ADMIN="$GW_ADMIN"
log "part overload: peak (wrk, closed loop, c=$OVER_C, ${DURATION}s)"
wrk_once "$OV_PORT" new "$OVER_C" > "$OV/peak"
PEAK="$(awk '{print $1}' "$OV/peak")"
log "part overload: peak $(cat "$OV/peak") (rps p50 p99 non2xx requests socket_errors)"
for level in $OVER_LEVELS; do
    rate="$(python3 -c "print(round($level * $PEAK))")"
    half="$(python3 -c "print(round(0.5 * $PEAK))")"
    log "part overload: ${level} x peak = $rate/s for ${DURATION}s, then $half/s for ${OVER_RECOVER}s"
    over_run "level-$level" "$OV_PORT" "$OV_PID" "$OV_ADMIN" "$rate" "$((DURATION + OVER_RECOVER))" \
        "$DURATION $OV/level-$level.rate $half"
done

if [ -f bench/delay-line/Cargo.toml ]; then
    echo 1ms > "$OV/delay"
    start_delay_line "$PGPORT" "$OV/delay" "$OV/delay-line.out"
    OV_LINE_PORT="$DL_PORT"; OV_LINE="$DL_PID"
    start_gateway ov-slow "postgres://postgres@127.0.0.1:$OV_LINE_PORT/postgres" 5s
    OVS_PORT="$GW_PORT"; OVS_PID="$GW_PID"; OVS_ADMIN="$GW_ADMIN"
    log "part overload: peak through the delay line at 1 ms (wrk, c=$OVER_C)"
    wrk_once "$OVS_PORT" new "$OVER_C" > "$OV/peak-slow"
    SLOW_RATE="$(awk '{print $1}' "$OV/peak-slow")"
    log "part overload: store slowing down: $SLOW_RATE/s; delay 1 ms, $OVER_SLOW_DELAY after ${DURATION}s, 1 ms after $((2 * DURATION))s"
    over_run slow "$OVS_PORT" "$OVS_PID" "$OVS_ADMIN" "$SLOW_RATE" "$((2 * DURATION + OVER_RECOVER))" \
        "$DURATION $OV/delay $OVER_SLOW_DELAY" "$((2 * DURATION)) $OV/delay 1ms"
    echo "line_cpu_s $(python3 -c "import os; print($(cpu_ticks "$OV_LINE") / os.sysconf('SC_CLK_TCK'))")" > "$OV/slow.line"
else
    log "part overload: no bench/delay-line; the slowing store is left out"
fi

OVERLOAD_RESULTS="${OVERLOAD_RESULTS:-bench/results/$(date -u +%Y-%m-%d)-overload.md}"
python3 bench/overload_report.py "$OV" "$OVERLOAD_RESULTS" "$DURATION" "$OVER_RECOVER" \
    "$(git rev-parse --short HEAD)" "$OVER_LEVELS" "$OVER_C" "$OVER_SLOW_DELAY" "$OVER_TIMEOUT"
log "wrote $OVERLOAD_RESULTS"
