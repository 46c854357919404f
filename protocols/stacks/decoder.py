"""Secure decoder stack (Privformer Alg. 9 done right) and incremental decoding.

Per layer (post-LN; pre-LN analogous, see :func:`protocols.model.ref_decoder`)::

    x = LN1(x + MaskedMHA(x));  x = LN2(x + MHA(x, enc_out));  x = LN3(x + FFN(x))

Cross attention: K and V depend on the encoder output only, so K' and V (and K'^T V) of all
layers are computed once, in one kernel call per step for all layers (:func:`cross_precompute`).

Incremental decoding (:class:`DecodeState`, :func:`decoder_step`): per layer and head the
secret running sum G = sum_j K'_j^T V_j of the masked self attention (plus a bounded cache of
the newest K', V rows, folded into G every ``block`` tokens) and the cross attention K'^T V;
a new token costs O(1) in the prefix length (Eq. 15).

Softmax-style attention (``cfg.attention`` softmax, power-softmax, sigma-relu; issue 14): the
self attention keeps a secret KV cache of the target prefix per layer
(:class:`protocols.layers.kv_cache.KVCache`; a step appends the token's k, v and computes its row
against every cached key, :func:`protocols.layers.kv_cache.attend_out`), the cross attention the
encoder output's K and V per layer (projected once when the session opens, like K'^T V) and
runs :func:`protocols.layers.mha.heads` of the token's query against them. A token then costs
O(t + S) bytes (t cached target tokens, S source positions) in rounds independent of both.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers import attention as A
from protocols.layers.cross import (
    CrossKV,
    cost_cross_precompute,
    cross_mha,
    cross_precompute,
)
from protocols.layers.ffn import cost_ffn_hidden, ffn, ffn_hidden
from protocols.layers.kv_cache import KVCache, attend_out, cost_attend_out
from protocols.layers.layernorm import widen
from protocols.layers.ln_proj import (
    RELU,
    cost_ln_bias,
    cost_ln_proj,
    cost_step_project,
    fused_biases,
    fusion_map,
    ln_proj,
    step_project,
)
from protocols.layers.mha import (
    add_bias,
    cost_features,
    cost_finish,
    cost_heads,
    features,
    finish,
    heads,
    mha,
    split_heads,
)
from protocols.layers.norms import cost_norm, norm
from protocols.layers.secure_model import sub

from .schedule import GENERAL, Schedule


def _ln(p, cfg, shares, prefix, x, span=None, wide: bool = False):
    return norm(p, cfg, shares, prefix, x, span, wide)


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
        ws, wc = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.cross")
        wf = sub(shares, f"{pre}.ffn")
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


#: What a decode session folds into fewer rounds (FUSIONS names it). "self", "cross", "ffn":
#: the projection a step forms inside the LayerNorm before it - each saves the projection's
#: 2 rounds per layer and costs one truncated product per projection output (rs times x W),
#: ~0.37 MB per token of the Privformer workload for "ffn" or "cross" (W1: d_ff, cross W^Q:
#: h r outputs), 0.73 MB for "self" (W^Q, W^K, W^V). "wo": the cross attention's W^O folded
#: into its K'^T V at decode_open where the model's calibration allows it
#: (:func:`folded_layers`, :class:`FoldedWO`) - one round fewer per layer and ~12 KB fewer
#: per token, for h r d more products per layer at decode_open (201 MB more for the
#: Privformer workload: it pays for itself after ~13 tokens on the emulated WAN, ~120 on
#: loopback). The default keeps a token of a calibrated model (its LayerNorms' narrowed
#: tables, :func:`protocols.stacks.schedule.ln_spans`) within 10 % of issue 12's 6.45 MB: 6.85 MB in
#: 246 rounds for the random Privformer model (7.22 MB and 263 rounds with whole tables and
#: no calibration); FUSIONS ("all") gives the fewest rounds, 236 for 7.58 MB (measured:
#: protocols/jobs/transformer.py).
FUSIONS = ("self", "cross", "ffn", "wo")
DEFAULT_FUSE = ("cross", "ffn", "wo")


@functools.lru_cache(maxsize=64)
def ln_fusions(cfg: M.ModelConfig, fuse=DEFAULT_FUSE) -> dict[str, list[str]]:
    """The LayerNorms of a decode step fused with the projection that reads them
    (:func:`protocols.layers.layernorm.layernorm_project`): ln prefix -> weight share names.
    Post-LN: ln1 -> the cross attention's W^Q, ln2 -> the FFN's W1, ln3 -> the next layer's
    W^Q, W^K, W^V (the last layer's ln3 is the output). Pre-LN: ln1 -> W^Q, W^K, W^V,
    ln2 -> the cross W^Q, ln3 -> W1 (the final LayerNorm is the output). Only the kinds in
    ``fuse`` (:data:`FUSIONS`). Only LayerNorm has an inverse square root whose rounds can
    carry the projection: with ``cfg.norm`` none or batchnorm nothing is fused ({})."""
    def plan(i: int) -> dict[str, tuple[str, list[str]]]:
        pre, names = f"dec.{i}", step_names(i)
        lns = ({"self": "ln1", "cross": "ln2", "ffn": "ln3"} if cfg.norm_first else
               {"cross": "ln1", "ffn": "ln2", "self": "ln3"})
        kinds = {"cross": names["cross"], "ffn": names["ffn"]}
        if cfg.norm_first or i + 1 < cfg.n_dec_layers:
            kinds["self"] = step_names(i if cfg.norm_first else i + 1)["self"]
        return {kind: (f"{pre}.{lns[kind]}", ws) for kind, ws in kinds.items()}
    return fusion_map(cfg, fuse, FUSIONS, "decode", plan)


@dataclass
class DecodeState:
    """Secret incremental-decoding state of one party (shares only; t and n_enc are public).

    ``prefix[i]``: layer i's masked self-attention state, Performer's prefix sums
    (:class:`attention.PrefixState`) or a KV cache (:class:`protocols.layers.kv_cache.KVCache`,
    softmax-style attention); ``cross_kv[i]``: K'^T V of layer i's cross attention, times
    1/n_enc when attn_norm is "mean" (the row scale of every step, applied once) - or, for a
    softmax-style attention, the :class:`CrossKV` K, V of the encoder output, or, the
    session folding layer i's W^O (:func:`folded_layers`), its :class:`FoldedWO`;
    ``ln_bias``: beta W of the fused LayerNorm projections (:func:`ln_fusions` of ``fuse``)."""

    prefix: list[A.PrefixState | KVCache]
    cross_kv: list[AShare | CrossKV | FoldedWO]
    n_enc: int
    ln_bias: dict = field(default_factory=dict)
    fuse: tuple = DEFAULT_FUSE
    schedule: Schedule = GENERAL
    t: int = 0

    @staticmethod
    def start(p: Party, cfg: M.ModelConfig, shares: dict, enc: AShare,
              block: int | None = None, fuse=DEFAULT_FUSE,
              schedule: Schedule = GENERAL,
              on_layer: Callable[[str], None] | None = None) -> "DecodeState":
        """``block``: tokens cached before folding into G (:class:`attention.PrefixState`);
        ``fuse``: the LayerNorms fused with the projections after them (:func:`ln_fusions`;
        "wo" folds the cross attentions' W^O the ``schedule`` allows); ``schedule``: the
        session's calibrated choices (:class:`~protocols.stacks.schedule.Schedule`);
        ``on_layer``: in malicious mode (``p.checks`` set) the cross attentions are computed
        layer by layer, ``on_layer("dec.<i>.cross")`` after each - where a job flushes its
        checks once they are large, as a Table 2 decoder's all-layer claims would not fit
        one flush; else all layers together (fewer rounds). Cost:
        :func:`cost_decode_start`."""
        B, S, _ = enc.shape

        def cross_all(**kw):
            if on_layer is None or p.checks is None:
                return cross_precompute(p, cfg, shares, enc, **kw)
            out = []
            for i in range(cfg.n_dec_layers):
                out += cross_precompute(p, cfg, shares, enc, layers=[i], **kw)
                on_layer(f"dec.{i}.cross")
            return out
        if cfg.attention != M.PERFORMER:            # KV caches of capacity max_len
            return DecodeState([KVCache.empty(B, cfg.n_heads, cfg.d_head, cfg.max_len,
                                              p.shadow is not None)
                                for _ in range(cfg.n_dec_layers)],
                               cross_all(), S,
                               fused_biases(p, shares, ln_fusions(cfg, fuse)), tuple(fuse),
                               schedule)
        scale = 1.0 / S if cfg.attn_norm == "mean" else None     # in K'^T V's truncation
        cross = [c.kv for c in cross_all(need_kv=True, kv_scale=scale)]
        cross = fold_wo_into_kv(p, cfg, shares, cross,
                                folded_layers(cfg, fuse, schedule.fold_wo))
        return DecodeState([A.PrefixState.empty(B, cfg.n_heads, cfg.n_features, cfg.d_head,
                                                block) for _ in range(cfg.n_dec_layers)],
                           cross, S, fused_biases(p, shares, ln_fusions(cfg, fuse)), tuple(fuse),
                           schedule)

    @property
    def batch(self) -> int | None:
        """The session's batch size (None for a model without decoder layers)."""
        if not self.prefix:
            return None
        return self.prefix[0].batch                  # PrefixState or KVCache


@dataclass
class FoldedWO:
    """A cross attention's W^O folded into its K'^T V for a decode session: ``m`` (B, h r, d)
    = (K'^T V)_h W^O_h stacked over the heads (times 1/n_enc with attn_norm "mean"), so that
    a step's o W^O = Q' m is one product (:func:`fold_wo_into_kv`)."""

    m: AShare


def folded_layers(cfg: M.ModelConfig, fuse, fold_wo) -> list[int]:
    """The layers whose cross attention W^O a session folds: ``fuse`` has "wo" and the
    model's schedule allows it (``fold_wo``, :func:`protocols.stacks.schedule.folded_wo`)."""
    if "wo" not in fuse or cfg.attention != M.PERFORMER:
        return []
    return [i for i in range(cfg.n_dec_layers) if f"dec.{i}.cross" in fold_wo]


def fold_wo_into_kv(p: Party, cfg: M.ModelConfig, shares: dict, cross: list,
                    layers: list[int]) -> list:
    """``cross`` (each layer's K'^T V, (B, h, r, dh)) with the ``layers``' entries replaced
    by their :class:`FoldedWO`: one product for all of them, h r d outputs per row and layer
    (2 rounds; :func:`cost_fold_wo`)."""
    if not layers:
        return cross
    if p.shadow is not None:               # the calibration files each layer apart
        if len(layers) > 1:
            for i in layers:
                cross = fold_wo_into_kv(p, cfg, shares, cross, [i])
            return cross
        p = p.at(f"dec.{layers[0]}.cross")
    h, dh, d, r = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_features
    kv = AShare(np.stack([cross[i].a for i in layers]), np.stack([cross[i].b for i in layers]))
    wo = [shares[f"dec.{i}.cross.wo"].reshape(h, dh, d) for i in layers]
    wo = AShare(np.stack([w.a for w in wo])[:, None], np.stack([w.b for w in wo])[:, None])
    m = arith.matmul_aa(p, kv, wo, site="kvwo")                      # (n, B, h, r, d)
    out = list(cross)
    for n, i in enumerate(layers):
        out[i] = FoldedWO(m[n].reshape(m.shape[1], h * r, d))
    return out


def cost_fold_wo(p_cfg, cfg: M.ModelConfig, B: int, n_layers: int) -> Cost:
    return arith.cost_mul(n_layers * B * cfg.n_heads * cfg.n_features * cfg.d_model, p_cfg)


def cost_decode_start(p_cfg, cfg: M.ModelConfig, B: int, S: int, folded: bool = True,
                      fuse=DEFAULT_FUSE, schedule: Schedule = GENERAL) -> Cost:
    """Declared cost of :meth:`DecodeState.start` on B encoder outputs of S positions: its
    :func:`cross_precompute` (K'^T V carrying the row scale 1/n_enc in its truncation for
    attn_norm "mean"), the folded W^O (:func:`fold_wo_into_kv`) and the fused LayerNorms'
    beta W."""
    scaled = cfg.attn_norm == "mean" and cfg.attention == M.PERFORMER
    n_fold = len(folded_layers(cfg, fuse, schedule.fold_wo))
    return (cost_cross_precompute(p_cfg, cfg, B, S, folded, kv_scaled=scaled)
            + (cost_fold_wo(p_cfg, cfg, B, n_fold) if n_fold else Cost(0, (0, 0, 0)))
            + cost_ln_bias(p_cfg, cfg, ln_fusions(cfg, fuse), folded))


def self_step(p, cfg, w, q, k, v, st: A.PrefixState | KVCache, featured: bool = False,
               raw: bool = False):
    """``featured``: q, k are already the Performer features (ReLU'd split projections);
    ``raw``: o W^O truncates by 2 frac (:func:`protocols.stacks.schedule.deferred_wo`)."""
    if isinstance(st, KVCache):               # softmax-style: the row against the cache
        return attend_out(p, cfg, w, st, q, k, v)
    qf, kf = (q, k) if featured else features(p, cfg, w, q, k)
    if raw:
        scale = 1.0 / (st.t + 1) if cfg.attn_norm == "mean" else None
        return finish(p, cfg, w, A.attention_step(p, st, qf, kf, v, True, scale), None, True)
    o = A.attention_step(p, st, qf, kf, v)
    return finish(p, cfg, w, o, [st.t])


def _cross_step(p, cfg, w, q, kv, featured: bool = False, raw: bool = False):
    """The cross attention of one token from its projection q (``featured``: from its
    features); kv carries 1/n_enc (a :class:`CrossKV`, softmax-style: the row against the
    encoder output's K, V); ``raw``: o W^O truncates by 2 frac
    (:func:`protocols.stacks.schedule.deferred_wo`)."""
    if isinstance(kv, CrossKV):
        return finish(p, cfg, w, heads(p, M.head_kind(cfg), q, kv.kf, kv.v), None)
    qf = q if featured else features(p, cfg, w, q, None)[0]
    if isinstance(kv, FoldedWO):                   # o W^O = Q' ((K'^T V) W^O): one product
        B = qf.shape[0]
        return add_bias(arith.matmul_aa(p, qf.reshape(B, 1, -1), kv.m, site="wo"), w, "bo")
    return finish(p, cfg, w, A.cross_attention_step(p, qf, kv, raw), None, raw)


def sublayer(p: Party, cfg: M.ModelConfig, kind: str, got: dict, w: dict, names: list[str],
             st=None, raw: bool = False) -> AShare:
    """A decode step's sublayer ``kind`` ("self", "cross", "ffn") of one layer from its
    projections ``got`` (:func:`step_project` / :func:`ln_proj`, outputs ``names``; the split
    ones under :data:`RELU`); ``w`` the sublayer's shares, ``st`` the self attention's
    PrefixState / KVCache or the cross attention's K'^T V / CrossKV; ``raw``: an attention
    whose o W^O truncates by 2 frac (:func:`protocols.stacks.schedule.deferred_wo`)."""
    featured = RELU in got
    if kind == "ffn" and featured:                 # relu_a of ffn_hidden reads the split form
        sp = got[RELU]
        return ffn_hidden(p, w, sp.z.reshape(*sp.shapes[0]), cfg.ffn_act)
    if featured:
        got = {**got, **got[RELU].relu_outputs(p)}
    if kind == "self":
        return self_step(p, cfg, w, *[split_heads(got[n], cfg.n_heads) for n in names], st,
                          featured, raw)
    if kind == "cross":
        return _cross_step(p, cfg, w, split_heads(got[names[0]], cfg.n_heads), st, featured,
                           raw)
    return ffn_hidden(p, w, got[names[0]], cfg.ffn_act)


def step_names(layer: int) -> dict[str, list[str]]:
    pre = f"dec.{layer}"
    return {"self": [f"{pre}.self.{n}" for n in ("wq_proj", "wk_proj", "wv_c")],
            "cross": [f"{pre}.cross.wq_proj"], "ffn": [f"{pre}.ffn.w1"]}


def _plan(cfg: M.ModelConfig, i: int) -> list[tuple[str, str | None, int]]:
    """Layer i's three LayerNorms in order: (ln prefix, projection kind read from it, layer of
    that projection); post-LN: ln1 -> cross, ln2 -> ffn, ln3 -> the next layer's self
    (none after the last layer); pre-LN: ln1 -> self, ln2 -> cross, ln3 -> ffn."""
    pre = f"dec.{i}"
    if cfg.norm_first:
        return [(f"{pre}.ln1", "self", i), (f"{pre}.ln2", "cross", i), (f"{pre}.ln3", "ffn", i)]
    last = i + 1 == cfg.n_dec_layers
    return [(f"{pre}.ln1", "cross", i), (f"{pre}.ln2", "ffn", i),
            (f"{pre}.ln3", None if last else "self", i + 1)]


def decoder_step(p: Party, cfg: M.ModelConfig, shares: dict, state: DecodeState,
                 y_t: AShare, on_layer: Callable[[str], None] | None = None,
                 wide: bool = False) -> AShare:
    """One token: y_t (B, d) at position state.t -> (B, d); == model.ref_decoder_step.
    The LayerNorms of ``state.fuse`` run fused with the projection after them
    (:func:`ln_fusions`). ``on_layer(name)`` is called after each layer (``dec.i``,
    ``dec.final_ln``). ``wide``: the output row at 2 frac fractional bits, the last
    normalization's product reshared untruncated (one round fewer,
    :func:`protocols.layers.norms.norm`): for the query user, who truncates it after
    reconstructing."""
    if len(y_t.shape) != 2 or y_t.shape[-1] != cfg.d_model:
        raise ValueError(f"decoder step input must be (B, {cfg.d_model}), got {y_t.shape}")
    B = y_t.shape[0]
    x = y_t.reshape(B, 1, cfg.d_model)
    post, fusions = not cfg.norm_first, ln_fusions(cfg, state.fuse)
    got = {}
    if post and cfg.n_dec_layers:                  # the first layer projects its own input
        got = step_project(p, cfg, shares, x, step_names(0)["self"])
    for i in range(cfg.n_dec_layers):
        pre = f"dec.{i}"
        ws, wc = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.cross")
        wf = sub(shares, f"{pre}.ffn")
        st, kv, names = state.prefix[i], state.cross_kv[i], step_names(i)
        plan = iter(_plan(cfg, i))

        def through_ln(x):
            ln, kind, j = next(plan)
            span = state.schedule.span(ln)
            if kind is None:                       # post-LN: the step's output
                return _ln(p, cfg, shares, ln, x, span, wide), {}
            return ln_proj(p, cfg, shares, state.ln_bias, ln, x, post, step_names(j)[kind],
                           ln in fusions, span)

        for kind, w, s in (("self", ws, st), ("cross", wc, kv), ("ffn", wf, None)):
            raw, pk = f"{pre}.{kind}" in state.schedule.raw_wo, p.at(f"{pre}.{kind}")
            if post:                # x = LN(x + sublayer(x)); LN forms the next projection
                y, got = through_ln(x + sublayer(pk, cfg, kind, got, w, names[kind], s, raw))
                x = y
            else:                   # x = x + sublayer(LN(x))
                _, got = through_ln(x)
                x = x + sublayer(pk, cfg, kind, got, w, names[kind], s, raw)
        if on_layer is not None:
            on_layer(pre)
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(p, cfg, shares, "dec.final_ln", x, state.schedule.span("dec.final_ln"), wide)
        if on_layer is not None:
            on_layer("dec.final_ln")
    elif wide and not cfg.n_dec_layers:
        x = widen(p, x)
    state.t += 1
    return x.reshape(B, cfg.d_model)


def cost_decoder_step(p_cfg, cfg: M.ModelConfig, B: int, t: int, block: int | None = None,
                      folded: bool = True, fuse=DEFAULT_FUSE, n_enc: int | None = None,
                      schedule: Schedule = GENERAL, wide: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`decoder_step` for the token at position
    ``t`` (t tokens already decoded; the self-attention cache state follows from t and
    ``block``) with the LayerNorm fusions ``fuse``, the session's ``schedule``
    (:class:`~protocols.stacks.schedule.Schedule`) and the ``wide`` output
    (:func:`decoder_step`'s).
    Rounds do not depend on t; bytes do, through the
    cache folding - or, softmax-style attention, linearly in t and in ``n_enc`` (the source
    positions the cross attention reads; required then)."""
    d, L, raw_wo = cfg.d_model, cfg.n_dec_layers, schedule.raw_wo
    ffn = cost_ffn_hidden(p_cfg, B, d, cfg.d_ff, cfg.ffn_act, split=True)
    post, fusions = not cfg.norm_first, ln_fusions(cfg, fuse)
    folds = set(folded_layers(cfg, fuse, schedule.fold_wo))
    total = cost_step_project(p_cfg, cfg, B, step_names(0)["self"], folded) if post and L else \
        Cost(0, (0, 0, 0))
    for i in range(L):
        for ln, kind, j in _plan(cfg, i):
            if kind is None:
                total = total + cost_norm(p_cfg, cfg, B, schedule.span(ln), wide)
            else:
                total = total + cost_ln_proj(p_cfg, cfg, B, step_names(j)[kind], post, folded,
                                              ln in fusions, schedule.span(ln))
        core = _cost_attention_cores(p_cfg, cfg, B, t, block, folded, n_enc,
                                     {k for k in ("self", "cross") if f"dec.{i}.{k}" in raw_wo},
                                     i in folds)
        total = total + core["self"] + core["cross"] + ffn
    return total + cost_norm(p_cfg, cfg, B, schedule.span("dec.final_ln"), wide) \
        if cfg.norm_first and L else total


def cost_self_core(p_cfg, cfg: M.ModelConfig, B: int, t: int, block: int | None,
                   folded: bool, raw: bool = False) -> Cost:
    """:func:`self_step` from its projections, the token at position t: relu-performer the
    features' ReLU, the step (``raw``: deferred, :func:`protocols.stacks.schedule.deferred_wo`) and
    W^O; softmax-style the KV-cache row. Shared with the LM's steps."""
    if cfg.attention != M.PERFORMER:
        return cost_attend_out(p_cfg, cfg, B, t)
    h, r, dh = cfg.n_heads, cfg.n_features, cfg.d_head
    block = A.default_decode_block(r, dh) if block is None else int(block)
    return (cost_features(p_cfg, B * h * 2 * r, folded)
            + A.cost_attention_step(p_cfg, B, h, r, dh, t % block, t >= block, block, raw,
                                    raw and cfg.attn_norm == "mean")
            + cost_finish(p_cfg, cfg, B, raw=raw))


def _cost_attention_cores(p_cfg, cfg: M.ModelConfig, B: int, t: int, block: int | None,
                          folded: bool, n_enc: int | None, raw=frozenset(),
                          fold: bool = False) -> dict[str, Cost]:
    """A decode step's self and cross attention of one layer after their projections
    (``raw``: the kinds whose o W^O truncates by 2 frac; ``fold``: the cross attention's
    W^O folded into its K'^T V, :class:`FoldedWO`)."""
    h, r, dh = cfg.n_heads, cfg.n_features, cfg.d_head
    if cfg.attention != M.PERFORMER:
        if n_enc is None:
            raise ValueError("a softmax-style decode step's cost depends on the source "
                             "length: pass n_enc")
        return {"self": cost_attend_out(p_cfg, cfg, B, t),
                "cross": (cost_heads(p_cfg, M.head_kind(cfg), B, h, 1, n_enc, dh)
                          + cost_finish(p_cfg, cfg, B, row_scale=False))}
    raw_cross = "cross" in raw
    cross = (arith.cost_mul(B * cfg.d_model, p_cfg) if fold else
             arith.cost_mul(B * h * dh, p_cfg, not raw_cross)
             + cost_finish(p_cfg, cfg, B, row_scale=False, raw=raw_cross))
    return {"self": cost_self_core(p_cfg, cfg, B, t, block, folded, "self" in raw),
            "cross": cost_features(p_cfg, B * h * r, folded) + cross}
