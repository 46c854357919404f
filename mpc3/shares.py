"""Replicated secret shares held by one party.

Party ``i`` of a 2-out-of-3 replicated sharing of ``x = x_0 + x_1 + x_2 (mod 2^64)`` holds
the pair ``(a, b) = (x_i, x_{i+1})``; slot ``j`` is therefore held by parties ``j`` and
``j-1``. :class:`AShare` is the arithmetic sharing over Z_2^64. :class:`BShare` is the same
over GF(2), bit-sliced: ``a`` and ``b`` are ``(planes, words)`` uint64 arrays where bit ``e``
of word ``w`` of plane ``p`` is bit ``p`` of element ``64*w + e``; boolean circuits run as
vectorised bitwise operations over whole planes.

Linear operations are local and live here as operators; everything that needs
communication or the party's rank (adding a public constant) lives in ``mpc3.kernels``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import ring


@dataclass
class AShare:
    a: np.ndarray
    b: np.ndarray

    def __post_init__(self) -> None:
        ring.check_ring(self.a, "AShare.a")
        ring.check_ring(self.b, "AShare.b")
        if self.a.shape != self.b.shape:
            raise ValueError(f"AShare halves differ in shape: {self.a.shape} vs {self.b.shape}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    @property
    def size(self) -> int:
        return self.a.size

    def _other(self, other: "AShare") -> "AShare":
        if not isinstance(other, AShare):
            raise TypeError(f"expected AShare, got {type(other).__name__}")
        return other

    def __add__(self, other: "AShare") -> "AShare":
        o = self._other(other)
        return AShare(self.a + o.a, self.b + o.b)

    def __sub__(self, other: "AShare") -> "AShare":
        o = self._other(other)
        return AShare(self.a - o.a, self.b - o.b)

    def __neg__(self) -> "AShare":
        return AShare(-self.a, -self.b)

    def scale(self, c) -> "AShare":
        """Multiply by a public integer (array broadcastable, taken mod 2^64); no truncation."""
        c = np.asarray(c).astype(np.uint64) if np.asarray(c).dtype != np.uint64 else np.asarray(c)
        return AShare(self.a * c, self.b * c)

    def reshape(self, *shape) -> "AShare":
        return AShare(self.a.reshape(*shape), self.b.reshape(*shape))

    def __getitem__(self, idx) -> "AShare":
        return AShare(self.a[idx], self.b[idx])

    @property
    def T(self) -> "AShare":
        return AShare(np.swapaxes(self.a, -1, -2), np.swapaxes(self.b, -1, -2))

    def transpose(self, *axes) -> "AShare":
        return AShare(self.a.transpose(*axes), self.b.transpose(*axes))

    def copy(self) -> "AShare":
        return AShare(self.a.copy(), self.b.copy())

    @staticmethod
    def concat(parts: list["AShare"], axis: int = 0) -> "AShare":
        return AShare(np.concatenate([p.a for p in parts], axis),
                      np.concatenate([p.b for p in parts], axis))


class SplitShare:
    """A sharing stopped at the truncation's split form (made by
    :func:`mpc3.kernels.arith.mul_split_aa`): in element group g (:func:`group_sizes` of
    its size; roles rotate with g) role 0 holds A = a + b, roles 1 and 2 hold B (role 1 as
    ``b``, role 2 as ``a``), value = A + B; the other slots are not a replicated sharing.
    Valid uses only: adding replicated shares elementwise (``+``, which keeps A and B right),
    reshaping, and :func:`mpc3.kernels.convert.relu_a` of the whole array, which reads no
    other slot."""

    def __init__(self, a: np.ndarray, b: np.ndarray) -> None:
        self.a, self.b = a, b

    shape = property(lambda self: self.a.shape)
    size = property(lambda self: self.a.size)

    def reshape(self, *shape) -> "SplitShare":
        return SplitShare(self.a.reshape(*shape), self.b.reshape(*shape))

    def __add__(self, other: AShare) -> "SplitShare":
        if not isinstance(other, AShare):
            raise TypeError(f"SplitShare + {type(other).__name__}: only replicated shares add")
        return SplitShare(self.a + other.a, self.b + other.b)


class SignedSplit(SplitShare):
    """A :class:`SplitShare` whose DReLU was started in the products' own rounds
    (:func:`mpc3.kernels.arith.mul_split_aa`): ``bits`` are the masked sign bits
    (``mpc3.kernels.bitplanes.MaskedBits``) of the flat values, biases included, so
    :func:`mpc3.kernels.convert.relu_a` only injects - or, past ROUND_LEAN_ELEMENTS, the
    DReLU's leaves ``(BShare, N)`` (:mod:`mpc3.kernels.leaves`), so it runs the carry tree
    first. Reshaping keeps them; adding anything would make them stale and is refused
    (pass biases to mul_split_aa)."""

    def __init__(self, a: np.ndarray, b: np.ndarray, bits) -> None:
        super().__init__(a, b)
        self.bits = bits

    def reshape(self, *shape) -> "SignedSplit":
        return SignedSplit(self.a.reshape(*shape), self.b.reshape(*shape), self.bits)

    def __add__(self, other):
        raise TypeError("SignedSplit + ...: its sign bits were taken before the addition; "
                        "pass biases to mul_split_aa")


@dataclass
class BShare:
    """Bit-sliced replicated boolean sharing of ``n`` elements with ``planes`` bits each.

    Layout ("grouped planes"): elements are split into the three role groups of
    :func:`group_sizes`; group ``g`` occupies ``ceil(n_g / 64)`` consecutive words of every
    plane, so role-rotated protocols can address a group without moving bits.
    """

    a: np.ndarray
    b: np.ndarray
    n: int

    def __post_init__(self) -> None:
        for h in (self.a, self.b):
            if not (isinstance(h, np.ndarray) and h.dtype == np.uint64 and h.ndim == 2):
                raise TypeError("BShare halves must be 2-D uint64 (planes, words) arrays")
        if self.a.shape != self.b.shape:
            raise ValueError("BShare halves differ in shape")
        if self.a.shape[1] != grouped_words(self.n):
            raise ValueError(f"{self.a.shape[1]} words do not match {self.n} elements")

    @property
    def planes(self) -> int:
        return self.a.shape[0]

    @property
    def sizes(self) -> list[int]:
        return group_sizes(self.n)

    def __xor__(self, other: "BShare") -> "BShare":
        return BShare(self.a ^ other.a, self.b ^ other.b, self.n)

    def __getitem__(self, idx) -> "BShare":
        """Planes ``idx`` (an int keeps one plane); ints and slices give views."""
        if isinstance(idx, (int, np.integer)):
            i = range(self.planes)[idx]                      # IndexError like numpy
            return BShare(self.a[i:i + 1], self.b[i:i + 1], self.n)
        if isinstance(idx, slice):
            return BShare(self.a[idx], self.b[idx], self.n)
        sel = np.atleast_1d(np.arange(self.planes)[idx])
        return BShare(self.a[sel], self.b[sel], self.n)

    @staticmethod
    def stack(parts: list["BShare"]) -> "BShare":
        return BShare(np.concatenate([p.a for p in parts]), np.concatenate([p.b for p in parts]),
                      parts[0].n)


def group_sizes(n: int) -> list[int]:
    """Sizes of the three element groups led by parties 0, 1, 2."""
    return list(_group_sizes(n))


@functools.lru_cache(maxsize=4096)
def _group_sizes(n: int) -> tuple[int, int, int]:
    return tuple(n // 3 + (1 if g < n % 3 else 0) for g in range(3))


def words(n: int) -> int:
    return (n + 63) // 64


@functools.lru_cache(maxsize=4096)
def grouped_words(n: int) -> int:
    return sum(words(m) for m in _group_sizes(n))


def bits_to_planes(bits: np.ndarray) -> np.ndarray:
    """(planes, n) array of 0/1 -> (planes, grouped_words(n)) uint64 planes."""
    bits = np.atleast_2d(np.asarray(bits, dtype=np.uint8))
    nplanes, n = bits.shape
    out, start = [], 0
    for m in group_sizes(n):
        padded = np.zeros((nplanes, words(m) * 64), dtype=np.uint8)
        padded[:, :m] = bits[:, start:start + m]
        out.append(np.packbits(padded, axis=1, bitorder="little").view(np.uint64))
        start += m
    return np.ascontiguousarray(np.concatenate(out, axis=1))


def planes_to_bits(planes: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`bits_to_planes`: -> (planes, n) uint8 0/1."""
    out, start = [], 0
    for m in group_sizes(n):
        w = words(m)
        chunk = np.ascontiguousarray(planes[:, start:start + w]).view(np.uint8)
        out.append(np.unpackbits(chunk, axis=1, bitorder="little")[:, :m])
        start += w
    return np.concatenate(out, axis=1)
