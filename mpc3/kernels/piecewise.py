"""Piecewise polynomials on shares: the machinery of the activations that are 0 far left
and x far right (gelu_a in activations.py, silu_a in silu.py), in one copy.

* :func:`piecewise` - 0 below the first break, one polynomial piece per segment, x from
  the last break on: the comparisons [x >= t_k] (one thermometer per element) run in the
  rounds of the pieces and are left masked for ONE batched injection that telescopes to the
  piece x is in (garbage of the other pieces cancels exactly in the ring). Cost:
  :func:`cost_piecewise`.
* :func:`quartics` - one quartic per segment in two product layers, all segments at once,
  each around a centre of its segment; :func:`quartic_table` fits them (near-minimax,
  K-bit coefficients quantised one at a time with the rest refitted). :func:`segments_a`
  is the two together (the "segments" form: fewest rounds). Cost: :func:`cost_segments`.
* The "cheb" forms (one even polynomial in z = 2 x^2 / T^2 - 1 between two breaks, fewest
  bytes) share :func:`cheb_z` and :func:`x_half_dot`: x / 2 plus one dot product.

The algorithms, scales and error analyses are in the kernels' docstrings
(:mod:`mpc3.kernels.activations`, :mod:`mpc3.kernels.silu`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import ring
from ..party import Party, RingConfig
from ..shares import AShare
from . import arith, convert, thresholds
from .base import Cost, run_steps

#: The pieces are fitted this far beyond each segment (DReLU's either-answer region
#: [t - 2^-12, t) may pick the next segment's piece).
FIT_MARGIN = 2.0 ** -10


# ------------------------------------------------------------------------ fitting ----
def minimax(basis: np.ndarray, target: np.ndarray, iters: int) -> np.ndarray:
    """Coefficients of ``basis`` (points x terms) near-minimising the max error to
    ``target`` (least squares reweighted towards the worst points)."""
    w = np.ones(len(target))
    for _ in range(iters):
        coef, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
        r = np.abs(basis @ coef - target)
        w = w * (1 + 50 * r / r.max())
        w = w / w.max()
    return coef


def _fit(basis: np.ndarray, target: np.ndarray, fixed: dict[int, float],
         iters: int) -> np.ndarray:
    """:func:`minimax` with the coefficients in ``fixed`` held at their given values."""
    free = [k for k in range(basis.shape[1]) if k not in fixed]
    rest = target - sum(c * basis[:, k] for k, c in fixed.items())
    coef = minimax(basis[:, free], rest, iters)
    out = np.zeros(basis.shape[1])
    out[free] = coef
    for k, c in fixed.items():
        out[k] = c
    return out


def fit_quantised(basis: np.ndarray, target: np.ndarray, order, coef_bits: int,
                  iters: int = 40) -> np.ndarray:
    """Near-minimax coefficients of ``basis``'s columns, those in ``order`` multiples of
    2^-coef_bits: rounded one at a time in that order, the others refitted after each (the
    refit absorbs most of each rounding)."""
    fixed: dict[int, float] = {}
    for k in order:
        a = _fit(basis, target, fixed, iters)
        fixed[k] = round(a[k] * 2 ** coef_bits) / 2 ** coef_bits
    return _fit(basis, target, fixed, iters)


def quartic_table(fn: Callable[[np.ndarray], np.ndarray], breaks, extra: int,
                  coef_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(centres m_j, coefficients (segments, 5) a0..a4 in u = x - m_j) of one quartic of
    ``fn`` per segment [t_j, t_{j+1}) of ``breaks`` (fitted FIT_MARGIN beyond its ends):
    m_j a multiple of 2^-(extra + 1) (so 2 m_j x is exact at scale frac + extra), a4, a3, a1
    multiples of 2^-coef_bits (quantised in that order, refitting the rest)."""
    centres, coefs = [], []
    for lo, hi in zip(breaks[:-1], breaks[1:]):
        m = round((lo + hi) / 2 * 2 ** (extra + 1)) / 2 ** (extra + 1)
        x = np.linspace(lo - FIT_MARGIN, hi + FIT_MARGIN, 801)
        u = x - m
        centres.append(m)
        coefs.append(fit_quantised(np.stack([u ** k for k in range(5)], 1), fn(x),
                                   (4, 3, 1), coef_bits))
    return np.array(centres), np.array(coefs)


# --------------------------------------------------------------- the segmented form ----
def form(kernel: str, method: str, n: int, malicious: bool = False) -> str:
    """"auto": "segments" (fewest rounds) for calls of at most ROUND_LEAN_ELEMENTS
    elements, else "cheb" (fewest bytes) - and always "cheb" in malicious mode
    (``malicious``: the party has checks), whose proof the comparisons dominate: the
    segments' five thresholds cost it about twice the proof terms of the Chebyshev form's
    two (docs/MALICIOUS.md), for 3 rounds more (exact mode); a named method as it is."""
    if method == "auto":
        if malicious:
            return "cheb"
        return "segments" if n <= thresholds.ROUND_LEAN_ELEMENTS else "cheb"
    if method not in ("segments", "cheb"):
        raise ValueError(f"{kernel}: unknown method {method!r} (auto, segments, cheb)")
    return method


def wide(v: AShare, k: int) -> AShare:
    """(n,) -> (n, k), the same value in every column."""
    return AShare(np.repeat(v.a[:, None], k, 1), np.repeat(v.b[:, None], k, 1))


def pairs(left: list[AShare], right: list[AShare]) -> tuple[AShare, AShare]:
    """Operands of ONE dot product sum_i left_i right_i per element (matmul of (.., 1, k)
    by (.., k, 1)): the products are summed before the single truncation."""
    def stack(vs, axis):
        return AShare(np.expand_dims(np.stack([v.a for v in vs], -1), axis),
                      np.expand_dims(np.stack([v.b for v in vs], -1), axis))
    return stack(left, -2), stack(right, -1)


def coef_ints(c, bits: int) -> np.ndarray:
    """Public coefficients c as ring integers c 2^bits (rounded)."""
    return ring.from_signed(np.rint(np.asarray(c, dtype=np.float64) * 2 ** bits)
                            .astype(np.int64))


def piecewise(p: Party, x: AShare, breaks, steps: Callable) -> AShare:
    """0 below breaks[0], piece j on [t_j, t_{j+1}), x from breaks[-1] on: the comparisons
    c_k = [x >= t_k] (left masked for the injection) run in lockstep with the pieces
    ``steps(x)`` (lockstep steps, :func:`mpc3.kernels.base.lockstep`) -> (n, len(breaks) - 1)
    values V_1..; the output is sum_k c_k (V_{k+1} - V_k) with V_0 = 0 and V_last = x (it
    telescopes to the piece x is in; garbage in the other pieces cancels exactly in the
    ring): one batched injection."""
    shape = x.shape
    x = x.reshape(-1)
    n, nt = x.size, len(breaks)
    t = ring.encode(np.array(breaks), p.cfg.frac)
    if shared_breaks(n, nt, p.cfg):        # one thermometer per element, dealt carry
        compare = thresholds.compare_steps(p, x, t, convert.window(p))
    else:
        diff = arith.add_public(p, wide(x, nt), -t[None, :]).reshape(-1)
        compare = convert.drelu_masked_steps(p, diff)
    bits, poly = run_steps(p, compare, steps(x))
    zero = np.zeros((n, 1), dtype=np.uint64)
    values = AShare.concat([poly, x.reshape(n, 1)], 1)                # V_1..V_nt
    below = AShare.concat([AShare(zero, zero.copy()), poly], 1)       # V_0..V_nt-1
    # nt injections, 2 rounds, resharing only each element's sum
    return convert.mul_masked(p, bits, (values - below).reshape(-1), sum_runs=nt).reshape(shape)


def shared_breaks(n: int, nt: int, cfg: RingConfig) -> bool:
    """Whether :func:`piecewise` compares each element with all its breaks in
    thresholds.compare_public_masked (2 rounds; one thermometer per element) rather than
    convert.drelu_masked on the n * nt differences: on few elements, or when it sends fewer
    bytes (4 or more breaks)."""
    win = convert.window_for(cfg)
    return convert.dealt_carry(n * nt) or \
        thresholds.cost_compare_public(n, nt, *win).bytes_total <= \
        convert.cost_drelu(n * nt, cfg, win=win, fused=True).bytes_total


def cost_piecewise(n: int, nt: int, cfg: RingConfig, pieces: Cost) -> Cost:
    """:func:`piecewise` with ``nt`` breaks whose pieces cost ``pieces``."""
    win = convert.window_for(cfg)
    compare = (thresholds.cost_compare_public(n, nt, *win) if shared_breaks(n, nt, cfg)
               else convert.cost_drelu(n * nt, cfg, win=win, fused=True))
    return Cost.parallel(compare, pieces) + convert.cost_inject(n * nt, fused=True, seg=nt)


def quartics(p: Party, x: AShare, table: tuple[np.ndarray, np.ndarray], e: int, K: int):
    """The segment quartics P_j(x) of ``table`` (:func:`quartic_table` with extra = e,
    coef_bits = K), (n, segments) at scale frac: two product layers (lockstep steps,
    :func:`mpc3.kernels.base.lockstep`).

    Layer 1: y = x^2 at S = frac + e bits. Segment j in u = x - m_j (local) and
    u^2 = y - 2 m_j x + m_j^2 (local): P_j = [u^2, a1 u] . [L_j, 1] + a0 with
    L_j = a4 u^2 + a3 u + a2 (local, scale S + K): layer 2 is ONE two-term dot product per
    segment formed at scale 2 S + K, a0 a public addition."""
    p.new_op()
    f, S = p.cfg.frac, p.cfg.frac + e
    n = x.size
    centres, a = table
    nseg = centres.size
    y, = yield from arith.mul_many_steps(p, [(x, x, "mul", 2 * f - S)])   # x^2 at scale S
    xs = wide(x.scale(1 << e), nseg)                         # x at scale S
    u = arith.add_public(p, xs, -ring.encode(centres, S)[None, :])
    two_m = coef_ints(2 * centres, e)[None, :]
    u2 = arith.add_public(p, wide(y, nseg) - wide(x, nseg).scale(two_m),   # (x - m)^2 at S
                          ring.encode(centres ** 2, S)[None, :])
    L = arith.add_public(p, u2.scale(coef_ints(a[:, 4], K)[None, :])
                         + u.scale(coef_ints(a[:, 3], K)[None, :]),
                         ring.encode(a[:, 2], S + K)[None, :])        # scale S + K
    M = u.scale(coef_ints(a[:, 1], K)[None, :])                       # scale S + K
    one = arith.public_share(p, np.full((n, nseg), np.uint64(1) << np.uint64(S)))
    # one product per segment, 2 | 1 rounds
    poly, = yield from arith.mul_many_steps(p, [(*pairs([u2, M], [L, one]), "matmul",
                                                 2 * S + K - f)])
    poly = poly.reshape(n, nseg)
    return arith.add_public(p, poly, ring.encode(a[:, 0], f)[None, :])  # P_j at scale f


def segments_a(p: Party, x: AShare, breaks, table, e: int, K: int) -> AShare:
    """:func:`piecewise` with :func:`quartics` for the segments between ``breaks``."""
    return piecewise(p, x, breaks, lambda v: quartics(p, v, table, e, K))


def cost_segments(n: int, nt: int, cfg: RingConfig, e: int, K: int) -> Cost:
    """:func:`segments_a` with ``nt`` breaks (nt - 1 quartics) on ``n`` elements."""
    f, S = cfg.frac, cfg.frac + e
    quartic = (arith.cost_mul(n, cfg, 2 * f - S)
               + arith.cost_mul(n * (nt - 1), cfg, 2 * S + K - f))
    return cost_piecewise(n, nt, cfg, quartic)


# ------------------------------------------------------------ the Chebyshev forms ----
def cheb_z(p: Party, x: AShare, num: int, sh: int, S: int):
    """z = 2 x^2 / T^2 - 1 at scale S, 2 / T^2 = num / 2^sh exact in the ring: one product
    (:func:`cost_cheb_z`), as lockstep steps."""
    f = p.cfg.frac
    one = ring.encode(np.ones(x.size), S)
    z, = yield from arith.mul_many_steps(p, [(x, x.scale(num), "mul", 2 * f + sh - S)])
    return arith.add_public(p, z, -one)


def cost_cheb_z(n: int, cfg: RingConfig, sh: int, S: int) -> Cost:
    return arith.cost_mul(n, cfg, 2 * cfg.frac + sh - S)


def x_half_dot(p: Party, x: AShare, left: list[AShare], right: list[AShare], c0: float,
               S: int, K: int):
    """x / 2 + sum_i left_i right_i + c0, (n, 1) at scale frac: ONE dot product formed at
    scale 2 S + K (left_i at S, right_i at S + K) whose last term is x times the public
    power of two that halves it, as lockstep steps. Cost: one product (arith.cost_mul of
    n, shift 2 S + K - f)."""
    f, n = p.cfg.frac, x.size
    half = arith.public_share(p, np.full(n, np.uint64(1) << np.uint64(2 * S + K - f - 1)))
    poly, = yield from arith.mul_many_steps(p, [(*pairs(left + [x], right + [half]), "matmul",
                                                 2 * S + K - f)])
    poly = poly.reshape(n, 1)                                       # scale f
    return arith.add_public(p, poly, ring.encode(np.full((n, 1), c0), f))
