"""Secure sentence embedding of a headless encoder (``arch = "encoder"``: BertModel,
sentence-transformers); exactly :func:`protocols.model.ref_embed` on shares.

For an embedded input x (B, S, d) shared by the query user:

1. the secure encoder (:func:`protocols.stacks.encoder.encoder`; final LayerNorm when norm_first);
2. pooling of the S positions (``cfg.pool``, sentence-transformers' pooling modes):

   * ``cls``: the first ([CLS]) row, a local slice (no communication);
   * ``mean``: the sum over the positions is local; without ``normalize`` one standalone
     truncation multiplies it by the public 1/S (a *scaled* truncation,
     :func:`mpc3.kernels.truncation.scaled`, ROW_SCALE_EXTRA bits more than the value's
     frac - as :func:`protocols.layers.mha.row_scale_trunc` carries a classifier's 1/S); with
     ``normalize`` the 1/S is never applied: sum / ||sum|| = mean / ||mean|| exactly;
   * ``max``: per coordinate, the maximum over the positions
     (:func:`mpc3.kernels.extrema.max_rows_a`: a ReLU tournament, every pair of every
     coordinate in one call per level: ceil(log2 S) levels of 4 rounds);

3. with ``normalize`` (sentence-transformers' Normalize: e / max(||e||, 1e-12)), three
   kernel calls on the pooled e (B, d):

   * ``n2 = sum_k e_k^2 / 4^K``: one matmul of each row with itself (B outputs), the public
     4^-K a larger shift of its truncation (frac + 2K bits, a power of two: exact);
   * ``r = sqrt_inv_a(n2)`` (B inputs: the 1/16-octave table, no Newton step, for B <= 16);
   * ``e * r / 2^K``: one product of B d outputs truncated by frac + K bits.

   2^K = :func:`norm_scale` ~ sqrt(d) (times S for the undivided mean sum) keeps n2 near the
   mean square of the pooled coordinates, inside sqrt_inv's range [2^-12, 2^16] for any
   LayerNorm-scale row, whatever d and S; the result is e / ||e|| whatever K (it cancels).

Cost: :func:`cost_embed_sentence` (equal to the measured traffic,
``tests/protocols/stacks/test_sentence.py``).

Ranges (checked by :mod:`protocols.calibration.calibrate` at layer ``pool``): ``pool_max`` - the
spread max - min over the positions of each coordinate, which bounds every difference the
max tournament compares, below ``convert.relu_limit``; ``norm_sumsq`` - the
squared norm of e before its 4^-K (a product), below ``arith.product_limit``; ``norm_sq`` -
n2 inside fxp.SQRT_INV_RANGE (both ends: an embedding of norm below ~2^-6 sqrt(d) would
leave it); ``norm_scale`` - e_k r, at most 2^K. The mean's truncation is exact for |sum| <
2^44, beyond any sum of LayerNorm-scale rows.

Error (frac = 18): pooling adds at most 1 ulp (mean) or 2^-12 per tournament level (ReLU's
error region, max); normalize is e / ||e|| times (1 + delta) with |delta| <= 2.5e-4 +
2^-17 (1 / n2 + sqrt(n2)) (sqrt_inv's fast table, n2's truncation, sqrt_inv's 2 ulp; n2 near
1 by the choice of K: ~2.6e-4), plus 1 ulp per coordinate - a common scale of the whole row,
which leaves its direction (the cosine similarity) unchanged.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from mpc3.kernels import arith, checked, extrema, fxp, truncation
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers.attention import ROW_SCALE_EXTRA

from .encoder import cost_encoder, encoder


def norm_scale(d: int, S: int, pool: str) -> int:
    """K with 2^K ~ sqrt(d) (times S for mean pooling, whose sum is never divided by S
    when normalized): n2 = ||e||^2 / 4^K is then about the mean square of the pooled
    coordinates - LayerNorm scale, the middle of sqrt_inv's range."""
    return max(0, round(math.log2(math.sqrt(d) * (S if pool == "mean" else 1))))


def mean_trunc(S: int, frac: int) -> truncation.Scaled:
    """The standalone truncation that multiplies a value of ``frac`` fractional bits by the
    public 1/S: the multiplier round(2^(frac + ROW_SCALE_EXTRA) / S) and as many bits of
    shift (relative error of 1/S at most S 2^-(frac + ROW_SCALE_EXTRA + 1))."""
    return truncation.scaled(1.0 / S, 0, frac + ROW_SCALE_EXTRA)


def max_pool_a(p: Party, h: AShare) -> AShare:
    """Per coordinate maximum over the positions: h (B, S, d) -> (B, d), the rows of
    (B, d, S) through :func:`mpc3.kernels.extrema.max_rows_a`. Cost: :func:`cost_max_pool`."""
    B, S, d = h.shape
    rows = AShare(np.ascontiguousarray(h.a.transpose(0, 2, 1)).reshape(-1),
                  np.ascontiguousarray(h.b.transpose(0, 2, 1)).reshape(-1))
    return extrema.max_rows_a(p, rows, np.full(B * d, S), site="pool_max").reshape(B, d)


def cost_max_pool(p_cfg, B: int, S: int, d: int) -> Cost:
    return extrema.cost_max_rows(np.full(B * d, S), p_cfg)


@profiled
def pool_a(p: Party, cfg: M.ModelConfig, h: AShare) -> AShare:
    """``cfg.pool`` of the encoder output h (B, S, d) -> (B, d); the mean's 1/S is left out
    when ``cfg.normalize`` (it cancels). Cost: :func:`cost_pool`."""
    if cfg.pool == "cls":
        return AShare(np.ascontiguousarray(h.a[:, 0]), np.ascontiguousarray(h.b[:, 0]))
    if cfg.pool == "max":
        return max_pool_a(p, h)
    s = AShare(h.a.sum(axis=1, dtype=np.uint64), h.b.sum(axis=1, dtype=np.uint64))
    if cfg.normalize:
        return s
    t = mean_trunc(h.shape[1], p.cfg.frac)
    if p.checks is not None:                 # malicious mode: the verified scaled route
        return checked.trunc_scaled(p, s, t)
    p.new_op()
    flat = AShare(s.a.reshape(-1), s.b.reshape(-1))
    return truncation.trunc_split(p, flat, t.shift, from_rss=True,
                                  mult=t.mult).reshape(s.shape)


def cost_pool(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    d = cfg.d_model
    if cfg.pool == "cls" or (cfg.pool == "mean" and cfg.normalize):
        return Cost(0, (0, 0, 0))
    if cfg.pool == "max":
        return cost_max_pool(p_cfg, B, S, d)
    return truncation.cost_trunc(B * d, p_cfg, mean_trunc(S, p_cfg.frac).shift)


@profiled
def normalize_a(p: Party, e: AShare, K: int) -> AShare:
    """e / ||e|| per row of e (B, d), with n2 = ||e||^2 / 4^K handed to sqrt_inv_a (the
    module docstring). Cost: :func:`cost_normalize`."""
    B, d = e.shape
    f = p.cfg.frac
    n2 = arith.matmul_aa(p, e.reshape(B, 1, d), e.reshape(B, d, 1), f + 2 * K,
                         site="norm_sumsq")
    r = fxp.sqrt_inv_a(p, n2.reshape(B, 1), site="norm_sq")
    rb = AShare(np.ascontiguousarray(np.broadcast_to(r.a, (B, d))),
                np.ascontiguousarray(np.broadcast_to(r.b, (B, d))))
    return arith.mul_aa(p, e, rb, f + K, site="norm_scale")


def cost_normalize(p_cfg, B: int, d: int, K: int) -> Cost:
    f = p_cfg.frac
    return (arith.cost_mul(B, p_cfg, f + 2 * K) + fxp.cost_sqrt_inv(B, p_cfg)
            + arith.cost_mul(B * d, p_cfg, f + K))


def embed_sentence(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare,
                   on_layer: Callable[[str], None] | None = None) -> AShare:
    """x (B, S, d) embedded input -> sentence embeddings (B, d) == model.ref_embed.
    ``on_layer`` marks ``enc.i`` (and ``enc.final_ln``), ``pool`` and, with normalize,
    ``normalize``."""
    if cfg.arch != M.ENCODER:
        raise ValueError(f"embed_sentence needs a headless encoder (arch {M.ENCODER!r}), "
                         f"got arch {cfg.arch!r}")
    mark = on_layer or (lambda name: None)
    h = encoder(p, cfg, shares, x, on_layer=on_layer)
    e = pool_a(p.at("pool"), cfg, h)
    mark("pool")
    if not cfg.normalize:
        return e
    out = normalize_a(p.at("pool"), e, norm_scale(cfg.d_model, x.shape[1], cfg.pool))
    mark("normalize")
    return out


def cost_embed_sentence(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    """Declared rounds and bytes per party of :func:`embed_sentence` (folded shares, the
    encoder's automatic attention order) on B inputs of S positions."""
    cost = cost_encoder(p_cfg, cfg, B, S) + cost_pool(p_cfg, cfg, B, S)
    if cfg.normalize:
        cost = cost + cost_normalize(p_cfg, B, cfg.d_model,
                                     norm_scale(cfg.d_model, S, cfg.pool))
    return cost
