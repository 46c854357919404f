"""Distributed zero-knowledge verification of replicated products (mpc3.dzkp) against the
products themselves, three parties in this process (threads): for L gates, the products'
reshare (8 L bytes per party, one round) and the proof that every party's product message
was honest (every party proves its own batch and checks its two neighbours'); and for
matrix products (``--matmul``), the product and the flush of ``party.checks`` that reduces
it by random vectors (mpc3.freivalds) and proves it; and for fixed-point matrix products
(``--fxp``), the whole product with its truncation in semi-honest and in malicious mode. Rounds and
bytes are the parties' own counters beside the declared cost; walls are this machine's,
with the three parties sharing its cores:

    python benchmarks/dzkp.py --json benchmarks/results/dzkp.json

Each size runs once after a warm-up at L = 1000 (numba compiles the ring kernels on first
use). ``verify_s`` is the slowest party's verification; ``product_s`` its product.
``gram_runs``: the prover's first Gram sums alone on 2^22 bit terms in gates of each of
``--widths`` terms (the proof's cost per term by gate width); ``fold_runs``: the first fold
of one side alone, likewise (``--kernels-only``: these two alone). ``--ands N ...``: N AND
gates' claims proven as mod-2 gates over GF(2^64) and, for comparison, as the Galois-ring
proof's integer claims they were before (``ands_runs``; with ``--kernels-only``, alone):

    python benchmarks/dzkp.py --kernels-only --ands 1048576 8388608 --json benchmarks/results/dzkp_ands.json
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
from mpc3 import dzkp, ring  # noqa: E402
from mpc3.checks import Checks  # noqa: E402
from mpc3.claims import mul_claims  # noqa: E402
from mpc3.kernels import arith  # noqa: E402
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
    dzkp.verify_claims(p, *mul_claims(p, x, y, sent, got[0], "mul", kop), params=params)
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


def _mat_job(p, x, y, params):
    p.checks = Checks(p, params)
    t0 = time.perf_counter()
    z = arith.matmul_aa(p, x, y, trunc=False)
    t1 = time.perf_counter()
    product = p.stats.snapshot()
    p.checks.flush(p)
    return z, t1 - t0, time.perf_counter() - t1, product, p.stats - product


def measure_matmul(shape: tuple[int, int, int], params: dzkp.Params, seed: int = 0) -> dict:
    """One M x K x N matrix product and its verification (a flush of party.checks: the
    Freivalds reduction, the proof and the openings' digest round)."""
    M, K, N = shape
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1 << 64, size=(M, K), dtype=np.uint64)
    y = rng.integers(0, 1 << 64, size=(K, N), dtype=np.uint64)
    xs, ys = deal(x, rng), deal(y, rng)
    out = run_parties(_mat_job, [(xs[i], ys[i], params) for i in range(3)])
    assert np.array_equal(reveal([o[0] for o in out]), ring.matmul(x, y))
    rounds, sent = dzkp.cost_verify(0, 2, params, ring_len=2 * K)
    proof = [o[4] for o in out]
    return {"shape": list(shape), "five_product_form": arith.five_product_form(x.shape, y.shape),
            "product_bytes_per_party": [o[3].bytes_sent for o in out],
            "proof_rounds": max(s.rounds for s in proof),
            "proof_bytes_per_party": [s.bytes_sent for s in proof],
            "declared": {"rounds": rounds + 1, "bytes_per_party": sent + 64},
            "declared_equals_measured": all((s.rounds, s.bytes_sent) == (rounds + 1, sent + 64)
                                            for s in proof),
            "soundness_bits": round(dzkp.soundness_bits(0, 2, params, 2 * K), 2),
            "product_s": round(max(o[1] for o in out), 4),
            "verify_s": round(max(o[2] for o in out), 4)}


def _fxp_job(p, x, y, malicious, params):
    """A fixed-point matrix product: semi-honest (truncation fused into the reshare) or
    malicious (plain product, trunc_a, then the flush that proves both)."""
    if malicious:
        p.checks = Checks(p, params)
    before, t0 = p.stats.snapshot(), time.perf_counter()
    z = arith.matmul_aa(p, x, y)
    t1 = time.perf_counter()
    if malicious:
        p.checks.flush(p)
    return z, t1 - t0, time.perf_counter() - t1, p.stats - before


def measure_fxp(shape: tuple[int, int, int], params: dzkp.Params, seed: int = 0) -> dict:
    """One M x K x N fixed-point matrix product (truncation included) in both modes, in one
    run: bytes and rounds per party of the whole (product, truncation, and in malicious
    mode the flush with the truncation's witness), and walls."""
    M, K, N = shape
    rng = np.random.default_rng(seed)
    x = rng.integers(-(1 << 20), 1 << 20, size=(M, K)).astype(np.uint64)
    y = rng.integers(-(1 << 20), 1 << 20, size=(K, N)).astype(np.uint64)
    xs, ys = deal(x, rng), deal(y, rng)
    row, values = {"shape": list(shape)}, []
    for mode in ("semi-honest", "malicious"):
        out = run_parties(_fxp_job, [(xs[i], ys[i], mode == "malicious", params)
                                     for i in range(3)])
        values.append(reveal([o[0] for o in out]).astype(np.int64))
        row[mode] = {"bytes_per_party": [o[3].bytes_sent for o in out],
                     "rounds": max(o[3].rounds for o in out),
                     "product_s": round(max(o[1] for o in out), 4),
                     "verify_s": round(max(o[2] for o in out), 4)}
    assert np.abs(values[0] - values[1]).max() <= 2          # both: stochastic rounding
    semi, mal = row["semi-honest"], row["malicious"]
    row["bytes_ratio"] = round(sum(mal["bytes_per_party"]) / sum(semi["bytes_per_party"]), 4)
    row["rounds_ratio"] = round(mal["rounds"] / semi["rounds"], 3)
    return row


def _second_call(fn) -> float:
    """Seconds of ``fn()``'s second call (the first compiles the serial and parallel forms)."""
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_gram(m: int, terms: int, k: int = 64, seed: int = 0) -> dict:
    """The prover's Gram sums of a first compression by ``k`` (:func:`mpc3.dzkp_kernels.
    gram_int`) on ``terms`` random bit terms in gates of ``m`` terms, one party alone in
    this process (parallel kernels for large work): its cost per term by gate width, the
    second of two calls."""
    from mpc3 import dzkp_kernels as dk
    rng = np.random.default_rng(seed)
    L = terms // m
    n = -(-L // k)
    u, v = (rng.integers(0, 2, size=(m, L), dtype=np.uint8) for _ in range(2))
    scale = np.arange(1, m + 1, dtype=np.uint64)
    sig = rng.integers(0, 2, size=(n, 64), dtype=np.uint64)
    wall = _second_call(lambda: dk.gram_int(u, v, sig, k, scale, scale))
    return {"terms_per_gate": m, "gates": L, "k_first": k, "gram_s": round(wall, 4),
            "us_per_term": round(wall / (m * L) * 1e6, 4)}


def measure_fold(m: int, terms: int, k: int = 64, seed: int = 0) -> dict:
    """The first fold (:func:`mpc3.dzkp_kernels.fold_int`: the chunks combined at the
    challenge, times sigma) of ``terms`` random bit terms in gates of ``m`` terms, as
    :func:`measure_gram` times the Gram sums: one side's cost per term (every party folds
    four sides a batch: its own two as prover, one of each neighbour's as verifier)."""
    from mpc3 import dzkp_kernels as dk
    from mpc3.galois import galois_ring
    params = dzkp.Params()
    g, reps = galois_ring(params.degree), params.reps
    rng = np.random.default_rng(seed)
    L = terms // m
    n = -(-L // k)
    x = rng.integers(0, 2, size=(m, L), dtype=np.uint8)
    lr = rng.integers(0, 1 << 63, size=(reps, k, g.D), dtype=np.uint64)
    sig = rng.integers(0, 2, size=(reps, n, g.D), dtype=np.uint64)
    scale = np.arange(1, m + 1, dtype=np.uint64)
    wall = _second_call(lambda: dk.fold_int(x, k, lr, sig, g._taps, n=n, scale=scale))
    return {"terms_per_gate": m, "gates": L, "k_first": k, "fold_s": round(wall, 4),
            "us_per_term": round(wall / (m * L) * 1e6, 4)}


def measure_ands(ands: int, seed: int = 0) -> dict:
    """The proof of ``ands`` AND gates' claims, three parties in this process, both ways:
    as mod-2 gates over GF(2^64) (:func:`mpc3.dzkp_bits.verify_bits`, 2 terms a gate, 64
    gates a word) and as the integer claims the Galois-ring proof took before them (4 bit
    terms an AND, 64 ANDs merged into a gate of 256 terms): each prover's gates true, the
    slowest party's wall, bytes and rounds."""
    from mpc3 import dzkp_bits
    rng = np.random.default_rng(seed)
    W = -(-ands // 64)
    words = lambda *s: rng.integers(0, 1 << 64, size=s, dtype=np.uint64)  # noqa: E731
    bits = []
    for _ in range(3):
        u, v, zl = words(2, W), words(2, W), words(W)
        bits.append((u, v, zl, np.bitwise_xor.reduce(u & v, axis=0) ^ zl))
    m, L = 256, W
    scale = np.left_shift(np.uint64(1), np.arange(m, dtype=np.uint64) % np.uint64(64))
    ring_claims = []
    for _ in range(3):
        u, v = (rng.integers(0, 2, size=(m, L), dtype=np.uint8) for _ in range(2))
        z = ((u.astype(np.uint64) * scale[:, None]) * v).sum(axis=0, dtype=np.uint64)
        zl = words(L)
        ring_claims.append((u, v, zl, z - zl))

    def job(p, kind):
        i, nxt, prv = p.rank, (p.rank + 1) % 3, (p.rank - 1) % 3
        before, t0 = p.stats.snapshot(), time.perf_counter()
        if kind == "bits":
            ok = dzkp_bits.verify_bits(p, [dzkp_bits.BitClaim(bits[i][0], bits[i][1],
                                                                bits[i][2] ^ bits[i][3])],
                                       [dzkp_bits.BitClaim(bits[nxt][0], None, bits[nxt][2])],
                                       [dzkp_bits.BitClaim(None, bits[prv][1], bits[prv][3])])
            assert ok == (True, True)
        else:
            c, one = ring_claims, np.ones(m, dtype=np.uint64)
            dzkp.verify_claims(p, dzkp.Claim(c[i][0], c[i][1], c[i][2] + c[i][3], scale, one),
                               dzkp.Claim(c[nxt][0], None, c[nxt][2], scale, None),
                               dzkp.Claim(None, c[prv][1], c[prv][3], None, one))
        return time.perf_counter() - t0, p.stats - before
    out = {"ands": ands}
    for kind in ("bits", "ring"):
        got = run_parties(job, [(kind,)] * 3)
        out[kind] = {"verify_s": round(max(t for t, _ in got), 3),
                     "bytes_per_party": got[0][1].bytes_sent, "rounds": got[0][1].rounds}
    out["bits"]["declared"] = list(dzkp_bits.cost_verify_bits([(W, 2)]))
    out["ring"]["declared"] = list(dzkp.cost_verify(L, m))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    ap.add_argument("--matmul", nargs="*", default=["128x768x2304", "1x768x2304"],
                    help="matrix products MxKxN (GPT-2-small's QKV projection of a 128-token "
                         "prompt and of one decoding step by default)")
    ap.add_argument("--fxp", nargs="*", default=["128x768x768", "1x768x768"],
                    help="fixed-point matrix products MxKxN measured in both modes (a "
                         "GPT-2-small attention output projection, prompt and one step)")
    ap.add_argument("--widths", type=int, nargs="*", default=[2, 8, 64, 256],
                    help="gate widths whose first-compression Gram sums are timed alone")
    ap.add_argument("--gram-terms", type=int, default=1 << 22)
    ap.add_argument("--kernels-only", action="store_true",
                    help="only the first compression's kernels alone (gram_runs, fold_runs)")
    ap.add_argument("--ands", type=int, nargs="*", default=[],
                    help="AND gates proven both ways (mod-2 gates over GF(2^64); the "
                         "integer claims of the Galois-ring proof): ands_runs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    params = dzkp.Params()
    result = runinfo.start("dzkp")
    result["params"] = {"degree": params.degree, "reps": params.reps, "k": params.k}
    if args.ands:
        measure_ands(4096)                                  # warm-up: numba compiles
        result["ands_runs"] = [measure_ands(n) for n in args.ands]
    if args.ands and args.kernels_only:
        runinfo.finish(result, args.json)
        return 0
    if not args.kernels_only:
        measure(1000, params)                               # warm-up: numba compiles
        result["runs"] = [measure(n, params) for n in args.sizes]
        result["matmul_runs"] = [measure_matmul(tuple(int(v) for v in s.split("x")), params)
                                 for s in args.matmul]
        result["fxp_runs"] = [measure_fxp(tuple(int(v) for v in s.split("x")), params)
                              for s in args.fxp]
    result["gram_runs"] = [measure_gram(m, args.gram_terms) for m in args.widths]
    result["fold_runs"] = [measure_fold(m, args.gram_terms) for m in args.widths]
    runinfo.finish(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
