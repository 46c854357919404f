"""Secret KV cache of a softmax-style causal self-attention: incremental decoding of a
decoder-only LM whose ``attention`` is softmax, power-softmax or sigma-relu
(:func:`protocols.layers.mha.heads`; float64: :func:`protocols.model.variants.ref_heads`).

These attentions have no fixed-size prefix state like Performer's G = sum_j K'_j^T V_j:
a new token's row needs every earlier key and value. Each party keeps, per layer, its
replicated shares of the projected keys and values of every token so far
(:class:`KVCache`, (B, h, capacity, d_head) each, capacity = the model's ``max_len``; shares
only, nothing is opened; the arrays grow by doubling as tokens arrive, up to the capacity:
per party 32 h d_head bytes per token, layer and batch row, at most twice that while it
grows - not max_len tokens' worth from the session's start). :func:`attend` appends the new tokens'
k, v rows (local) and

* on an empty cache with one query row per new token (the prompt): the causally masked
  attention of those rows (``heads(masked=True)``: only the T(T+1)/2 causal scores are
  reshared and transformed);
* with a single query row (a decode step, or the last prompt row when only its output is
  needed): that row against all t cached keys, unmasked - exactly row t of the masked
  attention (sigma-relu divides by the row's number of keys, t, in both).

All heads go through one kernel call per protocol step (scores for all heads in one product,
one row-max level / exp / power / ReLU call, one reciprocal, one weighted-V product), so a
step's rounds do not depend on h; they do not depend on t either, except for the
max-subtracted softmax's row maximum, ceil(log2 t) ReLU levels; its bytes grow linearly
in t (scores, exp and weights of t keys per head): :func:`cost_attend`. Ranges: those of
the attention (module docstrings of :mod:`protocols.layers.attention_variants` and
:mod:`protocols.layers.softmax`: scores below ``softmax.SCORE_LIMIT`` for softmax, inside
``fxp.EXP_RANGE`` for its max-free form), checked per site by the calibration
(the calibration's, :func:`protocols.calibration.shadow.trace_lm`) on the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpc3.kernels.base import Cost
from mpc3.party import Party
from mpc3.shares import AShare
from protocols import model as M

from .mha import cost_finish, cost_heads, expand_kv, finish, heads


def _zeros(B: int, h: int, n: int, dh: int, plain: bool = False) -> AShare:
    a = np.zeros((B, h, n, dh), np.uint64)
    return AShare(a, np.broadcast_to(np.zeros((), np.uint64), a.shape) if plain else
                  np.zeros_like(a))


@dataclass
class KVCache:
    """Shares of the keys and values of the first ``t`` tokens (rows >= t are zero), at most
    ``capacity`` tokens. A shadow party's cache (``plain``: its shares' slot b is zero,
    mpc3.shadow) keeps slot a alone - the calibration's decode steps hold half the bytes."""

    k: AShare          # (B, h, allocated rows, dh)
    v: AShare
    capacity: int
    t: int = 0
    plain: bool = False

    @staticmethod
    def empty(B: int, h: int, dh: int, capacity: int, plain: bool = False) -> "KVCache":
        if capacity < 1:
            raise ValueError(f"KV cache capacity={capacity} must be >= 1")
        return KVCache(_zeros(B, h, 0, dh, plain), _zeros(B, h, 0, dh, plain), int(capacity),
                       plain=plain)

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    def append(self, k: AShare, v: AShare) -> None:
        """Keep n new tokens' rows, k and v (B, h, n, dh). Local."""
        n, t = k.shape[2], self.t
        B, h, rows, dh = self.k.shape
        if k.shape[:2] != (B, h) or k.shape != v.shape or k.shape[3] != dh:
            raise ValueError(f"KV rows {k.shape}/{v.shape} do not fit the cache "
                             f"{self.k.shape}")
        if t + n > self.capacity:
            raise ValueError(f"the KV cache holds {t} tokens; {n} more exceed its capacity "
                             f"of {self.capacity} (max_len)")
        if t + n > rows:                                  # grow by doubling, up to capacity
            grow = min(self.capacity, max(2 * rows, t + n))
            for name in ("k", "v"):
                old, new = getattr(self, name), _zeros(B, h, grow, dh, self.plain)
                new.a[:, :, :t] = old.a[:, :, :t]
                if not self.plain:
                    new.b[:, :, :t] = old.b[:, :, :t]
                setattr(self, name, new)
        for cache, new in ((self.k, k), (self.v, v)):
            cache.a[:, :, t:t + n] = new.a
            if not self.plain:
                cache.b[:, :, t:t + n] = new.b
            elif new.b.any():
                raise ValueError("a plain (shadow) KV cache takes shares whose slot b is zero")
        self.t = t + n

    def rows(self) -> tuple[AShare, AShare]:
        """The cached keys and values, (B, h, t, dh) each."""
        return self.k[:, :, :self.t], self.v[:, :, :self.t]


def _shape(t0: int, n: int, rows: int) -> None:
    if n < 1 or rows not in (1, n) or (rows > 1 and t0):
        raise ValueError(f"attend: {rows} query rows for {n} new tokens after {t0} cached: "
                         f"give one row per token on an empty cache (a prompt) or one row "
                         f"(the newest token)")


def attend(p: Party, attention: str, cache: KVCache, q: AShare, k: AShare,
           v: AShare, expand=None) -> AShare:
    """Append the n new tokens' k, v (B, h, n, dh) and return the attention of the query
    rows q (B, h, rows, dh): rows = n on an empty cache (causal mask) or rows = 1 (the
    newest token against every cached key). ``expand``: repeats grouped-query keys and
    values (the cache keeps kv_heads heads) for q's heads. Cost: :func:`cost_attend`."""
    t0, n, rows = cache.t, k.shape[2], q.shape[2]
    _shape(t0, n, rows)
    cache.append(k, v)
    keys, values = cache.rows()
    if expand is not None:
        keys, values = expand(keys), expand(values)
    return heads(p, attention, q, keys, values, masked=rows > 1)


def cost_attend(p_cfg, attention: str, B: int, h: int, dh: int, t0: int, n: int = 1,
                rows: int = 1) -> Cost:
    """Declared rounds and bytes per party of :func:`attend` (t0 tokens cached before)."""
    _shape(t0, n, rows)
    return cost_heads(p_cfg, attention, B, h, rows, t0 + n, dh, masked=rows > 1)


def attend_out(p: Party, cfg, w: dict, cache: KVCache, q: AShare, k: AShare,
               v: AShare) -> AShare:
    """:func:`attend` with the model's attention, then the heads merged @ W^O (+ b^O): the
    attention sublayer's output (B, rows, d). Cost: :func:`cost_attend_out`."""
    return finish(p, cfg, w, attend(p, M.head_kind(cfg), cache, q, k, v,
                                    lambda t: expand_kv(cfg, t)), None)


def cost_attend_out(p_cfg, cfg, B: int, t0: int, n: int = 1, rows: int = 1) -> Cost:
    return (cost_attend(p_cfg, M.head_kind(cfg), B, cfg.n_heads, cfg.d_head, t0, n, rows)
            + cost_finish(p_cfg, cfg, B * rows, row_scale=False))
