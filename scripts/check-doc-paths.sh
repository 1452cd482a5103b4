#!/usr/bin/env bash
# Checks that every repository path the Markdown documents cite still exists, so a moved or
# renamed file cannot leave a stale reference behind. Used by scripts/test.sh, next to `cargo doc`.
#
# What counts as a cited path, in README.md, cli/README.md, docs/*.md and benches/README.md:
#   * a link target, `[text](target)` or `[label]: target`, that is not a URL or an anchor;
#   * a `code span` made only of path characters that contains a `/` (`src/keys.rs`,
#     `engine/lane`, `tests/torture/`, `lua/*.lua`);
#   * in any other text, code blocks included, a word with a `/` and a source or document
#     extension (`src/engine/driver/wheel.rs`).
# A path may be written from the repository root, from the document's folder, from `src/` or a
# folder of it (as docs/ARCHITECTURE.md writes module files and sub-folders) or, in cli/README.md,
# from `cli/` and `cli/src/`.
# Without an extension it may also name a `.rs` file or a folder; `*` and `**` are globs.
# Prints each path that matches nothing and exits 1 if there is any; silent otherwise. With
# `--list`, prints every cited path instead.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob globstar

docs=(README.md cli/README.md docs/*.md benches/README.md)
exts='rs|md|lua|sh|py|java|toml|json'

# Whether a path written in the document $1 names something in the repository.
exists() {
  local doc="$1" path="$2" base candidate
  local bases=("" "$(dirname "$doc")/" "src/" "src/*/")
  case "$doc" in cli/*) bases+=("cli/" "cli/src/") ;; esac
  for base in "${bases[@]}"; do
    candidate="${base}${path}"
    candidate="${candidate#./}"
    case "$candidate" in
      *'*'*)
        # A glob: it must match something (nullglob leaves an empty list otherwise).
        # shellcheck disable=SC2206
        local matches=($candidate)
        [ ${#matches[@]} -gt 0 ] && return 0
        ;;
      *) [ -e "$candidate" ] && return 0 ;;
    esac
    case "$path" in
      *.*) ;;
      *) [ -e "${candidate%/}.rs" ] && return 0 ;;
    esac
  done
  return 1
}

# Every path a document cites, one a line (with duplicates).
cited() {
  local doc="$1"
  # Link targets: inline links and reference definitions, minus URLs and in-page anchors.
  grep -oE '\]\([^) ]+\)' "$doc" | sed -E 's/^\]\(//; s/\)$//' || true
  grep -oE '^\[[^]]+\]: +[^ ]+' "$doc" | sed -E 's/^\[[^]]+\]: +//' || true
  # Code spans of path characters with a slash.
  grep -oE '`[A-Za-z0-9_.*/-]+`' "$doc" | tr -d '`' | grep '/' || true
  # Words with a slash and an extension anywhere, URLs removed first.
  sed -E 's#[a-z]+://[^ )>`]*##g' "$doc" \
    | grep -oE "[A-Za-z0-9_.*-]*/[A-Za-z0-9_.*/-]*\.($exts)\b" || true
}

# `--list` prints what would be checked instead.
if [ "${1:-}" = --list ]; then
  for doc in "${docs[@]}"; do cited "$doc" | sort -u | sed "s#^#$doc: #"; done
  exit 0
fi
missing=0
for doc in "${docs[@]}"; do
  while IFS= read -r path; do
    path="${path%%#*}"
    case "$path" in
      "" | http://* | https://* | mailto:*) continue ;;
    esac
    if ! exists "$doc" "$path"; then
      echo "$doc: cites $path, which does not exist" >&2
      missing=1
    fi
  done < <(cited "$doc" | sort -u)
done
exit "$missing"
