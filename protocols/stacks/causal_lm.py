"""Secure decoder-only causal LM (GPT-style, ``arch = "decoder-only"``): prompt prefill in one
pass and O(1) incremental steps; exactly :func:`protocols.model.ref_lm` /
:func:`protocols.model.ref_lm_step` on shares.

Per layer ``dec.i`` (post-LN; pre-LN analogous, final LayerNorm ``dec.final_ln``)::

    x = LN1(x + MaskedMHA(x));  x = LN2(x + FFN(x))

The masked ReLU-Performer self-attention keeps, per layer and head, the decode state of the
translator's decoder (:class:`protocols.layers.attention.PrefixState`: G = sum_j K'_j^T V_j over
the folded prefix plus a cache of fewer than ``block`` tokens), so a generated token costs
O(1) in the prefix (:func:`lm_step`, the same kernel calls as the translator's decoder step
without cross attention).

Prefill (:func:`lm_prefill`): the prompt's T rows go through every layer at once. Its masked
attention (:func:`prefill_attention`) is Alg. 3 in row blocks of the *decode* block L: stage 1
(one kernel call) forms the in-block causal scores and K'_b^T V_b of every full block, stage 2
one product [Q'_b | tril(Q'_b K'_b^T)] @ [P_b ; V_b] (P_b the exclusive prefix sum, local);
the full blocks' sum is the state's G and the rows of the last partial block its cache - the
state is exactly the one T decode steps would leave, with two products per layer instead of
2T. In the last layer only the last row goes on past the attention (its FFN and LayerNorms),
since only the last position's hidden state is returned.

Softmax-style attention (``attention`` softmax, power-softmax, sigma-relu) keeps a secret KV
cache per layer instead (:class:`protocols.layers.kv_cache.KVCache`, capacity ``max_len``): the
prefill runs the masked attention over the prompt and keeps its keys and values (in the last
layer only the last row's query is projected and attends, to all T keys), a step appends the
token's k, v and computes its single row against every cached key - O(t) bytes per token,
rounds independent of t (:func:`protocols.layers.kv_cache.attend`).

LayerNorm fusion (:func:`lm_fusions`, as the translator's decode step does): a step's
LayerNorm may form the projections that read it inside its own rounds
(:func:`protocols.layers.layernorm.layernorm_project`) - pre-LN: LN1 the self attention's Q, K, V,
LN2 the FFN's W1; post-LN: LN1 W1, LN2 the next layer's Q, K, V - saving the projection's
two rounds per fused LayerNorm for one more truncated product per projection output. The
session's beta W constants are formed once, at the end of the prefill (:class:`LMState`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers import attention as A
from protocols.layers.ffn import cost_ffn, cost_ffn_hidden, ffn
from protocols.layers.kv_cache import KVCache, attend_out, cost_attend_out
from protocols.layers.layernorm import _bcast
from protocols.layers.ln_proj import (
    cost_ln_bias,
    cost_ln_proj,
    fused_biases,
    fusion_map,
    ln_proj,
)
from protocols.layers.mha import (
    cost_features,
    cost_finish,
    cost_project,
    cost_project_features,
    cost_qkv,
    finish,
    project,
    qkv_features,
)
from protocols.layers.norms import cost_norm, norm
from protocols.layers.secure_model import OUT_SCALE, sub

from .decoder import cost_self_core, self_step, step_names, sublayer
from .schedule import GENERAL, Schedule

#: the projections a step may form inside the LayerNorm before them (:func:`lm_fusions`).
#: Each fused LayerNorm saves 2 rounds per layer for one truncated product per projection
#: output. The default (W1 only) costs 3-10 % more bytes per token (declared, cost_lm_step:
#: GPT-2 small's shape, relu-performer pre-LN, 516 -> 492 rounds, +6.0 %; the Table 2 shape
#: 212 -> 200, +5.5 %, sigma-relu +10.1 %; the shipped LM 76 -> 72, +3.4 %); Q, K, V too
#: ("self") 11-25 % (GPT-2 small: 468 rounds, +22.5 %).
LM_FUSIONS = ("self", "ffn")
DEFAULT_LM_FUSE = ("ffn",)


def lm_fusions(cfg: M.ModelConfig, fuse=DEFAULT_LM_FUSE) -> dict[str, list[str]]:
    """The LayerNorms of an LM step fused with the projection reading them: ln prefix ->
    weight share names. Pre-LN: ln1 -> W^Q, W^K, W^V, ln2 -> W1; post-LN: ln1 -> W1, ln2 ->
    the next layer's W^Q, W^K, W^V (the last layer's ln2 is the output). Only the kinds in
    ``fuse`` (:data:`LM_FUSIONS`), only LayerNorm (its inverse square root's rounds carry
    the products) and only layers with an FFN (a pruned one has no LayerNorm)."""
    def plan(i: int) -> dict[str, tuple[str, list[str]]]:
        pre, names = f"dec.{i}", step_names(i)
        if cfg.norm_first:
            kinds = {"self": (f"{pre}.ln1", names["self"])}
            if cfg.has_ffn(i):
                kinds["ffn"] = (f"{pre}.ln2", names["ffn"])
            return kinds
        if not cfg.has_ffn(i):
            return {}
        kinds = {"ffn": (f"{pre}.ln1", names["ffn"])}
        if i + 1 < cfg.n_dec_layers:
            kinds["self"] = (f"{pre}.ln2", step_names(i + 1)["self"])
        return kinds
    return fusion_map(cfg, fuse, LM_FUSIONS, "LM", plan)


@dataclass
class LMState:
    """Secret state of one party's LM session: per layer a PrefixState (relu-performer) or a
    KVCache (softmax-style attention); ``ln_bias``: beta W of the fused LayerNorm projections
    (:func:`lm_fusions` of ``fuse``); t is public."""

    prefix: list[A.PrefixState | KVCache]
    t: int = 0
    ln_bias: dict = field(default_factory=dict)
    fuse: tuple = ()                 # lm_prefill sets its fuse (default DEFAULT_LM_FUSE)
    schedule: Schedule = GENERAL     # the steps' calibrated choices

    @property
    def batch(self) -> int:
        return self.prefix[0].batch                  # PrefixState or KVCache


def _blocks(x: AShare, L: int, nb: int) -> AShare:
    """(B, h, T, k) -> (B, h, nb, L, k), zero-padded rows."""
    B, h, T, k = x.shape
    pad = nb * L - T
    if pad:
        z = np.zeros((B, h, pad, k), dtype=np.uint64)
        x = AShare.concat([x, AShare(z, z.copy())], axis=2)
    return x.reshape(B, h, nb, L, k)


def prefill_attention(p: Party, qf: AShare, kf: AShare, v: AShare,
                      block: int | None = None) -> tuple[AShare, A.PrefixState]:
    """Causal ReLU attention of T prompt rows and the decode state they leave.

    qf, kf (B, h, T, r), v (B, h, T, dh) -> (Q'_i G_i rows (B, h, T, dh), PrefixState with
    t = T, G over the floor(T/L)*L first tokens and the rest cached). ``block`` L: the decode
    block (default :func:`protocols.layers.attention.default_decode_block`).
    Cost: :func:`cost_prefill_attention`."""
    B, h, T, r = qf.shape
    dh = v.shape[-1]
    L = A.default_decode_block(r, dh) if block is None else int(block)
    if L < 1:
        raise ValueError(f"decode block={block} must be >= 1")
    nb, nf = -(-T // L), T // L
    qb, kb, vb = _blocks(qf, L, nb), _blocks(kf, L, nb), _blocks(v, L, nb)
    items = [(qb, kb.T, "matmul", A.tril_mask(L).astype(bool))]
    if nf:
        items.append((kb[:, :, :nf].T, vb[:, :, :nf], "matmul"))
    got = A.mul_many(p, items, sites=["scores", "kv"][:len(items)])
    scores = got[0]
    z = np.zeros((B, h, r, dh), dtype=np.uint64)
    G = AShare(z, z.copy())
    left, right = scores, vb
    if nf:
        csum = AShare(np.cumsum(got[1].a, axis=2, dtype=np.uint64),
                      np.cumsum(got[1].b, axis=2, dtype=np.uint64))
        G = csum[:, :, nf - 1].copy()
        if nb > 1:
            zero = np.zeros((B, h, 1, r, dh), dtype=np.uint64)
            prefix = AShare.concat([AShare(zero, zero.copy()), csum[:, :, :nb - 1]], axis=2)
            left = AShare.concat([qb, scores], axis=-1)              # (B,h,nb,L,r+L)
            right = AShare.concat([prefix, vb], axis=-2)             # (B,h,nb,r+L,dh)
    out = arith.matmul_aa(p, left, right, site="out").reshape(B, h, nb * L, dh)[:, :, :T]
    rest = T - nf * L
    state = A.PrefixState(G, block=L, t=T, folded=nf * L)
    if rest:
        state.kc, state.vc = kf[:, :, nf * L:].copy(), v[:, :, nf * L:].copy()
    return out, state


def cost_prefill_attention(p_cfg, B: int, h: int, T: int, r: int, dh: int,
                           block: int | None = None) -> Cost:
    L = A.default_decode_block(r, dh) if block is None else int(block)
    nb, nf = -(-T // L), T // L
    first = B * h * (nb * L * (L + 1) // 2 + nf * r * dh)
    return (arith.cost_mul(first, p_cfg)
            + arith.cost_mul(B * h * nb * L * dh, p_cfg))


def _ln(p, cfg, shares, prefix, x, schedule: Schedule = GENERAL, span=None):
    """The norm at ``prefix`` with the schedule's RMSNorm gain (``span``: a step's table)."""
    return norm(p, cfg, shares, prefix, x, span, gain=schedule.gain(prefix))


def _ffn_block(p: Party, cfg: M.ModelConfig, shares: dict, i: int, x: AShare,
               wf: dict, schedule: Schedule = GENERAL) -> AShare:
    """Layer i after its attention's residual sum x (post-LN: before LN1): LN1 (post-LN),
    the FFN and LN2; nothing for a pruned FFN (``ffn_pruned``: norm none, so no LN either).
    AERO's FFN scales are folded into the shares (:func:`_out_scale`)."""
    pre = f"dec.{i}"
    if not cfg.has_ffn(i):
        return x
    pf = p.at(f"{pre}.ffn")
    if cfg.norm_first:
        return x + ffn(pf, wf, _ln(p, cfg, shares, f"{pre}.ln2", x, schedule), cfg.ffn_act)
    x = _ln(p, cfg, shares, f"{pre}.ln1", x, schedule)
    return _ln(p, cfg, shares, f"{pre}.ln2", x + ffn(pf, wf, x, cfg.ffn_act), schedule)


def _out_scale(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare) -> AShare:
    """AERO's folded FFN scales (``ffn_scale``): the stack ran on x / C_L; times C_L =
    ``dec.out_scale`` (one truncated product of the returned rows)."""
    if not cfg.ffn_scale:
        return x
    return arith.mul_aa(p.at(OUT_SCALE), x, _bcast(shares[OUT_SCALE], x.shape),
                        site="out_scale")


def _check(cfg: M.ModelConfig) -> None:
    if cfg.arch != M.DECODER_ONLY:
        raise ValueError(f"this needs a decoder-only model, got arch {cfg.arch!r}")


def lm_prefill(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare,
               block: int | None = None, on_layer: Callable[[str], None] | None = None,
               fuse=DEFAULT_LM_FUSE,
               schedule: Schedule = GENERAL) -> tuple[AShare, LMState]:
    """Prompt x (B, T, d) -> (final hidden row of its last position (B, d), the session's
    LMState after T tokens, its steps fusing the LayerNorms of ``fuse`` and following the
    ``schedule`` (:class:`~protocols.stacks.schedule.Schedule`)). ``on_layer(name)``
    after each layer (``dec.i``, ``dec.final_ln``). Cost: :func:`cost_lm_prefill`."""
    _check(cfg)
    fusions = lm_fusions(cfg, fuse)               # an unknown kind is refused before any round
    if len(x.shape) != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"prompt must be (B, T, {cfg.d_model}), got {x.shape}")
    B, T, _ = x.shape
    if T > cfg.max_len:
        raise ValueError(f"a prompt of {T} tokens exceeds max_len {cfg.max_len}")
    mark = on_layer or (lambda name: None)
    states, n = [], np.arange(1, T + 1)
    every = p.shadow is not None       # calibrated: every row goes on, as the last row of the
    for i in range(cfg.n_dec_layers):  # prompt that ends there would (row i sees rows <= i)
        pre, last = f"dec.{i}", i == cfg.n_dec_layers - 1 and not every
        w, wf, pa = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.ffn"), p.at(f"{pre}.self")
        u = _ln(p, cfg, shares, f"{pre}.ln1", x, schedule) if cfg.norm_first else x
        if cfg.attention != M.PERFORMER:   # KV cache; the last layer needs the last query only
            q, k, v = project(pa, cfg, w, u[:, T - 1:] if last else u, u)
            st = KVCache.empty(B, cfg.kv_heads, cfg.d_head, cfg.max_len, p.shadow is not None)
            x = (x[:, -1:] if last else x) + attend_out(pa, cfg, w, st, q, k, v)
        else:
            qf, kf, v = qkv_features(pa, cfg, w, u, None)
            o, st = prefill_attention(pa, qf, kf, v, block)
            x = x + finish(pa, cfg, w, o, n)
        states.append(st)
        if last:                       # only the last position's hidden row is returned
            x = x[:, -1:]
        x = _ffn_block(p, cfg, shares, i, x, wf, schedule)
        mark(pre)
    if cfg.norm_first:
        x = _ln(p, cfg, shares, "dec.final_ln", x, schedule)
        mark("dec.final_ln")
    state = LMState(states, T, fused_biases(p, shares, fusions), tuple(fuse), schedule)
    if fusions:                    # the session's beta W1: after the last layer's mark
        mark("dec.ln_bias")
    return _out_scale(p, cfg, shares, x)[:, -1:].reshape(B, cfg.d_model), state


def lm_open(p: Party, cfg: M.ModelConfig, shares: dict, B: int, block: int | None = None,
            fuse=DEFAULT_LM_FUSE, schedule: Schedule = GENERAL) -> LMState:
    """The state :func:`lm_prefill` of an empty prompt would leave: every token stepped
    (the calibration's steps, :mod:`protocols.calibration.shadow`). Cost: its fused LayerNorms'
    beta W (:func:`protocols.layers.ln_proj.cost_ln_bias`)."""
    _check(cfg)
    fusions = lm_fusions(cfg, fuse)
    h, dh = cfg.n_heads, cfg.d_head
    states = [KVCache.empty(B, cfg.kv_heads, dh, cfg.max_len, p.shadow is not None)
              if cfg.attention != M.PERFORMER else
              A.PrefixState.empty(B, h, cfg.n_features, dh, block)
              for _ in range(cfg.n_dec_layers)]
    return LMState(states, 0, fused_biases(p, shares, fusions), tuple(fuse), schedule)


def lm_step(p: Party, cfg: M.ModelConfig, shares: dict, state: LMState, y_t: AShare,
            on_layer: Callable[[str], None] | None = None) -> AShare:
    """One token: y_t (B, d) embedded at position state.t -> final hidden row (B, d);
    O(1) in the prefix. Cost: :func:`cost_lm_step`."""
    _check(cfg)
    if len(y_t.shape) != 2 or y_t.shape[-1] != cfg.d_model:
        raise ValueError(f"LM step input must be (B, {cfg.d_model}), got {y_t.shape}")
    B = y_t.shape[0]
    if B != state.batch:
        raise ValueError(f"step batch {B} differs from the session's {state.batch}")
    x = y_t.reshape(B, 1, cfg.d_model)
    fusions, got = lm_fusions(cfg, state.fuse), None

    def through_ln(ln: str, x: AShare, want_y: bool, names: list[str]):
        """LN ``ln`` of x, and the projections ``names`` if it forms them: (y, got)."""
        span = state.schedule.span(ln)
        if ln not in fusions:
            return _ln(p, cfg, shares, ln, x, state.schedule, span), None
        return ln_proj(p, cfg, shares, state.ln_bias, ln, x, want_y, names, True, span)

    for i in range(cfg.n_dec_layers):
        pre, names = f"dec.{i}", step_names(i)
        w, wf, st = sub(shares, f"{pre}.self"), sub(shares, f"{pre}.ffn"), state.prefix[i]
        pre_ln, raw = cfg.norm_first, f"{pre}.self" in state.schedule.raw_wo
        pa, pf = p.at(f"{pre}.self"), p.at(f"{pre}.ffn")
        u, got = through_ln(f"{pre}.ln1", x, False, names["self"]) if pre_ln else (x, got)
        if got:                        # Q, K, V formed by the LayerNorm before
            x = x + sublayer(pa, cfg, "self", got, w, names["self"], st, raw)
        elif isinstance(st, KVCache):
            x = x + attend_out(pa, cfg, w, st, *project(pa, cfg, w, u, None, pos=st.t))
        else:
            x = x + self_step(pa, cfg, w, *qkv_features(pa, cfg, w, u, None), st, True, raw)
        got = None
        if cfg.has_ffn(i):      # pre-LN: x + FFN(LN2(x)); post-LN: LN2(y + FFN(y)), y = LN1(x)
            y, hid = through_ln(f"{pre}.ln{2 if pre_ln else 1}", x, not pre_ln, names["ffn"])
            h = (sublayer(pf, cfg, "ffn", hid, wf, names["ffn"]) if hid else
                 ffn(pf, wf, y, cfg.ffn_act))
            x = x + h if pre_ln else y + h
            if not pre_ln:             # LN2 may form the next layer's Q, K, V
                nxt = step_names(i + 1)["self"] if i + 1 < cfg.n_dec_layers else []
                x, got = through_ln(f"{pre}.ln2", x, True, nxt)
        if on_layer is not None:
            on_layer(pre)
    if cfg.norm_first:
        x = _ln(p, cfg, shares, "dec.final_ln", x, state.schedule,
                state.schedule.span("dec.final_ln"))
        if on_layer is not None:
            on_layer("dec.final_ln")
    state.t += 1
    return _out_scale(p, cfg, shares, x).reshape(B, cfg.d_model)


# -------------------------------------------------------------------- declared costs ----
def _attn_io(p_cfg, cfg: M.ModelConfig, B: int, T: int, folded: bool = True,
             raw: bool = False) -> Cost:
    """Projections, ReLU features (Omega folded into the projections, or its own product:
    mha.qkv_features), 1/n rows and W^O of T new rows."""
    d, h, r = cfg.d_model, cfg.n_heads, cfg.n_features
    io = (cost_project_features(p_cfg, B * h * 2 * T * r, B * T * d) if folded else
          cost_project(p_cfg, 3 * B * T * d) + cost_features(p_cfg, B * h * 2 * T * r, False))
    return io + cost_finish(p_cfg, cfg, B * T, raw=raw)


def _rest(p_cfg, cfg: M.ModelConfig, rows_in: int, rows: int, i: int = 0) -> Cost:
    """LayerNorms and FFN of layer i: the attention saw ``rows_in`` rows, ``rows`` go on."""
    d = cfg.d_model
    if not cfg.has_ffn(i):
        return Cost(0, (0, 0, 0))
    ln = cost_norm(p_cfg, cfg, rows_in if cfg.norm_first else rows)
    return ln + cost_ffn(p_cfg, rows, d, cfg.d_ff, cfg.ffn_act) + cost_norm(p_cfg, cfg, rows)


def _kv_attn(p_cfg, cfg: M.ModelConfig, B: int, t0: int, n: int, rows: int) -> Cost:
    """Softmax-style attention with the KV cache: projections (q of ``rows`` rows, k and v
    of n), :func:`protocols.layers.kv_cache.attend_out` (the attention and W^O)."""
    return (cost_qkv(p_cfg, cfg, B * rows, B * n)
            + cost_attend_out(p_cfg, cfg, B, t0, n, rows))


def cost_lm_prefill(p_cfg, cfg: M.ModelConfig, B: int, T: int,
                    block: int | None = None, fuse=DEFAULT_LM_FUSE, folded: bool = True) -> Cost:
    """Declared rounds and bytes per party of :func:`lm_prefill` (``folded``: Omega folded
    into the shares, secure_model's default), whose session fuses the LayerNorms of ``fuse``
    (their beta W: :func:`decoder.cost_ln_bias`)."""
    h, r, dh = cfg.n_heads, cfg.n_features, cfg.d_head
    cost = Cost(0, (0, 0, 0))
    for i in range(cfg.n_dec_layers):
        last = i == cfg.n_dec_layers - 1
        rows = B if last else B * T
        if cfg.attention != M.PERFORMER:
            attn = _kv_attn(p_cfg, cfg, B, 0, T, 1 if last else T)
        else:
            attn = (_attn_io(p_cfg, cfg, B, T, folded)
                    + cost_prefill_attention(p_cfg, B, h, T, r, dh, block))
        cost = cost + attn + _rest(p_cfg, cfg, B * T, rows, i)
    return cost + _cost_end(p_cfg, cfg, B) + cost_ln_bias(p_cfg, cfg, lm_fusions(cfg, fuse),
                                                          folded)


def _cost_end(p_cfg, cfg: M.ModelConfig, B: int, span=None) -> Cost:
    """The final norm (pre-LN, its table ``span``) and AERO's folded FFN scales
    (:func:`_out_scale`)."""
    cost = cost_norm(p_cfg, cfg, B, span) if cfg.norm_first else Cost(0, (0, 0, 0))
    if cfg.ffn_scale:
        cost = cost + arith.cost_mul(B * cfg.d_model, p_cfg)
    return cost


def cost_lm_step(p_cfg, cfg: M.ModelConfig, B: int, t: int, block: int | None = None,
                 fuse=DEFAULT_LM_FUSE, folded: bool = True,
                 schedule: Schedule = GENERAL) -> Cost:
    """Declared cost of :func:`lm_step` for the token at position ``t`` (t tokens before it)
    in a session fusing the LayerNorms of ``fuse`` (:func:`lm_fusions`) with the ``schedule``
    (:class:`~protocols.stacks.schedule.Schedule`), Omega ``folded`` into the shares or
    not: relu-performer: it depends on t only through t mod block (O(1) in the prefix);
    softmax-style (KV cache): bytes linear in t, rounds independent of t."""
    h, r, dh, d = cfg.n_heads, cfg.n_features, cfg.d_head, cfg.d_model
    L = A.default_decode_block(r, dh) if block is None else int(block)
    raw_wo = schedule.raw_wo

    def attn(raw: bool) -> Cost:               # projections, features, the step and W^O
        if cfg.attention != M.PERFORMER:
            return _kv_attn(p_cfg, cfg, B, t, 1, 1)
        return (_attn_io(p_cfg, cfg, B, 1, folded, raw)
                + A.cost_attention_step(p_cfg, B, h, r, dh, t % L, t >= L, L, raw,
                                        raw and cfg.attn_norm == "mean"))

    fusions, pre_ln = lm_fusions(cfg, fuse), cfg.norm_first

    def norm_b(ln: str) -> Cost:
        return cost_norm(p_cfg, cfg, B, schedule.span(ln))

    def ln_proj_cost(ln: str, names: list[str], want_y: bool) -> Cost | None:
        return (cost_ln_proj(p_cfg, cfg, B, names, want_y, folded, True, schedule.span(ln))
                if ln in fusions else None)

    cost, formed = Cost(0, (0, 0, 0)), False    # formed: Q, K, V made by the LN before
    for i in range(cfg.n_dec_layers):
        pre, names = f"dec.{i}", step_names(i)
        raw = f"{pre}.self" in raw_wo
        core = cost_self_core(p_cfg, cfg, B, t, L, folded, raw)
        if pre_ln:
            fused = ln_proj_cost(f"{pre}.ln1", names["self"], False)
            cost = cost + (fused + core if fused is not None else norm_b(f"{pre}.ln1")
                           + attn(raw))
        else:
            cost = cost + (core if formed else attn(raw))
        formed = False
        if cfg.has_ffn(i):
            ln = f"{pre}.ln{2 if pre_ln else 1}"
            fused = ln_proj_cost(ln, names["ffn"], not pre_ln)
            cost = cost + (fused + cost_ffn_hidden(p_cfg, B, d, cfg.d_ff, cfg.ffn_act, split=True)
                           if fused is not None else
                           norm_b(ln) + cost_ffn(p_cfg, B, d, cfg.d_ff, cfg.ffn_act))
            if not pre_ln:
                nxt = step_names(i + 1)["self"] if i + 1 < cfg.n_dec_layers else []
                fused = ln_proj_cost(f"{pre}.ln2", nxt, True)
                formed = fused is not None
                cost = cost + (fused if formed else norm_b(f"{pre}.ln2"))
    return cost + _cost_end(p_cfg, cfg, B, schedule.span("dec.final_ln"))
