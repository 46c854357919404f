"""Fixed-point functions: sqrt_inv_a, reciprocal_a, exp_a - one documented range each.

Leak-free initialisation (Privformer Alg. 4 semantics: nothing is revealed, not even the
bit length), restructured for rounds: instead of Alg. 4's 2*ell sequential DReLU/Select
steps, all comparisons ``c_k = [x >= t_k]`` against (fractional-)octave thresholds ``t_k``
run in ONE two-round comparison of each input with the whole table
(:mod:`mpc3.kernels.thresholds`: one thermometer code per input, the carry in one round);
the initial guess is then a public-table lookup written as the dot product
``y0 = T_0 + sum_k c_k (T_k - T_{k-1})`` (one batched bit injection of 2 rounds whose
resharing carries one sum per input; the c_k are a thermometer code of the interval holding
x), followed by Newton iterations:

* sqrt_inv: few inputs - 1/16-octave table of best lines, no Newton (4 rounds); many
  inputs - quarter-octave table + two Newton steps of 4 rounds (fewer bytes).
* reciprocal: half-octave table of best lines (1.5 %), y <- y (2 - x y) twice.
* exp ("limit"): q(x/64)^64 - a degree-4 polynomial q fitted to e^u, six squarings.

Ranges and errors (frac = 18, ulp = 2^-18, y the exact value of the encoded input; measured
on dense sweeps and tested at the range edges by tests/mpc3/test_kernels_ranges.py; "prob" mode
figures exclude its failure events, see below). Rounds: exact / prob truncation.

==============  ===============  ==================================================  =======
kernel          range (closed)   error bound                                          rounds
==============  ===============  ==================================================  =======
sqrt_inv fast   [2^-12, 2^16]    2.5e-4 y + 2 ulp                                      4 / 4
sqrt_inv lean   [2^-12, 2^16]    4e-5 y + 2 ulp  (prob: 5e-5 y + 4 ulp)               12 / 8
reciprocal      [2^-12, 2^16]    5e-6 y + 2 ulp                                       12 / 8
exp "limit"     [-48, 9.5]       4 ulp on [-48, 0], 1.5e-5 y on [0, 9.5]              16 / 9
                                 (prob: 240 ulp, 1e-3 y); never negative
==============  ===============  ==================================================  =======

The exp bounds are worst cases from the rounding analysis in :func:`exp_steps` (measured
maxima over 1.5e5 inputs: 1.7 ulp and 6.6e-6 y; prob 107 ulp and 6.0e-4 y); the others are
measured maxima with ~20 % margin (3.4e4 inputs, 4.8e3 for fast: fast 2.0e-4 y + 1.5 ulp,
lean 3.4e-5 y + 2 ulp (prob 3.9e-5 y + 3 ulp), reciprocal 3.9e-6 y + 1.5 ulp). "poly" exp is
Privformer's baseline polynomial, accurate only near 0.

Outside the ranges (nothing signals it; the client's range check must):
* sqrt_inv/reciprocal below 2^-12 (and x <= 0): the guess saturates at the first table
  entry. "fast" returns exactly 2^6 for every x < 2^-12 (x > -2^17, including 0 and
  negatives); lean's and reciprocal's Newton steps no longer converge (lean is 1.3 % off at
  2^-13 and 11 % at 2^-14, reciprocal 32 % at 2^-14; x = 0 gives 1.5^2 2^6.0625 ~ 150 /
  16384).
* above 2^16: "fast" saturates at exactly 2^-8; lean's guess saturates too (0.1 % off at
  2^16.5, 6 % at 2^16.99); reciprocal's output is below 4 ulp, until x - 2^-12 reaches 2^17, where the comparisons leave their
  window and the result is garbage (e.g. 64 / ~1000 / 16384 at 2^18).
* exp below -48: the polynomial's product exceeds 2^62 and wraps by exactly 1.0 in q; the
  result still rounds to 0 or 1 ulp down to about -120 (garbage below); above 9.5 (exact) the
  last square reaches 2^62 from 14 ln 2 = 9.70 and an increasing share of results wraps.

"prob" truncation fails with probability ~|z|/2^64 per product z (scale before the
shift); these kernels keep their products small for it (PRODUCT_BITS, SQ_EXTRA, EXP_EXTRA):
per element at most ~3e-6 for sqrt_inv at x = 1 (~2e-4 at 2^-12, where y^2 is 2^48),
~2^-18 for reciprocal, and ~e^x 2^-28 for exp (5e-5 at 9.5).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import ring
from ..party import Party, profiled
from ..shares import AShare
from . import arith, convert, thresholds, truncation
from .base import Cost, lockstep, run_steps
from .truncation import trunc_steps

LOG_LO, LOG_HI = -12, 16
#: The whole table range of the initial guesses: octaves LOG_LO .. LOG_HI. A caller that knows
#: its inputs lie in a narrower range of octaves (a LayerNorm whose variance the model's
#: calibration bounds) passes that ``span``: fewer thresholds, fewer bytes, same rounds.
FULL_SPAN = (LOG_LO, LOG_HI)
#: Largest product (bits, at the scale before truncation) the table lookups form on purpose:
#: "exact" truncation is exact below 2^62; "prob" fails with probability ~|z|/2^64, so its
#: products are kept below 2^48 (failure < 2^-16 per product, as a product of in-range
#: values y*y already is).
PRODUCT_BITS = {"exact": 60, "prob": 48}

#: The one documented input range of each function (real units, closed intervals); the
#: calibration pass of ``share-model``, the kernel catalog and the tests use these constants.
SQRT_INV_RANGE = (2.0 ** LOG_LO, 2.0 ** LOG_HI)
RECIPROCAL_RANGE = (2.0 ** LOG_LO, 2.0 ** LOG_HI)
EXP_RANGE = (-48.0, 9.5)
#: exp_neg_a: below -EXP_NEG_FLOOR its result is 0 (e^-32 < 2^-46, far below an ulp); its
#: inputs (s - max of a softmax row) may reach -2^13 (scores |s| < 2^12 each): the comparison
#: with the floor stays inside convert.relu_limit.
EXP_NEG_FLOOR = 32.0
EXP_NEG_RANGE = (-2.0 ** 13, EXP_RANGE[1])
#: exp_neg_a's absolute error in ulps on its range, by truncation mode (exp's on [-48, 0]).
EXP_NEG_ERROR = {"exact": 4.0, "prob": 240.0}
#: "prob" mode's failure probability per element on the range, an upper bound (the worst
#: case of the docstring's figures: sqrt_inv at 2^-12, exp at 9.5); a failure is a garbage
#: value, documented, not prevented.
PROB_FAILURE = {"sqrt_inv": 2e-4, "reciprocal": 2.0 ** -18, "exp": 5e-5}
#: Error claims on those ranges (module docstring), by truncation mode: (rel, ulps) means
#: |out - y| <= rel * |y| + ulps * 2^-frac. For exp: ulps bounds the error on [lo, 0], rel
#: the relative error on [0, hi] (so the (rel, ulps) form holds everywhere too).
SQRT_INV_ERROR = {"fast": {"exact": (2.5e-4, 2.0), "prob": (2.5e-4, 2.0)},
                  "lean": {"exact": (4e-5, 2.0), "prob": (5e-5, 4.0)}}
RECIPROCAL_ERROR = {"exact": (5e-6, 2.0), "prob": (5e-6, 2.0)}
EXP_ERROR = {"exact": (1.5e-5, 4.0), "prob": (1e-3, 240.0)}
#: exp_a("limit") squares q(x / 2^EXP_SQUARINGS) this many times.
EXP_SQUARINGS = 6
#: Extra fractional bits exp_a("limit") keeps before its last squaring, per truncation mode.
#: "exact": free (every product stays below 2^62 on EXP_RANGE); "prob": none, since each
#: extra bit doubles every truncation's failure probability ~|z|/2^64.
EXP_EXTRA = {"exact": 6, "prob": 0}
#: Working scale cap of exp_a("limit"): e^hi * 2^(2F) must stay below 2^62.
EXP_MAX_SCALE = 24


@functools.lru_cache(maxsize=None)
def _best_line(power: float, width: float) -> tuple[float, float]:
    """Line c0 + c1*u minimising the max relative error of u^-power on [1, 2^width]."""
    u = np.linspace(1.0, 2.0 ** width, 2001)
    y = u ** -power
    basis = np.stack([np.ones_like(u), u], 1)
    w = 1 / y
    for _ in range(60):                       # reweighted least squares -> near-minimax
        coef, *_ = np.linalg.lstsq(basis * w[:, None], y * w, rcond=None)
        r = np.abs(basis @ coef - y) / y
        w = w * (1 + 50 * r / r.max())
    return float(coef[0]), float(coef[1])


def check_span(span) -> tuple[int, int]:
    """``span`` (None: :data:`FULL_SPAN`) as integer octaves LOG_LO <= lo < hi <= LOG_HI."""
    if span is None:
        return FULL_SPAN
    lo, hi = (int(v) for v in span)
    if (lo, hi) != tuple(span) or not LOG_LO <= lo < hi <= LOG_HI:
        raise ValueError(f"table span {span!r}: integer octaves lo < hi in [{LOG_LO}, {LOG_HI}]")
    return lo, hi


@functools.lru_cache(maxsize=None)
def _table(power: float, per_octave: int, linear: bool, f: int, mode: str,
           span: tuple[int, int] = FULL_SPAN):
    """Public table of :func:`_init_guess`: thresholds 2^e for e in the octaves ``span``,
    per-interval alpha (and for a linear table beta and the truncation shift f + sh of the
    slope products); below the first and above the last threshold the value saturates."""
    step = 1.0 / per_octave
    exps = np.arange(span[0] * per_octave, span[1] * per_octave + 1) * step  # thresholds 2^e
    if not linear:
        middles = np.concatenate([[exps[0] - step / 2], exps + step / 2])
        return exps, 2.0 ** (-power * middles), None, None
    c0, c1 = _best_line(power, step)
    alpha = np.concatenate([[2.0 ** (-power * exps[0])], c0 * 2.0 ** (-power * exps[:-1]),
                            [2.0 ** (-power * exps[-1])]])
    beta = np.concatenate([[0.0], c1 * 2.0 ** (-power * exps[:-1] - exps[:-1]), [0.0]])
    # shift per interval: ~22 significant bits of b_j, but the active product below
    # 2^(PRODUCT_BITS - 2) (sh may be negative: then fewer than f bits are cut)
    want = np.maximum(np.round(22 - f - np.log2(np.maximum(np.abs(beta), 1e-30))), 0)
    cap = PRODUCT_BITS[mode] - 2 * f - np.ceil(np.log2(np.maximum(alpha, 1e-30))) - 2
    shifts = np.maximum(f + np.minimum(want, cap), 1).astype(np.int64)
    return exps, alpha, beta, shifts


@functools.lru_cache(maxsize=None)
def _table_ring(power: float, per_octave: int, linear: bool, f: int, mode: str,
                span: tuple[int, int] = FULL_SPAN):
    """:func:`_table` in the ring: thresholds 2^e and alpha at scale f, the slopes beta at
    their per-interval shifts (None without ``linear``) - encoded once, not per call."""
    exps, alpha, beta, shifts = _table(power, per_octave, linear, f, mode, span)
    slopes = None if beta is None else \
        ring.from_signed(np.round(beta * 2.0 ** shifts).astype(np.int64))
    return ring.encode(2.0 ** exps, f), ring.encode(alpha, f), slopes


def _init_guess(p: Party, x: AShare, power: float, per_octave: int, linear: bool) -> AShare:
    """x^(-power) from one batched comparison against thresholds t_j = 2^(j/per_octave) and one
    injection. With c_j = [x >= t_j] (a thermometer code) and V_j the interval's value
    (alpha_j, or alpha_j + beta_j x for a ``linear`` table), the guess telescopes:
    y0 = V_0 + sum_j c_j (V_{j+1} - V_j): a two-round comparison of each input with the
    whole table (:func:`mpc3.kernels.thresholds.compare_public_masked`, masked bits) and one
    injection that reshares only the sum per input (convert.mul_masked ``sum_runs``).

    The products beta_j * x are formed for every interval alongside the comparison (public
    scalings, one truncation running in the comparison's rounds: :func:`init_guess_steps`)
    with a per-interval shift that keeps ~20 significant bits; only the selected one survives
    the sum (the injection is exact), so its error is that of a single truncation. Without
    ``linear`` the table is the interval's geometric middle. Cost: :func:`cost_init_guess`.
    """
    return run_steps(p, init_guess_steps(p, x, power, per_octave, linear))[0]


def init_guess_steps(p: Party, x: AShare, power: float, per_octave: int, linear: bool,
                     span=None):
    """:func:`_init_guess` as lockstep steps (:func:`mpc3.kernels.base.lockstep`): the slope
    products' truncation and the comparison share their two rounds, the injection follows."""
    p.new_op()
    f = p.cfg.frac
    span = check_span(span)
    exps, alpha, beta, shifts = _table(power, per_octave, linear, f, p.cfg.trunc, span)
    t_ring, alpha_ring, slopes = _table_ring(power, per_octave, linear, f, p.cfg.trunc, span)
    k = exps.size
    flat = x.reshape(-1)
    rows = flat.size
    compare = thresholds.compare_steps(p, flat, t_ring, _window(f))
    if linear:           # the slope products do not depend on the comparison: shared rounds
        wide = AShare(np.repeat(flat.a[:, None], k + 1, 1), np.repeat(flat.b[:, None], k + 1, 1))
        prods = wide.scale(slopes[None, :]).reshape(-1)
        slope, above = yield from lockstep(
            p, trunc_steps(p, prods, np.tile(shifts, rows), from_rss=True), compare)
        values = arith.add_public(p, slope.reshape(rows, k + 1), np.tile(alpha_ring, (rows, 1)))
    else:
        above = yield from compare
        values = arith.public_share(p, np.tile(alpha_ring, (rows, 1)))
    steps = AShare(values.a[:, 1:] - values.a[:, :-1], values.b[:, 1:] - values.b[:, :-1])
    picked = yield from convert.inject_steps(p, steps.reshape(-1), above.planes, True, seg=k)
    return AShare(values.a[:, 0] + picked.a, values.b[:, 0] + picked.b).reshape(x.shape)


def _window(f: int) -> tuple[int, int]:
    """DReLU window of the threshold comparisons: |x - t| < 2^(LOG_HI + 1) in real units."""
    return 0, f + LOG_HI + 2


def cost_init_guess(n: int, power: float, per_octave: int, linear: bool, frac: int,
                    mode: str, span=None) -> Cost:
    exps, _, _, shifts = _table(power, per_octave, linear, frac, mode, check_span(span))
    k = exps.size
    compare = thresholds.cost_compare_public(n, k, *_window(frac))
    if linear:
        compare = Cost.parallel(arith.cost_trunc_shifts(np.tile(shifts, n), mode, from_rss=True),
                                compare)
    return compare + convert.cost_inject(n * k, fused=True, seg=k)


def _const(p: Party, x: AShare, c: float) -> AShare:
    return arith.add_public(p, x, np.full(x.shape, ring.encode(np.array(c), p.cfg.frac)))


#: Extra fractional bits (on x*y, on y^2) inside a sqrt_inv Newton step, per truncation mode.
#: Their product (xy)(y^2) is y * 2^(2 frac + both) before its truncation: "prob" keeps it
#: below 2^(PRODUCT_BITS["prob"] - 4) for y <= 2^6 (x >= 2^-12), "exact" below 2^62.
SQ_EXTRA = {"exact": (8, 8), "prob": (2, 6)}


FAST_ROWS = 16   # sqrt_inv "auto": up to this many inputs use the round-lean table
NEWTON_SQRT = 2  # Newton steps of sqrt_inv "lean"
#: Thresholds per octave of sqrt_inv "lean"'s constant guess: 4 puts it within 2^(1/16) - 1
#: = 4.4 % of x^-1/2, which two Newton steps (e -> ~1.5 e^2) take to ~1e-5; one threshold
#: per octave (19 %) needed a third step, i.e. 4 more rounds.
LEAN_PER_OCTAVE = 4


def sqrt_inv_a(p: Party, x: AShare, mode: str = "auto", span=None,
               site: str | None = None) -> AShare:
    """1/sqrt(x) for shared x in SQRT_INV_RANGE (Privformer Alg. 4, leak-free), same scale.

    mode "fast": sixteenth-octave thresholds with the best line per interval (rel. error
    9e-5 plus fixed point), no Newton step: 4 rounds, ~21 KB per input. mode "lean":
    quarter-octave thresholds, constant guess (4.4 %), two Newton steps: 12 rounds, ~2.7 KB
    per input (4.8 KB for a single input).
    "auto" picks "fast" for at most FAST_ROWS inputs (decoding steps) and "lean" otherwise
    (whole sequences). Newton step y <- y + y/2 - (x y)(y^2)/2 in two multiplication layers:
    x*y, y^2 (kept at frac + SQ_EXTRA bits) and y/2 in one call with per-element shifts,
    then their product. Error: SQRT_INV_ERROR. Cost: :func:`cost_sqrt_inv`.

    ``span`` (octaves (lo, hi), None: the whole range): the caller guarantees
    x in [2^lo, 2^hi] (a calibrated LayerNorm) - the table covers only those octaves, with
    the same error there (fast: 17 + 16 (hi - lo) intervals instead of 449); outside it
    the guess saturates at the span's ends. ``site``: a shadow party's record.
    """
    if p.shadow is not None:
        return p.shadow.sqrt_inv_a(x, site)
    return run_steps(p, sqrt_inv_steps(p, x, mode, span))[0]


def sqrt_inv_steps(p: Party, x: AShare, mode: str = "auto", span=None,
                   site: str | None = None):
    """:func:`sqrt_inv_a` as lockstep steps (:func:`mpc3.kernels.base.lockstep`)."""
    if p.shadow is not None:               # no rounds: done at the first step
        return p.shadow.sqrt_inv_a(x, site)
    p.new_op()
    mode = _sqrt_inv_mode(mode, x.size)
    f, (e1, e2) = p.cfg.frac, SQ_EXTRA[p.cfg.trunc]
    shape = x.shape
    x = x.reshape(-1)
    if mode == "fast":
        y = yield from init_guess_steps(p, x, 0.5, per_octave=16, linear=True, span=span)
        return y.reshape(shape)
    y = yield from init_guess_steps(p, x, 0.5, per_octave=LEAN_PER_OCTAVE, linear=False,
                                    span=span)
    one = arith.public_share(p, ring.encode(np.ones(x.size), f))
    shifts = np.repeat([f - e1, f - e2, f + 1], x.size)
    for _ in range(NEWTON_SQRT):
        layer, = yield from arith.mul_many_steps(
            p, [(AShare.concat([x, y, y]), AShare.concat([y, y, one]), "mul", shifts)])
        xy, y2, half = layer[:x.size], layer[x.size:2 * x.size], layer[2 * x.size:]
        last, = yield from arith.mul_many_steps(p, [(xy, y2, "mul", f + e1 + e2 + 1)])
        y = y + half - last
    return y.reshape(shape)


def _sqrt_inv_mode(mode: str, n: int) -> str:
    if mode == "auto":
        return "fast" if n <= FAST_ROWS else "lean"
    if mode not in ("fast", "lean"):
        raise ValueError(f"sqrt_inv_a: unknown mode {mode!r} (auto, fast, lean)")
    return mode


def cost_sqrt_inv(n: int, cfg, mode: str = "auto", span=None) -> Cost:
    """Rounds and bytes per party of :func:`sqrt_inv_a` on ``n`` inputs (table ``span``)."""
    frac, trunc = cfg.frac, cfg.trunc
    if _sqrt_inv_mode(mode, n) == "fast":
        return cost_init_guess(n, 0.5, 16, True, frac, trunc, span)
    e1, e2 = SQ_EXTRA[trunc]
    step = (arith.cost_mul(3 * n, cfg, np.repeat([frac - e1, frac - e2, frac + 1], n))
            + arith.cost_mul(n, cfg, frac + e1 + e2 + 1))
    cost = cost_init_guess(n, 0.5, LEAN_PER_OCTAVE, False, frac, trunc, span)
    for _ in range(NEWTON_SQRT):
        cost = cost + step
    return cost


@profiled
def reciprocal_a(p: Party, x: AShare, iterations: int = 2, site: str | None = None) -> AShare:
    """1/x for shared x in RECIPROCAL_RANGE: leak-free half-octave linear initialisation
    (1.5 %) + Newton y <- y (2 - x y) twice. Error: RECIPROCAL_ERROR (for the default two
    iterations). Cost: :func:`cost_reciprocal` (4 + 4 * iterations rounds). A shadow
    party returns 1/x for every ``iterations`` (the guess is exact, so are its steps)."""
    if p.shadow is not None:
        return p.shadow.reciprocal_a(x, site)
    y = _init_guess(p, x, 1.0, per_octave=2, linear=True)
    for _ in range(iterations):
        xy = arith.mul_aa(p, x, y)
        y = arith.mul_aa(p, y, _const(p, -xy, 2.0))
    return y


def cost_reciprocal(n: int, cfg, iterations: int = 2) -> Cost:
    """Rounds and bytes per party of :func:`reciprocal_a` on ``n`` elements."""
    frac, trunc = cfg.frac, cfg.trunc
    cost = cost_init_guess(n, 1.0, 2, True, frac, trunc)
    for _ in range(2 * iterations):
        cost = cost + arith.cost_mul(n, cfg)
    return cost


@functools.lru_cache(maxsize=None)
def _exp_coeffs(hi: float) -> tuple[float, float, float]:
    """(c2, c3, c4) of q(u) = 1 + u + u^2 (c2 + c3 u + c4 u^2) minimising the max relative
    error of q(u)^64 against exp(64 u) for u in [0, hi / 64] (q(u) ~ e^u below 0 too)."""
    u = np.linspace(hi / 2 ** EXP_SQUARINGS / 4000, hi / 2 ** EXP_SQUARINGS, 4000)
    g = (np.exp(u) - 1 - u) / u ** 2
    basis = np.stack([np.ones_like(u), u, u ** 2], 1)
    w0 = u ** 2 * np.exp(-u)                      # error of q relative to e^u
    w = w0.copy()
    for _ in range(60):                           # reweighted least squares -> near-minimax
        coef, *_ = np.linalg.lstsq(basis * w[:, None], g * w, rcond=None)
        r = np.abs(basis @ coef - g) * w0
        w = w * (1 + 50 * r / r.max())
    return float(coef[0]), float(coef[1]), float(coef[2])


def _exp_scales(frac: int, mode: str) -> tuple[int, int]:
    """(F, K): working scale of exp "limit" and the bits of its public coefficients."""
    F = min(frac + EXP_EXTRA[mode], EXP_MAX_SCALE)
    return F, F - 8


def exp_steps(p: Party, x: AShare):
    """exp_a("limit") as lockstep steps (:func:`base.lockstep`): q(x/64)^64. u = x/64 is x read at scale f + 6; u2 = u*u; y0 = 1 + u + u2 * w with
    w = c2 + c3 u + c4 u2 formed locally at scale F + K; then six squarings at scale F, the
    last one truncating back to f. F = f + EXP_EXTRA[mode] (exact: 24, u is free; prob: f,
    u = trunc(x, 6)).

    Rounding analysis (f = 18, exact). With y_k = e^(x / 2^(6-k)), an error d in y_k reaches
    the output as d * 2^(6-k) * y_k^(2^(6-k) - 1); every squaring adds < 2^-F, and y0 carries
    < 1.55 * 2^-F (u2's truncation times |w| <= 0.55, plus the product's) and the error of q
    (< 1.1e-6 / 64 relative on [0, hi/64] with c3, c4 rounded to K bits). For x <= 0:
    1 (last truncation) + 62/64 (squarings) + 64 * 1.55/64 = 3.52 ulp; for x >= 0:
    2^-18 + (62 + 64 * 1.55) * 2^-24 + 1.1e-6 = 1.34e-5 relative. Prob (F = 18, u rounded):
    237 ulp and 9.0e-4. Largest products: u2 * w < 2^61.85 at x = -48, e^x 2^2F < 2^61.7 at
    x = 9.5 (exact); below 2^50 in prob mode. Squares are never negative, nor is their
    truncation (arith rounds non-negative values to non-negative ones).
    """
    f = p.cfg.frac
    F, K = _exp_scales(f, p.cfg.trunc)

    def mul(a, b, trunc):
        return (yield from arith.mul_many_steps(p, [(a, b, "mul", trunc)]))[0]

    u = x
    if F != f + EXP_SQUARINGS:
        p.new_op()
        u = yield from trunc_steps(p, AShare(x.a.reshape(-1), x.b.reshape(-1)),
                                   f + EXP_SQUARINGS - F, from_rss=True)
        u = u.reshape(x.shape)
    u2 = yield from mul(u, u, F)
    c2, c3, c4 = _exp_coeffs(EXP_RANGE[1])
    w = u.scale(round(c3 * 2 ** K)) + u2.scale(round(c4 * 2 ** K))              # scale F + K
    w = arith.add_public(p, w, np.full(x.shape, ring.encode(np.array(c2), F + K)))
    y = u + (yield from mul(u2, w, F + K))
    y = arith.add_public(p, y, np.full(x.shape, np.uint64(1 << F)))
    for k in range(EXP_SQUARINGS):
        y = yield from mul(y, y, F if k < EXP_SQUARINGS - 1 else 2 * F - f)
    return y


@profiled
def exp_neg_a(p: Party, x: AShare, site: str | None = None) -> AShare:
    """exp(x) for x <= 0 of any size (a max-subtracted softmax's s - max): exp "limit"
    (:func:`exp_steps`, exact on [-48, 0]) in lockstep with one two-round comparison
    ``[x >= -EXP_NEG_FLOOR]`` (:func:`mpc3.kernels.thresholds.compare_steps`), whose bit then
    multiplies the result (convert.mul_masked, 2 rounds): 0 below the floor, where exp's
    polynomial leaves its range and wraps. Range :data:`EXP_NEG_RANGE`; error
    :data:`EXP_NEG_ERROR` ulp (exp's own on [-EXP_NEG_FLOOR, 0]; e^-32 < 2^-46 below it,
    and either answer on the comparison's error region [-2^-12, 0) below the floor).
    Cost: :func:`cost_exp_neg` (exp's 16 rounds + 2; prob truncation 9 + 2)."""
    if p.shadow is not None:
        return p.shadow.exp_neg_a(x, site)
    if p.checks is not None:              # malicious mode: maybe in blocks, proven between
        from mpc3.checks import in_blocks
        return in_blocks(p, _exp_neg, x, rowwise=False)
    return _exp_neg(p, x)


def _exp_neg(p: Party, x: AShare) -> AShare:
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))
    floor = ring.encode(np.array([-EXP_NEG_FLOOR]), p.cfg.frac)
    e, above = run_steps(p, exp_steps(p, flat),
                         thresholds.compare_steps(p, flat, floor, thresholds.window(p)))
    return convert.mul_masked(p, above, e).reshape(x.shape)


def cost_exp_neg(n: int, cfg) -> Cost:
    """Rounds and bytes per party of :func:`exp_neg_a` on ``n`` elements."""
    return (Cost.parallel(cost_exp(n, cfg),
                          thresholds.cost_compare_public(n, 1, *thresholds.window_for(cfg)))
            + convert.cost_inject(n, fused=True))


def _exp_poly(p: Party, x: AShare) -> AShare:
    """Privformer's 1 + x + 0.5x^2 + 0.1665x^3 + 0.0438x^4 (accurate only near 0)."""
    f = p.cfg.frac
    x2 = arith.mul_aa(p, x, x)
    both = arith.mul_aa(p, AShare.concat([x2, x2], 0), AShare.concat([x, x2], 0))
    x3, x4 = both[:x.shape[0]], both[x.shape[0]:]
    acc = None
    for c, term in zip((1.0, 0.5, 0.1665, 0.0438), (x, x2, x3, x4)):
        t = term.scale(ring.encode(np.array(c), f))
        acc = t if acc is None else acc + t
    return _const(p, truncation.trunc_a(p, acc), 1.0)


@profiled
def exp_a(p: Party, x: AShare, method: str = "limit", site: str | None = None) -> AShare:
    """exp(x): "limit" (accurate on EXP_RANGE, see the module docstring) or "poly"
    (Privformer's polynomial baseline). Cost: :func:`cost_exp`."""
    if p.shadow is not None:
        return p.shadow.exp_a(x, site)
    if method == "limit":
        return run_steps(p, exp_steps(p, x))[0]
    if method == "poly":
        return _exp_poly(p, x)
    raise ValueError(f"exp_a: unknown method {method!r} (poly, limit)")


def cost_exp(n: int, cfg, method: str = "limit") -> Cost:
    """Rounds and bytes per party of :func:`exp_a` on ``n`` elements."""
    frac, mode = cfg.frac, cfg.trunc
    if method == "poly":
        return (arith.cost_mul(n, cfg) + arith.cost_mul(2 * n, cfg)
                + truncation.cost_trunc(n, cfg, frac))
    F, K = _exp_scales(frac, mode)
    cost = arith.cost_mul(n, cfg, F) + arith.cost_mul(n, cfg, F + K)
    if F < frac + EXP_SQUARINGS:
        cost = truncation.cost_trunc(n, cfg, frac + EXP_SQUARINGS - F) + cost
    for k in range(EXP_SQUARINGS):
        cost = cost + arith.cost_mul(n, cfg, F if k < EXP_SQUARINGS - 1 else 2 * F - frac)
    return cost
