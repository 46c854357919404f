"""Secure LayerNorm (Privformer Alg. 5), leak-free inverse square root, rows batched.

For x (..., d) (the residual sum is formed by the caller, locally):

1. mu = (sum_k x_k) * (1/d)                         one truncation (scale_public)
2. xc = x - mu (local); in one kernel call: sum_k xc_k^2 as a per-row dot product
   (one output element per row, not d) and xc * gamma
3. var + eps = sum xc^2 * (1/d) + eps               one truncation on one element per row
   (for a power-of-two d the 1/d rides in step 2's truncation shift: two rounds fewer)
4. rs = sqrt_inv_a(var + eps)                        (fxp kernel, never reveals anything)
5. y = (xc * gamma) * rs + beta                      one multiplication

Constraints (checked per layer by :mod:`protocols.calibrate`): |x| and sum_k xc_k^2 below
``arith.product_limit`` (2^26 real); var + eps inside ``fxp.SQRT_INV_RANGE`` ([2^-12, 2^16]).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith
from mpc3.party import Party
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
    s = AShare(x.a.sum(axis=-1, dtype=np.uint64), x.b.sum(axis=-1, dtype=np.uint64))
    mu = A.scale_public(p, s, 1.0 / d, LN_SCALE_EXTRA)
    xc = x - _bcast(mu.reshape(*mu.shape, 1), x.shape)
    pow2 = d & (d - 1) == 0
    sq_shift = p.cfg.frac + (d.bit_length() - 1 if pow2 else 0)
    sq, xg = arith.mul_many_aa(p, [
        (xc.reshape(*x.shape[:-1], 1, d), xc.reshape(*x.shape, 1), "matmul", sq_shift),
        (xc, _bcast(gamma, x.shape), "mul", True)])
    var = sq.reshape(x.shape[:-1])
    if not pow2:
        var = A.scale_public(p, var, 1.0 / d, LN_SCALE_EXTRA)
    var = arith.add_public(p, var, ring.encode(np.full(var.shape, float(eps)), p.cfg.frac))
    rs = fxp.sqrt_inv_a(p, var)
    y = arith.mul_aa(p, xg, _bcast(rs.reshape(*rs.shape, 1), x.shape))
    return y + _bcast(beta, x.shape)
