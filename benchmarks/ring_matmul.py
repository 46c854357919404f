"""Measure Z_2^64 matmul strategies (reproduces the tables in mpc3/ringmm.py).

    python benchmarks/ring_matmul.py [--reps N]
    python benchmarks/ring_matmul.py --local [--reps N]

Columns: milliseconds, best of --reps; "1x" = one call, "x3" = wall time of
a round in which three threads each make one call concurrently, each on its own copy of
the operands (like the 3-party simulator, whose parties hold different shares).
Strategies: numpy integer matmul, numba serial / parallel kernels by row pairs and by
column tiles (``mpc3.ringmm``), float64 BLAS on 3 balanced 22-bit limbs, and the
dispatching ``mpc3.ring.matmul``.

``--local``: a party's local term of a shared matrix product
(:func:`mpc3.kernels.arith._local_matmul`), the two-product form against the five-product
form, three threads each computing its own party's term (x3 as above), the two forms
alternating ``--reps`` times; the ratio in parentheses = five / two, and "ratio N" the
multiply-adds per operand element the policy reads (``arith.FIVE_MIN_RATIO``).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mpc3 import ring, ringmm  # noqa: E402

Fn = Callable[[np.ndarray, np.ndarray], np.ndarray]
LIMB, KCHUNK = 22, 2048  # |limb| <= 2^21 -> |partial dot| <= 2^42 * 2048 = 2^53


def numpy_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.view(np.int64), b.view(np.int64)).view(np.uint64)


def _numba(parallel: bool, tiled: bool = False) -> Fn:
    def f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _, serial, par, tser, tpar = ringmm._kernels()
        nb = max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
        A = np.ascontiguousarray(np.broadcast_to(a.view(np.int64), (nb, *a.shape[-2:])))
        B = np.ascontiguousarray(np.broadcast_to(b.view(np.int64), (nb, *b.shape[-2:])))
        C = np.zeros((nb, a.shape[-2], b.shape[-1]), np.int64)
        if tiled:
            (tpar if parallel else tser)(A, B, C, ringmm.TILE_COLS)
        else:
            (par if parallel else serial)(A, B, C)
        return C.view(np.uint64).reshape(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + C.shape[1:])
    return f


def _limbs(x: np.ndarray) -> list[np.ndarray]:
    """3 balanced signed 22-bit limbs (as float64) with x = sum l_i 2^(22 i) mod 2^64."""
    v, out = x.view(np.int64), []
    half, mask = 1 << (LIMB - 1), (1 << LIMB) - 1
    for _ in range(3):
        l = ((v + half) & mask) - half
        out.append(l.astype(np.float64))
        v = (v - l) >> LIMB
    return out


def blas_limbs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """6 limb-pair GEMMs (i + j <= 2) stacked along N, K chunked at 2048."""
    N, K = b.shape[-1], a.shape[-1]
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, 1))[:-1] + (N,), np.uint64)
    for k0 in range(0, K, KCHUNK):
        a0, a1, a2 = _limbs(a[..., k0:k0 + KCHUNK])
        b0, b1, b2 = _limbs(b[..., k0:k0 + KCHUNK, :])
        p0 = a0 @ np.concatenate([b0, b1, b2], axis=-1)
        p1 = a1 @ np.concatenate([b0, b1], axis=-1)
        p2 = a2 @ b0
        c0 = p0[..., :N].astype(np.int64)
        c1 = p0[..., N:2 * N].astype(np.int64) + p1[..., :N].astype(np.int64)
        c2 = p0[..., 2 * N:].astype(np.int64) + p1[..., N:].astype(np.int64) + p2.astype(np.int64)
        acc += (c0 + (c1 << LIMB) + (c2 << 2 * LIMB)).view(np.uint64)
    return acc


def t_single(f: Fn, a: np.ndarray, b: np.ndarray, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b)
        best = min(best, time.perf_counter() - t)
    return best


def _round(work: Callable[[int], None]) -> float:
    """Wall time of a round in which 3 threads (parties 0, 1, 2) each call work(i) once."""
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def t_three(f: Fn, a: np.ndarray, b: np.ndarray, reps: int) -> float:
    """Best wall time of a round in which 3 threads each call f once on their own copies."""
    ops = [(a.copy(), b.copy()) for _ in range(3)]
    return min(_round(lambda i: f(*ops[i])) for _ in range(reps))


def local_terms(reps: int) -> None:
    """Two- against five-product local terms, three concurrent parties."""
    from mpc3.kernels import arith
    from mpc3.sharing import deal
    rng = np.random.default_rng(0)
    five_min = arith.FIVE_MIN_RATIO
    print("ms per round of three parties' local terms: two-product / five-product (ratio)")
    for M, K, N in [(64, 512, 4768), (64, 512, 2048), (64, 2048, 512), (64, 512, 512),
                    (128, 768, 3072), (128, 3072, 768), (128, 512, 2048), (256, 768, 768),
                    (512, 512, 4768), (512, 512, 2048), (512, 2048, 512)]:
        x = deal(rng.integers(0, 2**64, (M, K), dtype=np.uint64), rng)
        y = deal(rng.integers(0, 2**64, (K, N), dtype=np.uint64), rng)
        best = {}
        for _ in range(reps):
            for form, ratio in (("two", 1 << 60), ("five", 0)):
                arith.FIVE_MIN_RATIO = ratio
                terms: list = [None] * 3

                def run(i: int, out: list = terms) -> None:
                    out[i] = arith._local_matmul(x[i], y[i], i)

                best[form] = min(best.get(form, float("inf")), _round(run))
                assert np.array_equal(terms[0] + terms[1] + terms[2],
                                      ring.matmul(x[0].a + x[1].a + x[2].a,
                                                  y[0].a + y[1].a + y[2].a))
        arith.FIVE_MIN_RATIO = five_min
        ratio = M * K * N // (M * K + K * N)
        print(f"{M} x {K} x {N} (ratio {ratio}): {best['two'] * 1e3:7.1f} / "
              f"{best['five'] * 1e3:7.1f} ({best['five'] / best['two']:.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--local", action="store_true",
                    help="a party's local term of a shared product: two- vs five-product form")
    args = ap.parse_args()
    if args.local:
        local_terms(args.reps)
        return
    rng = np.random.default_rng(0)
    shapes = [(1, 64, 512, 4768), (1, 128, 3072, 768), (1, 64, 512, 2048), (1, 64, 2048, 512),
              (1, 64, 512, 512), (8, 512, 64, 64), (1, 1, 512, 512)]
    strategies: dict[str, Fn] = {
        "numpy-int": numpy_int,
        "numba-ser": _numba(False),
        "numba-par": _numba(True),
        "tiled-ser": _numba(False, True),
        "tiled-par": _numba(True, True),
        "blas-limbs": blas_limbs,
        "ring.matmul": ring.matmul,
    }
    print(f"cpus={os.cpu_count()} numpy={np.__version__}  ms per call: 1x / x3 (3 concurrent threads)")
    print(f"{'B x M x K x N':<22}" + "".join(f"{n:>18}" for n in strategies))
    for nb, M, K, N in shapes:
        sa, sb = ((nb, M, K), (nb, K, N)) if nb > 1 else ((M, K), (K, N))
        a = rng.integers(0, 2**64 - 1, sa, dtype=np.uint64, endpoint=True)
        b = rng.integers(0, 2**64 - 1, sb, dtype=np.uint64, endpoint=True)
        ref = ring.matmul(a, b)
        cells = []
        for name, f in strategies.items():
            out = f(a, b)  # warm-up (JIT) + correctness
            assert out.shape == ref.shape and np.array_equal(out, ref), name
            cells.append(f"{t_single(f, a, b, args.reps) * 1e3:7.2f} /{t_three(f, a, b, args.reps) * 1e3:7.2f}")
        print(f"{f'{nb} x {M} x {K} x {N}':<22}" + "".join(f"{c:>18}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
