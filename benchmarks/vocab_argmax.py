"""A secret embedding table and LM head at GPT-2's vocabulary (V = 50257, d = 768, B = 1),
three parties in this process (threads): the token of one hidden row
(:func:`protocols.layers.vocab.lm_head_token`: the logits' product and the arg-max over V),
the arg-max alone, and the one-hot embedding lookup (:func:`~protocols.layers.vocab.onehot_embed`)
of 1 and of 128 tokens. Rounds and bytes are the parties' own counters (exact, the same on any
machine) beside the declared costs, which must equal them; wall time and CPU are this
machine's, with the three parties sharing its cores. ``local_product_one_party_s`` is one
party's local term of the lookup's product alone (no other party running):

    python benchmarks/vocab_argmax.py --json benchmarks/results/vocab_argmax.json

Random weights (table and head N(0, 0.05^2), bias N(0, 0.1^2), the row N(0, 1): logits of
sd ~1.4, inside every range); each measurement runs ``--repeat`` times after one run on a
small vocabulary (numba compiles its kernels on first use); walls of every run are kept.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from mpc3 import ring  # noqa: E402
from mpc3.kernels import arith  # noqa: E402
from mpc3.party import RingConfig  # noqa: E402
from mpc3.sharing import deal, reveal  # noqa: E402
from mpc3.sim import make_parties, run_parties  # noqa: E402
from protocols.layers import vocab as VO  # noqa: E402

V, D = 50257, 768
RC = RingConfig()


def _dealt(x: np.ndarray, encode: bool = True) -> list:
    return deal(ring.encode(x, RC.frac) if encode else x, shared_replicas=True)


def measure(fn, dealt: list, declared, repeat: int) -> tuple[dict, list]:
    """Run ``fn(party, *shares)`` ``repeat`` times; the figures and the last run's result."""
    walls, cpus = [], []
    for _ in range(repeat):
        parties = make_parties(RC)
        c0, t0 = os.times(), time.perf_counter()
        out = run_parties(fn, [tuple(d[i] for d in dealt) for i in range(3)], parties=parties)
        walls.append(round(time.perf_counter() - t0, 4))
        c1 = os.times()
        cpus.append(round(c1.user + c1.system - c0.user - c0.system, 3))
    rounds = max(p.stats.rounds for p in parties)
    per = [p.stats.bytes_sent for p in parties]
    return {"rounds": rounds, "bytes_per_party": per, "bytes_total": sum(per),
            "declared": {"rounds": declared.rounds,
                         "bytes_per_party": list(declared.bytes_per_party)},
            "declared_equals_measured": (rounds == declared.rounds
                                         and tuple(per) == declared.bytes_per_party),
            "wall_s": walls, "wall_s_min": min(walls), "process_cpu_s": cpus}, out


def local_product(onehot_share, table_share, repeat: int) -> float:
    """Best wall time of party 0's local term of the lookup's product, alone."""
    x = onehot_share.reshape(-1, V)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        arith._local_matmul(x, table_share, 0)
        best = min(best, time.perf_counter() - t0)
    return round(best, 4)


def warm_up() -> None:
    """One run of each protocol on a small vocabulary: numba's kernels compile here."""
    rng = np.random.default_rng(1)
    v = 3000
    table = _dealt(rng.normal(size=(v, D)) * 0.05)
    run_parties(lambda p, o, t: VO.onehot_embed(p, o, t),
                [(o, t) for o, t in zip(_dealt(VO.onehot(rng.integers(0, v, (1, 128)), v),
                                               False), table)])
    run_parties(lambda p, h, w: VO.lm_head_token(p, h, w),
                [(h, w) for h, w in zip(_dealt(rng.normal(size=(1, D))), _dealt(
                    rng.normal(size=(D, v)) * 0.05))])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = runinfo.start("vocab_argmax")
    result["shape"] = {"V": V, "d": D, "B": 1, "frac": RC.frac, "trunc": RC.trunc}
    warm_up()
    rng = np.random.default_rng(0)

    h = rng.normal(size=(1, D))
    w = rng.normal(size=(D, V)) * 0.05
    b = rng.normal(size=V) * 0.1
    logits = h @ w + b
    top = np.sort(logits[0])[-2:]
    sh, sw, sb = _dealt(h), _dealt(w), _dealt(b)
    del w
    r, out = measure(lambda p, x, y, z: VO.lm_head_token(p, x, y, z), [sh, sw, sb],
                     VO.cost_lm_head_token(RC, 1, V), args.repeat)
    r.update(token=int(round(ring.decode(reveal(out))[0])), numpy_argmax=int(logits.argmax()),
             top2_gap=float(top[1] - top[0]))
    result["lm_head_token"] = r
    del sw
    r, out = measure(lambda p, x: VO.argmax_a(p, x), [_dealt(logits)],
                     VO.cost_argmax(RC, 1, V), args.repeat)
    r.update(token=int(round(ring.decode(reveal(out))[0])))
    result["argmax_a"] = r

    table = rng.normal(size=(V, D)) * 0.05
    st = _dealt(table)
    want = ring.encode(table, RC.frac)
    del table
    for T in (1, 128):
        ids = rng.integers(0, V, size=(1, T))
        so = _dealt(VO.onehot(ids, V), encode=False)
        r, out = measure(lambda p, o, t: VO.onehot_embed(p, o, t), [so, st],
                         VO.cost_onehot_embed(RC, 1, T, D), args.repeat)
        r.update(rows_exact=bool((reveal(out) == want[ids]).all()),
                 local_product_one_party_s=local_product(so[0], st[0], args.repeat))
        result[f"onehot_embed_T{T}"] = r
        del so, out
    runinfo.finish(result, args.json)
    return 0 if all(result[k]["declared_equals_measured"] for k in
                    ("lm_head_token", "argmax_a", "onehot_embed_T1", "onehot_embed_T128")) else 1


if __name__ == "__main__":
    sys.exit(main())
