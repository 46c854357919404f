"""Rotary position embeddings on shares (LLaMA-family models, ``embedding`` rotary):
``rope(x)[pos] = x * cos[pos] + rotate_half(x) * sin[pos]`` per head, with the public tables
of :func:`protocols.model.rope_tables` (float64: :func:`protocols.model.ref_rope`).

Everything but the truncation is local: rotate_half permutes and negates share elements,
and each replicated share is multiplied by the tables encoded at ``frac`` bits, which leaves
the rotated value at 2 frac fractional bits. One truncation (:func:`mpc3.kernels.truncation.
trunc_a`) then brings every row of q and k back to frac bits in one call. Cost
(:func:`cost_rope`): that truncation of the q and k elements (exact: 2 rounds, probabilistic:
1). Range: |rope(x)| <= sqrt(2) max|x| - far inside the truncation's 2^62 / 2^(2 frac).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import truncation
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare
from protocols import model as M


def _rotate_half(t: np.ndarray) -> np.ndarray:
    half = t.shape[-1] // 2
    return np.concatenate([np.uint64(0) - t[..., half:], t[..., :half]], axis=-1)


def _rotated(p: Party, x: AShare, positions, theta: float) -> AShare:
    """x * cos + rotate_half(x) * sin at 2 frac fractional bits (local)."""
    cos, sin = M.rope_tables(x.shape[-1], theta, positions)
    c, s = ring.encode(cos, p.cfg.frac), ring.encode(sin, p.cfg.frac)
    return AShare(x.a * c + _rotate_half(x.a) * s, x.b * c + _rotate_half(x.b) * s)


@profiled
def rope_many(p: Party, items: list[tuple[AShare, np.ndarray]], theta: float) -> list[AShare]:
    """Rotary embeddings of per-head rows ``x`` (..., S, dh) at ``positions`` (S,), for every
    ``(x, positions)`` item, in one truncation. Cost: :func:`cost_rope` of all elements."""
    rot = [_rotated(p, x, pos, theta) for x, pos in items]
    flat = AShare(np.concatenate([r.a.reshape(-1) for r in rot]),
                  np.concatenate([r.b.reshape(-1) for r in rot]))
    out = truncation.trunc_a(p, flat)
    got, at = [], 0
    for r in rot:
        got.append(out[at:at + r.size].reshape(r.shape))
        at += r.size
    return got


def cost_rope(ring_cfg, n: int) -> Cost:
    """:func:`rope_many` on ``n`` elements in all."""
    return truncation.cost_trunc(n, ring_cfg)
