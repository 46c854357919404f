"""The claims of verified kernels' messages beyond the plain replicated product
(:func:`mul_claims`) and matrix product (:mod:`mpc3.freivalds`): what
:class:`mpc3.checks.Checks` registers for the AND layers of the boolean circuits (mod-2
gates, :mod:`mpc3.dzkp_bits`) and for bit injection.

A claim is a batch of gates ``sum_a u[a] v[a] = z`` whose factors are known, one side
each, to the prover's two neighbours - V_L (prev) knows every u, V_R (next) every v - and
whose z is the sum of a share each of them computes; the prover knows everything. A party
builds the three views of each claim of a kernel (as prover, as V_L of next, as V_R of
prev) from what it holds; :func:`mpc3.dzkp.verify_claims` proves them.
"""
from __future__ import annotations


import numpy as np

from .dzkp import Claim
from .dzkp_bits import BitClaim
from .freivalds import mat_views
from .kernels.checked import dot_shaped
from .kernels.base import group_bounds
from .kernels.boolean import word_slices
from .kernels.convert import _bits_u64, _run_starts, _run_sums
from .shares import bits_to_planes, group_sizes, grouped_words

_TWO = np.uint64(2)
_MINUS2 = np.uint64((1 << 64) - 2)
_ONE = np.uint64(1)


# ------------------------------------------------------------ replicated products ------
def masks(p, kop: int, tag: str, shape) -> tuple[np.ndarray, np.ndarray]:
    """(f_next, f_prev), flat: this party's zero-sharing draws ``(kop, tag)`` of ``shape``
    (its mask is ``f_next - f_prev``, :meth:`mpc3.party.Party.add_zero_share`)."""
    return tuple(np.ravel(p.prg.ring(s, kop, tag, shape)) for s in ("next", "prev"))


def mul_claims(p, x, y, sent: np.ndarray, received: np.ndarray, tag: str,
               kop: int) -> tuple[Claim, Claim, Claim]:
    """The three claims of one replicated product z = x y (:func:`mpc3.kernels.arith.reshare`
    of ``x.a (y.a + y.b) + x.b y.a`` masked with the zero sharing ``(kop, tag)``): this
    party's own (it ``sent`` its masked term to prev) and its shares of its neighbours'
    (it ``received`` next's term)."""
    return mul_views(x, y, sent, received, None, *masks(p, kop, tag, np.shape(x.a)))


def mul_views(x, y, term, left, right, f_next, f_prev) -> tuple[Claim, Claim, Claim]:
    """The claims that each party's masked 3-out-of-3 term ``x.a (y.a + y.b) + x.b y.a +
    f_next - f_prev`` of a product is what its two verifiers hold of it, one part each
    (V_L's + V_R's; a reshare: V_L, its receiver, holds it all): this party's own (``term``)
    and its shares of its neighbours' - ``left`` its part of next's term, as next's V_L,
    ``right`` its part of prev's, as prev's V_R (None: nothing). Flat arrays."""
    xa, xb, ya, yb = (np.ravel(t) for t in (x.a, x.b, y.a, y.b))
    zero = np.zeros_like(xa)
    mine = Claim(np.stack([xa, xb]), np.stack([yb, ya]), np.ravel(term) - xa * ya - f_next + f_prev)
    as_left = Claim(np.stack([xb, zero]), np.stack([zero, yb]), np.ravel(left) - xb * yb + f_next)
    as_right = Claim(np.stack([zero, xa]), np.stack([ya, zero]),
                     -f_prev if right is None else np.ravel(right) - f_prev)
    return mine, as_left, as_right


def dot_claims(p, x, y, out, tag: str, kop: int) -> tuple[Claim, Claim, Claim] | None:
    """:func:`mul_claims` of a batch of dot products, ``x`` (..., 1, K) @ ``y`` (..., K, 1)
    with equal batch shapes (the piecewise activations' per-element sums): one gate of 2K
    terms per output. Such a product is always in :func:`mpc3.kernels.arith._local_matmul`'s
    two-product form, whose term is ``sum_k x_a y_a + x_a y_b + x_b y_a``. None for other
    shapes (:func:`mpc3.freivalds.matmul_claims` takes them)."""
    if not dot_shaped(x.shape, y.shape):
        return None
    return dot_views(x, y, out.a, out.b, None, *masks(p, kop, tag, out.shape))


def dot_views(x, y, term, left, right, f_next, f_prev) -> tuple[Claim, Claim, Claim]:
    """:func:`mul_views` of the dot products of :func:`dot_claims`."""
    K = x.shape[-1]
    xa, xb, ya, yb = (np.ascontiguousarray(t.reshape(-1, K).T) for t in (x.a, x.b, y.a, y.b))
    zero = np.zeros_like(xa)
    mine = Claim(np.concatenate([xa, xb]), np.concatenate([yb, ya]),
                 np.ravel(term) - (xa * ya).sum(0) - f_next + f_prev)
    as_left = Claim(np.concatenate([xb, zero]), np.concatenate([zero, yb]),
                    np.ravel(left) - (xb * yb).sum(0) + f_next)
    as_right = Claim(np.concatenate([zero, xa]), np.concatenate([ya, zero]),
                     -f_prev if right is None else np.ravel(right) - f_prev)
    return mine, as_left, as_right


def term_views(rank: int, items, term, left, right, f_next, f_prev):
    """The claims of products whose masked terms lie side by side in the flat ``term``
    (``left``, ``right``, the masks alike; :func:`mul_views`): items ``(x, y, kind, lo,
    hi)``, "mul" (x, y flat or of the output's shape) or "matmul" (dot products,
    :func:`dot_views`, or :func:`mpc3.freivalds.mat_views`). Returns (triples - the
    elementwise products' joined into one batch -, the matrix products' views or None)."""
    muls, triples, mats = [], [], ([], [], [])
    for x, y, kind, lo, hi in items:
        cut = [None if a is None else a[lo:hi] for a in (term, left, right, f_next, f_prev)]
        if kind == "mul":
            muls.append(mul_views(x, y, *cut))
        elif dot_shaped(x.shape, y.shape):
            triples.append(dot_views(x, y, *cut))
        else:
            for j, views in enumerate(mat_views(rank, x, y, *cut)):
                mats[j].extend(views)
    if muls:
        triples.insert(0, tuple(_concat([t[j] for t in muls]) for j in range(3)))
    return triples, (mats if mats[0] else None)


# ------------------------------------------------------------------- AND layers -------
def and_bit_batch(n: int, planes: int) -> tuple[int, int]:
    """(words, terms a gate) of an AND layer's mod-2 claims (:func:`and_claims`) on
    ``planes`` planes of n bits: one gate a bit, the planes' grouped words."""
    return planes * grouped_words(n), 2


def and_claims(p, x, y, out, tag: str, kop: int) -> tuple[BitClaim, BitClaim, BitClaim]:
    """The three views of an AND layer's claims, mod 2 (:mod:`mpc3.dzkp_bits`). With a, b
    the prover's slots (V_L holds slot a and the message the prover sent it, V_R slot b),
    the message is ``z = x_a y_a ^ x_a y_b ^ x_b y_a ^ f_prev ^ f_next`` (f_prev the pad the
    prover shares with V_L, f_next with V_R), i.e. the gate

        x_a y_b ^ y_a x_b = A ^ B,  V_L's A = z ^ f_prev ^ x_a y_a,  V_R's B = f_next

    of two terms, V_L's factors (x_a, y_a) against V_R's (y_b, x_b), on the packed planes
    as they are (a group's padding bits, never sent, masked to zero on every side)."""
    n, shape = x.n, x.a.shape
    valid = bits_to_planes(np.ones((1, n), dtype=np.uint8))
    xa, xb, ya, yb, sent, got = (np.ravel(t & valid) for t in (x.a, x.b, y.a, y.b, out.a, out.b))
    f_next, f_prev = (np.ravel(p.prg.bytes(stream, kop, tag, 8 * shape[0] * shape[1])
                               .view(np.uint64).reshape(shape) & valid)
                      for stream in ("next", "prev"))

    def left(xa, ya, z, f):                  # V_L's side: slot a, the message, f_prev
        return np.stack([xa, ya]), z ^ f ^ (xa & ya)

    (u, zl), v = left(xa, ya, sent, f_prev), np.stack([yb, xb])
    lu, lz = left(xb, yb, got, f_next)       # next's slot a is this party's b; its f_prev
    return (BitClaim(u, v, zl ^ f_next), BitClaim(lu, None, lz),
            BitClaim(None, np.stack([ya, xa]), f_prev))   # prev's slot b is this party's a


# ---------------------------------------------------------------- bit injection -------
def _view(pos: int, u, v, zl, zr, us=None, vs=None) -> Claim:
    """This party's view of one gate batch: pos 0 the prover (everything), 2 its V_L (u and
    its z share), 1 its V_R (v and its z share); u, v, zl, zr: callables, so a party only
    evaluates what it holds; ``us``/``vs``: u's/v's rows' values where they are given as
    uint8 bits (:class:`mpc3.dzkp.Claim`)."""
    if pos == 0:
        return Claim(u(), v(), zl() + zr(), us, vs)
    if pos == 2:
        return Claim(u(), None, zl(), us)
    return Claim(None, v(), zr(), None, vs)


def injection_claims(p, x, bit, st: list[dict], got2, parts=None,
                     seg: int = 0) -> list[tuple[Claim, Claim, Claim]]:
    """The claims of :func:`mpc3.kernels.convert.inject_steps` (bit d given as an RSS
    BShare, or masked bits, with run sums or not): (own, as V_L, as V_R) per gate width.

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

    A masked 3-out-of-3 bit (``parts`` given: the comparison that made it, e.g.
    :func:`mpc3.claims_compare.bit_parts`) works the same way: ``parts(g, role)`` gives the
    single's bit as an XOR of a value role 2 holds and one role 1 holds (None where this
    party holds neither) in place of its two slots, and the pair's beta is the bit it
    learnt in the swap.

    With run sums (``seg``: s0, y1 and y2 carry one sum per run of ``seg`` elements) their
    gates are the sums of the elements' gates: one gate per run, its terms the run's
    elements' terms side by side (:func:`_runs`).
    """
    n = x.shape[0]
    views = Views()
    add = views.add
    for g, (s, sl, wsl) in enumerate(zip(st, group_bounds(n),
                                         word_slices(group_sizes(n)))):
        role, ng = s["role"], s["n"]
        F, S = _runs(sl, seg)
        cols = int(np.prod(x.shape[1:], dtype=np.int64))    # a group may be empty
        xa, xb = x.a[sl].reshape(ng, cols), x.b[sl].reshape(ng, cols)

        def lifted(planes):                  # a row's bit for each of its values
            return np.repeat(_bits_u64(planes[:, wsl], ng), cols)
        flat = lambda a: np.ascontiguousarray(a).reshape(-1)     # noqa: E731
        va, vb = flat(xa), flat(xb)
        if parts is None:
            ea, eb = lifted(bit.a), lifted(bit.b)
        else:                                # slot-like: role 0 (eg, eh), V_L eb, V_R ea
            eg_, eh_ = (None if e is None else np.repeat(e, cols) for e in parts(g, role))
            beta_ = np.repeat(s["beta"], cols) if role else None
            ea, eb = {0: (eg_, eh_), 1: (eh_, beta_), 2: (beta_, eg_)}[role]

        # --- the single's messages (prover role 0): V_L = role 2, V_R = role 1
        pos = (role - 0) % 3
        # slot g as V_L sees it, slot g+1 as V_R does
        eg, xg = (ea, va) if role == 0 else (eb, vb)
        eh, xh = (eb, vb) if role == 0 else (ea, va)
        cross_u = lambda k=np.uint64(1): np.stack([eg, xg, _MINUS2 * eg * xg,   # noqa: E731
                                                   _MINUS2 * eg]) * k
        cross_v = lambda: np.stack([xh, eh, eh, eh * xh])                            # noqa: E731
        add(1, pos, _view(
            pos, lambda: (_TWO * eg)[None], lambda: eh[None],
            lambda: eg - flat(s["rho2"]), lambda: eh - flat(s["m2"])))
        add(4 * max(seg, 1), pos, _view(                        # s0 (a sum per run)
            pos, lambda: F(cross_u()), lambda: F(cross_v()),
            lambda: flat(s["s0"]) - S(eg * xg), lambda: S(flat(s["kappa"]) - eh * xh)))
        add(4, pos, _view(                                      # m1
            pos, lambda: cross_u(_TWO), cross_v,
            lambda: xg - flat(s["rho1"]) - _TWO * eg * xg,
            lambda: xh - flat(s["m1"]) - _TWO * eh * xh))

        # --- the pair's messages: beta, B = slot g+2 (role 1's b, role 2's a)
        beta, B = (eb, vb) if role == 1 else (ea, va)
        sB = B - _TWO * beta * B
        y1 = flat(got2[(1, g)][0]) if role == 0 else S(flat(s.get("y", 0)))
        y2 = flat(got2[(-1, g)][0]) if role == 0 else S(flat(s.get("y", 0)))
        pos = (role - 1) % 3                 # prover role 1: V_L role 0, V_R role 2
        add(2 * max(seg, 1), pos, _view(
            pos, lambda: F(np.stack([flat(s["m1"]), flat(s["m2"])])),
            lambda: F(np.stack([beta, sB])), lambda: y1,
            lambda: S(flat(s["tau1"]) - beta * B)))
        pos = (role - 2) % 3                 # prover role 2: V_L role 1, V_R role 0
        add(2 * max(seg, 1), pos, _view(
            pos, lambda: F(np.stack([beta, sB])),
            lambda: F(np.stack([flat(s["rho1"]), flat(s["rho2"])])),
            lambda: S(flat(s["tau2"])), lambda: y2))
    return views.triples()


def _runs(sl: slice, seg: int):
    """(F, S) of a group's run sums (:func:`mpc3.kernels.convert._run_sums` over ``seg``):
    F lays each run's elements' gate terms side by side, (w, ng) -> (w seg, runs), S sums
    a value over each run; both the identity without runs."""
    if not seg:
        return (lambda u: u), (lambda z: z)
    ng = sl.stop - sl.start
    starts = _run_starts(sl.start, sl.stop, seg)
    run = np.searchsorted(starts, np.arange(ng), side="right") - 1
    at = np.arange(ng) - starts[run]

    def F(u):
        out = np.zeros((u.shape[0] * seg, starts.size), dtype=np.uint64)
        for t in range(u.shape[0]):
            out[t * seg + at, run] = u[t]
        return out
    return F, (lambda z: _run_sums(np.ascontiguousarray(z), sl, seg))


def _slot(pos: int) -> int:
    """Index in (own, as V_L of next, as V_R of prev) of a view at position ``pos``."""
    return {0: 0, 2: 1, 1: 2}[pos]


def _concat(claims: list):
    """One batch of several claims of one kind (:class:`Claim` or, packed,
    :class:`mpc3.dzkp_bits.BitClaim`); a side that is None in all of them stays None."""
    def side(xs, other):
        if all(x is None for x in xs):
            return None
        return np.concatenate([x if x is not None else np.zeros_like(o)
                               for x, o in zip(xs, other)], axis=1)
    scaled = isinstance(claims[0], Claim) and any(
        s is not None for c in claims for s in (c.us, c.vs))
    if scaled:                      # bits with their rows' values: kept if all alike
        us = [c.us for c in claims if c.u is not None]
        vs = [c.vs for c in claims if c.v is not None]
        alike = all(s is not None and np.array_equal(s, ss[0]) for ss in (us, vs) for s in ss)
        if alike:
            return Claim(side([c.u for c in claims], [c.v for c in claims]),
                         side([c.v for c in claims], [c.u for c in claims]),
                         np.concatenate([c.z for c in claims]), us[0] if us else None,
                         vs[0] if vs else None)
        claims = [Claim(*(None if x is None else x if s is None else
                          x.astype(np.uint64) * s[:, None] for x, s in ((c.u, c.us), (c.v, c.vs))),
                        c.z) for c in claims]
    us, vs = [c.u for c in claims], [c.v for c in claims]
    return type(claims[0])(side(us, vs), side(vs, us), np.concatenate([c.z for c in claims]))


#: Gate terms from which each group's views stay their own batch (:meth:`Views.triples`).
SPLIT_TERMS = 1 << 16


class Views:
    """A kernel's claims as this party holds them, by gate width: what it proves, what it
    checks as V_L of its next neighbour and as V_R of its previous one."""

    def __init__(self) -> None:
        self.by_width: dict[int, tuple[list, list, list]] = {}

    def add(self, width, pos: int, claim) -> None:
        """A view at position ``pos`` (0 the prover, 2 its V_L, 1 its V_R); ``width``: the
        gates' terms (("bits", terms) for mod-2 gates, :class:`mpc3.dzkp_bits.BitClaim`)."""
        self.by_width.setdefault(width, ([], [], []))[_slot(pos)].append(claim)

    def add_all(self, pos: int, claims: dict[int, Claim]) -> None:
        for width, claim in claims.items():
            self.add(width, pos, claim)

    def triples(self) -> list[tuple[Claim, Claim, Claim]]:
        """(own, as V_L, as V_R) triples by width (every party lists a kernel's batches in
        the same order, whichever of its groups it met first), as
        :class:`mpc3.checks.Checks` collects them: a width's views as they came, one
        batch per group, when the three roles have as many (then every party has as many,
        in the same group order: nothing is copied) and each has at least SPLIT_TERMS
        terms (a batch's last chunk is padded in the proof), else joined into one batch
        each. Every party sees the same three provers' views, so all decide alike."""
        out = []
        for w in sorted(self.by_width, key=lambda w: (isinstance(w, tuple), w[-1] if isinstance(w, tuple) else w)):
            views = self.by_width[w]
            if len(views[0]) == len(views[1]) == len(views[2]) and \
                    min(c.terms for v in views for c in v) >= SPLIT_TERMS:
                out.extend(zip(*views))
            else:
                out.append(tuple(_concat(v) for v in views))
        return out
