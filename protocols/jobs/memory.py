"""A job's working memory on one party, estimated from its kind and shapes before it is
admitted (:meth:`net.party.runner.JobRunner.accept` bounds it by ``[limits]`` job_memory_bytes and
the per-user and per-party totals).

What grows with a transformer job's shapes is the widest layer's elements and the session
state it keeps. A nonlinear layer (softmax over the attention scores, the FFN activation, the
Performer features' ReLU) holds, per element and party, its two input slots, the products'
split form, the comparison's bit planes and leaves and the truncation's and injection's
buffers at once; layers run one after another, so the widest one sets the peak:

    estimate = BYTES_PER_ELEMENT * max(score / feature / FFN-hidden / row elements)
               + the session state kept (KV caches; Performer prefix sums)
               + the input shares (16 B per element).

:data:`BYTES_PER_ELEMENT` is measured, not derived: the peak RSS increase of ``lm_prefill``
jobs of the shipped softmax LM, per party (three in-process parties, divided by three;
``benchmarks/job_memory.py``, ``benchmarks/results/job_memory.json``), is 280 - 300 B per
score element at B = 64 - 256, T = 52. ``tests/net/party/test_memory.py`` checks the estimate
against the measured increase of softmax and Performer prefills (1x - 2x; measured 1.2 - 1.5x). The
other kinds (classify, embed, encoder, decode steps) use the same formula unmeasured.
Kinds without a model config (diagnostic kinds on bare tensors) are estimated from their
inputs alone (:data:`BYTES_PER_INPUT_BYTE` per byte of input shares).
"""
from __future__ import annotations

import math
from typing import Mapping

from .contract import JobSpec, ModelView

#: Working memory per element of the widest layer, per party (bytes; measured, see above).
BYTES_PER_ELEMENT = 320
#: Diagnostic kinds on bare tensors: working memory per byte of input shares.
BYTES_PER_INPUT_BYTE = 16
SLOT_PAIR = 16                # a replicated share element on one party: two uint64 slots


def _rows(shapes: Mapping[str, tuple]) -> tuple[int, int]:
    """(batch B, query positions S) of a transformer job's input (X (B, S, d) or Y (B, d))."""
    shape = tuple(shapes.get("X") or shapes.get("Y") or shapes.get("ONEHOT") or (1, 1))
    return int(shape[0]), int(shape[1]) if len(shape) == 3 else 1


def transformer_memory(cfg, spec: JobSpec, shapes: Mapping[str, tuple]) -> int:
    """The estimate (module docstring) for a transformer job of ``cfg``."""
    B, S = _rows(shapes)
    step = spec.session == "step"                     # one new row against a cache
    keys = cfg.max_len if step else S                 # softmax: the scores' width
    layers = cfg.n_enc_layers + cfg.n_dec_layers
    if cfg.attention == "relu-performer":
        attn = B * S * cfg.n_heads * cfg.n_features
        state = layers * B * cfg.n_heads * cfg.n_features * (cfg.d_head + 1) * SLOT_PAIR
    else:
        attn = B * cfg.n_heads * S * keys
        kv = cfg.kv_heads * cfg.d_head                # grouped-query: the KV heads' width
        state = layers * 2 * B * cfg.max_len * kv * SLOT_PAIR   # K, V caches
    wide = max(attn, B * S * cfg.d_ff, B * S * cfg.d_model)
    kept = state if spec.session in ("open", "step") else 0
    inputs = sum(math.prod(s) for s in shapes.values()) * SLOT_PAIR
    return BYTES_PER_ELEMENT * wide + kept + inputs


def job_memory(spec: JobSpec, model: ModelView, shapes: Mapping[str, tuple]) -> int:
    """Estimated peak working memory of an admitted job on one party, in bytes."""
    inputs = sum(math.prod(s) for s in shapes.values()) * SLOT_PAIR
    if spec.session == "close":
        return 0
    try:
        cfg = model.config
    except ValueError:                                # bare tensors: diagnostic kinds
        return BYTES_PER_INPUT_BYTE * inputs
    return transformer_memory(cfg, spec, shapes)
