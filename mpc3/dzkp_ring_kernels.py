"""Fused numba kernels of :mod:`mpc3.dzkp`'s Galois-ring compressions (every one after the
first, and the first when only matrix-product claims are proven): the Gram sums whose
values at the nodes the prover sends, and the folds of the vectors at a challenge.

- **Gram sums by Karatsuba's trick on the chunks.** h at the extra nodes needs G[i, i']
  only through T[i, i'] = G[i, i'] + G[i', i] = P[i, i'] - G[i, i] - G[i', i'] with
  P[i, i'] = sum_t (U_i + U_i')(V_i + V_i'): one ring product per pair and position, not
  two, as unreduced coefficient products (D x D a pair).
- **Folds by multiplication matrices.** sum_i L_i(r) X_i: each position's D coefficients
  times L_i(r)'s D x D matrix, by blocks of positions so each matrix stays in L1; chunks
  that are all zero (a verifier's half of a replicated product) are skipped.

Arithmetic is int64 (wrapping = mod 2^64) on uint64 views; serial and parallel forms as in
:mod:`mpc3.dzkp_kernels`, whose choice (:func:`mpc3.dzkp_kernels._parts`) they share.
"""
from __future__ import annotations

import numpy as np

from .dzkp_kernels import BLOCK, _i64, _parallel_twin, _parts
from .gf2k import bind_jit
from .ringmm import once, twins

_prange = range  # replaced by numba.prange when the kernels are compiled


def _gram_ring_part(U, V, k, n, t0, t1, out):  # pragma: no cover
    """out[p, a, b] += sum_t A_p[t, a] B_p[t, b] over t0 <= t < t1, for the pairs p = (i <= i')
    with A_p = U_i (+ U_i'), B_p = V_i (+ V_i'): U, V (N, D) chunked by n."""
    N, D = U.shape
    A = np.zeros((BLOCK, D), dtype=np.int64)
    B = np.zeros((BLOCK, D), dtype=np.int64)
    for s in range(t0, t1, BLOCK):
        w = min(t1, s + BLOCK) - s
        w4 = w + (-w) % 4
        p = 0
        for i in range(k):
            for i2 in range(i, k):
                for t in range(w4):
                    x, y = i * n + s + t, i2 * n + s + t
                    inx = t < w and x < N
                    iny = t < w and i2 != i and y < N
                    for d in range(D):
                        A[t, d] = (U[x, d] if inx else 0) + (U[y, d] if iny else 0)
                        B[t, d] = (V[x, d] if inx else 0) + (V[y, d] if iny else 0)
                C = out[p]
                for t in range(0, w4, 4):
                    b0, b1, b2, b3 = B[t], B[t + 1], B[t + 2], B[t + 3]
                    for a in range(D):
                        a0, a1, a2, a3 = A[t, a], A[t + 1, a], A[t + 2, a], A[t + 3, a]
                        row = C[a]
                        for b in range(D):
                            row[b] += a0 * b0[b] + a1 * b1[b] + a2 * b2[b] + a3 * b3[b]
                p += 1


def _gram_ring_all(U, V, k, n, out):  # pragma: no cover
    """out (parts, reps, pairs, D, D); U, V (reps, N, D)."""
    parts, reps = out.shape[0], out.shape[1]
    for jj in _prange(parts * reps):
        j, r = jj // reps, jj % reps
        _gram_ring_part_jit(U[r], V[r], k, n, n * j // parts, n * (j + 1) // parts, out[j, r])


def _fold_ring_part(X, n, mats, nz, t0, t1, out):  # pragma: no cover
    """out[r, t] = sum_i X[r, i n + t] @ mats[r, i] (L_i(r)'s D x D multiplication matrix) for
    t0 <= t < t1, chunks with nz[r, i] false skipped; X (reps, N, D), mats (reps, k, D, D), out
    (reps, n, D). By blocks of positions: each matrix stays in L1 while the block passes."""
    reps, N, D = X.shape
    k = mats.shape[1]
    for r in range(reps):
        for s in range(t0, t1, BLOCK):
            w = min(t1, s + BLOCK) - s
            o = out[r, s:s + w]
            o[:] = 0
            for i in range(k):
                if not nz[r, i]:
                    continue
                base = i * n + s
                top = min(w, N - base)
                M = mats[r, i]
                for t in range(top):
                    xi = X[r, base + t]
                    ot = o[t]
                    for d in range(D):
                        xd = xi[d]
                        Md = M[d]
                        for e in range(D):
                            ot[e] += xd * Md[e]


def _fold_ring_all(X, n, mats, nz, out, parts):  # pragma: no cover
    """nz[r, i] first: chunk i of X[r] holds a non-zero word (a scan that stops there)."""
    reps, N, D = X.shape
    for r in range(reps):
        for i in range(nz.shape[1]):
            t, end = i * n * D, min(N, (i + 1) * n) * D
            while t < end and X[r, t // D, t % D] == 0:
                t += 1
            nz[r, i] = t < end
    for j in _prange(parts):
        _fold_ring_part_jit(X, n, mats, nz, n * j // parts, n * (j + 1) // parts, out)


_gram_ring_part_jit = _gram_ring_part
_fold_ring_part_jit = _fold_ring_part


@once
def _kernels() -> dict:
    """Compile lazily (disk-cached): the part kernels, and serial / parallel drivers."""
    import numba

    g = globals()
    bind_jit(g, ("_gram_ring_part", "_fold_ring_part"))
    out = {}
    for name in ("_gram_ring_all", "_fold_ring_all"):
        out[name, False] = numba.njit(cache=True, nogil=True)(g[name])   # _prange: range
        out[name, True] = _parallel_twin(numba, g[name])
        twins(out[name, False], out[name, True])
    return out


def gram_ring(U: np.ndarray, V: np.ndarray, k: int) -> np.ndarray:
    """P[r, p, a, b] = sum_t A_p[t, a] B_p[t, b] (coefficient products, unreduced) for ring
    vectors U, V (reps, N, D) in k chunks of n = ceil(N / k), A_p = U_i + U_i' (U_i on the
    diagonal), B_p likewise: (reps, pairs, D, D)."""
    reps, N, D = U.shape
    n = -(-N // k)
    P = k * (k + 1) // 2
    par, parts = _parts(reps * P * n * D * D)
    out = np.zeros((parts, reps, P, D, D), dtype=np.int64)
    _kernels()["_gram_ring_all", par](_i64(U), _i64(V), k, n, out)
    return out.sum(axis=0, dtype=np.int64).view(np.uint64)


def fold_ring(X: np.ndarray, k: int, mats: np.ndarray) -> np.ndarray:
    """sum_i L_i(r) X_i for ring vectors X (reps, N, D) in k chunks, mats (reps, k, D, D) the
    multiplication matrices of L_i(r): (reps, ceil(N / k), D). All-zero chunks are skipped."""
    reps, N, D = X.shape
    n = -(-N // k)
    nz = np.zeros((reps, k), dtype=np.bool_)          # filled by the kernel
    par, parts = _parts(reps * k * n * D * D)
    out = np.empty((reps, n, D), dtype=np.int64)
    _kernels()["_fold_ring_all", par](_i64(X), n, _i64(mats), nz, out, parts)
    return out.view(np.uint64)
