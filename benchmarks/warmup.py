"""A party's kernel warm-up (``mpc3.warmup``), as a party process runs it before serving: each
mode's warm-up in a fresh process on an empty numba cache (a fresh install) and again on the
cache it filled (every later start), CPU and wall seconds; the catalog-only warm-up parties
ran before it for comparison (what ``prepare_kernels`` called until afd94ac).

    python benchmarks/warmup.py --json benchmarks/results/warmup.json
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

from runinfo import ROOT, finish, start

CALLS = {
    "catalog only": "from mpc3.kernels import catalog; catalog.warm_up()",
    "semi-honest": "from mpc3 import warmup; warmup.warm_up('semi-honest')",
    "malicious": "from mpc3 import warmup; warmup.warm_up('malicious')",
}


def _timed(code: str, cache: str) -> dict:
    """CPU (user + system, the child's) and wall seconds of ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env=dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    a = ap.parse_args()
    result = start("warmup")
    for name, code in CALLS.items():
        with tempfile.TemporaryDirectory() as cache:
            result[name] = {"empty_cache": _timed(code, cache), "cached": _timed(code, cache)}
            print(name, result[name], file=sys.stderr, flush=True)
    finish(result, a.json)


if __name__ == "__main__":
    main()
