"""The seed papers' attention variants on replicated shares, causal masks included.

All take per-head q, k, v of shape (B, h, S, dh) (heads split, as
:func:`protocols.layers.softmax.softmax_attention`), form the scores s = q k^T / sqrt(dh) in one
product (:func:`protocols.layers.softmax.kept_scores`: a model's q carries 1/sqrt(dh) folded into
W^Q, ``prescaled``; otherwise it rides in q with 12 extra bits) and, when ``masked``, only
the S(S+1)/2 causal scores are reshared and transformed; the others are 0.

* :func:`power_softmax` - PowerSoftmax (seed 000, Eq. 2 with the 1/eps^2-Lipschitz division
  of Eq. 4): out_i = sum_j s_ij^p v_j / (eps + sum_j s_ij^p), p even. Forms:
  "plain" (Eq. 4); "stable" (Eq. 5 + 4: the same on t = s / c, c = ||s_i||_inf, so every
  row's largest |t| is 1 and no digits are lost in t^p: c^-2 = max_j s_ij^2 by a ReLU
  tournament over the row's kept scores (mpc3.kernels.extrema), c^-1 by fxp.sqrt_inv_a; the paper's
  eps' only keeps c > 0 in floating point and is 0 here); "length" (Eq. 6, length-agnostic:
  (s^p / L) / (eps + mean_j s^p) with L the row's number of keys, i + 1 for causal row i;
  the reciprocal's input is the mean, so its range does not grow with L; 1/L rides in the
  products (:func:`_mantissa`), the mean and (s^p / L) V in one call).
  Powers by repeated squaring (p = 2, 4, 6, 8: 1, 2, 3, 3 product layers), 1/den by
  ``fxp.reciprocal_a``.
* :func:`sigma_attention` - scaled sigma-attention (seed 002, Eq. 5 with post-activation
  scaling S(L) = 1/L and the mask of Eq. 9): out = (sigma(s) * M) V / L, with sigma = ReLU
  (one relu_a) or a public polynomial sum_k c_k s^k (all powers in ceil(log2 deg) product
  layers, the c_k / L ride in the last product, no extra truncation). L = the number of keys
  (constant, also for causal rows, as in the paper) unless ``length`` is given: an int, or
  "keys" = each row's own number of keys (i + 1 for causal row i; ReLU only), which models
  use so that a causal row never depends on later tokens (1/L_i rides in the product with
  per-row shifts, no extra round).
* softmax: :mod:`protocols.layers.softmax` (max-subtracted and max-free, masked forms included).

Ranges (checked by the calibration the model-zoo wiring adds;
tests/protocols/layers/test_attention_variants.py runs inside them): every score |s| < 2^13
and every product below arith.product_limit;
power_softmax: each denominator (eps + sum_j s^p; eps + mean_j s^p for "length";
eps + sum_j t^p in [1, Sk + eps] for "stable") in fxp.RECIPROCAL_RANGE = [2^-12, 2^16] - so
eps >= 2^-12 is required for "plain"/"length" (refused otherwise); "stable" needs every
row's max_j |s_ij| in [2^-6, 2^7) (fxp.SQRT_INV_RANGE and the ReLU limit for s^2);
|sum_j s_ij^p v_j| < 2^14 for "length". sigma_attention: ReLU inputs within
convert.relu_limit (2^14), |s|^deg < 2^26, and |out| * L < 2^14 (ReLU) or
< 2^14 max_k |c_k| (polynomial). Error: fixed point (18 bits), the 12-bit factors (2^-12
relative) and reciprocal_a's / sqrt_inv_a's; PowerSoftmax's is ~2 ulp * sum_j |v_j| / den
(largest where den ~ eps). Measured in tests/protocols/layers/test_attention_variants.py
(<= 2e-3 absolute, measured <= 1.3e-3, at B=2, h=3, S=7, dh=8 with |q|, |k|, |v| <= 1.5,
eps = 1e-2).
"""
from __future__ import annotations

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, convert, extrema, fxp
from mpc3.kernels.base import Cost
from mpc3.party import Party, RingConfig, profiled
from mpc3.shares import AShare
from protocols.layers.attention import cost_divide_rows, divide_rows, repeat_cols
from protocols.layers.softmax import (
    keep_mask,
    kept_scores,
    row_keys,
    row_lengths,
    row_sums,
    scatter_kept,
    score_query,
    score_trunc,
)

POWER_FORMS = ("plain", "stable", "length")
#: Significant bits of the public factors 1/L, eps and c_k/L that ride in products.
SIG_BITS = 12


# ------------------------------------------------------------------------ helpers ----
def _mantissa(x) -> tuple[np.ndarray, np.ndarray]:
    """Positive public reals x -> (integers c, shifts b) with c = round(x 2^b) in
    [2^(SIG_BITS-1), 2^SIG_BITS]: x to SIG_BITS significant bits whatever its size."""
    x = np.asarray(x, dtype=np.float64)
    b = (SIG_BITS - 1 - np.floor(np.log2(x))).astype(np.int64)
    return np.rint(x * 2.0 ** b).astype(np.uint64), b


def _per_element(shift, shape) -> np.ndarray:
    """Shifts broadcast to an output shape, flat (mul_many_aa's per-element form)."""
    return np.broadcast_to(shift, shape).reshape(-1)


def _relu_scores(p: Party, q: AShare, k: AShare, keep: np.ndarray, prescaled: bool) -> AShare:
    """ReLU of the kept scores (protocols.layers.softmax.kept_scores), the product stopping at the
    split form relu_a reads (arith.mul_split_aa: 8 bytes per kept score less)."""
    return convert.relu_a(p, arith.mul_split_aa(
        p, [(score_query(q, prescaled), k.T, "matmul", keep)],
        trunc=score_trunc(p.cfg.frac, prescaled), sites=["vscores"]), "sigma")


def _power_layers(n: int) -> int:
    """Product layers of :func:`_power` (square-and-multiply)."""
    if n == 1:
        return 0
    return _power_layers(n // 2) + 1 + n % 2


@profiled
def _power(p: Party, x: AShare, n: int) -> AShare:
    """x^n by repeated squaring, each product truncated (one layer each; site ``power``)."""
    if n == 1:
        return x
    half = _power(p, x, n // 2)
    sq = arith.mul_aa(p, half, half, site="power")
    return arith.mul_aa(p, sq, x, site="power") if n % 2 else sq


def _check_power(power: int, eps: float, form: str) -> None:
    if form not in POWER_FORMS:
        raise ValueError(f"power_softmax: form={form!r} must be one of {POWER_FORMS}")
    if power < 2 or power % 2:
        raise ValueError(f"power_softmax: power={power} must be even and >= 2")
    lo = fxp.RECIPROCAL_RANGE[0]
    if form != "stable" and eps < lo:
        raise ValueError(f"power_softmax: eps={eps} below the reciprocal's range "
                         f"(eps >= 2^-12 = {lo:.3g} for form {form!r})")
    if form == "stable" and not eps >= 0:
        raise ValueError("power_softmax: eps must be >= 0")


# --------------------------------------------------------------- power softmax ----
def power_softmax(p: Party, q: AShare, k: AShare, v: AShare, power: int = 4,
                  eps: float = 1e-2, form: str = "plain", masked: bool = False,
                  fused: bool = False, prescaled: bool = False) -> AShare:
    """PowerSoftmax attention (seed 000 Eq. 4-6; module docstring). ``fused`` (forms plain
    and stable): the division as :func:`protocols.layers.attention.divide_rows` (4 rounds fewer);
    ``prescaled``: q carries 1/sqrt(dh) (protocols.layers.softmax). Cost:
    :func:`cost_power_softmax`."""
    _check_power(power, eps, form)
    f = p.cfg.frac
    B, h, Sq, dh = q.shape
    Sk = k.shape[-2]
    if masked and Sq != Sk:
        raise ValueError("masked power_softmax needs Sq == Sk")
    keep = keep_mask(q.shape, Sk, masked)
    s = kept_scores(p, q, k, keep, prescaled)
    if form == "stable":                          # s / ||s_i||_inf = s * (max_j s_ij^2)^-1/2
        lens = row_lengths(B, h, Sq, Sk, masked)
        inv_c = fxp.sqrt_inv_a(p, extrema.max_rows_a(p, arith.mul_aa(p, s, s), lens)
                               .reshape(B, h, Sq))
        wide = repeat_cols(inv_c, Sk)
        s = arith.mul_aa(p, s, AShare(wide.a[keep], wide.b[keep]))
    e = scatter_kept(_power(p, s, power), keep)                      # s^p, 0 where masked
    total = row_sums(e)
    if form == "length":
        c, b = _mantissa(1.0 / row_keys(Sq, Sk, masked))
        one = arith.public_share(p, np.ones(total.shape, np.uint64))      # 1 at scale 0
        mean, ev = arith.mul_many_aa(p, [                              # one call:
            (total.scale(c), one, "mul", _per_element(b, total.shape)),   # sum_j s^p / L_i
            (e.scale(c[:, None]), v, "matmul",                            # (s^p / L_i) @ v
             _per_element((f + b)[:, None], (B, h, Sq, v.shape[-1])))])
        total = mean
    den = arith.add_public(p, total, np.full(total.shape, ring.encode(np.array(eps), f)))
    if fused and form != "length":
        return divide_rows(p, e, v, den, "den")
    inv = fxp.reciprocal_a(p, den, site="den")
    if form != "length":
        ev = arith.matmul_aa(p, e, v, site="vout")
    return arith.mul_aa(p, ev, repeat_cols(inv, v.shape[-1]), site="vout")


def cost_power_softmax(cfg: RingConfig, B: int, h: int, Sq: int, Sk: int, dh: int,
                       power: int = 4, form: str = "plain", masked: bool = False,
                       eps: float = 1e-2, fused: bool = False, prescaled: bool = False) -> Cost:
    _check_power(power, eps, form)
    f = cfg.frac
    kept = B * h * (Sq * (Sq + 1) // 2 if masked else Sq * Sk)
    rows = B * h * Sq
    cost = arith.cost_mul(kept, cfg, score_trunc(f, prescaled))
    if form == "stable":
        cost = (cost + arith.cost_mul(kept, cfg)
                + extrema.cost_max_rows(row_lengths(B, h, Sq, Sk, masked), cfg)
                + fxp.cost_sqrt_inv(rows, cfg) + arith.cost_mul(kept, cfg))
    for _ in range(_power_layers(power)):
        cost = cost + arith.cost_mul(kept, cfg)
    if form == "length":
        b = _mantissa(1.0 / row_keys(Sq, Sk, masked))[1]
        shifts = np.concatenate([np.tile(b, B * h),
                                 np.tile(np.repeat(f + b, dh), B * h)])
        cost = cost + arith.cost_mul_many(shifts, 0, cfg.trunc)
    elif fused:
        return cost + cost_divide_rows(cfg, rows, dh)
    cost = cost + fxp.cost_reciprocal(rows, cfg)
    if form != "length":
        cost = cost + arith.cost_mul(rows * dh, cfg)
    return cost + arith.cost_mul(rows * dh, cfg)


# ---------------------------------------------------------- scaled sigma-attention ----
def _all_powers(p: Party, x: AShare, deg: int) -> list[AShare]:
    """[x, x^2, ..., x^deg] in ceil(log2 deg) product layers: with x..x^m known, one call
    forms x^(m+j) = x^m x^j for j = 1..min(m, deg - m)."""
    pw, n = [x], x.size
    while len(pw) < deg:
        m = len(pw)
        new = min(m, deg - m)
        prod = arith.mul_aa(p, AShare.concat([pw[-1]] * new), AShare.concat(pw[:new]))
        pw += [prod[j * n:(j + 1) * n] for j in range(new)]
    return pw


def _sigma_coeffs(coeffs, L: int) -> tuple[np.ndarray, int]:
    c = np.asarray(coeffs, dtype=np.float64) / L
    if c.ndim != 1 or c.size < 2 or not np.any(c[1:]):
        raise ValueError("sigma_attention: polynomial coefficients c_0..c_deg, deg >= 1")
    b = int(_mantissa(np.max(np.abs(c)))[1])
    return ring.from_signed(np.rint(c * 2.0 ** b).astype(np.int64)), b


def sigma_attention(p: Party, q: AShare, k: AShare, v: AShare, sigma="relu",
                    masked: bool = False, length: int | str | None = None,
                    prescaled: bool = False) -> AShare:
    """Scaled sigma-attention (sigma(s) * M) V / L (seed 002 Eq. 5, 9): ``sigma`` is
    "relu" or the coefficients (c_0, ..., c_deg) of a public polynomial; ``prescaled``: q
    carries 1/sqrt(dh) (protocols.layers.softmax). Cost: :func:`cost_sigma_attention`."""
    f = p.cfg.frac
    Sq, Sk = q.shape[-2], k.shape[-2]
    if masked and Sq != Sk:
        raise ValueError("masked sigma_attention needs Sq == Sk")
    L = _sigma_length(length, Sq, Sk, masked, sigma)
    keep = keep_mask(q.shape, Sk, masked)
    if isinstance(sigma, str):
        if sigma != "relu":
            raise ValueError(f"sigma_attention: sigma={sigma!r} must be 'relu' or coefficients")
        c, b = _mantissa(1.0 / L)
        if np.ndim(L):                     # per row i: c_i on its entries, shift f + b_i
            c, b = np.broadcast_to(c[:, None], keep.shape)[keep], b[:, None]
        act = _relu_scores(p, q, k, keep, prescaled).scale(c)   # ReLU(s) / L at scale f + b
    else:
        s = kept_scores(p, q, k, keep, prescaled)
        c, b = _sigma_coeffs(sigma, L)
        pw = _all_powers(p, s, c.size - 1)
        act = arith.add_public(p, s.scale(c[1]), np.full(s.shape, c[0] << np.uint64(f)))
        for ck, x in zip(c[2:], pw[1:]):
            act = act + x.scale(ck)                           # sum_k c_k s^k / L at f + b
    return arith.matmul_aa(p, scatter_kept(act, keep), v, trunc=f + b,
                           site="sigma_sum" if isinstance(sigma, str) else None)


def _sigma_length(length, Sq: int, Sk: int, masked: bool, sigma):
    """L: an int, or the (Sq,) row key counts for length="keys" (ReLU only)."""
    if length is None:
        return Sk
    if isinstance(length, str):
        if length != "keys":
            raise ValueError(f"sigma_attention: length={length!r} must be None, an int or "
                             "'keys'")
        if not isinstance(sigma, str):
            raise ValueError("sigma_attention: length='keys' is built for sigma='relu' only")
        return row_keys(Sq, Sk, masked)
    return int(length)


def cost_sigma_attention(cfg: RingConfig, B: int, h: int, Sq: int, Sk: int, dh: int,
                         sigma="relu", masked: bool = False,
                         length: int | str | None = None, prescaled: bool = False) -> Cost:
    f = cfg.frac
    kept = B * h * (Sq * (Sq + 1) // 2 if masked else Sq * Sk)
    L = _sigma_length(length, Sq, Sk, masked, sigma)
    if isinstance(sigma, str):
        trunc = score_trunc(f, prescaled)
        cost = arith.cost_mul_split(kept, cfg, trunc) + convert.cost_relu_split(kept, cfg, trunc)
        b = _mantissa(1.0 / L)[1]
        if np.ndim(L):
            b = np.broadcast_to(b[:, None], (B, h, Sq, dh)).reshape(-1)
    else:
        cost = arith.cost_mul(kept, cfg, score_trunc(f, prescaled))
        deg = len(sigma) - 1
        done = 1
        while done < deg:
            new = min(2 * done, deg) - done
            cost = cost + arith.cost_mul(kept * new, cfg)
            done += new
        b = _sigma_coeffs(sigma, L)[1]
    return cost + arith.cost_mul(B * h * Sq * dh, cfg, f + b)
