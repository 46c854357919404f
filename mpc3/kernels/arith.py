"""Arithmetic kernels over Z_2^64: local linear ops, open, reshare, mul/matmul, truncation.

Multiplication is the replicated-sharing product of Araki et al. (CCS'16) as used by ABY3
and Privformer (Sec. 2.1, App. A): each party computes ``z_i = x_i y_i + x_i y_{i+1} +
x_{i+1} y_i`` locally (a 3-out-of-3 sharing), masks it with a zero sharing and reshares.

Fixed-point truncation is fused into that resharing through the *split form*: for the
elements of group ``g`` the single (role 0) keeps ``A = z_0`` and the pair (roles 1, 2)
exchange their parts so both know ``B = z_1 + z_2``; then ``x = A + B`` and

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

Masks come from the pairwise PRGs, are uniform, and every message is hidden from its
receiver by a key the receiver lacks; there is no setting that replaces them with constants.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import ring
from ..comm import NEXT, PREV
from ..party import Party
from ..shares import AShare, SplitShare
from . import fused
from .base import (Cost, Round, group_bounds, pack_by_width, unpack_by_width,
                   width_bytes, width_plan)

OFFSET_BITS = 62          # exact truncation is exact for |x| < 2^62
_ONE = np.uint64(1)


def product_limit(frac: int, extra: int = 0) -> float:
    """The one documented range of a truncated product (mul_aa/matmul_aa/mul_many_aa): a
    product (or matmul sum) of a ``frac``-bit and a ``frac + extra``-bit operand is exact
    while its real value satisfies |z| < product_limit(frac, extra) = 2^(62 - 2*frac - extra)
    (2^26 for frac = 18). Outside, in exact mode: up to twice the limit the truncation's
    2^62 offset no longer covers z (measured 13-37 % of results wrong), beyond that z wraps
    in the ring (~90 % wrong). In prob mode a product fails with probability
    ~|z| 2^(2*frac + extra - 64) at any size (2.3 % at |z| ~ 2^22.5, 19 % just below the
    limit), as the module docstring explains (tests/test_kernels_ranges.py)."""
    return 2.0 ** (OFFSET_BITS - 2 * frac - extra)


def _dir(my_role: int, other_role: int) -> int:
    return NEXT if (other_role - my_role) % 3 == 1 else PREV


def _u(v: int) -> np.uint64:
    return np.uint64(v % (1 << 64))


# ---------------------------------------------------------------- local operations ----
def add_public(p: Party, x: AShare, c: np.ndarray) -> AShare:
    """x + c for a public ring array c (added to slot 0). Cost: local."""
    c = ring.check_ring(np.asarray(c), "c")
    a, b = x.a, x.b
    if p.rank == 0:
        a = a + c
    elif p.rank == 2:
        b = b + c
    return AShare(np.broadcast_to(a, np.broadcast_shapes(a.shape, c.shape)).copy(),
                  np.broadcast_to(b, np.broadcast_shapes(b.shape, c.shape)).copy())


def public_share(p: Party, c: np.ndarray) -> AShare:
    """The trivial sharing (c, 0, 0) of a public ring array. Cost: local."""
    c = ring.check_ring(np.asarray(c), "c")
    zero = np.zeros_like(c)
    return AShare(c.copy() if p.rank == 0 else zero, c.copy() if p.rank == 2 else zero.copy())


def matmul_public(x: AShare, w: np.ndarray) -> AShare:
    """x @ W for a public ring matrix W (no truncation). Cost: local."""
    w = ring.check_ring(w, "W")
    return AShare(ring.matmul(x.a, w), ring.matmul(x.b, w))


# ---------------------------------------------------------------------- open ----------
def open_a(p: Party, x: AShare, to: int | None = None) -> np.ndarray | None:
    """Reconstruct x to every party (to=None) or to party ``to`` only.

    Each party misses slot i+2, which its next neighbour holds as its ``b``.
    Cost: 1 round; to all: 8 bytes per element per party; to one: 8 bytes per element,
    sent by the party after ``to``.
    """
    p.new_op()
    if to is None:
        got, _ = p.comm.exchange(to_prev=[x.b], from_next=True)
        return x.a + x.b + got[0]
    sender = (to + 1) % 3
    got, _ = p.comm.exchange(to_prev=[x.b] if p.rank == sender else None,
                             from_next=p.rank == to)
    return x.a + x.b + got[0] if p.rank == to else None


def cost_open_a(n: int, to: int | None = None) -> Cost:
    if to is None:
        return Cost.uniform(1, 8 * n)
    per = [0, 0, 0]
    per[(to + 1) % 3] = 8 * n
    return Cost(1, tuple(per))


# ------------------------------------------------------------------- reshare ----------
def reshare(p: Party, z: np.ndarray, tag: str = "reshare") -> AShare:
    """3-out-of-3 additive ``z`` (party i holds z_i) -> replicated sharing of sum(z).

    Party i masks with a zero sharing and sends z_i + alpha_i to party i-1.
    Cost: 1 round, 8 bytes per element per party.
    """
    z = ring.check_ring(z, "z")
    zi = z + p.zero_share(z.shape, tag)
    got, _ = p.comm.exchange(to_prev=[zi], from_next=True)
    return AShare(zi, got[0].reshape(z.shape))


def cost_reshare(n: int) -> Cost:
    return Cost.uniform(1, 8 * n)


# ------------------------------------------------------------ multiplication ----------
def _local_mul(x: AShare, y: AShare) -> np.ndarray:
    return x.a * (y.a + y.b) + x.b * y.a


def _local_matmul(x: AShare, y: AShare) -> np.ndarray:
    """x_i y_i + x_i y_{i+1} + x_{i+1} y_i, adding the halves of the smaller operand (a
    decoding step multiplies one row by a weight matrix)."""
    if x.size <= y.size:
        return ring.matmul(x.a + x.b, y.a) + ring.matmul(x.a, y.b)
    return ring.matmul(x.a, y.a + y.b) + ring.matmul(x.b, y.a)


def mul_aa(p: Party, x: AShare, y: AShare, trunc: bool | int = True) -> AShare:
    """Elementwise product of two shared arrays (Araki et al.; Privformer Pi_Mult).

    ``trunc``: True = truncate by cfg.frac (fixed-point), an int = truncate by that many
    bits, an array (broadcast to the output) = per-element shifts in the same rounds,
    False = no truncation (integer product).
    Cost: see :func:`cost_mul`; 1 element per party and output, 1 round without truncation.
    """
    if x.shape != y.shape:
        raise ValueError(f"mul_aa: shapes differ {x.shape} vs {y.shape}")
    p.new_op()
    return _finish(p, _local_mul(x, y), trunc)


def matmul_aa(p: Party, x: AShare, y: AShare, trunc: bool | int = True) -> AShare:
    """Matrix product of two shared matrices (batched like np.matmul) (Privformer Pi_MatMul).

    Communication depends on the output size only. Cost: :func:`cost_mul` of the output.
    """
    if x.shape[-1] != y.shape[-2 if len(y.shape) > 1 else 0]:
        raise ValueError(f"matmul_aa: inner dimensions differ {x.shape} @ {y.shape}")
    p.new_op()
    return _finish(p, _local_matmul(x, y), trunc)


def _item_product(x: AShare, y: AShare, kind: str, keep):
    """One item's local 3-out-of-3 product: (z, keep broadcast or None, kept entries flat)."""
    if kind == "mul" and x.shape != y.shape:
        raise ValueError(f"mul_many_aa: shapes differ {x.shape} vs {y.shape}")
    if kind == "matmul" and x.shape[-1] != y.shape[-2]:
        raise ValueError(f"mul_many_aa: inner dimensions differ {x.shape} @ {y.shape}")
    if kind not in ("mul", "matmul"):
        raise ValueError(f"mul_many_aa: unknown kind {kind!r}")
    z = _local_mul(x, y) if kind == "mul" else _local_matmul(x, y)
    keep = None if keep is None else np.broadcast_to(keep, z.shape)
    return z, keep, (z.reshape(-1) if keep is None else z[keep])


def mul_many_aa(p: Party, items: list[tuple]) -> list[AShare]:
    """Several independent products in the rounds of one: items ``(x, y, kind, trunc)``
    or ``(x, y, kind, trunc, keep)``; ``kind`` is "mul" (elementwise) or "matmul";
    ``trunc`` True/int (fixed-point shift) or False (plain reshare, riding the first round);
    ``keep`` is a public boolean mask: only kept outputs are reshared, the rest are 0.
    Cost: :func:`cost_mul_many`.
    """
    p.new_op()
    parts = {True: [], False: []}
    for item in items:
        trunc = item[3]
        z, keep, zk = _item_product(item[0], item[1], item[2], item[4] if len(item) > 4 else None)
        shift = None if trunc is False else (p.cfg.frac if trunc is True else trunc)
        parts[shift is not None].append((z.shape, keep, zk, shift))
    cut = [z for _, _, z, _ in parts[True]]
    flat_plain = np.concatenate([z for _, _, z, _ in parts[False]]) if parts[False] else None
    if cut:
        zt = np.concatenate(cut)
        zt = zt + p.zero_share(zt.shape, "mulmask")
        shifts = [s for _, _, _, s in parts[True]]
        if all(np.ndim(s) == 0 and s == shifts[0] for s in shifts):
            bits = int(shifts[0])                               # one shift for every item
        else:
            bits = np.concatenate([np.broadcast_to(np.asarray(s), z.shape).reshape(-1)
                                   for _, _, z, s in parts[True]])
        if flat_plain is not None:
            flat_plain = flat_plain + p.zero_share(flat_plain.shape, "plainmask")
            tr, pl = _trunc_split(p, zt, bits, from_rss=False, plain=flat_plain)
        else:
            tr, pl = _trunc_split(p, zt, bits, from_rss=False), None
    else:
        tr, pl = None, reshare(p, flat_plain, "plainmask")
    results, pos = {True: [], False: []}, {True: 0, False: 0}
    for key, flat in ((True, tr), (False, pl)):
        for shape, keep, z, _ in parts[key]:
            piece = flat[pos[key]:pos[key] + z.size]
            pos[key] += z.size
            if keep is None:
                results[key].append(piece.reshape(shape))
            else:
                a, b = np.zeros(shape, np.uint64), np.zeros(shape, np.uint64)
                a[keep], b[keep] = piece.a, piece.b
                results[key].append(AShare(a, b))
    order = {True: iter(results[True]), False: iter(results[False])}
    return [next(order[item[3] is not False]) for item in items]


def mul_split_aa(p: Party, items: list[tuple], trunc: bool | int = True,
                 replicated: list[tuple] | None = None):
    """Products ``(x, y, kind)`` or ``(x, y, kind, keep)`` (kind "mul" or "matmul"; ``keep``
    a public boolean mask: only kept outputs, in row-major order), truncated by ``trunc``,
    flattened and concatenated in item order, delivered in split form (:class:`SplitShare`)
    for a kernel that reads only that form - :func:`mpc3.kernels.convert.relu_a` of the
    whole result: the replicated sharing is never completed (8 bytes per element less than
    mul_many_aa). With ``replicated`` (a list, possibly empty) the result is
    ``(split, [outputs])``: those items come back completed, as AShares, from the same rounds
    and messages (the split ones keep their own element groups). Cost:
    :func:`cost_mul_split`."""
    p.new_op()

    zs = [_item_product(*it[:3], it[3] if len(it) > 3 else None) for it in items]
    zr = [_item_product(*it[:3], None) for it in replicated or []]
    z = np.concatenate([v for _, _, v in zs + zr])
    n_split = sum(v.size for _, _, v in zs)
    bits = p.cfg.frac if trunc is True else int(trunc)
    out = _trunc_split(p, z + p.zero_share(z.shape, "mulmask"), bits, from_rss=False,
                       split=True, segments=_segments(n_split, z.size - n_split))
    if replicated is None:
        return out
    cut = np.cumsum([n_split] + [v.size for _, _, v in zr])
    return SplitShare(out.a[:n_split], out.b[:n_split]), [
        AShare(out.a[i:j], out.b[i:j]).reshape(full.shape)
        for (full, _, _), i, j in zip(zr, cut, cut[1:])]


@functools.lru_cache(maxsize=256)
def _segments(n_split: int, n_rep: int) -> tuple[tuple[slice, int, bool], ...]:
    """(elements, role group, split?) of a mul_split_aa call: the split elements in the groups
    of their own count (what relu_a reads), then the replicated ones in theirs."""
    return tuple((sl, g, True) for g, sl in enumerate(group_bounds(n_split))) + tuple(
        (slice(n_split + sl.start, n_split + sl.stop), g, False)
        for g, sl in enumerate(group_bounds(n_rep)) if n_rep)


def cost_mul_split(n: int, trunc: bool | int, frac: int, mode: str, n_rep: int = 0) -> Cost:
    """mul_split_aa with ``n`` split and ``n_rep`` replicated outputs."""
    bits = frac if trunc is True else trunc
    return cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n + n_rep,)), mode,
                             from_rss=False, split=True, segments=_segments(n, n_rep))


def cost_mul_many(shifts, n_plain: int, mode: str) -> Cost:
    """mul_many_aa: ``shifts`` = the per-output shifts of the truncated items in item order
    (concatenated), plus ``n_plain`` plainly reshared outputs."""
    shifts = np.asarray(shifts).reshape(-1)
    if shifts.size == 0:
        return cost_reshare(n_plain)
    return cost_trunc_shifts(shifts, mode, from_rss=False) + Cost(0, (8 * n_plain,) * 3)


def cost_mul(n: int, trunc, frac: int, mode: str) -> Cost:
    """Rounds and bytes per party of mul_aa/matmul_aa with ``n`` output elements
    (``trunc``: True, False, a shift, or per-element shifts)."""
    if trunc is False:
        return cost_reshare(n)
    bits = frac if trunc is True else trunc
    return cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n,)), mode, from_rss=False)


def _finish(p: Party, z: np.ndarray, trunc) -> AShare:
    if trunc is False:
        return reshare(p, z)
    if trunc is True or np.ndim(trunc) == 0:                 # one shift: no per-element array
        bits = p.cfg.frac if trunc is True else int(trunc)
    else:
        bits = np.broadcast_to(np.asarray(trunc), z.shape).reshape(-1)
    z = z + p.zero_share(z.shape, "mulmask")
    return _trunc_split(p, z.reshape(-1), bits, from_rss=False).reshape(z.shape)


# ------------------------------------------------------------------ truncation ----------
def cost_trunc_shifts(shifts, mode: str, from_rss: bool, split: bool = False,
                      segments=None) -> Cost:
    """Exact cost of a truncation (fused or standalone) with per-element public shifts
    (``split``: delivered in split layout, :func:`mul_split_aa`; ``segments`` as there)."""
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
    return _trunc_split(p, flat, bits, from_rss=True).reshape(x.shape)


def cost_trunc(n: int, bits, mode: str) -> Cost:
    return cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n,)), mode, from_rss=True)


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


def _trunc_split(p: Party, src, bits, from_rss: bool, plain: np.ndarray | None = None,
                 split: bool = False, segments=None):
    """Core of fused/standalone truncation; ``src`` is z (3-of-3, flat) or a flat AShare.

    ``split``: stop at the split form (:class:`SplitShare`): role 0 keeps U and never sends
    it, so role 2's slot g stays 0 - 8 bytes per element less. ``segments``: (elements, role
    group, split?) triples instead of the three groups of ``n`` (mul_split_aa's mixed calls).

    ``bits`` is one shift for all elements or a per-element array (products of different
    scales then share the same rounds); each correction is packed at its own shift width.
    Output slots for group g (roles 0, 1, 2 hold slots (g, g+1), (g+1, g+2), (g+2, g)):
    slot g = U - kappa + X2', slot g+1 = kappa + X1', slot g+2 = W - nu', where U, W are
    the shifted pieces of role 0 and of the pair, and X1' + X2' - nu' = a_t*b_t*2^(64-f).
    """
    exact = p.cfg.trunc == "exact"
    n = src.a.size if from_rss else src.size
    segments = segments or _default_segments(n, split)
    groups = [sl for sl, _, _ in segments]
    if np.ndim(bits) != 0:
        bits = np.broadcast_to(np.asarray(bits, dtype=np.int64), (n,))
    per = [_group_shifts(bits, sl) for sl in groups]
    offset = _u(1 << OFFSET_BITS) if exact else np.uint64(0)

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
            st["Uk"], t = fused.single_split(src.a[sl] if from_rss else src[sl],
                                             src.b[sl] if from_rss else None,
                                             st["kappa"], rho, sh, low)
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
    got = r1.run()

    for g, st in enumerate(state):
        role = st["role"]
        if role == 0:
            continue
        sh, up, low, plan = per[g]
        # W = ((B + offset + 2^f - 1) >>a f) - (offset >> f) (+ 2^f - 1: unbiased rounding,
        # module doc), bt = top bit of B + offset + 2^f - 1, with B = z + the other's z
        st["W"], st["bt"] = fused.pair_split(
            st["B"] if from_rss else st["z"],
            None if from_rss else got[(_dir(role, 3 - role), g)][0],
            offset + low, sh, offset >> sh.view(np.uint64))
        if role == 2:
            split = st["split"]
            msg = got[(NEXT, g)] if (exact or not split) else ()
            st["s0"] = np.uint64(0) if split else msg[0]      # split: a slot nobody reads
            if exact:
                st["at_rho"] = unpack_by_width(msg[-1], plan, st["n"])

    if exact:   # Round 2: a_t*b_t = b_t*rho + b_t*(a_t - rho), masked towards role 0.
        r2 = Round(p)
        for g, st in enumerate(state):
            role, ng = st["role"], st["n"]
            sh, up, low, plan = per[g]
            if role == 0:
                r2.recv(NEXT, g, 1)
                r2.recv(PREV, g, 1)
                continue
            nu1, nu2 = p.rand_with_many(role, 3 - role, [(f"nu1{g}", ng), (f"nu2{g}", ng)])
            # W -= (nu1 + nu2) << (64 - f); x = (b_t * r + nu_own) & (2^f - 1)
            if role == 1:
                st["kappa"], rho = p.rand_with_many(1, 0, [(f"kappa{g}", ng), (f"rho{g}", ng)])
                x1, st["x1"] = fused.pair_round2(st["W"], st["bt"], rho, nu1, nu2, low, up)
                r2.send(PREV, pack_by_width(x1, plan))
            else:
                x2, x2s = fused.pair_round2(st["W"], st["bt"], st["at_rho"], nu2, nu1, low, up)
                st["s0"] = st["s0"] + x2s
                r2.send(NEXT, pack_by_width(x2, plan))
        got2 = r2.run()

    a_out = np.empty(n, dtype=np.uint64)
    b_out = np.empty(n, dtype=np.uint64)
    for g, (sl, st) in enumerate(zip(groups, state)):
        role = st["role"]
        sh, up, low, plan = per[g]
        if role == 0:
            if exact:
                fused.single_final(st["Uk"], st["kappa"],
                                   unpack_by_width(got2[(NEXT, g)][0], plan, st["n"]),
                                   unpack_by_width(got2[(PREV, g)][0], plan, st["n"]),
                                   up, a_out[sl], b_out[sl])
            else:
                a_out[sl], b_out[sl] = st["Uk"], st["kappa"]
        elif role == 1:
            kappa = st["kappa"] if exact else p.rand_with(1, 0, st["n"], f"kappa{g}")
            a_out[sl] = kappa + (st["x1"] if exact else 0)
            b_out[sl] = st["W"]
        else:
            a_out[sl] = st["W"]
            b_out[sl] = st["s0"]
    if plain is not None:
        return AShare(a_out, b_out), AShare(plain, got[(NEXT, -1)][0])
    return SplitShare(a_out, b_out) if all(sp for _, _, sp in segments) else \
        AShare(a_out, b_out)
