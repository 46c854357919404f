"""The vocabulary end of a model on shares: the secure arg-max of logit rows.

:func:`argmax_a` is a tournament over the C entries of each row (ceil(log2 C) levels). Each
level pairs neighbours (entries 2j, 2j + 1; an odd row's last entry waits for the next
level), so every value stands for a contiguous range of indices and the left one's are the
lower: the bit ``[a >= b]`` sends ties to the lower index, as numpy's argmax. A level is
the two-round masked comparison of all B * pairs differences with 0
(:func:`mpc3.kernels.thresholds.compare_public_masked`, as :mod:`mpc3.kernels.extrema`'s row
maxima) and the injection of its bits into the rows (a - b, i_a - i_b)
(:func:`mpc3.kernels.convert.mul_masked`, two rounds): ``b + bit (a - b)`` is the winner's
value, ``i_b + bit (i_a - i_b)`` its index, which rides along as a fixed-point share, so
only the index is ever opened (by the caller). The last level injects the index alone.

Cost (:func:`cost_argmax`): 4 rounds per level. Against the former tournament of
drelu_a (leaves, carry tree, one more round to complete the bit) and mul_ab, at C = 50257,
B = 1: 64 rounds instead of 113, 5.55 MB instead of 4.92 MB for the three parties together
(the comparison's dealt carry sends ~12 B per element more than the tree), both measured
equal to their declarations; at C = 5: 12 rounds instead of 21, 1252 B instead of 924 B.

Range: every compared difference below ``convert.relu_limit`` (|a - b| < 2^14 real, so a
row's spread max - min < 2^14; calibration site ``argmax``). Error: the comparison is exact
for a - b >= 0 and for a - b < -2^(drop - frac) = -2^-12; on [-2^-12, 0) either bit may come
out (DReLU's error region, ``RingConfig.relu_drop_bits``). So the result is numpy's argmax
whenever every entry either equals the row maximum or lies more than 2^-12 below it; else it
is the index of an entry within ceil(log2 C) * 2^-12 of the maximum (each level may keep
the smaller of two values closer than 2^-12). Index differences are injected, not compared:
no range. The index is exact (C < 2^(62 - frac)).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, convert
from mpc3.kernels.base import Cost
from mpc3.kernels.thresholds import (compare_public_masked, cost_compare_public, window,
                                     window_for)
from mpc3.party import Party
from mpc3.shares import AShare


def argmax_a(p: Party, x: AShare, site: str | None = None) -> AShare:
    """Index of the largest entry of each row: x (B, C) -> (B,) shares of the index in fixed
    point (``frac`` bits, so it decodes to a float equal to the index). Ties go to the lower
    index; see the module docstring for the error region. ``site``: a shadow party's record
    (every compared difference lies within its row's spread). Cost: :func:`cost_argmax`."""
    if len(x.shape) != 2 or x.shape[1] < 1:
        raise ValueError(f"argmax_a needs (B, C) with C >= 1, got {x.shape}")
    if p.shadow is not None:
        return p.shadow.argmax_a(x, site)
    B, C = x.shape
    zero, win = np.zeros(1, np.uint64), window(p)
    vals = x
    ids = arith.public_share(p, ring.encode(np.broadcast_to(np.arange(C, dtype=np.float64),
                                                            (B, C)), p.cfg.frac))
    while vals.shape[1] > 1:
        n = vals.shape[1]
        h = n // 2
        a, b = vals[:, 0:2 * h:2], vals[:, 1:2 * h:2]
        ia, ib = ids[:, 0:2 * h:2], ids[:, 1:2 * h:2]
        diff, idiff = (a - b).reshape(B * h), (ia - ib).reshape(B * h)
        bits = compare_public_masked(p, diff, zero, win)          # [a >= b] per pair
        if n == 2:                                       # the last level: the index only
            return ib[:, 0] + convert.mul_masked(p, bits, idiff)
        rows = AShare.concat([diff.reshape(B * h, 1), idiff.reshape(B * h, 1)], axis=1)
        sel = convert.mul_masked(p, bits, rows)                   # bit * (a - b, i_a - i_b)
        nv = b + sel[:, 0].reshape(B, h)
        ni = ib + sel[:, 1].reshape(B, h)
        if n % 2:
            nv = AShare.concat([nv, vals[:, n - 1:]], axis=1)
            ni = AShare.concat([ni, ids[:, n - 1:]], axis=1)
        vals, ids = nv, ni
    return ids[:, 0]


def cost_argmax(p_cfg, B: int, C: int) -> Cost:
    """Rounds and bytes per party of :func:`argmax_a` on B rows of C entries."""
    L, m = window_for(p_cfg)
    cost, n = Cost(0, (0, 0, 0)), C
    while n > 1:
        pairs = B * (n // 2)
        cost = (cost + cost_compare_public(pairs, 1, L, m)
                + convert.cost_inject(pairs, fused=True, cols=1 if n == 2 else 2))
        n = n // 2 + n % 2
    return cost
