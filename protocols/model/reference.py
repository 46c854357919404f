"""Float64 reference of the Privformer-style transformer (the single source of truth: the MPC
parties compute exactly these semantics on secret shares). numpy only (no torch).

Architecture
------------
Encoder-decoder transformer (Vaswani et al.) in which softmax attention is
replaced by Performer ReLU attention (Privformer Sec. 5, Eq. 12-15):

* Per head ``h`` (``d_head = d_model // n_heads``)::

      Q_h = Xq  @ W^Q[:, h*d_head:(h+1)*d_head] (+ b^Q[h-slice] when cfg.attn_bias)
      K_h = Xkv @ W^K[:, h-slice],  V_h = Xkv @ W^V[:, h-slice]   (+ b^K, b^V likewise)
      Q'_h = ReLU(Q_h @ Omega_h),  K'_h = ReLU(K_h @ Omega_h)   Omega_h: (d_head, r)

  unmasked (Eq. 12):   out_h[i] = norm_i * Q'_h[i] @ (K'_h^T V_h)
  masked   (Eq. 14/15): out_h[i] = norm_i * Q'_h[i] @ G_i,  G_i = sum_{j<=i} K'_h[j]^T V_h[j]
                        (== norm * tril(Q'_h K'_h^T) V_h)

  ``norm_i = c`` for ``attn_norm == "const"`` and ``norm_i = c / n_i`` for
  ``attn_norm == "mean"``, where ``n_i`` is the (public) number of keys query
  ``i`` attends to: ``n_i = S_kv`` unmasked, ``n_i = i + 1`` (0-based ``i``)
  masked.  ``c = cfg.attn_c`` is a public constant.  Heads are concatenated
  (head-major column order) and multiplied by ``W^O`` (+ ``b^O`` when cfg.attn_bias).

* FFN(x) = ReLU(x W1 + b1) W2 + b2.
* LayerNorm over the last dim: ``(x - mean) / sqrt(var + eps) * gamma + beta``
  with the biased (population) variance (``cfg.norm`` "layernorm"). ``cfg.norm`` "none":
  the identity wherever a LayerNorm would be (and no final LayerNorm); "batchnorm":
  BatchNorm at inference, ``(x - mean_c) / sqrt(var_c + eps) * gamma_c + beta_c`` with the
  running statistics ``mean``, ``var`` of each channel c (:func:`ref_norm`). ``cfg.ffn_bn``
  (seed 002's vision MLP): FFN(x) = act(BN(x W1 + b1)) W2 + b2, BN over the d_ff channels.
* Post-LN (``norm_first=False``, Vaswani)::

      enc: x = LN1(x + MHA(x, x));        x = LN2(x + FFN(x))
      dec: x = LN1(x + MaskedMHA(x, x));  x = LN2(x + MHA(x, enc_out));  x = LN3(x + FFN(x))

  Pre-LN (``norm_first=True``): ``x = x + sublayer(LN(x))`` (cross attention
  uses ``LN2(x)`` as query and ``enc_out`` as key/value) and a final LayerNorm
  (``enc.final_ln`` / ``dec.final_ln``) on each stack output.
* ``cfg.attention`` softmax, power-softmax or sigma-relu: every attention (self, masked,
  cross) is that variant on the per-head q, k, v (:func:`.variants.ref_heads`, no Omega);
  the incremental decoder (:class:`RefDecodeState`) then keeps a KV cache of the target
  prefix and the encoder output's K, V instead of Performer's sums.
* User side (never secret-shared, :mod:`protocols.model.decode`): ``emb(tok) =
  embed[tok] * sqrt(d_model) + PE[pos]`` with the standard sinusoidal PE, and
  ``logits = h @ out.w + out.b``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .config import GATED, PERFORMER, ROTARY, ModelConfig
from .features import (attn_norm, attn_params, merge_heads, project, ref_features, relu,
                       split_heads)
from .rotary import ref_rope
from .variants import ref_heads
from .weights import Weights


def ref_layernorm(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def ref_rmsnorm(x, gamma, eps):
    """RMSNorm (LLaMA-family): x / sqrt(mean(x^2) + eps) * gamma over the last dim."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma


def ref_batchnorm(x, gamma, beta, mean, var, eps):
    """BatchNorm with running statistics (torch's BatchNorm1d in eval mode) over the last dim."""
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def batchnorm_affine(gamma, beta, mean, var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) with BatchNorm(x) = x * a + b; refuses var + eps <= 0."""
    ve = np.asarray(var, dtype=np.float64) + eps
    if np.any(ve <= 0):
        raise ValueError(f"batchnorm: running var + eps must be > 0 (min {float(ve.min())})")
    a = np.asarray(gamma, dtype=np.float64) / np.sqrt(ve)
    return a, np.asarray(beta, dtype=np.float64) - np.asarray(mean, dtype=np.float64) * a


def ref_norm(cfg: ModelConfig, w: Mapping, prefix: str, x) -> np.ndarray:
    """The normalization ``cfg.norm`` with the tensors below ``prefix`` (``enc.0.ln1`` ...)."""
    if cfg.norm == "none":
        return x
    if cfg.norm == "rmsnorm":
        return ref_rmsnorm(x, w[f"{prefix}.gamma"], cfg.ln_eps)
    if cfg.norm == "batchnorm":
        return ref_batchnorm(x, *(w[f"{prefix}.{n}"] for n in ("gamma", "beta", "mean", "var")),
                             cfg.ln_eps)
    return ref_layernorm(x, w[f"{prefix}.gamma"], w[f"{prefix}.beta"], cfg.ln_eps)


def ref_ffn(x, w1, b1, w2, b2, act: str = "relu"):
    """act(x W1 + b1) W2 + b2 for act in ModelConfig's FFN_ACTS (relu, gelu, none)."""
    h = x @ w1 + b1
    return ffn_activation(h, act) @ w2 + b2


def ref_swiglu(x, w1, w3, w2):
    """LLaMA's gated FFN: (silu(x W1) * (x W3)) W2, no biases."""
    g = x @ w1
    return (g * (0.5 + 0.5 * np.tanh(0.5 * g)) * (x @ w3)) @ w2     # silu, no overflow


def ffn_activation(h, act: str):
    if act == "relu":
        return relu(h)
    if act == "gelu":
        from mpc3.kernels.activations import gelu_ref
        return gelu_ref(h)
    if act == "none":
        return h
    raise ValueError(f"unknown FFN activation {act!r}")


def ref_mha(cfg: ModelConfig, p: Mapping, xq, xkv, causal: bool = False,
            form: str = "kv", q_offset: int = 0) -> np.ndarray:
    """Multi-head ReLU attention.

    ``p`` holds ``wq, wk, wv, wo, omega`` (or folded ``wq_omega, wk_omega`` +
    ``wv, wo``).  ``xq``: (B, Sq, d), ``xkv``: (B, Sk, d).  ``causal`` requires
    Sq == Sk (query i sees keys j <= i).  ``form``: "kv" (K'^T V first, running
    sums G_i for causal, Eq. 12/15), "qk" (norm * tril(Q'K'^T) V, Eq. 14) or
    "loop" (naive per-(i, j) loop).  All forms are mathematically identical.
    """
    h = cfg.n_heads
    if cfg.attention != PERFORMER:      # softmax-style: q, k, v per head, no features
        q, k, v = qkv_heads(cfg, p, xq, xkv, q_offset, q_offset)
        return project(p, merge_heads(ref_heads(cfg.attention, q, k, v, causal)), "o")
    qf = ref_features(cfg, p, xq, "q")  # (B,h,Sq,r)
    kf = ref_features(cfg, p, xkv, "k")  # (B,h,Sk,r)
    v = split_heads(project(p, xkv, "v"), h)  # (B,h,Sk,dh)
    Sq, Sk = qf.shape[-2], kf.shape[-2]
    if causal:
        if Sq != Sk:
            raise ValueError(f"causal attention needs Sq == Sk, got {Sq} != {Sk}")
        n = np.arange(1, Sq + 1)
    else:
        n = np.full(Sq, Sk)
    scale = attn_norm(cfg, n)[:, None]  # (Sq,1)
    if form == "kv":
        if causal:
            G = np.cumsum(np.einsum("...sr,...sd->...srd", kf, v), axis=-3)  # (B,h,S,r,dh)
            o = np.einsum("...sr,...srd->...sd", qf, G)
        else:
            o = qf @ (np.swapaxes(kf, -1, -2) @ v)
    elif form == "qk":
        A = qf @ np.swapaxes(kf, -1, -2)
        if causal:
            A = np.tril(A)
        o = A @ v
    elif form == "loop":
        o = np.zeros(qf.shape[:-1] + (v.shape[-1],))
        for i in range(Sq):
            for j in range(i + 1 if causal else Sk):
                s = np.sum(qf[..., i, :] * kf[..., j, :], axis=-1)  # (B,h)
                o[..., i, :] += s[..., None] * v[..., j, :]
    else:
        raise ValueError(f"unknown attention form {form!r}")
    o = o * scale
    return project(p, merge_heads(o), "o")


def qkv_heads(cfg: ModelConfig, p: Mapping, xq, xkv, q_pos: int = 0, k_pos: int = 0):
    """Per-head q (B, h, Sq, dh), k, v (B, h, Sk, dh) of a softmax-style attention: grouped
    keys and values (``n_kv_heads``) repeated to the h query heads, and with ``embedding``
    rotary q and k rotated at positions q_pos.., k_pos.. ."""
    h, g = cfg.n_heads, cfg.n_heads // cfg.kv_heads
    q = split_heads(project(p, xq, "q"), h)
    k, v = (np.repeat(split_heads(project(p, xkv, n), cfg.kv_heads), g, axis=-3) for n in "kv")
    if cfg.embedding == ROTARY:
        q = ref_rope(q, q_pos + np.arange(q.shape[-2]), cfg.rope_theta)
        k = ref_rope(k, k_pos + np.arange(k.shape[-2]), cfg.rope_theta)
    return q, k, v


# --------------------------------------------------------------------------- stacks


def _ln(cfg, w, prefix, x):
    return ref_norm(cfg, w, prefix, x)


def _ffn(cfg, w, prefix, x):
    if cfg.ffn_act == GATED:
        return ref_swiglu(x, *(w[f"{prefix}.{n}"] for n in ("w1", "w3", "w2")))
    if cfg.ffn_bn:      # seed 002: BatchNorm between the first product and the activation
        h = ref_batchnorm(x @ w[f"{prefix}.w1"] + w[f"{prefix}.b1"],
                          *(w[f"{prefix}.bn_{n}"] for n in ("gamma", "beta", "mean", "var")),
                          cfg.ln_eps)
        return ffn_activation(h, cfg.ffn_act) @ w[f"{prefix}.w2"] + w[f"{prefix}.b2"]
    return ref_ffn(x, w[f"{prefix}.w1"], w[f"{prefix}.b1"], w[f"{prefix}.w2"], w[f"{prefix}.b2"],
                   cfg.ffn_act)


def fold_ffn_bn(cfg: ModelConfig, w: Weights) -> tuple[ModelConfig, Weights]:
    """``cfg.ffn_bn`` folded: BN(x W1 + b1) = x (W1 diag a) + (b1 a + b) with
    (a, b) = :func:`batchnorm_affine` of the FFN's statistics - the same model without
    ``ffn_bn`` (exact up to float rounding; :mod:`protocols.layers.secure_model` shares it so, at no
    cost online)."""
    from dataclasses import replace
    out = Weights(dict(w.tensors))
    for name in [n for n in w.keys() if n.endswith(".ffn.bn_gamma")]:
        p = name[:-len(".bn_gamma")]
        a, b = batchnorm_affine(*(w[f"{p}.bn_{n}"] for n in ("gamma", "beta", "mean", "var")),
                                cfg.ln_eps)
        out[f"{p}.w1"], out[f"{p}.b1"] = w[f"{p}.w1"] * a, w[f"{p}.b1"] * a + b
        for n in ("gamma", "beta", "mean", "var"):
            del out.tensors[f"{p}.bn_{n}"]
    return replace(cfg, ffn_bn=False).validate(), out


def ref_encoder(cfg: ModelConfig, w: Weights, x, form: str = "kv", folded=None) -> np.ndarray:
    """Encoder stack: x (B, S, d) -> (B, S, d)."""
    x = np.asarray(x, dtype=np.float64)
    for i in range(cfg.n_enc_layers):
        p = attn_params(w, f"enc.{i}.attn", folded)
        if cfg.norm_first:
            u = _ln(cfg, w, f"enc.{i}.ln1", x)
            x = x + ref_mha(cfg, p, u, u, form=form)
            x = x + _ffn(cfg, w, f"enc.{i}.ffn", _ln(cfg, w, f"enc.{i}.ln2", x))
        else:
            x = _ln(cfg, w, f"enc.{i}.ln1", x + ref_mha(cfg, p, x, x, form=form))
            x = _ln(cfg, w, f"enc.{i}.ln2", x + _ffn(cfg, w, f"enc.{i}.ffn", x))
    if cfg.norm_first:
        x = _ln(cfg, w, "enc.final_ln", x)
    return x


def ref_decoder(cfg: ModelConfig, w: Weights, y, enc_out, form: str = "kv",
                folded=None) -> np.ndarray:
    """Full (teacher-forced, causally masked) decoder: y (B,T,d), enc_out (B,S,d) -> (B,T,d)."""
    x = np.asarray(y, dtype=np.float64)
    for i in range(cfg.n_dec_layers):
        ps = attn_params(w, f"dec.{i}.self", folded)
        pc = attn_params(w, f"dec.{i}.cross", folded)
        if cfg.norm_first:
            u = _ln(cfg, w, f"dec.{i}.ln1", x)
            x = x + ref_mha(cfg, ps, u, u, causal=True, form=form)
            x = x + ref_mha(cfg, pc, _ln(cfg, w, f"dec.{i}.ln2", x), enc_out, form=form)
            x = x + _ffn(cfg, w, f"dec.{i}.ffn", _ln(cfg, w, f"dec.{i}.ln3", x))
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + ref_mha(cfg, ps, x, x, causal=True, form=form))
            x = _ln(cfg, w, f"dec.{i}.ln2", x + ref_mha(cfg, pc, x, enc_out, form=form))
            x = _ln(cfg, w, f"dec.{i}.ln3", x + _ffn(cfg, w, f"dec.{i}.ffn", x))
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(cfg, w, "dec.final_ln", x)
    return x


class RefDecodeState:
    """Incremental decoder state (Privformer Alg. 3 / Eq. 15; a KV cache for the
    softmax-style attentions).

    Per decoder layer, relu-performer: ``G[i]`` (B, h, r, d_head) running sum
    ``sum_{j<=t} K'_j^T V_j`` of the masked self-attention and ``cross_kv[i]`` (B, h, r,
    d_head) = ``K'^T V`` of the cross attention (computed once from ``enc_out``);
    softmax-style: the KV cache ``K[i]``, ``V[i]`` (B, h, t, d_head) of the target prefix and
    ``cross_kv[i]`` = (K, V) (B, h, S, d_head) of the encoder output (once). ``n_enc`` is
    the number of encoder positions and ``t`` the number of tokens consumed so far (so the
    masked count is ``n = t + 1``).
    """

    def __init__(self, cfg: ModelConfig, w: Weights, enc_out):
        enc_out = np.asarray(enc_out, dtype=np.float64)
        B, S, _ = enc_out.shape
        h, r, dh, L = cfg.n_heads, cfg.n_features, cfg.d_head, cfg.n_dec_layers
        self.t = 0
        self.n_enc = S
        self.G = [np.zeros((B, h, r, dh)) for _ in range(L)]
        self.K = [np.zeros((B, h, 0, dh)) for _ in range(L)]
        self.V = [np.zeros((B, h, 0, dh)) for _ in range(L)]
        self.cross_kv = []
        for i in range(L):
            p = w.sub(f"dec.{i}.cross")
            if cfg.attention != PERFORMER:    # grouped K, V repeated to the h query heads
                self.cross_kv.append(tuple(np.repeat(split_heads(
                    project(p, enc_out, n), cfg.kv_heads), h // cfg.kv_heads, axis=-3)
                    for n in "kv"))
                continue
            v = split_heads(project(p, enc_out, "v"), h)  # (B,h,S,dh)
            kf = ref_features(cfg, p, enc_out, "k")  # (B,h,S,r)
            self.cross_kv.append(np.swapaxes(kf, -1, -2) @ v)


def _step_attn(cfg, p, x_t, kv, scale):
    """The attention of one row x_t (B, d) -> (B, d): relu-performer against a K'^T V (or
    G) ``kv`` (B, h, r, dh) times ``scale``; softmax-style against the keys and values
    ``kv`` = (K, V) (B, h, n, dh), unmasked (every key is visible to the row)."""
    if cfg.attention != PERFORMER:
        q = split_heads(project(p, x_t, "q")[:, None, :], cfg.n_heads)
        if cfg.embedding == ROTARY:      # the row's position: the newest key's
            q = ref_rope(q, [kv[0].shape[-2] - 1], cfg.rope_theta)
        return project(p, merge_heads(ref_heads(cfg.attention, q, *kv))[:, 0], "o")
    qf = ref_features(cfg, p, x_t[:, None, :], "q")[:, :, 0, :]  # (B,h,r)
    o = np.einsum("bhr,bhrd->bhd", qf, kv) * scale
    return project(p, o.reshape(o.shape[0], -1), "o")


def _step_self(cfg, w, i, state, x_t):
    """Layer i's masked self attention of the row x_t at position state.t; appends it to the
    state (G, or the KV cache K, V): ``RefDecodeState`` and ``archs.RefLMState``."""
    p = w.sub(f"dec.{i}.self")
    if cfg.attention != PERFORMER:        # KV cache: the new row against every key so far
        _, k, v = qkv_heads(cfg, p, x_t[:, None, :], x_t[:, None, :], state.t, state.t)
        state.K[i] = np.concatenate([state.K[i], k], axis=2)
        state.V[i] = np.concatenate([state.V[i], v], axis=2)
        return _step_attn(cfg, p, x_t, (state.K[i], state.V[i]), 1.0)
    kf = ref_features(cfg, p, x_t[:, None, :], "k")[:, :, 0, :]  # (B,h,r)
    v = split_heads(project(p, x_t, "v")[:, None, :], cfg.n_heads)[:, :, 0, :]  # (B,h,dh)
    state.G[i] = state.G[i] + np.einsum("bhr,bhd->bhrd", kf, v)
    return _step_attn(cfg, p, x_t, state.G[i], float(attn_norm(cfg, state.t + 1)))


def ref_decoder_step(cfg: ModelConfig, w: Weights, state: RefDecodeState | None, y_t,
                     enc_out=None) -> np.ndarray:
    """One decoder step: y_t (B, d) (embedded token at position state.t) -> (B, d).

    O(1) in the prefix length.  Mutates ``state`` (t += 1).  ``enc_out`` is
    only needed to build a state when ``state`` is None (prefer
    ``RefDecodeState(cfg, w, enc_out)``).
    """
    if state is None:
        raise ValueError("pass a RefDecodeState(cfg, w, enc_out)")
    x = np.asarray(y_t, dtype=np.float64)
    cscale = float(attn_norm(cfg, state.n_enc))
    for i in range(cfg.n_dec_layers):
        pc = w.sub(f"dec.{i}.cross")
        if cfg.norm_first:
            x = x + _step_self(cfg, w, i, state, _ln(cfg, w, f"dec.{i}.ln1", x))
            x = x + _step_attn(cfg, pc, _ln(cfg, w, f"dec.{i}.ln2", x), state.cross_kv[i], cscale)
            x = x + _ffn(cfg, w, f"dec.{i}.ffn", _ln(cfg, w, f"dec.{i}.ln3", x))
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + _step_self(cfg, w, i, state, x))
            x = _ln(cfg, w, f"dec.{i}.ln2", x + _step_attn(cfg, pc, x, state.cross_kv[i], cscale))
            x = _ln(cfg, w, f"dec.{i}.ln3", x + _ffn(cfg, w, f"dec.{i}.ffn", x))
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(cfg, w, "dec.final_ln", x)
    state.t += 1
    return x
