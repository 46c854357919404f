"""The claims of a truncation's messages (:func:`mpc3.kernels.truncation.trunc_steps`) in
its two verified forms: of a replicated sharing (``trunc_a``, and a product's truncation
after its plain reshare) and fused into a product's resharing (the 3-out-of-3 sum's split
form, as semi-honest mode runs it).

Both rest on the single's witness: A's 64 bits as ``a_j = K_j ^ M_j``, K a pad V_L draws
with the single, M sent to V_R at the flush (:func:`trunc_claims`). In the replicated form
A's value is ``x_g + x_{g+1}``, one slot each verifier holds. In the fused form A is the
single's own product term, which nobody else holds: the single also sends V_R
``M' = A - K'`` (K' a second pad with V_L), so that A's value is again split between the
verifiers, ``K' + M'``, and the product claims of :func:`mpc3.claims.term_views` pin it,
with the pair's exchanged terms, to the product (:func:`fused_claims`).
"""
from __future__ import annotations

import numpy as np

from .claims import Views, _view, masks, term_views
from .comm import NEXT, PREV
from .dzkp import Claim
from .dzkp_bits import BitClaim
from .kernels.base import unpack_by_width

_ONE = np.uint64(1)
_TWO = np.uint64(2)
_63 = np.uint64(63)


def carries(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The carries of ``x + y`` (uint64 words): bit j is the carry out of bit j, c_(j+1),
    bit 63 the sum's overflow."""
    s = x + y
    return ((x ^ y ^ s) >> _ONE) | ((s < x).astype(np.uint64) << _63)


def carry_side(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One verifier's side of the carry gates of ``A = x_g + x_(g+1)`` (:func:`a_bits`):
    with its half x of A and its XOR share c of the carries (bit j: c_(j+1)), the rows
    ``(x ^ ci, ci)`` and its share ``c ^ ci ^ ((x ^ ci) & ci)`` of z, ci = c << 1 its share
    of the carries into each bit. With V_L's (x_g, P) and V_R's (x_(g+1), Q) the gate of
    bit j, ``(x_g ^ P') (x_(g+1) ^ Q') ^ P' Q' = z_L ^ z_R``, is the cross terms of
    ``c_(j+1) ^ c_j = (x_j ^ c_j)(y_j ^ c_j)`` - the full adder's carry, c = P ^ Q - so
    the gates hold for every bit iff P ^ Q are the carries of x_g + x_(g+1): 64 gates of
    two terms an element, one word each side."""
    ci = c << _ONE
    a = x ^ ci
    return np.stack([a, ci]), c ^ ci ^ (a & ci)


def carry_claim(pos: int, left, right) -> BitClaim:
    """This party's view at ``pos`` (0 the prover, 2 V_L, 1 V_R) of the carry gates of
    :func:`carry_side`, from the sides ``left`` = (x_g, P) and ``right`` = (x_(g+1), Q)."""
    lv = carry_side(*left) if pos in (0, 2) else None
    rv = carry_side(*right) if pos in (0, 1) else None
    z = lv[1] if rv is None else rv[1] if lv is None else lv[1] ^ rv[1]
    return BitClaim(None if lv is None else lv[0], None if rv is None else rv[0], z)


def _uk_rows(half, bits: np.ndarray, f: np.ndarray) -> np.ndarray:
    """(3, n) one side's shares of the bits that make ``A >>a f`` from A's halves
    (:func:`trunc_claims`): the carry into bit f, the overflow and A's top bit."""
    c = half[1]
    return np.stack([((c << _ONE) >> f) & _ONE, c >> _63, bits >> _63])


def _uk_coefficients(f: np.ndarray) -> np.ndarray:
    """(3, n) the ring weights of :func:`_uk_rows`' bits: 1, -2^(64-f), -2^(64-f)."""
    big = np.where(f == 0, np.uint64(0),
                   np.uint64(0) - np.left_shift(_ONE, np.uint64(64) - np.maximum(f, _ONE)))
    return np.stack([np.ones_like(f), big, big])


def trunc_witness(p, rec: dict) -> np.ndarray:
    """The single's witness of a truncation (:func:`trunc_claims`): for the group where
    this party is role 0, the carries of its ``A = x_g + x_{g+1}`` XOR a pad from the key
    it shares with V_L (role 2), one word per element, for V_R (role 1)."""
    return a_witness(p, rec["x"], rec["groups"], [st["role"] for st in rec["state"]],
                     rec["kop"])


def a_witness(p, x, groups, roles, kop: int) -> np.ndarray:
    """The carries of the single's ``A = x_g + x_{g+1}`` (:func:`carries`) in the group
    where this party is role 0, XOR the pad ``(kop, "wit<g>")`` it shares with V_L, for V_R
    (sent at the flush)."""
    out = []
    for g, (sl, role) in enumerate(zip(groups, roles)):
        if role == 0:
            pad = p.prg.ring("prev", kop, f"wit{g}", (sl.stop - sl.start,))
            out.append(carries(x.a[sl], x.b[sl]) ^ pad)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def a_bits(p, x, sl: slice, g: int, role: int, kop: int, witness: np.ndarray,
           halves=None):
    """This party's part of the single's witness in group g: ``(K, M, left, right)``, A's
    bits XOR-shared as ``K ^ M`` and the sides of their carry gates (:func:`carry_side`),
    ``left = (x_g, P)`` for the prover and V_L, ``right = (x_{g+1}, Q)`` for the prover and
    V_R (None where it holds neither): A = x_g + x_{g+1} has the carries ``P ^ Q``, P V_L's
    pad and Q the witness, so its bits are ``K = x_g ^ (P << 1)`` (V_L's) XOR ``M = x_{g+1}
    ^ (Q << 1)`` (V_R's). ``halves``: (x_g, x_{g+1}) given (A = their sum; the fused form's
    K', M'), else the slots of the replicated x."""
    pos, ng = role % 3, sl.stop - sl.start
    if halves is None:
        xg = x.a[sl] if role == 0 else x.b[sl]           # slot g (V_L's) - role 2's b
        xh = x.b[sl] if role == 0 else x.a[sl]           # slot g+1 (V_R's) - role 1's a
    else:
        xg, xh = halves
    K = M = left = right = None
    if pos in (0, 2):
        P = p.prg.ring("prev" if pos == 0 else "next", kop, f"wit{g}", (ng,))
        left, K = (xg, P), xg ^ (P << _ONE)
    if pos in (0, 1):                        # a witness of the wrong length fails the proof
        Q = carries(xg, xh) ^ left[1] if pos == 0 else \
            witness if witness is not None and witness.size == ng else \
            np.zeros(ng, dtype=np.uint64)
        right, M = (xh, Q), xh ^ (Q << _ONE)
    return K, M, left, right


def trunc_claims(p, rec: dict, witness: np.ndarray,
                 halves=None) -> list[tuple[Claim, Claim, Claim]]:
    """The claims of :func:`mpc3.kernels.truncation.trunc_a`'s messages (replicated input,
    no multiplier): (own, as V_L of next, as V_R of prev) per gate width.

    The single (role 0) knows ``A = x_g + x_{g+1}`` alone and sends ``Uk = (A >>a f) -
    kappa`` (and, exact mode, ``t = (a_63 - rho) mod 2^f``) - not products of what its
    neighbours hold. Its witness, the carries of that sum XOR-shared as ``P ^ Q`` (P a pad
    V_L, role 2, draws from their key, Q sent to V_R, role 1, at the flush:
    :func:`trunc_witness`), is pinned by 64 mod-2 gates an element (:func:`carry_side`)
    and gives A's bits XOR-shared (:func:`a_bits`). Then, with x, y the halves, f the shift
    and b = b_L ^ b_R (arithmetic value ``b_L + b_R - 2 b_L b_R``) the carry into bit f,
    the overflow and a_63, ``A >>a f = (x >> f) + (y >> f) + c_f - 2^(64-f) (c_64 +
    a_63)`` (logical shifts), so Uk is one gate of three terms an element:

    * Uk:   sum_b (2 e_b b_L) b_R = ((x >> f) + sum e_b b_L - Uk) + ((y >> f) + sum e_b b_R
      - kappa), e = (1, -2^(64-f), -2^(64-f)) (:func:`_uk_coefficients`)
    * t:    (2^(65-f) K_63) M_63 = 2^(64-f) (K_63 - t) + 2^(64-f) (M_63 - rho)

    and the pair's exact-mode replies are one product each, mod 2^f (times 2^(64-f)):
    ``x1 = b_t rho + nu1`` (role 1: rho from role 0, b_t from role 2) and ``x2 = b_t t +
    nu2`` (role 2: b_t from role 1, t from role 0).

    ``halves(g, sl, role)``: A's parts (V_L's, V_R's) in group g as a party of that role
    holds them (None where it holds neither; :func:`fused_claims`), else x's slots.
    """
    views = Views()
    x, kop, exact = rec.get("x"), rec["kop"], rec["got2"] is not None
    wits = received(rec, witness, 1)
    for g, (sl, st, per) in enumerate(zip(rec["groups"], rec["state"], rec["per"])):
        role, ng = st["role"], st["n"]
        sh, up = per[0], per[1]
        top = np.left_shift(_ONE, np.broadcast_to(np.asarray(up, np.uint64), (ng,)))
        pos = role % 3                                           # prover: role 0
        K, M, left, right = a_bits(p, x, sl, g, role, kop, wits.get(g, [None])[0],
                                   None if halves is None else halves(g, sl, role))
        f = np.broadcast_to(np.asarray(sh, dtype=np.uint64), (ng,))
        e = _uk_coefficients(f)
        views.add(("bits", 2), pos, carry_claim(pos, left, right))
        lb = None if left is None else _uk_rows(left, K, f)      # each side's bits, once
        rb = None if right is None else _uk_rows(right, M, f)
        views.add(3, pos, _view(
            pos, lambda: _TWO * e * lb, lambda: rb,
            lambda: (left[0] >> f) + (e * lb).sum(0) - st["Uk"],
            lambda: (right[0] >> f) + (e * rb).sum(0) - st["kappa"]))
        if not exact:
            continue
        t = st["t"] if role == 0 else st.get("at_rho")
        views.add(1, pos, _view(
            pos, lambda: (top * _TWO * (K >> _63))[None],
            lambda: (M >> _63)[None],
            lambda: top * ((K >> _63) - t), lambda: top * ((M >> _63) - st["rho"])))
        got2 = rec["got2"]
        bt = st["bt"].astype(np.uint64) if role else None
        x1 = unpack_by_width(got2[(1, g)][0], per[3], ng, (p, 1)) if role == 0 else st.get("x")
        x2 = unpack_by_width(got2[(-1, g)][0], per[3], ng, (p, -1)) if role == 0 else st.get("x")
        pos = (role - 1) % 3                                     # prover: role 1
        views.add(1, pos, _view(
            pos, lambda: (top * st["rho"])[None], lambda: bt[None],
            lambda: top * x1, lambda: np.uint64(0) - top * st["nu"][0]))
        pos = (role - 2) % 3                                     # prover: role 2
        views.add(1, pos, _view(
            pos, lambda: (top * bt)[None], lambda: t[None],
            lambda: np.uint64(0) - top * st["nu"][1], lambda: top * x2))
    return views.triples()


def received(rec: dict, witness: np.ndarray, parts: int) -> dict:
    """{g: (parts arrays of the group's size)} of a witness this party received as V_R
    (role 1) of the groups' singles: ``parts`` blocks, each the concatenation over those
    groups in order (:func:`fused_witness`'s layout). A witness of the wrong length is read
    as zeros (its proof fails)."""
    mine = [(g, st["n"]) for g, st in enumerate(rec["state"]) if st["role"] == 1]
    total = sum(n for _, n in mine)
    if witness is None or witness.size != parts * total:
        witness = np.zeros(parts * total, dtype=np.uint64)
    out, at = {}, 0
    for g, n in mine:
        out[g] = tuple(witness[j * total + at:j * total + at + n] for j in range(parts))
        at += n
    return out


# ------------------------------------------------------------------ the fused form ----
def fused_witness(p, rec: dict) -> np.ndarray:
    """The single's witness of a fused truncation, for V_R: over the groups where it is role
    0 (in order), the carries of ``A = K' + M'`` XOR the pad ``wit<g>`` (as
    :func:`trunc_witness`) of all, then ``M' = A - K'`` of all, with A its own product term
    and K' the pad ``arith<g>`` it shares with V_L."""
    bits, arith = [], []
    for g, (sl, st) in enumerate(zip(rec["groups"], rec["state"])):
        if st["role"] == 0:
            A = rec["z"][sl]
            K, K2 = (p.prg.ring("prev", rec["kop"], f"{t}{g}", A.shape)
                     for t in ("wit", "arith"))
            bits.append(carries(K2, A - K2) ^ K)
            arith.append(A - K2)
    return np.concatenate(bits + arith) if bits else np.zeros(0, dtype=np.uint64)


def _fused_halves(p, rec: dict, wits: dict):
    """``halves(g, sl, role)`` of :func:`trunc_claims` for a fused truncation: A's parts
    (K', M') as a party of ``role`` holds them - the single both, V_L (role 2) the pad K'
    (drawn once a group), V_R (role 1) the received M' (``wits``, :func:`received`)."""
    pads = {}

    def halves(g, sl, role):
        if role == 1:
            return None, wits[g][1]
        if g not in pads:
            pads[g] = p.prg.ring("prev" if role == 0 else "next", rec["kop"], f"arith{g}",
                                 (sl.stop - sl.start,))
        return pads[g], (rec["z"][sl] - pads[g] if role == 0 else None)
    return halves


def shared_bits(p, rec: dict, g: int, role: int):
    """(K, M) of A's bits in group g of the fused truncation ``rec`` as a party of
    ``role`` holds them (None where it holds neither; its received witness in
    ``rec["witness"]``): a comparison of the same product's split form reads A's bits from
    them, the truncation's claims pinning them to A (:mod:`mpc3.claims_compare`)."""
    sl = rec["groups"][g]
    wits = received(rec, rec.get("witness"), 2)
    K, M, _, _ = a_bits(p, None, sl, g, role, rec["kop"], wits.get(g, (None,))[0],
                        halves=_fused_halves(p, rec, wits)(g, sl, role))
    return K, M


def fused_claims(p, rec: dict, witness: np.ndarray):
    """The claims of a truncation fused into products' resharing (``rec["terms"]``: the
    products whose masked 3-out-of-3 terms ``rec["z"]`` are, flat): (triples, matrix
    products' views) for :class:`mpc3.checks.Checks`.

    In group g the pair (roles 1, 2) exchange their terms, so role 1's is held by its V_R
    (role 2, its receiver) and role 2's by its V_L (role 1); the single's A is held as
    ``K' + M'`` (:func:`fused_witness`), K' by V_L (role 2), M' by V_R (role 1). The
    truncation's claims are :func:`trunc_claims` with A's halves K', M'; the product
    claims (:func:`mpc3.claims.term_views`) say that each party's term is its product term
    under the zero sharing ``(terms kop, "mulmask")``, plus its slot a of the biases
    (``terms["bias"]``: this party's slots a and b, shifted, flat; V_L takes off its
    prover's).
    """
    z, got = rec["z"], rec["got"]
    wits = received(rec, witness, 2)
    halves = _fused_halves(p, rec, wits)
    triples = trunc_claims(p, rec, np.concatenate([w[0] for w in wits.values()] or
                                                  [np.zeros(0, np.uint64)]), halves)
    left, right = np.zeros_like(z), np.zeros_like(z)   # of next's term, of prev's
    for g, (sl, st) in enumerate(zip(rec["groups"], rec["state"])):
        role = st["role"]
        if role == 1:                                  # next is role 2, prev the single
            left[sl], right[sl] = got[(NEXT, g)][0], wits[g][1]
        elif role == 2:                                # next is the single, prev role 1
            left[sl], right[sl] = halves(g, sl, 2)[0], got[(PREV, g)][0]
    terms = rec["terms"]
    term = z
    if terms.get("bias") is not None:
        term, left = z - terms["bias"][0], left - terms["bias"][1]
    more, mats = term_views(p.rank, terms["items"], term, left, right,
                            *masks(p, terms["kop"], "mulmask", z.shape))
    return triples + more, mats
