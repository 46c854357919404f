"""Secure LayerNorm (Privformer Alg. 5), leak-free inverse square root, rows batched.

For x (..., d) (the residual sum is formed by the caller, locally), with S1 = sum_k x_k
(local):

* in ONE kernel call E[x^2] = (x . x) / d, mu^2 = S1^2 / d^2 and (x - mu) * gamma =
  (d x - S1) * gamma / d (d x - S1 is local; the 1/d, 1/d^2 ride in the truncations: shifts
  for d a power of two, else public multipliers, :func:`mpc3.kernels.truncation.scaled`); then
  var + eps = E[x^2] - mu^2 + eps (local), rs = sqrt_inv_a(var + eps),
  y = ((x - mu) * gamma) * rs + beta (one multiplication). No separate truncation for the
  mean: 8 rounds when decoding (sqrt_inv "fast"), 16 for whole sequences, for every d.

:func:`layernorm_project` fuses a LayerNorm with the linear layer that reads it (a decode
step's next projection): the products (x - mu) * gamma @ W run in sqrt_inv's rounds and the
row scale 1/sqrt(var + eps) is applied after them, so the projection costs no rounds of its
own.

Constraints (checked per layer by :mod:`protocols.calibration.calibrate`): every product below
``arith.product_limit`` (2^26 real; that includes S1^2, sum_k x_k^2 and d (x - mu) * gamma);
var + eps inside ``fxp.SQRT_INV_RANGE`` ([2^-12, 2^16]).
"""
from __future__ import annotations

import functools

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, truncation
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare


def _bcast(x: AShare, shape) -> AShare:
    return AShare(np.ascontiguousarray(np.broadcast_to(x.a, shape)),
                  np.ascontiguousarray(np.broadcast_to(x.b, shape)))


def _stats(p: Party, x: AShare, gamma: AShare, beta: AShare, eps: float
           ) -> tuple[AShare, AShare]:
    """The products before sqrt_inv: ((x - mu) * gamma, var + eps)."""
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"layernorm: gamma/beta must have shape ({d},)")
    f = p.cfg.frac
    lead = x.shape[:-1]
    s1 = AShare(x.a.sum(axis=-1, dtype=np.uint64), x.b.sum(axis=-1, dtype=np.uint64))
    g = _bcast(gamma, x.shape)
    xc = x.scale(np.uint64(d)) - _bcast(s1.reshape(*lead, 1), x.shape)   # d (x - mu)
    t_ex2, t_mu2, t_xg = _inverse_d(f, d)
    ex2, mu2, xg = arith.mul_many_aa(p, [
        (x.reshape(*lead, 1, d), x.reshape(*x.shape, 1), "matmul", t_ex2),
        (s1, s1, "mul", t_mu2),
        (xc, g, "mul", t_xg)], ["sumsq", "sum2", "xgamma"])
    var = ex2.reshape(lead) - mu2
    return xg, arith.add_public(p, var, ring.encode(np.full(var.shape, float(eps)), f))


@functools.lru_cache(maxsize=64)
def _inverse_d(f: int, d: int):
    """The truncations of E[x^2] (times 1/d), mu^2 (1/d^2) and (x - mu) gamma (1/d): shifts
    for d a power of two, else scaled truncations. The two per-row statistics take as many
    significant bits of their factor as fit (~30: var = E[x^2] - mu^2 cancels when the mean
    is large); the d products (x - mu) gamma f + 2 (relative error below 2^-(f + 2), a
    quarter ulp of an output of 1), since each of their correction messages is as wide as
    the shift."""
    if d & (d - 1) == 0:
        logd = d.bit_length() - 1
        return f + logd, f + 2 * logd, f + logd
    return (truncation.scaled(1.0 / d, f), truncation.scaled(1.0 / d ** 2, f),
            truncation.scaled(1.0 / d, f, f + 2 + d.bit_length()))


def _rms_stats(p: Party, x: AShare, gamma: AShare, eps: float) -> tuple[AShare, AShare]:
    """RMSNorm's products before sqrt_inv, in one call: (x * gamma, mean(x^2) + eps)."""
    d = x.shape[-1]
    if gamma.shape != (d,):
        raise ValueError(f"rmsnorm: gamma must have shape ({d},)")
    lead = x.shape[:-1]
    ex2, xg = arith.mul_many_aa(p, [
        (x.reshape(*lead, 1, d), x.reshape(*x.shape, 1), "matmul", _inverse_d(p.cfg.frac, d)[0]),
        (x, _bcast(gamma, x.shape), "mul", True)], ["sumsq", "xgamma"])
    ex2 = ex2.reshape(lead)
    return xg, arith.add_public(p, ex2, ring.encode(np.full(ex2.shape, float(eps)), p.cfg.frac))


@profiled
def rmsnorm(p: Party, x: AShare, gamma: AShare, eps: float, span=None,
            wide: bool = False, gain: int = 0) -> AShare:
    """RMSNorm (LLaMA-family) ``x / sqrt(mean(x^2) + eps) * gamma``: LayerNorm's rounds
    without the mean - one call for x . x / d and x * gamma, sqrt_inv_a of mean(x^2) + eps
    (site ``var_eps``, ``span`` as :func:`layernorm`'s), one product. ``gain`` k: the rows
    are first multiplied by 2^k and eps by 4^k (local; the same function, since RMSNorm is
    scale invariant), so a small mean square keeps its significant bits
    (:func:`protocols.stacks.schedule.rms_gain` picks k from the calibration). Cost:
    :func:`cost_rmsnorm`."""
    from mpc3.kernels import fxp
    if gain:
        x, eps = x.scale(np.uint64(1 << gain)), eps * 4.0 ** gain
    xg, ms = _rms_stats(p, x, gamma, eps)
    rs = fxp.sqrt_inv_a(p, ms, span=span, site="var_eps")
    return arith.mul_aa(p, xg, _bcast(rs.reshape(*rs.shape, 1), x.shape), trunc=not wide,
                        site="scale")


def cost_rmsnorm(ring_cfg, rows: int, d: int, span=None, wide: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`rmsnorm` on ``rows`` rows of width d."""
    from mpc3.kernels import fxp
    t_ex2 = getattr(_inverse_d(ring_cfg.frac, d)[0], "shift", _inverse_d(ring_cfg.frac, d)[0])
    stats = arith.cost_mul_many(np.concatenate([np.full(rows, t_ex2),
                                                np.full(rows * d, ring_cfg.frac)]),
                                0, ring_cfg.trunc)
    return (stats + fxp.cost_sqrt_inv(rows, ring_cfg, span=span)
            + arith.cost_mul(rows * d, ring_cfg, not wide))


@profiled
def layernorm(p: Party, x: AShare, gamma: AShare, beta: AShare, eps: float,
              span=None, wide: bool = False) -> AShare:
    """``span``: octaves bounding var + eps (:func:`mpc3.kernels.fxp.sqrt_inv_a`; None: its
    whole range). ``wide``: the output at 2 frac fractional bits, its last product reshared
    untruncated (one round fewer: an output the query user truncates itself, :func:`widen`)."""
    if p.checks is not None:                  # malicious mode: maybe in row blocks
        from mpc3.checks import in_blocks
        return in_blocks(p, lambda q, v: _layernorm(q, v, gamma, beta, eps, span, wide), x)
    return _layernorm(p, x, gamma, beta, eps, span, wide)


def _layernorm(p: Party, x: AShare, gamma: AShare, beta: AShare, eps: float,
               span=None, wide: bool = False) -> AShare:
    from mpc3.kernels import fxp
    xg, var = _stats(p, x, gamma, beta, eps)
    rs = fxp.sqrt_inv_a(p, var, span=span, site="var_eps")
    y = arith.mul_aa(p, xg, _bcast(rs.reshape(*rs.shape, 1), x.shape), trunc=not wide,
                     site="scale")
    return y + _bcast(widen(p, beta) if wide else beta, x.shape)


def widen(p: Party, x: AShare) -> AShare:
    """x at frac fractional bits -> the same value at 2 frac (local, exact)."""
    return x.scale(np.uint64(1 << p.cfg.frac))


@profiled
def layernorm_project(p: Party, x: AShare, gamma: AShare, beta: AShare, eps: float,
                      mats: list[tuple[AShare, int]], want_y: bool = True, split=(),
                      split_biases=None, span=None, sites=None):
    """LayerNorm fused with the linear layer that reads its output: returns
    ``(y, outs, z)`` with ``y = LN(x)`` (None unless ``want_y``) and
    ``outs[i] = LN(x) W_i - beta W_i`` for i not in ``split``; the outputs of the mats in
    ``split`` (indices, in order) feed only relu_a and come, plus ``split_biases`` (one per
    split mat, broadcast over its rows, or None), as one split share ``z`` of their
    flattened values (arith.mul_split_aa: 8 bytes per element less, and on few elements
    their sign taken in the same rounds; ``outs[i]`` None), z None without ``split``.

    With xg = (x - mu) * gamma and rs = 1/sqrt(var + eps), LN(x) W = (xg W) rs + beta W: the
    products ``xg W_i`` (truncated by ``bits_i``, ``mats = [(W_i, bits_i)]``) run in the
    rounds of sqrt_inv (in lockstep, :func:`mpc3.kernels.base.run_steps`), and one round of
    products then
    scales xg and every ``xg W_i`` by rs. The caller adds ``beta W_i`` (a constant of the
    model, formed once per session). Cost: :func:`cost_layernorm_project` - the rounds of a
    LayerNorm alone; the bytes of the products plus those of the extra ``rs`` scalings.
    ``span``: as :func:`layernorm`'s; ``sites``: the calibration site of each mat's product
    (their scalings by rs: ``lnscale``).
    """
    from mpc3.kernels import fxp
    from mpc3.kernels.base import run_steps
    xg, var = _stats(p, x, gamma, beta, eps)
    rs, prods = run_steps(p, fxp.sqrt_inv_steps(p, var, span=span, site="var_eps"),
                          arith.mul_many_steps(p, [(xg, w, "matmul", bits) for w, bits in mats],
                                               sites))
    rs = rs.reshape(*rs.shape, 1)
    keep = [i for i in range(len(mats)) if i not in split]
    items = ([xg] if want_y else []) + [prods[i] for i in keep]
    scaled = [(t, _bcast(rs, t.shape), "mul") for t in items]
    sitems = [(prods[i], _bcast(rs, prods[i].shape), "mul") for i in split]
    names = (["scale"] if want_y else []) + ["lnscale"] * len(keep)
    if sitems:                     # one call: the split products and the others, completed
        z, out = arith.mul_split_aa(p, sitems, replicated=scaled, biases=split_biases,
                                    sites=["lnscale"] * len(sitems) + names)
    else:
        out, z = arith.mul_many_aa(p, [item + (True,) for item in scaled], names), None
    y = out.pop(0) + _bcast(beta, x.shape) if want_y else None
    outs = [None] * len(mats)
    for i, o in zip(keep, out):
        outs[i] = o
    return y, outs, z


def _cost_stats(ring_cfg, rows: int, d: int) -> Cost:
    t_ex2, t_mu2, t_xg = (getattr(t, "shift", t) for t in _inverse_d(ring_cfg.frac, d))
    shifts = np.concatenate([np.full(rows, t_ex2), np.full(rows, t_mu2),
                             np.full(rows * d, t_xg)])
    return arith.cost_mul_many(shifts, 0, ring_cfg.trunc)


def cost_layernorm(ring_cfg, rows: int, d: int, span=None, wide: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`layernorm` on ``rows`` rows of width d."""
    from mpc3.kernels import fxp
    return (_cost_stats(ring_cfg, rows, d) + fxp.cost_sqrt_inv(rows, ring_cfg, span=span)
            + arith.cost_mul(rows * d, ring_cfg, not wide))


def cost_layernorm_project(ring_cfg, rows: int, d: int, outs: list[tuple[int, int]],
                           want_y: bool = True, split=(), span=None) -> Cost:
    """:func:`layernorm_project` on ``rows`` rows; ``outs = [(width_i, bits_i)]``."""
    from mpc3.kernels import fxp
    prods = arith.cost_mul_many(np.concatenate([np.full(rows * n, bits) for n, bits in outs]),
                                0, ring_cfg.trunc)
    scaled = rows * (d * want_y + sum(n for i, (n, _) in enumerate(outs) if i not in split))
    last = arith.cost_mul(scaled, ring_cfg)
    if split:
        last = arith.cost_mul_split(rows * sum(outs[i][0] for i in split), ring_cfg,
                                    n_rep=scaled)
    return (_cost_stats(ring_cfg, rows, d)
            + Cost.parallel(fxp.cost_sqrt_inv(rows, ring_cfg, span=span), prods) + last)
