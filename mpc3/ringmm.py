"""Exact matrix products over Z_2^64: the numba kernels behind :func:`mpc3.ring.matmul`.

:func:`ring_matmul` (``mpc3.ring.matmul`` checks its operands and calls it) computes
``(a @ b) mod 2^64`` exactly with ``np.matmul`` shape semantics (2-D, batched/broadcast
``(..., M, K) @ (..., K, N)``, 1-D vectors).  Three strategies were measured (``benchmarks/ring_matmul.py``):

1. numpy integer matmul (no BLAS for integers; naive loops);
2. numba kernels over int64 (wrapping multiply == multiply mod 2^64), loop
   order i-k-j with a contiguous, AVX-512-vectorised inner j loop; each work
   unit computes two output rows (sharing the loads of B) and unrolls k by 4
   (each output row is loaded/stored once per 4 multiply-adds).  This 2x4
   register blocking was 1.6x faster than plain i-k-j; 4-row and j-blocked
   variants were slower there (but see column tiles below, for a wide B).  A serial
   (``nogil``) kernel and a ``parallel=True`` kernel (prange over work units) share
   the unit code;
3. float64 BLAS on 3 balanced 22-bit limbs (6 limb-pair GEMMs with i+j <= 2,
   stacked along N, every partial dot product an exact integer < 2^53 for
   K <= 2048, K chunked beyond), converted back and shift-added mod 2^64.

Measured on the 2-core machine (Xeon, AVX-512 incl. DQ, 2.3 GHz, OpenBLAS
0.3.31), milliseconds, "x3" = wall time of a round in which 3 threads each
call concurrently (the 3-party simulator).  Quiet machine, first prototype
(plain i-k-j numba kernels, 2-D BLAS limbs)::

    M x K x N          numpy-int   numba-ser   numba-par   blas-limbs
                       1x  / x3    1x  / x3    1x  / x3    1x  / x3
    64 x 512 x 2048    186 / 260   20.7 / 34.5 10.2 / 34.3  25 / 188
    64 x 2048 x 512    279 / 300   20.7 / 35.1 11.1 / 33.3  37 / 152
    64 x 512 x 512      30 / 49     4.3 / 8.8   2.1 / 8.4  5.8 / 24
    512 x 64 x 64      1.0 / 3.4   0.49 / 1.1  0.26 / 1.8  0.8 / 3.5
    1 x 512 x 512     0.50 / 1.8   0.07 / 0.38 0.08 / 2.0  3.5 / 19

Final kernels, ``python benchmarks/ring_matmul.py --reps 7`` (best of 7;
NOTE: run while other jobs kept the load average at 3-5, so the x3 column
and the parallel kernel are pessimistic/noisy)::

    B x M x K x N       numpy-int    numba-ser    numba-par    blas-limbs
    1 x 64 x 512 x 2048  160 / 454   12.1 / 39.1  11.3 / 32.8   135 / 334
    1 x 64 x 2048 x 512  274 / 705   12.5 / 37.5  15.3 / 34.6   114 / 314
    1 x 64 x 512 x 512    36 / 87     3.2 / 10.9   2.7 / 7.7     80 / 46
    8 x 512 x 64 x 64    7.9 / 24.6   3.2 / 12.2   3.2 / 14.2   206 / 712
    1 x 1 x 512 x 512   0.77 / 2.8   0.07 / 8.2*  0.08 / 1.0    21 / 72
    (* scheduler noise; 0.4 ms on the quiet machine)

The BLAS path loses: limb splitting/conversion costs as much as the GEMMs and
OpenBLAS's own threads oversubscribe the 2 cores when 3 parties call at once
(and when anything else runs).  The int64 kernels are bound by vpmullq
throughput (serial: ~0.4 cycle per 64-bit multiply-add).  Chosen strategy:
numba integer kernels; the parallel kernel only for products with at least
``PARALLEL_MIN_MACS`` = 2^25 multiply-adds (large: it wins single-call and
ties under 3 concurrent callers), the serial GIL-free kernel otherwise (it
wins under 3 concurrent callers, and for small shapes thread launch dominates).

Column tiles (2026-11-24, AMD EPYC, 2 MiB L2 per core, 32 MiB L3 shared): a work unit
streams all of B once per two rows of A, so a B larger than the caches is read from memory
M/2 times - the encoder's folded feature projection (64 x 512 @ 512 x 4256, 17 MB per
share) ran slower per multiply-add than the 8 MB products (the serial kernel in the day's
first ``benchmarks/ring_matmul.py --reps 5`` run: 9.0 G multiply-adds/s for 64 x 512 x 4768,
12.1 for 64 x 512 x 2048). When several rows meet a large B
(:func:`_tiled`: 4 MiB at K <= 1024, 12 MiB at any K) the kernels instead copy a
K x TILE_COLS column tile of B (512 KB at K = 512: it stays in L2; 3 MB at K = 3072, still
read from L3 instead of memory) and run every row pair over it; the parallel kernel
distributes tiles.
``python benchmarks/ring_matmul.py --reps 5`` (2026-11-24 21:21 UTC; x3 = three concurrent
callers, each on its own operands, like three in-process parties), ms 1x / x3, by row pairs ->
by column tiles::

    64 x 512 x 4768    serial 21.5 / 53.8 -> 10.8 / 18.9   parallel 12.3 / 53.8 -> 7.5 / 18.1
    128 x 3072 x 768   serial 45.4 / 108  -> 23.1 / 49.4   parallel 19.8 / 95.9 -> 12.1 / 48.4

(an earlier run, 64 x 512 x 4768: parallel 10.1 / 41.2 -> 5.3 / 23.0). For the 8 MB shapes
this benchmark shows no difference either way, but the in-process encoder was slower in two
of three interleaved pairs with its 512 x 2048 FFN product untiled (1.111 / 1.201 / 1.194 s
against 1.146 / 1.053 / 1.052, `mpc3 bench layer encoder --repeat 3`), so K <= 1024 tiles
from 4 MiB; with K = 2048 at 8 MB (the FFN's W2) a scratch sweep was mixed, so larger K waits for
12 MiB.

Kernels are compiled lazily on first use and cached on disk (``cache=True``);
importing this module does not import numba. It imports nothing else from mpc3
(:mod:`mpc3.ring` re-exports what the other modules use).
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable

import numpy as np

#: Products with at least this many multiply-adds use the multi-threaded kernel.
PARALLEL_MIN_MACS: int = 1 << 25
#: Column tiles (see the module docstring): width; smallest B (bytes) for K <= TILE_MAX_K;
#: smallest B for any K.
TILE_COLS: int = 128
TILE_MAX_K: int = 1024
TILE_MIN_BYTES: int = 4 << 20
TILE_ANY_K_BYTES: int = 12 << 20


# kernels: pure Python source, compiled lazily by numba
_prange = range  # replaced by numba.prange when the kernels are compiled


def _rows(a: np.ndarray, e: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray,
          two: bool) -> None:  # pragma: no cover
    """c += a @ b and, if ``two``, d += e @ b: rows a, e (K,) of A, a C-contiguous B (K, N),
    output rows c, d (N,) (two rows share the loads of B).

    int64 arithmetic wraps, so this is exact mod 2^64.  Loop order i-k-j with a
    contiguous (vectorised) j loop; k is unrolled by 4 so each output row is
    loaded/stored once per 4 multiply-adds.
    """
    K, N = b.shape
    K4 = K - K % 4
    if two:
        for k in range(0, K4, 4):
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            e0, e1, e2, e3 = e[k], e[k + 1], e[k + 2], e[k + 3]
            b0, b1, b2, b3 = b[k], b[k + 1], b[k + 2], b[k + 3]
            for j in range(N):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                c[j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                d[j] += e0 * x0 + e1 * x1 + e2 * x2 + e3 * x3
        for k in range(K4, K):
            a0, e0, b0 = a[k], e[k], b[k]
            for j in range(N):
                c[j] += a0 * b0[j]
                d[j] += e0 * b0[j]
    else:
        for k in range(0, K4, 4):
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            b0, b1, b2, b3 = b[k], b[k + 1], b[k + 2], b[k + 3]
            for j in range(N):
                c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
        for k in range(K4, K):
            a0, b0 = a[k], b[k]
            for j in range(N):
                c[j] += a0 * b0[j]


_rows_jit = _rows  # replaced by the compiled row kernel


def _row_pairs(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:  # pragma: no cover
    """c += a @ b for C-contiguous 2-D arrays, two rows at a time."""
    M = a.shape[0]
    for i in range(0, M, 2):
        j = i + 1 if i + 1 < M else i
        _rows_jit(a[i], a[j], b, c[i], c[j], j != i)


def _mm_unit(A: np.ndarray, B: np.ndarray, C: np.ndarray, t: int) -> None:  # pragma: no cover
    """Work unit ``t``: output rows i, i+1 of batch bi."""
    M = A.shape[1]
    units = (M + 1) // 2
    bi = t // units
    i = 2 * (t - bi * units)
    j = i + 1 if i + 1 < M else i
    _rows_jit(A[bi, i], A[bi, j], B[bi], C[bi, i], C[bi, j], j != i)


def _mm_tile(A: np.ndarray, B: np.ndarray, C: np.ndarray, t: int,
             width: int) -> None:  # pragma: no cover
    """Work unit ``t``: column tile (batch bi, columns j0:j0+width) for every row of A,
    over a contiguous copy of B's tile and a zeroed output tile."""
    M, N = A.shape[1], B.shape[2]
    tiles = (N + width - 1) // width
    bi = t // tiles
    j0 = (t - bi * tiles) * width
    j1 = min(N, j0 + width)
    ct = np.zeros((M, j1 - j0), dtype=np.int64)
    _row_pairs_jit(A[bi], np.ascontiguousarray(B[bi, :, j0:j1]), ct)
    C[bi, :, j0:j1] += ct


_row_pairs_jit = _row_pairs  # replaced by the compiled kernels
_mm_unit_jit = _mm_unit
_mm_tile_jit = _mm_tile


def _mm_serial(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """C[b] += A[b] @ B[b] for int64 (nb, M, K), (nb, K, N), (nb, M, N) C-arrays."""
    for t in range(A.shape[0] * ((A.shape[1] + 1) // 2)):
        _mm_unit_jit(A, B, C, t)


def _mm_parallel(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """Same as :func:`_mm_serial`, work units distributed over threads."""
    for t in _prange(A.shape[0] * ((A.shape[1] + 1) // 2)):
        _mm_unit_jit(A, B, C, t)


def _mm_tiled_serial(A: np.ndarray, B: np.ndarray, C: np.ndarray,
                     width: int) -> None:  # pragma: no cover
    """Same as :func:`_mm_serial` by column tiles of B."""
    for t in range(A.shape[0] * ((B.shape[2] + width - 1) // width)):
        _mm_tile_jit(A, B, C, t, width)


def _mm_tiled_parallel(A: np.ndarray, B: np.ndarray, C: np.ndarray,
                       width: int) -> None:  # pragma: no cover
    """Same as :func:`_mm_tiled_serial`, tiles distributed over threads."""
    for t in _prange(A.shape[0] * ((B.shape[2] + width - 1) // width)):
        _mm_tile_jit(A, B, C, t, width)


#: Compiled kernels release the GIL only for calls of at least this much work (multiply-adds,
#: elements): a short call that releases it hands the GIL to another party thread of the
#: same process and then waits for it to come back (in-process parties, the GIL's convoy
#: effect), which costs more than the call; a long one should let the others run meanwhile.
NOGIL_MIN_WORK: int = 1 << 15


def jit_pair(func: Callable[..., None], **flags) -> tuple[Callable[..., None], ...]:
    """(GIL-holding, GIL-releasing) numba compilations of ``func`` (disk-cached under two
    names: numba's cache key ignores the nogil flag)."""
    import types

    import numba

    twin = types.FunctionType(func.__code__, func.__globals__, func.__name__ + "_nogil",
                              func.__defaults__, func.__closure__)
    twin.__qualname__ = func.__qualname__ + "_nogil"
    return twins(numba.njit(cache=True, **flags)(func),
                 numba.njit(cache=True, nogil=True, **flags)(twin))


def once(build: Callable[[], Any]) -> Callable[[], Any]:
    """``functools.cache`` for a module's kernel builder (no arguments), safe when the three
    party threads of one process make the first call together: one builds, the others wait
    and share it (with functools.cache each built, compiled and registered its own set)."""
    lock, built = threading.Lock(), []

    @functools.wraps(build)
    def get():
        if not built:
            with lock:
                if not built:
                    built.append(build())
        return built[0]
    return get


#: groups of compilations of one function (GIL-holding / GIL-free / parallel) that take the
#: same arguments and are chosen by the work's size (:func:`twins`)
_TWINS: list[tuple] = []


def twins(*dispatchers):
    """Register compilations of one function chosen by size: a party's small warm-up
    (:mod:`mpc3.warmup`) reaches one of them, :func:`compile_twins` builds the others for the
    same argument types, so a large job compiles nothing. Returns ``dispatchers``."""
    _TWINS.append(dispatchers)
    return dispatchers


def compile_twins() -> int:
    """Compile (or load from numba's cache) every registered twin for every signature another
    member of its group has, groups in registration order (a form in two groups passes what
    the first gave it on to the second); the number of signatures added."""
    added = 0
    for group in _TWINS:
        if not all(hasattr(d, "compile") for d in group):   # NUMBA_DISABLE_JIT: Python
            continue
        sigs = {sig for d in group for sig in d.signatures}
        for d in group:
            for sig in sigs - set(d.signatures):
                d.compile(sig)
                added += 1
    return added


@once
def _kernels() -> tuple[Callable[..., None], ...]:
    """Import numba and wrap the kernels (compiled on first call, disk-cached): serial
    holding the GIL, serial releasing it, parallel; tiled serial, tiled parallel."""
    import numba

    g = globals()
    g["_prange"] = numba.prange
    for name in ("_rows", "_row_pairs", "_mm_unit", "_mm_tile"):
        g[name + "_jit"] = numba.njit(cache=True, nogil=True)(g[name])
    serial_gil, serial = jit_pair(_mm_serial)
    par = functools.partial(numba.njit, cache=True, nogil=True, parallel=True)
    parallel = par()(_mm_parallel)
    twins(serial, parallel)                   # jit_pair registered (serial_gil, serial)
    return (serial_gil, serial, parallel,
            *twins(numba.njit(cache=True, nogil=True)(_mm_tiled_serial),
                   par()(_mm_tiled_parallel)))


def warm_up() -> None:
    """Each matmul kernel's group once on tiny C-contiguous int64 operands, the only types
    :func:`ring_matmul` passes (the tiled ones are reached only by large products)."""
    a, b = np.ones((1, 2, 3), np.int64), np.ones((1, 3, 4), np.int64)
    k = _kernels()
    k[0](a, b, np.zeros((1, 2, 4), np.int64))
    k[3](a, b, np.zeros((1, 2, 4), np.int64), TILE_COLS)


def _tiled(rows: int, K: int, N: int) -> bool:
    """Column tiles pay when several rows meet a B too large for the caches (module
    docstring)."""
    size = 8 * K * N
    return rows >= 8 and N >= 4 * TILE_COLS and (
        size >= TILE_ANY_K_BYTES or (K <= TILE_MAX_K and size >= TILE_MIN_BYTES))


def _kernel_arg(x: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Broadcast to ``shape`` and return a C-contiguous, writable int64 view."""
    if shape is not None and x.shape != shape:
        x = np.broadcast_to(x, shape)
    x = np.ascontiguousarray(x)
    if not x.flags.writeable:  # keep a single numba signature (no readonly arrays)
        x = x.copy()
    return x.view(np.int64)


def ring_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
                like: int | None = None) -> np.ndarray:
    """Exact ``(a @ b) mod 2^64`` for uint64 arrays (checked by the caller), with
    ``np.matmul`` shapes; ``out`` (C-contiguous uint64 of the result's shape): add the product
    into it instead (returned). ``like``: the inner dimension of a larger product this one is
    a block of - the kernel (tiles, threads) is chosen as for that product."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must be at least 1-D")
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if a_vec else a
    b2 = b[:, None] if b_vec else b
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shape mismatch {a.shape} @ {b.shape}")

    if b2.ndim == 2:
        # Shared right operand: fold the batch of ``a`` into its rows.
        batch = a2.shape[:-2]
        A3 = _kernel_arg(a2.reshape(1, math.prod(batch) * M, K))
        B3 = _kernel_arg(b2)[None]
    else:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        nb = math.prod(batch)
        A3 = _kernel_arg(a2, (*batch, M, K)).reshape(nb, M, K)
        B3 = _kernel_arg(b2, (*batch, K, N)).reshape(nb, K, N)

    if out is None:
        C3 = np.zeros((B3.shape[0], A3.shape[1], N), dtype=np.int64)
    else:
        shape = (*batch, *(() if a_vec else (M,)), *(() if b_vec else (N,)))
        C3 = _out_arg(out, shape, (B3.shape[0], A3.shape[1], N))
    rows = C3.shape[0] * C3.shape[1]
    if rows and N and K:
        serial_gil, serial, parallel, tiled, tiled_parallel = _kernels()
        macs = rows * (like or K) * N
        big = rows > 1 and macs >= PARALLEL_MIN_MACS
        if _tiled(A3.shape[1], like or K, N):
            (tiled_parallel if big else tiled)(A3, B3, C3, TILE_COLS)
        else:
            (parallel if big else serial if macs >= NOGIL_MIN_WORK else serial_gil)(A3, B3, C3)

    if out is not None:
        return out
    res = C3.view(np.uint64).reshape(*batch, M, N)
    if a_vec:
        res = res[..., 0, :]
    if b_vec:
        res = res[..., 0]
    return res


def _out_arg(out: np.ndarray, shape: tuple[int, ...], kernel: tuple[int, int, int]
             ) -> np.ndarray:
    """``out`` (the result's ``shape``) as the kernels' int64 ``kernel`` accumulator (a view:
    no copy)."""
    if out.dtype != np.uint64 or out.shape != shape or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise ValueError(f"matmul: out must be a writable C-contiguous uint64 array of shape "
                         f"{shape}")
    return out.view(np.int64).reshape(kernel)
