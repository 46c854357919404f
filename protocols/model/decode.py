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
    """embed[tok] * sqrt(d_model) + PE[offset + pos]; ids (B, S) -> (B, S, d)."""
    ids = np.asarray(ids, dtype=np.int64)
    S = ids.shape[-1]
    pe = positional_encoding(offset + S, cfg.d_model)[offset:]
    return table[ids] * math.sqrt(cfg.d_model) + pe


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
