"""The vocabulary ends of a model on shares, for an owner that keeps its embedding table and
LM head secret: the user's tokens go in as secret one-hot rows and come out as the index of
the largest logit, which the caller opens to the user alone (greedy decoding that reveals no
logit).

:func:`onehot_embed` - the embedding lookup as one product. The user encodes its token ids
as one-hot rows (:func:`onehot`: ring integers 0/1, i.e. 0 fractional bits, dealt with
:func:`mpc3.sharing.deal` as they are, never through ``ring.encode``); the owner's table
(V, d) is shared at ``frac`` bits. ``onehot @ table`` is then exactly the table's rows at
``frac`` bits, so the product is reshared without a truncation (``arith.matmul_aa(...,
trunc=False)``): 1 round, 8 B per output element per party, no range, no error. The work is
the parties' local product, T V d multiply-adds per party and row of tokens (5/3 of that in
arith's five-product form): at GPT-2's V = 50257, d = 768 one party's local product alone
took 0.07 s for one token and 6.0 s for a 128-token prompt on the project's 2-core machine,
three in-process parties 0.23 s and 23.5 s (benchmarks/results/vocab_argmax.json; docs/
MODELS.md, "Secret embeddings and LM head: the protocols"). Nothing checks that a row is
one-hot: a user sending another vector gets the model run on that mix of rows and still
learns only the chosen token.

:func:`lm_head_token` - the logits ``h @ W (+ b)`` of the final hidden rows h (B, d) with the
owner's head W (d, V) and bias b (V,): one truncated product of B V outputs
(:func:`arith.cost_mul`), the bias added locally, then :func:`argmax_a` over the V logits.
Range: |logit| below ``arith.product_limit`` (2^26; calibration site ``lm_head``) and a
row's spread below ``convert.relu_limit`` (site ``argmax``, below). Error: the product's
stochastic rounding (< 1 ulp per logit, none when 2^frac divides the product) comes before
the arg-max's error region, so logits within 2^-12 + 2 ulp of the maximum may win.

:func:`argmax_a` is a tournament over the C entries of each row (ceil(log2 C) levels). Each
level pairs neighbours (entries 2j, 2j + 1; an odd row's last entry waits for the next
level), so every value stands for a contiguous range of indices and the left one's are the
lower: the bit ``[a >= b]`` sends ties to the lower index, as numpy's argmax. A level is
the two-round masked comparison of all B * pairs differences with 0
(:func:`mpc3.kernels.thresholds.compare_public_masked`, as :mod:`mpc3.kernels.extrema`'s row
maxima) and the injection of its bits into the rows (a - b, i_a - i_b)
(:func:`mpc3.kernels.convert.mul_masked`, two rounds): ``b + bit (a - b)`` is the winner's
value, ``i_b + bit (i_a - i_b)`` its index, which rides along as a fixed-point share. The
last level injects the index alone.

Cost (:func:`cost_argmax`): 4 rounds per level. Against the former tournament of drelu_a
(leaves, carry tree, one more round to complete the bit) and mul_ab, at C = 50257, B = 1:
64 rounds instead of 113, 5.55 MB instead of 4.92 MB for the three parties together (the
comparison's dealt carry sends more bytes per element than the tree), both measured equal
to their declarations; at C = 5: 12 rounds instead of 21, 1252 B instead of 924 B.

Range: every compared difference below ``convert.relu_limit`` (|a - b| < 2^14 real, so a
row's spread max - min < 2^14). Error: the comparison is exact for a - b >= 0 and for
a - b < -2^(drop - frac) = -2^-12; on [-2^-12, 0) either bit may come out (DReLU's error
region, ``RingConfig.relu_drop_bits``). So the result is numpy's argmax whenever every entry
either equals the row maximum or lies more than 2^-12 below it; else it is the index of an
entry within ceil(log2 C) * 2^-12 of the maximum (each level may keep the smaller of two
values closer than 2^-12). Index differences are injected, not compared: no range; the index
is exact for C < 2^(63 - frac).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, convert
from mpc3.kernels.base import Cost
from mpc3.kernels.thresholds import (compare_public_masked, cost_compare_public, window,
                                     window_for)
from mpc3.party import Party, profiled
from mpc3.shares import AShare


@profiled
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


# ------------------------------------------------------------------ the embedding ----
def onehot(ids, V: int) -> np.ndarray:
    """User side: token ids (ints in [0, V), any shape) -> their one-hot rows, shape
    ``ids.shape + (V,)``, as ring integers 0/1 (uint64, 0 fractional bits): deal them with
    :func:`mpc3.sharing.deal` as they are (see the module docstring)."""
    ids = np.asarray(ids)
    if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0
                     or ids.max() >= V):
        raise ValueError(f"onehot: token ids must be integers in [0, {V})")
    out = np.zeros(ids.shape + (V,), dtype=np.uint64)
    np.put_along_axis(out, ids[..., None].astype(np.int64), np.uint64(1), axis=-1)
    return out


def onehot_embed(p: Party, onehot: AShare, table: AShare) -> AShare:
    """The rows of a secret table picked by secret one-hot rows: ``onehot`` (B, T, V) at 0
    fractional bits (:func:`onehot`), ``table`` (V, d) at ``frac`` bits -> (B, T, d) at
    ``frac`` bits, exact. Cost: :func:`cost_onehot_embed`."""
    if len(onehot.shape) != 3 or len(table.shape) != 2 or onehot.shape[2] != table.shape[0]:
        raise ValueError(f"onehot_embed needs one-hot rows (B, T, V) and a table (V, d), "
                         f"got {onehot.shape} and {table.shape}")
    B, T, V = onehot.shape
    out = arith.matmul_aa(p, onehot.reshape(B * T, V), table, trunc=False)
    return out.reshape(B, T, table.shape[1])


def cost_onehot_embed(p_cfg, B: int, T: int, d: int) -> Cost:
    """Rounds and bytes per party of :func:`onehot_embed`: one resharing of B T d elements."""
    return arith.cost_mul(B * T * d, p_cfg, trunc=False)


# ------------------------------------------------------------------- the LM head ----
def lm_head_token(p: Party, h: AShare, w: AShare, b: AShare | None = None) -> AShare:
    """The token of each row: the index of the largest logit of ``h @ w (+ b)``, h (B, d) the
    final hidden rows, w (d, V) and b (V,) the secret LM head -> (B,) shares of the index in
    fixed point (``frac`` bits, as :func:`argmax_a`); opening it is the caller's. Shadow
    sites ``lm_head`` (the product) and ``argmax``. Cost: :func:`cost_lm_head_token`."""
    if len(h.shape) != 2 or len(w.shape) != 2 or h.shape[1] != w.shape[0]:
        raise ValueError(f"lm_head_token needs rows (B, d) and a head (d, V), got {h.shape} "
                         f"and {w.shape}")
    if b is not None and b.shape != (w.shape[1],):
        raise ValueError(f"lm_head_token: a bias of shape {b.shape} for {w.shape[1]} logits")
    logits = arith.matmul_aa(p, h, w, site="lm_head")
    if b is not None:
        logits = logits + AShare(np.broadcast_to(b.a, logits.shape),
                                 np.broadcast_to(b.b, logits.shape))
    return argmax_a(p, logits, site="argmax")


def cost_lm_head_token(p_cfg, B: int, V: int) -> Cost:
    """Rounds and bytes per party of :func:`lm_head_token` on B rows and V logits."""
    return arith.cost_mul(B * V, p_cfg) + cost_argmax(p_cfg, B, V)
