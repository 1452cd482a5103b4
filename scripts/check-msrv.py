#!/usr/bin/env python3
"""Checks that every locked dependency the published crates build with declares a
`rust-version` no newer than the crate's own (only one toolchain is installed here, so the MSRV
cannot be checked by building with it). Reads `cargo metadata --locked`; follows the normal and
build dependencies of `fairlock` and `fairlock-cli` through the resolved graph (dev-dependencies
are not needed by users). Exit 1 and a list when one is newer."""

import json
import subprocess
import sys


def version_tuple(v):
    """`1.89` and `1.89.0` are the same version: pad to three parts."""
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"]
        )
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    bad = []
    for root_name in ("fairlock", "fairlock-cli"):
        root = next(p for p in meta["packages"] if p["name"] == root_name)
        ours = root.get("rust_version")
        if not ours:
            bad.append(f"{root_name} declares no rust-version")
            continue
        seen, stack, newest = set(), [root["id"]], ("", (0,))
        while stack:
            pid = stack.pop()
            for dep in nodes[pid]["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds <= {"dev"}:
                    continue
                if dep["pkg"] in seen:
                    continue
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])
                pkg = packages[dep["pkg"]]
                rv = pkg.get("rust_version")
                if rv and version_tuple(rv) > version_tuple(ours):
                    bad.append(f"{root_name} (rust-version {ours}) builds {pkg['name']} {pkg['version']}, which needs {rv}")
                if rv and version_tuple(rv) > newest[1]:
                    newest = (f"{pkg['name']} {pkg['version']}", version_tuple(rv))
        print(f"{root_name}: rust-version {ours}; newest dependency requirement "
              f"{'.'.join(map(str, newest[1]))} ({newest[0]}), {len(seen)} crates checked")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
