#!/usr/bin/env bash
# Which of the library's source files one uncontended `FairLock::lock()` passes through: the
# files of `src/` with code that ran inside `measured_lock` of the test kit's `lock-path` binary
# (testkit/src/bin/lock-path.rs), traced with Valgrind's callgrind on a debug build (nothing
# inlined, so a function counts in the file that defines it). Generic code of other crates that
# the compiler attributes to `src/lib.rs` is not counted. Needs `valgrind` (Debian: `apt install
# valgrind`) and a redis-server the test kit can start (`bash scripts/install-servers.sh`).
#
#   bash scripts/lock-path.sh          # the count and the files, one per line
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "lock-path: needs valgrind" >&2; exit 2; }
cargo build -q -p fairlock-testkit --bin lock-path
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --collect-atstart=no --toggle-collect=measured_lock \
  --callgrind-out-file="$out/cg.out" target/debug/lock-path >"$out/log" 2>&1 \
  || { cat "$out/log" >&2; exit 1; }
# Self cost only (a call line's cost is the callee's), per function of this crate, by the file
# that defines it. `src/lib.rs` only declares modules and re-exports; the compiler files some
# generic code of other crates under it, so it is left out.
python3 - "$out/cg.out" "$(pwd)/src/" >"$out/files" <<'PY'
import re, sys
path, src = sys.argv[1], sys.argv[2]
names = {}
def resolve(kind, val):
    m = re.match(r'\((\d+)\)(?: (.*))?', val)
    if not m:
        return val
    table = names.setdefault('fn' if kind.endswith('fn') else 'fl', {})
    if m.group(2) is not None:
        table[m.group(1)] = m.group(2)
    return table.get(m.group(1), '?')
fl = fi = fn = None
skip = False
files = set()
for line in open(path):
    line = line.rstrip('\n')
    m = re.match(r'^(fl|fi|fe|fn|cfl|cfi|cfn|cob|ob)=(.*)$', line)
    if m:
        kind, value = m.groups()
        name = resolve(kind, value)
        if kind == 'fl':
            fl, fi = name, None
        elif kind in ('fi', 'fe'):
            fi = name
        elif kind == 'fn':
            fn, fi = name, None
        continue
    if line.startswith('calls='):
        skip = True
        continue
    if line and (line[0].isdigit() or line[0] in '+-*'):
        if skip:
            skip = False
            continue
        f = fi or fl
        if f and f.startswith(src) and fn and 'fairlock::' in fn and f != src + 'lib.rs':
            files.add(f[len(src):])
print('\n'.join(sorted(files)))
PY
echo "$(wc -l <"$out/files") files of src/ ran inside one uncontended FairLock::lock():"
cat "$out/files"
