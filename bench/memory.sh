#!/usr/bin/env bash
# Memory use of idemgate (idle connections, the HTTP/2 body attack); see bench/memory.py.
# Usage: bash bench/memory.sh [--only idle-h1,idle-h1-long,idle-h1-8k,idle-tcp,idle-h2,attack-1,attack-2,attack-10,attack-repeat]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import h2' 2>/dev/null || pip install h2
# Two commands: built with an example, the binary would get the
# dev-dependencies' features (the test-only failpoints).
nice -n 10 cargo build --release --locked --bin idemgate
nice -n 10 cargo build --release --locked --bin demo_upstream
ulimit -n 20000
exec nice -n 10 python3 bench/memory.py "$@"
