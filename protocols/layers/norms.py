"""Secure normalization of a model (``ModelConfig.norm``): one entry point for the stacks.

* ``layernorm``: :func:`protocols.layers.layernorm.layernorm` (leak-free inverse square root;
  :func:`protocols.layers.layernorm.cost_layernorm`: 11 rounds for <= 16 rows, 19 beyond, d = 2^k);
* ``rmsnorm`` (LLaMA-family): :func:`protocols.layers.layernorm.rmsnorm`, LayerNorm's rounds
  without the mean (:func:`protocols.layers.layernorm.cost_rmsnorm`);
* ``none``: the identity (AERO's softmax-only block): no tensors, 0 rounds, 0 bytes;
* ``batchnorm`` (seed 002 Sec. 4.2, its vision transformers): BatchNorm with running
  statistics is, at inference, the per-channel affine map ``y = x * a + b`` with
  ``a = gamma / sqrt(var + eps)`` and ``b = beta - mean * a``. The model owner folds the
  statistics into ``a``, ``b`` before sharing (:func:`protocols.model.batchnorm_affine`;
  shares ``p.scale``, ``p.shift``), so no inverse square root runs on shares. ``a`` is a
  secret weight, so ``x * a`` is one secret product, :func:`arith.cost_mul` of rows*d
  elements with its truncation (exact: 2 rounds, 30.76 B per element, the three parties
  together; probabilistic: 1 round, 24 B); ``+ b`` is local. It would cost 0 rounds only
  folded into the next linear layer, which mpc3 does not do (post-norm needs ``y`` itself
  as the residual stream, and the decode steps' fusions are LayerNorm's).

Range (checked by :mod:`protocols.calibration.calibrate`, site ``bn``): the product ``x * a`` below
``arith.product_limit`` (2^26 real).
"""
from __future__ import annotations

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare
from protocols import model as M

from .layernorm import _bcast, cost_layernorm, cost_rmsnorm, layernorm, rmsnorm, widen


@profiled
def batchnorm(p: Party, x: AShare, scale: AShare, shift: AShare, wide: bool = False) -> AShare:
    """x (..., d) * scale + shift, per channel; one truncated product (:func:`cost_batchnorm`;
    ``wide``: untruncated, at 2 frac fractional bits, as :func:`norm`'s)."""
    d = x.shape[-1]
    if scale.shape != (d,) or shift.shape != (d,):
        raise ValueError(f"batchnorm: scale/shift must have shape ({d},)")
    return arith.mul_aa(p, x, _bcast(scale, x.shape), trunc=not wide, site="bn") \
        + _bcast(widen(p, shift) if wide else shift, x.shape)


def cost_batchnorm(ring_cfg, rows: int, d: int, wide: bool = False) -> Cost:
    return arith.cost_mul(rows * d, ring_cfg, not wide)


def norm(p: Party, cfg: M.ModelConfig, shares: dict, prefix: str, x: AShare,
         span=None, wide: bool = False, gain: int = 0) -> AShare:
    """The model's normalization at ``prefix`` (``enc.0.ln1``, ``dec.final_ln`` ...) of x;
    ``span``: a LayerNorm's calibrated variance octaves
    (:func:`protocols.layers.layernorm.layernorm`); ``wide``: the output at 2 frac fractional bits,
    its last product untruncated (one round fewer; a model output the query user truncates after
    reconstructing it); ``gain``: an RMSNorm's calibrated input scale (:func:`rmsnorm`)."""
    p = p.at(prefix)                 # a shadow party files its records under the prefix
    if cfg.norm == "none":
        return widen(p, x) if wide else x
    if cfg.norm == "batchnorm":
        return batchnorm(p, x, shares[f"{prefix}.scale"], shares[f"{prefix}.shift"], wide)
    if cfg.norm == "rmsnorm":
        return rmsnorm(p, x, shares[f"{prefix}.gamma"], cfg.ln_eps, span, wide, gain)
    return layernorm(p, x, shares[f"{prefix}.gamma"], shares[f"{prefix}.beta"], cfg.ln_eps,
                     span, wide)


def cost_norm(ring_cfg, cfg: M.ModelConfig, rows: int, span=None, wide: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`norm` on ``rows`` rows of width d."""
    if cfg.norm == "none":
        return Cost(0, (0, 0, 0))
    if cfg.norm == "batchnorm":
        return cost_batchnorm(ring_cfg, rows, cfg.d_model, wide)
    if cfg.norm == "rmsnorm":
        return cost_rmsnorm(ring_cfg, rows, cfg.d_model, span, wide)
    return cost_layernorm(ring_cfg, rows, cfg.d_model, span, wide)
