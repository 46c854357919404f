"""Secure position-wise feed-forward network (Privformer Alg. 7): ReLU(x W1 + b1) W2 + b2.

LLaMA-family models (``ffn_act`` swiglu) run the gated FFN (:func:`gated`) instead.

Biases are added locally; the one activation call (ReLU, GELU or none: ModelConfig.ffn_act)
covers every row of every batch element. With ReLU the x W1 product stops at the split form
relu_a reads (:func:`mpc3.kernels.arith.mul_split_aa`: 8 bytes per hidden element less).
Cost (:func:`cost_ffn`): two matmuls (:func:`mpc3.kernels.arith.cost_mul` of B*S*d_ff -
cost_mul_split with ReLU - and B*S*d_model outputs) plus one activation on B*S*d_ff elements.

A linear FFN (``ffn_act`` none) is shared fused (:mod:`protocols.layers.secure_model`: ``w1`` =
W1 W2, ``b1`` = b1 W2 + b2, no ``w2``): one matmul of B*S*d_model outputs, exactly
x W1 W2 + b1 W2 + b2 (AERO's softmax-only block). Shares with a ``w2`` run the two products.
"""
from __future__ import annotations

import numpy as np

from mpc3.kernels import arith
from mpc3.party import Party, profiled
from mpc3.shares import AShare


def _add(x: AShare, b: AShare) -> AShare:
    """x + b with b broadcast over the leading dimensions (local)."""
    return AShare(x.a + b.a, x.b + b.b) if x.shape == b.shape else \
        AShare(x.a + np.broadcast_to(b.a, x.shape), x.b + np.broadcast_to(b.b, x.shape))


@profiled
def activation(p: Party, h: AShare, act: str) -> AShare:
    """The FFN nonlinearity on shares: relu_a, gelu_a (|h| <= 2^13) or none."""
    from mpc3.kernels import activations, convert
    if act == "relu":
        return convert.relu_a(p, h, "hidden")
    if act == "gelu":
        if p.checks is not None:           # malicious mode: maybe in blocks, proven between
            from mpc3.checks import in_blocks
            return in_blocks(p, lambda q, v: activations.gelu_a(q, v, site="hidden_gelu"), h)
        return activations.gelu_a(p, h, site="hidden_gelu")
    if act == "none":
        return h
    raise ValueError(f"ffn: unknown activation {act!r} (relu, gelu, none)")


def gated(p: Party, w: dict, x: AShare) -> AShare:
    """LLaMA's gated FFN (``ffn_act`` swiglu): (silu(x W1) * (x W3)) W2, no biases - the two
    products in one call, silu_a (|x W1| <= 2^13, site ``hidden_silu``), the gate product,
    W2. Cost: :func:`cost_gated`."""
    from mpc3.kernels.silu import silu_a
    g, u = arith.mul_many_aa(p, [(x, w["w1"], "matmul", True), (x, w["w3"], "matmul", True)],
                             ["w1", "w3"])
    hid = arith.mul_aa(p, silu_a(p, g, site="hidden_silu"), u, site="gate")
    return arith.matmul_aa(p, hid, w["w2"], site="w2")


def cost_gated(p_cfg, rows: int, d_model: int, d_ff: int):
    """:func:`gated` on ``rows`` rows."""
    from mpc3.kernels.silu import cost_silu
    n = rows * d_ff
    return (arith.cost_mul(2 * n, p_cfg) + cost_silu(n, p_cfg) + arith.cost_mul(n, p_cfg)
            + arith.cost_mul(rows * d_model, p_cfg))


def ffn(p: Party, w: dict, x: AShare, act: str = "relu") -> AShare:
    """``w``: shares ``w1`` (d, d_ff), ``b1``, ``w2`` (d_ff, d), ``b2`` (the gated FFN:
    ``w1``, ``w3``, ``w2``); ``x`` (..., d); ``act``: ModelConfig.ffn_act."""
    if x.shape[-1] != w["w1"].shape[0]:
        raise ValueError(f"ffn: input width {x.shape[-1]} != d_model {w['w1'].shape[0]}")
    if act == "swiglu":
        return gated(p, w, x)
    if act == "relu" and "w2" in w:            # ReLU reads the product's split form
        z = arith.mul_split_aa(p, [(x, w["w1"], "matmul")], biases=[w["b1"]], sites=["w1"])
        return ffn_hidden(p, w, z.reshape(*x.shape[:-1], w["w1"].shape[1]), act)
    return ffn_hidden(p, w, _add(arith.matmul_aa(p, x, w["w1"], site="w1"), w["b1"]), act)


def ffn_hidden(p: Party, w: dict, hid: AShare, act: str = "relu") -> AShare:
    """The FFN after its first layer: act(hid) W2 + b2 for ``hid = x W1 + b1`` (a decode
    step forms hid inside a LayerNorm: :func:`protocols.layers.layernorm.layernorm_project`); for
    fused shares (no ``w2``) ``hid`` is already the output."""
    if "w2" not in w:
        if act != "none":
            raise ValueError(f"ffn: fused shares (no w2) are a linear FFN, not {act!r}")
        return hid
    return _add(arith.matmul_aa(p, activation(p, hid, act), w["w2"], site="w2"), w["b2"])


def cost_activation(p_cfg, n: int, act: str, split: bool = False):
    """:func:`activation` on ``n`` elements (``split``: ReLU of mul_split_aa's output, whose
    sign may already be taken: convert.cost_relu_split)."""
    from mpc3.kernels import activations, convert
    from mpc3.kernels.base import Cost
    if act == "relu":
        if split:
            return convert.cost_relu_split(n, p_cfg, True)
        return convert.cost_relu(n, p_cfg)
    if act == "gelu":
        return activations.cost_gelu(n, p_cfg)
    if act == "none":
        return Cost(0, (0, 0, 0))
    raise ValueError(f"ffn: unknown activation {act!r} (relu, gelu, none)")


def cost_ffn(p_cfg, rows: int, d_model: int, d_ff: int, act: str = "relu",
             fused: bool | None = None):
    """Declared rounds and bytes per party of :func:`ffn` on ``rows`` input rows (B*S);
    ``fused`` (default: act is none, as the share layout does) for shares without ``w2``."""
    if act == "swiglu":
        return cost_gated(p_cfg, rows, d_model, d_ff)
    linear = act == "none" if fused is None else fused
    width = d_model if linear else d_ff
    if act == "relu" and not linear:
        return (arith.cost_mul_split(rows * width, p_cfg, True)
                + cost_ffn_hidden(p_cfg, rows, d_model, d_ff, act, fused, split=True))
    return (arith.cost_mul(rows * width, p_cfg)
            + cost_ffn_hidden(p_cfg, rows, d_model, d_ff, act, fused))


def cost_ffn_hidden(p_cfg, rows: int, d_model: int, d_ff: int, act: str = "relu",
                    fused: bool | None = None, split: bool = False):
    """:func:`ffn_hidden` on ``rows`` rows (``split``: ``hid`` is mul_split_aa's output)."""
    from mpc3.kernels.base import Cost
    if act == "none" if fused is None else fused:
        return Cost(0, (0, 0, 0))
    return (cost_activation(p_cfg, rows * d_ff, act, split)
            + arith.cost_mul(rows * d_model, p_cfg))
