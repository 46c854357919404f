"""Arithmetic over the ring Z_2^64 used by every mpc3 protocol.

Conventions
-----------
* A ring element is a ``numpy.uint64`` scalar/array; all arithmetic wraps
  mod 2^64 (numpy's native unsigned overflow behaviour).  Functions here never
  silently convert floats or signed integers into ring arrays: use
  :func:`check_ring` at API boundaries, :func:`encode` for reals and
  :func:`from_signed` for int64 data.
* Signed values use two's complement: ``to_signed`` / ``from_signed`` are
  zero-copy views between uint64 and int64 wherever possible.
* Fixed point: a real ``x`` is encoded as ``round(x * 2^f) mod 2^64`` with
  ``f = DEFAULT_FRAC = 18``.  Why 18: in a 64-bit ring the product of two
  encodings carries 2f = 36 fractional bits before truncation; one bit is the
  sign, which leaves 64 - 36 - 1 = 27 bits of integer headroom (|x*y| < 2^27; exact
  truncation needs one more bit: |x*y| < 2^26, ``kernels.arith.product_limit``)
  while the resolution is 2^-18 ~= 3.8e-6.  ``encode`` rejects anything with
  ``|x| * 2^f >= 2^62`` so that sums of a few encodings cannot wrap.
  Rounding is numpy's ``rint`` (round half to even).
* Bit packing (:func:`pack_bits`, :func:`pack_uint`) uses little bit order
  (bit 0 of value 0 is the least significant bit of byte 0); it is used to
  count and send the exact number of wire bytes.

Ring matmul
-----------
:func:`matmul` computes ``(a @ b) mod 2^64`` exactly with ``np.matmul``
shape semantics (2-D, batched/broadcast ``(..., M, K) @ (..., K, N)``, 1-D
vectors).  Three strategies were measured (``benchmarks/ring_matmul.py``):

1. numpy integer matmul (no BLAS for integers; naive loops);
2. numba kernels over int64 (wrapping multiply == multiply mod 2^64), loop
   order i-k-j with a contiguous, AVX-512-vectorised inner j loop; each work
   unit computes two output rows (sharing the loads of B) and unrolls k by 4
   (each output row is loaded/stored once per 4 multiply-adds).  This 2x4
   register blocking was 1.6x faster than plain i-k-j; 4-row and j-blocked
   variants were slower.  A serial (``nogil``) kernel and a ``parallel=True``
   kernel (prange over work units) share the unit code;
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
Kernels are compiled lazily on first use and cached on disk (``cache=True``);
importing this module does not import numba.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

__all__ = [
    "RING_BITS",
    "DTYPE",
    "DEFAULT_FRAC",
    "PARALLEL_MIN_MACS",
    "check_ring",
    "to_signed",
    "from_signed",
    "encode",
    "decode",
    "matmul",
    "pack_bits",
    "unpack_bits",
    "pack_uint",
    "unpack_uint",
    "WidthPlan",
    "width_plan",
    "pack_var",
    "unpack_var",
]

RING_BITS: int = 64
DTYPE: np.dtype = np.dtype(np.uint64)
DEFAULT_FRAC: int = 18
#: Products with at least this many multiply-adds use the multi-threaded kernel.
PARALLEL_MIN_MACS: int = 1 << 25

_ENCODE_LIMIT = float(2**62)


# --------------------------------------------------------------------------- #
# basic conversions
# --------------------------------------------------------------------------- #
def check_ring(x: Any, name: str = "x") -> np.ndarray:
    """Return ``x`` unchanged if it is a uint64 ndarray, else raise TypeError."""
    if isinstance(x, np.ndarray) and x.dtype == DTYPE:
        return x
    got = f"ndarray of dtype {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__
    raise TypeError(f"{name}: expected uint64 ring array, got {got}")


def to_signed(x: np.ndarray) -> np.ndarray:
    """Two's-complement int64 view of a ring array (no copy)."""
    return check_ring(x).view(np.int64)


def from_signed(x: Any) -> np.ndarray:
    """int64 (or other integer) array -> ring array (a view for int64 input)."""
    arr = np.asarray(x)
    if arr.dtype == DTYPE:
        return arr
    if arr.dtype == np.int64:
        return arr.view(DTYPE)
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64).view(DTYPE)
    raise TypeError(f"from_signed: expected integer array, got dtype {arr.dtype}")


def encode(x: Any, frac: int = DEFAULT_FRAC) -> np.ndarray:
    """Encode reals as fixed point: ``round(x * 2^frac) mod 2^64``."""
    scaled = np.rint(np.asarray(x, dtype=np.float64) * float(2**frac))
    if not np.all(np.isfinite(scaled)):
        raise ValueError("encode: NaN or infinite input")
    if scaled.size and np.max(np.abs(scaled)) >= _ENCODE_LIMIT:
        raise ValueError("encode: value out of fixed-point range")
    return scaled.astype(np.int64).view(DTYPE)


def decode(x: np.ndarray, frac: int = DEFAULT_FRAC) -> np.ndarray:
    """Decode fixed point: signed interpretation divided by ``2^frac``."""
    return to_signed(x).astype(np.float64) / float(2**frac)


# --------------------------------------------------------------------------- #
# matmul kernels (pure Python source, compiled lazily by numba)
# --------------------------------------------------------------------------- #
_prange = range  # replaced by numba.prange when the kernels are compiled


def _mm_unit(A: np.ndarray, B: np.ndarray, C: np.ndarray, t: int) -> None:  # pragma: no cover
    """Work unit ``t``: output rows i, i+1 of batch bi (two rows share B loads).

    int64 arithmetic wraps, so this is exact mod 2^64.  Loop order i-k-j with a
    contiguous (vectorised) j loop; k is unrolled by 4 so each output row is
    loaded/stored once per 4 multiply-adds.
    """
    M, K = A.shape[1], A.shape[2]
    N = B.shape[2]
    units = (M + 1) // 2
    bi = t // units
    i = 2 * (t - bi * units)
    b = B[bi]
    a = A[bi, i]
    c = C[bi, i]
    K4 = K - K % 4
    if i + 1 < M:
        e = A[bi, i + 1]
        d = C[bi, i + 1]
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


_mm_unit_jit = _mm_unit  # replaced by the compiled unit kernel


def _mm_serial(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """C[b] += A[b] @ B[b] for int64 (nb, M, K), (nb, K, N), (nb, M, N) C-arrays."""
    for t in range(A.shape[0] * ((A.shape[1] + 1) // 2)):
        _mm_unit_jit(A, B, C, t)


def _mm_parallel(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """Same as :func:`_mm_serial`, work units distributed over threads."""
    for t in _prange(A.shape[0] * ((A.shape[1] + 1) // 2)):
        _mm_unit_jit(A, B, C, t)


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
    return (numba.njit(cache=True, **flags)(func),
            numba.njit(cache=True, nogil=True, **flags)(twin))


@functools.cache
def _kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """Import numba and wrap the kernels (compiled on first call, disk-cached): serial
    holding the GIL, serial releasing it, parallel."""
    import numba

    g = globals()
    g["_prange"] = numba.prange
    g["_mm_unit_jit"] = numba.njit(cache=True, nogil=True)(_mm_unit)
    serial_gil, serial = jit_pair(_mm_serial)
    parallel = numba.njit(cache=True, nogil=True, parallel=True)(_mm_parallel)
    return serial_gil, serial, parallel


def _kernel_arg(x: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Broadcast to ``shape`` and return a C-contiguous, writable int64 view."""
    if shape is not None and x.shape != shape:
        x = np.broadcast_to(x, shape)
    x = np.ascontiguousarray(x)
    if not x.flags.writeable:  # keep a single numba signature (no readonly arrays)
        x = x.copy()
    return x.view(np.int64)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ``(a @ b) mod 2^64`` for uint64 arrays, with ``np.matmul`` shapes."""
    check_ring(a, "a")
    check_ring(b, "b")
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

    C3 = np.zeros((B3.shape[0], A3.shape[1], N), dtype=np.int64)
    rows = C3.shape[0] * C3.shape[1]
    if rows and N and K:
        serial_gil, serial, parallel = _kernels()
        macs = rows * K * N
        kernel = (parallel if rows > 1 and macs >= PARALLEL_MIN_MACS else
                  serial if macs >= NOGIL_MIN_WORK else serial_gil)
        kernel(A3, B3, C3)

    out = C3.view(DTYPE).reshape(*batch, M, N)
    if a_vec:
        out = out[..., 0, :]
    if b_vec:
        out = out[..., 0]
    return out


# --------------------------------------------------------------------------- #
# bit packing
# --------------------------------------------------------------------------- #
def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Pack a flat array of 0/1 values into ``ceil(n/8)`` bytes (little bit order)."""
    flat = np.asarray(bits).reshape(-1)
    if flat.dtype != np.uint8:
        flat = flat.astype(np.uint8)
    return np.packbits(flat, bitorder="little")


def unpack_bits(buf: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: the first ``n`` bits as a uint8 0/1 array."""
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    if len(data) * 8 < n:
        raise ValueError(f"unpack_bits: buffer too short for {n} bits")
    return np.unpackbits(data, count=n, bitorder="little")


def _check_width(width: int) -> None:
    if not 1 <= width <= RING_BITS:
        raise ValueError(f"width must be in 1..{RING_BITS}, got {width}")


def _pack_uint_kernel(vals: np.ndarray, width: int, out: np.ndarray) -> None:  # pragma: no cover
    """OR the low ``width`` bits of vals[i] into ``out`` (zeroed uint8) at bit i*width."""
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1)
    for i in range(vals.size):
        v = vals[i] & mask
        o = i * width
        bi = o >> 3
        s = np.uint64(o & 7)
        lo = v << s
        nb = ((o & 7) + width + 7) >> 3              # bytes touched: 1..9
        for k in range(min(nb, 8)):
            out[bi + k] |= np.uint8((lo >> np.uint64(8 * k)) & np.uint64(0xFF))
        if nb > 8:
            out[bi + 8] |= np.uint8(v >> (np.uint64(64) - s))


def _unpack_uint_kernel(data: np.ndarray, width: int, out: np.ndarray) -> None:  # pragma: no cover
    """out[i] = the ``width`` bits of ``data`` from bit i*width (inverse of the pack kernel)."""
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1)
    for i in range(out.size):
        o = i * width
        bi = o >> 3
        s = np.uint64(o & 7)
        nb = ((o & 7) + width + 7) >> 3
        lo = np.uint64(0)
        for k in range(min(nb, 8)):
            lo |= np.uint64(data[bi + k]) << np.uint64(8 * k)
        v = lo >> s
        if nb > 8:
            v |= np.uint64(data[bi + 8]) << (np.uint64(64) - s)
        out[i] = v & mask


def _pack_var_kernel(vals: np.ndarray, order: np.ndarray, widths: np.ndarray,
                     bitoff: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """OR vals[order[j]] (low widths[j] bits) into ``out`` (zeroed) at bit bitoff[j]."""
    for j in range(order.size):
        width = widths[j]
        v = vals[order[j]] & ((np.uint64(1) << np.uint64(width)) - np.uint64(1))
        o = bitoff[j]
        bi = o >> 3
        s = np.uint64(o & 7)
        lo = v << s
        nb = ((o & 7) + width + 7) >> 3
        for k in range(min(nb, 8)):
            out[bi + k] |= np.uint8((lo >> np.uint64(8 * k)) & np.uint64(0xFF))
        if nb > 8:
            out[bi + 8] |= np.uint8(v >> (np.uint64(64) - s))


def _unpack_var_kernel(data: np.ndarray, order: np.ndarray, widths: np.ndarray,
                       bitoff: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[order[j]] = the widths[j] bits of ``data`` from bit bitoff[j]."""
    for j in range(order.size):
        width = widths[j]
        o = bitoff[j]
        bi = o >> 3
        s = np.uint64(o & 7)
        nb = ((o & 7) + width + 7) >> 3
        lo = np.uint64(0)
        for k in range(min(nb, 8)):
            lo |= np.uint64(data[bi + k]) << np.uint64(8 * k)
        v = lo >> s
        if nb > 8:
            v |= np.uint64(data[bi + 8]) << (np.uint64(64) - s)
        out[order[j]] = v & ((np.uint64(1) << np.uint64(width)) - np.uint64(1))


@functools.cache
def _bit_kernels() -> tuple[tuple[Callable[..., None], ...], ...]:
    """The compiled pack/unpack kernels, each as :func:`jit_pair` (numba imported on first
    use, disk-cached)."""
    return tuple(jit_pair(k) for k in
                 (_pack_uint_kernel, _unpack_uint_kernel, _pack_var_kernel, _unpack_var_kernel))


def _bit_kernel(i: int, n: int) -> Callable[..., None]:
    return _bit_kernels()[i][n >= NOGIL_MIN_WORK]


def pack_uint(values: np.ndarray, width: int) -> np.ndarray:
    """Pack the low ``width`` bits of each uint64 into ``ceil(n*width/8)`` bytes."""
    _check_width(width)
    vals = np.ascontiguousarray(check_ring(values, "values").reshape(-1), dtype="<u8")
    if width % 8 == 0:  # byte aligned: just drop the high bytes
        return np.ascontiguousarray(vals.view(np.uint8).reshape(-1, 8)[:, : width // 8]).reshape(-1)
    out = np.zeros((vals.size * width + 7) // 8, dtype=np.uint8)
    _bit_kernel(0, vals.size)(vals, width, out)
    return out


def unpack_uint(buf: np.ndarray, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_uint`: ``n`` values of ``width`` bits as uint64."""
    _check_width(width)
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    if len(data) * 8 < n * width:
        raise ValueError(f"unpack_uint: buffer too short for {n} x {width} bits")
    if width % 8 == 0:
        out = np.zeros((n, 8), dtype=np.uint8)
        out[:, : width // 8] = data[: n * width // 8].reshape(n, width // 8)
        return out.reshape(-1).view("<u8").astype(DTYPE, copy=False)
    out = np.empty(n, dtype=DTYPE)
    _bit_kernel(1, n)(np.ascontiguousarray(data), width, out)
    return out


class WidthPlan:
    """Wire layout of values with per-element public widths (1..63): the values of each
    distinct width, in increasing width order and element order within a width, form one
    tight bit string (:func:`pack_uint`) starting on a byte boundary."""

    def __init__(self, widths: np.ndarray) -> None:
        widths = np.asarray(widths, dtype=np.int64).reshape(-1)
        if widths.size and not (1 <= widths.min() and widths.max() < RING_BITS):
            raise ValueError(f"widths must be in 1..{RING_BITS - 1}")
        self.n = widths.size
        self.order = np.argsort(widths, kind="stable")
        self.widths = widths[self.order]
        starts = np.flatnonzero(np.diff(self.widths, prepend=-1)) if self.n else self.order
        counts = np.diff(np.append(starts, self.n))
        run_bytes = (counts * self.widths[starts] + 7) // 8
        run_bit0 = 8 * (np.cumsum(run_bytes) - run_bytes)         # first bit of each run
        rank = np.arange(self.n) - np.repeat(starts, counts)        # position in its run
        self.bitoff = np.repeat(run_bit0, counts) + rank * self.widths
        self.nbytes = int(run_bytes.sum())


@functools.lru_cache(maxsize=256)
def _width_plan(key: bytes) -> WidthPlan:
    return WidthPlan(np.frombuffer(key, dtype=np.int64))


def width_plan(widths: np.ndarray) -> WidthPlan:
    """The (cached) :class:`WidthPlan` of an int array of widths."""
    return _width_plan(np.ascontiguousarray(widths, dtype=np.int64).tobytes())


def pack_var(values: np.ndarray, plan: WidthPlan) -> np.ndarray:
    """Pack ``values`` (uint64, plan.n of them) by a :class:`WidthPlan`."""
    vals = np.ascontiguousarray(check_ring(values, "values").reshape(-1))
    if vals.size != plan.n:
        raise ValueError(f"pack_var: {vals.size} values for a plan of {plan.n}")
    out = np.zeros(plan.nbytes, dtype=np.uint8)
    _bit_kernel(2, plan.n)(vals, plan.order, plan.widths, plan.bitoff, out)
    return out


def unpack_var(buf: np.ndarray, plan: WidthPlan) -> np.ndarray:
    """Inverse of :func:`pack_var`."""
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    if len(data) < plan.nbytes:
        raise ValueError(f"unpack_var: buffer too short for {plan.nbytes} bytes")
    out = np.empty(plan.n, dtype=DTYPE)
    _bit_kernel(3, plan.n)(np.ascontiguousarray(data), plan.order, plan.widths, plan.bitoff, out)
    return out
