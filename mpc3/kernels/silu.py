"""silu_a: SiLU(x) = x sigmoid(x) (LLaMA-family FFNs, issue 36), built like gelu_a
(:mod:`mpc3.kernels.activations`) on the same machinery (:mod:`mpc3.kernels.piecewise`).

SiLU has GELU's shape: SiLU(x) = x / 2 + E(x) with E(x) = (x / 2) tanh(x / 2) even, so
SiLU(-x) = SiLU(x) - x, 0 far left and x far right. But it reaches ReLU much more slowly:
|SiLU - ReLU| = |x| sigmoid(-|x|) is 2.7e-3 at |x| = 8 (GELU's: 1.3e-4 at 4), so the
polynomials must cover |x| < ~10, and tanh(x / 2)'s poles at x = +-i pi make one polynomial
converge slowly there (degree 24 in x for 5.5e-4 on |x| < 10, GELU's 12 on 3.72).
silu_a(method="auto") takes

* "segments" for calls of at most thresholds.ROUND_LEAN_ELEMENTS (2^14) elements: fewest
  rounds (6 exact, 4 prob), five quartics;
* "cheb" above: fewest bytes (2 comparisons instead of 6), one degree-12 polynomial in
  z = 2 x^2 / T^2 - 1 in five product layers (12 rounds exact, 7 prob).

Segments (:data:`SILU_BREAKS` = (-10.25, -3.625, -1.25, 1.25, 3.625, 10.25)): 0 below
-10.25, x from 10.25 on (the tails: |SiLU - ReLU| <= 10.25 sigmoid(-10.25) = 3.6e-4), one
quartic per segment in between, fitted like GELU's (:func:`piecewise.quartic_table`;
:func:`piecewise.segments_a`: one thermometer of six comparisons, x^2 and one two-term dot
product per segment, one injection). Four quartics on (-10, -2.6, 0, 2.6, 10) reach only
7.2e-4 in float64 and 1.4e-3 once prob mode's 14-bit coefficients are rounded (the outer
segments are 7.4 wide, |u|^4 up to 187); five with the cut points chosen on a grid for the
smallest error after rounding in both modes give 3.2e-4 (exact) / 4.1e-4 (prob), so
the tails and the pieces balance. The outer segments are the widest: their rounding
binds, and the inner break (anywhere in [1, 1.3]) does not.

Chebyshev (:data:`SILU_CHEB_Z`: 2 / T^2 = 43 / 2^11, T = 9.76, where the tails' 5.6e-4
balances the polynomial's): P(x) = x / 2 + sum_k c_k T_k(z), k <= 12, between the
comparisons [x >= -T] and [x >= T]. z (layer 1), T_2 = 2 z^2 - 1 (2), T_3 = 2 z T_2 - z
and T_4 = 2 T_2^2 - 1 (3, one mul_many), T_8 = 2 T_4^2 - 1 (4), and ONE 4-term dot product
(5): with T_{a+b} = 2 T_a T_b - T_{|a-b|}, T_5..T_7 are z, T_2, T_3 times T_4 and
T_9..T_12 are z, T_2, T_3, T_4 times T_8 (plus lower terms), so
sum c_k T_k = c_0 + L + T_8 A + T_4 B with L, A, B local combinations of z, T_2, T_3, T_4,
T_8. The 12 coefficients are fitted in that product basis directly
(:func:`silu_cheb_table`; K-bit, rounded one at a time with the rest refitted), and x / 2
rides in the dot product (:func:`piecewise.x_half_dot`). Degree 10 would give 1.6e-3, and
without T_3 (no T_11) 1.3e-3 even at degree 12 (float64, same T).

Scales per truncation mode (e, K): u, u^2, z, T_k kept at frac + e bits, the dot product
formed at scale 2 (frac + e) + K. Segments (:data:`SILU_SCALES`): exact (2, 16), 56 bits
(selected |u^2 L + a1 u| <= 3.5 < 2^6); prob (0, 14), 50 bits: the selected product fails
w.p. ~3.5 * 2^-14 = 2.1e-4 per element at most. Chebyshev (:data:`SILU_CHEB_SCALES`):
exact (2, 18), 58 bits (|sum - c_0| <= 6.8 < 2^4); prob (0, 13), 49 bits: fails w.p.
~6.8 * 2^-15 = 2.1e-4 at most (|x| near T; about 3 * 2^-15 near 0). Prob mode's 13-bit
coefficients cost 6.6e-5 of error against exact's 18 (14 bits: 2.5e-5, at twice the
failures) and z at frac bits ~4e-5 more (dx/dz = T^2 / 4x is large). Both prob figures
are :data:`SILU_PROB_FAILURE` (2.5e-4 with the other products' share), documented like
gelu_a's, not prevented; products of pieces an input is not in may fail or overflow
harmlessly (they cancel).

Range (one, closed): |x| <= :func:`silu_limit` (cfg) = relu_limit / 2 = 2^13, so every
comparison x - t_k stays inside DReLU's window (|t_k| <= 10.25). Error on the range
(:data:`SILU_ERROR`): max |out - SiLU(x)| <= 6e-4 exact, 7e-4 prob, both methods (measured
on the grid of tests/mpc3/test_kernels_silu.py: segments 3.62e-4 exact, 4.11e-4 prob; cheb
5.63e-4 exact, 5.77e-4 prob. The exact maxima are the tails just beyond the outermost
threshold, 0 or x there exactly). DReLU's either-answer region [t_k - 2^-12, t_k) picks the
next segment's piece, fitted 2^-10 beyond its ends.

Outside the range: up to |x| < 2^15 - 10.25 - 2^-8 the comparisons are still right (DReLU's
one bit of margin) and so is the result (0 or x, within the tails' error); from
2^15 + 10.25 to 2^16 - 10.25 every comparison is wrong - positive x give 0, negative x
give x - and beyond about half are (garbage).

Cost (:func:`cost_silu`; bytes over the three parties per element, from 2^14 elements):
segments: 6 comparisons (one thermometer), 1 + 5 products, 6 injections: 409.9 B exact in
6 rounds, 332.6 B prob in 4 (gelu_a's: 348.8 / 285.8 B); cheb: 2 comparisons, 6 products,
2 injections: 286.9 B exact in 12 rounds (5 product layers + 2), 233.3 B prob in 7
(gelu_a's: 223.5 B in 10, 185.3 B in 7).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import ring
from ..party import Party, RingConfig, profiled
from ..shares import AShare
from . import arith, convert
from .base import Cost
from .piecewise import (FIT_MARGIN, cheb_z, coef_ints, cost_cheb_z, cost_piecewise,
                        cost_segments, fit_quantised, form, piecewise, quartic_table,
                        segments_a, x_half_dot)

#: Comparison thresholds: 0 below the first, quartic j on [t_j, t_{j+1}), x from the last on.
SILU_BREAKS = (-10.25, -3.625, -1.25, 1.25, 3.625, 10.25)
#: (e, K) per truncation mode: u, u^2 kept at frac + e bits, coefficients a4, a3, a1 with K.
SILU_SCALES = {"exact": (2, 16), "prob": (0, 14)}
#: 2 / T^2 = 43 / 2^11 (exact in the ring): the "cheb" form covers |x| < T = 9.76.
SILU_CHEB_Z = (43, 11)
#: (e, K) per truncation mode of the "cheb" form: z, T_k at frac + e bits, the dot
#: product's coefficients K-bit integers (module docstring).
SILU_CHEB_SCALES = {"exact": (2, 18), "prob": (0, 13)}
#: Error claim on the range (absolute), per truncation mode (prob: excluding its failures).
SILU_ERROR = {"exact": 6e-4, "prob": 7e-4}
#: "prob" mode's failure probability per element on the polynomials' range (|x| below the
#: method's outermost threshold), an upper bound; a failure is a garbage value.
SILU_PROB_FAILURE = {"segments": 2.5e-4, "cheb": 2.5e-4}

#: The "cheb" form's product basis, after the constant: L's terms, then A's (times T_8),
#: then B's (times T_4); the column order is also the coefficients' (see _cheb_basis).
_CHEB_TERMS = ("z", "T2", "T3", "T4", "T8", "z T8", "T2 T8", "T3 T8", "T4 T8",
               "z T4", "T2 T4", "T3 T4")


def silu_limit(cfg: RingConfig) -> float:
    """The one documented range of silu_a: |x| <= relu_limit(cfg) / 2 (2^13 by default)."""
    return convert.relu_limit(cfg) / 2


def silu_ref(x) -> np.ndarray:
    """float64 SiLU, x sigmoid(x) with sigmoid(x) = exp(-log(1 + e^-x)) (no overflow for
    large -x, full relative precision in the left tail)."""
    x = np.asarray(x, dtype=np.float64)
    return x * np.exp(-np.logaddexp(0.0, -x))


def silu_method(method: str, n: int, malicious: bool = False) -> str:
    """"auto": "segments" (fewest rounds) for calls of at most ROUND_LEAN_ELEMENTS
    elements, else "cheb" (fewest bytes); always "cheb" in malicious mode (piecewise.form)."""
    return form("silu_a", method, n, malicious)


@functools.lru_cache(maxsize=None)
def silu_table(extra: int, coef_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(centres, coefficients (5, 5)) of the five quartics of SiLU on :data:`SILU_BREAKS`
    (:func:`mpc3.kernels.piecewise.quartic_table`)."""
    return quartic_table(silu_ref, SILU_BREAKS, extra, coef_bits)


def silu_cheb_threshold() -> float:
    num, sh = SILU_CHEB_Z
    return math.sqrt(2 * 2 ** sh / num)


def _cheb_basis(z: np.ndarray) -> np.ndarray:
    """The columns 1, then :data:`_CHEB_TERMS`, as the ring forms them from z."""
    t2 = 2 * z * z - 1
    t3, t4 = 2 * z * t2 - z, 2 * t2 * t2 - 1
    t8 = 2 * t4 * t4 - 1
    return np.stack([np.ones_like(z), z, t2, t3, t4, t8, z * t8, t2 * t8, t3 * t8, t4 * t8,
                     z * t4, t2 * t4, t3 * t4], 1)


@functools.lru_cache(maxsize=None)
def silu_cheb_table(coef_bits: int) -> np.ndarray:
    """Coefficients of 1 and :data:`_CHEB_TERMS` for E(x) = SiLU(x) - x / 2 (even) on
    |x| <= T + 2^-10: near-minimax, all but the constant multiples of 2^-coef_bits (rounded
    from the last term back, the rest refitted after each)."""
    num, sh = SILU_CHEB_Z
    x = np.linspace(0, silu_cheb_threshold() + FIT_MARGIN, 801)
    z = num * x * x / 2 ** sh - 1
    return fit_quantised(_cheb_basis(z), silu_ref(x) - x / 2,
                         range(len(_CHEB_TERMS), 0, -1), coef_bits)


@profiled
def silu_a(p: Party, x: AShare, method: str = "auto", site: str | None = None) -> AShare:
    """SiLU(x) = x sigmoid(x) for |x| <= silu_limit(cfg), same scale; error SILU_ERROR.
    Algorithm and costs: module docstring. Cost: :func:`cost_silu`. ``site``: the
    calibration's name of this call (a shadow party records |x| there; a party ignores it)."""
    if p.shadow is not None:
        return p.shadow.silu_a(x, site)
    if silu_method(method, x.size, p.checks is not None) == "cheb":
        f, (e, K) = p.cfg.frac, SILU_CHEB_SCALES[p.cfg.trunc]
        T = silu_cheb_threshold()
        return piecewise(p, x, (-T, T), lambda v: _cheb_poly(p, v, f + e, K))
    e, K = SILU_SCALES[p.cfg.trunc]
    return segments_a(p, x, SILU_BREAKS, silu_table(e, K), e, K)


def _cheb_poly(p: Party, x: AShare, S: int, K: int):
    """The "cheb" form's one piece as lockstep steps, (n, 1) at scale frac: x / 2 + c_0 + L
    + T_8 A + T_4 B (module docstring) in five product layers; outside |x| < T garbage that
    cancels."""
    c = silu_cheb_table(K)
    k = coef_ints(c, K)
    one_S = ring.encode(np.ones(x.size), S)
    # each layer: one product per element (two in layer 3), 2 | 1 rounds
    z = yield from cheb_z(p, x, *SILU_CHEB_Z, S)             # 43 x^2 / 2^11 - 1 at scale S
    zz, = yield from arith.mul_many_steps(p, [(z, z, "mul", S - 1)])
    t2 = arith.add_public(p, zz, -one_S)
    zt2, t4 = yield from arith.mul_many_steps(p, [(z, t2, "mul", S - 1),
                                                  (t2, t2, "mul", S - 1)])
    t3, t4 = zt2 - z, arith.add_public(p, t4, -one_S)
    t44, = yield from arith.mul_many_steps(p, [(t4, t4, "mul", S - 1)])
    t8 = arith.add_public(p, t44, -one_S)

    def comb(first: int, terms: list[AShare]) -> AShare:   # scale S + K
        out = terms[0].scale(k[first])
        for j, v in enumerate(terms[1:], first + 1):
            out = out + v.scale(k[j])
        return out
    L = comb(1, [z, t2, t3, t4, t8])
    A = comb(6, [z, t2, t3, t4])
    B = comb(10, [z, t2, t3])
    # layer 5: one 4-term dot product per element, 2 | 1 rounds
    return (yield from x_half_dot(p, x, [t8, t4, L], [A, B, arith.public_share(p, one_S)],
                                  c[0], S, K))


def _cost_cheb_poly(n: int, cfg: RingConfig) -> Cost:
    f, (e, K) = cfg.frac, SILU_CHEB_SCALES[cfg.trunc]
    S = f + e
    return (cost_cheb_z(n, cfg, SILU_CHEB_Z[1], S)
            + arith.cost_mul(n, cfg, S - 1)            # T_2
            + arith.cost_mul(2 * n, cfg, S - 1)        # z T_2 and T_4, one round
            + arith.cost_mul(n, cfg, S - 1)            # T_8
            + arith.cost_mul(n, cfg, 2 * S + K - f))   # the dot product


def cost_silu(n: int, cfg: RingConfig, method: str = "auto") -> Cost:
    """Rounds and bytes per party of :func:`silu_a` on ``n`` elements."""
    if silu_method(method, n) == "cheb":
        return cost_piecewise(n, 2, cfg, _cost_cheb_poly(n, cfg))
    e, K = SILU_SCALES[cfg.trunc]
    return cost_segments(n, len(SILU_BREAKS), cfg, e, K)
