#!/usr/bin/env python3
"""Print the library's import graph: its cycles and, with --layers, imports that run upwards.

Usage (from the repository root, Python 3.8+, standard library only):

    python3 scripts/import-graph.py            # cycles (strongly connected components)
    python3 scripts/import-graph.py --layers   # ... and every edge from a lower layer to a higher one
    python3 scripts/import-graph.py --edges    # ... and every edge, one per line

It reads `src/**/*.rs` except `src/bin/`. An edge A -> B means file A names module B through
`use crate::...`, `use super::...`, `use self::...` or a relative `use child::...`, a `crate::`,
`$crate::`, `super::` or `self::` path in code, or a `mod b;` declaration. A path is mapped to the
file that defines the longest module prefix it names; a name that module only re-exports
(`pub use` / `pub(crate) use`) is followed to the module it comes from, so facades such as
`lib.rs` do not join cycles they are not part of. Comments and string literals are ignored;
`#[cfg(test)]` modules count like any other code.

The exit status is 0 unless --check is given and a rule of docs/ARCHITECTURE.md is broken: a
cycle of more than MAX_CYCLE files, a cycle whose files are not all in one top folder of `src/`
(a folder's `mod.rs` declares its files and they use what it shares), or an upward edge.
"""

import argparse
import os
import re
import sys

# Layers, highest first, as in docs/ARCHITECTURE.md. A file belongs to the first entry whose
# prefix its path (relative to src/) starts with. Imports may run only to the same or a lower
# layer. lib.rs is the crate root: it declares every module and re-exports the public API.
LAYERS = [
    ("root", ["lib.rs"]),
    ("composites", ["redlock.rs", "admin.rs"]),
    ("lock", ["lock/"]),
    ("coord", ["coord/"]),
    ("engine", ["engine/"]),
    ("wire", ["wire/"]),
    ("conn", ["conn/"]),
    (
        "data",
        [
            "keys.rs",
            "state.rs",
            "config/",
            "metrics.rs",
            "retry.rs",
            "scripts.rs",
            "util.rs",
            "error.rs",
        ],
    ),
]
# The largest import cycle allowed; a cycle must stay within one folder.
MAX_CYCLE = 3

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Blank out comments, string and char literals, keeping line structure."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not re.match(r"\w", text[i - 1 : i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # char literal ('a', '\n', '\''), else a lifetime or label: keep it
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use_tree(tree):
    """`a::{b, c::{d, e as f}, self}` -> [[a, b], [a, c, d], [a, c, e], [a]]."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)  # `x as y` names x
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(s, prefix):
        brace = s.find("{")
        if brace >= 0 and s.endswith("}"):
            head = [p for p in s[:brace].split("::") if p]
            result = []
            for part in split_top(s[brace + 1 : -1]):
                result.extend(walk(part, prefix + head))
            return result
        segs = [p for p in s.split("::") if p]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        return [prefix + segs]

    return walk(tree, [])


class Module:
    def __init__(self, path, file):
        self.path = path  # ("crate", "engine", "held")
        self.file = file  # relative to src/, or the parent's file for inline modules
        self.children = {}  # name -> Module
        self.reexports = {}  # name -> absolute path (list of segments) it re-exports


def load(src):
    files = {}
    for root, dirs, names in os.walk(src):
        rel_root = os.path.relpath(root, src)
        if rel_root == "bin" or rel_root.startswith("bin" + os.sep):
            dirs[:] = []
            continue
        for name in names:
            if name.endswith(".rs"):
                rel = os.path.normpath(os.path.join(rel_root, name)).replace(os.sep, "/")
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    files[rel] = strip_comments_and_strings(f.read())
    return files


def file_of_child(parent_file, name, files):
    """The file of `mod name;` declared in parent_file."""
    base = os.path.dirname(parent_file)
    stem = os.path.basename(parent_file)[:-3]
    if stem not in ("lib", "mod", "main"):
        base = os.path.join(base, stem)
    for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
        cand = os.path.normpath(cand).replace(os.sep, "/")
        if cand in files:
            return cand
    return None


MOD_DECL = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")
USE_STMT = re.compile(r"(?:\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);")


def build_tree(files):
    root = Module(("crate",), "lib.rs")
    modules = {root.path: root}
    queue = [root]
    while queue:
        mod = queue.pop()
        text = files[mod.file]
        for m in MOD_DECL.finditer(text):
            name, kind = m.group(1), m.group(2)
            if kind == ";":
                child_file = file_of_child(mod.file, name, files)
                if child_file is None:
                    continue
            else:
                child_file = mod.file  # inline module: same file
            child = Module(mod.path + (name,), child_file)
            mod.children[name] = child
            modules[child.path] = child
            if kind == ";":
                queue.append(child)
    return root, modules


def absolute(segs, mod, modules):
    """Make a path absolute (starting with "crate") as seen from module `mod`, or None."""
    if not segs:
        return None
    first = segs[0]
    if first in ("crate", "$crate"):
        return ["crate"] + segs[1:]
    if first == "self":
        return list(mod.path) + segs[1:]
    if first == "super":
        path = list(mod.path)
        while segs and segs[0] == "super":
            path, segs = path[:-1], segs[1:]
        return path + segs
    if first in mod.children:
        return list(mod.path) + segs
    return None  # an extern crate or a local item


def resolve(abs_path, modules, depth=0):
    """The module path that defines what abs_path names."""
    mod = modules[("crate",)]
    i = 1
    while i < len(abs_path) and abs_path[i] in mod.children:
        mod = mod.children[abs_path[i]]
        i += 1
    if i < len(abs_path) and abs_path[i] in mod.reexports and depth < 16:
        return resolve(mod.reexports[abs_path[i]] + abs_path[i + 1 :], modules, depth + 1)
    return mod


def inline_scopes(text, mod):
    """Yield (start, end, Module) for inline `mod x { ... }` blocks of this file (one level)."""
    for m in MOD_DECL.finditer(text):
        if m.group(2) != "{" or m.group(1) not in mod.children:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        yield m.start(), j, mod.children[m.group(1)]


def scope_at(pos, scopes, mod):
    for start, end, child in scopes:
        if start <= pos < end:
            return child
    return mod


def collect_reexports(files, modules):
    for mod in modules.values():
        text = files[mod.file]
        scopes = list(inline_scopes(text, mod))
        for m in USE_STMT.finditer(text):
            if not m.group(0).lstrip().startswith("pub"):
                continue
            if scope_at(m.start(), scopes, mod) is not mod:
                continue
            for segs in expand_use_tree(m.group(1)):
                if not segs or segs[-1] == "*":
                    continue
                ab = absolute(segs, mod, modules)
                if ab:
                    mod.reexports[segs[-1]] = ab


CODE_PATH = re.compile(r"(?<![A-Za-z0-9_:])(\$crate|crate|super|self)((?:::" + IDENT + r")+)")


def edges_of(files, modules):
    edges = {}
    file_mods = {}  # file -> the module it defines (inline modules share their file)
    for mod in modules.values():
        if mod.file not in file_mods or len(mod.path) < len(file_mods[mod.file].path):
            file_mods[mod.file] = mod
    for file, mod in file_mods.items():
        text = files[file]
        scopes = list(inline_scopes(text, mod))
        out = edges.setdefault(file, {})

        def add(target_mod, why):
            if target_mod.file != file:
                out.setdefault(target_mod.file, why)

        for name, child in mod.children.items():
            if child.file != file:
                add(child, "mod " + name)
        code = text
        for m in USE_STMT.finditer(text):
            scope = scope_at(m.start(), scopes, mod)
            for segs in expand_use_tree(m.group(1)):
                ab = absolute(segs, scope, modules)
                if ab:
                    add(resolve(ab, modules), "use " + "::".join(segs))
            code = code[: m.start()] + " " * (m.end() - m.start()) + code[m.end() :]
        for m in CODE_PATH.finditer(code):
            segs = [m.group(1)] + m.group(2).split("::")[1:]
            ab = absolute(segs, scope_at(m.start(), scopes, mod), modules)
            if ab:
                add(resolve(ab, modules), "::".join(segs))
    return edges


def sccs(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def layer_of(file):
    for rank, (name, prefixes) in enumerate(LAYERS):
        if any(file == p or (p.endswith("/") and file.startswith(p)) for p in prefixes):
            return rank, name
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=None, help="the crate's src/ (default: ../src from here)")
    ap.add_argument("--layers", action="store_true", help="list edges that run up the layers")
    ap.add_argument("--edges", action="store_true", help="list every edge")
    ap.add_argument("--check", action="store_true", help="exit 1 if a layering rule is broken")
    args = ap.parse_args()
    src = args.src or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

    files = load(src)
    root, modules = build_tree(files)
    collect_reexports(files, modules)
    edges = edges_of(files, modules)
    nodes = set(files)
    n_edges = sum(len(v) for v in edges.values())
    print(f"{len(nodes)} files, {n_edges} edges")

    broken = False
    cycles = sorted((c for c in sccs(nodes, edges) if len(c) > 1), key=lambda c: (-len(c), c))
    if not cycles:
        print("no cycles")
    for comp in cycles:
        print(f"cycle of {len(comp)} files: {', '.join(comp)}")
        folders = {f.split("/")[0] if "/" in f else None for f in comp}
        if len(comp) > MAX_CYCLE or len(folders) != 1 or None in folders:
            broken = True

    if args.layers:
        up = []
        unlayered = sorted(f for f in nodes if layer_of(f)[0] is None)
        for f in unlayered:
            print(f"not in the layer table: {f}")
        for a in sorted(edges):
            ra, na = layer_of(a)
            for b, why in sorted(edges[a].items()):
                rb, nb = layer_of(b)
                if ra is not None and rb is not None and rb < ra:
                    up.append(f"  {a} ({na}) -> {b} ({nb}): {why}")
        print(f"{len(up)} edges run up the layers" + (":" if up else ""))
        for line in up:
            print(line)
        broken = broken or bool(up) or bool(unlayered)

    if args.edges:
        for a in sorted(edges):
            for b, why in sorted(edges[a].items()):
                print(f"  {a} -> {b}: {why}")

    return 1 if args.check and broken else 0


if __name__ == "__main__":
    sys.exit(main())
