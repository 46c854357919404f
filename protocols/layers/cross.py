"""The decoder's cross attention (Privformer Alg. 8, its encoder-decoder half): the encoder
output's K' (or K), V - and K'^T V - for every decoder layer, computed once per sequence or
decode session (:func:`cross_precompute`), and the attention of decoder rows against them
(:func:`cross_mha`). With Omega folded the Performer's K' and Q' come from the products'
split form (:func:`protocols.layers.attention.relu_products`), V's products in the same rounds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare
from protocols import model as M

from . import attention as A
from .attention import row_scale_trunc
from .mha import (
    add_bias,
    cost_features,
    cost_project,
    cost_project_features,
    features,
    finish,
    heads,
    project,
    project_features,
    split_heads,
)
from .secure_model import PROJ_EXTRA, sub


@dataclass
class CrossKV:
    kf: AShare           # (B, h, S, r) K' of the encoder output (softmax-style: K, (B,h,S,dh))
    v: AShare            # (B, h, S, dh)
    kv: AShare | None    # (B, h, r, dh) K'^T V, when the kv order is used (Performer only)


def cross_precompute(p: Party, cfg: M.ModelConfig, shares: dict, enc: AShare,
                     need_kv: bool = True, kv_scale: float | None = None,
                     layers: list[int] | None = None) -> list[CrossKV]:
    """K', V (and K'^T V, times the public ``kv_scale`` in its truncation when given) of
    every decoder layer's cross attention (``layers``: of those): 3-4 kernel calls in all;
    softmax-style attention: K and V (one product call). A shadow party (the calibration)
    runs the layers one by one, filing each layer's values under it."""
    layers = list(range(cfg.n_dec_layers)) if layers is None else layers
    L, h = len(layers), cfg.n_heads
    if L == 0:
        return []
    if p.shadow is not None:
        if L > 1:
            return [cross_precompute(p, cfg, shares, enc, need_kv, kv_scale, [i])[0]
                    for i in layers]
        p = p.at(f"dec.{layers[0]}.cross")
    ws = [sub(shares, f"dec.{i}.cross") for i in layers]
    if cfg.attention == M.PERFORMER and "omega" not in ws[0]:
        kf, vs = _cross_features(p, cfg, ws, enc)
        return _with_kv(p, kf, vs, need_kv, kv_scale)
    wcat = AShare.concat([AShare.concat([w["wk_proj"], w["wv_c"]], axis=1) for w in ws], axis=1)
    y = arith.matmul_aa(p, enc, wcat, trunc=p.cfg.frac + PROJ_EXTRA, site="proj")
    if "bk" in ws[0]:                                  # attention biases: local
        bcat = AShare.concat([AShare.concat([w["bk"], w["bv"]], axis=0) for w in ws], axis=0)
        y = add_bias(y, {"b": bcat}, "b")
    nk, d = ws[0]["wk_proj"].shape[1], cfg.d_model
    ks, vs = [], []
    for i in range(L):
        base = i * (nk + d)
        ks.append(split_heads(y[..., base:base + nk], h))
        vs.append(split_heads(y[..., base + nk:base + nk + d], h))
    if cfg.attention != M.PERFORMER:
        return [CrossKV(ks[i], vs[i], None) for i in range(L)]
    kst = _stack(ks)                                                      # (L,B,h,S,.)
    if "omega" in ws[0]:
        om = AShare(np.stack([w["omega"].a for w in ws])[:, None],
                    np.stack([w["omega"].b for w in ws])[:, None])         # (L,1,h,dh,r)
        kst = arith.matmul_aa(p, kst, om, site="omega")
    return _with_kv(p, A.relu_many(p, [kst], "features")[0], vs, need_kv, kv_scale)


def _with_kv(p: Party, kf: AShare, vs: list[AShare], need_kv: bool,
             kv_scale: float | None) -> list[CrossKV]:
    """The layers' CrossKV from K' stacked (L,B,h,S,r) and V per layer, with K'^T V (one
    product for all layers, times ``kv_scale``) when ``need_kv``."""
    kv = None
    if need_kv:
        vst = _stack(vs)
        trunc = True if kv_scale is None else row_scale_trunc(kv_scale, p.cfg.frac)
        kv = arith.matmul_aa(p, kf.T, vst, trunc, site="kv")
    return [CrossKV(kf[i], vs[i], None if kv is None else kv[i]) for i in range(len(vs))]


def _stack(xs: list[AShare]) -> AShare:
    return AShare(np.stack([x.a for x in xs]), np.stack([x.b for x in xs]))


@profiled
def _cross_features(p: Party, cfg: M.ModelConfig, ws: list[dict], enc: AShare):
    """cross_precompute's K' (stacked) and V (per layer), Omega folded: every layer's
    K' = ReLU(enc W^K Omega + b_k) from the products' split form (attention.relu_products),
    V's products in the same rounds."""
    h, bits = cfg.n_heads, p.cfg.frac + PROJ_EXTRA
    kfs, (y,) = A.relu_products(p, [(enc, w["wk_proj"], w.get("bk")) for w in ws], bits,
                                plain=[(enc, AShare.concat([w["wv_c"] for w in ws], axis=1))],
                                site="proj", relu_site="features")
    if "bv" in ws[0]:
        y = add_bias(y, {"b": AShare.concat([w["bv"] for w in ws], axis=0)}, "b")
    d = cfg.d_model
    vs = [split_heads(y[..., i * d:(i + 1) * d], h) for i in range(len(ws))]
    return _stack([split_heads(k, h) for k in kfs]), vs


def cost_cross_precompute(p_cfg, cfg: M.ModelConfig, B: int, S: int, folded: bool = True,
                          need_kv: bool = True, kv_scaled: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`cross_precompute` on B encoder outputs of
    S positions (Omega folded into W^K unless ``folded`` is False; ``kv_scaled``: called with
    a ``kv_scale``, whose truncation is wider)."""
    L, h, r, dh, d = cfg.n_dec_layers, cfg.n_heads, cfg.n_features, cfg.d_head, cfg.d_model
    if L == 0:
        return Cost(0, (0, 0, 0))
    if cfg.attention != M.PERFORMER:
        return cost_project(p_cfg, B * S * L * 2 * d)
    if folded:
        cost = cost_project_features(p_cfg, L * B * h * S * r, B * S * L * d)
    else:
        cost = cost_project(p_cfg, B * S * L * 2 * d) + cost_features(p_cfg, L * B * h * S * r,
                                                                      folded)
    if need_kv:
        bits = row_scale_trunc(1.0, p_cfg.frac).shift if kv_scaled else True
        cost = cost + arith.cost_mul(L * B * h * r * dh, p_cfg, bits)
    return cost


def cross_mha(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, ckv: CrossKV,
              order: str = "kv") -> AShare:
    if cfg.attention == M.PERFORMER and "omega" not in w:
        qf = project_features(p, cfg, w, xq, None, want_kv=False)[0]
    else:
        q, _, _ = project(p, cfg, w, xq, None, want_q=True, want_kv=False)
        if cfg.attention != M.PERFORMER:
            return finish(p, cfg, w, heads(p, M.head_kind(cfg), q, ckv.kf, ckv.v), None)
        qf, _ = features(p, cfg, w, q, None)
    if order == "kv" and ckv.kv is not None:
        o = arith.matmul_aa(p, qf, ckv.kv, site="out")
    else:
        o = A.relu_attention(p, qf, ckv.kf, ckv.v, order="qk")
    return finish(p, cfg, w, o, np.full(qf.shape[2], ckv.kf.shape[2]))
