"""The vocabulary end of a model on shares: the secure arg-max of logit rows.

:func:`argmax_a` is a tournament over the C entries of each row: each level one drelu_a on
the differences of neighbouring pairs ([a >= b], so ties go to the lower index, as numpy's
argmax) and one mul_ab of the bit into (a - b, i_a - i_b) rows; the index rides along as a
fixed-point share, so only the index is revealed. ceil(log2 C) levels.

Range: logit differences below ``convert.relu_limit``. Logits closer than 2^-12 (DReLU's
error region) may come out either way.
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, convert
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare


def argmax_a(p: Party, x: AShare) -> AShare:
    """Index of the largest entry of each row: x (B, C) -> (B,) shares of the index in fixed
    point (``frac`` bits, so it decodes to a float equal to the index). Ties and differences
    inside DReLU's error region go to the lower index. Cost: :func:`cost_argmax`."""
    if len(x.shape) != 2 or x.shape[1] < 1:
        raise ValueError(f"argmax_a needs (B, C) with C >= 1, got {x.shape}")
    B, C = x.shape
    vals = x
    ids = arith.public_share(p, ring.encode(np.broadcast_to(np.arange(C, dtype=np.float64),
                                                            (B, C)), p.cfg.frac))
    while vals.shape[1] > 1:
        n = vals.shape[1]
        h = n // 2
        a, b = vals[:, 0:2 * h:2], vals[:, 1:2 * h:2]
        ia, ib = ids[:, 0:2 * h:2], ids[:, 1:2 * h:2]
        bit = convert.drelu_a(p, a - b)                       # [a >= b] per pair
        diff = AShare.concat([(a - b).reshape(B * h, 1), (ia - ib).reshape(B * h, 1)], axis=1)
        sel = convert.mul_ab(p, bit, diff)                    # bit * (a - b, i_a - i_b)
        nv = b + sel[:, 0].reshape(B, h)
        ni = ib + sel[:, 1].reshape(B, h)
        if n % 2:
            nv = AShare.concat([nv, vals[:, n - 1:]], axis=1)
            ni = AShare.concat([ni, ids[:, n - 1:]], axis=1)
        vals, ids = nv, ni
    return ids[:, 0]


def cost_argmax(p_cfg, B: int, C: int) -> Cost:
    cost, n = Cost(0, (0, 0, 0)), C
    while n > 1:
        pairs = B * (n // 2)
        cost = cost + convert.cost_drelu(pairs, p_cfg) + convert.cost_inject(pairs, cols=2)
        n = n // 2 + n % 2
    return cost
