#!/usr/bin/env bash
# Fuzz the parsers with cargo-fuzz (libFuzzer, nightly): the idempotency key,
# the request fingerprint, and the config loader with ${VAR} expansion.
#
#   fuzz/run.sh [RUNS]              # default 10000000 executions per target
#
# Environment:
#   FUZZ_TARGETS="key fingerprint config"  which targets, in order
#   FUZZ_MAX_TIME=SECONDS           also stop each target after this long (0: no limit)
#   FUZZ_SANITIZER=none             cargo fuzz -s (none|address|...); none by default:
#                                   idemgate forbids unsafe code, and ASan costs ~2x speed
#   FUZZ_TOOLCHAIN=nightly          the toolchain cargo fuzz builds with
#
# One target at a time, under nice -n 19. The corpora in fuzz/corpus/<target>
# grow as the fuzzer finds new coverage (minimise with `cargo fuzz cmin`
# before committing); crashes land in fuzz/artifacts/<target>/. Logs and the
# summary go to fuzz/logs/ (ignored by git); the summary is also printed.
# Exits non-zero if any target crashed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RUNS="${1:-10000000}"
TARGETS="${FUZZ_TARGETS:-key fingerprint config}"
MAX_TIME="${FUZZ_MAX_TIME:-0}"
SANITIZER="${FUZZ_SANITIZER:-none}"
TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly}"

rustup toolchain list | grep -q "^$TOOLCHAIN" \
    || { echo "fuzz: the $TOOLCHAIN toolchain is not installed (rustup toolchain install $TOOLCHAIN)" >&2; exit 1; }
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    nice -n 19 cargo install cargo-fuzz --locked
fi

mkdir -p fuzz/logs
summary=fuzz/logs/summary.md
{
    echo "| target | executions | wall time (s) | corpus (files / bytes) | crashes |"
    echo "| --- | --- | --- | --- | --- |"
} >"$summary"

echo "==> building the fuzz targets (-s $SANITIZER)"
(cd fuzz && nice -n 19 cargo "+$TOOLCHAIN" fuzz build -s "$SANITIZER")

failed=0
for target in $TARGETS; do
    corpus="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    log="fuzz/logs/$target.log"
    mkdir -p "$corpus" "$artifacts"
    crashes_before=$(find "$artifacts" -type f | wc -l)
    extra=()
    [ "$target" = config ] && extra+=(-max_len=16384)
    echo "==> $target: -runs=$RUNS -max_total_time=$MAX_TIME (log: $log)"
    start=$(date +%s)
    set +e
    (cd fuzz && nice -n 19 cargo "+$TOOLCHAIN" fuzz run -s "$SANITIZER" "$target" \
        -- -runs="$RUNS" -max_total_time="$MAX_TIME" -print_final_stats=1 "${extra[@]}") >"$log" 2>&1
    rc=$?
    set -e
    wall=$(( $(date +%s) - start ))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
    files=$(find "$corpus" -type f | wc -l)
    bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
    crashes=$(( $(find "$artifacts" -type f | wc -l) - crashes_before ))
    [ "$rc" -ne 0 ] && failed=1
    [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="exit $rc, see $log"
    echo "| $target | ${execs:-?} | $wall | $files / $bytes | $crashes |" >>"$summary"
    tail -n 3 "$log"
done

echo
cat "$summary"
exit "$failed"
