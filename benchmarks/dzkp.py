"""Distributed zero-knowledge verification of replicated products (mpc3.dzkp) against the
products themselves, three parties in this process (threads): for L gates, the products'
reshare (8 L bytes per party, one round) and the proof that every party's product message
was honest (every party proves its own batch and checks its two neighbours'). Rounds and
bytes are the parties' own counters beside the declared cost; walls are this machine's,
with the three parties sharing its cores:

    python benchmarks/dzkp.py --json benchmarks/results/dzkp.json

Each size runs once after a warm-up at L = 1000 (numba compiles the ring kernels on first
use). ``verify_s`` is the slowest party's verification; ``product_s`` its product.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from mpc3 import dzkp  # noqa: E402
from mpc3.kernels.arith import _local_mul  # noqa: E402
from mpc3.sharing import deal, reveal  # noqa: E402
from mpc3.shares import AShare  # noqa: E402
from mpc3.sim import run_parties  # noqa: E402


def _job(p, x, y, params):
    t0 = time.perf_counter()
    kop = p.new_op()
    sent = p.add_zero_share(_local_mul(x, y), "mul")
    got, _ = p.comm.exchange(to_prev=[sent], from_next=True)
    t1 = time.perf_counter()
    product = p.stats.snapshot()
    dzkp.verify_claims(p, *dzkp.mul_claims(p, x, y, sent, got[0], "mul", kop), params=params)
    proof = p.stats - product
    return (AShare(sent, got[0]), t1 - t0, time.perf_counter() - t1, product, proof)


def measure(n: int, params: dzkp.Params, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1 << 64, size=n, dtype=np.uint64)
    y = rng.integers(0, 1 << 64, size=n, dtype=np.uint64)
    xs, ys = deal(x, rng), deal(y, rng)
    out = run_parties(_job, [(xs[i], ys[i], params) for i in range(3)])
    assert np.array_equal(reveal([o[0] for o in out]), x * y)
    rounds, sent = dzkp.cost_verify(n, 2, params)
    proof = [o[4] for o in out]
    return {"gates": n,
            "product_bytes_per_party": [o[3].bytes_sent for o in out],
            "proof_rounds": max(s.rounds for s in proof),
            "proof_bytes_per_party": [s.bytes_sent for s in proof],
            "declared": {"rounds": rounds, "bytes_per_party": sent},
            "declared_equals_measured": all((s.rounds, s.bytes_sent) == (rounds, sent)
                                            for s in proof),
            "proof_over_product_bytes": round(sent / (8 * n), 5),
            "soundness_bits": round(dzkp.soundness_bits(n, 2, params), 2),
            "product_s": round(max(o[1] for o in out), 4),
            "verify_s": round(max(o[2] for o in out), 4),
            "verified_gates_per_s": round(n / max(o[2] for o in out))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    params = dzkp.Params()
    result = runinfo.start("dzkp")
    result["params"] = {"degree": params.degree, "reps": params.reps, "k": params.k}
    measure(1000, params)                                   # warm-up: numba compiles
    result["runs"] = [measure(n, params) for n in args.sizes]
    runinfo.finish(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
