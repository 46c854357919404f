"""Float64 reference of the architectures beyond the translator (the semantics the secure
protocols of :mod:`protocols.stacks.classifier` and :mod:`protocols.stacks.causal_lm` compute on
shares).

Encoder classifier (``arch = "encoder-classifier"``, BERT-style)::

    h = ref_encoder(x)                        (B, S, d), final LayerNorm when norm_first
    logits = mean_s(h) @ head.w + head.b      (B, n_classes), mean over the S positions
    pool "cls-tanh" (BERT): logits = tanh(h[:, 0] @ pool.w + pool.b) @ head.w + head.b

Headless encoder (``arch = "encoder"``: BertModel, sentence-transformers)::

    h = ref_encoder(x)                        (B, S, d)
    e = mean_s(h) | h[:, 0] | max_s(h)        (B, d), pool mean / cls / max per coordinate
    normalize: e = e / max(||e||, 1e-12)      (sentence-transformers' Normalize)

Decoder-only causal LM (``arch = "decoder-only"``, GPT-style), per layer ``dec.i``::

    post-LN:  x = LN1(x + MaskedMHA(x));  x = LN2(x + FFN(x))
    pre-LN:   x = x + MaskedMHA(LN1(x));  x = x + FFN(LN2(x));  final LN dec.final_ln

AERO's softmax-only block (norm none, ffn_act none) may scale its FFN (``ffn_scale``, seed
001 Eq. 6: ``x = beta_i x + FFN(x) / alpha_i`` after the attention's residual) and drop the
FFN of its deepest ``ffn_pruned`` layers (``x`` unchanged). :func:`fold_ffn_scales` rewrites
such a model into one without scales whose output times one constant is the original's.

with the masked attention of :func:`ref_mha` (``causal=True``): ReLU-Performer or a
softmax-style one (:mod:`.variants`). The query user embeds tokens with ``embed.tgt``
(:func:`protocols.model.embed`) and applies the LM head ``out.w``, ``out.b`` locally
(:func:`protocols.model.output_logits`). :class:`RefLMState` / :func:`ref_lm_step` are the
incremental form: Performer's prefix sums (O(1) per token), or a KV cache (the token's row
against every cached key, O(t) per token) for the softmax-style attentions.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from .config import DECODER_ONLY, ENCODER, ENCODER_CLASSIFIER, PERFORMER, ModelConfig
from .reference import _ffn, _ln, _step_self, ref_encoder, ref_mha
from .weights import Weights


def _need(cfg: ModelConfig, arch: str) -> None:
    if cfg.arch != arch:
        raise ValueError(f"this needs an {arch} model, got arch {cfg.arch!r}")


def ref_classify(cfg: ModelConfig, w: Weights, x, folded=None) -> np.ndarray:
    """Classifier logits: x (B, S, d) embedded input -> (B, n_classes)."""
    _need(cfg, ENCODER_CLASSIFIER)
    h = ref_encoder(cfg, w, x, folded=folded)
    if cfg.pool == "cls-tanh":            # BERT's pooler: the first ([CLS]) position
        pooled = np.tanh(h[:, 0] @ w["pool.w"] + w["pool.b"])
    else:
        pooled = h.mean(axis=1)
    return pooled @ w["head.w"] + w["head.b"]


#: sentence-transformers' Normalize divides by max(||e||, NORM_EPS) (torch's F.normalize).
NORM_EPS = 1e-12


def ref_embed(cfg: ModelConfig, w: Weights, x, folded=None) -> np.ndarray:
    """Sentence embeddings of a headless encoder: x (B, S, d) embedded input -> (B, d)."""
    _need(cfg, ENCODER)
    h = ref_encoder(cfg, w, x, folded=folded)
    e = {"cls": lambda: h[:, 0], "max": lambda: h.max(axis=1),
         "mean": lambda: h.mean(axis=1)}[cfg.pool]()
    if cfg.normalize:
        e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), NORM_EPS)
    return e


def _ffn_block(cfg: ModelConfig, w: Weights, i: int, x) -> np.ndarray:
    """Layer i's FFN sub-block after its attention (pre- or post-LN, AERO's scaled / pruned)."""
    pre = f"dec.{i}"
    if not cfg.has_ffn(i):
        return x
    if cfg.ffn_scale:
        return (w[f"{pre}.ffn.beta"] * x
                + _ffn(cfg, w, f"{pre}.ffn", x) / w[f"{pre}.ffn.alpha"])
    if cfg.norm_first:
        return x + _ffn(cfg, w, f"{pre}.ffn", _ln(cfg, w, f"{pre}.ln2", x))
    return _ln(cfg, w, f"{pre}.ln2", x + _ffn(cfg, w, f"{pre}.ffn", x))


def fold_ffn_scales(cfg: ModelConfig, w: Weights) -> tuple[ModelConfig, Weights, float]:
    """``(cfg', w', c)`` with ``ref_lm(cfg, w, x) == c * ref_lm(cfg', w', x)``, cfg' without
    ``ffn_scale``: the residual stream of layer l is carried divided by C_l = the product of
    the betas before it. Layer l's W^Q, W^K, W^V are multiplied by C_l and W^O, b^O divided by
    it; its FFN (linear) becomes F(C_l z) / (alpha_l C_(l+1)): W1 / (alpha beta), b1 and b2
    divided by alpha C_(l+1); c = C_L. Exact up to float rounding; shared so by
    :mod:`protocols.layers.secure_model` (one product by c at the end instead of one per layer).
    Refuses alpha or beta = 0."""
    out = Weights(dict(w.tensors))
    C = 1.0
    for i in range(cfg.n_dec_layers):
        p, f = f"dec.{i}.self", f"dec.{i}.ffn"
        for n in ("wq", "wk", "wv"):
            out[f"{p}.{n}"] = w[f"{p}.{n}"] * C
        for n in ("wo", "bo"):
            if f"{p}.{n}" in w:
                out[f"{p}.{n}"] = w[f"{p}.{n}"] / C
        if not cfg.has_ffn(i):
            continue
        a, b = float(w[f"{f}.alpha"][0]), float(w[f"{f}.beta"][0])
        if a == 0 or b == 0:
            raise ValueError(f"{f}: alpha={a}, beta={b}: FFN scales must be nonzero")
        out[f"{f}.w1"] = w[f"{f}.w1"] / (a * b)
        for n in ("b1", "b2"):
            out[f"{f}.{n}"] = w[f"{f}.{n}"] / (a * b * C)
        del out.tensors[f"{f}.alpha"], out.tensors[f"{f}.beta"]
        C *= b
    return replace(cfg, ffn_scale=False).validate(), out, C


def ref_lm(cfg: ModelConfig, w: Weights, x, form: str = "kv") -> np.ndarray:
    """Decoder-only stack on a whole (teacher-forced) sequence: x (B, T, d) -> (B, T, d)."""
    _need(cfg, DECODER_ONLY)
    x = np.asarray(x, dtype=np.float64)
    for i in range(cfg.n_dec_layers):
        p = w.sub(f"dec.{i}.self")
        if cfg.norm_first:
            u = _ln(cfg, w, f"dec.{i}.ln1", x)
            x = x + ref_mha(cfg, p, u, u, causal=True, form=form)
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + ref_mha(cfg, p, x, x, causal=True, form=form))
        x = _ffn_block(cfg, w, i, x)
    if cfg.norm_first:
        x = _ln(cfg, w, "dec.final_ln", x)
    return x


class RefLMState:
    """Incremental LM state: per layer the running sum G = sum_j K'_j^T V_j (B, h, r, dh)
    (relu-performer) or the KV cache ``K``, ``V`` (B, h, t, dh) of every token so far (the
    softmax-style attentions), and the number ``t`` of tokens consumed."""

    def __init__(self, cfg: ModelConfig, batch: int):
        _need(cfg, DECODER_ONLY)
        self.t = 0
        h, dh = cfg.n_heads, cfg.d_head
        self.G = [np.zeros((batch, h, cfg.n_features, dh)) for _ in range(cfg.n_dec_layers)]
        self.K = [np.zeros((batch, h, 0, dh)) for _ in range(cfg.n_dec_layers)]
        self.V = [np.zeros((batch, h, 0, dh)) for _ in range(cfg.n_dec_layers)]


def ref_lm_step(cfg: ModelConfig, w: Weights, state: RefLMState, y_t) -> np.ndarray:
    """One token: y_t (B, d) embedded at position state.t -> final hidden row (B, d)."""
    x = np.asarray(y_t, dtype=np.float64)
    for i in range(cfg.n_dec_layers):
        if cfg.norm_first:
            x = x + _step_self(cfg, w, i, state, _ln(cfg, w, f"dec.{i}.ln1", x))
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + _step_self(cfg, w, i, state, x))
        x = _ffn_block(cfg, w, i, x)
    if cfg.norm_first:
        x = _ln(cfg, w, "dec.final_ln", x)
    state.t += 1
    return x


def greedy_generate(cfg: ModelConfig, w: Weights, user: Mapping, prompt_ids, n_tokens: int,
                    eos: int | None = None) -> list[list[int]]:
    """Greedy decoding with the reference LM: ``prompt_ids`` (B, T) -> up to ``n_tokens``
    new tokens per row (stopping a row at ``eos``, which is not returned)."""
    from .decode import embed_tokens, output_logits, take_tokens
    ids = np.asarray(prompt_ids, dtype=np.int64)
    if ids.ndim == 1:
        ids = ids[None]
    B, T = ids.shape
    if T + n_tokens - 1 > cfg.max_len:
        raise ValueError(f"prompt of {T} tokens + {n_tokens} generated exceeds max_len "
                         f"{cfg.max_len}")
    h = ref_lm(cfg, w, embed_tokens(cfg, user, ids))[:, -1]
    performer = cfg.attention == PERFORMER    # softmax: the whole sequence again per token
    state = RefLMState(cfg, B) if performer else None
    for t in range(T if performer else 0):    # the incremental state of the prompt (= h)
        ref_lm_step(cfg, w, state, embed_tokens(cfg, user, ids[:, t:t + 1], t)[:, 0])
    out: list[list[int]] = [[] for _ in range(B)]
    done = np.zeros(B, dtype=bool)
    for k in range(n_tokens):
        tok = output_logits(user, h).argmax(-1)
        take_tokens(out, done, tok, eos)
        if done.all() or k == n_tokens - 1:
            break
        if performer:
            h = ref_lm_step(cfg, w, state, embed_tokens(cfg, user, tok[:, None],
                                                        offset=state.t)[:, 0])
        else:
            ids = np.concatenate([ids, tok[:, None]], axis=1)
            h = ref_lm(cfg, w, embed_tokens(cfg, user, ids))[:, -1]
    return out
