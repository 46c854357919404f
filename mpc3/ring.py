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
  sign, which leaves 64 - 36 - 1 = 27 bits of integer headroom (|x*y| < 2^27)
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
   order i-k-j with a contiguous inner j loop and the k loop unrolled by 4 so
   each output row is loaded/stored once per 4 multiply-adds; a serial variant
   (``nogil``) and a ``parallel=True`` variant (prange over output rows);
3. float64 BLAS on 3 balanced 22-bit limbs (6 limb-pair GEMMs with i+j <= 2,
   stacked along N, every partial dot product an exact integer < 2^53 for
   K <= 2048), converted back and shift-added mod 2^64.

Measured on the 2-core machine (Xeon w/ AVX-512, 2.3 GHz, OpenBLAS 0.3.31;
milliseconds per call, "x3" = wall time per round when 3 threads each call
matmul concurrently, as in the 3-party simulator)::

    shape (B x M x K x N)   numpy-int    numba-ser    numba-par   blas-limbs
                            1x   / x3    1x   / x3    1x   / x3    1x  / x3
    1 x 64 x 512 x 2048     186 / 260    19.7 / 32.6  9.3 / 29.7   25 / 188
    1 x 64 x 2048 x 512     279 / 300    20.7 / 35.1  9.9 / 33.0   37 / 152
    1 x 64 x 512 x 512      30 / 49      3.8 / 6.3    1.9 / 8.0    5.8 / 24
    8 x 512 x 64 x 64       (see benchmark; numba-ser fastest under x3)
    1 x 1 x 512 x 512       0.50 / 1.8   0.07 / 0.38  0.08 / 2.0   3.5 / 19

(the BLAS path is dominated by limb splitting/conversion and collapses when
three threads share two cores, since OpenBLAS oversubscribes; AVX-512 vpmullq
is throughput bound at ~0.4 cycle per 64-bit multiply-add, which is where the
numba kernels sit).  Chosen strategy: numba integer kernels; the parallel
kernel only for large products (>= ``PARALLEL_MIN_MACS`` multiply-adds, where
it wins single-call and ties under 3 concurrent callers), the serial
GIL-free kernel otherwise (wins under concurrency and for small shapes).
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


def _mm_serial(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """C[b] = A[b] @ B[b] (int64, wrapping). A: (nb,M,K), B/C C-contiguous."""
    nb, M, K = A.shape
    N = B.shape[2]
    K4 = K - K % 4
    for t in range(nb * M):
        bi = t // M
        i = t - bi * M
        c = C[bi, i]
        a = A[bi, i]
        b = B[bi]
        for k in range(0, K4, 4):
            a0 = a[k]
            a1 = a[k + 1]
            a2 = a[k + 2]
            a3 = a[k + 3]
            b0 = b[k]
            b1 = b[k + 1]
            b2 = b[k + 2]
            b3 = b[k + 3]
            for j in range(N):
                c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
        for k in range(K4, K):
            a0 = a[k]
            b0 = b[k]
            for j in range(N):
                c[j] += a0 * b0[j]


def _mm_parallel(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:  # pragma: no cover
    """Same as :func:`_mm_serial`, output rows distributed over threads."""
    nb, M, K = A.shape
    N = B.shape[2]
    K4 = K - K % 4
    for t in _prange(nb * M):
        bi = t // M
        i = t - bi * M
        c = C[bi, i]
        a = A[bi, i]
        b = B[bi]
        for k in range(0, K4, 4):
            a0 = a[k]
            a1 = a[k + 1]
            a2 = a[k + 2]
            a3 = a[k + 3]
            b0 = b[k]
            b1 = b[k + 1]
            b2 = b[k + 2]
            b3 = b[k + 3]
            for j in range(N):
                c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
        for k in range(K4, K):
            a0 = a[k]
            b0 = b[k]
            for j in range(N):
                c[j] += a0 * b0[j]


@functools.cache
def _kernels() -> tuple[Callable[..., None], Callable[..., None]]:
    """Import numba and wrap the kernels (compiled on first call, disk-cached)."""
    import numba

    globals()["_prange"] = numba.prange
    serial = numba.njit(cache=True, nogil=True)(_mm_serial)
    parallel = numba.njit(cache=True, nogil=True, parallel=True)(_mm_parallel)
    return serial, parallel


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

    C3 = np.zeros((B3.shape[0] if b2.ndim > 2 else 1, A3.shape[1], N), dtype=np.int64)
    rows = C3.shape[0] * C3.shape[1]
    if rows and N and K:
        serial, parallel = _kernels()
        kernel = parallel if rows > 1 and rows * K * N >= PARALLEL_MIN_MACS else serial
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


def pack_uint(values: np.ndarray, width: int) -> np.ndarray:
    """Pack the low ``width`` bits of each uint64 into ``ceil(n*width/8)`` bytes."""
    _check_width(width)
    vals = np.ascontiguousarray(check_ring(values, "values").reshape(-1), dtype="<u8")
    if width % 8 == 0:  # byte aligned: just drop the high bytes
        return np.ascontiguousarray(vals.view(np.uint8).reshape(-1, 8)[:, : width // 8]).reshape(-1)
    bits = np.unpackbits(vals.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    return np.packbits(bits[:, :width].reshape(-1), bitorder="little")


def unpack_uint(buf: np.ndarray, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_uint`: ``n`` values of ``width`` bits as uint64."""
    _check_width(width)
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    if len(data) * 8 < n * width:
        raise ValueError(f"unpack_uint: buffer too short for {n} x {width} bits")
    out = np.zeros((n, 8), dtype=np.uint8)
    if width % 8 == 0:
        out[:, : width // 8] = data[: n * width // 8].reshape(n, width // 8)
    else:
        bits = np.zeros((n, 64), dtype=np.uint8)
        bits[:, :width] = np.unpackbits(data, count=n * width, bitorder="little").reshape(n, width)
        out = np.packbits(bits, axis=1, bitorder="little")
    return out.reshape(-1).view("<u8").astype(DTYPE, copy=False)
