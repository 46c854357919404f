"""Activations: gelu_a (exact erf GELU) in two forms chosen by call size, and tanh_a (from
exp and reciprocal; see its docstring).

GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2. gelu_a(method="auto") takes

* "segments" for calls of at most thresholds.ROUND_LEAN_ELEMENTS (2^14) elements - a decode
  step's FFN row: fewest rounds (7 exact), 466 B per element over the three parties;
* "cheb" above - a prompt's or a batch's FFN: fewest bytes (247.5 B per element, 10
  rounds exact, 6-7 prob), see :func:`_cheb_poly`. GELU(x) = x / 2 + E(x) with
  E(x) = x erf(x / sqrt 2) / 2 even and smooth, so on |x| < T = sqrt(2^9 / 37) = 3.72 one
  degree-6 Chebyshev polynomial in z = 2 x^2 / T^2 - 1 (degree 12 in x: 3.9e-4 in float64)
  replaces the four quartics, and two comparisons [x >= -T], [x >= T] (tails: |GELU - ReLU|
  <= T Phi(-T) = 3.7e-4) replace five; three products z, T_2, T_4 and one 4-term dot
  product give it. Measured error 3.95e-4 (exact) on the grid of tests/mpc3/test_kernels_gelu.py.

Both have the same range and error claim. The segments form - the PUMA approach (Dong et
al. 2023: segments with low-degree polynomials chosen by comparisons), re-cut for rounds
(the machinery, shared with silu_a: :mod:`mpc3.kernels.piecewise`):

* Segments. Thresholds t = (-4, -1.5625, 0, 1.5625, 4) (:data:`GELU_BREAKS`): 0 below -4,
  x above 4 (exact by construction: the tails |GELU - ReLU| = |x| Phi(-|x|) < 1.27e-4
  there), and four quartics in between, one per segment, fitted in float64 at import
  (reweighted least squares -> near-minimax, 4.3e-4 max error after quantisation; the cut points minimise
  the largest of the four errors). Three segments need degree 8 (one more product
  layer), five reach 4e-5 at one more comparison, product and injection per element.
* Comparisons. All five c_k = [x >= t_k] in ONE DReLU call (a thermometer code), running in
  the rounds of the quartics (lockstep steps, :func:`mpc3.kernels.base.lockstep`) and left
  masked so its last AND layer rides in the injection's first round
  (convert.drelu_masked / mul_masked): 7 rounds in all.
* Quartics in two product layers, all segments at once. Layer 1: y = x^2 (one product,
  kept at S = frac + e bits). Each segment j is written around a centre m_j (a multiple
  of 2^-(e+1), so 2 m_j x is exact at scale S) in u = x - m_j, so its coefficients stay small (sum |a_k u^k| <= 4
  instead of 9 for monomials in x): u and u^2 = y - 2 m_j x + m_j^2 are local.
  P_j = u^2 (a4 u^2 + a3 u + a2) + a1 u + a0 = [u^2, a1 u] . [L_j, 1] + a0: layer 2 is ONE
  two-term dot product per segment (matmul_aa of (.., 1, 2) @ (.., 2, 1): the products are
  summed before the single truncation), a0 is a public addition. a4, a3, a1 are public
  integers of K bits, quantised one at a time with the others refitted (so quantisation
  costs < 1e-5).
* Selection. With V_0 = 0, V_1..V_4 = P_1..P_4, V_5 = x, the output is
  sum_k c_k (V_{k+1} - V_k) (it telescopes to V_j on segment j): one batched injection of
  the five bits, no one-hot conversion. Values of segments an input is not in may be
  garbage (their products overflow for large |x|); they cancel exactly in the ring.
  Horner would need four sequential products per segment (8 rounds in exact mode) instead
  of two layers (4 rounds); the power form x^2, x^3, x^4 needs two layers as well but
  one more product per element and large coefficients.

Scales per truncation mode (:data:`GELU_SCALES`, (e, K)): "exact" e = 2, K = 16 - the dot
product is formed at scale 2S + K = 56 bits (|value| <= 3 on a segment, < 2^62 always);
"prob" e = 0, K = 14 - scale 50, so the selected product (|u^2 L + a1 u| <= 1.5) fails
with probability ~2^50.6/2^64 ~ 1e-4 per element at most (measured: 4 failures in 4e5
elements of [-6, 6]; documented like exp_a's, not prevented; products of segments an input is not in may fail or overflow harmlessly).

Range (one, closed): |x| <= :func:`gelu_limit` (cfg) = relu_limit / 2 = 2^13: every
comparison x - t_k then stays inside DReLU's window. Error on the range, both modes
(:data:`GELU_ERROR`): max |out - GELU(x)| <= 6e-4 (measured 4.32e-4 exact, 4.37e-4 prob on
a 4e4-point sweep of [-6, 6]; 1.3e-4 on the tails; tests/mpc3/test_kernels_gelu.py). DReLU's
either-answer region [t_k - 2^-12, t_k) picks the next segment's quartic, fitted 2^-10 beyond
its ends.

Outside the range: up to |x| < 2^15 - 4 - 2^-8 the comparisons are still right (DReLU's
one bit of margin) and so is the result; beyond 2^15 + 4 every comparison is wrong -
positive x give 0 and negative x give x - and from 2^16 + 4 about half are (garbage).

Cost (:func:`cost_gelu`): rounds = max(DReLU without its last AND layer (5), 2 product
layers (4 | 2)) + injection (2) = 7 in both modes (was 12 / 10 one after the other); bytes:
5 comparisons, 1 + 4 products, 5 injections per element.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import ring
from ..party import Party, RingConfig, profiled
from ..shares import AShare
from . import arith, convert, fxp
from .base import Cost
from .piecewise import (FIT_MARGIN, cheb_z, coef_ints, cost_cheb_z, cost_piecewise,
                        cost_segments, form, minimax, piecewise, quartic_table, segments_a,
                        x_half_dot)

#: Comparison thresholds t_0..t_4: 0 below t_0, quartic j on [t_{j-1}, t_j), x from t_4 on.
GELU_BREAKS = (-4.0, -1.5625, 0.0, 1.5625, 4.0)
#: (e, K) per truncation mode: u, u^2 kept at frac + e bits, coefficients a4, a3, a1 with K.
GELU_SCALES = {"exact": (2, 16), "prob": (0, 14)}
#: Error claim on the range (absolute), per truncation mode (prob: excluding its failures).
GELU_ERROR = {"exact": 6e-4, "prob": 6e-4}
#: "prob" mode's failure probability per element on the polynomial's range (|x| below the
#: method's outermost threshold), an upper bound (see the scales above and
#: :data:`GELU_CHEB_SCALES`); a failure is a garbage value, documented, not prevented.
GELU_PROB_FAILURE = {"segments": 1e-4, "cheb": 2e-4}


def gelu_limit(cfg: RingConfig) -> float:
    """The one documented range of gelu_a: |x| <= relu_limit(cfg) / 2 (2^13 by default)."""
    return convert.relu_limit(cfg) / 2


#: Elements per np.vectorize call of :func:`gelu_ref`: its object array (a Python float per
#: element, ~4x the input's bytes) stays a few MB.
_ERF_BLOCK = 1 << 16


def gelu_ref(x) -> np.ndarray:
    """float64 GELU, exact erf form (``math.erf``, libm's; evaluated in blocks of
    :data:`_ERF_BLOCK` elements so that np.vectorize's object array stays small - whole,
    it was the calibration trace's largest transient. A numba ufunc is 10x faster with
    the same bits, but compiling it costs an owner process 124 MB of LLVM)."""
    x = np.asarray(x, dtype=np.float64)
    u = (x / math.sqrt(2.0)).reshape(-1)
    erf = np.vectorize(math.erf, otypes=[float])
    for i in range(0, u.size, _ERF_BLOCK):
        u[i:i + _ERF_BLOCK] = erf(u[i:i + _ERF_BLOCK])
    return 0.5 * x * (1.0 + u.reshape(x.shape))


@functools.lru_cache(maxsize=None)
def gelu_table(extra: int, coef_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(centres m_j, coefficients (4, 5) a0..a4 in u = x - m_j) of the four quartics
    (:func:`mpc3.kernels.piecewise.quartic_table` of GELU on :data:`GELU_BREAKS`): m_j a
    multiple of 2^-(extra + 1), a4, a3, a1 multiples of 2^-coef_bits."""
    return quartic_table(gelu_ref, GELU_BREAKS, extra, coef_bits)


def gelu_method(method: str, n: int, trunc: str, malicious: bool = False) -> str:
    """"auto": "segments" (fewest rounds) for calls of at most ROUND_LEAN_ELEMENTS
    elements, else "cheb" (fewest bytes); always "cheb" in malicious mode (piecewise.form)."""
    return form("gelu_a", method, n, malicious)


def gelu_a(p: Party, x: AShare, method: str = "auto", site: str | None = None) -> AShare:
    """GELU(x) (erf form) for |x| <= gelu_limit(cfg), same scale; error GELU_ERROR.
    Algorithm and costs: module docstring. Cost: :func:`cost_gelu`."""
    if p.shadow is not None:
        return p.shadow.gelu_a(x, site)
    if gelu_method(method, x.size, p.cfg.trunc, p.checks is not None) == "cheb":
        f, (e, K) = p.cfg.frac, GELU_CHEB_SCALES[p.cfg.trunc]
        T = gelu_cheb_threshold()
        return piecewise(p, x, (-T, T), lambda v: _cheb_poly(p, v, f + e, K))
    e, K = GELU_SCALES[p.cfg.trunc]
    return segments_a(p, x, GELU_BREAKS, gelu_table(e, K), e, K)


def cost_gelu(n: int, cfg: RingConfig, method: str = "auto") -> Cost:
    """Rounds and bytes per party of :func:`gelu_a` on ``n`` elements."""
    if gelu_method(method, n, cfg.trunc) == "cheb":
        return cost_piecewise(n, 2, cfg, _cost_cheb_poly(n, cfg))
    e, K = GELU_SCALES[cfg.trunc]
    return cost_segments(n, len(GELU_BREAKS), cfg, e, K)


# ------------------------------------------------------------ GELU, method "cheb" ----
#: 2 / T^2 = 37 / 2^8 (exact in the ring): the polynomial covers |x| < T = 3.7199, where
#: the tails' |GELU - ReLU| = T Phi(-T) = 3.7e-4 balances the polynomial's error.
GELU_CHEB_Z = (37, 8)
#: Chebyshev degree in z = 2 x^2 / T^2 - 1 (degree 12 in x).
GELU_CHEB_DEGREE = 6
#: (e, K) per truncation mode: z, T_2, T_4 kept at frac + e bits, combination coefficients
#: K-bit integers, so the final dot product is formed at scale 2 (frac + e) + K: exact 58
#: (|value| <= 4 < 2^62), prob 50 (fails with probability ~ 2^51.8 / 2^64 ~ 2e-4 per element,
#: like the segments' prob form; documented, not prevented).
GELU_CHEB_SCALES = {"exact": (2, 18), "prob": (0, 14)}


def gelu_cheb_threshold() -> float:
    num, sh = GELU_CHEB_Z
    return math.sqrt(2 * 2 ** sh / num)


@functools.lru_cache(maxsize=None)
def gelu_cheb_table() -> np.ndarray:
    """Chebyshev coefficients c_0..c_6 in z of E(x) = x erf(x / sqrt 2) / 2 (even, smooth:
    GELU(x) = x / 2 + E(x)) on |x| <= T + 2^-10, near-minimax (reweighted least squares)."""
    T = gelu_cheb_threshold()
    x = np.linspace(0, T + FIT_MARGIN, 6001)
    z = 2 * (x / T) ** 2 - 1
    target = gelu_ref(x) - x / 2
    eye = np.eye(GELU_CHEB_DEGREE + 1)
    basis = np.stack([np.polynomial.chebyshev.chebval(z, eye[k]) for k in range(len(eye))], 1)
    return minimax(basis, target, 80)


def _cheb_poly(p: Party, x: AShare, S: int, K: int):
    """The "cheb" form's one piece as lockstep steps, (n, 1) at scale frac: four product
    layers (2 comparisons,
    4 products, 2 injections per element with :func:`mpc3.kernels.piecewise.piecewise`).

    P(x) = x / 2 + sum_k c_k T_k(z) on |x| < T; outside, garbage that cancels.
    P from three products z, T_2 = 2 z^2 - 1, T_4 = 2 T_2^2 - 1 and ONE 4-term dot product:
    with T_3 = 2 z T_2 - z, T_5 = 2 z T_4 - T_3, T_6 = 2 T_2 T_4 - T_2,
    sum c_k T_k = c_0 + L + z T_2 (2 c_3 - 2 c_5) + T_4 (2 c_5 z + 2 c_6 T_2),
    L = (c_1 - c_3 + c_5) z + (c_2 - c_6) T_2 + c_4 T_4 (local), and x / 2 rides in the
    same sum as x times a public power of two."""
    c = gelu_cheb_table()
    one_S = ring.encode(np.ones(x.size), S)
    z = yield from cheb_z(p, x, *GELU_CHEB_Z, S)         # 37 x^2 / 2^8 - 1 at scale S
    zz, = yield from arith.mul_many_steps(p, [(z, z, "mul", S - 1)])
    t2 = arith.add_public(p, zz, -one_S)
    t22, = yield from arith.mul_many_steps(p, [(t2, t2, "mul", S - 1)])
    t4 = arith.add_public(p, t22, -one_S)

    def k_int(v: float) -> np.ndarray:                      # K-bit public coefficient
        return coef_ints(v, K)
    local = z.scale(k_int(c[1] - c[3] + c[5])) + t2.scale(k_int(c[2] - c[6])) \
        + t4.scale(k_int(c[4]))                                         # scale S + K
    mixed = z.scale(k_int(2 * c[5])) + t2.scale(k_int(2 * c[6]))      # scale S + K
    return (yield from x_half_dot(p, x, [t2, t4, local],
                                  [z.scale(k_int(2 * c[3] - 2 * c[5])), mixed,
                                   arith.public_share(p, one_S)], c[0], S, K))


def _cost_cheb_poly(n: int, cfg: RingConfig) -> Cost:
    f, (e, K) = cfg.frac, GELU_CHEB_SCALES[cfg.trunc]
    S = f + e
    return (cost_cheb_z(n, cfg, GELU_CHEB_Z[1], S)
            + arith.cost_mul(n, cfg, S - 1) + arith.cost_mul(n, cfg, S - 1)
            + arith.cost_mul(n, cfg, 2 * S + K - f))


#: The one documented range of tanh_a (closed): |x| <= 24, so that -2|x| stays inside
#: fxp.EXP_RANGE (lower end -48).
TANH_LIMIT = -fxp.EXP_RANGE[0] / 2
#: Error claim of tanh_a on its range (absolute), per truncation mode (prob: excluding its
#: failures): exact 2 * (reciprocal 5e-6 + 2 ulp + exp's 4 ulp) ~ 6e-5, claimed 1e-4; prob
#: carries exp's 240 ulp twice ~ 1.8e-3, claimed 2.5e-3. Measured on 22k points of [-24, 24]
#: (dense near 0): 1.7e-5 exact, 1.8e-4 prob.
TANH_ERROR = {"exact": 1e-4, "prob": 2.5e-3}


@profiled
def tanh_a(p: Party, x: AShare, site: str | None = None) -> AShare:
    """tanh(x) for |x| <= TANH_LIMIT (24), same scale; error TANH_ERROR.

    tanh is odd, so with s = 2 [x >= 0] - 1 and a = s x = |x|:
    tanh(x) = s (1 - e) / (1 + e) = s (2 / (1 + e) - 1), e = exp(-2a) in (0, 1].

    * one drelu_a for the bit b = [x >= 0] and one mul_ab for b x (a = 2 b x - x, local);
    * exp_a of -2a (inside EXP_RANGE's negative part: error <= 4 ulp);
    * reciprocal_a of 1 + e in [1, 2] (well inside RECIPROCAL_RANGE);
    * t = 2 r - 1 (local) and one mul_ab for s t = 2 b t - t.

    DReLU's either-answer region [-2^-12, 0) is harmless: a wrong bit gives s = +1 on a
    negative x, a = x, and s tanh(s x) = tanh(x) for either sign. Outside the range: exp's
    input leaves EXP_RANGE but its result stays 0 or 1 ulp down to about -120, so tanh is
    still right up to |x| ~ 60; beyond, garbage; from |x| >= relu_limit (2^14) the sign too.

    Cost (:func:`cost_tanh`): drelu (6) + injection (2) + exp + reciprocal + injection (2)
    rounds: 44 in exact mode with exp 16 and reciprocal 18."""
    if p.shadow is not None:
        return p.shadow.tanh_a(x, site)
    shape = x.shape
    x = x.reshape(-1)
    b = convert.drelu_a(p, x)                                  # [x >= 0]
    bx = convert.mul_ab(p, b, x)                               # b x
    a = bx + bx - x                                            # |x| (local)
    e = fxp.exp_a(p, -(a + a))                                 # e^(-2|x|) in (0, 1]
    one = ring.encode(np.ones(x.shape), p.cfg.frac)
    r = fxp.reciprocal_a(p, arith.add_public(p, e, one))       # 1 / (1 + e)
    t = arith.add_public(p, r + r, ring.encode(-np.ones(x.shape), p.cfg.frac))  # tanh(|x|)
    bt = convert.mul_ab(p, b, t)
    return (bt + bt - t).reshape(shape)


def cost_tanh(n: int, cfg: RingConfig) -> Cost:
    """Rounds and bytes per party of :func:`tanh_a` on ``n`` elements."""
    return (convert.cost_drelu(n, cfg)
            + convert.cost_inject(n, fused=False)
            + fxp.cost_exp(n, cfg) + fxp.cost_reciprocal(n, cfg)
            + convert.cost_inject(n, fused=False))
