"""Compiled bit-plane helpers of the DReLU leaves (:mod:`mpc3.kernels.convert`).

Both work straight on the bit-sliced layout of one element group (plane ``r``, bit ``e % 64``
of word ``e // 64`` is row ``r`` of element ``e``; bits beyond the group's ``n`` elements stay
zero), so no (rows, n) byte matrix is unpacked, gathered and packed again. Blocks are given by
their bit offsets ``offs`` and widths ``ks``; block j owns thermometer rows ``base_j ..
base_j + 2^k_j - 2`` (``base`` = running sum of ``2^k - 1``). Compiled lazily by numba like
:mod:`mpc3.ring`; tests compare them with the numpy formulation.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import ring
from ..ringmm import once


def _planes(x: np.ndarray, e0: int, out: np.ndarray) -> None:  # pragma: no cover
    """out[i] (64 words) = bit i of x[e0 + e] at bit e, for the (up to) 64 elements from e0
    (missing elements read as 0): a 64 x 64 bit-matrix transpose in six rounds of block
    swaps (Hacker's Delight 7-3) instead of a shift, mask and or per element and bit (at the
    ReLU's 27-bit window 5 - 10 % faster; slower on windows of a few bits)."""
    n = max(0, min(64, x.size - e0))
    for e in range(n):
        out[e] = x[e0 + e]
    for e in range(n, 64):
        out[e] = 0
    j = 32
    m = np.uint64(0x00000000FFFFFFFF)
    while j != 0:
        sj = np.uint64(j)
        for k in range(64):
            if k & j == 0:
                t = ((out[k] >> sj) ^ out[k + j]) & m
                out[k] ^= t << sj
                out[k + j] ^= t
        j >>= 1
        m ^= m << np.uint64(j)


_planes_jit = _planes  # replaced by its compiled form when the kernels are compiled


def _thermo_kernel(a: np.ndarray, offs: np.ndarray, ks: np.ndarray, top: int,
                   out: np.ndarray) -> None:  # pragma: no cover
    """out (zeroed (rows, words) uint64): rows [a_j >= v] (v = 1 .. 2^k_j - 1) per block, then
    the bit ``top`` of a. Bit-sliced per 64-element word: a's bits transposed into planes,
    [a_j >= v] = OR of the minterms [a_j = u] for u >= v."""
    nb = offs.size
    ap = np.zeros(64, dtype=np.uint64)
    ones = ~np.uint64(0)
    rows = out.shape[0]
    for w in range(out.shape[1]):
        _planes_jit(a, 64 * w, ap)
        r = 0
        for j in range(nb):
            k = ks[j]
            size = 1 << k
            acc = np.uint64(0)
            for v in range(size - 1, 0, -1):               # rows v = size-1 .. 1
                mv = ones
                for i in range(k):
                    plane = ap[offs[j] + i]
                    mv &= plane if (v >> i) & 1 else ~plane
                acc |= mv
                out[r + v - 1, w] = acc
            r += size - 1
        out[rows - 1, w] = ap[top]


def _select_kernel(therm: np.ndarray, b: np.ndarray, offs: np.ndarray, ks: np.ndarray,
                   const_one: bool, out: np.ndarray) -> None:  # pragma: no cover
    """out (zeroed (2 nb - 1, words) uint64) = [G_0..G_{nb-1}, P_1..P_{nb-1}] with, for the
    code t extended by t_0 = const_one and t_{2^k} = 0, G_j = t[2^k - b_j] and
    P_j = t[2^k - 1 - b_j] ^ G_j (t_v = therm row base_j + v - 1).

    Bit-sliced, one word (64 elements) at a time: the bits of b are transposed into planes,
    then [b_j = v] is a minterm of block j's planes and G_j = XOR_v [b_j = v] & t[2^k - v]."""
    nb = offs.size
    bp = np.zeros(64, dtype=np.uint64)
    ones = ~np.uint64(0)
    c0 = ones if const_one else np.uint64(0)
    nwords = out.shape[1]
    for w in range(nwords):
        e0 = 64 * w
        _planes_jit(b, e0, bp)
        r = 0
        for j in range(nb):
            k = ks[j]
            size = 1 << k
            g = np.uint64(0)
            q = np.uint64(0)
            for v in range(size):
                mv = ones
                for i in range(k):
                    plane = bp[offs[j] + i]
                    mv &= plane if (v >> i) & 1 else ~plane
                gi = size - v                                # t index of G: 1 .. size
                if gi < size:
                    g ^= mv & therm[r + gi - 1, w]
                pi = gi - 1                                  # t index of P's first term
                q ^= mv & (c0 if pi == 0 else therm[r + pi - 1, w])
            out[j, w] = g
            if j > 0:
                out[nb + j - 1, w] = q ^ g
            r += size - 1
        tail = b.size - e0
        if tail < 64:                                        # padding bits stay zero
            keep = (np.uint64(1) << np.uint64(tail)) - np.uint64(1) if tail > 0 else np.uint64(0)
            for row in range(2 * nb - 1):
                out[row, w] &= keep


def _select_rows_kernel(therm: np.ndarray, idx: np.ndarray, b: np.ndarray, offs: np.ndarray,
                        ks: np.ndarray, const_one: bool, out: np.ndarray) -> None:  # pragma: no cover
    """:func:`_select_kernel` where element e reads the thermometer of row idx[e] (``therm``
    planes are over rows, not elements): out (zeroed (2 nb - 1, words(n))) gets, per element
    and block, the two entries its b selects - no expansion of every row to every element."""
    nb = offs.size
    one = np.uint64(1)
    for e in range(b.size):
        r = idx[e]
        rw, rb = r >> 6, np.uint64(r & 63)
        w, sh = e >> 6, np.uint64(e & 63)
        base = 0
        for j in range(nb):
            k = ks[j]
            size = 1 << k
            v = (b[e] >> np.uint64(offs[j])) & np.uint64(size - 1)
            gi = size - np.int64(v)
            g = (therm[base + gi - 1, rw] >> rb) & one if gi < size else np.uint64(0)
            pi = gi - 1
            if pi == 0:
                t = one if const_one else np.uint64(0)
            else:
                t = (therm[base + pi - 1, rw] >> rb) & one
            out[j, w] |= g << sh
            if j > 0:
                out[nb + j - 1, w] |= (t ^ g) << sh
            base += size - 1


def _carry_kernel(delta: np.ndarray, alpha: np.ndarray, dealt: np.ndarray, last: np.ndarray,
                  rest: np.ndarray, kind: np.ndarray, idx: np.ndarray, first: bool,
                  out: np.ndarray) -> None:  # pragma: no cover
    """out (words,) = last ^ XOR over terms c of (AND_{r in rest[c]} delta[r]) & v_c with
    v_c = all ones (kind 0; only when ``first``), alpha[idx[c]] (kind 1), dealt[idx[c]]
    (kind 2); ``rest`` rows are padded with -1 (thresholds' one-round carry)."""
    ones = ~np.uint64(0)
    for w in range(out.size):
        z = last[w]
        for c in range(kind.size):
            k = kind[c]
            if k == 0:
                if not first:
                    continue
                v = ones
            elif k == 1:
                v = alpha[idx[c], w]
            else:
                v = dealt[idx[c], w]
            for j in range(rest.shape[1]):
                r = rest[c, j]
                if r < 0:
                    break
                v &= delta[r, w]
            z ^= v
        out[w] = z


def _products_kernel(alpha: np.ndarray, members: np.ndarray,
                     out: np.ndarray) -> None:  # pragma: no cover
    """out[u] = AND of alpha[members[u, j]] over the row (padded with -1)."""
    ones = ~np.uint64(0)
    for u in range(members.shape[0]):
        for w in range(alpha.shape[1]):
            v = ones
            for j in range(members.shape[1]):
                m = members[u, j]
                if m < 0:
                    break
                v &= alpha[m, w]
            out[u, w] = v


@once
def _kernels() -> tuple[tuple[Callable[..., None], ...], ...]:
    import numba
    globals()["_planes_jit"] = numba.njit(cache=True, nogil=True, inline="always")(_planes)
    return (ring.jit_pair(_thermo_kernel), ring.jit_pair(_select_kernel),
            ring.jit_pair(_carry_kernel), ring.jit_pair(_products_kernel),
            ring.jit_pair(_select_rows_kernel))


def _kernel(i: int, n: int) -> Callable[..., None]:
    """Kernel ``i`` for ``n`` elements (~40 multiply-adds' work per element)."""
    return _kernels()[i][40 * n >= ring.NOGIL_MIN_WORK]


def _block_arrays(blocks) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([off for off, _ in blocks], dtype=np.int64),
            np.array([k for _, k in blocks], dtype=np.int64))


def thermometer_planes(a: np.ndarray, blocks, top: int, words: int) -> np.ndarray:
    """(rows + 1, words) planes: the thermometer codes of a's blocks and a's bit ``top``."""
    offs, ks = _block_arrays(blocks)
    rows = int(sum((1 << k) - 1 for k in ks)) + 1
    out = np.zeros((rows, words), dtype=np.uint64)
    _kernel(0, a.size)(np.ascontiguousarray(a), offs, ks, top, out)
    return out


def carry_share(delta: np.ndarray, alpha: np.ndarray, dealt: np.ndarray, last: np.ndarray,
                plan: tuple[np.ndarray, np.ndarray, np.ndarray], first: bool) -> np.ndarray:
    """One pair member's XOR share of a polynomial in opened masked bits (``plan`` = (rest,
    kind, idx) of :func:`_carry_kernel`), plus its share ``last`` of a linear term."""
    out = np.empty(last.size, dtype=np.uint64)
    rest, kind, idx = plan
    _kernel(2, out.size * kind.size)(delta, alpha, dealt, np.ascontiguousarray(last), rest,
                                     kind, idx, bool(first), out)
    return out


def and_products(alpha: np.ndarray, members: np.ndarray) -> np.ndarray:
    """(len(members), words) planes: the AND of the alpha rows listed in each members row."""
    out = np.empty((members.shape[0], alpha.shape[1]), dtype=np.uint64)
    _kernel(3, out.size)(np.ascontiguousarray(alpha), members, out)
    return out


def bit_plane(bits: np.ndarray, n: int) -> np.ndarray:
    """The (1, words(n)) plane of n bits given as 0/1 integers."""
    return bits_to_planes_group(bits.astype(np.uint8)[None], n)


def select_rows(therm: np.ndarray, idx: np.ndarray, b: np.ndarray, blocks,
                const_one: bool) -> np.ndarray:
    """:func:`select_planes` from thermometer planes over rows: element e uses row idx[e]."""
    offs, ks = _block_arrays(blocks)
    out = np.zeros((2 * offs.size - 1, -(-b.size // 64)), dtype=np.uint64)
    _kernel(4, b.size)(np.ascontiguousarray(therm), np.ascontiguousarray(idx, dtype=np.int64),
                       np.ascontiguousarray(b), offs, ks, bool(const_one), out)
    return out


def select_planes(therm: np.ndarray, b: np.ndarray, blocks, const_one: bool) -> np.ndarray:
    """(2 nb - 1, words) planes [G.., P..] of the leaves from a share of the thermometer
    planes (:func:`thermometer_planes` rows, more rows or padding bits are ignored)."""
    offs, ks = _block_arrays(blocks)
    out = np.zeros((2 * offs.size - 1, therm.shape[1]), dtype=np.uint64)
    _kernel(1, b.size)(np.ascontiguousarray(therm), np.ascontiguousarray(b), offs, ks,
                  bool(const_one), out)
    return out


# ----------------------------------------------------------------- layout helpers ------
def bits_to_planes_group(bits: np.ndarray, n: int) -> np.ndarray:
    """(rows, n) 0/1 bytes of one element group -> its (rows, words(n)) planes."""
    padded = np.zeros((bits.shape[0], -(-n // 64) * 64), dtype=np.uint8)
    padded[:, :n] = bits
    return np.packbits(padded, axis=1, bitorder="little").view(np.uint64)


def run_span(sl: slice, seg: int) -> slice:
    """The runs of ``seg`` consecutive elements that the elements ``sl`` touch."""
    if sl.stop == sl.start:
        return slice(sl.start // seg, sl.start // seg)
    return slice(sl.start // seg, (sl.stop - 1) // seg + 1)


class MaskedBits:
    """Comparison bits in masked 3-out-of-3 form (one party's planes over the grouped
    layout): convert.drelu_masked (the last AND layer's output) and
    thresholds.compare_public_masked make them, convert.mul_masked consumes them once - the
    injection's first round swaps the pair's halves."""

    def __init__(self, planes: np.ndarray, n: int) -> None:
        self.planes, self.n = planes, n
