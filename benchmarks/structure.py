"""The shape of the code at a commit: files and lines per folder (room), the largest modules,
hand-written cost functions, the kernel catalog's adapter lambdas and re-export shims.

    python benchmarks/structure.py                 # the working tree's HEAD
    python benchmarks/structure.py --rev ebdea74   # any commit, read with git (no checkout)
    python benchmarks/structure.py --rev A --rev B # side by side

What it counts (Python files of mpc3/, protocols/, net/, app/; generated *_pb2 modules left
out): a *room* is a folder holding modules directly; ``def cost_`` at any indentation is a
hand-written cost function; ``lambda s, c`` in mpc3/kernels/catalog.py is an adapter between
a kernel's cost function and the catalog; ``noqa: F401`` marks an import kept only to be
re-exported.
"""
from __future__ import annotations

import argparse
import re
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("mpc3", "protocols", "net", "app")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def sources(rev: str) -> dict[str, str]:
    """path -> text of every counted module at ``rev``."""
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, "--", *TOPS).split()
             if p.endswith(".py") and "_pb2" not in p]
    return {p: _git("show", f"{rev}:{p}") for p in paths}


def measure(rev: str) -> dict:
    src = sources(rev)
    rooms, lines = Counter(), Counter()
    for path, text in src.items():
        room = str(Path(path).parent)
        rooms[room] += 1
        lines[room] += len(text.splitlines())
    catalog = src.get("mpc3/kernels/catalog.py", "")
    return {
        "rev": _git("rev-parse", "--short", rev).strip(),
        "modules": len(src),
        "rooms": {r: (rooms[r], lines[r]) for r in sorted(rooms)},
        "largest": sorted(((len(t.splitlines()), p) for p, t in src.items()), reverse=True)[:8],
        "cost_functions": sum(len(re.findall(r"^\s*def cost_", t, re.M)) for t in src.values()),
        "catalog_adapters": len(re.findall(r"lambda s, c\b", catalog)),
        "reexport_shims": sum(t.count("noqa: F401") for t in src.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", action="append", help="a commit (repeatable; default HEAD)")
    revs = ap.parse_args().rev or ["HEAD"]
    for m in map(measure, revs):
        print(f"== {m['rev']}: {m['modules']} modules, {m['cost_functions']} cost functions, "
              f"{m['catalog_adapters']} catalog adapter lambdas, {m['reexport_shims']} "
              f"noqa: F401 re-exports")
        for room, (n, k) in m["rooms"].items():
            print(f"  {room + '/':26s} {n:3d} files {k:6d} lines")
        print("  largest: " + ", ".join(f"{p} {n}" for n, p in m["largest"]))


if __name__ == "__main__":
    main()
