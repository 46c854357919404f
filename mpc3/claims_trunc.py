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

import functools

import numpy as np

from .claims import Views, _view, masks, term_views
from .comm import NEXT, PREV
from .dzkp import Claim
from .kernels.base import unpack_by_width

_ONE = np.uint64(1)


_J = np.arange(64, dtype=np.uint64)[:, None]


def _bit_rows(words: np.ndarray) -> np.ndarray:
    """(N,) words -> (64, N) their bits as 0/1 words (row j: bit j)."""
    return (words[None, :] >> _J) & _ONE


def _bits8(words: np.ndarray) -> np.ndarray:
    """(N,) words -> (64, N) their bits as uint8 0/1 (row j: bit j)."""
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8).reshape(-1, 8), axis=1,
                         bitorder="little").T.copy()


def _sra(words: np.ndarray, f) -> np.ndarray:
    """Arithmetic shift right by f of uint64 words: sum_j c_j w_j (:func:`_shift_rows`)."""
    return (np.ascontiguousarray(words).view(np.int64) >> np.int64(f)).view(np.uint64)


def _shift_rows(sh, n: int) -> np.ndarray:
    """(64, n) coefficients c_j with sum_j c_j a_j = (A >>a f) for A's bits a_j:
    2^(j-f) for f <= j < 63, -2^(63-f) for j = 63, 0 below f (f per element; one f: a
    (64, 1) column, broadcast)."""
    f = np.broadcast_to(np.asarray(sh, dtype=np.int64), (n if np.ndim(sh) else 1,))
    e = np.arange(64)[:, None] - f[None, :]
    c = np.where(e >= 0, np.left_shift(_ONE, np.maximum(e, 0).astype(np.uint64)),
                 np.uint64(0)).astype(np.uint64)
    c[63] = np.uint64(0) - np.left_shift(_ONE, (63 - f).astype(np.uint64))
    return c


def trunc_witness(p, rec: dict) -> np.ndarray:
    """The single's witness of a truncation (:func:`trunc_claims`): for the group where
    this party is role 0, the bits of its ``A = x_g + x_{g+1}`` XOR a pad from the key it
    shares with V_L (role 2), one word per element, for V_R (role 1)."""
    return a_witness(p, rec["x"], rec["groups"], [st["role"] for st in rec["state"]],
                     rec["kop"])


def a_witness(p, x, groups, roles, kop: int) -> np.ndarray:
    """The bits of the single's ``A = x_g + x_{g+1}`` in the group where this party is
    role 0, XOR the pad ``(kop, "wit<g>")`` it shares with V_L, for V_R (sent at the flush)."""
    out = []
    for g, (sl, role) in enumerate(zip(groups, roles)):
        if role == 0:
            pad = p.prg.ring("prev", kop, f"wit{g}", (sl.stop - sl.start,))
            out.append((x.a[sl] + x.b[sl]) ^ pad)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def a_bits(p, x, sl: slice, g: int, role: int, kop: int, witness: np.ndarray,
           halves=None):
    """This party's part of the single's witness in group g: ``(K, M, x_g, x_{g+1})`` with
    ``K ^ M = A`` - K (V_L's pad) and x_g for the prover and V_L, M (the witness) and
    x_{g+1} for the prover and V_R, None where it holds neither. ``halves``: (x_g, x_{g+1})
    given (A = their sum; the fused form's K', M'), else the slots of the replicated x."""
    pos, ng = role % 3, sl.stop - sl.start
    if halves is None:
        xg = x.a[sl] if role == 0 else x.b[sl]           # slot g (V_L's) - role 2's b
        xh = x.b[sl] if role == 0 else x.a[sl]           # slot g+1 (V_R's) - role 1's a
    else:
        xg, xh = halves
    K = M = None
    if pos in (0, 2):
        K = p.prg.ring("prev" if pos == 0 else "next", kop, f"wit{g}", (ng,))
    if pos == 0:
        M = (xg + xh) ^ K
    elif pos == 1:                           # a witness of the wrong length fails the proof
        M = witness if witness is not None and witness.size == ng else \
            np.zeros(ng, dtype=np.uint64)
    return K, M, xg, xh


def trunc_gate_bits(shifts) -> tuple[int, int]:
    """(min, max) of a truncation's shifts (one or per element, over every group): its
    claims' gates run over A's bits min..63 and below max (:func:`trunc_claims`)."""
    fs = [np.asarray(f).reshape(-1) for f in shifts]
    fs = np.concatenate(fs) if fs else np.zeros(0, np.int64)
    return (int(fs.min()), int(fs.max())) if fs.size else (0, 0)


def trunc_claims(p, rec: dict, witness: np.ndarray,
                 halves=None) -> list[tuple[Claim, Claim, Claim]]:
    """The claims of :func:`mpc3.kernels.truncation.trunc_a`'s messages (replicated input,
    no multiplier): (own, as V_L of next, as V_R of prev) per gate width.

    The single (role 0) knows ``A = x_g + x_{g+1}`` alone and sends ``Uk = (A >>a f) -
    kappa`` (and, exact mode, ``t = (a_63 - rho) mod 2^f``) - not products of what its
    neighbours hold. Its witness, A's 64 bits a_j = K_j ^ M_j with K a pad V_L (role 2)
    draws from their key and M sent to V_R (role 1) at the flush (:func:`trunc_witness`),
    makes them linear in the bits, whose arithmetic values ``K_j + M_j - 2 K_j M_j`` are
    one product each (K, M are bits by construction):

    * Uk:   sum_(j >= f) (2 c_j K_j) M_j = (sum c_j K_j - Uk) + (sum c_j M_j - kappa) =:
      z_U, c_j of :func:`_shift_rows` (zero below f)
    * A:    sum_(j < f) (2^(j+1) K_j) M_j = (K - x_g) + (M - x_{g+1}) - 2^f z_U; with Uk's
      gate times 2^f that is ``sum_j 2^j a_j = A`` (2^f 2 c_j = 2^(j+1) for f <= j < 63,
      and 0 = 2^64 for j = 63): A's 64 bits are pinned, and with them Uk mod 2^64 - in 64
      terms an element, each bit's product once (f per element: the gates run over bits
      min f..63 and below max f, the coefficients zero past an element's own f)
    * t:    (2^(65-f) K_63) M_63 = 2^(64-f) (K_63 - t) + 2^(64-f) (M_63 - rho)

    and the pair's exact-mode replies are one product each, mod 2^f (times 2^(64-f)):
    ``x1 = b_t rho + nu1`` (role 1: rho from role 0, b_t from role 2) and ``x2 = b_t t +
    nu2`` (role 2: b_t from role 1, t from role 0).

    ``halves(g, sl, role)``: A's parts (V_L's, V_R's) in group g as a party of that role
    holds them (None where it holds neither; :func:`fused_claims`), else x's slots.
    """
    views = Views()
    x, kop, exact = rec.get("x"), rec["kop"], rec["got2"] is not None
    fmin, fmax = trunc_gate_bits(per[0] for per in rec["per"])    # public: every group's
    wits = received(rec, witness, 1)
    for g, (sl, st, per) in enumerate(zip(rec["groups"], rec["state"], rec["per"])):
        role, ng = st["role"], st["n"]
        sh, up = per[0], per[1]
        top = np.left_shift(_ONE, np.broadcast_to(np.asarray(up, np.uint64), (ng,)))
        pos = role % 3                                           # prover: role 0
        K, M, xg, xh = a_bits(p, x, sl, g, role, kop, wits.get(g, [None])[0],
                              None if halves is None else halves(g, sl, role))
        c = _shift_rows(sh, ng)
        f = np.broadcast_to(np.asarray(sh, dtype=np.uint64), (ng,))
        two_j = np.where(_J[:fmax] < f, np.left_shift(_ONE, _J[:fmax] + _ONE), np.uint64(0))
        if np.ndim(sh) == 0:      # one shift: bit rows as uint8 with each row's value
            Kb = None if K is None else _bits8(K)
            Mb = None if M is None else _bits8(M)
            zu = functools.cache(lambda: _sra(K, sh) - st["Uk"])     # sum_j c_j K_j
            zv = functools.cache(lambda: _sra(M, sh) - st["kappa"])
            two = np.where(_J[:fmax, 0] < np.uint64(sh), np.left_shift(_ONE, _J[:fmax, 0] + _ONE),
                           np.uint64(0))
            scales = ((np.uint64(2) * c[fmin:, 0], np.ones(64 - fmin, np.uint64)),
                      (two, np.ones(fmax, np.uint64)))
            uk_u, a_u = (lambda: Kb[fmin:]), (lambda: Kb[:fmax])
        else:
            Kb = None if K is None else _bit_rows(K)         # each bit row computed once
            Mb = None if M is None else _bit_rows(M)
            zu = functools.cache(lambda: (c * Kb).sum(axis=0) - st["Uk"])
            zv = functools.cache(lambda: (c * Mb).sum(axis=0) - st["kappa"])
            scales = ((None, None), (None, None))
            uk_u = (lambda: np.uint64(2) * c[fmin:] * Kb[fmin:])
            a_u = (lambda: two_j * Kb[:fmax])
        views.add(64 - fmin, pos, _view(                        # Uk's gate: bits f..63
            pos, uk_u, lambda: Mb[fmin:], zu, zv, *scales[0]))
        if fmax:                                                # A's, less 2^f Uk's: bits < f
            views.add(fmax, pos, _view(
                pos, a_u, lambda: Mb[:fmax],
                lambda: K - xg - (zu() << f), lambda: M - xh - (zv() << f), *scales[1]))
        if not exact:
            continue
        t = st["t"] if role == 0 else st.get("at_rho")
        views.add(1, pos, _view(
            pos, lambda: (top * np.uint64(2) * (K >> np.uint64(63)))[None],
            lambda: (M >> np.uint64(63))[None],
            lambda: top * ((K >> np.uint64(63)) - t), lambda: top * ((M >> np.uint64(63)) - st["rho"])))
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
    """The single's witness of a fused truncation, for V_R: A's bits XOR the pad ``wit<g>``
    (as :func:`trunc_witness`), then ``M' = A - K'`` with K' the pad ``arith<g>`` it shares
    with V_L; A its own product term, over the groups where it is role 0 (in order, the
    bits of all, then M' of all)."""
    bits, arith = [], []
    for g, (sl, st) in enumerate(zip(rec["groups"], rec["state"])):
        if st["role"] == 0:
            A = rec["z"][sl]
            K, K2 = (p.prg.ring("prev", rec["kop"], f"{t}{g}", A.shape)
                     for t in ("wit", "arith"))
            bits.append(A ^ K)
            arith.append(A - K2)
    return np.concatenate(bits + arith) if bits else np.zeros(0, dtype=np.uint64)


def shared_bits(p, rec: dict, g: int, role: int):
    """(K, M) of A's bits in group g of the fused truncation ``rec`` as a party of
    ``role`` holds them (None where it holds neither; its received witness in
    ``rec["witness"]``): a comparison of the same product's split form reads A's bits from
    them, the truncation's claims pinning them to A (:mod:`mpc3.claims_compare`)."""
    sl = rec["groups"][g]
    wit = received(rec, rec.get("witness"), 2).get(g, (None,))[0]
    K, M, _, _ = a_bits(p, None, sl, g, role, rec["kop"], wit,
                        halves=(rec["z"][sl], np.uint64(0)) if role == 0 else (None, None))
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
    z, kop, got = rec["z"], rec["kop"], rec["got"]
    wits = received(rec, witness, 2)
    pads = {}

    def halves(g, sl, role):
        if role == 1:
            return None, wits[g][1]
        if g not in pads:
            pads[g] = p.prg.ring("prev" if role == 0 else "next", kop, f"arith{g}",
                                 (sl.stop - sl.start,))
        return pads[g], (z[sl] - pads[g] if role == 0 else None)
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
