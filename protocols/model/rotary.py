"""Rotary position embeddings (RoFormer; LLaMA-family models, ``embedding`` rotary) in
float64: the public cos / sin tables and their action on per-head q or k.

Hugging Face's convention (``rotate_half``), which its LLaMA checkpoints are stored for:
with ``inv_freq[i] = theta^(-2i / dh)`` (i < dh/2) and angle ``pos * inv_freq[i]``,

    cos[pos] = [cos(angle) | cos(angle)],  sin[pos] = [sin(angle) | sin(angle)]   (dh each)
    rope(x)[pos] = x * cos[pos] + rotate_half(x) * sin[pos],
    rotate_half(x) = [-x[dh/2:] | x[:dh/2]]

The secure form (:mod:`protocols.layers.rotary`) multiplies shares by the same public tables
(fixed point) and truncates once.
"""
from __future__ import annotations

import numpy as np


def rope_tables(d_head: int, theta: float, positions) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (len(positions), d_head), of the given 0-based positions."""
    if d_head % 2:
        raise ValueError(f"rotary embeddings need an even d_head, got {d_head}")
    inv = float(theta) ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    ang = np.asarray(positions, dtype=np.float64).reshape(-1, 1) * inv
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang), np.sin(ang)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def ref_rope(x, positions, theta: float) -> np.ndarray:
    """Rotary embedding of per-head rows x (..., S, dh) at ``positions`` (S,)."""
    x = np.asarray(x, dtype=np.float64)
    cos, sin = rope_tables(x.shape[-1], theta, positions)
    return x * cos + rotate_half(x) * sin
