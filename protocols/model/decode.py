"""Query-user side in float64: embedding with the sinusoidal positional encoding, output
logits, and greedy decoding with the reference model (never secret-shared)."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .config import ModelConfig
from .reference import RefDecodeState, ref_decoder_step, ref_encoder
from .weights import Weights


def positional_encoding(S: int, d: int) -> np.ndarray:
    """Standard sinusoidal PE (S, d): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    pos = np.arange(S, dtype=np.float64)[:, None]
    i2 = np.arange(0, d, 2, dtype=np.float64)
    ang = pos / np.power(10000.0, i2 / d)
    pe = np.zeros((S, d))
    pe[:, 0::2] = np.sin(ang)
    pe[:, 1::2] = np.cos(ang[:, : d // 2])
    return pe


def embed(cfg: ModelConfig, table: np.ndarray, ids, offset: int = 0) -> np.ndarray:
    """embed[tok] * sqrt(d_model) + PE[offset + pos]; ids (B, S) -> (B, S, d). Models with
    learned positions embed with :func:`embed_tokens` (it needs their position table)."""
    if cfg.embedding != "sinusoidal":
        raise ValueError(f"this model embeds tokens with learned positions (embedding "
                         f"{cfg.embedding!r}): use embed_tokens(cfg, user, ids)")
    ids = np.asarray(ids, dtype=np.int64)
    S = ids.shape[-1]
    pe = positional_encoding(offset + S, cfg.d_model)[offset:]
    return table[ids] * math.sqrt(cfg.d_model) + pe


def input_table(cfg: ModelConfig) -> str:
    """The token table of a model's first input: ``embed.tgt`` for a decoder-only LM, else
    ``embed.src``."""
    return "embed.tgt" if cfg.arch == "decoder-only" else "embed.src"


def embed_tokens(cfg: ModelConfig, user: Mapping, ids, offset: int = 0, types=None,
                 table: str | None = None) -> np.ndarray:
    """The query user's embedding of token ids (B, S) -> (B, S, d), any ``cfg.embedding``:

    * ``sinusoidal``: :func:`embed` with ``user[table]``;
    * ``learned`` (GPT-2): ``table[tok] + embed.pos[offset + pos] (+ embed.type[type])``;
    * ``learned-ln`` (BERT): the same, then LayerNorm ``embed.ln.gamma/beta`` (cfg.ln_eps);
    * ``rotary`` (LLaMA-family): ``table[tok]`` alone (positions are rotated into q and k on
      shares).

    ``table``: default :func:`input_table`; ``types`` (B, S) token types (default 0), only
    with an ``embed.type`` table. Computed in float64 by the user, never shared."""
    table = table or input_table(cfg)
    if cfg.embedding == "sinusoidal":
        if types is not None:
            raise ValueError("token types need a model with an embed.type table")
        return embed(cfg, user[table], ids, offset)
    ids = np.asarray(ids, dtype=np.int64)
    S = ids.shape[-1]
    if offset + S > cfg.max_len:
        raise ValueError(f"{offset + S} positions exceed the model's {cfg.max_len} "
                         f"{'' if cfg.embedding == 'rotary' else 'learned '}positions (max_len)")
    if cfg.embedding == "rotary":
        if types is not None:
            raise ValueError("token types need a model with an embed.type table")
        return user[table][ids].astype(np.float64)
    x = user[table][ids] + user["embed.pos"][offset:offset + S]
    if "embed.type" in user:
        t = np.zeros_like(ids) if types is None else np.asarray(types, dtype=np.int64)
        x = x + user["embed.type"][t]
    elif types is not None:
        raise ValueError("token types need a model with an embed.type table")
    if cfg.embedding == "learned-ln":
        from .reference import ref_layernorm
        x = ref_layernorm(x, user["embed.ln.gamma"], user["embed.ln.beta"], cfg.ln_eps)
    return x


def output_logits(user: Mapping, h) -> np.ndarray:
    return h @ user["out.w"] + user["out.b"]


def greedy_decode(cfg: ModelConfig, w: Weights, user: Mapping, src_ids, bos: int, eos: int,
                  max_steps: int | None = None) -> list[list[int]]:
    """Greedy decoding with the numpy reference (ref_encoder + ref_decoder_step).

    ``src_ids`` (B, S): all rows must have the same length (no padding; every
    source position is a real key).  Returns token lists without BOS/EOS.
    """
    src_ids = np.asarray(src_ids, dtype=np.int64)
    if src_ids.ndim == 1:
        src_ids = src_ids[None]
    B = src_ids.shape[0]
    max_steps = cfg.max_len if max_steps is None else max_steps
    enc = ref_encoder(cfg, w, embed(cfg, user["embed.src"], src_ids))
    state = RefDecodeState(cfg, w, enc)
    tok = np.full(B, bos, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(B)]
    done = np.zeros(B, dtype=bool)
    for t in range(max_steps):
        y = embed(cfg, user["embed.tgt"], tok[:, None], offset=t)[:, 0, :]
        hdec = ref_decoder_step(cfg, w, state, y, enc)
        tok = output_logits(user, hdec).argmax(-1)
        for b in range(B):
            if not done[b]:
                if tok[b] == eos:
                    done[b] = True
                else:
                    out[b].append(int(tok[b]))
        if done.all():
            break
    return out


def take_tokens(out: list[list[int]], done: np.ndarray, tok: np.ndarray,
                eos: int | None) -> None:
    """Greedy decoding bookkeeping: append row b's token to ``out[b]`` unless the row is
    done; a row's ``eos`` ends it (and is not appended)."""
    for b in range(len(out)):
        if not done[b]:
            if eos is not None and tok[b] == eos:
                done[b] = True
            else:
                out[b].append(int(tok[b]))
