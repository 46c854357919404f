"""Fixed-point functions: sqrt_inv_a, reciprocal_a, exp_a.

Leak-free initialisation (Privformer Alg. 4 semantics: nothing is revealed, not even the
bit length), restructured for rounds: instead of Alg. 4's 2*ell sequential DReLU/Select
steps, all comparisons ``c_k = [x >= t_k]`` against (half-)octave thresholds ``t_k`` run in
ONE batched DReLU; the initial guess is then a public-table lookup written as the dot
product ``y0 = T_0 + sum_k c_k (T_k - T_{k-1})`` (one batched bit injection; the c_k are a
thermometer code of the interval holding x), followed by Newton iterations:

* sqrt_inv: octave table (guess within 19 %), y <- 1.5 y - 0.5 (x y) y^2 in 4 rounds per
  step (see :func:`sqrt_inv_a`); three steps leave only fixed-point error.
* reciprocal: half-octave table (guess within 19 %), y <- y (2 - x y), three steps.

Supported inputs: x in [2^-12, 2^16] (real); outside it the guess saturates and Newton may
need more steps. Round counts: sqrt_inv 20, reciprocal 20 (see ``cost_*``).

exp_a: ``method="poly"`` is Privformer's max-free baseline 1 + x + 0.5x^2 + 0.1665x^3 +
0.0438x^4 (accurate only near 0); ``method="limit"`` evaluates the degree-4 Taylor
polynomial at u = x / 2^6 and squares six times (relative error < 1e-3 for x in [-16, 8],
tends to 0 for very negative x; x must stay below ~30 to fit the ring).
"""
from __future__ import annotations

import numpy as np

from .. import ring
from ..party import Party
from ..shares import AShare
from . import arith, convert

LOG_LO, LOG_HI = -12, 16


def _init_guess(p: Party, x: AShare, power: float, per_octave: int) -> AShare:
    """x^(-power) to within 1/per_octave octave, from one batched comparison and injection."""
    f = p.cfg.frac
    step = 1.0 / per_octave
    exps = np.arange(LOG_LO * per_octave, LOG_HI * per_octave + 1) * step   # thresholds 2^e
    mids = np.concatenate([[exps[0] - step / 2], exps + step / 2])  # interval geometric middles
    table = 2.0 ** (-power * mids)                              # T_{-1}, T_0, ..., T_K
    diffs = ring.encode(np.diff(table), f)                      # weight of c_k
    flat = AShare(x.a.reshape(-1, 1), x.b.reshape(-1, 1))
    rows = flat.shape[0]
    thr = ring.encode(2.0 ** exps, f)[None, :]
    diff = arith.add_public(p, AShare(np.repeat(flat.a, len(exps), 1),
                                      np.repeat(flat.b, len(exps), 1)), -thr)
    win = (0, f + LOG_HI + 2)
    bits = convert.drelu_a(p, diff, win=win)
    weights = arith.public_share(p, np.tile(diffs, rows))
    picked = convert.mul_ab(p, bits, weights).reshape(rows, len(exps))
    y0 = AShare(picked.a.sum(axis=1), picked.b.sum(axis=1))
    return arith.add_public(p, y0, ring.encode(np.full(rows, table[0]), f)).reshape(x.shape)


def _const(p: Party, x: AShare, c: float) -> AShare:
    return arith.add_public(p, x, np.full(x.shape, ring.encode(np.array(c), p.cfg.frac)))


SQ_EXTRA = 8     # extra fractional bits kept on x*y and y^2 inside a Newton step


def sqrt_inv_a(p: Party, x: AShare, iterations: int = 3) -> AShare:
    """1/sqrt(x) for shared x > 0 (Privformer Alg. 4, leak-free), same fixed-point scale.

    Newton step y <- y + y/2 - (x y)(y^2)/2 in two multiplication layers: x*y, y^2 (both
    kept at frac + SQ_EXTRA bits, so y^2 keeps its precision for large x) and y/2 in one
    call with per-element shifts, then their product. Octave initialisation (within 19 %),
    three steps. Cost: 8 rounds of initialisation + 4 per iteration (20 by default).
    """
    f, e = p.cfg.frac, SQ_EXTRA
    shape = x.shape
    x = x.reshape(-1)
    y = _init_guess(p, x, 0.5, per_octave=1)
    one = arith.public_share(p, ring.encode(np.ones(x.size), f))
    shifts = np.repeat([f - e, f - e, f + 1], x.size)
    for _ in range(iterations):
        layer = arith.mul_aa(p, AShare.concat([x, y, y]), AShare.concat([y, y, one]),
                             trunc=shifts)
        xy, y2, half = layer[:x.size], layer[x.size:2 * x.size], layer[2 * x.size:]
        y = y + half - arith.mul_aa(p, xy, y2, trunc=f + 2 * e + 1)
    return y.reshape(shape)


def reciprocal_a(p: Party, x: AShare, iterations: int = 3) -> AShare:
    """1/x for shared x > 0, leak-free initialisation (half octaves) + Newton."""
    y = _init_guess(p, x, 1.0, per_octave=2)
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
