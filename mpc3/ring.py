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
:func:`matmul` computes ``(a @ b) mod 2^64`` exactly with ``np.matmul`` shape semantics
(2-D, batched/broadcast ``(..., M, K) @ (..., K, N)``, 1-D vectors); its numba kernels,
their measurements and the choice among them are in :mod:`mpc3.ringmm`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from .ringmm import NOGIL_MIN_WORK, PARALLEL_MIN_MACS, jit_pair, once, ring_matmul

__all__ = [
    "RING_BITS",
    "DTYPE",
    "DEFAULT_FRAC",
    "PARALLEL_MIN_MACS",
    "NOGIL_MIN_WORK",
    "jit_pair",
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
    "NonCanonical",
    "check_padding",
]

RING_BITS: int = 64
DTYPE: np.dtype = np.dtype(np.uint64)
DEFAULT_FRAC: int = 18

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


def narrow(x: np.ndarray, bits: int) -> np.ndarray:
    """Plaintext ring values with ``bits`` more fractional bits -> rounded to the nearest
    (ties up) at the lower scale; exact for a value reconstructed by its owner."""
    if bits <= 0:
        return check_ring(x)
    v = to_signed(x)
    return ((v >> bits) + ((v >> (bits - 1)) & 1)).view(DTYPE)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
           like: int | None = None) -> np.ndarray:
    """Exact ``(a @ b) mod 2^64`` for uint64 arrays, with ``np.matmul`` shapes; ``out``: add
    the product into this C-contiguous uint64 array of the result's shape (returned);
    ``like``: the inner dimension of the product this one is a block of (its kernel choice)."""
    return ring_matmul(check_ring(a, "a"), check_ring(b, "b"), out, like)


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


class NonCanonical(ValueError):
    """A packed buffer is not what :func:`pack_uint` / :func:`pack_var` (or the boolean
    planes' packing) makes of any values: wrong length, or padding bits (past the packed
    bits of the buffer or of a width run, in its last byte) that are not zero."""


def check_padding(last: np.ndarray, used_bits) -> None:
    """Refuse set bits above the low ``used_bits`` (mod 8; 0 means all 8) of the bytes
    ``last``: the padding of packed bit strings, which honest packing leaves zero."""
    used = np.asarray(used_bits, dtype=np.int64) % 8
    pad = np.where(used == 0, 0, (0xFF << used) & 0xFF).astype(np.uint8)
    if (np.asarray(last, dtype=np.uint8) & pad).any():
        raise NonCanonical("non-zero padding bits")


def _check_width(width: int) -> None:
    if not 1 <= width <= RING_BITS:
        raise ValueError(f"width must be in 1..{RING_BITS}, got {width}")


def _pack_uint_kernel(vals: np.ndarray, width: int, out: np.ndarray) -> None:  # pragma: no cover
    """OR the low ``width`` bits of vals[i] into ``out`` (zeroed little-endian uint64 words)
    at bit i*width: one or two word updates per value."""
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1) if width < 64 else ~np.uint64(0)
    for i in range(vals.size):
        v = vals[i] & mask
        o = i * width
        wi = o >> 6
        s = o & 63
        out[wi] |= v << np.uint64(s)
        if s + width > 64:
            out[wi + 1] |= v >> np.uint64(64 - s)


def _unpack_uint_kernel(data: np.ndarray, width: int, out: np.ndarray) -> None:  # pragma: no cover
    """out[i] = the ``width`` bits of ``data`` (little-endian uint64 words) from bit i*width
    (inverse of the pack kernel)."""
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1) if width < 64 else ~np.uint64(0)
    for i in range(out.size):
        o = i * width
        wi = o >> 6
        s = o & 63
        v = data[wi] >> np.uint64(s)
        if s + width > 64:
            v |= data[wi + 1] << np.uint64(64 - s)
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


@once
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
    nbytes = (vals.size * width + 7) // 8
    out = np.zeros(-(-nbytes // 8), dtype="<u8")
    _bit_kernel(0, vals.size)(vals, width, out)
    return out.view(np.uint8)[:nbytes]


def unpack_uint(buf: np.ndarray, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_uint`: ``n`` values of ``width`` bits as uint64."""
    _check_width(width)
    data = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray)) else buf
    nbytes = (n * width + 7) // 8
    if len(data) != nbytes:
        raise NonCanonical(f"{len(data)} bytes for {n} values of {width} bits "
                           f"({nbytes} bytes)")
    if width % 8 == 0:
        out = np.zeros((n, 8), dtype=np.uint8)
        out[:, : width // 8] = data[: n * width // 8].reshape(n, width // 8)
        return out.reshape(-1).view("<u8").astype(DTYPE, copy=False)
    if nbytes:
        check_padding(data[-1:], n * width)
    words = np.zeros(-(-nbytes // 8), dtype="<u8")
    words.view(np.uint8)[:nbytes] = data
    out = np.empty(n, dtype=DTYPE)
    _bit_kernel(1, n)(words, width, out)
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
        self.run_last = np.cumsum(run_bytes) - 1                    # each run's last byte
        self.run_bits = counts * self.widths[starts]               # and its packed bits


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
    if len(data) != plan.nbytes:
        raise NonCanonical(f"{len(data)} bytes for a width plan of {plan.nbytes}")
    if plan.n:
        check_padding(data[plan.run_last], plan.run_bits)
    out = np.empty(plan.n, dtype=DTYPE)
    _bit_kernel(3, plan.n)(np.ascontiguousarray(data), plan.order, plan.widths, plan.bitoff, out)
    return out
