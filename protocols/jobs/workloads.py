"""The one catalog of layer workloads (``mpc3 bench layer NAME`` and the ``bench_layer`` job).

Each :class:`Workload` states, in one place:

* ``prefixes``: the model tensors it reads (only these are uploaded for a remote run);
* ``inputs``: the names of its secret inputs, in the order its secure function takes them;
* ``secure(cfg, opts)``: the per-party function ``fn(party, shares, *input_shares) -> AShare``;
* ``case(cfg, weights, batch, rng, opts)``: its plaintext inputs and their float64 reference;
* ``cost(ring_cfg, cfg, batch, opts)``: its declared rounds and bytes per party, where the
  protocol module declares one (MHA, masked MHA, FFN); ``None`` otherwise.

Inputs (Privformer Sec. 9.1 for single layers): ``X`` uniform in [-10, 10] for single layers;
the encoder/decoder stacks get ``X`` (and the decoder its encoder output ``E``) uniform in
[-sqrt(3), sqrt(3)] (:data:`STACK_RANGE`: unit variance, the scale of embeddings and LayerNorm
outputs - with [-10, 10] and random weights the residual sum's variance leaves sqrt_inv_a's
range and the first LayerNorm would be meaningless); ``opts.input_range`` overrides the
half-width of ``X``. The softmax baselines get per-head Q, K, V uniform in [-1, 1] (the paper's
max-free polynomial exp is only meaningful near 0).

Adding a workload: write its protocol in its own module and add one entry to
:data:`WORKLOADS`; the CLI, the job kind and the remote benchmark read everything from here.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mpc3.shares import AShare
from protocols import model as M

STACK_RANGE = math.sqrt(3.0)   # uniform with unit variance: the scale of a LayerNorm output
LAYER_RANGE = 10.0             # Privformer Sec. 9.1: single-layer inputs uniform in [-10, 10]
SOFTMAX_RANGE = 1.0            # softmax baselines: per-head q, k, v uniform in [-1, 1]


@dataclass(frozen=True)
class Options:
    """Knobs of a layer workload (CLI flags / job params)."""

    fold: bool = True                   # Omega folded into W^Q, W^K (as share-model does)
    block: int | None = None            # row block of masked VK attention
    decode_block: int | None = None     # decoder-step: tokens cached before folding into G
    exp: str = "poly"                   # softmax baselines: exp kernel
    input_range: float | None = None    # half-width of X; None = the workload's default


@dataclass(frozen=True)
class Workload:
    name: str
    prefixes: tuple[str, ...]
    inputs: tuple[str, ...]
    secure: Callable            # (cfg, opts) -> fn(party, shares, *input_shares) -> AShare
    case: Callable              # (cfg, weights, batch, rng, opts) -> ([inputs], reference)
    cost: Callable | None = None    # (ring_cfg, cfg, batch, opts) -> Cost
    stack: bool = False         # whole stack: X defaults to STACK_RANGE instead of LAYER_RANGE

    def x_range(self, opts: Options) -> float:
        if opts.input_range is not None:
            return float(opts.input_range)
        return STACK_RANGE if self.stack else LAYER_RANGE

    def describe_inputs(self, opts: Options) -> str:
        """The input distribution, as reported under ``params.inputs``."""
        if self.inputs == ("Q", "K", "V"):
            return f"uniform[-{SOFTMAX_RANGE:g},{SOFTMAX_RANGE:g}] q,k,v per head"
        r = self.x_range(opts)
        text = f"uniform[-{r:.4g},{r:.4g}]"
        if "E" in self.inputs:
            text += f"; enc_out uniform[-{STACK_RANGE:.4g},{STACK_RANGE:.4g}]"
        return text


# ------------------------------------------------------------------ builders ----
_FOLDED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _folded(cfg, weights, opts):
    """Omega folded into W^Q, W^K (model preparation, as share-model does): computed once per
    weights object, so a timed reference run measures the forward pass only."""
    if not opts.fold:
        return None
    if weights not in _FOLDED:
        _FOLDED[weights] = M.fold_omega(weights, cfg)
    return _FOLDED[weights]


def _x(wl: "Workload", cfg, batch, rng, opts):
    r = wl.x_range(opts)
    return rng.uniform(-r, r, (batch, cfg.max_len, cfg.d_model))


def _attention(name: str, prefix: str, causal: bool, form: str) -> Workload:
    def secure(cfg, opts):
        from protocols.layers.mha import mha
        from protocols.layers.secure_model import sub
        return lambda p, sh, x: mha(p, cfg, sub(sh, prefix), x, causal=causal,
                                    masked_form=form, block=opts.block)

    def case(cfg, weights, batch, rng, opts):
        x = _x(WORKLOADS[name], cfg, batch, rng, opts)
        p = M.attn_params(weights, prefix, _folded(cfg, weights, opts))
        return [x], M.ref_mha(cfg, p, x, x, causal=causal)

    def cost(ring_cfg, cfg, batch, opts):
        from protocols.layers.mha import cost_mha
        return cost_mha(ring_cfg, cfg, batch, cfg.max_len, causal=causal, folded=opts.fold,
                        masked_form=form, block=opts.block)

    return Workload(name, (prefix + ".",), ("X",), secure, case, cost)


def _ffn() -> Workload:
    pre = "enc.0.ffn"

    def secure(cfg, opts):
        from protocols.layers.ffn import ffn
        from protocols.layers.secure_model import sub
        return lambda p, sh, x: ffn(p, sub(sh, pre), x, cfg.ffn_act)

    def case(cfg, weights, batch, rng, opts):
        x = _x(WORKLOADS["ffn"], cfg, batch, rng, opts)
        return [x], M.ref_ffn(x, *(weights[f"{pre}.{k}"] for k in ("w1", "b1", "w2", "b2")),
                             act=cfg.ffn_act)

    def cost(ring_cfg, cfg, batch, opts):
        from protocols.layers.ffn import cost_ffn
        return cost_ffn(ring_cfg, batch * cfg.max_len, cfg.d_model, cfg.d_ff, cfg.ffn_act)

    return Workload("ffn", (pre + ".",), ("X",), secure, case, cost)


def _ln() -> Workload:
    pre = "enc.0.ln1"

    def secure(cfg, opts):
        from protocols.layers.layernorm import layernorm
        return lambda p, sh, x: layernorm(p, x, sh[f"{pre}.gamma"], sh[f"{pre}.beta"],
                                          cfg.ln_eps)

    def case(cfg, weights, batch, rng, opts):
        x = _x(WORKLOADS["ln"], cfg, batch, rng, opts)
        return [x], M.ref_layernorm(x, weights[f"{pre}.gamma"], weights[f"{pre}.beta"],
                                    cfg.ln_eps)

    def cost(ring_cfg, cfg, batch, opts):
        from protocols.layers.layernorm import cost_layernorm
        return cost_layernorm(ring_cfg, batch * cfg.max_len, cfg.d_model)

    return Workload("ln", (pre + ".",), ("X",), secure, case, cost)


def _encoder() -> Workload:
    def secure(cfg, opts):
        from protocols.stacks.encoder import encoder
        return lambda p, sh, x: encoder(p, cfg, sh, x)

    def case(cfg, weights, batch, rng, opts):
        x = _x(WORKLOADS["encoder"], cfg, batch, rng, opts)
        return [x], M.ref_encoder(cfg, weights, x, folded=_folded(cfg, weights, opts))

    return Workload("encoder", ("enc.",), ("X",), secure, case, stack=True)


def _decoder(name: str) -> Workload:
    def secure(cfg, opts):
        from protocols.stacks import decoder as D
        if name == "decoder":
            return lambda p, sh, y, e: D.decoder(p, cfg, sh, y, e)

        def step(p, sh, ys, es):     # the whole prefix, one token at a time (O(1) per token)
            st = D.DecodeState.start(p, cfg, sh, es, block=opts.decode_block)
            outs = [D.decoder_step(p, cfg, sh, st, ys[:, t]) for t in range(ys.shape[1])]
            return AShare(np.stack([o.a for o in outs], 1), np.stack([o.b for o in outs], 1))
        return step

    def case(cfg, weights, batch, rng, opts):
        x = _x(WORKLOADS[name], cfg, batch, rng, opts)
        e = rng.uniform(-STACK_RANGE, STACK_RANGE, (batch, cfg.max_len, cfg.d_model))
        return [x, e], M.ref_decoder(cfg, weights, x, e, folded=_folded(cfg, weights, opts))

    return Workload(name, ("dec.",), ("X", "E"), secure, case, stack=True)


def _softmax(name: str, masked: bool) -> Workload:
    def secure(cfg, opts):
        from protocols.layers.softmax import softmax_attention
        return lambda p, sh, q, k, v: softmax_attention(p, q, k, v, masked=masked, exp=opts.exp)

    def case(cfg, weights, batch, rng, opts):
        from protocols.model.variants import ref_softmax_attention
        shape = (batch, cfg.n_heads, cfg.max_len, cfg.d_head)
        q, k, v = (rng.uniform(-SOFTMAX_RANGE, SOFTMAX_RANGE, shape) for _ in range(3))
        return [q, k, v], ref_softmax_attention(q, k, v, masked=masked, exp=opts.exp)

    return Workload(name, (), ("Q", "K", "V"), secure, case)


#: name -> workload, in the order of Privformer's Table 2 and then the baselines.
WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    _attention("mha", "enc.0.attn", causal=False, form="vk"),
    _attention("mmha-qk", "dec.0.self", causal=True, form="qk"),
    _attention("mmha-vk", "dec.0.self", causal=True, form="vk"),
    _ffn(), _ln(), _encoder(), _decoder("decoder"),
    _softmax("softmax-attn", masked=False), _softmax("masked-softmax-attn", masked=True),
    _decoder("decoder-step"),
)}
LAYER_WORKLOADS = tuple(WORKLOADS)


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown layer workload {name!r}; choose from {LAYER_WORKLOADS}")
    return WORKLOADS[name]


# ------------------------------------------- functional API (bench_jobs, remote bench) ----
def model_prefixes(name: str) -> tuple[str, ...]:
    """Model tensors a layer workload reads (only these are uploaded)."""
    return get(name).prefixes


def layer_inputs(name: str) -> tuple[str, ...]:
    """Names of a layer workload's secret inputs, in call order."""
    return get(name).inputs


def layer_fn(name: str, cfg: M.ModelConfig, block: int | None = None, exp: str = "poly",
             decode_block: int | None = None):
    """Per-party ``fn(party, shares, *input_shares) -> AShare`` of a layer workload."""
    return get(name).secure(cfg, Options(block=block, exp=exp, decode_block=decode_block))


def layer_case(name: str, cfg: M.ModelConfig, weights: M.Weights, batch: int, rng,
               fold: bool = True, exp: str = "poly", input_range: float | None = None
               ) -> tuple[list[np.ndarray], np.ndarray]:
    """(plaintext inputs, float64 reference) of a layer workload (distributions: module doc)."""
    return get(name).case(cfg, weights, batch, rng,
                          Options(fold=fold, exp=exp, input_range=input_range))
