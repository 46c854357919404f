"""The claims of the comparison's leaves (:func:`mpc3.kernels.leaves.leaves_steps`): what
:class:`mpc3.checks.Checks` proves about its three messages in each element group.

* Role 0 (the single) sends ``T' = T ^ rho`` to role 2, T the thermometer codes of its
  window blocks and A's window top bit, rho from the key it shares with role 1. T is
  XOR-shared between its verifiers (V_L = role 2 holds T', V_R = role 1 holds rho), and the
  bits of ``A = x_g + x_{g+1}`` are too, with the witness of
  :func:`mpc3.claims_trunc.a_witness` (``a = K ^ M``, from the sum's carries XOR-shared
  as V_L's pad and V_R's witness). With the
  arithmetic value ``t = T' + rho - 2 T' rho`` of a shared bit, the code is right iff
    - A's bits are A's (the carries' mod-2 gates, :func:`mpc3.claims_trunc.carry_side`);
    - each code is monotone, ``t_(v+1) (1 - t_v) = 0``: with a = T'_(v+1), c = 1 - T'_v
      (V_L's) and b = rho_(v+1), d = rho_v (V_R's) that is ``(a - b)(d - c) = 0``, i.e.
      ``a d + c b = a c + b d`` (error -1, 0 or 1);
    - each block's bits are its code's count, and the top row is A's window top bit: mod-2
      linear relations of the XOR-shared rows and bits (:func:`_sum_selectors`), which hold
      iff the verifiers' sides are equal - compared by digest, no proof terms
      (:meth:`mpc3.checks.Checks.linear`). A monotone code of the block's count is its
      thermometer.
* Each pair member sends role 0 its XOR share of the leaves, masked: role 1
  ``sel(rho, b) ^ kappa``, role 2 ``sel(T', b) ^ kappa ^ sigma`` (kappa, sigma from the pair's
  key). Leaf G_j's share is one row of its block's code selected by the pair's ``b``, P_j's
  XOR G_j's one more row (:func:`_half_side`): ``sum_v S_v t_v + (2 E) F = E + F`` over the
  integers, E the message's bit and F the mask's, the code share on one verifier's side
  (role 0 holds rho and T') and S(b) on the other's (the other pair member).

Every gate is a mod-2 gate, proven over GF(2^64) (:mod:`mpc3.dzkp_bits`).

A leaf set whose pair part arrives late (``pair_b``: a product's split form, whose A is the
single's 3-out-of-3 term) reads A's bits from the product's fused truncation
(:func:`a_parts`): no witness or carry gates of its own, the same claims otherwise.
"""
from __future__ import annotations

import functools

import numpy as np

from .claims import SPLIT_TERMS, Views
from .claims_trunc import a_bits, a_witness, carry_side, shared_bits
from .dzkp import Claim
from .dzkp_bits import BitClaim, pack
from .kernels.base import group_bounds
from .kernels.leaves import leaf_blocks
from .kernels.thresholds import _plan_arrays, carry_plan
from .shares import group_sizes, words

_ONE = np.uint64(1)


def _planes(planes: np.ndarray, n: int) -> np.ndarray:
    """(rows, words(n)) planes of one group with the bits past n cleared (a group's padding
    is never sent, so the gates read zeros there on every side)."""
    out = np.array(planes[..., :words(n)], dtype=np.uint64)
    if n % 64:
        out[..., -1] &= np.uint64((1 << (n % 64)) - 1)
    return out


def _rows(planes: np.ndarray, n: int) -> np.ndarray:
    """(rows, words(n)) planes of one group -> (rows, n) 0/1 words."""
    return np.unpackbits(np.ascontiguousarray(planes).view(np.uint8), axis=1,
                         bitorder="little")[:, :n].astype(np.uint64)


def mod2(rows: np.ndarray, z: np.ndarray) -> dict:
    """A claims side of mod-2 gates (:mod:`mpc3.dzkp_bits`) from 0/1 words: its factors
    ``rows`` (terms, L) and its share of z (L,), packed, for :func:`_sided`."""
    return {BITS: {rows.shape[0]: (pack(rows), pack(np.reshape(z, (1, -1)))[0])}}


def _sided(pos: int, left, right, linear=None) -> dict[int, Claim]:
    """{width: Claim} of a party's view at ``pos`` (0 prover, 2 V_L, 1 V_R) of gates whose
    V_L side ``left() -> {width: (u, zl)}`` and V_R side ``right() -> {width: (v, zr)}``
    are evaluated only by the parties that hold them. A side may also give, under the key
    LINEAR, its XOR shares of mod-2 linear relations (:func:`_therm_side`): a verifier hands
    them to ``linear(pos, shares)`` (:meth:`mpc3.checks.Checks.linear`); the prover drops
    them."""
    lv = left() if pos in (0, 2) else None
    rv = right() if pos in (0, 1) else None
    for side, at in ((lv, 2), (rv, 1)):
        shares = side.pop(LINEAR, None) if side is not None else None
        if shares is not None and pos == at:
            linear(pos, shares)
    out = {}
    bl, br = (side.pop(BITS, {}) if side is not None else None for side in (lv, rv))
    for w in (bl if bl is not None else br):       # mod-2 gates: {terms: (rows, z share)}
        u, v = (None if b is None else b[w][0] for b in (bl, br))
        z = bl[w][1] if br is None else br[w][1] if bl is None else bl[w][1] ^ br[w][1]
        out["bits", w] = BitClaim(u, v, z)
    for w in (lv if lv is not None else rv):
        if pos == 0:
            out[w] = Claim(lv[w][0], rv[w][0], lv[w][1] + rv[w][1])
        elif pos == 2:
            out[w] = Claim(lv[w][0], None, lv[w][1])
        else:
            out[w] = Claim(None, rv[w][0], rv[w][1])
    return out


def _bases(blocks) -> list[int]:
    """First thermometer row of each block."""
    return list(np.cumsum([0] + [(1 << k) - 1 for _, k in blocks])[:-1])


# ------------------------------------------------------------- the thermometer --------
#: the keys under which a claims side gives its shares of mod-2 linear relations and its
#: side of mod-2 gates, {terms: (packed rows, packed z share)} (:func:`_sided`)
LINEAR, BITS = "linear", "bits"


@functools.cache
def _sum_selectors(k: int) -> np.ndarray:
    """(k, 2^k - 1) 0/1: block bit i of a thermometer's count is the XOR of its rows
    t_u (u = 1 .. 2^k - 1) where bit i of u and of u - 1 differ (the count's one-hot
    e_v = t_v ^ t_(v+1), with t_0 = 1 and t_(2^k) = 0, XORed over the v whose bit i is
    set)."""
    u = np.arange(1, 1 << k)
    return np.stack([((u >> i) ^ ((u - 1) >> i)) & 1 for i in range(k)]).astype(bool)


def _therm_side(P: np.ndarray, n: int, K: np.ndarray, half, blocks, L: int, top,
                left: bool) -> dict:
    """One verifier's side of the single's thermometer claim on n rows: V_L (``left``) holds
    T' (``P``: its packed planes, :func:`_planes`), its share K of A's bits and ``half`` =
    (x_g, P) (:func:`mpc3.claims_trunc.a_bits`); V_R rho, its share M and (x_{g+1}, Q)
    (here also T, K, half; half None: no carry gates, A's bits being a fused truncation's,
    :func:`a_parts`). ``top``: the window's top bit, whose row ends T (leaves), or None
    (thresholds: no such row). The carry gates that pin A's bits to A
    (:func:`mpc3.claims_trunc.carry_side`) and every monotonicity constraint, mod-2 gates
    of two terms; and under LINEAR this side's XOR shares of
    the mod-2 linear relations, packed - each block's bits are its code's count
    (:func:`_sum_selectors`), the top row is A's window top bit - which hold iff both
    verifiers' shares are equal (module docstring)."""
    def kbit(j: int) -> np.ndarray:                  # bit j of each K, packed
        return pack(((K >> np.uint64(j)) & _ONE)[None])[0]
    rows, zs, linear = [], [], []
    for (off, k), base in zip(blocks, _bases(blocks)):
        t = P[base:base + (1 << k) - 1]
        sel = _sum_selectors(k)
        for i in range(k):                 # a_i = XOR of t_u over sel[i]
            linear.append(np.bitwise_xor.reduce(t[sel[i]], axis=0) ^ kbit(L + off + i))
        hi, lo = t[1:], t[:-1]             # t_(v+2) (1 - t_(v+1)) = 0: a d ^ c b = a c ^ b d
        if left:                           # a = T'_hi, c = 1 ^ T'_lo
            c = _planes(~lo, n)
            rows.append(np.stack([hi, c]))
            zs.append(hi & c)
        else:                              # b = rho_hi, d = rho_lo
            rows.append(np.stack([lo, hi]))
            zs.append(hi & lo)
    if top is not None:                    # the window's top bit: t_top = a_top
        linear.append(P[-1] ^ kbit(L + top))
    out = {LINEAR: np.stack(linear).view(np.uint8)}
    if any(r.shape[1] for r in rows):
        out[BITS] = {2: (np.concatenate([r.reshape(2, -1) for r in rows], axis=1),
                         np.concatenate([z.reshape(-1) for z in zs]))}
    if half is None:                       # A's bits pinned elsewhere (a late leaf set)
        return out
    return _join_bits(out, carry_side(*half))   # A's bits are A's: its carries' gates


def _join_bits(out: dict, gates: tuple[np.ndarray, np.ndarray]) -> dict:
    """``out`` (a claims side, :func:`_sided`) with more two-term mod-2 gates, ``gates`` =
    (rows (2, W), z share (W,)), after those it holds: one batch."""
    bits = out.setdefault(BITS, {})
    bits[2] = gates if 2 not in bits else (np.concatenate([bits[2][0], gates[0]], axis=1),
                                           np.concatenate([bits[2][1], gates[1]]))
    return out


# ---------------------------------------------------------------- the selection -------
def _selection(b: np.ndarray, blocks, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, S0): leaf l's share is ``XOR_v S[v-1, l] t_v ^ S0[l] t_0``
    (:func:`mpc3.kernels.bitplanes.select_planes`: G_j = t[2^k - b_j], P_j = t[2^k - 1 - b_j]
    ^ G_j), S of shape (width, leaves, n) - G_0..G_(nb-1) then P_1..P_(nb-1) - and S0
    (leaves, n), as 0/1 words."""
    S, S0 = _selection_bits(b, blocks, width)
    return S.astype(np.uint64), S0.astype(np.uint64)


def _selection_bits(b: np.ndarray, blocks, width: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_selection` as booleans (an eighth of the memory, packed without a copy)."""
    n = b.size
    v = np.arange(1, width + 1, dtype=np.uint64)[:, None]
    gs, ps, g0, p0 = [], [], [], []
    for j, (off, k) in enumerate(blocks):
        size = np.uint64(1 << k)
        beta = (b >> np.uint64(off)) & (size - _ONE)
        g = (v == (size - beta)[None]) & (v < size)
        gs.append(g)
        g0.append(np.zeros(n, dtype=bool))
        if j:
            ps.append(g ^ ((v == (size - _ONE - beta)[None]) & (v < size)))
            p0.append(beta == size - _ONE)
    return np.stack(gs + ps, axis=1), np.stack(g0 + p0)


def _leaf_rows(T: np.ndarray, blocks, width: int) -> np.ndarray:
    """(width, leaves, n): each leaf's block code rows (zero-padded)."""
    n = T.shape[1]
    per = []
    for (_, k), base in zip(blocks, _bases(blocks)):
        rows = np.zeros((width, n), dtype=np.uint64)
        rows[:(1 << k) - 1] = T[base:base + (1 << k) - 1]
        per.append(rows)
    return np.stack(per + per[1:], axis=1)


def _flat(a: np.ndarray, leaves=None) -> np.ndarray:
    """(width, leaves, n) -> (width, leaves * n) over the chosen leaves (all if None)."""
    a = a if leaves is None else a[:, leaves]
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2])


def _p_from_g(a: np.ndarray, nb: int) -> np.ndarray:
    """Leaves [G_0..G_(nb-1), P_1..P_(nb-1)] along axis -2 with each P_j XOR G_j (on
    :func:`_selection`'s S: P_j's row ``2^k - 1 - b_j`` alone, every selector one-hot)."""
    a = a.copy()
    a[..., nb:, :] ^= a[..., 1:nb, :]
    return a


def _half_side(rows: np.ndarray, bits: np.ndarray, nb: int,
               const: np.ndarray | None = None) -> dict:
    """One verifier's side of a pair member's leaves, mod-2 gates on packed planes
    (:mod:`mpc3.dzkp_bits`). With E the message's bits and F the mask's (one on each side),
    leaf G_j's share is a one-hot selection of its block's code rows,
    ``XOR_v S_v t_v = E ^ F``, and P_j's, XOR G_j's, is the selection of one more row:
    ``XOR_v S'_v t_v (^ const) = E' ^ F'`` with E' = E_Pj ^ E_Gj and F' likewise. ``rows``
    (width, leaves, W): this side's code rows or one-hot selectors; ``bits`` (leaves, W):
    its E or F; ``const`` (leaves, W): the constant-one row's selector, on the side that
    holds the selectors (role 2's half); a gate per leaf and element."""
    z = _p_from_g(bits, nb)
    z = z if const is None else z ^ const
    return {BITS: {rows.shape[0]: (_flat(rows), z.reshape(-1))}}


def _packed_selection(b: np.ndarray, blocks, width: int, nb: int):
    """:func:`_selection`'s (S with each P_j XOR G_j, S0), packed along the elements:
    ((width, leaves, W), (leaves, W))."""
    S, S0 = _selection_bits(b, blocks, width)
    S = _p_from_g(S, nb)
    return (pack(S.reshape(-1, b.size)).reshape(S.shape[0], S.shape[1], -1),
            pack(S0))


# --------------------------------------------------------------------- the kernel -----
def a_parts(p, rec: dict, sl: slice, g: int, role: int, witness):
    """(K, M, left, right) of the single's A in group g (:func:`mpc3.claims_trunc.a_bits`);
    in the late form (``pair_b``: A is the single's term of a product whose truncation is
    fused, ``rec["trunc"]``) A's bits are that truncation's (``shared_bits``), pinned to A
    by its claims, and left, right None: no carry gates, no witness of its own."""
    if rec["late"]:
        return (*shared_bits(p, rec["trunc"], g, role), None, None)
    return a_bits(p, rec["x"], sl, g, role, rec["kop"], witness)


def leaves_witness(p, rec: dict) -> np.ndarray:
    x = rec["x"]
    return a_witness(p, x, group_bounds(x.size), [s["role"] for s in rec["state"]],
                     rec["kop"])


def leaves_claims(p, rec: dict, witness: np.ndarray) -> list[tuple[Claim, Claim, Claim]]:
    """(own, as V_L of next, as V_R of prev) per gate width of the leaves' messages
    (module docstring)."""
    x, blocks, L, m = rec["x"], rec["blocks"], rec["L"], rec["m"]
    width, nb = max((1 << k) - 1 for _, k in blocks), len(blocks)
    p.checks.linear_used = True               # every party, whatever its groups hold
    views = Views()
    add = views.add_all

    for g, (sl, s) in enumerate(zip(group_bounds(x.size), rec["state"])):
        role, ng = s["role"], s["n"]
        K, M, lft, rgt = a_parts(p, rec, sl, g, role, witness)
        therm = (lambda: _planes(s["therm"], ng))
        rho = (lambda: _planes(s["rho"], ng))
        rows = (lambda key: _planes(s[key], ng))
        # role 0's thermometer: V_L = role 2 (T', K, x_g), V_R = role 1 (rho, M, x_{g+1})
        add(role % 3, _sided(role % 3,
                             lambda: _therm_side(therm(), ng, K, lft, blocks, L, m - 1, True),
                             lambda: _therm_side(rho(), ng, M, rgt, blocks, L, m - 1, False),
                             p.checks.linear))
        # role 1's half: V_L = role 0 (rho, u1), V_R = role 2 (b, kappa)
        mine1 = "u1" if role == 0 else "u"
        sel = functools.cache(lambda: _packed_selection(s["b"], blocks, width, nb))
        add((role - 1) % 3, _sided(
            (role - 1) % 3,
            lambda: _half_side(_leaf_rows(rho(), blocks, width), rows(mine1), nb),
            lambda: _half_side(sel()[0], rows("kappa"), nb)))
        # role 2's half: V_L = role 1 (b, kappa, sigma), V_R = role 0 (T', u2)
        mine2 = "u2" if role == 0 else "u"
        add((role - 2) % 3, _sided(
            (role - 2) % 3,
            lambda: _half_side(sel()[0], rows("kappa") ^ rows("sigma"), nb, sel()[1]),
            lambda: _half_side(_leaf_rows(therm(), blocks, width), rows(mine2), nb)))
    return views.triples()


def leaves_bit_batches(n: int, m: int) -> list[tuple[int, int]]:
    """(words, terms) of each batch of the leaves' mod-2 gates on ``n`` elements (window
    width ``m``), as :meth:`mpc3.claims.Views.triples` forms them and the proof pads them
    (to the largest of the three provers' views), each row's or leaf's gates on its own
    words of the packed planes: the monotonicity pairs and A's carry gates (a word an
    element), each group's single proving its own; then
    the halves, each party a pair member in the two groups it does not lead, one batch per
    group if every view is at least SPLIT_TERMS terms. The leaves have no ring claims: the
    sums and the top row are linear relations."""
    blocks = leaf_blocks(m - 1, n)
    nb, sizes = len(blocks), group_sizes(n)
    npairs = sum(max((1 << k) - 2, 0) for _, k in blocks)
    width = max((1 << k) - 1 for _, k in blocks)
    two = max(npairs * words(ng) + ng for ng in sizes)
    out = [(two, 2)] if two else []
    views = [[(2 * nb - 1) * words(sizes[g]) for g in range(3) if g != r] for r in range(3)]
    if min(64 * width * w for v in views for w in v) >= SPLIT_TERMS:
        return out + [(max(v[i] for v in views), width) for i in range(2)]
    return out + [(max(sum(v) for v in views), width)]


# ------------------------------------------------------------- thresholds' carry ------
#: The comparison with public thresholds (:func:`mpc3.kernels.thresholds.compare_steps`):
#: role 0 sends the thermometer codes of its rows (no top row) and the dealt mask products
#: ``D_U = prod_(v in U) alpha_v ^ dm_U`` (alpha = alpha1 ^ alpha2: alpha1 and dm from its
#: key with role 1, alpha2 with role 2); each pair member its half of the masked leaves
#: ``sel(code share, b) ^ alpha_i``. Every dealt product is one mod-2 gate of two terms:
#: ``prod_U = prod_(U - last) alpha_last`` with both factors XOR-shared between role 2 (D,
#: alpha2) and role 1 (dm, alpha1). The pair's 3-out-of-3 output bits, which the injection
#: swaps, are polynomials in the opened delta (both pair members) times alpha/dealt shares
#: (role 0 and the member) plus a selection: one gate each (:func:`swap_claims`).
def compare_witness(p, rec: dict) -> np.ndarray:
    return a_witness(p, rec["x"], [s["rsl"] for s in rec["state"]],
                     [s["role"] for s in rec["state"]], rec["kop"])


def _halves(s: dict, role: int, nmask: int, rows) -> dict:
    """What a party holds of a group's masks (None where it holds nothing)."""
    if role == 0:
        rn, rp = s["r_next"], s["r_prev"]
        return {"a1": rows(rn[:nmask]), "dm": rows(rn[nmask:-1]), "lam1": rows(rn[-1:])[0],
                "a2": rows(rp[:nmask]), "D": rows(s["deal"]), "lam2": rows(rp[-1:])[0]}
    mine = {"a1" if role == 1 else "a2": rows(s["alpha"]),
            "dm" if role == 1 else "D": rows(s["dealt"]),
            "lam1" if role == 1 else "lam2": rows(s["lam"][None])[0]}
    return mine


def compare_claims(p, rec: dict, witness: np.ndarray) -> list[tuple[Claim, Claim, Claim]]:
    """(own, as V_L of next, as V_R of prev) per gate width of compare_steps' three
    messages per group; keeps each group's (K, M) for the injection (:func:`bit_parts`)."""
    blocks, L = rec["blocks"], rec["L"]
    nb = len(blocks)
    masked, _, dealt = carry_plan(nb)
    leaves = [i for i in range(2 * nb - 1) if i != nb - 1]       # masked, as select orders
    pos_of = {v: i for i, v in enumerate(masked)}
    dpos = {u: i for i, u in enumerate(dealt)}
    width = max((1 << k) - 1 for _, k in blocks)
    views = Views()
    add = views.add_all
    rec["KM"] = {}
    p.checks.linear_used = True               # every party, whatever its groups hold

    for g, s in enumerate(rec["state"]):
        role, ng, idx = s["role"], s["n"], s["idx"]
        K, M, lft, rgt = a_parts(p, rec, s["rsl"], g, role, witness)
        rec["KM"][g] = (K, M)
        rows = (lambda planes: _rows(planes, ng))
        code = (lambda key: _rows(s[key], s["nrows"])[:, idx])      # rows -> elements
        h = _halves(s, role, len(masked), rows)

        def dealt_side(left):
            """The dealt products' gates, (X_L ^ X_R)(Y_L ^ Y_R) = D ^ dm: X (the smaller
            product or alpha) times Y = alpha_last, X_L Y_R ^ Y_L X_R = D ^ X_L Y_L ^ dm ^
            X_R Y_R (V_L = role 2: D, alpha2; V_R = role 1: dm, alpha1)."""
            xs, ys, zs = [], [], []
            for i, u in enumerate(dealt):
                a = h["a2" if left else "a1"]
                X = a[pos_of[u[0]]] if len(u) == 2 else h["D" if left else "dm"][dpos[u[:-1]]]
                Y = a[pos_of[u[-1]]]
                xs.append(X)
                ys.append(Y)
                zs.append(h["D" if left else "dm"][i] ^ (X & Y))
            xs, ys = np.concatenate(xs), np.concatenate(ys)
            return np.stack([xs, ys] if left else [ys, xs]), np.concatenate(zs)

        def side0(left):
            out = _therm_side(_planes(s["therm" if left else "rho"], s["nrows"]),  # per row
                              s["nrows"], K if left else M,
                              lft if left else rgt, blocks, L, None, left)
            return _join_bits(out, mod2(*dealt_side(left))[BITS][2])   # after monotonicity
        add(role % 3, _sided(role % 3, lambda: side0(True), lambda: side0(False),
                             p.checks.linear))

        # role 1's half (round 1, to role 2): V_L = role 0 (rho, alpha1), V_R = role 2
        half1 = (lambda: rows(s["half"] if role == 1 else s["delta"] ^ s["half"]))
        half2 = (lambda: rows(s["half"] if role == 2 else s["delta"] ^ s["half"]))
        sel = functools.cache(lambda: _selection(s["b"], blocks, width))   # both halves
        # (mod-2 gates: XOR_v sel_v code_v = the half's masked leaf ^ its alpha share)
        add((role - 1) % 3, _sided(
            (role - 1) % 3,
            lambda: mod2(_flat(_leaf_rows(code("rho"), blocks, width), leaves), h["a1"]),
            lambda: mod2(_flat(sel()[0], leaves), half1())))
        # role 2's half (round 2, to role 1): V_L = role 1 (b), V_R = role 0 (T', alpha2)
        add((role - 2) % 3, _sided(
            (role - 2) % 3,
            lambda: mod2(_flat(sel()[0], leaves), half2() ^ sel()[1][leaves]),
            lambda: mod2(_flat(_leaf_rows(code("therm"), blocks, width), leaves), h["a2"])))
    return views.triples()


def bit_parts(p, rec: dict, g: int, role: int):
    """Role 0's output bit of group g, ``e0 = a_top ^ lam1 ^ lam2``, as (V_L's part, V_R's
    part) - ``K_top ^ lam2`` (role 2) and ``M_top ^ lam1`` (role 1) - each None where this
    party holds neither; (ng,) 0/1 words (after :func:`compare_claims`)."""
    s, (K, M) = rec["state"][g], rec["KM"][g]
    lam = (lambda plane: _rows(plane[None], s["n"])[0])
    lam1 = lam(s["r_next"][-1] if role == 0 else s["lam"]) if role in (0, 1) else None
    lam2 = lam(s["r_prev"][-1] if role == 0 else s["lam"]) if role in (0, 2) else None
    top = np.uint64(rec["L"] + rec["m"] - 1)
    eg = ((K[s["idx"]] >> top) & _ONE) ^ lam2 if role in (0, 2) else None
    eh = ((M[s["idx"]] >> top) & _ONE) ^ lam1 if role in (0, 1) else None
    return eg, eh


def swap_claims(p, rec: dict, g: int, role: int, e_in: np.ndarray | None) -> list:
    """(pos, {width: Claim}) of the pair's output bits of group g, which the injection's
    first round swaps: role 1's ``e1`` (to role 2) and role 2's ``e2`` (to role 1) are
    ``XOR_c mono_c(delta) coef_c ^ leaf_(G, nb-1) (^ kind-0 monomials ^ b_top ^ 1 for
    role 1) ^ lam``; ``e_in``: the bit this party received in the swap (pair members)."""
    s, blocks = rec["state"][g], rec["blocks"]
    nb, ng = len(blocks), s["n"]
    (rest, kind, idx), _ = _plan_arrays(nb)
    masked = carry_plan(nb)[0]
    width = max((1 << k) - 1 for _, k in blocks)
    rows = (lambda planes: _rows(planes, ng))
    h = _halves(s, role, len(masked), rows)
    live = np.flatnonzero(kind != 0)

    @functools.cache                # both of a pair member's sides read them
    def monos():                    # ANDed as packed planes, 64 bits a word, then unpacked
        delta = np.ascontiguousarray(s["delta"])
        out = np.full((kind.size, delta.shape[1]), -1, dtype=np.int64).view(delta.dtype)
        for c in range(kind.size):
            for r in rest[c][rest[c] >= 0]:
                out[c] &= delta[r]
        return rows(out)

    def coefs(one):                 # alpha_i / dealt rows of each live entry
        a, d = (h["a1"], h["dm"]) if one else (h["a2"], h["D"])
        return np.stack([a[idx[c]] if kind[c] == 1 else d[idx[c]] for c in live])

    def code(key):
        return _flat(_leaf_rows(_rows(s[key], s["nrows"])[:, s["idx"]], blocks, width),
                     [nb - 1])

    @functools.cache
    def sel():
        return _flat(_selection(s["b"], blocks, width)[0], [nb - 1])

    def own_e():
        return rows(s["e"])[0]

    def e1_right():
        mono = monos()
        btop = rows(s["btop"][None])[0]
        e1 = own_e() if role == 1 else e_in
        return mod2(np.concatenate([mono[live], sel()]),
                    e1 ^ btop ^ _ONE ^ np.bitwise_xor.reduce(mono[kind == 0], axis=0))

    def e2_left():
        e2 = own_e() if role == 2 else e_in
        return mod2(np.concatenate([monos()[live], sel()]), e2)
    p1, p2 = (role - 1) % 3, (role - 2) % 3
    return [(p1, _sided(p1, lambda: mod2(np.concatenate([coefs(True), code("rho")]),
                                         h["lam1"]), e1_right)),
            (p2, _sided(p2, e2_left, lambda: mod2(np.concatenate([coefs(False), code("therm")]),
                                                  h["lam2"])))]
