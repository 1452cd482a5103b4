#!/usr/bin/env bash
# Checks that the library compiles with no features and with each feature alone (cargo-hack's
# --each-feature), so no feature silently relies on another. Used by scripts/test.sh.
#
# Installs what it needs when missing: cargo-hack, from crates.io into .build/tools/ (outside
# ~/.cargo, so the machine's own tools are left alone), and Debian's libssl-dev and pkg-config,
# which the `tls-native-tls` feature's OpenSSL bindings build against. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

hack_version="0.6.46"
tools="$PWD/.build/tools"
hack="$tools/bin/cargo-hack"
if ! { [ -x "$hack" ] && "$hack" hack --version 2>/dev/null | grep -qF "$hack_version"; }; then
  echo "installing cargo-hack $hack_version into $tools" >&2
  cargo install --locked --quiet --root "$tools" --version "$hack_version" cargo-hack
fi

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if ! dpkg-query -W -f='${Status}' libssl-dev 2>/dev/null | grep -q "install ok installed"; then
  need+=(libssl-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# cargo-hack runs `cargo check --manifest-path Cargo.toml …` for the library, and the root
# manifest selects the workspace's default members (the CLI and the test kit too), whose features
# would be unified into the library's dependencies (redis's rustls, tokio's "full") and hide a
# missing one. So the subcommand is an alias that selects the library alone. Dev-dependencies
# need no removal (--no-dev-deps would edit Cargo.toml while it runs): with resolver 2, a
# `cargo check` of the library does not turn on their features.
export CARGO_ALIAS_CHECK_FAIRLOCK_LIB="check --package fairlock"
# cargo-hack runs as a cargo subcommand; ours comes first on PATH so cargo finds it.
# A warning in one combination (an import only another feature uses) fails the check, as clippy's
# -D warnings does for --all-features; the output is kept to show it.
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
PATH="$tools/bin:$PATH" cargo hack check-fairlock-lib --package fairlock --each-feature 2>&1 | tee "$out"
if grep -q '^warning' "$out"; then
  echo "check-features: the library warns in a feature combination (see above)" >&2
  exit 1
fi

# A build without the `cluster` and `sentinel` features must not compile redis-rs's cluster or
# sentinel clients (what a standalone user would pay for without using).
if cargo tree --package fairlock --no-default-features --edges normal,build,features --invert redis 2>/dev/null \
  | grep -E 'redis feature "(cluster|cluster-async|sentinel)"'; then
  echo "check-features: a build without cluster/sentinel enables the redis features above" >&2
  exit 1
fi
echo "check-features: without cluster/sentinel, redis-rs builds neither client"
