"""How much of an in-process layer run's CPU is the ring matmul: ``mpc3 bench layer``'s own
run (:func:`app.bench.layer.run_layer`), with every :func:`mpc3.ring.matmul` call timed by the
calling thread's CPU clock and numba held to one thread (``NUMBA_NUM_THREADS=1``, set before
numba loads), so that all of a product's CPU is on the thread that asked for it. Prints wall,
the process's CPU and the matmul's CPU of each run and of the fastest (JSON on stdout):

    python benchmarks/cpu_split.py encoder --batch 8 > benchmarks/results/cpu_split_encoder_b8.json
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

os.environ["NUMBA_NUM_THREADS"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runinfo  # noqa: E402
from app.bench import layer  # noqa: E402
from mpc3 import ring, sim  # noqa: E402

_lock = threading.Lock()
_matmul_cpu = [0.0]


def _timed(matmul):
    def timed(*args, **kw):
        t0 = time.thread_time()
        try:
            return matmul(*args, **kw)
        finally:
            with _lock:
                _matmul_cpu[0] += time.thread_time() - t0
    return timed


def main(argv=None) -> None:
    sub = argparse.ArgumentParser(prog="cpu_split.py").add_subparsers(required=True)
    layer.register(sub)                       # mpc3 bench layer's own arguments
    a = sub.choices["layer"].parse_args(argv)
    result = runinfo.start("cpu_split")
    ring.matmul = _timed(ring.matmul)
    runs, run_parties = [], sim.run_parties

    def measured(*args, **kw):                # each of run_layer's timed runs
        _matmul_cpu[0] = 0.0
        c0, t0 = os.times(), time.perf_counter()
        out = run_parties(*args, **kw)
        c1 = os.times()
        runs.append({"wall_s": time.perf_counter() - t0,
                     "cpu_s": c1.user + c1.system - c0.user - c0.system,
                     "matmul_cpu_s": _matmul_cpu[0]})
        return out

    sim.run_parties = measured
    r = layer.run_layer(a)
    best = min(runs, key=lambda x: x["wall_s"])
    result.update(workload=r["workload"], batch=a.batch, numba_threads=1, min_run=best,
                  runs=runs, bytes_total=r["bytes_total"])
    runinfo.finish(result, None)


if __name__ == "__main__":
    main()
