"""The Galois ring GR(2^64, D) = Z_2^64[X] / (f(X)): where verification of Z_2^64 products lives.

Why a ring extension. A check "sum_j rho_j e_j = 0" with random rho_j in Z_2^64 misses an
error e_j = 2^63 with probability 1/2 (every even rho_j kills it): Z_2^64 has zero divisors,
so Schwartz-Zippel fails there. In GR(2^64, D) the *exceptional set* - the 2^D elements
whose coefficients are 0 or 1 - has pairwise differences that are units (their reductions
mod 2 are distinct elements of the field GF(2^D)). A non-zero polynomial of degree d over
the ring has at most d roots in that set, so a random exceptional point catches a false
claim with probability >= 1 - d / 2^D, and a random exceptional combination of errors in
Z_2^64 vanishes with probability <= 1 / 2^D (reduce mod 2^(t+1), t the lowest error
valuation: the combination becomes a non-trivial GF(2^D) combination of 0/1 values).
Abspoel, Cramer, Damgard, Escudero, Yuan (TCC 2019) and Boyle, Gilboa, Ishai, Nof (CCS 2019,
"Sublinear distributed ZK") use exactly this lift; :mod:`mpc3.dzkp` builds on it.

Representation. An element is a uint64 array whose last axis holds its D coefficients
(coefficient i multiplies X^i), arithmetic mod 2^64 per coefficient; f is a sparse monic
polynomial with 0/1 coefficients irreducible mod 2 (so the quotient is a Galois ring),
``X^D = -(sum of f's lower terms)``. The heavy operations are ring matrix products
(:func:`mpc3.ring.matmul`): an inner product of two element vectors is one GEMM of their
coefficient columns, a vector times a fixed element is one GEMM with that element's D x D
multiplication matrix.
"""
from __future__ import annotations

import functools

import numpy as np

from . import ring

#: sparse irreducible (mod 2) monic polynomials: degree -> exponents of the lower terms
#: (checked by Rabin's test in tests/mpc3/test_galois.py)
MODULI = {8: (4, 3, 1, 0), 12: (3, 0), 16: (5, 3, 1, 0), 20: (3, 0), 24: (4, 3, 1, 0),
          32: (7, 3, 2, 0), 48: (5, 3, 2, 0), 64: (4, 3, 1, 0)}


#: inner-dimension block of :func:`long_matmul`: a (block x N) slice of the right operand
#: stays in cache while every row of the left one passes over it
LONG_BLOCK = 2048


def long_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` mod 2^64 for a long inner dimension and narrow operands (the proofs' Gram
    matrices and weighted sums: M, N <= a few thousand, K up to millions), accumulated over
    K blocks - the ring kernel streams its right operand once per two rows, from memory when
    it is larger than the caches."""
    K = a.shape[1]
    if K <= 2 * LONG_BLOCK:
        return ring.matmul(a, b)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.uint64)
    for s in range(0, K, LONG_BLOCK):
        ring.matmul(np.ascontiguousarray(a[:, s:s + LONG_BLOCK]), b[s:s + LONG_BLOCK], out, K)
    return out


def _mul_kernel(a: np.ndarray, b: np.ndarray, taps: np.ndarray,
                out: np.ndarray) -> None:  # pragma: no cover
    """out[r] = a[r] * b[r] in the ring (int64 views: wrapping = mod 2^64): the schoolbook
    product into 2D - 1 coefficients, then the top ones folded down by f."""
    n, d = a.shape
    c = np.zeros(2 * d - 1, dtype=np.int64)
    for r in range(n):
        c[:] = 0
        for i in range(d):
            ai = a[r, i]
            for j in range(d):
                c[i + j] += ai * b[r, j]
        for m in range(2 * d - 2, d - 1, -1):
            top = c[m]
            for t in taps:
                c[m - d + t] -= top
        out[r, :] = c[:d]


@functools.cache
def _mul_jit():
    import numba
    return numba.njit(cache=True, nogil=True)(_mul_kernel)


def _mul_one(a: np.ndarray, b: np.ndarray, taps: np.ndarray, c: np.ndarray,
             out: np.ndarray) -> None:  # pragma: no cover
    """out = a * b for single elements (int64 views; c: scratch of 2D - 1; out may be a)."""
    d = a.shape[0]
    c[:] = 0
    for i in range(d):
        ai = a[i]
        for j in range(d):
            c[i + j] += ai * b[j]
    for m in range(2 * d - 2, d - 1, -1):
        top = c[m]
        for t in taps:
            c[m - d + t] -= top
    out[:] = c[:d]


def _lagrange_kernel(nodes: np.ndarray, z: np.ndarray, w: np.ndarray, taps: np.ndarray,
                     out: np.ndarray) -> None:  # pragma: no cover
    """out[r, i] = w_i prod_{m != i} (z[r] - nodes[m]) (int64 views): prefix products, then
    suffix products from the top."""
    k, d = nodes.shape
    c = np.zeros(2 * d - 1, dtype=np.int64)
    diff = np.empty((k, d), dtype=np.int64)
    pre = np.empty((k, d), dtype=np.int64)
    suf = np.empty(d, dtype=np.int64)
    tmp = np.empty(d, dtype=np.int64)
    for r in range(z.shape[0]):
        for i in range(k):
            for e in range(d):
                diff[i, e] = z[r, e] - nodes[i, e]
        pre[0, :] = 0
        pre[0, 0] = 1
        for i in range(1, k):
            _mul_one_jit(pre[i - 1], diff[i - 1], taps, c, pre[i])
        suf[:] = 0
        suf[0] = 1
        for i in range(k - 1, -1, -1):
            _mul_one_jit(pre[i], suf, taps, c, tmp)
            _mul_one_jit(tmp, w[i], taps, c, out[r, i])
            _mul_one_jit(suf, diff[i], taps, c, suf)


_mul_one_jit = _mul_one


@functools.cache
def _lagrange_jit():
    import numba
    globals()["_mul_one_jit"] = numba.njit(cache=True, nogil=True)(_mul_one)
    return numba.njit(cache=True, nogil=True)(_lagrange_kernel)


class GaloisRing:
    """GR(2^64, degree) with the modulus of :data:`MODULI`."""

    def __init__(self, degree: int) -> None:
        if degree not in MODULI:
            raise ValueError(f"no modulus for degree {degree}; have {sorted(MODULI)}")
        self.D = degree
        self.taps = MODULI[degree]
        self._taps = np.array(self.taps, dtype=np.int64)
        self._x = self.from_ints(np.array([2]))[0]          # the element X

    # ---------------------------------------------------------------- elements ---------
    def zeros(self, shape=()) -> np.ndarray:
        return np.zeros(tuple(shape) + (self.D,), dtype=np.uint64)

    def one(self) -> np.ndarray:
        e = self.zeros()
        e[0] = 1
        return e

    def lift(self, x: np.ndarray) -> np.ndarray:
        """Z_2^64 values as ring elements (coefficient 0)."""
        x = np.asarray(x, dtype=np.uint64)
        out = np.zeros(x.shape + (self.D,), dtype=np.uint64)
        out[..., 0] = x
        return out

    def from_ints(self, ints: np.ndarray) -> np.ndarray:
        """Exceptional elements: the bits of each integer (< 2^D) as 0/1 coefficients."""
        ints = np.asarray(ints, dtype=np.uint64)
        if ints.size and int(ints.max()) >> self.D:
            raise ValueError(f"exceptional elements take integers below 2^{self.D}")
        shifts = np.arange(self.D, dtype=np.uint64)
        return (ints[..., None] >> shifts) & np.uint64(1)

    def exceptional(self, raw: np.ndarray) -> np.ndarray:
        """Uniform exceptional elements from uniform uint64 words (their low D bits)."""
        mask = np.uint64((1 << self.D) - 1)
        return self.from_ints(np.asarray(raw, dtype=np.uint64) & mask)

    # -------------------------------------------------------------- arithmetic ---------
    def reduce(self, c: np.ndarray) -> np.ndarray:
        """Coefficients of degree < 2D - 1 (last axis) reduced mod f."""
        shape = c.shape
        D = self.D
        c = np.moveaxis(np.atleast_2d(c), -1, 0).copy()             # coefficient-major: contiguous rows
        for m in range(c.shape[0] - 1, D - 1, -1):
            for t in self.taps:                      # X^m = -X^(m-D) * (f - X^D)
                c[m - D + t] -= c[m]
        out = np.ascontiguousarray(np.moveaxis(c[:D], 0, -1))
        return out.reshape(shape[:-1] + (D,))

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise product (broadcasting leading axes)."""
        shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        a2 = np.ascontiguousarray(np.broadcast_to(a, shape + (self.D,))).reshape(-1, self.D)
        b2 = np.ascontiguousarray(np.broadcast_to(b, shape + (self.D,))).reshape(-1, self.D)
        out = np.empty_like(a2)
        _mul_jit()(a2.view(np.int64), b2.view(np.int64), self._taps, out.view(np.int64))
        return out.reshape(shape + (self.D,))

    def mul_matrix(self, r: np.ndarray) -> np.ndarray:
        """The D x D matrices M with ``a @ M == a * r`` for row vectors of coefficients, for
        elements r (..., D): row i holds X^i r, a shift reduced once."""
        r = np.asarray(r, dtype=np.uint64)
        D = self.D
        shifted = np.zeros(r.shape[:-1] + (D, 2 * D - 1), dtype=np.uint64)
        for i in range(D):
            shifted[..., i, i:i + D] = r
        return self.reduce(shifted)

    def scale(self, a: np.ndarray, r: np.ndarray) -> np.ndarray:
        """a * r for one fixed element r: one ring GEMM."""
        flat = np.ascontiguousarray(a).reshape(-1, self.D)
        return ring.matmul(flat, self.mul_matrix(r)).reshape(a.shape)

    def combine(self, parts: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
        """sum_i coeffs[i] * parts[i] for ring-element arrays parts (k, ..., D) and fixed
        coeffs (k, D): one GEMM with the stacked multiplication matrices."""
        k = parts.shape[0]
        rest = parts.shape[1:-1]
        flat = np.ascontiguousarray(np.moveaxis(parts, 0, -2)).reshape(-1, k * self.D)
        mats = self.mul_matrix(coeffs).reshape(k * self.D, self.D)   # (k D, D)
        return ring.matmul(flat, mats).reshape(rest + (self.D,))

    def combine_int(self, parts: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
        """sum_i coeffs[i] * parts[i] for Z_2^64 arrays parts (k, ...): a (.., k) @ (k, D)
        GEMM, D multiply-adds per term."""
        k = parts.shape[0]
        flat = np.ascontiguousarray(np.moveaxis(parts, 0, -1)).reshape(-1, k)
        return ring.matmul(flat, np.ascontiguousarray(coeffs)).reshape(parts.shape[1:] + (-1,))

    def fold_products(self, prod: np.ndarray) -> np.ndarray:
        """Coefficient products P[..., a, b] (= sum of x_a y_b) -> the reduced element
        sum_{a, b} P[a, b] X^(a + b)."""
        D = self.D
        out = np.zeros(prod.shape[:-2] + (2 * D - 1,), dtype=np.uint64)
        for a in range(D):
            out[..., a:a + D] += prod[..., a, :]
        return self.reduce(out)

    def dot(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """sum_t a[t] * b[t] for element vectors (n, D): one (D x n) @ (n x D) GEMM."""
        return self.fold_products(long_matmul(np.ascontiguousarray(a.T), b))

    # ----------------------------------------------------------------- inverses ---------
    def _inv_mod2(self, a: np.ndarray) -> int:
        """Inverse of a's reduction in GF(2^D), as a bit mask (extended Euclid)."""
        f = (1 << self.D) | sum(1 << t for t in self.taps)
        x = sum((int(a[i]) & 1) << i for i in range(self.D))
        if x == 0:
            raise ZeroDivisionError("not a unit of the Galois ring (zero mod 2)")
        r0, r1, s0, s1 = f, x, 0, 1
        while r1:
            q = 0
            while r0.bit_length() >= r1.bit_length():
                sh = r0.bit_length() - r1.bit_length()
                q ^= 1 << sh
                r0 ^= r1 << sh
            r0, r1 = r1, r0
            s0, s1 = s1, s0 ^ _clmul(q, s1)
        return s0

    def inv(self, a: np.ndarray) -> np.ndarray:
        """The inverse of a unit: its GF(2^D) inverse lifted by Newton steps
        b <- b (2 - a b), each doubling the number of correct low bits (1 -> 64)."""
        b = self.from_ints(np.array([self._inv_mod2(a)]))[0]
        two = self.lift(np.array(2, dtype=np.uint64))
        for _ in range(6):
            b = self.mul(b, two - self.mul(a, b))
        return b

    def lagrange(self, nodes: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Lagrange coefficients L_i(z) (..., k, D) of exceptional ``nodes`` (k, D) at points
        z (..., D): p(z) = sum_i L_i(z) p(nodes[i]) for every polynomial p of degree < k.
        Barycentric form: L_i(z) = w_i prod_{m != i} (z - nodes[m]), the weights cached."""
        k = nodes.shape[0]
        w = self._weights(nodes.tobytes(), k)
        flat = np.ascontiguousarray(z, dtype=np.uint64).reshape(-1, self.D)
        out = np.empty((flat.shape[0], k, self.D), dtype=np.uint64)
        _lagrange_jit()(np.ascontiguousarray(nodes, dtype=np.uint64).view(np.int64),
                        flat.view(np.int64), w.view(np.int64), self._taps, out.view(np.int64))
        return out.reshape(z.shape[:-1] + (k, self.D))

    @functools.lru_cache(maxsize=64)
    def _weights(self, key: bytes, k: int) -> np.ndarray:
        """w_i = 1 / prod_(m != i) (nodes[i] - nodes[m]): the k products pairwise, all rows
        at once (log2 k vectorised steps), then k inverses."""
        nodes = np.frombuffer(key, dtype=np.uint64).reshape(k, self.D)
        den = nodes[:, None, :] - nodes[None, :, :]                   # (k, k, D)
        den[np.arange(k), np.arange(k)] = self.one()
        while den.shape[1] > 1:
            if den.shape[1] % 2:
                den = np.concatenate([den, np.broadcast_to(self.one(), (k, 1, self.D))], axis=1)
            den = self.mul(den[:, 0::2], den[:, 1::2])
        return np.stack([self.inv(d) for d in den[:, 0]])


@functools.cache
def galois_ring(degree: int) -> GaloisRing:
    """The one shared instance per degree (its caches are reused)."""
    return GaloisRing(degree)


def _clmul(a: int, b: int) -> int:
    """Carry-less product of two bit masks (GF(2)[X])."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        b >>= 1
    return r
