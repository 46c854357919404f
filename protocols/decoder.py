"""Secure decoder stack (Privformer Alg. 9 done right) and incremental decoding.

Per layer (post-LN; pre-LN analogous, see :func:`protocols.model.ref_decoder`)::

    x = LN1(x + MaskedMHA(x));  x = LN2(x + MHA(x, enc_out));  x = LN3(x + FFN(x))

Cross attention: K and V depend on the encoder output only, so K' and V (and K'^T V) of all
layers are computed once, in one kernel call per step for all layers (:func:`cross_precompute`).

Incremental decoding (:class:`DecodeState`, :func:`decoder_step`): per layer and head the
secret running sum G = sum_j K'_j^T V_j of the masked self attention (plus a bounded cache of
the newest K', V rows, folded into G every ``block`` tokens) and the cross attention K'^T V;
a new token costs O(1) in the prefix length (Eq. 15).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare

from . import attention as A
from . import model as M
from .ffn import cost_ffn, ffn
from .layernorm import cost_layernorm, layernorm
from .mha import (add_bias, cost_features, cost_finish, cost_project, features, finish, mha,
                  project, split_heads)
from .secure_model import PROJ_EXTRA, sub


@dataclass
class CrossKV:
    kf: AShare           # (B, h, S, r) K' of the encoder output
    v: AShare            # (B, h, S, dh)
    kv: AShare | None    # (B, h, r, dh) K'^T V, when the kv order is used


def cross_precompute(p: Party, cfg: M.ModelConfig, shares: dict, enc: AShare,
                     need_kv: bool = True) -> list[CrossKV]:
    """K', V (and K'^T V) of every decoder layer's cross attention: 3-4 kernel calls in all."""
    L, h = cfg.n_dec_layers, cfg.n_heads
    if L == 0:
        return []
    ws = [sub(shares, f"dec.{i}.cross") for i in range(L)]
    wcat = AShare.concat([AShare.concat([w["wk_proj"], w["wv_c"]], axis=1) for w in ws], axis=1)
    y = arith.matmul_aa(p, enc, wcat, trunc=p.cfg.frac + PROJ_EXTRA)
    if "bk" in ws[0]:                                  # attention biases: local
        bcat = AShare.concat([AShare.concat([w["bk"], w["bv"]], axis=0) for w in ws], axis=0)
        y = add_bias(y, {"b": bcat}, "b")
    nk, d = ws[0]["wk_proj"].shape[1], cfg.d_model
    ks, vs = [], []
    for i in range(L):
        base = i * (nk + d)
        ks.append(split_heads(y[..., base:base + nk], h))
        vs.append(split_heads(y[..., base + nk:base + nk + d], h))
    kst = AShare(np.stack([k.a for k in ks]), np.stack([k.b for k in ks]))   # (L,B,h,S,.)
    if "omega" in ws[0]:
        om = AShare(np.stack([w["omega"].a for w in ws])[:, None],
                    np.stack([w["omega"].b for w in ws])[:, None])         # (L,1,h,dh,r)
        kst = arith.matmul_aa(p, kst, om)
    kf = A.relu_many(p, [kst])[0]
    kv = None
    if need_kv:
        vst = AShare(np.stack([v.a for v in vs]), np.stack([v.b for v in vs]))
        kv = arith.matmul_aa(p, kf.T, vst)
    return [CrossKV(kf[i], vs[i], None if kv is None else kv[i]) for i in range(L)]


def cross_mha(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, ckv: CrossKV,
              order: str = "kv") -> AShare:
    q, _, _ = project(p, cfg, w, xq, None, want_q=True, want_kv=False)
    qf, _ = features(p, cfg, w, q, None)
    if order == "kv" and ckv.kv is not None:
        o = arith.matmul_aa(p, qf, ckv.kv)
    else:
        o = A.relu_attention(p, qf, ckv.kf, ckv.v, order="qk")
    return finish(p, cfg, w, o, np.full(qf.shape[2], ckv.kf.shape[2]))


def _ln(p, cfg, shares, prefix, x):
    return layernorm(p, x, shares[f"{prefix}.gamma"], shares[f"{prefix}.beta"], cfg.ln_eps)


def _cross_order(cfg, T, S, order):
    if order not in A.ORDERS:
        raise ValueError(f"cross order={order!r} must be one of {A.ORDERS}")
    if order == "auto":   # one-off K'^T V (r*dh) + Q'(K'^T V) vs Q'K'^T (T*S), per head
        return "qk" if T * S + T * cfg.d_head < cfg.n_features * cfg.d_head + T * cfg.d_head \
            else "kv"
    return order


def decoder(p: Party, cfg: M.ModelConfig, shares: dict, y: AShare, enc: AShare,
            masked_form: str = "auto", block: int | None = None, cross_order: str = "auto",
            layers: int | None = None) -> AShare:
    """Full (teacher-forced) decoder: y (B, T, d), enc (B, S, d) -> (B, T, d)."""
    for name, t in (("y", y), ("enc", enc)):
        if len(t.shape) != 3 or t.shape[-1] != cfg.d_model:
            raise ValueError(f"decoder {name} must be (B, S, {cfg.d_model}), got {t.shape}")
    if y.shape[0] != enc.shape[0]:
        raise ValueError(f"batch sizes differ: y {y.shape[0]} vs enc {enc.shape[0]}")
    order = _cross_order(cfg, y.shape[1], enc.shape[1], cross_order)
    n = cfg.n_dec_layers if layers is None else layers
    cross = cross_precompute(p, cfg, shares, enc, need_kv=(order == "kv"))
    x = y
    for i in range(n):
        pre = f"dec.{i}"
        ws, wc, wf = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.cross"), sub(shares, f"{pre}.ffn")
        kw = dict(causal=True, masked_form=masked_form, block=block)
        if cfg.norm_first:
            x = x + mha(p, cfg, ws, _ln(p, cfg, shares, f"{pre}.ln1", x), **kw)
            x = x + cross_mha(p, cfg, wc, _ln(p, cfg, shares, f"{pre}.ln2", x), cross[i], order)
            x = x + ffn(p, wf, _ln(p, cfg, shares, f"{pre}.ln3", x), cfg.ffn_act)
        else:
            x = _ln(p, cfg, shares, f"{pre}.ln1", x + mha(p, cfg, ws, x, **kw))
            x = _ln(p, cfg, shares, f"{pre}.ln2", x + cross_mha(p, cfg, wc, x, cross[i], order))
            x = _ln(p, cfg, shares, f"{pre}.ln3", x + ffn(p, wf, x, cfg.ffn_act))
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(p, cfg, shares, "dec.final_ln", x)
    return x


@dataclass
class DecodeState:
    """Secret incremental-decoding state of one party (shares only; t and n_enc are public)."""

    prefix: list[A.PrefixState]
    cross_kv: list[AShare]
    n_enc: int
    t: int = 0

    @staticmethod
    def start(p: Party, cfg: M.ModelConfig, shares: dict, enc: AShare,
              block: int | None = None) -> "DecodeState":
        """``block``: tokens cached before folding into G (:class:`attention.PrefixState`)."""
        B, S, _ = enc.shape
        cross = cross_precompute(p, cfg, shares, enc, need_kv=True)
        return DecodeState([A.PrefixState.empty(B, cfg.n_heads, cfg.n_features, cfg.d_head,
                                                block) for _ in range(cfg.n_dec_layers)],
                           [c.kv for c in cross], S)


def _self_step(p, cfg, w, x, st: A.PrefixState):
    q, k, v = project(p, cfg, w, x, None)
    qf, kf = features(p, cfg, w, q, k)
    o = A.attention_step(p, st, qf, kf, v)
    return finish(p, cfg, w, o, [st.t])


def _cross_step(p, cfg, w, x, kv, n_enc):
    q, _, _ = project(p, cfg, w, x, None, want_q=True, want_kv=False)
    qf, _ = features(p, cfg, w, q, None)
    return finish(p, cfg, w, A.cross_attention_step(p, qf, kv), [n_enc])


def decoder_step(p: Party, cfg: M.ModelConfig, shares: dict, state: DecodeState,
                 y_t: AShare, on_layer: Callable[[str], None] | None = None) -> AShare:
    """One token: y_t (B, d) at position state.t -> (B, d); == model.ref_decoder_step.
    ``on_layer(name)`` is called after each layer (``dec.i``, ``dec.final_ln``)."""
    if len(y_t.shape) != 2 or y_t.shape[-1] != cfg.d_model:
        raise ValueError(f"decoder step input must be (B, {cfg.d_model}), got {y_t.shape}")
    B = y_t.shape[0]
    x = y_t.reshape(B, 1, cfg.d_model)
    for i in range(cfg.n_dec_layers):
        pre = f"dec.{i}"
        ws, wc, wf = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.cross"), sub(shares, f"{pre}.ffn")
        st, kv = state.prefix[i], state.cross_kv[i]
        if cfg.norm_first:
            x = x + _self_step(p, cfg, ws, _ln(p, cfg, shares, f"{pre}.ln1", x), st)
            x = x + _cross_step(p, cfg, wc, _ln(p, cfg, shares, f"{pre}.ln2", x), kv, state.n_enc)
            x = x + ffn(p, wf, _ln(p, cfg, shares, f"{pre}.ln3", x), cfg.ffn_act)
        else:
            x = _ln(p, cfg, shares, f"{pre}.ln1", x + _self_step(p, cfg, ws, x, st))
            x = _ln(p, cfg, shares, f"{pre}.ln2", x + _cross_step(p, cfg, wc, x, kv, state.n_enc))
            x = _ln(p, cfg, shares, f"{pre}.ln3", x + ffn(p, wf, x, cfg.ffn_act))
        if on_layer is not None:
            on_layer(pre)
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(p, cfg, shares, "dec.final_ln", x)
        if on_layer is not None:
            on_layer("dec.final_ln")
    state.t += 1
    return x.reshape(B, cfg.d_model)


def cost_decoder_step(p_cfg, cfg: M.ModelConfig, B: int, t: int, block: int | None = None,
                      folded: bool = True) -> Cost:
    """Declared rounds and bytes per party of :func:`decoder_step` for the token at position
    ``t`` (t tokens already decoded; the self-attention cache state follows from t and
    ``block``). Rounds do not depend on t; bytes do, through the cache folding."""
    d, h, r, dh = cfg.d_model, cfg.n_heads, cfg.n_features, cfg.d_head
    block = A.default_decode_block(r, dh) if block is None else int(block)
    nq = h * r if folded else d
    self_step = (cost_project(p_cfg, B * (2 * nq + d)) + cost_features(p_cfg, B * h * 2 * r, folded)
                 + A.cost_attention_step(p_cfg, B, h, r, dh, t % block, t >= block, block)
                 + cost_finish(p_cfg, cfg, B))
    cross_step = (cost_project(p_cfg, B * nq) + cost_features(p_cfg, B * h * r, folded)
                  + arith.cost_mul(B * h * dh, True, p_cfg.frac, p_cfg.trunc)
                  + cost_finish(p_cfg, cfg, B))
    ln = cost_layernorm(p_cfg, B, d)
    layer = self_step + cross_step + cost_ffn(p_cfg, B, d, cfg.d_ff, cfg.ffn_act) + ln + ln + ln
    total = Cost(0, (0, 0, 0))
    for _ in range(cfg.n_dec_layers):
        total = total + layer
    return total + ln if cfg.norm_first and cfg.n_dec_layers else total
