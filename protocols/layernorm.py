"""Secure LayerNorm (Privformer Alg. 5), leak-free inverse square root, rows batched.

For x (..., d) (the residual sum is formed by the caller, locally), with S1 = sum_k x_k
(local):

* d a power of two (one product round before sqrt_inv): in ONE kernel call
  E[x^2] = (x . x) / d and mu^2 = S1^2 / d^2 (the 1/d, 1/d^2 ride in the truncation shifts),
  x * gamma and S1 * gamma / d; then var + eps = E[x^2] - mu^2 + eps (local),
  rs = sqrt_inv_a(var + eps), y = (x * gamma - mu * gamma) * rs + beta (one multiplication).
  No separate truncation for the mean: 14 rounds when decoding (sqrt_inv "fast"), 24 else.
* otherwise: mu = S1 * (1/d) (one truncation), then sum_k (x_k - mu)^2 and (x - mu) * gamma in
  one call, var = sum * (1/d) (one truncation), sqrt_inv, one multiplication (18 / 28 rounds).

Constraints (checked per layer by :mod:`protocols.calibrate`): every product below
``arith.product_limit`` (2^26 real; for d a power of two that includes S1^2 and sum_k x_k^2);
var + eps inside ``fxp.SQRT_INV_RANGE`` ([2^-12, 2^16]).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith
from mpc3.party import Party
from mpc3.kernels.base import Cost
from mpc3.shares import AShare

from . import attention as A

LN_SCALE_EXTRA = 8


def _bcast(x: AShare, shape) -> AShare:
    return AShare(np.ascontiguousarray(np.broadcast_to(x.a, shape)),
                  np.ascontiguousarray(np.broadcast_to(x.b, shape)))


def layernorm(p: Party, x: AShare, gamma: AShare, beta: AShare, eps: float) -> AShare:
    from mpc3.kernels import fxp
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"layernorm: gamma/beta must have shape ({d},)")
    f = p.cfg.frac
    lead = x.shape[:-1]
    s1 = AShare(x.a.sum(axis=-1, dtype=np.uint64), x.b.sum(axis=-1, dtype=np.uint64))
    g = _bcast(gamma, x.shape)
    if d & (d - 1) == 0:
        logd = d.bit_length() - 1
        s1b = _bcast(s1.reshape(*lead, 1), x.shape)
        ex2, mu2, xg, mg = arith.mul_many_aa(p, [
            (x.reshape(*lead, 1, d), x.reshape(*x.shape, 1), "matmul", f + logd),
            (s1, s1, "mul", f + 2 * logd),
            (x, g, "mul", True),
            (s1b, g, "mul", f + logd)])
        var = ex2.reshape(lead) - mu2
        xg = xg - mg
    else:
        mu = A.scale_public(p, s1, 1.0 / d, LN_SCALE_EXTRA)
        xc = x - _bcast(mu.reshape(*lead, 1), x.shape)
        sq, xg = arith.mul_many_aa(p, [
            (xc.reshape(*lead, 1, d), xc.reshape(*x.shape, 1), "matmul", f),
            (xc, g, "mul", True)])
        var = A.scale_public(p, sq.reshape(lead), 1.0 / d, LN_SCALE_EXTRA)
    var = arith.add_public(p, var, ring.encode(np.full(var.shape, float(eps)), f))
    rs = fxp.sqrt_inv_a(p, var)
    y = arith.mul_aa(p, xg, _bcast(rs.reshape(*rs.shape, 1), x.shape))
    return y + _bcast(beta, x.shape)


def cost_layernorm(ring_cfg, rows: int, d: int) -> Cost:
    """Declared rounds and bytes per party of :func:`layernorm` on ``rows`` rows of width d."""
    from mpc3.kernels import fxp
    f, mode = ring_cfg.frac, ring_cfg.trunc
    if d & (d - 1) == 0:
        logd = d.bit_length() - 1
        shifts = np.concatenate([np.full(rows, f + logd), np.full(rows, f + 2 * logd),
                                 np.full(rows * d, f), np.full(rows * d, f + logd)])
        pre = arith.cost_mul_many(shifts, 0, mode)
    else:
        pre = (A.cost_scale_public(rows, ring_cfg, LN_SCALE_EXTRA)
               + arith.cost_mul_many(np.full(rows + rows * d, f), 0, mode)
               + A.cost_scale_public(rows, ring_cfg, LN_SCALE_EXTRA))
    return (pre + fxp.cost_sqrt_inv(rows, "auto", f, mode)
            + arith.cost_mul(rows * d, True, f, mode))
