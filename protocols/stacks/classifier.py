"""Secure encoder classifier (BERT-style, ``arch = "encoder-classifier"``) and a secure
arg-max; exactly :func:`protocols.model.ref_classify` on shares.

Steps, for an embedded input x (B, S, d) shared by the query user:

1. the secure encoder (:func:`protocols.stacks.encoder.encoder`; final LayerNorm when norm_first);
2. pooling and head in two rounds: the sum over the S positions is local, ``z = (sum_s h_s)
   @ head.w`` is one matmul (B*C outputs truncated) whose truncation also scales by the
   public 1/S (:func:`protocols.layers.mha.row_scale_trunc`, ROW_SCALE_EXTRA bits) - scaling the
   B*C logits rather than the B*d pooled rows; ``head.b`` is added locally. With ``pool``
   ``cls-tanh`` (BERT): the first row, ``tanh(h_0 @ pool.w + pool.b)`` (one matmul and
   :func:`mpc3.kernels.activations.tanh_a`), then the head (one matmul);
3. optionally (the ``classify_argmax`` job) the arg-max class on shares,
   :func:`protocols.layers.vocab.argmax_a`, so only the index is revealed.

Ranges (checked by :mod:`protocols.calibration.calibrate` at sites ``head``, ``argmax``):
|sum_s h_s @ head.w| below ``arith.product_limit``; logit differences below
``convert.relu_limit``. The arg-max of logits closer than 2^-12 (DReLU's error region) may
come out either way.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers.attention import row_scale_trunc
from protocols.layers.ffn import cost_ffn
from protocols.layers.mha import cost_mha
from protocols.layers.norms import cost_norm

from .encoder import encoder


def _add_row(x: AShare, b: AShare) -> AShare:
    return x + AShare(np.broadcast_to(b.a, x.shape).copy(), np.broadcast_to(b.b, x.shape).copy())


def pool_head(p: Party, cfg: M.ModelConfig, shares: dict, h: AShare) -> AShare:
    """Pooling (``cfg.pool``), then the head: h (B, S, d) -> logits (B, n_classes).
    Cost: :func:`cost_pool_head`."""
    if cfg.pool == "cls-tanh":
        return cls_tanh_head(p, shares, h)
    S = h.shape[1]
    s = AShare(h.a.sum(axis=1, dtype=np.uint64), h.b.sum(axis=1, dtype=np.uint64))
    logits = arith.matmul_aa(p, s, shares["head.w"], row_scale_trunc(1.0 / S, p.cfg.frac),
                             site="head")
    return _add_row(logits, shares["head.b"])


def cls_tanh_head(p: Party, shares: dict, h: AShare) -> AShare:
    """BERT's pooler and head: tanh(h[:, 0] @ pool.w + pool.b) @ head.w + head.b. The first
    ([CLS]) row is a local slice; two matmuls and one tanh_a (|pre-activation| <=
    activations.TANH_LIMIT, calibration site ``tanh``)."""
    from mpc3.kernels import activations
    cls = AShare(np.ascontiguousarray(h.a[:, 0]), np.ascontiguousarray(h.b[:, 0]))
    z = _add_row(arith.matmul_aa(p, cls, shares["pool.w"], site="pool_dense"), shares["pool.b"])
    return _add_row(arith.matmul_aa(p, activations.tanh_a(p, z, site="tanh"), shares["head.w"],
                                    site="head"), shares["head.b"])


def cost_pool_head(p_cfg, B: int, n_classes: int, pool: str = "mean", d: int = 0) -> Cost:
    """:func:`pool_head` on B rows (``d``: model width, for ``pool`` cls-tanh)."""
    if pool == "cls-tanh":
        from mpc3.kernels import activations
        return (arith.cost_mul(B * d, p_cfg) + activations.cost_tanh(B * d, p_cfg)
                + arith.cost_mul(B * n_classes, p_cfg))
    return arith.cost_mul(B * n_classes, p_cfg, row_scale_trunc(1.0, p_cfg.frac).shift)


def classify(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare,
             on_layer: Callable[[str], None] | None = None) -> AShare:
    """x (B, S, d) embedded input -> logits (B, n_classes) == model.ref_classify."""
    if cfg.arch != M.ENCODER_CLASSIFIER:
        raise ValueError(f"classify needs an encoder-classifier model, got arch {cfg.arch!r}")
    h = encoder(p, cfg, shares, x, on_layer=on_layer)
    out = pool_head(p.at("head"), cfg, shares, h)
    if on_layer is not None:
        on_layer("head")
    return out


def cost_classify(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    """Declared rounds and bytes per party of :func:`classify` (folded Omega, the encoder's
    automatic attention order) on B inputs of S positions."""
    rows, d = B * S, cfg.d_model
    layer = (cost_mha(p_cfg, cfg, B, S) + cost_norm(p_cfg, cfg, rows)
             + cost_ffn(p_cfg, rows, d, cfg.d_ff, cfg.ffn_act) + cost_norm(p_cfg, cfg, rows))
    cost = Cost(0, (0, 0, 0))
    for _ in range(cfg.n_enc_layers):
        cost = cost + layer
    if cfg.norm_first:
        cost = cost + cost_norm(p_cfg, cfg, rows)
    return cost + cost_pool_head(p_cfg, B, cfg.n_classes, cfg.pool, d)
