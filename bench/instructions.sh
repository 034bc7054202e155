#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind: deterministic,
# so a few percent between two builds is seen whatever else the machine
# does (bench/run.sh's requests/s cannot resolve that on shared cores).
#
#   BASELINE=<commit> bash bench/instructions.sh
#
# Builds the current tree's binary and BASELINE's (alone: built with an
# example it would carry the test-only failpoints), puts each on the memory
# store in front of the demo upstream (server_threads = 0, RUST_LOG=warn,
# no tracing), and per kind — A pass-through, B a new key per request,
# C replays of 100 hot keys — sends 300 requests to warm up, zeroes the
# counters, sends exactly N (3000), dumps, and divides. Two runs per build
# and kind. Prints a Markdown table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${BASELINE:?set BASELINE to the commit to compare with}"
N="${N:-3000}"
WORK="$(mktemp -d /tmp/idemgate-instructions.XXXXXX)"
# KEEP=1 keeps the callgrind files (callgrind_annotate them) in $WORK.
trap 'pkill -P $$ 2>/dev/null || true; [ -n "${KEEP:-}" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"' EXIT
command -v valgrind >/dev/null || { apt-get install -y -qq valgrind >/dev/null; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

cargo build --release --locked --quiet --bin idemgate
cargo build --release --locked --quiet --bin demo_upstream
cp target/release/idemgate "$WORK/idemgate-head"
# The baseline's binary is built once and kept where bench/run.sh keeps it.
REV="$(git rev-parse --verify "$BASELINE^{commit}")"
KEPT="${BENCH_CACHE:-$HOME/.cache/idemgate-bench}/baseline/$REV/idemgate"
if [ ! -x "$KEPT" ]; then
    git worktree add --quiet --detach "$WORK/src" "$REV"
    (cd "$WORK/src" && CARGO_TARGET_DIR="$WORK/target" cargo build --release --locked --quiet --bin idemgate)
    mkdir -p "$(dirname "$KEPT")"
    cp "$WORK/target/release/idemgate" "$KEPT.tmp" && mv "$KEPT.tmp" "$KEPT"
    git worktree remove --force "$WORK/src"
fi
cp "$KEPT" "$WORK/idemgate-base"

UP="$(free_port)"; PORT="$(free_port)"; ADMIN="$(free_port)"
target/release/demo_upstream --listen "127.0.0.1:$UP" >/dev/null 2>&1 &
cat > "$WORK/gw.toml" <<TOML
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$ADMIN"
server_threads = 0
[store]
url = "memory://"
[[routes]]
name = "api"
match = "/*"
upstream = "http://127.0.0.1:$UP"
key_required = false
TOML

measure() { # build kind run -> instructions per request
    local out="$WORK/cg.$1.$2.$3" pid
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$WORK/idemgate-$1" serve --config "$WORK/gw.toml" 2>"$out.log" &
    pid=$!
    for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 1; done
    python3 bench/instructions_client.py "$PORT" "$2" 300 "warm$1$3" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    python3 bench/instructions_client.py "$PORT" "$2" "$N" "run$1$3" >"$out.client" \
        || { kill "$pid"; return 1; }
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"; wait "$pid" 2>/dev/null || true
    grep -hE '^(summary|totals):' "$out".* | head -1 | awk -v n="$N" '{printf "%.0f", $2 / n}'
}

echo "| kind | $BASELINE | $(git rev-parse --short HEAD) (+ working tree) | ratio |"
echo "|---|---|---|---|"
for kind in A B C; do
    b1=$(measure base "$kind" 1); b2=$(measure base "$kind" 2)
    h1=$(measure head "$kind" 1); h2=$(measure head "$kind" 2)
    base=$(( (b1 + b2) / 2 )); head=$(( (h1 + h2) / 2 ))
    echo "| $kind | $base | $head | $(python3 -c "print(f'{$head / $base:.3f}')") |"
done
