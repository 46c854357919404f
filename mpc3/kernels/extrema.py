"""Maxima of secret rows: max_rows_a, a tournament of ReLUs over rows of any lengths.

``max(a, b) = b + ReLU(a - b)`` (the tournament of PUMA's and CrypTen's max): each level
pairs the first half of every row's remaining values with its second half, all pairs of all
rows in ONE ReLU, and keeps an odd row's last value for the next level. A row of n values
takes ceil(log2 n) levels and n - 1 ReLUs; rows of different lengths (the causal rows of a
masked attention, 1..S keys) share the levels, so a call costs the levels of its longest row
and the ReLUs of all rows together (:func:`cost_max_rows`). Levels are sequential, so each
ReLU takes the two-round comparison (:func:`mpc3.kernels.thresholds.compare_public_masked`
with 0) and the injection (convert.mul_masked): 4 rounds at any size, where relu_a spends
7 on more than 2^14 elements for ~12 bytes per element less (a prompt's first levels).

Range: every difference a - b inside ``convert.relu_limit`` (|x| < 2^14), so every value
with |x| < 2^13. Error: ReLU is exact for a - b >= 0 and returns either 0 or a - b on DReLU's
error region [-2^(drop - frac), 0) (2^-12 by default), so each level may return the smaller
value when the two differ by less than that: the result m satisfies
max - levels * 2^-12 <= m <= max (never above the maximum, never below the minimum).
"""
from __future__ import annotations

import functools

import numpy as np

from ..party import Party, profiled
from ..shares import AShare
from . import convert
from .base import Cost
from .thresholds import compare_public_masked, cost_compare_public, window, window_for


@functools.lru_cache(maxsize=64)
def _levels(lengths: bytes) -> tuple:
    """Per level: (a, b) flat indices of the pairs, (src, dst) of the values an odd row
    carries over, and the level's output size. Cached by the row lengths (a model's rows
    repeat: every head, layer and step of one shape)."""
    lens = np.frombuffer(lengths, dtype=np.int64)
    levels = []
    while lens.size and lens.max() > 1:
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        half, odd = lens // 2, lens % 2 == 1
        rows = np.repeat(np.arange(lens.size), half)
        j = np.arange(half.sum()) - np.repeat(np.cumsum(half) - half, half)
        new = half + odd
        new_starts = np.concatenate([[0], np.cumsum(new)[:-1]])
        a = starts[rows] + j
        levels.append((a, a + half[rows], new_starts[rows] + j,
                       starts[odd] + lens[odd] - 1, new_starts[odd] + half[odd],
                       int(new.sum())))
        lens = new
    return tuple(levels)


def _check(x: AShare, lengths) -> np.ndarray:
    lens = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
    if lens.size == 0 or lens.min() < 1:
        raise ValueError("max_rows_a: every row needs at least one value")
    if int(lens.sum()) != x.size:
        raise ValueError(f"max_rows_a: rows of {int(lens.sum())} values for {x.size} values")
    return lens


@profiled
def max_rows_a(p: Party, x: AShare, lengths, site: str | None = None) -> AShare:
    """The maximum of each row of ``x``: the flat concatenation of rows of ``lengths``
    values (row-major order) -> (len(lengths),). Cost: :func:`cost_max_rows`."""
    lens = _check(x, lengths)
    if p.shadow is not None:
        return p.shadow.max_rows_a(x, lens, site)
    cur = AShare(x.a.reshape(-1), x.b.reshape(-1))
    zero = np.zeros(1, np.uint64)
    for a, b, dst, keep_src, keep_dst, size in _levels(lens.tobytes()):
        lo = cur[b]
        diff = cur[a] - lo
        m = lo + convert.mul_masked(p, compare_public_masked(p, diff, zero, window(p)), diff)
        nxt = AShare(np.empty(size, np.uint64), np.empty(size, np.uint64))
        nxt.a[dst], nxt.b[dst] = m.a, m.b
        nxt.a[keep_dst], nxt.b[keep_dst] = cur.a[keep_src], cur.b[keep_src]
        cur = nxt
    return cur


def cost_max_rows(lengths, cfg) -> Cost:
    """Rounds and bytes per party of :func:`max_rows_a` on rows of ``lengths`` values."""
    lens = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
    cost = Cost(0, (0, 0, 0))
    for a, *_ in _levels(lens.tobytes()):
        cost = (cost + cost_compare_public(a.size, 1, *window_for(cfg))
                + convert.cost_inject(a.size, fused=True))
    return cost
