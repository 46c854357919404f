"""Named model presets: config transformations that select a seed paper's block.

:func:`aero` - AERO's softmax-only block (seed 001, Sec. 4.1-4.2, "SM + FuFFN"):

* no LayerNorm: ``norm = "none"`` (the identity; no tensors, 0 rounds);
* no FFN nonlinearity: ``ffn_act = "none"``;
* the FFN fused into one matrix: with no nonlinearity, FFN(x) = x W1 W2 + (b1 W2 + b2)
  exactly, and :mod:`protocols.layers.secure_model` shares it so (``w1`` = W1 W2 (d, d), ``b1`` =
  b1 W2 + b2): one product of d outputs per row instead of d_ff + d, one round fewer
  (:func:`protocols.layers.ffn.ffn`) - on every config with ``ffn_act`` none, not only this preset;
* softmax attention (the softmax is the block's only nonlinearity), unless ``attention``
  says otherwise.

Also selectable on top of the preset (config keys, decoder-only, exact and cheap):

* ``ffn_scale`` (AERO Eq. 6, x_out = beta x_SA + FFN(x_SA) / alpha, per-layer alpha, beta):
  folded into the weights by :func:`protocols.model.fold_ffn_scales` - one product of the
  returned row by the product of the betas, instead of a product per layer;
* ``ffn_pruned`` = x (AERO's ScFuFFN_x): the deepest x layers have no FFN (identity): their
  FFN product is saved.

Not implemented: weight or spectral normalization of the FFN weights (training-time
reparameterizations: the trained W is what mpc3 receives) and the entropy regularization
(a training loss).
"""
from __future__ import annotations

from dataclasses import replace

from .config import ModelConfig

#: the presets by name (``--preset NAME`` of config builders)
PRESETS = ("aero",)


def aero(cfg: ModelConfig, attention: str | None = "softmax", scale: bool = False,
         pruned: int = 0) -> ModelConfig:
    """``cfg`` with AERO's softmax-only block (module docstring); ``attention`` None keeps
    ``cfg.attention``; ``scale`` / ``pruned``: ``ffn_scale`` / ``ffn_pruned`` (decoder-only)."""
    att = cfg.attention if attention is None else attention
    return replace(cfg, norm="none", ffn_act="none", attention=att, ffn_scale=scale,
                   ffn_pruned=pruned).validate()


def apply_preset(cfg: ModelConfig, name: str) -> ModelConfig:
    """``cfg`` with the preset ``name`` (one of :data:`PRESETS`)."""
    if name == "aero":
        return aero(cfg)
    raise ValueError(f"unknown preset {name!r} (one of {PRESETS})")
