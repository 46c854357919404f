"""Secure encoder stack (Privformer Alg. 8 with the residual connections it omits).

Post-LN (Vaswani, ``cfg.norm_first=False``)::  x = LN1(x + MHA(x)); x = LN2(x + FFN(x))
Pre-LN (``norm_first=True``)::  x = x + MHA(LN1(x)); x = x + FFN(LN2(x)); final LN at the end.
Exactly :func:`protocols.model.ref_encoder` on shares; residual additions are local. "LN" is
the model's normalization (``cfg.norm``, :func:`protocols.layers.norms.norm`).
"""
from __future__ import annotations

from typing import Callable

from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers.ffn import cost_ffn, ffn
from protocols.layers.mha import cost_mha, mha
from protocols.layers.norms import cost_norm, norm
from protocols.layers.secure_model import sub


def _ln(p, cfg, shares, prefix, x):
    return norm(p, cfg, shares, prefix, x)


def encoder_layer(p: Party, cfg: M.ModelConfig, shares: dict, i: int, x: AShare,
                  order: str = "auto") -> AShare:
    pre = f"enc.{i}"
    wa, wf = sub(shares, f"{pre}.attn"), sub(shares, f"{pre}.ffn")
    pa, pf = p.at(f"{pre}.attn"), p.at(f"{pre}.ffn")      # (a shadow party's scopes)
    if cfg.norm_first:
        x = x + mha(pa, cfg, wa, _ln(p, cfg, shares, f"{pre}.ln1", x), order=order)
        return x + ffn(pf, wf, _ln(p, cfg, shares, f"{pre}.ln2", x), cfg.ffn_act)
    x = _ln(p, cfg, shares, f"{pre}.ln1", x + mha(pa, cfg, wa, x, order=order))
    return _ln(p, cfg, shares, f"{pre}.ln2", x + ffn(pf, wf, x, cfg.ffn_act))


def encoder(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare, order: str = "auto",
            layers: int | None = None,
            on_layer: Callable[[str], None] | None = None) -> AShare:
    """x (B, S, d) -> encoder output (B, S, d); ``layers`` runs only the first few (benchmarks).
    ``on_layer(name)`` is called after each layer (``enc.i``, ``enc.final_ln``), e.g. to mark
    per-layer traffic (:class:`protocols.jobs.CostRecorder`)."""
    if len(x.shape) != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"encoder input must be (B, S, {cfg.d_model}), got {x.shape}")
    mark = on_layer or (lambda name: None)
    n = cfg.n_enc_layers if layers is None else layers
    for i in range(n):
        x = encoder_layer(p, cfg, shares, i, x, order=order)
        mark(f"enc.{i}")
    if cfg.norm_first:
        x = _ln(p, cfg, shares, "enc.final_ln", x)
        mark("enc.final_ln")
    return x


def cost_encoder(p_cfg, cfg: M.ModelConfig, B: int, S: int, folded: bool = True) -> Cost:
    """Declared rounds and bytes per party of :func:`encoder` (the automatic attention
    order) on B inputs of S positions."""
    rows, d = B * S, cfg.d_model
    layer = (cost_mha(p_cfg, cfg, B, S, folded=folded) + cost_norm(p_cfg, cfg, rows)
             + cost_ffn(p_cfg, rows, d, cfg.d_ff, cfg.ffn_act) + cost_norm(p_cfg, cfg, rows))
    cost = Cost(0, (0, 0, 0))
    for _ in range(cfg.n_enc_layers):
        cost = cost + layer
    return cost + cost_norm(p_cfg, cfg, rows) if cfg.norm_first else cost
