"""Fixed-point functions: sqrt_inv_a, reciprocal_a, exp_a.

Leak-free initialisation (Privformer Alg. 4 semantics: nothing is revealed, not even the
bit length), restructured for rounds: instead of Alg. 4's 2*ell sequential DReLU/Select
steps, all comparisons ``c_k = [x >= t_k]`` against (half-)octave thresholds ``t_k`` run in
ONE batched DReLU; the initial guess is then a public-table lookup written as the dot
product ``y0 = T_0 + sum_k c_k (T_k - T_{k-1})`` (one batched bit injection; the c_k are a
thermometer code of the interval holding x), followed by Newton iterations:

* sqrt_inv: few inputs - 1/16-octave table of best lines, no Newton (10 rounds); many
  inputs - octave table + three Newton steps of 4 rounds (20 rounds, fewer bytes).
* reciprocal: half-octave table of best lines (1.5 %), y <- y (2 - x y) twice (18 rounds).

Supported inputs: x in [2^-12, 2^16] (real); outside it the guess saturates and Newton may
need more steps. Round counts: sqrt_inv 10 (few inputs) / 20, reciprocal 18.

exp_a: ``method="poly"`` is Privformer's max-free baseline 1 + x + 0.5x^2 + 0.1665x^3 +
0.0438x^4 (accurate only near 0); ``method="limit"`` evaluates the degree-4 Taylor
polynomial at u = x / 2^6 and squares six times (relative error < 1e-3 for x in [-16, 8],
tends to 0 for very negative x; x must stay below ~30 to fit the ring).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import ring
from ..party import Party
from ..shares import AShare, BShare, bits_to_planes, planes_to_bits
from . import arith, convert

LOG_LO, LOG_HI = -12, 16

#: The one documented input range of each function (real units, closed intervals); the
#: calibration pass of ``share-model`` and the tests use these same constants.
SQRT_INV_RANGE = (2.0 ** -10, 2.0 ** 14)
RECIPROCAL_RANGE = (2.0 ** -10, 2.0 ** 14)
EXP_RANGE = (-16.0, 8.0)


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


def _one_hot(p: Party, c: BShare, rows: int, k: int) -> BShare:
    """Local: thermometer bits c (rows x k, [x >= t_j]) -> one-hot interval bits
    (rows x (k+1)): e_0 = 1 ^ c_0, e_j = c_{j-1} ^ c_j, e_k = c_{k-1}."""
    halves = []
    for half, holds_one in ((c.a, p.rank == 0), (c.b, p.rank == 2)):   # slot 0 gets the 1
        bits = planes_to_bits(half, rows * k)[0].reshape(rows, k)
        pad = np.zeros((rows, 1), dtype=np.uint8)
        left = np.concatenate([pad + (1 if holds_one else 0), bits], 1)
        right = np.concatenate([bits, pad], 1)
        halves.append(bits_to_planes((left ^ right).reshape(1, -1)))
    return BShare(halves[0], halves[1], rows * (k + 1))


def _init_guess(p: Party, x: AShare, power: float, per_octave: int, linear: bool) -> AShare:
    """x^(-power) from one batched comparison against thresholds 2^(j/per_octave) and one
    injection: y0 = sum_j e_j * (a_j + b_j x) over the one-hot interval bits e_j.

    The products b_j * x are formed for every interval before the comparison (public
    scalings, one truncation round with a per-interval shift that keeps ~20 significant
    bits); only the selected one survives the injection, so its error is that of a single
    truncation. Without ``linear`` the table is the interval's geometric middle.
    """
    f = p.cfg.frac
    step = 1.0 / per_octave
    exps = np.arange(LOG_LO * per_octave, LOG_HI * per_octave + 1) * step   # thresholds 2^e
    k = exps.size
    flat = x.reshape(-1)
    rows = flat.size
    if linear:
        c0, c1 = _best_line(power, step)
        alpha = np.concatenate([[2.0 ** (-power * exps[0])], c0 * 2.0 ** (-power * exps[:-1]),
                                [2.0 ** (-power * exps[-1])]])
        beta = np.concatenate([[0.0], c1 * 2.0 ** (-power * exps[:-1] - exps[:-1]), [0.0]])
        # shift per interval: ~22 significant bits of b_j, product below 2^61 when active
        ymax = np.maximum(alpha, 1e-30)
        sh = np.clip(np.round(22 - f - np.log2(np.maximum(np.abs(beta), 1e-30))), 0,
                     60 - 2 * f - np.ceil(np.log2(ymax)) - 2).astype(np.int64)
        scaled = np.round(beta * 2.0 ** (f + sh))
        wide = AShare(np.repeat(flat.a[:, None], k + 1, 1), np.repeat(flat.b[:, None], k + 1, 1))
        prods = wide.scale(ring.from_signed(scaled.astype(np.int64))[None, :])
        slope = _trunc_cols(p, prods, f + sh)
    diff = arith.add_public(p, AShare(np.repeat(flat.a[:, None], k, 1),
                                      np.repeat(flat.b[:, None], k, 1)),
                            -ring.encode(2.0 ** exps, f)[None, :])
    bits = _one_hot(p, convert.drelu_a(p, diff.reshape(-1), win=(0, f + LOG_HI + 2)), rows, k)
    if not linear:
        alpha = 2.0 ** (-power * np.concatenate([[exps[0] - step / 2], exps + step / 2]))
        values = arith.public_share(p, np.tile(ring.encode(alpha, f), rows))
    else:
        values = arith.add_public(p, slope, np.tile(ring.encode(alpha, f), (rows, 1)))
    picked = convert.mul_ab(p, bits, values.reshape(-1)).reshape(rows, k + 1)
    return AShare(picked.a.sum(axis=1), picked.b.sum(axis=1)).reshape(x.shape)


def _trunc_cols(p: Party, v: AShare, shifts: np.ndarray) -> AShare:
    """Truncate column j of v by shifts[j] (zero shifts pass through), one kernel call."""
    rows, cols = v.shape
    full = np.broadcast_to(np.maximum(shifts, 1), (rows, cols))
    out = arith.trunc_a(p, v.reshape(-1), full.reshape(-1)).reshape(rows, cols)
    return out


def _const(p: Party, x: AShare, c: float) -> AShare:
    return arith.add_public(p, x, np.full(x.shape, ring.encode(np.array(c), p.cfg.frac)))


SQ_EXTRA = 8     # extra fractional bits kept on x*y and y^2 inside a Newton step


FAST_ROWS = 16   # sqrt_inv "auto": up to this many inputs use the round-lean table


def sqrt_inv_a(p: Party, x: AShare, mode: str = "auto") -> AShare:
    """1/sqrt(x) for shared x > 0 (Privformer Alg. 4, leak-free), same fixed-point scale.

    mode "fast": sixteenth-octave thresholds with the best line per interval (rel. error
    9e-5 plus fixed point), no Newton step: 10 rounds, ~40 KB per input. mode "lean": octave thresholds,
    constant guess (19 %), three Newton steps: 20 rounds, ~2.2 KB per input. "auto" picks
    "fast" for at most FAST_ROWS inputs (decoding steps) and "lean" otherwise (whole
    sequences). Newton step y <- y + y/2 - (x y)(y^2)/2 in two multiplication layers: x*y,
    y^2 (kept at frac + SQ_EXTRA bits) and y/2 in one call with per-element shifts, then
    their product.
    """
    if mode == "auto":
        mode = "fast" if x.size <= FAST_ROWS else "lean"
    if mode not in ("fast", "lean"):
        raise ValueError(f"sqrt_inv_a: unknown mode {mode!r} (auto, fast, lean)")
    f, e = p.cfg.frac, SQ_EXTRA
    shape = x.shape
    x = x.reshape(-1)
    if mode == "fast":
        return _init_guess(p, x, 0.5, per_octave=16, linear=True).reshape(shape)
    iterations = 3
    y = _init_guess(p, x, 0.5, per_octave=1, linear=False)
    one = arith.public_share(p, ring.encode(np.ones(x.size), f))
    shifts = np.repeat([f - e, f - e, f + 1], x.size)
    for _ in range(iterations):
        layer = arith.mul_aa(p, AShare.concat([x, y, y]), AShare.concat([y, y, one]),
                             trunc=shifts)
        xy, y2, half = layer[:x.size], layer[x.size:2 * x.size], layer[2 * x.size:]
        y = y + half - arith.mul_aa(p, xy, y2, trunc=f + 2 * e + 1)
    return y.reshape(shape)


def reciprocal_a(p: Party, x: AShare, iterations: int = 2) -> AShare:
    """1/x for shared x > 0: leak-free half-octave linear initialisation (1.5 %) + Newton
    y <- y (2 - x y) twice (~5e-8). Cost: 10 + 4 * iterations rounds."""
    y = _init_guess(p, x, 1.0, per_octave=2, linear=True)
    for _ in range(iterations):
        xy = arith.mul_aa(p, x, y)
        y = arith.mul_aa(p, y, _const(p, -xy, 2.0))
    return y


def exp_a(p: Party, x: AShare, method: str = "limit") -> AShare:
    """exp(x): "poly" (Privformer's polynomial) or "limit" (Taylor at x/64, six squarings)."""
    f = p.cfg.frac
    if method == "poly":
        coeffs = (1.0, 1.0, 0.5, 0.1665, 0.0438)
        u = x
    elif method == "limit":
        coeffs = (1.0, 1.0, 1 / 2, 1 / 6, 1 / 24)
        u = arith.trunc_a(p, x, 6)
    else:
        raise ValueError(f"exp_a: unknown method {method!r} (poly, limit)")
    u2 = arith.mul_aa(p, u, u)
    both = arith.mul_aa(p, AShare.concat([u2, u2], 0), AShare.concat([u, u2], 0))
    u3, u4 = both[:u.shape[0]], both[u.shape[0]:]
    acc = None
    for c, term in zip(coeffs[1:], (u, u2, u3, u4)):
        t = term.scale(ring.encode(np.array(c), f))
        acc = t if acc is None else acc + t
    y = _const(p, arith.trunc_a(p, acc), coeffs[0])
    if method == "limit":
        for _ in range(6):
            y = arith.mul_aa(p, y, y)
    return y
