"""Fixed-point truncation over Z_2^64 through the *split form* (fused into a product's
resharing, or standalone on a replicated sharing).

For the elements of group ``g`` the single (role 0) keeps ``A = z_0`` and the pair (roles 1,
2) exchange their parts so both know ``B = z_1 + z_2``; then ``x = A + B`` and

    x >> f  =  (A >>a f) + (B >>a f) + a_t * b_t * 2^(64-f)  - c,      c in {0, 1}

where ``>>a`` is the arithmetic shift, ``a_t``/``b_t`` the top bits of ``A`` and of ``B``
offset by 2^62. Share-local truncation (SecureML, ABY3's Pi_trunc1) is the same formula
without the ``a_t * b_t`` term, which is exactly its failure event. Mode "prob" omits it
(one round, one ring element per party and output - the RSS minimum; fails w.p. ~|x|/2^64);
mode "exact" (default) computes ``a_t * b_t`` mod 2^f with three f-bit messages in a second
round and never fails for |x| < 2^62. Costs of both: :func:`cost_trunc_shifts`.

Rounding (both modes, every path: fused mul/matmul/mul_many, trunc_a, per-element shifts).
Write ``x = q 2^f + s`` with ``0 <= s < 2^f``. The pair adds the public offset
``h = 2^f - 1`` to B, so the shifted pieces sum to ``floor((x + h) / 2^f) - c``, i.e. to
``q + [s > 0] - c``, where the dropped low carry ``c = [A mod 2^f >= s]`` for s > 0 (and 0
for s = 0). For uniformly random A (every kernel output and every dealt input) the result
is ``q + 1`` with probability ``s / 2^f`` and ``q`` otherwise: stochastic rounding,
unbiased (mean error 0), every error in (-1, +1) ulp, exact when 2^f divides x, never
negative for x >= 0. (A half-ulp offset h = 2^(f-1) would give round-to-nearest minus c:
mean error -0.5 ulp, range [-1.5, 0.5], a drift of -0.5 ulp per chained product.)

Scaled truncation (``mult``): ``floor(x m / 2^f)`` for public multipliers m < 2^31 in the same
rounds and messages - each piece is multiplied before its shift in 95-bit integers and the
carry correction is multiplied too - so a public real factor (attention's 1/n, LayerNorm's
1/d) rides in the truncation of the product it scales (:func:`scaled`).

The kernel is written as lockstep steps (:func:`trunc_steps`), so a comparison of the same
product can share its rounds (:func:`mpc3.kernels.base.run_steps`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..comm import NEXT, PREV
from .. import ring
from ..party import Party, profiled
from ..shares import AShare, SplitShare
from . import fused
from .base import (Cost, Round, pack_by_width, run_steps, unpack_by_width, width_bytes,
                   width_plan, group_bounds)

OFFSET_BITS = 62          # exact truncation is exact for |x| < 2^62
_ONE = np.uint64(1)


def _dir(my_role: int, other_role: int) -> int:
    return NEXT if (other_role - my_role) % 3 == 1 else PREV


def _u(v: int) -> np.uint64:
    return np.uint64(v % (1 << 64))


def cost_trunc_shifts(shifts, mode: str, from_rss: bool, split: bool = False,
                      segments=None) -> Cost:
    """Exact cost of a truncation (fused or standalone) with per-element public shifts
    (``split``: delivered in split layout, :func:`mpc3.kernels.arith.mul_split_aa`;
    ``segments`` as there)."""
    shifts = np.asarray(shifts).reshape(-1)
    per = [0, 0, 0]
    for sl, g, seg_split in segments or _default_segments(shifts.size, split):
        ng = sl.stop - sl.start
        wb = width_bytes(width_plan(shifts[sl]), ng)
        for rank in range(3):
            role = (rank - g) % 3
            ring_bytes = 8 * ng if ((role == 0 and not seg_split) or
                                    (role != 0 and not from_rss)) else 0
            per[rank] += ring_bytes + (wb if mode == "exact" else 0)
    return Cost(2 if mode == "exact" else 1, tuple(per))


@functools.lru_cache(maxsize=4096)
def _default_segments(n: int, split: bool):
    return tuple((sl, g, split) for g, sl in enumerate(group_bounds(n)))


@profiled
def trunc_a(p: Party, x: AShare, bits=None) -> AShare:
    """Fixed-point truncation x >> bits of a replicated sharing (default cfg.frac; an
    array broadcastable to x gives per-element shifts in the same rounds).

    The split form is free for a replicated sharing (A = x_g + x_{g+1}, B = x_{g+2}).
    Cost: :func:`cost_trunc`.
    """
    p.new_op()
    bits = p.cfg.frac if bits is None else (
        bits if np.ndim(bits) == 0 else np.broadcast_to(bits, x.shape).reshape(-1))
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))
    return trunc_split(p, flat, bits, from_rss=True).reshape(x.shape)


def cost_trunc(n: int, cfg, bits=None) -> Cost:
    """Rounds and bytes per party of :func:`trunc_a` on ``n`` elements by ``bits`` (an int
    or per-element shifts; None: cfg.frac)."""
    bits = cfg.frac if bits is None else bits
    return cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n,)), cfg.trunc, from_rss=True)


def _group_shifts(bits, sl: slice):
    """(shift as int64, 64 - shift, low mask 2^shift - 1, width plan) of a group's elements:
    scalars when every element of the group shifts alike, else per-element arrays (cached
    by content: tables of per-element shifts recur)."""
    if sl.stop == sl.start:                       # an empty group: nothing to shift or send
        return np.int64(1), np.uint64(63), _ONE, 1
    if np.ndim(bits) != 0:
        arr = bits[sl]
        if (arr == arr[0]).all():
            bits = int(arr[0])
        else:
            return _mixed_shifts(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    b = int(bits)
    if not 1 <= b < OFFSET_BITS:
        raise ValueError(f"cannot truncate by {b} bits")
    return np.int64(b), np.uint64(64 - b), _u((1 << b) - 1), b


@functools.lru_cache(maxsize=256)
def _mixed_shifts(key: bytes):
    arr = np.frombuffer(key, dtype=np.int64)
    if not (1 <= arr.min() and arr.max() < OFFSET_BITS):
        raise ValueError(f"cannot truncate by {arr} bits")
    b = arr.astype(np.uint64)
    return arr, np.uint64(64) - b, (_ONE << b) - _ONE, ring.width_plan(arr)


#: The largest multiplier of a scaled truncation (the 95-bit product's bound).
MAX_MULT = (1 << 31) - 1
#: Significant bits of a public real factor folded into a truncation (:func:`scaled`).
SCALE_BITS = 30


class Scaled(NamedTuple):
    """A product's truncation ``floor(z * mult / 2^shift)`` (mul_aa / matmul_aa /
    mul_many_aa ``trunc``; :func:`scaled` makes one from a real factor)."""
    shift: int
    mult: np.ndarray


def scaled(s, frac: int, bits: int | None = None) -> Scaled:
    """(shift, multipliers) of ``x * s >> frac`` for a public real factor ``s`` in
    (0, 1] (scalar or array; e.g. attention's row scale 1/n): ``trunc(x, shift, mult)`` with
    ``shift = frac + bits`` and ``mult = round(s 2^bits)`` computes ``floor(x s / 2^frac)``
    up to the encoding of s (relative 2^-(bits+1)/s) and the usual rounding. ``bits`` None:
    as many as the multiplier (<= MAX_MULT) and the shift (< OFFSET_BITS) allow - at least
    SCALE_BITS significant bits for s >= 2^(OFFSET_BITS - 1 - frac - SCALE_BITS). Every
    correction message of the truncation is ``shift`` bits wide."""
    s = np.asarray(s, dtype=np.float64)
    if not (np.all(s > 0) and np.all(s <= 1)):
        raise ValueError("a scaled truncation's factor must lie in (0, 1]")
    if bits is None:
        bits = min(OFFSET_BITS - 1 - frac, int(np.floor(np.log2(MAX_MULT / s.max()))))
    m = np.round(s * 2.0 ** bits).astype(np.uint64)
    return Scaled(frac + bits, np.maximum(m, np.uint64(1)))


def _check_mult(mult, n: int) -> np.ndarray:
    m = np.ascontiguousarray(np.atleast_1d(np.asarray(mult, dtype=np.uint64)).reshape(-1))
    if m.size not in (1, n):
        raise ValueError(f"{m.size} multipliers for {n} elements")
    if m.size and (m.min() < 1 or m.max() > MAX_MULT):
        raise ValueError(f"truncation multipliers must lie in [1, {MAX_MULT}]")
    return m


def trunc_split(p: Party, src, bits, from_rss: bool, plain: np.ndarray | None = None,
                split: bool = False, segments=None, mult=None):
    """Core of fused/standalone truncation (:func:`trunc_steps` run alone)."""
    if p.shadow is not None:           # a standalone truncation of a shadow share
        return p.shadow.trunc(src, bits, mult)
    return run_steps(p, trunc_steps(p, src, bits, from_rss, plain, split, segments,
                                    mult=mult))[0]


def trunc_steps(p: Party, src, bits, from_rss: bool, plain: np.ndarray | None = None,
                split: bool = False, segments=None, pair_sum: np.ndarray | None = None,
                mult=None, mode: str | None = None, terms=None):
    """Core of fused/standalone truncation as lockstep steps (:func:`base.run_steps`);
    ``src`` is z (3-of-3, flat) or a flat AShare.

    ``pair_sum`` (z input only): a flat array over the first elements (the split segments')
    that this kernel fills, after its first round, with the untruncated ``B = z_1 + z_2`` of
    every element whose group has this party in the pair (role 0's ``A`` is its own z): the
    split form of the product itself, for a comparison running in the same rounds
    (:func:`mpc3.kernels.arith.mul_split_aa`).

    ``split``: stop at the split form (:class:`SplitShare`): role 0 keeps U and never sends
    it, so role 2's slot g stays 0 - 8 bytes per element less. ``segments``: (elements, role
    group, split?) triples instead of the three groups of ``n`` (mul_split_aa's mixed calls).

    ``bits`` is one shift for all elements or a per-element array (products of different
    scales then share the same rounds); each correction is packed at its own shift width.
    Output slots for group g (roles 0, 1, 2 hold slots (g, g+1), (g+1, g+2), (g+2, g)):
    slot g = U - kappa + X2', slot g+1 = kappa + X1', slot g+2 = W - nu', where U, W are
    the shifted pieces of role 0 and of the pair, and X1' + X2' - nu' = a_t*b_t*2^(64-f).

    ``mult`` (None, or a positive integer < 2^31 per element or for all): a *scaled*
    truncation, ``floor(x * mult / 2^bits)`` with the same rounding, rounds, messages and
    exactness (|x| < 2^62): each piece is multiplied before its shift in 95-bit integers, so
    the product x * mult is never reduced mod 2^64, and the carry correction is multiplied
    too (:func:`scaled`). A public real factor then costs no rounds of its own.

    ``mode``: "exact" or "prob" for this call (None: cfg.trunc; mpc3.kernels.checked).
    ``terms``: malicious mode, the products whose masked terms ``src`` (z) is, for the
    fused form's claims (:meth:`mpc3.checks.Checks.truncation`).
    """
    p.new_op()
    exact = (mode or p.cfg.trunc) == "exact"
    n = src.a.size if from_rss else src.size
    given, segments = segments, segments or _default_segments(n, split)
    groups = [sl for sl, _, _ in segments]
    if np.ndim(bits) != 0:
        bits = np.broadcast_to(np.asarray(bits, dtype=np.int64), (n,))
    per = [_group_shifts(bits, sl) for sl in groups]
    offset = _u(1 << OFFSET_BITS) if exact else np.uint64(0)
    mults = [None] * len(groups)             # per group: its multipliers (scaled) or None
    if mult is not None:
        mult = _check_mult(mult, n)
        mults = [mult if mult.size == 1 else mult[sl] for sl in groups]

    r1, state = Round(p), []
    if plain is not None:                       # masked 3-of-3 products reshared, same round
        r1.send(PREV, plain)
        r1.recv(NEXT, -1, 1)
    # Round 1: split form (A at role 0, B at roles 1 and 2); role 0 sends its piece.
    for g, (sl, rg, split) in enumerate(segments):
        role, ng = p.role(rg), sl.stop - sl.start
        st = {"role": role, "n": ng, "split": split}
        if role == 0:
            sh, up, low, plan = per[g]
            if exact:
                st["kappa"], rho = p.rand_with_many(0, 1, [(f"kappa{g}", ng), (f"rho{g}", ng)])
            else:
                st["kappa"], rho = p.rand_with(0, 1, ng, f"kappa{g}"), None
            # A = z (or x_g + x_{g+1}); Uk = (A >>a f) - kappa; t = (a_t - rho) mod 2^f
            a_src, b_src = (src.a[sl], src.b[sl]) if from_rss else (src[sl], None)
            st["Uk"], t = fused.single_split(a_src, b_src, st["kappa"], rho, sh, low, mults[g])
            st["rho"], st["t"] = rho, t
            msg = [] if split else [st["Uk"]]
            if exact:
                msg.append(pack_by_width(t, plan))
            if msg:
                r1.send(PREV, *msg)                              # to role 2
        else:
            other = _dir(role, 3 - role)                         # role 1 <-> role 2
            if from_rss:
                st["B"] = src.b[sl] if role == 1 else src.a[sl]
            else:
                st["z"] = src[sl]
                r1.send(other, src[sl])
                r1.recv(other, g, 1)
            if role == 2 and (exact or not split):
                r1.recv(NEXT, g, int(exact) + int(not split))    # from role 0
        state.append(st)
    got = yield r1

    a_out = np.empty(n, dtype=np.uint64)
    b_out = np.empty(n, dtype=np.uint64)
    for g, st in enumerate(state):
        role = st["role"]
        if role == 0:
            continue
        sh, up, low, plan = per[g]
        if pair_sum is not None and groups[g].stop <= pair_sum.size:
            pair_sum[groups[g]] = st["z"] + got[(_dir(role, 3 - role), g)][0]
        # W = ((B + offset + 2^f - 1) >>a f) - (offset >> f) (+ 2^f - 1: unbiased rounding,
        # module doc), bt = top bit of B + offset + 2^f - 1, with B = z + the other's z
        # (scaled: W = floor(((B + offset) m + 2^f - 1) / 2^f) - (offset >> f) m)
        st["W"], st["bt"] = fused.pair_split(       # W in its output slot (updated there)
            st["B"] if from_rss else st["z"],
            None if from_rss else got[(_dir(role, 3 - role), g)][0], offset, sh, low, mults[g],
            w_out=(b_out if role == 1 else a_out)[groups[g]])
        if role == 2:
            split = st["split"]
            msg = got[(NEXT, g)] if (exact or not split) else ()
            st["s0"] = np.uint64(0) if split else msg[0]      # split: a slot nobody reads
            st["Uk"] = st["s0"]
            if exact:
                st["at_rho"] = unpack_by_width(msg[-1], plan, st["n"], (p, NEXT))

    if exact:   # Round 2: a_t*b_t = b_t*rho + b_t*(a_t - rho), masked towards role 0.
        r2 = Round(p)
        for g, st in enumerate(state):
            role, ng = st["role"], st["n"]
            sh, up, low, plan = per[g]
            if role == 0:
                r2.recv(NEXT, g, 1)
                r2.recv(PREV, g, 1)
                continue
            nu1, nu2 = st["nu"] = p.rand_with_many(role, 3 - role,
                                                   [(f"nu1{g}", ng), (f"nu2{g}", ng)])
            # W -= (nu1 + nu2) << (64 - f); x = (b_t * r + nu_own) & (2^f - 1)
            if role == 1:
                st["kappa"], rho = p.rand_with_many(1, 0, [(f"kappa{g}", ng), (f"rho{g}", ng)])
                x1, st["x1"] = fused.pair_round2(st["W"], st["bt"], rho, nu1, nu2, low, up,
                                                 mults[g])
                st["rho"], st["x"] = rho, x1
                r2.send(PREV, pack_by_width(x1, plan))
            else:
                x2, x2s = fused.pair_round2(st["W"], st["bt"], st["at_rho"], nu2, nu1, low, up,
                                            mults[g])
                st["s0"] = st["s0"] + x2s
                st["x"] = x2
                r2.send(NEXT, pack_by_width(x2, plan))
        got2 = yield r2

    for g, (sl, st) in enumerate(zip(groups, state)):
        role = st["role"]
        sh, up, low, plan = per[g]
        if role == 0:
            if exact:
                fused.single_final(st["Uk"], st["kappa"],
                                   unpack_by_width(got2[(NEXT, g)][0], plan, st["n"], (p, NEXT)),
                                   unpack_by_width(got2[(PREV, g)][0], plan, st["n"], (p, PREV)),
                                   up, a_out[sl], b_out[sl], mults[g])
            else:
                a_out[sl], b_out[sl] = st["Uk"], st["kappa"]
        elif role == 1:                     # b_out[sl] is W already
            kappa = st["kappa"] = st["kappa"] if exact else \
                p.rand_with(1, 0, st["n"], f"kappa{g}")
            if exact:
                np.add(kappa, st["x1"], out=a_out[sl])
            else:
                a_out[sl] = kappa
        else:                               # a_out[sl] is W already
            b_out[sl] = st["s0"]
    if p.checks is not None:                # malicious mode: the messages' claims
        simple = mult is None and not any(sp for _, _, sp in segments)
        claimed = None                      # the fused form: its groups, the pair's sums
        if terms is not None and simple and not from_rss:
            claimed = dict(terms, groups=groups, pair_sum=pair_sum)
        p.checks.truncation(p, src, per, state, got2 if exact else None, plain_form=(
            simple and from_rss and plain is None and pair_sum is None and given is None),
            got=got, terms=claimed)
    if plain is not None:
        return AShare(a_out, b_out), AShare(plain, got[(NEXT, -1)][0])
    return SplitShare(a_out, b_out) if all(sp for _, _, sp in segments) else \
        AShare(a_out, b_out)
