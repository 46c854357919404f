"""A decoder-only LM whose vocabulary ends stay secret (issue 36's "secret embeddings and LM
head"): the query user sends its tokens as secret one-hot rows and receives only the chosen
token - the greedy next token of each row, as a shared index it alone opens. No logit and no
hidden row leaves the parties.

Shares (:func:`protocols.layers.secure_model.secret_layout`, besides the model's :mod:`protocols.layers.secure_model`
layout): ``embed.tgt`` (V, d) - for sinusoidal positions times sqrt(d), folded by the owner -
``embed.pos`` (max_len, d) for learned positions, and the LM head ``out.w`` (d, V), ``out.b``
(V,). Rotary models need no position table (positions are rotations of q and k on shares).

* :func:`lm_prefill_token`: the prompt's one-hot rows (B, T, V) -> its embedding on shares
  (:func:`protocols.layers.vocab.onehot_embed`: one product, 1 round; learned positions add
  their shared rows, sinusoidal ones the public PE - both local), the LM's prefill
  (:func:`protocols.stacks.causal_lm.lm_prefill`), then the head's token
  (:func:`protocols.layers.vocab.lm_head_token`: logits, a masked-comparison arg-max);
* :func:`lm_step_token`: one one-hot row (B, V) at the session's position -> its token.

Cost: the LM's own plus :func:`cost_embed_onehot` and :func:`protocols.layers.vocab.
cost_lm_head_token` (:func:`cost_prefill_token`, :func:`cost_step_token`). What the user
learns: the tokens; what it sends: one-hot rows, which nothing checks (a user sending
another vector gets the model on that mix of rows and still only a token; docs/MODELS.md).
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
from protocols.layers.secure_model import check_secret
from protocols.layers.vocab import (
    cost_lm_head_token,
    cost_onehot_embed,
    lm_head_token,
    onehot_embed,
)

from .causal_lm import (
    DEFAULT_LM_FUSE,
    LMState,
    cost_lm_prefill,
    cost_lm_step,
    lm_prefill,
    lm_step,
)
from .schedule import GENERAL, Schedule

def embed_onehot(p: Party, cfg: M.ModelConfig, shares: Mapping, onehot: AShare,
                 offset: int = 0) -> AShare:
    """One-hot rows (B, T, V) at positions offset.. -> the model's input (B, T, d) on
    shares. Cost: :func:`cost_embed_onehot`."""
    B, T, V = onehot.shape
    if V != cfg.tgt_vocab:
        raise ValueError(f"one-hot rows of {V} entries for a vocabulary of {cfg.tgt_vocab}")
    if offset + T > cfg.max_len:
        raise ValueError(f"{offset + T} positions exceed the model's max_len {cfg.max_len}")
    x = onehot_embed(p.at("embed"), onehot, shares["embed.tgt"])
    if cfg.embedding == "learned":
        pos = shares["embed.pos"][offset:offset + T]
        x = x + AShare(np.broadcast_to(pos.a, x.shape), np.broadcast_to(pos.b, x.shape))
    elif cfg.embedding == "sinusoidal":
        pe = M.positional_encoding(offset + T, cfg.d_model)[offset:]
        x = arith.add_public(p, x, ring.encode(np.broadcast_to(pe, x.shape), p.cfg.frac))
    return x


def cost_embed_onehot(p_cfg, cfg: M.ModelConfig, B: int, T: int) -> Cost:
    return cost_onehot_embed(p_cfg, B, T, cfg.d_model)


def _token(p: Party, shares: Mapping, h: AShare) -> AShare:
    return lm_head_token(p.at("out"), h, shares["out.w"], shares["out.b"])


def lm_prefill_token(p: Party, cfg: M.ModelConfig, shares: Mapping, onehot: AShare,
                     fuse=DEFAULT_LM_FUSE, schedule: Schedule = GENERAL,
                     on_layer: Callable[[str], None] | None = None
                     ) -> tuple[AShare, LMState]:
    """The prompt's one-hot rows (B, T, V) -> (the next token of each row as a shared
    fixed-point index (B,), the session's LMState). Cost: :func:`cost_prefill_token`."""
    check_secret(cfg)
    h, state = lm_prefill(p, cfg, shares, embed_onehot(p, cfg, shares, onehot), fuse=fuse,
                          schedule=schedule, on_layer=on_layer)
    return _token(p, shares, h), state


def lm_step_token(p: Party, cfg: M.ModelConfig, shares: Mapping, state: LMState,
                  onehot: AShare, on_layer: Callable[[str], None] | None = None) -> AShare:
    """The newest token's one-hot row (B, V) at position state.t -> the next token (B,).
    Cost: :func:`cost_step_token`."""
    B, V = onehot.shape
    y = embed_onehot(p, cfg, shares, onehot.reshape(B, 1, V), state.t)[:, 0]
    return _token(p, shares, lm_step(p, cfg, shares, state, y, on_layer=on_layer))


def cost_prefill_token(p_cfg, cfg: M.ModelConfig, B: int, T: int,
                       fuse=DEFAULT_LM_FUSE) -> Cost:
    return (cost_embed_onehot(p_cfg, cfg, B, T) + cost_lm_prefill(p_cfg, cfg, B, T, fuse=fuse)
            + cost_lm_head_token(p_cfg, B, cfg.tgt_vocab))


def cost_step_token(p_cfg, cfg: M.ModelConfig, B: int, t: int, fuse=DEFAULT_LM_FUSE,
                    schedule: Schedule = GENERAL) -> Cost:
    return (cost_embed_onehot(p_cfg, cfg, B, 1)
            + cost_lm_step(p_cfg, cfg, B, t, fuse=fuse, schedule=schedule)
            + cost_lm_head_token(p_cfg, B, cfg.tgt_vocab))
