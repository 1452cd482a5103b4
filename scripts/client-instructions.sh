#!/usr/bin/env bash
# The client's instructions per uncontended FairLock lock + unlock cycle: Valgrind's callgrind
# counts every instruction of the process inside `measured_cycles` of the test kit's `lock-path`
# binary (a current-thread runtime, so the connection's and the driver's tasks are counted too;
# the server is another process), release build with debug info, 500 cycles after 5 warm-ups.
# Deterministic to within a few hundred instructions per cycle from run to run. Needs `valgrind`.
#
#   bash scripts/client-instructions.sh            # instructions per cycle
#   bash scripts/client-instructions.sh --top      # and the 25 costliest functions (self cost)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "client-instructions: needs valgrind" >&2; exit 2; }
CARGO_PROFILE_RELEASE_DEBUG=true cargo build -q --release -p fairlock-testkit --bin lock-path
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cycles=500
valgrind --tool=callgrind --collect-atstart=no --toggle-collect=measured_cycles \
  --callgrind-out-file="$out/cg.out" target/release/lock-path --cycles "$cycles" >"$out/log" 2>&1 \
  || { cat "$out/log" >&2; exit 1; }
total=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p' "$out/log")
echo "client instructions per uncontended lock + unlock cycle: $((total / cycles)) ($cycles cycles)"
if [ "${1:-}" = "--top" ]; then
  callgrind_annotate "$out/cg.out" 2>/dev/null | sed -n '/^Ir/,$p' | sed -n 3,27p | cut -c1-160
fi
