"""Arithmetic kernels over Z_2^64: local linear ops, open, reshare, mul/matmul, truncation.

Multiplication is the replicated-sharing product of Araki et al. (CCS'16) as used by ABY3
and Privformer (Sec. 2.1, App. A): each party computes ``z_i = x_i y_i + x_i y_{i+1} +
x_{i+1} y_i`` locally (a 3-out-of-3 sharing), masks it with a zero sharing and reshares.
A large matrix product splits those nine slot products among the parties by blocks of the
inner dimension instead: 5/3 of the multiply-adds (:func:`_local_matmul`).

Fixed-point truncation is fused into that resharing through the *split form*
(:mod:`mpc3.kernels.truncation`: exact by default, stochastic rounding).

Masks come from the pairwise PRGs, are uniform, and every message is hidden from its
receiver by a key the receiver lacks; there is no setting that replaces them with constants.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import ring
from ..comm import NEXT, PREV
from ..party import Party, profiled
from ..shares import AShare, SignedSplit, SplitShare
from . import checked, leaves, thresholds
from .base import Cost, Round, group_bounds, run_steps
from .truncation import (OFFSET_BITS, Scaled, cost_trunc_shifts, trunc_split,
                         trunc_steps)


def product_limit(frac: int, extra: int = 0) -> float:
    """The one documented range of a truncated product (mul_aa/matmul_aa/mul_many_aa): a
    product (or matmul sum) of a ``frac``-bit and a ``frac + extra``-bit operand is exact
    while its real value satisfies |z| < product_limit(frac, extra) = 2^(62 - 2*frac - extra)
    (2^26 for frac = 18). Outside, in exact mode: up to twice the limit the truncation's
    2^62 offset no longer covers z (measured 13-37 % of results wrong), beyond that z wraps
    in the ring (~90 % wrong). In prob mode a product fails with probability
    ~|z| 2^(2*frac + extra - 64) at any size (2.3 % at |z| ~ 2^22.5, 19 % just below the
    limit), as :mod:`mpc3.kernels.truncation` explains (tests/mpc3/test_kernels_ranges.py)."""
    return 2.0 ** (OFFSET_BITS - 2 * frac - extra)


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
    else:
        sender = (to + 1) % 3
        got, _ = p.comm.exchange(to_prev=[x.b] if p.rank == sender else None,
                                 from_next=p.rank == to)
    if p.checks is not None:                 # malicious mode: the other holder's digest
        p.checks.opened(p, x, None if got is None else got[0], to)
    if got is None:
        return None
    return x.a + x.b + got[0].reshape(x.shape)      # a 0-d value arrives as one element


def cost_open_a(n: int, cfg=None, to: int | None = None) -> Cost:
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
    zi = p.add_zero_share(z.copy(), tag)
    got, _ = p.comm.exchange(to_prev=[zi], from_next=True)
    return AShare(zi, got[0].reshape(z.shape))


def cost_reshare(n: int, cfg=None) -> Cost:
    return Cost.uniform(1, 8 * n)


# ------------------------------------------------------------ multiplication ----------
def _local_mul(x: AShare, y: AShare) -> np.ndarray:
    return x.a * (y.a + y.b) + x.b * y.a


#: The five-product form of :func:`_local_matmul` saves M K N / 3 multiply-adds per party
#: and costs the sums of one inner-dimension block of each operand, which stream from
#: memory; it is used from this many multiply-adds per element of the two operands, and
#: when every block has at least FIVE_MIN_K inner elements. Three parties' local terms,
#: ``python benchmarks/ring_matmul.py --local --reps 5``, five / two: ratio 109-122 (128
#: rows by GPT-2's weights, by 512 x 2048) 0.70-0.95, ratio 192-462 (256 and 512 rows)
#: 0.68-1.05; ratio 56-63 (64 rows by the Table 2 weights) 0.73-1.01 on the AMD machine of
#: 2026-11-28 (0.74-1.28 on an earlier one). The in-process Table 2 encoder takes 0.74 s
#: instead of 0.80 s with these in the five-product form (threshold 48 or 56 against 96, two
#: runs each, 8 % less CPU); a lower threshold, which adds the attention core's per-head
#: products (ratio 32), gains nothing more. A decoding step's one-row products stay in the
#: two-product form (ratio < 1).
FIVE_MIN_RATIO = 48
FIVE_MIN_K = 16


def k_blocks(K: int) -> tuple[slice, slice, slice]:
    """The three blocks of the inner dimension of :func:`_local_matmul`'s five-product form."""
    cuts = [K * j // 3 for j in range(4)]
    return tuple(slice(cuts[j], cuts[j + 1]) for j in range(3))


def five_product_form(x_shape: tuple, y_shape: tuple) -> bool:
    """Whether :func:`_local_matmul` cuts the inner dimension into three blocks (the parties'
    terms differ by block: a verifier needs to know which, mpc3.freivalds)."""
    K = x_shape[-1]
    if min(len(x_shape), len(y_shape)) < 2:                  # a vector operand
        return False
    shape = np.broadcast_shapes(x_shape[:-2], y_shape[:-2]) + (x_shape[-2], y_shape[-1])
    return not (K < 3 * FIVE_MIN_K
                or math.prod(shape) * K < FIVE_MIN_RATIO * (math.prod(x_shape)
                                                             + math.prod(y_shape)))


def _local_matmul(x: AShare, y: AShare, rank: int) -> np.ndarray:
    """Party ``rank``'s term of x y: a 3-out-of-3 sharing of the product.

    Two-product form: x_i y_i + x_i y_{i+1} + x_{i+1} y_i, adding the halves of the smaller
    operand (a decoding step multiplies one row by a weight matrix): 2 M K N multiply-adds
    per party.

    Five-product form (FIVE_MIN_RATIO multiply-adds per operand element): the inner
    dimension is cut into three blocks (:func:`k_blocks`) and in block j party j covers four
    of the nine slot products at once, (x_j + x_{j+1})(y_j + y_{j+1}); party j+1 covers
    (x_{j+1} + x_{j+2}) y_{j+2} + x_{j+2} y_{j+1} and party j+2 x_{j+2} y_j + x_j y_{j+2} -
    every slot product once. That is 5/3 M K N multiply-adds per party instead of 2 (a single product
    for every party would need the diagonal weights to be units of Z_2^64, and one of
    a, 1 - a is even), for the sums of one block of each operand. The zero sharing that
    masks the result makes any split of the nine products equally safe."""
    sum_x = x.size <= y.size
    if not five_product_form(x.shape, y.shape):      # added in place: a 0-d product (two
        if sum_x:                                    # vectors) stays an array
            z = ring.matmul(x.a + x.b, y.a)
            z += ring.matmul(x.a, y.b)
        else:
            z = ring.matmul(x.a, y.a + y.b)
            z += ring.matmul(x.b, y.a)
        return z
    K = x.shape[-1]
    shape = np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1])
    out = np.zeros(shape, dtype=np.uint64)
    for j, kb in enumerate(k_blocks(K)):
        xa, xb, ya, yb = x.a[..., kb], x.b[..., kb], y.a[..., kb, :], y.b[..., kb, :]
        role = (rank - j) % 3
        if role == 0:
            ring.matmul(xa + xb, ya + yb, out, K)
        elif role == 1 and sum_x:
            ring.matmul(xa + xb, yb, out, K)
            ring.matmul(xb, ya, out, K)
        elif role == 1:
            ring.matmul(xa, yb, out, K)
            ring.matmul(xb, ya + yb, out, K)
        else:
            ring.matmul(xa, yb, out, K)
            ring.matmul(xb, ya, out, K)
    return out


@profiled
def mul_aa(p: Party, x: AShare, y: AShare, trunc: bool | int = True,
           site: str | None = None) -> AShare:
    """Elementwise product of two shared arrays (Araki et al.; Privformer Pi_Mult).

    ``trunc``: True = truncate by cfg.frac (fixed-point), an int = truncate by that many
    bits, an array (broadcast to the output) = per-element shifts in the same rounds,
    a :class:`Scaled` = times public multipliers (broadcast to the output) in the same
    truncation (:func:`scaled`: a public real factor for free), False = no truncation
    (integer product).
    Cost: see :func:`cost_mul`; 1 element per party and output, 1 round without truncation.
    """
    if x.shape != y.shape:
        raise ValueError(f"mul_aa: shapes differ {x.shape} vs {y.shape}")
    if p.shadow is not None:
        return p.shadow.mul_aa(x, y, trunc, site)
    if p.checks is not None and trunc is not False:      # malicious mode: mpc3.kernels.checked
        return mul_many_aa(p, [(x, y, "mul", trunc)])[0]
    kop = p.new_op()
    out = _finish(p, _local_mul(x, y), trunc)
    if p.checks is not None:                 # malicious mode: the message's claim
        p.checks.product(p, x, y, out, trunc, kop)
    return out


@profiled
def matmul_aa(p: Party, x: AShare, y: AShare, trunc: bool | int = True,
              site: str | None = None) -> AShare:
    """Matrix product of two shared matrices (batched like np.matmul) (Privformer Pi_MatMul).

    Communication depends on the output size only. Cost: :func:`cost_mul` of the output.
    """
    if x.shape[-1] != y.shape[-2 if len(y.shape) > 1 else 0]:
        raise ValueError(f"matmul_aa: inner dimensions differ {x.shape} @ {y.shape}")
    if p.shadow is not None:
        return p.shadow.matmul_aa(x, y, trunc, site)
    if p.checks is not None and trunc is not False:      # malicious mode: mpc3.kernels.checked
        return mul_many_aa(p, [(x, y, "matmul", trunc)])[0]
    kop = p.new_op()
    out = _finish(p, _local_matmul(x, y, p.rank), trunc)
    if p.checks is not None:                 # malicious mode: the message's claim
        p.checks.matmul(p, x, y, out, trunc, kop)
    return out


def _item_product(x: AShare, y: AShare, kind: str, keep, rank: int):
    """One item's local 3-out-of-3 product: (z, keep broadcast or None, kept entries flat)."""
    if kind == "mul" and x.shape != y.shape:
        raise ValueError(f"mul_many_aa: shapes differ {x.shape} vs {y.shape}")
    if kind == "matmul" and x.shape[-1] != y.shape[-2 if len(y.shape) > 1 else 0]:
        raise ValueError(f"mul_many_aa: inner dimensions differ {x.shape} @ {y.shape}")
    if kind not in ("mul", "matmul"):
        raise ValueError(f"mul_many_aa: unknown kind {kind!r}")
    z = _local_mul(x, y) if kind == "mul" else _local_matmul(x, y, rank)
    keep = None if keep is None else np.broadcast_to(keep, z.shape)
    return z, keep, (z.reshape(-1) if keep is None else z[keep])


@profiled
def mul_many_aa(p: Party, items: list[tuple], sites: list | None = None) -> list[AShare]:
    """Several independent products in the rounds of one: items ``(x, y, kind, trunc)``
    or ``(x, y, kind, trunc, keep)``; ``kind`` is "mul" (elementwise) or "matmul";
    ``trunc`` True/int (fixed-point shift) or False (plain reshare, riding the first round);
    ``keep`` is a public boolean mask: only kept outputs are reshared, the rest are 0.
    ``sites``: the calibration site of each item (a shadow party's records, mpc3.shadow).
    Cost: :func:`cost_mul_many`; malicious mode: :func:`checked.cost_checked`.
    """
    if p.shadow is not None:
        return p.shadow.mul_many_aa(items, sites)
    return run_steps(p, mul_many_steps(p, items))[0]


def mul_many_steps(p: Party, items: list[tuple], sites: list | None = None):
    """:func:`mul_many_aa` as lockstep steps (:func:`base.lockstep`)."""
    if p.shadow is not None:               # no rounds: done at the first step
        return p.shadow.mul_many_aa(items, sites)
    if p.checks is not None:               # malicious mode: verified products, then truncation
        return (yield from checked.many_steps(p, items, _item_product))
    p.new_op()
    parts, (zt, flat_plain), mults = _many_products(p, items)
    if flat_plain is not None:
        p.add_zero_share(flat_plain, "plainmask")                  # fresh: in place
    if zt is not None:
        p.add_zero_share(zt, "mulmask")
        shifts = [s for _, _, _, s in parts[True]]
        if all(np.ndim(s) == 0 and s == shifts[0] for s in shifts):
            bits = int(shifts[0])                               # one shift for every item
        else:
            bits = np.concatenate([np.broadcast_to(np.asarray(s), (size,))
                                   for _, _, size, s in parts[True]])
        got = yield from trunc_steps(p, zt, bits, from_rss=False, plain=flat_plain,
                                     mult=_mult_array(parts[True], mults))
        tr, pl = got if flat_plain is not None else (got, None)
    else:
        r = Round(p)
        r.send(PREV, flat_plain)
        r.recv(NEXT, 0, 1)
        tr, pl = None, AShare(flat_plain, (yield r)[(NEXT, 0)][0])
    results, pos = {True: [], False: []}, {True: 0, False: 0}
    for key, flat in ((True, tr), (False, pl)):
        for shape, keep, size, _ in parts[key]:
            piece = flat[pos[key]:pos[key] + size]
            pos[key] += size
            if keep is None:
                results[key].append(piece.reshape(shape))
            else:
                a, b = np.zeros(shape, np.uint64), np.zeros(shape, np.uint64)
                a[keep], b[keep] = piece.a, piece.b
                results[key].append(AShare(a, b))
    order = {True: iter(results[True]), False: iter(results[False])}
    return [next(order[item[3] is not False]) for item in items]


def _many_products(p: Party, items: list[tuple]):
    """mul_many's local products: per kind (truncated True, plain False) the items'
    ``(shape, keep, size, shift)``; the kept products of each kind concatenated (None if
    none); the Scaled items' ``(index among the truncated, multipliers)``. The items' own
    product arrays end here, not in the steps generator's frame (the widest step's memory)."""
    parts, flat, mults = {True: [], False: []}, {True: [], False: []}, []
    for item in items:
        trunc = item[3]
        z, keep, zk = _item_product(item[0], item[1], item[2],
                                    item[4] if len(item) > 4 else None, p.rank)
        shift = None if trunc is False else (p.cfg.frac if trunc is True else trunc)
        if isinstance(shift, Scaled):
            mults.append((len(parts[True]), shift.mult))
            shift = shift.shift
        parts[shift is not None].append((z.shape, keep, zk.size, shift))
        flat[shift is not None].append(zk)
    cat = tuple(np.concatenate(flat[k]) if flat[k] else None for k in (True, False))
    return parts, cat, mults


def _mult_array(parts: list[tuple], mults: list[tuple]) -> np.ndarray | None:
    """Per-element multipliers of mul_many's truncated items (1 for unscaled items), None
    if no item is :class:`Scaled`."""
    if not mults:
        return None
    per = [np.ones(1, np.uint64)] * len(parts)
    for i, m in mults:
        per[i] = np.asarray(m, dtype=np.uint64)
    return np.concatenate([np.broadcast_to(m, shape)[keep].reshape(-1) if keep is not None
                           else np.broadcast_to(m, shape).reshape(-1)
                           for m, (shape, keep, _, _) in zip(per, parts)])


@profiled
def mul_split_aa(p: Party, items: list[tuple], trunc: bool | int = True,
                 replicated: list[tuple] | None = None, biases: list | None = None,
                 sites: list | None = None):
    """Products ``(x, y, kind)`` or ``(x, y, kind, keep)`` (kind "mul" or "matmul"; ``keep``
    a public boolean mask: only kept outputs, in row-major order), truncated by ``trunc``,
    plus ``biases`` (per item None or a replicated share broadcast to the item's output),
    flattened and concatenated in item order, delivered in split form for
    :func:`mpc3.kernels.convert.relu_a` of the whole result, which reads only that form: the
    replicated sharing is never completed (8 bytes per element less than mul_many_aa).

    The ReLU's comparison with 0 starts in the products' own two rounds, on the untruncated
    values (the pair's sum from the truncation's first round is the comparison's B;
    :func:`base.run_steps`): on few elements (:func:`thresholds.dealt_carry`) the whole
    two-round comparison, so relu_a only injects (2 rounds instead of 4), else the DReLU's
    leaves (:mod:`mpc3.kernels.leaves`), so relu_a runs the carry tree and the injection (2
    rounds fewer). The result is then a :class:`SignedSplit`; a plain :class:`SplitShare` when
    the shifted window would leave the ring. With ``replicated`` (a list, possibly empty) the result is
    ``(split, [outputs])``: those items come back completed, as AShares, from the same rounds
    and messages (the split ones keep their own element groups). Cost:
    :func:`cost_mul_split`. ``sites``: per item, then per replicated item (mpc3.shadow).
    Malicious mode: the same kernel, every output completed, with the fused form's claims
    (``cost_mul_split(..., malicious=True)``); items :func:`checked.fusable` refuses (a
    masked matrix product) give AShares without the sign (:func:`checked.cost_checked`)."""
    if p.shadow is not None:
        return p.shadow.mul_split_aa(items, trunc, replicated, biases, sites)
    every = [(*it[:3], trunc, it[3] if len(it) > 3 else None) for it in items] + \
        [(*it[:3], trunc, None) for it in replicated or []]
    if p.checks is not None and not checked.fusable(every):   # malicious mode, unfused
        return checked.split_checked(p, items, trunc, replicated, biases, _item_product)
    kop = p.new_op()
    malicious = p.checks is not None       # replicated outputs, the fused form's claims
    zs = [_item_product(*it[:3], it[3] if len(it) > 3 else None, p.rank) for it in items]
    zr = [_item_product(*it[:3], None, p.rank) for it in replicated or []]
    bits = p.cfg.frac if trunc is True else int(trunc)
    z = np.concatenate([v for _, _, v in zs + zr])
    terms = checked.split_terms(every, [v.size for _, _, v in zs + zr], kop) \
        if malicious else None
    # past here only the items' shapes: their products go (the widest step's memory)
    zs = [(full.shape, keep, v.size) for full, keep, v in zs]
    zr = [(full.shape, keep, v.size) for full, keep, v in zr]
    n_split = sum(size for _, _, size in zs)
    pos = 0
    for (shape, keep, size), b in zip(zs, biases or [None] * len(zs)):
        if b is not None:                   # slot a of the bias: a 3-of-3 share, pre-shifted
            slot_a = _bias_z(shape, keep, b, bits)
            z[pos:pos + size] += slot_a
            if malicious:                   # both slots, for the products' claims
                checked.bias_slots(terms, z.size, pos, slot_a,
                                   _bias_z(shape, keep, AShare(b.b, b.a), bits))
        pos += size
    p.add_zero_share(z, "mulmask")                        # fresh: in place
    segs = _segments(n_split, z.size - n_split, split=not malicious)
    win = split_sign_window(p.cfg, n_split, bits)
    if win is not None:
        pair = np.empty(n_split, dtype=np.uint64)     # filled by the truncation's round 1
        mine = AShare(z[:n_split], np.broadcast_to(np.uint64(0), (n_split,)))  # role 0: A = z
        sign = thresholds.compare_steps(p, mine, np.zeros(1, np.uint64), win, pair_b=pair) \
            if thresholds.dealt_carry(n_split) else \
            leaves.leaves_steps(p, mine, *win, pair_b=pair)
        out, sign = run_steps(p, trunc_steps(p, z, bits, False, split=not malicious,
                                             segments=segs, pair_sum=pair, terms=terms), sign)
        split = SignedSplit(out.a[:n_split], out.b[:n_split], sign)
    else:
        out = run_steps(p, trunc_steps(p, z, bits, False, split=not malicious,
                                       segments=segs, terms=terms))[0]
        split = (AShare if malicious else SplitShare)(out.a[:n_split], out.b[:n_split])
    if replicated is None:
        return split
    cut = np.cumsum([n_split] + [size for _, _, size in zr])
    return split, [AShare(out.a[i:j], out.b[i:j]).reshape(shape)
                   for (shape, _, _), i, j in zip(zr, cut, cut[1:])]


def _bias_z(shape: tuple, keep, b: AShare, shift: int) -> np.ndarray:
    """This party's 3-of-3 share of a bias at the product's scale (its slot a, << shift),
    over the kept outputs of an item of ``shape``."""
    v = np.broadcast_to(b.a, shape)
    return (v[keep] if keep is not None else v.reshape(-1)) << np.uint64(shift)


@functools.lru_cache(maxsize=256)
def _segments(n_split: int, n_rep: int,
              split: bool = True) -> tuple[tuple[slice, int, bool], ...]:
    """(elements, role group, split?) of a mul_split_aa call: the split elements in the groups
    of their own count (what relu_a reads), then the replicated ones in theirs (``split``
    False: malicious mode, whose split elements are completed too)."""
    return tuple((sl, g, split) for g, sl in enumerate(group_bounds(n_split))) + tuple(
        (slice(n_split + sl.start, n_split + sl.stop), g, False)
        for g, sl in enumerate(group_bounds(n_rep)) if n_rep)


def split_sign_window(cfg, n: int, trunc: bool | int) -> tuple[int, int] | None:
    """The DReLU window when mul_split_aa on ``n`` split outputs takes their sign (or, past
    ROUND_LEAN_ELEMENTS, its leaves) in its own rounds - whenever the shifted window stays
    inside the ring -, else None."""
    bits = cfg.frac if trunc is True else int(trunc)
    win = thresholds.sign_window(cfg, bits)
    return win if n and win is not None else None


def cost_mul_split(n: int, cfg, trunc: bool | int = True, n_rep: int = 0,
                   malicious: bool = False) -> Cost:
    """mul_split_aa with ``n`` split and ``n_rep`` replicated outputs (``cfg``: the
    RingConfig), the sign's comparison included when it rides along; ``malicious``: its
    fused route in malicious mode (every output completed, the comparison's blocks those of
    malicious mode)."""
    bits = cfg.frac if trunc is True else trunc
    cost = cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n + n_rep,)), cfg.trunc,
                             from_rss=False, split=not malicious,
                             segments=_segments(n, n_rep, split=not malicious))
    win = split_sign_window(cfg, n, trunc)
    if win is None:
        return cost
    return Cost.parallel(cost, thresholds.cost_compare_public(n, 1, *win, malicious)
                         if thresholds.dealt_carry(n) else leaves.leaf_cost(n, *win)[0])


def cost_mul_many(shifts, n_plain: int, mode: str) -> Cost:
    """mul_many_aa: ``shifts`` = the per-output shifts of the truncated items in item order
    (concatenated), plus ``n_plain`` plainly reshared outputs."""
    shifts = np.asarray(shifts).reshape(-1)
    if shifts.size == 0:
        return cost_reshare(n_plain)
    return cost_trunc_shifts(shifts, mode, from_rss=False) + Cost(0, (8 * n_plain,) * 3)


def cost_mul(n: int, cfg, trunc=True) -> Cost:
    """Rounds and bytes per party of mul_aa/matmul_aa with ``n`` output elements
    (``trunc``: True, False, a shift, or per-element shifts)."""
    if trunc is False:
        return cost_reshare(n)
    bits = cfg.frac if trunc is True else trunc
    return cost_trunc_shifts(np.broadcast_to(np.asarray(bits), (n,)), cfg.trunc, from_rss=False)


def _finish(p: Party, z: np.ndarray, trunc) -> AShare:
    if trunc is False:
        return reshare(p, z)
    mult = None
    if isinstance(trunc, Scaled):
        trunc, mult = trunc.shift, np.broadcast_to(trunc.mult, z.shape).reshape(-1)
    if trunc is True or np.ndim(trunc) == 0:                 # one shift: no per-element array
        bits = p.cfg.frac if trunc is True else int(trunc)
    else:
        bits = np.broadcast_to(np.asarray(trunc), z.shape).reshape(-1)
    p.add_zero_share(z, "mulmask")               # a fresh local product: in place
    return trunc_split(p, z.reshape(-1), bits, from_rss=False, mult=mult).reshape(z.shape)


