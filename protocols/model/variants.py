"""float64 references of the attention variants a model config can select (``attention``):

* ``relu-performer`` - Privformer's ReLU random-feature attention (:func:`.reference.ref_mha`);
* ``softmax`` - softmax(q k^T / sqrt(dh)) v (exact exp);
* ``power-softmax`` - seed 000's PowerSoftmax, Eq. 4: s^p / (eps + sum_j s^p), p =
  :data:`POWER`, eps = :data:`POWER_EPS`;
* ``sigma-relu`` - seed 002's scaled sigma-attention with sigma = ReLU: ReLU(s) v / L, L the
  number of keys the row attends to (S unmasked; i + 1 for causal row i, so a decoder's row
  never depends on later tokens and a KV-cache step computes exactly the masked row).

The secure protocols computing them are in :mod:`protocols.layers.attention` (softmax) and
:mod:`protocols.layers.attention_variants`; these functions are the one float64 definition both the
model reference and those protocols' tests use. q, k, v are per head: (B, h, S, dh).
"""
from __future__ import annotations

import math

import numpy as np

ATTENTIONS = ("relu-performer", "softmax", "power-softmax", "sigma-relu")
#: What the secure heads (protocols.layers.mha.heads) run for a softmax-style attention: the
#: model's ``attention``, softmax split by ``softmax_form`` (:func:`head_kind`).
HEAD_KINDS = ("softmax", "softmax-max-free", "power-softmax", "sigma-relu")
#: PowerSoftmax exponent and epsilon of models (eps >= 2^-12: the reciprocal's range).
POWER, POWER_EPS = 4, 2.0 ** -6


def scores(q, k) -> np.ndarray:
    return q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])


def _mask(Sq: int, Sk: int, masked: bool) -> np.ndarray:
    return np.tril(np.ones((Sq, Sk))) if masked else np.ones((Sq, Sk))


def ref_softmax_attention(q, k, v, masked=False, exp="limit"):
    """softmax attention; ``exp="poly"`` is Privformer's polynomial baseline instead of exp.
    Exact exp is taken of s - max over the row's kept scores (the same function, no float
    overflow at any score)."""
    sc = scores(q, k)
    mask = _mask(*sc.shape[-2:], masked)
    if exp == "limit":
        e = np.exp(sc - np.max(np.where(mask > 0, sc, -np.inf), axis=-1, keepdims=True))
    else:
        e = 1 + sc + 0.5 * sc**2 + 0.1665 * sc**3 + 0.0438 * sc**4
    e = e * mask
    return (e / e.sum(-1, keepdims=True)) @ v


def ref_power_softmax(q, k, v, power=POWER, eps=POWER_EPS, form="plain", masked=False):
    """PowerSoftmax written as the paper's equations (forms: plain Eq. 4, stable Eq. 5 + 4,
    length-agnostic Eq. 6)."""
    s = scores(q, k)
    mask = _mask(*s.shape[-2:], masked)
    if form == "stable":                                    # Eq. 5: s / (||s||_inf + 0)
        s = s / np.max(np.abs(s) * mask, axis=-1, keepdims=True)
    e = s ** power * mask
    if form == "length":                                    # Eq. 6
        L = mask.sum(-1)[:, None]
        return ((e / L) / (eps + e.sum(-1, keepdims=True) / L)) @ v
    return (e / (eps + e.sum(-1, keepdims=True))) @ v       # Eq. 4


def ref_sigma_attention(q, k, v, sigma="relu", masked=False, length=None):
    """(sigma(s) * M) v / L, sigma = ReLU or public polynomial coefficients (c_0, c_1, ...);
    L = ``length``: None = Sk for every row (the paper's constant), an int, or "keys" = the
    row's number of keys (i + 1 masked, Sk unmasked)."""
    s = scores(q, k)
    Sq, Sk = s.shape[-2:]
    act = np.maximum(s, 0) if isinstance(sigma, str) else sum(
        c * s ** i for i, c in enumerate(sigma))
    if isinstance(length, str) and length != "keys":
        raise ValueError(f"sigma attention: length={length!r} must be None, an int or 'keys'")
    mask = _mask(Sq, Sk, masked)
    L = mask.sum(-1)[:, None] if isinstance(length, str) else (Sk if length is None else length)
    return (act * mask) @ v / L


def head_kind(cfg) -> str:
    """The :data:`HEAD_KINDS` entry of a model config with a softmax-style attention."""
    if cfg.attention == "softmax" and cfg.softmax_form == "max-free":
        return "softmax-max-free"
    return cfg.attention


def ref_heads(attention: str, q, k, v, masked: bool = False) -> np.ndarray:
    """The model's attention (a :data:`HEAD_KINDS` entry) on per-head q, k, v (both softmax
    forms compute the same function)."""
    if attention in ("softmax", "softmax-max-free"):
        return ref_softmax_attention(q, k, v, masked)
    if attention == "power-softmax":
        return ref_power_softmax(q, k, v, masked=masked)
    if attention == "sigma-relu":
        return ref_sigma_attention(q, k, v, masked=masked, length="keys")
    raise ValueError(f"unknown attention {attention!r} (one of {HEAD_KINDS})")
