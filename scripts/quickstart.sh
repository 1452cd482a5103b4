#!/usr/bin/env bash
# Runs examples/quickstart.rs. Without REDIS_URL the example starts a throw-away redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${REDIS_URL:-}" ]; then
  bash scripts/install-redis.sh
fi
cargo run --quiet --example quickstart
