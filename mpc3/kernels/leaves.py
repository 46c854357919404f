"""DReLU's leaves without AND gates (:mod:`mpc3.kernels.convert` step 2) and the carry tree's
plan over them.

The window bits of ``x = A + B`` (role 0 knows A, the pair B) are cut into blocks. Role 0
sends the masked *thermometer code* ``[a_j >= v]`` of each block value to role 2 (its mask
from the PRG it shares with role 1); since ``b_j`` is known to the pair, each block's
generate ``G_j = [a_j >= 2^w - b_j]`` and propagate ``P_j = [a_j = 2^w - 1 - b_j]`` are one or
two entries of that code selected by ``b_j``: the pair obtains XOR shares locally and
reshares them to role 0 (2 rounds). :func:`leaves_steps` is the kernel as lockstep steps
(:func:`mpc3.kernels.base.lockstep`); with ``pair_b`` the pair's B arrives after the first
round, from the truncation of the product whose sign this is
(:func:`mpc3.kernels.arith.mul_split_aa`), and role 1 sends its half in round 2 - same
rounds and bytes.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import ring
from ..comm import NEXT, PREV
from ..party import Party
from ..shares import AShare, BShare, words
from .base import Cost, Round, group_bounds, packed_bytes
from .bitplanes import bit_plane, select_planes, thermometer_planes
from .boolean import pack_planes, random_planes, random_planes_many, unpack_planes
from .thresholds import ROUND_LEAN_ELEMENTS

BLOCK = 3
MAX_BLOCK = 5


# ------------------------------------------------------------------------ layout ------
@functools.cache
def _blocks(nlow: int, k: int = BLOCK) -> tuple[tuple[int, int], ...]:
    return tuple((s, min(k, nlow - s)) for s in range(0, nlow, k))


def leaf_blocks(nlow: int, n: int) -> tuple[tuple[int, int], ...]:
    """The DReLU leaf blocks (offset, width) of ``nlow`` window bits for a call on ``n``
    elements: BLOCK-bit blocks, or for at most ROUND_LEAN_ELEMENTS elements the width in
    BLOCK..MAX_BLOCK with the fewest tree levels, then the fewest thermometer rows (the
    relu window of 27 low bits: 4-bit blocks, 3 levels instead of 4; sqrt_inv's 35: 5-bit
    blocks, 3 instead of 4)."""
    return _blocks(nlow, BLOCK if n > ROUND_LEAN_ELEMENTS else _lean_width(nlow))


@functools.cache
def _lean_width(nlow: int) -> int:
    """Block width in BLOCK..MAX_BLOCK with the fewest tree levels, then thermometer rows."""
    def key(k):
        blocks = _blocks(nlow, k)
        return len(tree_plan(len(blocks))), sum((1 << w) - 1 for _, w in blocks)
    return min(range(BLOCK, MAX_BLOCK + 1), key=key)


def tree_plan(nblocks: int) -> list[list[tuple[int, int, bool]]]:
    """Levels of (hi, lo, need_P) index pairs over the current node list."""
    levels, count = [], nblocks
    while count > 1:
        pairs = [(2 * i + 1, 2 * i, i != 0) for i in range(count // 2)]
        levels.append(pairs)
        count = count // 2 + count % 2
    return levels


def ands_per_level(nblocks: int) -> list[int]:
    return [sum(2 if need else 1 for _, _, need in lvl) for lvl in tree_plan(nblocks)]


# ------------------------------------------------------------------------ leaves ------
def leaves_steps(p: Party, x: AShare, L: int, m: int, pair_b: np.ndarray | None = None):
    """Replicated bits [c, G_0..G_{N-1}, P_1..P_{N-1}] with c = 1 ^ a_top ^ b_top, and N;
    2 rounds (lockstep steps). ``pair_b``: the pair's B, read after round 1 (module doc);
    role 0's A is then ``x.a + x.b``. Cost: :func:`leaf_cost`."""
    kop = p.new_op()
    n = x.size
    blocks = leaf_blocks(m - 1, n)
    nb = len(blocks)
    nrows = sum((1 << k) - 1 for _, k in blocks) + 1          # thermometers + a_top
    nconv = 2 * nb - 1
    mask = ring.check_ring(np.array([(1 << m) - 1 if m < 64 else (1 << 64) - 1],
                                    dtype=np.uint64), "mask")[0]
    lsh, sL = np.uint64(L), np.uint64(1 << L if L > 0 else 0)
    top = np.uint64(m - 1)
    late = pair_b is not None

    def pair_window(s):
        B = pair_b[s["sl"]] if late else (x.b if s["role"] == 1 else x.a)[s["sl"]]
        s["b"] = ((B + sL) >> lsh) & mask
        s["c_pair"] = bit_plane((s["b"] >> top) ^ np.uint64(1), s["n"])  # its top bit, negated

    keep = p.checks is not None            # malicious mode: the claims read b (and more)

    def role1_half(s, g):
        u = select_planes(s["rho"], s["b"] if keep else s.pop("b"), blocks, const_one=False)
        s["kappa"], s["sigma"] = random_planes_many(p, "next", nconv, words(s["n"]),
                                                    (f"kappa{g}", f"sigma{g}"))
        s["u"] = u ^ s["kappa"]
        return pack_planes(s["u"], s["n"])                        # to role 0

    r1, st = Round(p), []
    for g, sl in enumerate(group_bounds(n)):
        role, ng = p.role(g), sl.stop - sl.start
        w = words(ng)
        s = {"role": role, "n": ng, "sl": sl}
        if role == 0:
            a = ((x.a[sl] + x.b[sl]) >> lsh) & mask
            rho = random_planes(p, "next", nrows, w, f"thermo{g}")
            planes = thermometer_planes(a, blocks, m - 1, w)
            therm = planes ^ rho
            s["rho_top"], s["atop_masked"] = rho[-1:], therm[-1:]
            if keep:
                s.update(rho=rho, therm=therm)
            r1.send(PREV, pack_planes(therm, ng))                   # to role 2
            if not late:
                r1.recv(NEXT, g, 1)                                 # role 1's half
        else:
            if not late:
                pair_window(s)
            if role == 1:
                s["rho"] = random_planes(p, "prev", nrows, w, f"thermo{g}")
                s["rho_top"] = s["rho"][-1:]
                if not late:
                    r1.send(PREV, role1_half(s, g))
            else:
                r1.recv(NEXT, g, 1)                                 # thermometer from role 0
        st.append(s)
    got = yield r1

    r2 = Round(p)
    for g, s in enumerate(st):
        ng, w = s["n"], words(s["n"])
        if s["role"] == 0:
            if late:
                r2.recv(NEXT, g, 1)
            else:
                s["u1"] = unpack_planes(got[(NEXT, g)][0], ng, (p, NEXT))
            r2.recv(PREV, g, 1)
            continue
        if late:
            pair_window(s)
        if s["role"] == 2:
            therm = unpack_planes(got[(NEXT, g)][0], ng, (p, NEXT))
            s["atop_masked"] = therm[-1:]
            if keep:
                s["therm"] = therm
            u = select_planes(therm, s["b"] if keep else s.pop("b"), blocks, const_one=True)
            s["kappa"], s["sigma"] = random_planes_many(p, "prev", nconv, w,
                                                        (f"kappa{g}", f"sigma{g}"))
            s["u"] = u ^ s["kappa"] ^ s["sigma"]
            r2.send(NEXT, pack_planes(s["u"], ng))                   # to role 0
        elif late:
            r2.send(PREV, role1_half(s, g))
    got2 = yield r2

    a_parts, b_parts = [], []
    for g, s in enumerate(st):
        ng = s["n"]
        if s["role"] == 0:
            if late:
                s["u1"] = unpack_planes(got2[(NEXT, g)][0], ng, (p, NEXT))
            s["u2"] = u2 = unpack_planes(got2[(PREV, g)][0], ng, (p, PREV))
            a_parts.append(np.concatenate([s["atop_masked"], u2]))
            b_parts.append(np.concatenate([s["rho_top"], s["u1"]]))
        else:
            c_pair = s["c_pair"]
            if s["role"] == 1:
                a_parts.append(np.concatenate([s["rho_top"], s["u"]]))
                b_parts.append(np.concatenate([c_pair, s["sigma"]]))
            else:
                a_parts.append(np.concatenate([c_pair, s["sigma"]]))
                b_parts.append(np.concatenate([s["atop_masked"], s["u"]]))
    if keep:                                # malicious mode: the messages' claims
        p.checks.leaves(p, {"x": x, "L": L, "m": m, "blocks": blocks, "state": st,
                            "kop": kop, "late": late, "pair_b": pair_b})
    return BShare(np.concatenate(a_parts, axis=1), np.concatenate(b_parts, axis=1), n), nb


def leaf_cost(n: int, L: int, m: int) -> tuple[Cost, int]:
    """Rounds and bytes per party of :func:`leaves_steps`, and the block count N."""
    blocks = leaf_blocks(m - 1, n)
    nb = len(blocks)
    nrows = sum((1 << k) - 1 for _, k in blocks) + 1
    nconv = 2 * nb - 1

    def role_bytes(role: int, ng: int) -> int:
        return packed_bytes(ng, 1) * (nrows if role == 0 else nconv if role in (1, 2) else 0)
    return Cost.by_role(2, n, role_bytes), nb
