#!/usr/bin/env bash
# Finds the real Redisson client for tests/redisson_interop*.rs, compiles the Java peer
# (interop/redisson/RedissonPeer.java) against it when the source or the classpath changed, and
# prints the peer's runtime classpath on stdout (everything else goes to stderr).
#
# Where Redisson comes from, first match wins:
#   1. REDISSON_CLASSPATH: a classpath holding Redisson and every library it needs;
#   2. ../shared/redisson/redisson-*.jar beside this repository, with Debian's Java libraries
#      (installed with apt-get when missing);
#   3. Maven: org.redisson:redisson:${REDISSON_VERSION:-4.4.0} and its dependencies, fetched
#      with `mvn` into the target directory (for machines that reach Maven Central).
# Java 17 or newer (java and javac) is installed with apt-get when missing.
#
# Used by scripts/test.sh (which exports the result as REDISSON_PEER_CLASSPATH) and, when that
# variable is not set, by the interop tests themselves. Idempotent and safe to run concurrently.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
source_file="$repo/interop/redisson/RedissonPeer.java"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
out="$target/redisson-peer"

die() {
  echo "" >&2
  echo "redisson-classpath.sh: ERROR: $*" >&2
  echo "  The Redisson interop tests need Java 17+ and the real Redisson client; they never skip." >&2
  echo "  Give Redisson as REDISSON_CLASSPATH=<jars>, or put the jar in ../shared/redisson/, or" >&2
  echo "  install Maven with access to Maven Central (org.redisson:redisson)." >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get is not available to install: $*"
  echo "redisson-classpath.sh: installing $* with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq >&2 || die "apt-get update failed"
  as_root apt-get install -y -qq --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
}

if ! command -v java >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
  apt_install openjdk-17-jdk-headless
fi
command -v javac >/dev/null 2>&1 || die "javac not found after installing openjdk-17-jdk-headless"

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

# Debian's netty-all.jar is an empty aggregator: the module jars are listed one by one.
debian_jars=(netty-buffer netty-codec netty-codec-dns netty-common netty-handler netty-resolver
  netty-resolver-dns netty-transport netty-transport-native-epoll netty-transport-native-kqueue
  netty-transport-native-unix-common jackson-annotations jackson-core jackson-databind
  jackson-dataformat-yaml slf4j-api byte-buddy objenesis reactive-streams snakeyaml spring3-beans
  spring3-core caffeine slf4j-simple)
debian_packages=(libnetty-java libjackson2-databind-java libjackson2-core-java
  libjackson2-annotations-java libjackson2-dataformat-yaml libslf4j-java libbyte-buddy-java
  libobjenesis-java libreactive-streams-java libyaml-snake-java libspring-beans-java
  libcaffeine-java)

debian_classpath() {
  local jar="$1" cp="$1" j missing=0
  for j in "${debian_jars[@]}"; do
    [ -f "/usr/share/java/$j.jar" ] || missing=1
  done
  if [ "$missing" -eq 1 ]; then
    apt_install "${debian_packages[@]}"
  fi
  for j in "${debian_jars[@]}"; do
    [ -f "/usr/share/java/$j.jar" ] || die "/usr/share/java/$j.jar is still missing after apt-get"
    cp="$cp:/usr/share/java/$j.jar"
  done
  echo "redisson-classpath.sh: using $jar with Debian's Java libraries" >&2
  printf '%s' "$cp"
}

maven_classpath() {
  local version="${REDISSON_VERSION:-4.4.0}" dir="$out/maven"
  command -v mvn >/dev/null 2>&1 || die "no Redisson found (REDISSON_CLASSPATH unset, no ../shared/redisson jar) and no mvn to fetch org.redisson:redisson"
  mkdir -p "$dir"
  cat >"$dir/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fairlock.interop</groupId>
  <artifactId>redisson-peer</artifactId>
  <version>1</version>
  <dependencies>
    <dependency><groupId>org.redisson</groupId><artifactId>redisson</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>2.0.16</version></dependency>
  </dependencies>
</project>
EOF
  if [ ! -f "$dir/lib/redisson-$version.jar" ]; then
    echo "redisson-classpath.sh: fetching org.redisson:redisson:$version with Maven" >&2
    rm -rf "$dir/lib"
    mvn -q -f "$dir/pom.xml" org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
      -DoutputDirectory="$dir/lib" >&2 ||
      die "mvn could not fetch org.redisson:redisson:$version"
  fi
  local cp
  cp="$(find "$dir/lib" -name '*.jar' | sort | tr '\n' ':')"
  echo "redisson-classpath.sh: using Redisson $version from Maven" >&2
  printf '%s' "${cp%:}"
}

if [ -n "${REDISSON_CLASSPATH:-}" ]; then
  echo "redisson-classpath.sh: using REDISSON_CLASSPATH" >&2
  classpath="$REDISSON_CLASSPATH"
else
  shared_jar=""
  if [ -d "$repo/../shared/redisson" ]; then
    shared_jar="$(find "$repo/../shared/redisson" -maxdepth 1 -name 'redisson-*.jar' | sort | tail -n 1)"
  fi
  if [ -n "$shared_jar" ]; then
    classpath="$(debian_classpath "$(cd "$(dirname "$shared_jar")" && pwd)/$(basename "$shared_jar")")"
  else
    classpath="$(maven_classpath)"
  fi
fi

# Compile once per change of the source or the classpath.
stamp="$( (cat "$source_file"; printf '%s' "$classpath") | sha256sum | cut -d' ' -f1)"
if [ ! -f "$out/classes/RedissonPeer.class" ] || [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "redisson-classpath.sh: compiling $source_file" >&2
  rm -rf "$out/classes"
  mkdir -p "$out/classes"
  javac -Xlint:all -Werror -cp "$classpath" -d "$out/classes" "$source_file" >&2 ||
    die "javac failed on $source_file against $classpath"
  printf '%s' "$stamp" >"$out/stamp"
fi
printf '%s\n' "$out/classes:$classpath"
