"""Fused numba kernels of :mod:`mpc3.dzkp`'s compressions: the Gram sums whose values at the
nodes the prover sends, and the folds of the vectors at a challenge - what the generic route
(chunk copies, ring GEMMs, ring products on numpy temporaries) computed, with fewer
multiply-adds:

- **symmetric Gram sums.** h at the extra nodes needs G[i, i'] only through
  L_i(w) L_i'(w) G[i, i'], so only T[i, i'] = G[i, i'] + G[i', i] for i < i' (and G[i, i])
  is computed: k (k + 1) / 2 sums, not k^2. Over Z_2^64 data (here) each pair's weighted
  sum is done once; over ring data (:mod:`mpc3.dzkp_ring_kernels`) by Karatsuba's trick on
  the chunks.
- **folds without temporaries.** The first fold reads the Z_2^64 data where they lie (chunk
  i, position t at i n + t, zero past the end), combines the k chunks with the Lagrange
  coefficients and multiplies by sigma_t in one pass, skipping zero rows or chunks (a
  replicated product's verifiers hold a zero half).

Arithmetic is int64 (wrapping = mod 2^64) on uint64 views. Each kernel has a serial
(GIL-free) and a parallel form over parts of the positions; the parallel one runs only for
at least ``ring.PARALLEL_MIN_MACS`` multiply-adds, as :mod:`mpc3.ringmm` decides.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import procinfo
from .gf2k import bind_jit
from .ringmm import PARALLEL_MIN_MACS, once, twins

#: Claims released while folding are returned to the kernel every this many bytes (their
#: small buffers would otherwise stay in the heap while the fold's large ones are mapped).
TRIM_BYTES = 256 << 20

#: positions per block: a block of the weights / chunks stays in L1 while every pair passes
BLOCK = 64

#: bytes of the chunks' blocks the Gram sums keep at hand (half a core's L2 here): wide gates
#: take fewer positions a block (:func:`gram_block`)
GRAM_CACHE = 256 << 10

_prange = range  # replaced by numba.prange when the kernels are compiled


def _gram_int_part(u, v, us, vs, sig, k, n, t0, t1, out, blk):  # pragma: no cover
    """out[p] += sum_t (sum_a u_i v_i' + u_i' v_i)[t] sig[t] over t0 <= t < t1 for the pairs
    (sig: binary weights as masks, 0 or -1: masked additions)
    p = (i <= i') in row order (the diagonal counted once); u, v (m, L) chunked by n, row a
    of u times us[a] (of v times vs[a]): words and ones, or bits and their rows' values."""
    m, L = u.shape
    R = sig.shape[1]
    ub = np.zeros((k, m, blk), dtype=np.int64)
    vb = np.zeros((k, m, blk), dtype=np.int64)
    q = np.zeros(blk + 3, dtype=np.int64)
    for s in range(t0, t1, blk):
        w = min(t1, s + blk) - s
        for i in range(k):
            for a in range(m):
                for t in range(w):
                    idx = i * n + s + t
                    ub[i, a, t] = u[a, idx] * us[a] if idx < L else 0
                    vb[i, a, t] = v[a, idx] * vs[a] if idx < L else 0
        p = 0
        for i in range(k):
            for i2 in range(i, k):
                for t in range(w):
                    acc = 0
                    for a in range(m):
                        acc += ub[i, a, t] * vb[i2, a, t]
                    if i2 != i:
                        for a in range(m):
                            acc += ub[i2, a, t] * vb[i, a, t]
                    q[t] = acc
                for t in range(w, w + 3):
                    q[t] = 0
                # indexed, not through row views: numba reference-counts a view made here
                for t in range(0, w, 4):
                    q0, q1, q2, q3 = q[t], q[t + 1], q[t + 2], q[t + 3]
                    r0, r1 = s + t, min(s + t + 1, t1 - 1)
                    r2, r3 = min(s + t + 2, t1 - 1), min(s + t + 3, t1 - 1)
                    for c in range(R):
                        out[p, c] += (q0 & sig[r0, c]) + (q1 & sig[r1, c]) + \
                            (q2 & sig[r2, c]) + (q3 & sig[r3, c])
                p += 1


def _gram_int_all(u, v, us, vs, sig, k, n, out, blk):  # pragma: no cover
    """out (parts, pairs, R): part j sums its share of the positions, by blocks of ``blk``."""
    parts = out.shape[0]
    for j in _prange(parts):
        _gram_int_part_jit(u, v, us, vs, sig, k, n, n * j // parts, n * (j + 1) // parts,
                           out[j], blk)


def _fold_int_part(x, xs, n, lr, sig, nz, taps, t0, t1, out):  # pragma: no cover
    """out[j, a n + t] = (sigma_t *) sum_i lr[i, j] xs[a] x[a, i n + t] for t0 <= t < t1: x
    (m, L) Z_2^64 words (xs ones) or bits (xs their rows' values), lr (k, reps D)
    (repetition j's coefficients at columns j D .. j D + D - 1), sig (reps, n, D) sigma's
    0/1 coefficients (int64) or empty (no sigma), nz (m,) rows not all zero, out (reps, m n, D)
    (every position written: a zero row's with zeros, without reading it). By blocks of
    positions: each chunk's slice of x is read in order into an L1 block of accumulators."""
    m, L = x.shape
    k, R = lr.shape
    reps, D = out.shape[0], out.shape[2]
    acc = np.zeros((BLOCK, R), dtype=np.int64)
    c = np.zeros(2 * D - 1, dtype=np.int64)
    lrs = np.empty((k, R), dtype=np.int64)
    weighted = sig.shape[0] > 0
    for a in range(m):
        if not nz[a]:                         # a zero row's fold is zero
            _zero_row_jit(out, a * n + t0, a * n + t1)
            continue
        for i in range(k):                    # the row's value folded into the coefficients
            for e in range(R):
                lrs[i, e] = lr[i, e] * xs[a]
        for s in range(t0, t1, BLOCK):
            w = min(t1, s + BLOCK) - s
            acc[:w] = 0
            for i in range(k):
                base = i * n + s
                top = min(w, L - base)
                li = lrs[i]
                for t in range(top):
                    xv = x[a, base + t]
                    row = acc[t]
                    if xv == 1:                   # bits: additions only (zeros skipped)
                        for e in range(R):
                            row[e] += li[e]
                    elif xv != 0:
                        for e in range(R):
                            row[e] += xv * li[e]
            for t in range(w):
                _emit_jit(acc[t], sig, s + t, taps, c, out, a * n + s + t, weighted)


def _fold_bits_part(x, xs, n, tab, sig, nz, taps, t0, t1, out):  # pragma: no cover
    """:func:`_fold_int_part` for bit rows: tab[g, b] = sum of lr[8 g + j] over b's set bits
    j, one table row per 8 chunks a position; the row's value multiplies the sum once."""
    m, L = x.shape
    G, R, reps, D = tab.shape[0], tab.shape[2], out.shape[0], out.shape[2]
    acc = np.zeros((BLOCK, R), dtype=np.int64)
    c = np.zeros(2 * D - 1, dtype=np.int64)
    idx = np.zeros(BLOCK, dtype=np.int64)
    weighted = sig.shape[0] > 0
    for a in range(m):
        sa = xs[a]
        if not nz[a]:                                           # a zero row's fold is zero
            _zero_row_jit(out, a * n + t0, a * n + t1)
            continue
        for s in range(t0, t1, BLOCK):
            w = min(t1, s + BLOCK) - s
            acc[:w] = 0
            for g in range(G):
                idx[:w] = 0
                for j in range(8):
                    base = (8 * g + j) * n + s
                    top = min(w, L - base)
                    for t in range(top):
                        idx[t] |= np.int64(x[a, base + t]) << j
                tg = tab[g]
                for t in range(w):
                    b = idx[t]
                    if b:
                        src = tg[b]
                        row = acc[t]
                        for e in range(R):
                            row[e] += src[e]
            for t in range(w):
                acc[t] *= sa
                _emit_jit(acc[t], sig, s + t, taps, c, out, a * n + s + t, weighted)


def _zero_row(out, o0, o1):  # pragma: no cover
    """out[:, o0:o1] = 0 (out: (reps, positions, D))."""
    for j in range(out.shape[0]):
        for o in range(o0, o1):
            for d in range(out.shape[2]):
                out[j, o, d] = 0


def _fold_bits_all(x, xs, n, tab, sig, nz, taps, out, parts):  # pragma: no cover
    for j in _prange(parts):
        _fold_bits_part_jit(x, xs, n, tab, sig, nz, taps, n * j // parts,
                            n * (j + 1) // parts, out)


def _emit(acc, sig, t, taps, c, out, o, weighted):  # pragma: no cover
    """out[j, o] = (sigma_t *) repetition j's D words of ``acc`` (sig: (reps, n, D) 0/1)."""
    D = out.shape[2]
    for j in range(out.shape[0]):
        if weighted:
            _ring_mul_into_jit(acc[j * D:(j + 1) * D], sig[j, t], taps, c, out[j, o])
        else:
            out[j, o] = acc[j * D:(j + 1) * D]


def _fold_int_all(x, xs, n, lr, sig, nz, taps, out, parts):  # pragma: no cover
    for j in _prange(parts):
        _fold_int_part_jit(x, xs, n, lr, sig, nz, taps, n * j // parts, n * (j + 1) // parts,
                           out)


def _bit_rows(x, bits, tops):  # pragma: no cover
    """Whether every row of x (m, L) holds zeros and one value; as it goes, bits[a, t] =
    (x[a, t] != 0) and tops[a] = row a's value (0: a zero row). Stops at the first row that
    holds two values (a side of words stops in its first row)."""
    m, L = x.shape
    zero = np.uint64(0)                # uint64 throughout (with an int64 0 numba unifies
    for a in range(m):                 # the two as float64)
        top = zero
        for t in range(L):
            v = x[a, t]
            if v != zero:
                if top == zero:
                    top = v
                elif v != top:
                    return False
            bits[a, t] = v != zero
        tops[a] = top
    return True


_gram_int_part_jit = _gram_int_part


def _mul_binary(a, b, taps, c, out):  # pragma: no cover
    """out = a * b in GR(2^64, D) for b with 0/1 coefficients: a shifted copy of a added
    per set one, a vectorized addition (c: scratch of 2D - 1)."""
    d = a.shape[0]
    c[:] = 0
    for e in range(d):
        if b[e]:
            ce = c[e:e + d]
            ce += a
    for m in range(2 * d - 2, d - 1, -1):
        top = c[m]
        for t in taps:
            c[m - d + t] -= top
    out[:] = c[:d]


_zero_row_jit = _zero_row
_ring_mul_into_jit = _mul_binary       # out = a * sigma in GR(2^64, D), c: scratch
_fold_int_part_jit = _fold_int_part
_fold_bits_part_jit = _fold_bits_part
_emit_jit = _emit


@once
def _kernels() -> dict:
    """Compile lazily (disk-cached): the part kernels, and serial / parallel drivers."""
    import numba

    g = globals()
    bind_jit(g, ("_emit", "_zero_row", "_gram_int_part", "_fold_int_part", "_fold_bits_part"))
    g["_ring_mul_into_jit"] = numba.njit(cache=True, nogil=True)(_mul_binary)
    out, drivers = {}, ("_gram_int_all", "_fold_int_all", "_fold_bits_all")
    for name in drivers:
        out[name, False] = numba.njit(cache=True, nogil=True)(g[name])   # _prange: range
    for name in drivers:
        out[name, True] = _parallel_twin(numba, g[name])
        twins(out[name, False], out[name, True])
    out["_bit_rows"] = numba.njit(cache=True, nogil=True)(_bit_rows)
    return out


def _parallel_twin(numba, func):
    """A parallel compilation of ``func`` under its own cache name (numba's cache key ignores
    the flags) with ``_prange`` bound to numba.prange."""
    import types

    glob = dict(func.__globals__)
    glob["_prange"] = numba.prange
    twin = types.FunctionType(func.__code__, glob, func.__name__ + "_par")
    twin.__qualname__ = func.__qualname__ + "_par"
    return numba.njit(cache=True, nogil=True, parallel=True)(twin)


_active = [0]
_active_lock = threading.Lock()


@contextlib.contextmanager
def verifying():
    """Marks one party's verification in this process. While several run at once (parties
    as threads: the simulator, tests, benchmarks) the kernels run serially - parallel ones
    would oversubscribe the cores and wait at every join; a party alone in its process gets
    the parallel kernels for large work, as in :mod:`mpc3.ringmm`."""
    with _active_lock:
        _active[0] += 1
    try:
        yield
    finally:
        with _active_lock:
            _active[0] -= 1


def _parts(macs: int) -> tuple[bool, int]:
    if macs >= PARALLEL_MIN_MACS and _active[0] <= 1:
        import numba
        return True, 2 * numba.get_num_threads()
    return False, 1


def _i64(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.uint64)
    if not x.flags.writeable:
        x = x.copy()
    return x.view(np.int64)


def pairs(k: int) -> list[tuple[int, int]]:
    """The pairs (i <= i') in the order the Gram kernels return them."""
    return [(i, i2) for i in range(k) for i2 in range(i, k)]


def gram_int(u: np.ndarray, v: np.ndarray, sig: np.ndarray, k: int, us=None,
             vs=None) -> np.ndarray:
    """T[p] = sum_t sig[t] sum_a (u_i v_i' + u_i' v_i)[a, t] (G[i, i] once on the diagonal)
    for Z_2^64 u, v (m, L) in k chunks of n (>= ceil(L / k)) and binary weights sig (n, R)
    (every coefficient 0 or 1: :func:`masks`): (pairs, R). ``us``/``vs``: the rows' values
    where u/v are bits (:func:`rows`)."""
    n, R = sig.shape
    P = k * (k + 1) // 2
    par, parts = _parts(P * n * R)
    out = np.zeros((parts, P, R), dtype=np.int64)
    (u, us), (v, vs) = rows(u, us), rows(v, vs)
    _kernels()["_gram_int_all", par](u, v, us, vs, masks(sig), k, n, out,
                                     gram_block(k, u.shape[0]))
    return out.sum(axis=0, dtype=np.int64).view(np.uint64)


def gram_block(k: int, m: int) -> int:
    """Positions per block of the Z_2^64 Gram sums: the k chunks' block of u and of v (2 k m
    words a position) stay within GRAM_CACHE bytes (a multiple of 4, 4 to BLOCK)."""
    return max(4, min(BLOCK, GRAM_CACHE // (16 * k * m) // 4 * 4))


def masks(sig: np.ndarray) -> np.ndarray:
    """Binary weights (uint64 coefficients, each 0 or 1: sigma drawn from the exceptional
    set of binary polynomials, :mod:`mpc3.dzkp`) as the kernels' masks, 0 or -1 (int64)."""
    if sig.size and int(sig.max()) > 1:
        raise ValueError("the first compression's weights sigma must be binary")
    return (np.uint64(0) - np.ascontiguousarray(sig, dtype=np.uint64)).view(np.int64)


def rows(x: np.ndarray, scale) -> tuple[np.ndarray, np.ndarray]:
    """(data, row values) as the kernels read them: uint64 words (as int64) with ones, or
    uint8 bits with their rows' values ``scale`` (as int64)."""
    if scale is None:
        return _i64(x), np.ones(x.shape[0], dtype=np.int64)
    if x.dtype != np.uint8:
        raise ValueError(f"bit rows must be uint8, not {x.dtype}")
    return np.ascontiguousarray(x), _i64(scale)


def bit_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(bits (m, L) uint8, the rows' values (m,) uint64) if every row of the uint64 rows x
    holds zeros and one value (a boolean circuit's bits, lifted or scaled), else None: one
    compiled pass, stopping at the first row that does not (its first row is tested first,
    before a non-contiguous x is copied)."""
    if x.shape[0] == 0 or x.shape[1] == 0:
        return None
    first = x[0]
    top = first.max()
    if not ((first == 0) | (first == top)).all():
        return None
    x = np.ascontiguousarray(x, dtype=np.uint64)
    bits, tops = np.empty(x.shape, dtype=np.uint8), np.empty(x.shape[0], dtype=np.uint64)
    return (bits, tops) if _kernels()["_bit_rows"](x, bits, tops) else None


def fold_int(x: np.ndarray, k: int, lr: np.ndarray, sig: np.ndarray | None,
             taps: np.ndarray, n: int | None = None, out: np.ndarray | None = None,
             scale: np.ndarray | None = None, coef: tuple | None = None) -> np.ndarray:
    """(sigma_t *) p_(a,t)(r) for Z_2^64 rows x (m, L) in k chunks of n (>= ceil(L / k);
    that unless given): lr (reps, k, D) the Lagrange coefficients at r, sig (reps, n, D)
    binary or None: (reps, m n, D), written into ``out`` if given (uint64; every position
    is written). ``scale``: the rows' values where x is bits (:func:`rows`). ``coef``:
    :func:`_coefficients` of lr, when one fold reads several batches."""
    m, L = x.shape
    reps, _, D = lr.shape
    n = -(-L // k) if n is None else n
    nz = x.any(axis=1)
    par, parts = _parts(int(nz.sum()) * n * reps * D * (k + (D if sig is not None else 0)))
    out = np.empty((reps, m * n, D), dtype=np.uint64) if out is None else out
    if out.shape != (reps, m * n, D) or out.dtype != np.uint64:
        raise ValueError(f"fold_int: out {out.shape} {out.dtype}, want {(reps, m * n, D)}")
    s = np.zeros((0, 1, D), np.int64) if sig is None else _i64(sig)
    x, xs = rows(x, scale)
    lr2, tables = coef or _coefficients(lr)
    bits = x.dtype == np.uint8 and tables is not None     # bit rows: by tables of 8 chunks
    _kernels()["_fold_bits_all" if bits else "_fold_int_all", par](
        x, xs, n, tables if bits else lr2, s, nz, taps, out.view(np.int64), parts)
    return out


_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint64)


def _coefficients(lr: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """lr (reps, k, D) as the folds read it: (k, reps D), and for k a multiple of 8 the
    byte tables of the bit rows' fold, (k / 8, 256, reps D): table g, row b = the sum of the
    coefficients of chunks 8 g + j over the set bits j of b (mod 2^64); else None."""
    reps, k, D = lr.shape
    lr2 = np.ascontiguousarray(_i64(lr).transpose(1, 0, 2)).reshape(-1, reps * D)
    if k % 8:
        return lr2, None
    c = lr2.view(np.uint64).reshape(k // 8, 8, reps * D)
    return lr2, np.stack([_BYTE_BITS @ c[g] for g in range(k // 8)]).view(np.int64)


def fold_batches(batches: list, live: list, ns: list, sigmas: list, lr: np.ndarray,
                 taps: np.ndarray, k: int, extra: int = 0,
                 take=None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fold_int` of the u (weighted by its sigma) and v of every live batch (Claims,
    chunk length n each), side by side: (reps, sum m n + extra, D) each, the ``extra`` tail
    left for the caller to write. Each batch is released (``batches[b] = None``) once
    folded, so claims and folds are not held together; a side some batch holds nothing of
    (None) starts zero, and every other position is written by the folds. ``take(side,
    shape, zero)``: where the two vectors live (:meth:`mpc3.scratch.Scratch.take`);
    default fresh arrays (zero: untouched zero pages)."""
    reps, D = lr.shape[0], lr.shape[2]
    rows = [batches[b].width for b in live]
    total = sum(m * n for m, n in zip(rows, ns)) + extra
    take = take or (lambda side, shape, zero: (np.zeros if zero else np.empty)(
        shape, dtype=np.uint64))
    U, V = (take(side, (reps, total, D), any(getattr(batches[b], side) is None for b in live))
            for side in ("u", "v"))
    at = freed = 0
    coef = _coefficients(lr)                          # once for every batch
    for b, m, n, sigma in zip(live, rows, ns, sigmas):
        c, span = batches[b], slice(at, at + m * n)
        if c.u is not None:
            fold_int(c.u, k, lr, sigma, taps, n=n, out=U[:, span], scale=c.us, coef=coef)
        if c.v is not None:
            fold_int(c.v, k, lr, None, taps, n=n, out=V[:, span], scale=c.vs, coef=coef)
        batches[b] = c = None
        at += m * n
        freed += m * n * k
        if freed >= TRIM_BYTES // 32:          # ~32 bytes a term over the three roles
            procinfo.release_freed()
            freed = 0
    return U, V
