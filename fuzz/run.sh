#!/usr/bin/env bash
# Fuzz the parsers with cargo-fuzz (libFuzzer, nightly): the idempotency key,
# key_from/scope_from parts, the request fingerprint, and the config loader
# with ${VAR} expansion. Works from any directory (it cds to the repo root).
#
#   fuzz/run.sh [RUNS]              # fuzz: default 10000000 executions per target
#   fuzz/run.sh cmin                # minimise the corpora instead of fuzzing
#
# Environment:
#   FUZZ_TARGETS="key fingerprint config"  which targets, in order (cmin: every
#                                   target by default, key_source included)
#   FUZZ_MAX_TIME=SECONDS           also stop each target after this long (0: no limit)
#   FUZZ_SANITIZER=none             cargo fuzz -s (none|address|...); none by default:
#                                   idemgate forbids unsafe code, and ASan costs ~2x speed
#   FUZZ_TOOLCHAIN=nightly          the toolchain cargo fuzz builds with
#
# One target at a time, under nice -n 19. The corpora in fuzz/corpus/<target>
# grow as the fuzzer finds new coverage; crashes land in
# fuzz/artifacts/<target>/. Logs and the summary go to fuzz/logs/ (ignored by
# git); the summary is also printed. Exits non-zero if any target crashed.
#
# `cmin` runs `cargo fuzz cmin -s $FUZZ_SANITIZER <target>` on each target: it
# replaces fuzz/corpus/<target> with a subset of its inputs that keeps all of
# their coverage (files renamed to their SHA-1; `seed-*` files keep their
# names). Run it before committing a grown corpus; the before/after counts go
# to fuzz/logs/cmin.md. Exits non-zero if any cmin failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODE=run
if [ "${1:-}" = cmin ]; then
    MODE=cmin
    shift
fi
RUNS="${1:-10000000}"
MAX_TIME="${FUZZ_MAX_TIME:-0}"
SANITIZER="${FUZZ_SANITIZER:-none}"
TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly}"

rustup toolchain list | grep -q "^$TOOLCHAIN" \
    || { echo "fuzz: the $TOOLCHAIN toolchain is not installed (rustup toolchain install $TOOLCHAIN)" >&2; exit 1; }
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    nice -n 19 cargo install cargo-fuzz --locked
fi

if [ "$MODE" = cmin ]; then
    TARGETS="${FUZZ_TARGETS:-$(cd fuzz && cargo "+$TOOLCHAIN" fuzz list)}"
else
    TARGETS="${FUZZ_TARGETS:-key fingerprint config}"
fi

# files / bytes of a corpus directory
corpus_size() {
    echo "$(find "$1" -type f | wc -l) / $(find "$1" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')"
}

mkdir -p fuzz/logs

echo "==> building the fuzz targets (-s $SANITIZER)"
(cd fuzz && nice -n 19 cargo "+$TOOLCHAIN" fuzz build -s "$SANITIZER")

if [ "$MODE" = cmin ]; then
    summary=fuzz/logs/cmin.md
    {
        echo "| target | before (files / bytes) | after (files / bytes) |"
        echo "| --- | --- | --- |"
    } >"$summary"
    failed=0
    for target in $TARGETS; do
        corpus="fuzz/corpus/$target"
        log="fuzz/logs/cmin-$target.log"
        mkdir -p "$corpus"
        before=$(corpus_size "$corpus")
        # Named seeds: set aside a copy, put it back under its name afterwards
        # (cmin keeps its content under its SHA-1 if it adds coverage).
        seeds=$(mktemp -d)
        find "$corpus" -maxdepth 1 -type f -name 'seed-*' -exec cp {} "$seeds"/ \;
        echo "==> $target: cmin (log: $log)"
        set +e
        (cd fuzz && nice -n 19 cargo "+$TOOLCHAIN" fuzz cmin -s "$SANITIZER" "$target") >"$log" 2>&1
        rc=$?
        set -e
        for seed in "$seeds"/seed-*; do
            [ -e "$seed" ] || continue
            [ -e "$corpus/$(basename "$seed")" ] && continue
            rm -f "$corpus/$(sha1sum "$seed" | cut -c1-40)"
            cp "$seed" "$corpus/"
        done
        rm -rf "$seeds"
        after=$(corpus_size "$corpus")
        [ "$rc" -ne 0 ] && { failed=1; after="exit $rc, see $log"; }
        echo "| $target | $before | $after |" >>"$summary"
        tail -n 3 "$log"
    done
    echo
    cat "$summary"
    exit "$failed"
fi

summary=fuzz/logs/summary.md
{
    echo "| target | executions | wall time (s) | corpus (files / bytes) | crashes |"
    echo "| --- | --- | --- | --- | --- |"
} >"$summary"

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
