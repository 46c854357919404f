"""The claims of verified kernels' messages beyond the plain replicated product
(:func:`mpc3.dzkp.mul_claims`) and matrix product (:mod:`mpc3.freivalds`): what
:class:`mpc3.checks.Checks` registers for the AND layers of the boolean circuits and for bit
injection.

A claim is a batch of gates ``sum_a u[a] v[a] = z`` whose factors are known, one side
each, to the prover's two neighbours - V_L (prev) knows every u, V_R (next) every v - and
whose z is the sum of a share each of them computes; the prover knows everything. A party
builds the three views of each claim of a kernel (as prover, as V_L of next, as V_R of
prev) from what it holds; :func:`mpc3.dzkp.verify_claims` proves them.
"""
from __future__ import annotations

import numpy as np

from .dzkp import Claim
from .shares import group_sizes, planes_to_bits, words

_TOP = np.uint64(1 << 63)
_TWO = np.uint64(2)
_MINUS2 = np.uint64((1 << 64) - 2)


def _bits(planes: np.ndarray, n: int) -> np.ndarray:
    """Grouped planes -> their P n bits as 0/1 words (a group's padding is never sent)."""
    return planes_to_bits(planes, n).reshape(-1).astype(np.uint64)


# ------------------------------------------------------------------- AND layers -------
def and_claims(p, x, y, out, tag: str, kop: int) -> tuple[Claim, Claim, Claim]:
    """The three views of an AND layer's claim: :func:`mpc3.dzkp.mul_claims`'s replicated
    product, read mod 2. XOR is addition mod 2, and ``2^63 a b = 2^63 (a b mod 2)`` in
    Z_2^64, so with u and z multiplied by 2^63 (every bit lifted to a word) the Z_2^64 proof
    checks the GF(2) gate ``z = x_a y_a ^ x_a y_b ^ x_b y_a ^ alpha`` with the same soundness
    (an error 2^63 is caught by the Galois-ring proof like any other;
    tests/mpc3/test_galois.py)."""
    n, shape = x.n, x.a.shape
    xa, xb, ya, yb, sent, got = (_bits(t, n) for t in (x.a, x.b, y.a, y.b, out.a, out.b))
    f_next, f_prev = (_bits(p.prg.bytes(stream, kop, tag, 8 * shape[0] * shape[1])
                            .view(np.uint64).reshape(shape), n) for stream in ("next", "prev"))
    zero = np.zeros_like(xa)
    mine = Claim(_TOP * np.stack([xa, xb]), np.stack([yb, ya]),
                 _TOP * (sent + xa * ya + f_next + f_prev))
    as_left = Claim(_TOP * np.stack([xb, zero]), np.stack([zero, yb]),
                    _TOP * (got + xb * yb + f_next))
    as_right = Claim(_TOP * np.stack([zero, xa]), np.stack([ya, zero]), _TOP * f_prev)
    return mine, as_left, as_right


# ---------------------------------------------------------------- bit injection -------
def _view(pos: int, u, v, zl, zr) -> Claim:
    """This party's view of one gate batch: pos 0 the prover (everything), 2 its V_L (u and
    its z share), 1 its V_R (v and its z share); u, v, zl, zr: callables, so a party only
    evaluates what it holds."""
    if pos == 0:
        return Claim(u(), v(), zl() + zr())
    if pos == 2:
        uu = u()
        return Claim(uu, np.zeros_like(uu), zl())
    vv = v()
    return Claim(np.zeros_like(vv), vv, zr())


def injection_claims(p, x, bit, st: list[dict], got2) -> dict[int, tuple[list, list, list]]:
    """The claims of :func:`mpc3.kernels.convert.inject_steps` (bit d given as an RSS
    BShare, no run sums): gates by width -> (own, as V_L of next, as V_R of prev) lists.

    In group g the single (role 0) holds slots g, g+1 of x and of the bit, shared with
    role 2 (slot g) and role 1 (slot g+1). With e, x its slots' bits and values and
    ``u = e_g + e_{g+1} - 2 e_g e_{g+1}``, every term of its messages is a product of a
    value role 2 knows and one role 1 knows:

    * m2 = u - rho2:                   (2 e_g) e_{g+1} = e_g - rho2 + e_{g+1} - m2
    * s0 = u A - kappa, A = x_g + x_{g+1}: the cross terms c = e_g x_{g+1} + x_g e_{g+1}
      - 2 e_g x_g e_{g+1} - 2 e_g e_{g+1} x_{g+1} = (s0 - e_g x_g) + (kappa - e_{g+1} x_{g+1})
    * m1 = A - 2 u A - rho1:           2 c = (x_g - rho1 - 2 e_g x_g) + (x_{g+1} - m1 - 2 e_{g+1} x_{g+1})

    Role 1 (V_L: role 0, V_R: role 2) sends ``y1 = beta m1 + m2 sB + beta B - tau1`` and
    role 2 (V_L: role 1, V_R: role 0) ``y2 = beta rho1 + rho2 sB - tau2``, with beta, B the
    pair's slot g+2 and ``sB = B - 2 beta B``: two terms each.
    """
    n = x.shape[0]
    views: dict[int, tuple[list, list, list]] = {w: ([], [], []) for w in (1, 2, 4)}
    start_w = 0
    for g, (s, ng) in enumerate(zip(st, group_sizes(n))):
        wsl = slice(start_w, start_w + words(ng))
        start_w += wsl.stop - wsl.start
        role = s["role"]
        sl = slice(sum(group_sizes(n)[:g]), sum(group_sizes(n)[:g + 1]))
        xa, xb = x.a[sl].reshape(ng, -1), x.b[sl].reshape(ng, -1)
        cols = xa.shape[1]

        def lifted(planes):                  # a row's bit for each of its values
            b = np.unpackbits(np.ascontiguousarray(planes[:1, wsl]).view(np.uint8),
                              bitorder="little")[:ng].astype(np.uint64)
            return np.repeat(b, cols)
        flat = lambda a: np.ascontiguousarray(a).reshape(-1)     # noqa: E731
        ea, eb, va, vb = lifted(bit.a), lifted(bit.b), flat(xa), flat(xb)

        # --- the single's messages (prover role 0): V_L = role 2, V_R = role 1
        pos = (role - 0) % 3
        # slot g as V_L sees it, slot g+1 as V_R does
        eg, xg = (ea, va) if role == 0 else (eb, vb)
        eh, xh = (eb, vb) if role == 0 else (ea, va)
        cross_u = lambda k=np.uint64(1): np.stack([eg, xg, _MINUS2 * eg * xg,   # noqa: E731
                                                   _MINUS2 * eg]) * k
        cross_v = lambda: np.stack([xh, eh, eh, eh * xh])                            # noqa: E731
        views[1][_slot(pos)].append(_view(
            pos, lambda: (_TWO * eg)[None], lambda: eh[None],
            lambda: eg - flat(s["rho2"]), lambda: eh - flat(s["m2"])))
        both = lambda f, h: np.concatenate([f(), h()], axis=-1)                     # noqa: E731
        views[4][_slot(pos)].append(_view(
            pos, lambda: both(cross_u, lambda: cross_u(_TWO)), lambda: both(cross_v, cross_v),
            lambda: np.concatenate([flat(s["s0"]) - eg * xg,
                                    xg - flat(s["rho1"]) - _TWO * eg * xg]),
            lambda: np.concatenate([flat(s["kappa"]) - eh * xh,
                                    xh - flat(s["m1"]) - _TWO * eh * xh])))

        # --- the pair's messages: beta, B = slot g+2 (role 1's b, role 2's a)
        beta, B = (eb, vb) if role == 1 else (ea, va)
        sB = B - _TWO * beta * B
        y1 = flat(got2[(1, g)][0]) if role == 0 else flat(s.get("y", 0))
        y2 = flat(got2[(-1, g)][0]) if role == 0 else flat(s.get("y", 0))
        pos = (role - 1) % 3                 # prover role 1: V_L role 0, V_R role 2
        views[2][_slot(pos)].append(_view(
            pos, lambda: np.stack([flat(s["m1"]), flat(s["m2"])]),
            lambda: np.stack([beta, sB]), lambda: y1, lambda: flat(s["tau1"]) - beta * B))
        pos = (role - 2) % 3                 # prover role 2: V_L role 1, V_R role 0
        views[2][_slot(pos)].append(_view(
            pos, lambda: np.stack([beta, sB]),
            lambda: np.stack([flat(s["rho1"]), flat(s["rho2"])]),
            lambda: flat(s["tau2"]), lambda: y2))
    return {w: tuple(_concat(v) for v in vs) for w, vs in views.items()}


def _slot(pos: int) -> int:
    """Index in (own, as V_L of next, as V_R of prev) of a view at position ``pos``."""
    return {0: 0, 2: 1, 1: 2}[pos]


def _concat(claims: list[Claim]) -> Claim:
    return Claim(np.concatenate([c.u for c in claims], axis=1),
                 np.concatenate([c.v for c in claims], axis=1),
                 np.concatenate([c.z for c in claims]))
