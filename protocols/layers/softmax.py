"""Secure softmax attention, softmax(q k^T / sqrt(dh) [+ causal mask]) v per head, in two forms.

* ``"max"`` (models' default, ``ModelConfig.softmax_form``; PUMA's form): each row's secret
  maximum m_i first (:func:`mpc3.kernels.extrema.max_rows_a`, a ReLU tournament over the
  row's kept scores), then ``e = exp(s - m_i)`` with :func:`mpc3.kernels.fxp.exp_neg_a`
  (every input <= 0; 0 below -32), so no score is too large or too small: the row sum lies
  in [1, n_keys] and the e V products below n_keys max|v|. Scores need only |s| < 2^12
  (:data:`SCORE_LIMIT`, the tournament's differences inside ReLU's range) - pretrained
  models reach |s| ~ 40.
* ``"max-free"`` (Privformer Sec. 9.2): e = exp(s) directly, cheaper by the tournament and
  the comparison, but exact only while every score lies in ``fxp.EXP_RANGE`` [-48, 9.5]
  and the row sums in the reciprocal's range - models trained for it keep it.

Both: a model's q carries 1/sqrt(dh) already (``prescaled``: the owner folds it into W^Q and
b^Q, :func:`protocols.layers.secure_model.fold_scales` - exact to the weights' encoding, and the
scores' product truncates by frac alone); otherwise (the paper's baselines, tests) it rides in
the score product, q times round(2^12/sqrt(dh)) truncated by frac + 12, whose rounding of the
constant (up to 2^-13 relative) shifts a score s by up to s 2^-13. A causal (``masked``)
attention reshares and transforms only the S(S+1)/2 kept scores; row sums are local; the division is
:func:`protocols.layers.attention.divide_rows` (``fused``: in the reciprocal's rounds) or
reciprocal, e @ v, product (the paper baseline). ``exp="poly"`` (max-free only) is the paper's
polynomial baseline 1 + x + x^2/2 + 0.1665 x^3 + 0.0438 x^4, accurate only near 0.

Cost (:func:`cost_softmax_attention`), per attention call: the max form adds
ceil(log2 n_keys) ReLU levels (4 rounds each on up to 2^14 pairs) and 2 rounds of the
comparison's injection to the max-free form's; bytes grow by about one ReLU, one comparison
and one injection per kept score.
"""
from __future__ import annotations

import math

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, extrema, fxp
from mpc3.kernels.base import Cost
from mpc3.party import Party, RingConfig
from mpc3.shares import AShare

from .attention import cost_divide_rows, divide_rows, repeat_cols, tril_mask

FORMS = ("max", "max-free")
SOFTMAX_EXP = ("poly", "limit")
#: Extra fractional bits of 1/sqrt(dh) in the score product.
SCORE_EXTRA = 12
#: The max form's range: every kept score |s| < 2^12 (row differences inside relu_limit,
#: s - max >= -2^13 inside fxp.EXP_NEG_RANGE).
SCORE_LIMIT = 2.0 ** 12


def _check(form: str, exp: str) -> None:
    if form not in FORMS:
        raise ValueError(f"softmax form={form!r} must be one of {FORMS}")
    if exp not in SOFTMAX_EXP:
        raise ValueError(f"exp={exp!r} must be one of {SOFTMAX_EXP}")
    if form == "max" and exp != "limit":
        raise ValueError("the max-subtracted softmax computes exp accurately (exp='limit')")


def keep_mask(q_shape: tuple, Sk: int, masked: bool) -> np.ndarray:
    """Public boolean (B, h, Sq, Sk): the scores that exist (causal: j <= i)."""
    base = tril_mask(Sk).astype(bool) if masked else np.ones((1, Sk), bool)
    return np.broadcast_to(base, tuple(q_shape[:-1]) + (Sk,))


def score_trunc(frac: int, prescaled: bool) -> int:
    """The truncation of the score product: frac, or frac + SCORE_EXTRA when 1/sqrt(dh)
    rides in it."""
    return frac if prescaled else frac + SCORE_EXTRA


def score_query(q: AShare, prescaled: bool) -> AShare:
    """q as the score product takes it: times round(2^SCORE_EXTRA / sqrt(dh)) unless it
    carries 1/sqrt(dh) already."""
    return q if prescaled else q.scale(ring.encode(1.0 / math.sqrt(q.shape[-1]), SCORE_EXTRA))


def kept_scores(p: Party, q: AShare, k: AShare, keep: np.ndarray, prescaled: bool) -> AShare:
    """The kept entries of q k^T / sqrt(dh), flat in row-major order: one product.
    Cost: ``arith.cost_mul(kept, cfg, score_trunc(frac, prescaled))``."""
    sc = arith.mul_many_aa(p, [(score_query(q, prescaled), k.T, "matmul",
                                score_trunc(p.cfg.frac, prescaled), keep)], ["vscores"])[0]
    return AShare(sc.a[keep], sc.b[keep])


def row_keys(Sq: int, Sk: int, masked: bool) -> np.ndarray:
    """The number of keys each query row of one head attends to: Sk, or i + 1 for causal
    row i."""
    return np.arange(1, Sq + 1) if masked else np.full(Sq, Sk)


def row_lengths(B: int, h: int, Sq: int, Sk: int, masked: bool) -> np.ndarray:
    """Kept scores per row, rows in (B, h, Sq) order (:func:`row_keys` of every head)."""
    return np.tile(row_keys(Sq, Sk, masked), B * h)


def scatter_kept(x: AShare, keep: np.ndarray) -> AShare:
    """The kept entries ``x`` (flat, row-major) at their places of ``keep``; 0 elsewhere."""
    a, b = np.zeros(keep.shape, np.uint64), np.zeros(keep.shape, np.uint64)
    a[keep], b[keep] = x.a, x.b
    return AShare(a, b)


def row_sums(x: AShare) -> AShare:
    """Sums over the last axis (local)."""
    return AShare(x.a.sum(axis=-1, dtype=np.uint64), x.b.sum(axis=-1, dtype=np.uint64))


def softmax_attention(p: Party, q: AShare, k: AShare, v: AShare, masked: bool = False,
                      exp: str = "poly", fused: bool = False, form: str = "max-free",
                      prescaled: bool = False) -> AShare:
    """softmax(q k^T / sqrt(dh)) v for per-head q (B, h, Sq, dh), k, v (B, h, Sk, dh);
    ``form``, ``exp`` and ``prescaled`` as the module docstring says (defaults: Privformer's
    max-free baseline with its polynomial). Cost: :func:`cost_softmax_attention`."""
    _check(form, exp)
    B, h, Sq, dh = q.shape
    Sk = k.shape[-2]
    if masked and Sq != Sk:
        raise ValueError("masked softmax attention needs Sq == Sk")
    keep = keep_mask(q.shape, Sk, masked)
    s = kept_scores(p, q, k, keep, prescaled)            # kept scores, row-major
    if form == "max":
        lens = row_lengths(B, h, Sq, Sk, masked)
        m = extrema.max_rows_a(p, s, lens, site="rowmax")
        rows = np.repeat(np.arange(lens.size), lens)
        e_kept = fxp.exp_neg_a(p, s - AShare(m.a[rows], m.b[rows]), site="rowmax")
    else:
        e_kept = fxp.exp_a(p, s, method=exp, site="exp")
    e = scatter_kept(e_kept, keep)
    den = row_sums(e)
    den_site = None if form == "max" else "den"      # max-subtracted: den in [1, n]
    if fused:
        return divide_rows(p, e, v, den, den_site)
    inv = fxp.reciprocal_a(p, den, site=den_site)
    ev = arith.matmul_aa(p, e, v, site="vout")
    return arith.mul_aa(p, ev, repeat_cols(inv, dh), site="vout")


def cost_softmax_attention(cfg: RingConfig, B: int, h: int, Sq: int, Sk: int, dh: int,
                           masked: bool = False, exp: str = "poly", fused: bool = False,
                           form: str = "max-free", prescaled: bool = False) -> Cost:
    """Declared rounds and bytes per party of :func:`softmax_attention`."""
    _check(form, exp)
    f = cfg.frac
    kept = B * h * (Sq * (Sq + 1) // 2 if masked else Sq * Sk)
    rows = B * h * Sq
    cost = arith.cost_mul(kept, cfg, score_trunc(f, prescaled))
    if form == "max":
        cost = (cost + extrema.cost_max_rows(row_lengths(B, h, Sq, Sk, masked), cfg)
                + fxp.cost_exp_neg(kept, cfg))
    else:
        cost = cost + fxp.cost_exp(kept, cfg, exp)
    if fused:
        return cost + cost_divide_rows(cfg, rows, dh)
    return (cost + fxp.cost_reciprocal(rows, cfg) + arith.cost_mul(rows * dh, cfg)
            + arith.cost_mul(rows * dh, cfg))
