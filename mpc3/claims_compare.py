"""The claims of the comparison's leaves (:func:`mpc3.kernels.leaves.leaves_steps`): what
:class:`mpc3.checks.Checks` proves about its three messages in each element group.

* Role 0 (the single) sends ``T' = T ^ rho`` to role 2, T the thermometer codes of its
  window blocks and A's window top bit, rho from the key it shares with role 1. T is
  XOR-shared between its verifiers (V_L = role 2 holds T', V_R = role 1 holds rho), and the
  bits of ``A = x_g + x_{g+1}`` are too, with the witness of
  :func:`mpc3.claims.a_witness` (``a = K ^ M``: V_L's pad, V_R's witness). With the
  arithmetic value ``t = T' + rho - 2 T' rho`` of a shared bit, the code is right iff
    - A's bits are A's (the 64-term gate of :func:`mpc3.claims.trunc_claims`);
    - each block's code sums to the block's value: ``sum_v t_v = sum_i 2^i a_i`` (one
      gate of 2^k - 1 + k terms: every t_v and a_i is one product);
    - each code is monotone, ``t_(v+1) (1 - t_v) = 0`` mod 2 - with ``t = T' ^ rho``
      that is ``2^63 (a d + c b) = 2^63 (a c + b d)`` for a = T'_(v+1), c = 1 - T'_v
      (V_L's) and b = rho_(v+1), d = rho_v (V_R's) - a binary, monotone code with the
      block's sum is its thermometer;
    - the top row is A's window top bit (linear mod 2: zero terms).
* Each pair member sends role 0 its XOR share of the leaves, masked: role 1
  ``sel(rho, b) ^ kappa``, role 2 ``sel(T', b) ^ kappa ^ sigma`` (kappa, sigma from the pair's
  key). A leaf's share is a selection of its block's code rows by the pair's ``b``:
  ``XOR_v S_v(b) t_v``, one 2^63-lifted gate of 2^k - 1 terms, the code share on one
  verifier's side (role 0 holds rho and T') and S(b) on the other's (the other pair member).

A leaf set whose pair part arrives late (``pair_b``: a product's split form, whose A is a
3-out-of-3 share) has no claim; malicious mode takes the replicated products instead.
"""
from __future__ import annotations

import numpy as np

from .claims import _TOP, _bit_rows, _concat, _slot, a_bits, a_witness
from .dzkp import Claim
from .kernels.base import group_bounds
from .kernels.leaves import leaf_blocks
from .shares import group_sizes

_ONE = np.uint64(1)


def _rows(planes: np.ndarray, n: int) -> np.ndarray:
    """(rows, words(n)) planes of one group -> (rows, n) 0/1 words."""
    return np.unpackbits(np.ascontiguousarray(planes).view(np.uint8), axis=1,
                         bitorder="little")[:, :n].astype(np.uint64)


def _sided(pos: int, left, right) -> dict[int, Claim]:
    """{width: Claim} of a party's view at ``pos`` (0 prover, 2 V_L, 1 V_R) of gates whose
    V_L side ``left() -> {width: (u, zl)}`` and V_R side ``right() -> {width: (v, zr)}``
    are evaluated only by the parties that hold them."""
    lv = left() if pos in (0, 2) else None
    rv = right() if pos in (0, 1) else None
    out = {}
    for w in (lv or rv):
        if pos == 0:
            out[w] = Claim(lv[w][0], rv[w][0], lv[w][1] + rv[w][1])
        elif pos == 2:
            out[w] = Claim(lv[w][0], np.zeros_like(lv[w][0]), lv[w][1])
        else:
            out[w] = Claim(np.zeros_like(rv[w][0]), rv[w][0], rv[w][1])
    return out


def _bases(blocks) -> list[int]:
    """First thermometer row of each block."""
    return list(np.cumsum([0] + [(1 << k) - 1 for _, k in blocks])[:-1])


# ------------------------------------------------------------- the thermometer --------
def _sum_width(blocks) -> int:
    """Terms of a block's sum gate (2^k - 1 code rows and k bits; never the 2 of the
    monotonicity gates, which go in the same dict)."""
    return max(3, max((1 << k) - 1 + k for _, k in blocks))


def _therm_side(T: np.ndarray, K: np.ndarray, x: np.ndarray, blocks, L: int, top: int,
                left: bool) -> dict:
    """One verifier's side of role 0's claim: V_L (``left``) holds T' rows, its pad K and
    x_g; V_R rho rows, the witness M and x_{g+1} (here also T, K, x)."""
    Kb, n = _bit_rows(K), K.size
    two_j = np.left_shift(_ONE, np.arange(64, dtype=np.uint64) + _ONE)[:, None]
    out = {64: ((two_j * Kb) if left else Kb, K - x)}
    wide = _sum_width(blocks)
    sums_u, sums_z, mono_u, mono_z = [], [], [], []
    for (off, k), base in zip(blocks, _bases(blocks)):
        t = T[base:base + (1 << k) - 1]
        bits = Kb[L + off:L + off + k]
        scale = np.left_shift(_ONE, np.arange(k, dtype=np.uint64))[:, None]
        terms = np.zeros((wide, n), dtype=np.uint64)
        terms[:t.shape[0]] = (np.uint64(0) - np.uint64(2) * t) if left else t
        terms[t.shape[0]:t.shape[0] + k] = (scale * np.uint64(2) * bits) if left else bits
        sums_u.append(terms)
        sums_z.append((scale * bits).sum(axis=0) - t.sum(axis=0))
        for v in range(t.shape[0] - 1):            # t_(v+2) (1 - t_(v+1)) = 0 mod 2
            hi, lo = t[v + 1], t[v]
            if left:                               # a = T'_hi, c = 1 - T'_lo
                c = _ONE - lo
                mono_u.append(np.stack([_TOP * hi, _TOP * c]))
                mono_z.append(_TOP * hi * c)
            else:                                  # b = rho_hi, d = rho_lo
                mono_u.append(np.stack([lo, hi]))
                mono_z.append(_TOP * hi * lo)
    mono_u.append(np.zeros((2, n), dtype=np.uint64))           # the window's top bit
    mono_z.append(_TOP * (T[-1] + Kb[L + top]))
    out[wide] = (np.concatenate(sums_u, axis=1), np.concatenate(sums_z))
    out[2] = (np.concatenate(mono_u, axis=1), np.concatenate(mono_z))
    return out


# ---------------------------------------------------------------- the selection -------
def _selection(b: np.ndarray, blocks, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, S0): leaf l's share is ``XOR_v S[v-1] t_v ^ S0 t_0`` (:func:`select_planes`:
    G_j = t[2^k - b_j], P_j = t[2^k - 1 - b_j] ^ G_j), S of shape (width, leaves * n) -
    leaf-major, G_0..G_(nb-1) then P_1..P_(nb-1) - and S0 (leaves * n,)."""
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
    S = np.concatenate(gs + ps, axis=1).astype(np.uint64)
    return S, np.concatenate(g0 + p0).astype(np.uint64)


def _leaf_rows(T: np.ndarray, blocks, width: int) -> np.ndarray:
    """(width, leaves * n): each leaf's block code rows (zero-padded), leaf-major."""
    n = T.shape[1]
    per = []
    for (_, k), base in zip(blocks, _bases(blocks)):
        rows = np.zeros((width, n), dtype=np.uint64)
        rows[:(1 << k) - 1] = T[base:base + (1 << k) - 1]
        per.append(rows)
    return np.concatenate(per + per[1:], axis=1)


# --------------------------------------------------------------------- the kernel -----
def leaves_witness(p, rec: dict) -> np.ndarray:
    x = rec["x"]
    return a_witness(p, x, group_bounds(x.size), [s["role"] for s in rec["state"]],
                     rec["kop"])


def leaves_claims(p, rec: dict, witness: np.ndarray) -> dict[int, tuple[Claim, Claim, Claim]]:
    """Gates by width -> (own, as V_L of next, as V_R of prev) of the leaves' messages
    (module docstring)."""
    x, blocks, L, m, kop = rec["x"], rec["blocks"], rec["L"], rec["m"], rec["kop"]
    width = max((1 << k) - 1 for _, k in blocks)
    views: dict[int, tuple[list, list, list]] = {}

    def add(pos, claims):
        for w, c in claims.items():
            views.setdefault(w, ([], [], []))[_slot(pos)].append(c)

    for g, (sl, s) in enumerate(zip(group_bounds(x.size), rec["state"])):
        role, ng = s["role"], s["n"]
        K, M, xg, xh = a_bits(p, x, sl, g, role, kop, witness)
        therm = (lambda: _rows(s["therm"], ng))
        rho = (lambda: _rows(s["rho"], ng))
        bits = (lambda key: _rows(s[key], ng).reshape(-1))
        # role 0's thermometer: V_L = role 2 (T', K, x_g), V_R = role 1 (rho, M, x_{g+1})
        add(role % 3, _sided(role % 3,
                             lambda: _therm_side(therm(), K, xg, blocks, L, m - 1, True),
                             lambda: _therm_side(rho(), M, xh, blocks, L, m - 1, False)))
        # role 1's half: V_L = role 0 (rho, u1), V_R = role 2 (b, kappa)
        mine1 = "u1" if role == 0 else "u"
        add((role - 1) % 3, _sided(
            (role - 1) % 3,
            lambda: {width: (_TOP * _leaf_rows(rho(), blocks, width), _TOP * bits(mine1))},
            lambda: {width: (_selection(s["b"], blocks, width)[0], _TOP * bits("kappa"))}))
        # role 2's half: V_L = role 1 (b, kappa, sigma), V_R = role 0 (T', u2)
        mine2 = "u2" if role == 0 else "u"

        def left2():
            S, S0 = _selection(s["b"], blocks, width)
            return {width: (_TOP * S, _TOP * (bits("kappa") + bits("sigma") + S0))}
        add((role - 2) % 3, _sided(
            (role - 2) % 3, left2,
            lambda: {width: (_leaf_rows(therm(), blocks, width), _TOP * bits(mine2))}))
    return {w: tuple(_concat(v) for v in vs) for w, vs in views.items()}


def leaves_claim_gates(n: int, m: int, rank: int) -> dict[int, int]:
    """Gates of each width the leaves' claims on ``n`` elements (window width ``m``) give
    party ``rank`` to prove (:func:`mpc3.checks.Checks.batches` pads each width to the
    largest of the three): its group as the single proves its thermometer (A, sums,
    monotonicity and top), the two as a pair member its halves."""
    blocks = leaf_blocks(m - 1, n)
    nb, sizes = len(blocks), group_sizes(n)
    single = sizes[rank]
    return {64: single, _sum_width(blocks): nb * single,
            2: (sum(max((1 << k) - 2, 0) for _, k in blocks) + 1) * single,
            max((1 << k) - 1 for _, k in blocks): (2 * nb - 1) * (n - single)}
