"""Secret rows against public thresholds in two rounds: ``c_ij = [x_i >= t_j]`` as MaskedBits.

A table lookup (:mod:`mpc3.kernels.fxp`'s initial guesses) compares every input x_i with the
same k public thresholds. :func:`mpc3.kernels.convert.drelu_masked` on the k differences
x_i - t_j would spend 4 rounds (leaves 2, carry tree 2) and send one thermometer code per
difference. Here, in the split form of the role groups (role 0 knows ``A = x_g + x_{g+1}``,
the pair ``B = x_{g+2}``) with the threshold applied on the pair's side (``B - t_j``):

1. Round 1 - leaves. Role 0's window value ``a_i`` is the same for all thresholds of row i,
   so it sends ONE masked thermometer code per row (mask rho from the PRG it shares with
   role 1) to role 2; each pair member selects the leaves ``G_l, P_l`` of every (i, j) from
   its share of that code with ``b_ij`` (as in convert's leaves) and holds them XOR-shared
   with the other pair member (2-out-of-2). Rows are shared, so blocks may be wide: the block
   count ``nb`` is chosen by bytes (:func:`blocks_for`).
2. Round 2 - the carry in one round with role 0 as dealer. The carry into the window's top
   bit is ``XOR_l G_l P_{l+1} ... P_{nb-1}`` (its terms are exclusive), a polynomial of
   degree nb. The pair opens every masked leaf ``delta_v = leaf_v ^ alpha_v`` (alpha_v =
   alpha1_v ^ alpha2_v from the PRGs of role 0 with role 1 and with role 2; role 1 sends its
   half in round 1, role 2 in round 2) and each member evaluates its XOR share of
   ``prod_{v in S} (delta_v ^ alpha_v) = XOR_{U <= S} prod_{v in S-U} delta_v * alpha_U``
   locally: role 0 deals XOR shares of the mask products ``alpha_U`` (|U| >= 2), one share
   from the PRG with role 1, the other sent to role 2 with the thermometer in round 1.
3. The bit ``d = 1 ^ a_top ^ b_top ^ carry`` is left as masked 3-out-of-3 planes for
   :func:`mpc3.kernels.convert.mul_masked`: role 0 holds ``a_top ^ lambda`` with a fresh
   lambda = lambda1 ^ lambda2 (PRGs with role 1 and with role 2), the pair the rest, so the
   bit the pair learns in the injection, d ^ a_top ^ lambda, is uniform to each of them.

The window and its error region are convert's (``win = (L, m)``). Every message is masked by
PRG output the receiver lacks: the thermometer by rho, the dealt shares by role 1's share,
the opened leaves by alpha; role 0 receives nothing. Cost: :func:`cost_compare_public`
(2 rounds).
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from .. import ring
from ..comm import NEXT, PREV
from ..party import Party
from ..shares import AShare, grouped_words, words
from .base import Cost, Round, group_bounds, packed_bytes, run_steps
from .bitplanes import (MaskedBits, and_products, bit_plane, carry_share, run_span,
                        select_planes, select_rows, thermometer_planes)
from .boolean import pack_planes, random_planes, unpack_planes

MAX_BLOCKS = 7
#: Calls on at most this many elements (a decode step) trade bytes for rounds: a masked
#: DReLU (relu_a, drelu_masked, a product's sign in mul_split_aa) takes this module's
#: two-round comparison (:func:`dealt_carry`), convert.drelu_a the leaf block width with
#: the fewest tree levels (leaves.leaf_blocks); larger calls (whole sequences) keep the
#: tree over 3-bit blocks, the fewest bytes.
ROUND_LEAN_ELEMENTS = 1 << 14


def dealt_carry(n: int) -> bool:
    """Whether a masked DReLU on ``n`` elements takes thresholds' two-round comparison with 0
    (at most ROUND_LEAN_ELEMENTS: ~12 B per element more than the tree, 2 rounds less)."""
    return n <= ROUND_LEAN_ELEMENTS


def window(p: Party, exact: bool = False) -> tuple[int, int]:
    """(L, m): low bits dropped and window width for DReLU inputs."""
    return window_for(p.cfg, exact)


def window_for(cfg, exact: bool = False) -> tuple[int, int]:
    """:func:`window` of a RingConfig (for declared costs without a party)."""
    if exact:
        return 0, 64
    L = cfg.relu_drop_bits
    return L, cfg.frac + cfg.relu_bound_bits - L + 2


def sign_window(cfg, shift: int) -> tuple[int, int] | None:
    """The DReLU window of a product read before its truncation by ``shift`` bits (the same
    values at scale 2^shift higher), or None if it would reach past the ring."""
    L, m = window_for(cfg)
    return (L + shift, m) if L + shift + m <= 64 else None


_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


# ------------------------------------------------------------------------ layout ------
@functools.cache
def _even_blocks(nlow: int, nb: int) -> tuple[tuple[int, int], ...]:
    """``nb`` blocks (offset, width) over ``nlow`` bits, widths differing by at most one."""
    base, extra = divmod(nlow, nb)
    out, off = [], 0
    for j in range(nb):
        w = base + (1 if j < extra else 0)
        out.append((off, w))
        off += w
    return tuple(out)


@functools.cache
def carry_plan(nb: int):
    """(masked leaf indices, terms, dealt subsets) of the one-round carry over ``nb`` blocks.

    Leaves are indexed as select_planes returns them: G_0..G_{nb-1} then P_1..P_{nb-1} (P_l at
    nb + l - 1). Term l < nb - 1 is the set {G_l, P_{l+1}, ..., P_{nb-1}}; G_{nb-1} enters
    unmasked. The dealt subsets are every U (|U| >= 2) inside some term."""
    masked = tuple(range(nb - 1)) + tuple(range(nb, 2 * nb - 1))
    terms = tuple((l,) + tuple(nb + i - 1 for i in range(l + 1, nb)) for l in range(nb - 1))
    dealt = set()
    for s in terms:
        for r in range(2, len(s) + 1):
            dealt.update(itertools.combinations(s, r))
    return masked, terms, tuple(sorted(dealt, key=lambda u: (len(u), u)))


@functools.cache
def _plan_arrays(nb: int):
    """carry_plan as arrays for the compiled kernels: (rest, kind, idx) over every (term,
    subset U) pair - rest = positions (in the masked list) of the term's leaves outside U,
    kind 0/1/2 for U empty / a single mask / a dealt product, idx its row - and the dealt
    subsets' member positions (``members``), all padded with -1."""
    masked, terms, dealt = carry_plan(nb)
    pos = {v: i for i, v in enumerate(masked)}
    dpos = {u: i for i, u in enumerate(dealt)}
    rest, kind, idx = [], [], []
    for term in terms:
        for r in range(len(term) + 1):
            for u in itertools.combinations(term, r):
                rest.append([pos[v] for v in term if v not in u])
                kind.append(min(r, 2))
                idx.append(0 if r == 0 else pos[u[0]] if r == 1 else dpos[u])

    def pad(rows):
        width = max([len(x) for x in rows] + [1])
        return np.array([x + [-1] * (width - len(x)) for x in rows] or [[-1]], dtype=np.int64)
    return ((pad(rest), np.array(kind, dtype=np.int64), np.array(idx, dtype=np.int64)),
            pad([[pos[v] for v in u] for u in dealt]))


def _row_span(sl: slice, k: int) -> tuple[int, int]:
    """First row and number of rows the elements ``sl`` of the flat (rows, k) layout touch."""
    span = run_span(sl, k)
    return span.start, span.stop - span.start


def _cost(rows: int, k: int, blocks) -> Cost:
    """Rounds and bytes per party of the protocol with leaf ``blocks``: per group, role 0
    sends one thermometer code per row it touches and the dealt bits, each pair member its
    half of the opened leaves."""
    masked, _, dealt = carry_plan(len(blocks))
    therm = sum((1 << w) - 1 for _, w in blocks)
    per = [0, 0, 0]
    for g, sl in enumerate(group_bounds(rows * k)):
        ng, nrows = sl.stop - sl.start, _row_span(sl, k)[1]
        for rank in range(3):
            role = (rank - g) % 3
            per[rank] += (packed_bytes(nrows, 1) * therm + packed_bytes(ng, 1) * len(dealt)
                          if role == 0 else packed_bytes(ng, 1) * len(masked))
    return Cost(2, tuple(per))


@functools.lru_cache(maxsize=1024)
def blocks_for(nlow: int, rows: int, k: int) -> tuple[tuple[int, int], ...]:
    """The leaf blocks of a call: 2..MAX_BLOCKS even blocks, fewest bytes (rounds are 2 for
    any count; a thermometer of 2^w - 1 rows per block and row against ~2^nb dealt bits per
    element). Blocks wider than 16 bits are never taken."""
    options = [nb for nb in range(2, MAX_BLOCKS + 1) if -(-nlow // nb) <= 16]
    return _even_blocks(nlow, min(options, key=lambda nb: (
        _cost(rows, k, _even_blocks(nlow, nb)).bytes_total, nb)))


@functools.lru_cache(maxsize=256)
def claim_blocks(nlow: int, k: int) -> tuple[tuple[int, int], ...]:
    """The blocks of malicious mode: 2..MAX_BLOCKS even blocks of at most 8 bits, the fewest
    proof terms per element (mpc3.claims_compare). Each block's code (2^w - 1 rows) is
    proven per row and selected from per element, the dealt products and carry polynomial
    grow with ~2^nb, so the byte-optimal choice of a table lookup (blocks up to 16 bits)
    would make the claims huge. Terms per element: the row's claims (A's gate and the codes'
    monotonicity; their sums are mod-2 linear relations, no terms) over k thresholds, the
    dealt products, both halves' selections and both swapped bits (:func:`claim_terms`)."""
    options = [nb for nb in range(2, MAX_BLOCKS + 1) if -(-nlow // nb) <= 8]
    return _even_blocks(nlow, min(options, key=lambda nb: (claim_terms(nlow, nb, k), nb)))


def claim_terms(nlow: int, nb: int, k: int) -> float:
    """Proof terms per element of compare_steps' claims with ``nb`` even blocks."""
    blocks = _even_blocks(nlow, nb)
    width = max((1 << w) - 1 for _, w in blocks)
    row = 64 + 2 * sum(max((1 << w) - 2, 0) for _, w in blocks)   # A's gate, monotonicity
    masked, _, dealt = carry_plan(nb)
    live = int((_plan_arrays(nb)[0][1] != 0).sum())
    return row / k + 2 * len(dealt) + 2 * len(masked) * width + 2 * (live + width)


# ---------------------------------------------------------------------- protocol ------
def _top_plane(v: np.ndarray, top: np.uint64, n: int) -> np.ndarray:
    """The (words(n),) plane of bit ``top`` of n window values."""
    return bit_plane((v >> top) & np.uint64(1), n)[0]


def _select(therm: np.ndarray, nrows: int, idx: np.ndarray, b: np.ndarray, blocks,
            const_one: bool) -> np.ndarray:
    """The leaves of every element from a share of its row's thermometer code."""
    if nrows == b.size:                            # one threshold per row: rows = elements
        return select_planes(therm, b, blocks, const_one)
    return select_rows(therm, idx, b, blocks, const_one)


def _role1_half(s: dict, blocks, masked) -> None:
    """Role 1's leaves (from rho, its share of the thermometer) and its masked half."""
    s["leaves"] = _select(s["rho"], s["nrows"], s["idx"], s["b"], blocks, False)
    s["half"] = s["leaves"][masked] ^ s["alpha"]


def compare_public_masked(p: Party, x: AShare, thresholds: np.ndarray,
                          win: tuple[int, int]) -> MaskedBits:
    """``[x_i >= t_j]`` for x of shape (rows,) and public ring thresholds t (k,), as
    MaskedBits over the rows * k elements in row-major order (for convert.mul_masked).
    ``win = (L, m)``: |x_i - t_j| < 2^(L+m-2) at the ring scale; error region [-2^L, 0).
    Cost: :func:`cost_compare_public`."""
    return run_steps(p, compare_steps(p, x, thresholds, win))[0]


def compare_steps(p: Party, x: AShare, thresholds: np.ndarray, win: tuple[int, int],
                  pair_b: np.ndarray | None = None):
    """:func:`compare_public_masked` as lockstep steps (:func:`base.run_steps`). With
    ``pair_b`` the input is a split form whose pair part arrives late: role 0's ``A`` is
    ``x.a + x.b`` as usual, the pair's ``B`` of row i is ``pair_b[i]``, read only in round 2
    (another kernel of the same lockstep fills it after round 1: a product's truncation),
    and role 1 sends its leaves' half in round 2 instead of round 1 - same rounds, same
    bytes."""
    kop = p.new_op()
    keep = p.checks is not None             # malicious mode: the claims read the state
    t = ring.check_ring(np.asarray(thresholds, dtype=np.uint64).reshape(-1), "thresholds")
    xa, xb = x.a.reshape(-1), x.b.reshape(-1)
    rows, k = xa.size, t.size
    L, m = win
    n = rows * k
    blocks = claim_blocks(m - 1, k) if keep else blocks_for(m - 1, rows, k)
    plan = carry_plan(len(blocks))
    masked, dealt = list(plan[0]), plan[2]
    nmask, ndeal = len(masked), len(dealt)
    nrows_t = sum((1 << w) - 1 for _, w in blocks)
    mask = np.uint64((1 << m) - 1)
    lsh, sL, top = np.uint64(L), np.uint64(1 << L if L > 0 else 0), np.uint64(m - 1)
    late = pair_b is not None

    def pair_leaves(s):
        """A pair member's window values and top plane from its B (round 1, or 2 if late)."""
        sl, rsl, idx = s["sl"], s["rsl"], s["idx"]
        B = (pair_b if late else xb if s["role"] == 1 else xa)[rsl][idx] - \
            t[np.arange(sl.start, sl.stop) % k]
        s["b"] = ((B + sL) >> lsh) & mask
        s["btop"] = _top_plane(s["b"], top, s["n"])

    r1, st = Round(p), []
    for g, sl in enumerate(group_bounds(n)):
        ng = sl.stop - sl.start
        first, nrows = _row_span(sl, k)
        idx = np.arange(sl.start, sl.stop) // k - first
        w, rsl = words(ng), slice(first, first + nrows)
        s = {"g": g, "role": p.role(g), "n": ng}
        st.append(s)
        if s["role"] == 0:
            a = ((xa[rsl] + xb[rsl]) >> lsh) & mask
            planes = thermometer_planes(a, blocks, m - 1, words(nrows))[:-1]   # without a_top
            rho = random_planes(p, "next", nrows_t, words(nrows), f"rho{g}")
            r_next = random_planes(p, "next", nmask + ndeal + 1, w, f"al1{g}")
            r_prev = random_planes(p, "prev", nmask + 1, w, f"al2{g}")
            prods = and_products(r_next[:nmask] ^ r_prev[:nmask], _plan_arrays(len(blocks))[1])
            s["e"] = _top_plane(a[idx], top, ng) ^ r_next[-1] ^ r_prev[-1]
            therm, deal = planes ^ rho, prods ^ r_next[nmask:nmask + ndeal]
            if keep:
                s.update(rsl=rsl, idx=idx, nrows=nrows, therm=therm, rho=rho, deal=deal,
                         r_next=r_next, r_prev=r_prev)
            r1.send(PREV, pack_planes(therm, nrows), pack_planes(deal, ng))  # to role 2
            continue
        s.update(sl=sl, rsl=rsl, idx=idx, nrows=nrows)
        if not late:
            pair_leaves(s)
        if s["role"] == 1:
            rho = random_planes(p, "prev", nrows_t, words(nrows), f"rho{g}")
            r = random_planes(p, "prev", nmask + ndeal + 1, w, f"al1{g}")
            s["alpha"], s["dealt"], s["lam"], s["rho"] = r[:nmask], r[nmask:nmask + ndeal], \
                r[-1], rho
            if not late:
                _role1_half(s, blocks, masked)
                r1.send(NEXT, pack_planes(s["half"], ng))                  # to role 2
        else:
            r = random_planes(p, "next", nmask + 1, w, f"al2{g}")
            s.update(alpha=r[:nmask], lam=r[-1])
            r1.recv(NEXT, g, 2)                                            # from role 0
            if not late:
                r1.recv(PREV, g, 1)                                        # from role 1
    got = yield r1

    r2 = Round(p)
    for s in st:
        g, ng = s["g"], s["n"]
        if late and s["role"] != 0:
            pair_leaves(s)
        if s["role"] == 2:
            therm, deal = got[(NEXT, g)]
            therm = unpack_planes(therm, s["nrows"], (p, NEXT))
            if keep:
                s["therm"] = therm
            s["leaves"] = _select(therm, s["nrows"], s["idx"], s["b"], blocks, True)
            s["dealt"] = unpack_planes(deal, ng, (p, NEXT))
            s["half"] = s["leaves"][masked] ^ s["alpha"]
            if late:
                r2.recv(PREV, g, 1)                                        # from role 1
            else:
                s["delta"] = s["half"] ^ unpack_planes(got[(PREV, g)][0], ng, (p, PREV))
            r2.send(PREV, pack_planes(s["half"], ng))                      # to role 1
        elif s["role"] == 1:
            if late:
                _role1_half(s, blocks, masked)
                r2.send(NEXT, pack_planes(s["half"], ng))                  # to role 2
            r2.recv(NEXT, g, 1)
    got2 = yield r2

    out = np.zeros((1, grouped_words(n)), dtype=np.uint64)
    start = 0
    for s in st:
        ws = slice(start, start + words(s["n"]))
        start = ws.stop
        if s["role"] == 0:
            out[0, ws] = s["e"]
            continue
        if s["role"] == 1:
            s["delta"] = s["half"] ^ unpack_planes(got2[(NEXT, s["g"])][0], s["n"], (p, NEXT))
        elif late:
            s["delta"] = s["half"] ^ unpack_planes(got2[(PREV, s["g"])][0], s["n"], (p, PREV))
        z = carry_share(s["delta"], s["alpha"], s["dealt"], s["leaves"][len(blocks) - 1],
                        _plan_arrays(len(blocks))[0], first=s["role"] == 1)
        if s["role"] == 1:
            z = z ^ s["btop"] ^ _ONES
        out[0, ws] = z ^ s["lam"]
        if keep:
            s["e"] = out[:, ws]
    bits = MaskedBits(out, n)
    if keep:                                # malicious mode: the messages' claims
        p.checks.compare(p, bits, {"x": AShare(xa, xb), "t": t, "k": k, "L": L, "m": m,
                                   "blocks": blocks, "state": st, "kop": kop, "late": late,
                                   "pair_b": pair_b})
    return bits


def cost_compare_public(rows: int, k: int, L: int, m: int, malicious: bool = False) -> Cost:
    """Rounds and bytes per party of :func:`compare_public_masked` (rows x k comparisons;
    ``malicious``: with the blocks of malicious mode, :func:`claim_blocks`)."""
    return _cost(rows, k, claim_blocks(m - 1, k) if malicious else blocks_for(m - 1, rows, k))
