"""A LayerNorm and the linear layer after it, as a decode step runs them (issue 12): the
projections of a token's row (:func:`step_project`, the outputs that only feed relu_a in split
form, :data:`RELU`), a LayerNorm forming them in its own rounds (:func:`ln_proj`, fused:
:func:`protocols.layers.layernorm.layernorm_project`, with the session's beta W from
:func:`fused_biases`), and which LayerNorms of a model do so (:func:`fusion_map`; the session's
choice, :func:`fusion_choice`). Shared by the translator's decoder step
(:mod:`protocols.stacks.decoder`) and the decoder-only LM's (:mod:`protocols.stacks.causal_lm`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mpc3.kernels import arith
from mpc3.kernels.base import Cost, run_steps
from mpc3.party import Party, profiled
from mpc3.shares import AShare, SplitShare
from protocols import model as M

from . import attention as A
from .layernorm import cost_layernorm_project, layernorm_project
from .norms import cost_norm, norm
from .secure_model import PROJ_EXTRA


def fusion_map(cfg: M.ModelConfig, fuse, allowed: tuple, what: str,
               plan: Callable[[int], dict]) -> dict[str, list[str]]:
    """ln prefix -> weight names of the kinds in ``fuse`` (a subset of ``allowed``, else a
    ValueError naming ``what``), ``plan(i)`` giving layer i's {kind: (ln prefix, names)};
    empty unless the model's norm is LayerNorm."""
    unknown = set(fuse) - set(allowed)
    if unknown:
        raise ValueError(f"{what} fusions {sorted(unknown)} unknown (choose from {allowed})")
    out: dict[str, list[str]] = {}
    # the fused projections are plain products: not a rotated / grouped q, k, v, nor the
    # gated FFN's two
    skip = {"self"} if cfg.embedding == M.ROTARY or cfg.n_kv_heads else set()
    skip |= {"ffn"} if cfg.ffn_act == M.GATED else set()
    for i in range(cfg.n_dec_layers if cfg.norm == "layernorm" else 0):
        kinds = plan(i)
        out.update(kinds[kind] for kind in fuse if kind in kinds and kind not in skip)
    return out


def fusion_choice(value, allowed: tuple, default: tuple, what: str) -> tuple:
    """A session's LayerNorm fusions from its job parameter ``fuse``: None or "default" ->
    ``default``, "all" -> ``allowed``, "none" -> (), else a comma list of kinds in
    ``allowed`` (ValueError naming ``what`` otherwise); in ``allowed``'s order. A scheduling
    choice only: every choice computes the same function (fewer rounds, more bytes)."""
    if value is None or value == "default":
        return tuple(default)
    if not isinstance(value, str):
        raise ValueError(f"{what} fuse must be a string, got {type(value).__name__}")
    kinds = {"all": set(allowed), "none": set()}.get(value)
    if kinds is None:
        kinds = {k.strip() for k in value.split(",")}
        if not kinds <= set(allowed):
            raise ValueError(f"{what} fuse {value[:40]!r}: choose default, all, none or a comma "
                             f"list of {', '.join(allowed)}")
    return tuple(k for k in allowed if k in kinds)


def _site(name: str) -> str:
    """The calibration site of a LayerNorm's product with weight ``name`` (site_catalog)."""
    return "lnw1" if name.endswith(".w1") else "lnproj"


def _own_site(name: str) -> str:
    """The calibration site of a projection formed after its LayerNorm (step_project)."""
    return "w1" if name.endswith(".w1") else "proj"


def _proj_bits(p_cfg, name: str) -> int:
    return p_cfg.frac + (0 if name.endswith(".w1") else PROJ_EXTRA)


@profiled
def fused_biases(p: Party, shares: dict, fusions: dict[str, list[str]]
                 ) -> dict[tuple[str, str], AShare]:
    """beta W (+ b1 for W1) of every fused (LayerNorm, projection) of ``fusions`` (ln prefix ->
    weight names): model constants formed once per session, one product kernel per
    LayerNorm, all in the same rounds (so the bytes are a sum over LayerNorms)."""
    if not fusions:
        return {}
    kernels, got = [], []
    for ln, ws in fusions.items():
        kernels.append(arith.mul_many_steps(p.at(ln), [(shares[f"{ln}.beta"].reshape(1, -1),
                                                        shares[w], "matmul", _proj_bits(p.cfg, w))
                                                       for w in ws], [_site(w) for w in ws]))
        if p.shadow is not None:    # the calibration: one LayerNorm's weights read at a time
            got += run_steps(p, kernels.pop())
    got += run_steps(p, *kernels) if kernels else []
    return {(ln, w): _plus_bias(shares, w, v.reshape(-1))
            for (ln, ws), vs in zip(fusions.items(), got) for w, v in zip(ws, vs)}


def cost_ln_bias(p_cfg, cfg: M.ModelConfig, fusions: dict[str, list[str]],
                 folded: bool = True) -> Cost:
    return Cost.parallel(*[arith.cost_mul_many(
        np.concatenate([np.full(_width(cfg, w, folded), _proj_bits(p_cfg, w)) for w in ws]),
        0, p_cfg.trunc) for ws in fusions.values()]) if fusions else Cost(0, (0, 0, 0))


def _width(cfg: M.ModelConfig, name: str, folded: bool = True) -> int:
    if name.endswith(".w1"):      # a linear FFN is shared fused: w1 = W1 W2 (d, d)
        return cfg.d_model if cfg.ffn_act == "none" else cfg.d_ff
    if name.endswith(".wv_c") or cfg.attention != M.PERFORMER:     # no features: W (d, d)
        return cfg.d_model
    return cfg.n_heads * cfg.n_features if folded else cfg.d_model


#: key of a projection dict (:func:`step_project`, :func:`ln_proj`) holding the outputs that only
#: feed relu_a, made in split form (:class:`_Split`)
RELU = "relu"


@dataclass
class _Split:
    """Projection outputs that only feed relu_a - the folded Performer's Q' and K' features,
    a ReLU FFN's hidden layer - as ONE SplitShare of their flattened values (arith
    .mul_split_aa, biases added: 8 bytes per element less than replicated outputs)."""

    z: SplitShare
    names: list[str]
    shapes: list[tuple]

    def relu_outputs(self, p: Party) -> dict[str, AShare]:
        return dict(zip(self.names, A.relu_split(p, self.z, self.shapes, "features")))


def _feeds_relu(cfg: M.ModelConfig, name: str, folded: bool) -> bool:
    """Whether projection ``name``'s output only feeds relu_a (then it is made split)."""
    if name.endswith(".w1"):
        return cfg.ffn_act == "relu"
    return cfg.attention == M.PERFORMER and folded and name.endswith(("wq_proj", "wk_proj"))


def _split_names(cfg: M.ModelConfig, shares: dict, names: list[str]) -> list[str]:
    return [w for w in names
            if _feeds_relu(cfg, w, f"{w.rsplit('.', 1)[0]}.omega" not in shares)]


@profiled
def step_project(p: Party, cfg: M.ModelConfig, shares: dict, y: AShare, names: list[str]) -> dict:
    """y W (+ bias) for the projections ``names`` in one round of products: {name: AShare},
    and under :data:`RELU` a :class:`_Split` of those that only feed relu_a (a shadow party
    files the products under the projections' layer)."""
    split = _split_names(cfg, shares, names)
    plain = [w for w in names if w not in split]
    if names:
        p = p.at(names[0].rsplit(".", 1)[0])
    if not split:
        return {w: _plus_bias(shares, w, o) for w, o in zip(plain, arith.mul_many_aa(
            p, [(y, shares[w], "matmul", _proj_bits(p.cfg, w)) for w in plain],
            [_own_site(w) for w in plain]))}
    bits = {_proj_bits(p.cfg, w) for w in names}
    if len(bits) != 1:
        raise ValueError(f"projections {names} truncate differently: not one call")
    z, out = arith.mul_split_aa(p, [(y, shares[w], "matmul") for w in split], trunc=bits.pop(),
                                replicated=[(y, shares[w], "matmul") for w in plain],
                                biases=[_bias_of(shares, w) for w in split],
                                sites=[_own_site(w) for w in split + plain])
    got = {w: _plus_bias(shares, w, o) for w, o in zip(plain, out)}
    got[RELU] = _Split(z, split, [(*y.shape[:-1], shares[w].shape[-1]) for w in split])
    return got


def cost_step_project(p_cfg, cfg: M.ModelConfig, B: int, names: list[str], folded: bool) -> Cost:
    """:func:`step_project` of one row per batch element."""
    split = [w for w in names if _feeds_relu(cfg, w, folded)]
    widths = {w: B * _width(cfg, w, folded) for w in names}
    if not split:
        return arith.cost_mul_many(np.concatenate([np.full(widths[w], _proj_bits(p_cfg, w))
                                                   for w in names]), 0, p_cfg.trunc)
    return arith.cost_mul_split(sum(widths[w] for w in split), p_cfg, _proj_bits(p_cfg, split[0]),
                                n_rep=sum(widths[w] for w in names if w not in split))


def ln_proj(p, cfg, shares, ln_bias: dict, ln: str, x, want_y: bool, names: list[str],
             fused: bool, span=None):
    """LN ``ln`` of x and its projections ``names``: (y or None, {name: LN(x) W (+ b1)}, with
    the outputs that only feed relu_a under :data:`RELU`), ``fused``
    (:func:`protocols.layers.layernorm.layernorm_project`, ``ln_bias``: :func:`fused_biases` of the
    session's fusions), else the LayerNorm and then one round of products (:func:`step_project`).
    ``span``: the LayerNorm's calibrated variance octaves (:func:`protocols.layers.norms.norm`)."""
    if not fused:
        y = norm(p, cfg, shares, ln, x, span)
        return (y if want_y else None), step_project(p, cfg, shares, y, names)
    split = _split_names(cfg, shares, names)
    y, outs, z = layernorm_project(p.at(ln), x, shares[f"{ln}.gamma"], shares[f"{ln}.beta"],
                                   cfg.ln_eps, [(shares[w], _proj_bits(p.cfg, w)) for w in names],
                                   want_y, split=[names.index(w) for w in split],
                                   split_biases=[ln_bias[(ln, w)] for w in split], span=span,
                                   sites=[_site(w) for w in names])
    got = {w: o + bcast_row(ln_bias[(ln, w)], o.shape)
           for w, o in zip(names, outs) if o is not None}
    if split:
        got[RELU] = _Split(z, split, [(*x.shape[:-1], shares[w].shape[-1]) for w in split])
    return y, got


#: the bias added after each projection's product: the FFN's b1, the attention biases
#: (ModelConfig.attn_bias, present in the shares only then)
_BIAS = {"w1": "b1", "wq_proj": "bq", "wk_proj": "bk", "wv_c": "bv"}


def _bias_of(shares, name: str) -> AShare | None:
    prefix, leaf = name.rsplit(".", 1)
    return shares.get(f"{prefix}.{_BIAS[leaf]}")


def _plus_bias(shares, name: str, o: AShare) -> AShare:
    b = _bias_of(shares, name)
    return o if b is None else o + bcast_row(b, o.shape)


def cost_ln_proj(p_cfg, cfg, B: int, names: list[str], want_y: bool, folded: bool,
                  fused: bool, span=None) -> Cost:
    outs = [(_width(cfg, w, folded), _proj_bits(p_cfg, w)) for w in names]
    if fused:
        split = [i for i, w in enumerate(names) if _feeds_relu(cfg, w, folded)]
        return cost_layernorm_project(p_cfg, B, cfg.d_model, outs, want_y, split, span)
    return cost_norm(p_cfg, cfg, B, span) + cost_step_project(p_cfg, cfg, B, names, folded)


def bcast_row(v: AShare, shape) -> AShare:
    return AShare(np.broadcast_to(v.a, shape).copy(), np.broadcast_to(v.b, shape).copy())
