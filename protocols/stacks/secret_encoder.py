"""BERT-style encoders whose embedding tables stay secret (issue 36's "the same option for
BERT-style encoders and classifiers"): the query user sends each token as a secret one-hot
row, the lookup, the positions, the token types and the embedding LayerNorm run on shares,
and the user receives only what its owner permits of the model's output - a classifier's
logits or its class (the arg-max on shares), a headless encoder's sentence embedding.

Input ``onehot`` (B, S, V + Tv), ring integers 0/1 (:func:`protocols.layers.vocab.onehot`):
each position's word one-hot row (V = ``src_vocab`` entries) followed by its token type's
one-hot row (Tv = ``type_vocab`` entries, none for a model without types). The types are as
secret as the words (a sentence pair's boundary is not revealed) and cost nothing: the
owner stacks the type table under the word table, so one product of the rows as they come
looks up both (:func:`protocols.layers.vocab.onehot_embed`: an ordinary untruncated
``matmul_aa``, whatever checks the products get). Public: B, S (the token count), V, Tv.

Shares (:func:`protocols.layers.secure_model.secret_layout`): ``embed.tokens`` (V + Tv, d),
``embed.src`` - times sqrt(d) for sinusoidal positions - with ``embed.type``'s rows under
it; ``embed.pos`` (max_len, d) for learned embeddings, ``embed.ln.gamma``, ``embed.ln.beta``
for ``learned-ln`` (BERT).

Steps (:func:`embed_onehot_encoder`): the lookup (1 round, B S d elements reshared); the
positions' shared rows added (learned) or the public PE (sinusoidal), local; BERT's
embedding LayerNorm on shares (:func:`protocols.layers.layernorm.layernorm`, layer
``embed.ln``: its variance's inverse square root is range-limited, calibration sites
``var_eps``, ``scale``, traced from token samples by :func:`protocols.calibration.shadow.
trace_secret_encoder`). Then the model's own stack: :func:`protocols.stacks.classifier.
classify` or :func:`protocols.stacks.sentence.embed_sentence`, unchanged.

Cost: :func:`cost_embed_onehot_encoder` plus the stack's (:func:`cost_classify_secret`,
:func:`cost_embed_secret`); equal to the measured traffic
(tests/protocols/stacks/test_secret_encoder.py). Nothing checks that a row is one-hot: a
user sending another vector gets the model on that mix of rows, and still only the output
its owner permits.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith
from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers.layernorm import cost_layernorm, layernorm
from protocols.layers.secure_model import check_secret
from protocols.layers.vocab import cost_onehot_embed, onehot_embed

from .classifier import classify, cost_classify
from .sentence import cost_embed_sentence, embed_sentence


def onehot_width(cfg: M.ModelConfig) -> int:
    """Entries of one position's one-hot row: the words' and the token types'."""
    return cfg.src_vocab + cfg.type_vocab


def check_onehot_shape(cfg: M.ModelConfig, shape: tuple) -> None:
    """ValueError naming the problem unless ``shape`` is (B, S, V + Tv) with 1 <= S <=
    max_len."""
    if len(shape) != 3 or shape[2] != onehot_width(cfg):
        types = f" + {cfg.type_vocab} token types" if cfg.type_vocab else ""
        raise ValueError(f"one-hot rows must have the vocabulary's {cfg.src_vocab} entries"
                         f"{types} ({onehot_width(cfg)}), got {tuple(shape)}")
    if not 1 <= shape[1] <= cfg.max_len:
        raise ValueError(f"an input of {shape[1]} tokens: the model takes 1..{cfg.max_len} "
                         f"(max_len)")


def encoder_onehot(ids, cfg: M.ModelConfig, types=None) -> np.ndarray:
    """User side: token ids (B, S) and types (B, S) (default 0) -> the one-hot rows (B, S,
    V + Tv) the secret jobs take, ring integers (deal them as they are). ValueError, one
    line, for ids or types outside the model's vocabularies or over max_len."""
    from protocols.layers.vocab import onehot
    ids = np.asarray(ids)
    if ids.ndim != 2 or not 1 <= ids.shape[1] <= cfg.max_len:
        raise ValueError(f"token ids (B, S) with 1 <= S <= {cfg.max_len} (max_len), got "
                         f"shape {ids.shape}")
    rows = [onehot(ids, cfg.src_vocab)]
    if types is not None and not cfg.type_vocab:
        raise ValueError("token types need a model with an embed.type table")
    if cfg.type_vocab:
        t = np.zeros(ids.shape, np.int64) if types is None else np.asarray(types)
        if t.shape != ids.shape:
            raise ValueError(f"token types of shape {t.shape} for ids of shape {ids.shape}")
        if t.size and (not np.issubdtype(t.dtype, np.integer) or t.min() < 0
                       or t.max() >= cfg.type_vocab):
            raise ValueError(f"token types must be integers in [0, {cfg.type_vocab})")
        rows.append(onehot(t, cfg.type_vocab))
    return np.concatenate(rows, axis=-1)


def embed_onehot_encoder(p: Party, cfg: M.ModelConfig, shares: Mapping,
                         onehot: AShare) -> AShare:
    """One-hot rows (B, S, V + Tv) -> the encoder's input (B, S, d) on shares, ==
    :func:`protocols.model.embed_tokens`. Cost: :func:`cost_embed_onehot_encoder`."""
    check_secret(cfg)
    check_onehot_shape(cfg, onehot.shape)
    S = onehot.shape[1]
    x = onehot_embed(p.at("embed"), onehot, shares["embed.tokens"])
    if cfg.embedding == "sinusoidal":
        pe = M.positional_encoding(S, cfg.d_model)
        return arith.add_public(p, x, ring.encode(np.broadcast_to(pe, x.shape), p.cfg.frac))
    pos = shares["embed.pos"][:S]
    x = x + AShare(np.broadcast_to(pos.a, x.shape), np.broadcast_to(pos.b, x.shape))
    if cfg.embedding == "learned-ln":
        x = layernorm(p.at("embed.ln"), x, shares["embed.ln.gamma"], shares["embed.ln.beta"],
                      cfg.ln_eps)
    return x


def cost_embed_onehot_encoder(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    cost = cost_onehot_embed(p_cfg, B, S, cfg.d_model)
    if cfg.embedding == "learned-ln":
        cost = cost + cost_layernorm(p_cfg, B * S, cfg.d_model)
    return cost


def _embedded(p: Party, cfg: M.ModelConfig, shares: Mapping, onehot: AShare,
              on_layer: Callable[[str], None] | None) -> AShare:
    x = embed_onehot_encoder(p, cfg, shares, onehot)
    if on_layer is not None:
        on_layer("embed")
    return x


def classify_secret(p: Party, cfg: M.ModelConfig, shares: Mapping, onehot: AShare,
                    on_layer: Callable[[str], None] | None = None) -> AShare:
    """One-hot rows (B, S, V + Tv) -> the classifier's logits (B, C) on shares (the
    ``embed`` mark, then :func:`protocols.stacks.classifier.classify`'s). Cost:
    :func:`cost_classify_secret`."""
    return classify(p, cfg, shares, _embedded(p, cfg, shares, onehot, on_layer),
                    on_layer=on_layer)


def cost_classify_secret(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    return cost_embed_onehot_encoder(p_cfg, cfg, B, S) + cost_classify(p_cfg, cfg, B, S)


def embed_secret(p: Party, cfg: M.ModelConfig, shares: Mapping, onehot: AShare,
                 on_layer: Callable[[str], None] | None = None) -> AShare:
    """One-hot rows (B, S, V + Tv) -> a headless encoder's sentence embeddings (B, d) on
    shares (:func:`protocols.stacks.sentence.embed_sentence`). Cost:
    :func:`cost_embed_secret`."""
    return embed_sentence(p, cfg, shares, _embedded(p, cfg, shares, onehot, on_layer),
                          on_layer=on_layer)


def cost_embed_secret(p_cfg, cfg: M.ModelConfig, B: int, S: int) -> Cost:
    return cost_embed_onehot_encoder(p_cfg, cfg, B, S) + cost_embed_sentence(p_cfg, cfg, B, S)
