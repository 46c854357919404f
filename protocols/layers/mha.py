"""Secure multi-head ReLU attention (Privformer Alg. 6), all heads batched.

``w`` is the share dict of one attention prefix (see :mod:`protocols.layers.secure_model`):
``wq_proj, wk_proj`` (W^Q, W^K, or Omega-folded W^Q Omega, W^K Omega) and ``wv_c`` (W^V),
with the public constant c folded into the three of them,
``omega`` (unfolded only), ``wo``. Steps, each one kernel call for all heads:

1. projections X [W^Q | W^K | W^V] (one matmul; cross attention: both inputs in one call),
   truncated by frac + PROJ_EXTRA;
2. unfolded only: per-head Q_h Omega_h and K_h Omega_h in one batched matmul;
3. one relu_a on Q and K features together; folded, the Q and K products of step 1 stop at
   the split form relu_a reads (:func:`project_features`: 8 bytes per feature element less,
   V's product in the same rounds);
4. attention core (:mod:`protocols.layers.attention`);
5. merge heads, @ W^O; attn_norm "mean": rows times the public 1/n_i inside that product's
   truncation (:func:`mpc3.kernels.truncation.scaled`: no rounds of its own); c itself is in the
   weights.

Models with another ``attention`` (softmax, power-softmax, sigma-relu) take steps 1 and 6
and run :func:`heads` (one call per kernel step, all heads) in between; a decoder-only LM
keeps their keys and values in :class:`protocols.layers.kv_cache.KVCache`.

Attention biases (``cfg.attn_bias``; shares ``bq, bk, bv, bo`` scaled and folded like their
weights, :mod:`protocols.layers.secure_model`) are added locally after steps 1 and 6 (no rounds).
"""
from __future__ import annotations

import numpy as np

from mpc3.kernels import arith
from mpc3.party import Party, profiled
from mpc3.shares import AShare
from protocols import model as M
from protocols.model import variants as MV

from . import attention as A
from .attention import row_scale_trunc
from .secure_model import PROJ_EXTRA


def split_heads(x: AShare, h: int) -> AShare:
    """(B, S, h*k) -> (B, h, S, k)."""
    B, S, D = x.shape
    return x.reshape(B, S, h, D // h).transpose(0, 2, 1, 3)


def merge_heads(x: AShare) -> AShare:
    """(B, h, S, k) -> (B, S, h*k)."""
    B, h, S, k = x.shape
    return AShare(np.ascontiguousarray(x.a.transpose(0, 2, 1, 3)).reshape(B, S, h * k),
                  np.ascontiguousarray(x.b.transpose(0, 2, 1, 3)).reshape(B, S, h * k))


def _check_x(cfg: M.ModelConfig, x: AShare, name: str) -> None:
    if len(x.shape) != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"{name} must have shape (B, S, d_model={cfg.d_model}), got {x.shape}")


def add_bias(x: AShare | None, w: dict, name: str) -> AShare | None:
    """x + w[name] broadcast over the leading dimensions, when the model has that attention
    bias (ModelConfig.attn_bias); local, no communication."""
    if x is None or name not in w:
        return x
    b = w[name]
    return AShare(x.a + np.broadcast_to(b.a, x.shape), x.b + np.broadcast_to(b.b, x.shape))


def project(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, xkv: AShare | None,
            want_q: bool = True, want_kv: bool = True, pos: int = 0):
    """Q, K, V projections in one call; returns per-head (B,h,S,.) shares (None if not
    wanted); K and V have ``cfg.kv_heads`` heads (:func:`expand_kv` repeats them for the
    query heads). ``embedding`` rotary: q and k rotated (:mod:`.rotary`) with the key rows
    at positions pos, pos + 1, ... and the query rows the last ones among them (self
    attention; without keys the query rows start at pos). Cost: :func:`cost_qkv`."""
    bits = p.cfg.frac + PROJ_EXTRA
    h = cfg.n_heads
    src = xq if xkv is None else xkv
    names = (["wq_proj"] if want_q else []) + (["wk_proj", "wv_c"] if want_kv else [])
    # one product call, one reshare + truncation for all (no [W^Q|W^K|W^V] copy per call)
    got = dict(zip(names, A.mul_many(p, [(xq if n == "wq_proj" else src, w[n], "matmul")
                                         for n in names], trunc=bits,
                                     sites=["proj"] * len(names))))
    q, k, v = (add_bias(got.get(n), w, b) for n, b in
               (("wq_proj", "bq"), ("wk_proj", "bk"), ("wv_c", "bv")))
    q = None if q is None else split_heads(q, h)
    k, v = (None if t is None else split_heads(t, cfg.kv_heads) for t in (k, v))
    if cfg.embedding == M.ROTARY:
        from .rotary import rope_many
        n_k = src.shape[1] if want_kv else 0
        items = ([(q, pos + max(n_k - xq.shape[1], 0) + np.arange(xq.shape[1]))] if want_q
                 else []) + ([(k, pos + np.arange(n_k))] if want_kv else [])
        rot = iter(rope_many(p, items, cfg.rope_theta))
        q = next(rot) if want_q else None
        k = next(rot) if want_kv else None
    return q, k, v


def expand_kv(cfg: M.ModelConfig, t: AShare) -> AShare:
    """Grouped-query keys or values (B, kv_heads, S, dh) repeated to the n_heads query heads
    (query head j reads kv head j // (n_heads / kv_heads)); local."""
    g = cfg.n_heads // cfg.kv_heads
    if g == 1:
        return t
    return AShare(np.repeat(t.a, g, axis=1), np.repeat(t.b, g, axis=1))


def cost_qkv(p_cfg, cfg: M.ModelConfig, n_q: int, n_kv: int):
    """:func:`project` of ``n_q`` query rows and ``n_kv`` key/value rows (rows summed over the
    batch), softmax-style attentions: the projections and, with rotary embeddings, the one
    truncation of the rotated q and k."""
    dkv = cfg.kv_heads * cfg.d_head
    cost = cost_project(p_cfg, n_q * cfg.d_model + n_kv * 2 * dkv)
    if cfg.embedding == M.ROTARY:
        from .rotary import cost_rope
        cost = cost + cost_rope(p_cfg, n_q * cfg.d_model + n_kv * dkv)
    return cost


def features(p: Party, cfg: M.ModelConfig, w: dict, q: AShare | None, k: AShare | None):
    """ReLU random features Q' = ReLU(Q_h Omega_h), K' likewise, in one relu_a call."""
    parts = [t for t in (q, k) if t is not None]
    if "omega" in w:                       # unfolded: one batched matmul for Q and K
        cat = AShare.concat(parts, axis=2) if len(parts) > 1 else parts[0]
        proj = arith.matmul_aa(p, cat, w["omega"], site="omega")
        sizes = [t.shape[2] for t in parts]
        parts = [proj[:, :, :sizes[0]]] + ([proj[:, :, sizes[0]:]] if len(parts) > 1 else [])
    out = A.relu_many(p, parts, "features")
    it = iter(out)
    return (next(it) if q is not None else None), (next(it) if k is not None else None)


@profiled
def project_features(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, xkv: AShare | None,
                     want_kv: bool = True):
    """Folded Performer projection and features: Q' = ReLU(xq W^Q Omega + b_q), K' likewise
    (per-head (B,h,S,r)) and V (per-head), equal to :func:`project` + :func:`features`
    (``want_kv=False``: Q' only, K' and V None). The Q and K products go to relu_a in split
    form (:func:`protocols.layers.attention.relu_products`), V's product rides the same truncation
    call, completed. Cost: :func:`cost_project_features`."""
    bits, h = p.cfg.frac + PROJ_EXTRA, cfg.n_heads
    src = xq if xkv is None else xkv
    names = [("wq_proj", "bq", xq)] + ([("wk_proj", "bk", src)] if want_kv else [])
    items = [(x, w[n], w.get(b)) for n, b, x in names]
    if not want_kv:
        return split_heads(A.relu_products(p, items, bits, site="proj",
                                           relu_site="features")[0], h), None, None
    (qf, kf), (v,) = A.relu_products(p, items, bits, plain=[(src, w["wv_c"])], site="proj",
                                     relu_site="features")
    return split_heads(qf, h), split_heads(kf, h), split_heads(add_bias(v, w, "bv"), h)


def qkv_features(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, xkv: AShare | None):
    """Performer features Q', K' and V per head: :func:`project_features` when Omega is
    folded into the shares, else :func:`project` then :func:`features`."""
    if "omega" not in w:
        return project_features(p, cfg, w, xq, xkv)
    q, k, v = project(p, cfg, w, xq, xkv)
    return (*features(p, cfg, w, q, k), v)


def cost_project_features(p_cfg, n_qk: int, n_v: int):
    """:func:`project_features` with ``n_qk`` feature and ``n_v`` value elements."""
    return A.cost_relu_products(p_cfg, n_qk, p_cfg.frac + PROJ_EXTRA, n_v)


def cost_project(p_cfg, n_out: int):
    """:func:`project` producing ``n_out`` elements (Q, K, V together)."""
    return arith.cost_mul(n_out, p_cfg, p_cfg.frac + PROJ_EXTRA)


def cost_features(p_cfg, n: int, folded: bool = True):
    """The ReLU features on ``n`` elements (Q' and K' together): unfolded (:func:`features`)
    the Omega product and one relu_a; folded, the relu_a of the projections' split form (a
    decode step's, made by its LayerNorm projection: convert.cost_relu_split)."""
    from mpc3.kernels import convert
    if folded:
        return convert.cost_relu_split(n, p_cfg, p_cfg.frac + PROJ_EXTRA)
    return (arith.cost_mul(n, p_cfg)
            + convert.cost_relu(n, p_cfg))


def cost_finish(p_cfg, cfg: M.ModelConfig, rows: int, row_scale: bool = True,
                raw: bool = False):
    """:func:`finish` on ``rows`` query rows: @ W^O, with the 1/n row scale ("mean"; not when
    the caller folded it elsewhere, ``row_scale=False``) in its truncation; ``raw``: from an
    untruncated o, truncated by 2 frac."""
    bits = 2 * p_cfg.frac if raw else row_scale_trunc(1.0, p_cfg.frac).shift \
        if cfg.attn_norm == "mean" and row_scale else True
    return arith.cost_mul(rows * cfg.d_model, p_cfg, bits)


def finish(p: Party, cfg: M.ModelConfig, w: dict, o: AShare, n_keys, raw: bool = False
           ) -> AShare:
    """Merge heads, @ W^O; attn_norm "mean": each row times its public 1/n_i in the same
    truncation (``n_keys=None``: already applied, e.g. to a decode state's K'^T V). The
    product o W^O is formed unnormalised (site ``wo``). ``raw``: o is an untruncated product
    (2 frac fractional bits, any row scale applied: ``n_keys`` None), so o W^O truncates by
    2 frac - exact while |o W^O| < ``arith.product_limit(frac, frac)`` (site ``wo_raw``)."""
    trunc = 2 * p.cfg.frac if raw else True
    if raw and n_keys is not None:
        raise ValueError("finish: a raw o carries its row scale already (n_keys None)")
    if cfg.attn_norm == "mean" and n_keys is not None:
        trunc = row_scale_trunc(1.0 / np.asarray(n_keys, dtype=np.float64)[:, None],
                                p.cfg.frac)
    return add_bias(arith.matmul_aa(p, merge_heads(o), w["wo"], trunc,
                                    site="wo_raw" if raw else "wo"), w, "bo")


def mha(p: Party, cfg: M.ModelConfig, w: dict, xq: AShare, xkv: AShare | None = None,
        causal: bool = False, order: str = "auto", masked_form: str = "auto",
        block: int | None = None) -> AShare:
    """MHA(xq, xkv) (self attention when ``xkv`` is None) == :func:`protocols.model.ref_mha`."""
    _check_x(cfg, xq, "xq")
    if xkv is not None:
        _check_x(cfg, xkv, "xkv")
        if causal:
            raise ValueError("causal attention is self attention (xkv must be None)")
    if cfg.attention != M.PERFORMER:
        q, k, v = project(p, cfg, w, xq, xkv)
        o = heads(p, M.head_kind(cfg), q, expand_kv(cfg, k), expand_kv(cfg, v), causal)
        return add_bias(arith.matmul_aa(p, merge_heads(o), w["wo"], site="wo"), w, "bo")
    qf, kf, v = qkv_features(p, cfg, w, xq, xkv)
    Sq, Sk = qf.shape[2], kf.shape[2]
    if causal:
        o = A.masked_attention(p, qf, kf, v, form=masked_form, block=block)
        n = np.arange(1, Sq + 1)
    else:
        o = A.relu_attention(p, qf, kf, v, order=order)
        n = np.full(Sq, Sk)
    return finish(p, cfg, w, o, n)


def heads(p: Party, attention: str, q: AShare, k: AShare, v: AShare,
          masked: bool = False) -> AShare:
    """A softmax-style attention on per-head q, k, v: ``attention`` is the model's
    :func:`protocols.model.variants.head_kind` (== :func:`protocols.model.variants.ref_heads`);
    q carries 1/sqrt(dh), folded into W^Q (:func:`protocols.layers.secure_model.fold_scales`)."""
    from . import attention_variants as V
    from .softmax import softmax_attention
    if attention in ("softmax", "softmax-max-free"):
        form = "max" if attention == "softmax" else "max-free"
        return softmax_attention(p, q, k, v, masked=masked, exp="limit", fused=True, form=form,
                                 prescaled=True)
    if attention == "power-softmax":
        return V.power_softmax(p, q, k, v, MV.POWER, MV.POWER_EPS, "plain", masked, fused=True,
                               prescaled=True)
    if attention == "sigma-relu":           # causal rows: 1/L with L = the row's keys
        return V.sigma_attention(p, q, k, v, "relu", masked, "keys" if masked else None,
                                 prescaled=True)
    raise ValueError(f"unknown attention {attention!r}")


def cost_heads(p_cfg, attention: str, B: int, h: int, Sq: int, Sk: int, dh: int,
               masked: bool = False):
    from . import attention_variants as V
    from .softmax import cost_softmax_attention
    if attention in ("softmax", "softmax-max-free"):
        form = "max" if attention == "softmax" else "max-free"
        return cost_softmax_attention(p_cfg, B, h, Sq, Sk, dh, masked, "limit", fused=True,
                                      form=form, prescaled=True)
    if attention == "power-softmax":
        return V.cost_power_softmax(p_cfg, B, h, Sq, Sk, dh, MV.POWER, "plain", masked,
                                    MV.POWER_EPS, fused=True, prescaled=True)
    if attention == "sigma-relu":
        return V.cost_sigma_attention(p_cfg, B, h, Sq, Sk, dh, "relu", masked,
                                      "keys" if masked else None, prescaled=True)
    raise ValueError(f"unknown attention {attention!r}")


def cost_mha(p_cfg, cfg: M.ModelConfig, B: int, Sq: int, Sk: int | None = None,
             causal: bool = False, folded: bool = True, order: str = "auto",
             masked_form: str = "auto", block: int | None = None):
    """Declared rounds and bytes per party of :func:`mha` (self attention when Sk is None)."""
    d, h, r, dh = cfg.d_model, cfg.n_heads, cfg.n_features, cfg.d_head
    Sk = Sq if Sk is None else Sk
    if cfg.attention != M.PERFORMER:
        return (cost_qkv(p_cfg, cfg, B * Sq, B * Sk)
                + cost_heads(p_cfg, M.head_kind(cfg), B, h, Sq, Sk, dh, causal)
                + arith.cost_mul(B * Sq * d, p_cfg))
    nq = h * r if folded else d
    if folded:
        cost = cost_project_features(p_cfg, B * h * (Sq + Sk) * r, B * Sk * d)
    else:
        cost = (cost_project(p_cfg, B * Sq * nq + B * Sk * (nq + d))
                + cost_features(p_cfg, B * h * (Sq + Sk) * r, folded))
    if causal:
        if masked_form == "qk":
            cost = cost + A.cost_masked_qk(p_cfg, B, h, Sq, r, dh)
        else:
            cost = cost + A.cost_masked_vk(p_cfg, B, h, Sq, r, dh, block)
    else:
        cost = cost + A.cost_relu_attention(p_cfg, B, h, Sq, Sk, r, dh, order)
    return cost + cost_finish(p_cfg, cfg, B * Sq)
