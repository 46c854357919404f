"""Comparison and bit injection: msb_a, drelu_a, relu_a, b2a, mul_ab, select_ab.

DReLU (Privformer Sec. 2.1, DReLU(0) = 1) is the sign of ``x = A + B`` in the split form of
the role groups (role 0 knows ``A = x_g + x_{g+1}``, roles 1 and 2 know ``B = x_{g+2}``):

1. Window. With |x| < 2^K (K = frac + relu_bound_bits) only bits [L, L+m) of A and of
   B + 2^L matter, m = K - L + 2, L = relu_drop_bits: the sign of ``(A>>L) + ((B+2^L)>>L)``
   mod 2^m equals DReLU(x) except for x in [-2^L, 0) ulp, where either answer may come out
   (x >= 0 is always exact). ReLU's error is therefore below 2^L ulp.
2. Leaves without AND gates (:mod:`mpc3.kernels.leaves`). The carry into the top window bit
   is computed over 3-bit blocks (wider for calls on few elements, to save a tree level:
   ``leaves.leaf_blocks``). Role 0 knows its block value ``a_j`` and sends the *thermometer code*
   ``[a_j >= v]`` (v = 1..7), masked, to role 2 (its mask comes from the PRG it shares with
   role 1). Since ``b_j`` is public to the pair, the block's generate ``G_j = [a_j >= 8-b_j]``
   and propagate ``P_j = [a_j = 7-b_j]`` are each one or two entries of that code selected by
   ``b_j``: the pair obtains XOR shares locally and reshares them to role 0 (one bit each).
   Cost: 7 bits per block from role 0 plus 2 bits per leaf value, instead of the ~21 bits of
   AND gates a bitwise adder spends per 3 bits.
3. Tree. ``(G, P) o (G', P') = (G ^ P&G', P&P')`` over the blocks, all nodes of a level in one
   round; the lowest node never needs P. Depth ceil(log2(#blocks)). A masked DReLU on few
   elements (:func:`dealt_carry`) instead takes :mod:`mpc3.kernels.thresholds` (leaves and
   the whole carry in 2 rounds, role 0 dealing the carry's mask products).
4. Fused injection (relu_a, select_ab, mul_ab): with the bit as ``d = u ^ beta`` (u known to
   role 0, beta to the pair), ``d*x = u*A + beta*V + u*(s*B) + beta*B`` where
   ``V = (1-2u) A`` and ``s = 1-2 beta``. Role 0 sends V and u masked to role 1 and u*A masked
   to role 2; the pair computes additive shares of the rest locally and reshares to role 0.
   relu_a consumes the last AND gate's 3-out-of-3 output directly (the pair swaps one bit),
   saving a round. Cost: 3 ring elements from role 0, one from each of roles 1 and 2.

Every message is masked by PRG output shared by the sender and the third party.
"""
from __future__ import annotations

import functools

import numpy as np

from ..comm import NEXT, PREV
from ..party import Party, profiled
from ..shares import AShare, BShare, SignedSplit, SplitShare, group_sizes, words
from . import arith
from .arith import public_share
from . import fused
from .base import Cost, Round, group_bounds, packed_bytes, run_steps
from . import thresholds
from .thresholds import dealt_carry, window, window_for
from .bitplanes import MaskedBits, run_span
from .boolean import (and_local, and_steps, cost_and_bb, pack_planes, random_planes,
                      unpack_planes)
from .leaves import ands_per_level, leaf_cost, leaves_steps, tree_plan



def relu_limit(cfg) -> float:
    """The one documented range of drelu_a/relu_a/msb_a (real units): |x| < 2^relu_bound_bits
    (2^14 by default); inside it the result is exact outside the error region [-2^drop, 0)
    ulp. The window keeps one bit of margin (signs still right below 2^(bound+1) - 2^-8 for
    the defaults); on [2^(bound+1), 2^(bound+2)) every sign is wrong, beyond it about half
    (tests/mpc3/test_kernels_ranges.py). select_ab/mul_ab/b2a have no range (exact injection)."""
    return 2.0 ** cfg.relu_bound_bits


def _bits_u64(planes: np.ndarray, n: int) -> np.ndarray:
    """A (1, words(n)) plane of one group -> uint64 array of its n bits (0 or 1)."""
    return np.unpackbits(np.ascontiguousarray(planes).view(np.uint8), axis=1,
                         bitorder="little")[0, :n].astype(np.uint64)


# -------------------------------------------------------------------------- tree ------
def _carry(p: Party, leaves: BShare, nb: int, fused: bool):
    """Carry into the top window bit. Returns an RSS BShare, or (fused) this party's
    masked 3-out-of-3 share of the last node's G xor the leaves' c: the DReLU bit."""
    return run_steps(p, _carry_steps(p, leaves, nb, fused))[0]


def _carry_steps(p: Party, leaves: BShare, nb: int, fused: bool):
    """:func:`_carry` as lockstep steps: one AND layer per round."""
    G = [leaves[1 + j] for j in range(nb)]
    P = [None] + [leaves[nb + 1 + j] for j in range(nb - 1)]
    levels = tree_plan(nb)
    for li, lvl in enumerate(levels):
        left = [P[hi] for hi, lo, need in lvl for _ in range(2 if need else 1)]
        right = [x for hi, lo, need in lvl for x in ((G[lo], P[lo]) if need else (G[lo],))]
        xs, ys = BShare.stack(left), BShare.stack(right)
        last = li == len(levels) - 1
        if last and fused:
            z = and_local(p, xs, ys, f"tree{li}") ^ G[lvl[0][0]].a ^ leaves[0].a
            if p.checks is not None:        # malicious mode: the claims of its use
                p.checks.fused_and(p, z, {"x": xs, "y": ys, "lin": G[lvl[0][0]] ^ leaves[0],
                                          "tag": f"tree{li}", "kop": p.kop})
            return z
        prod = yield from and_steps(p, xs, ys, f"tree{li}")
        newG, newP, pos = [], [], 0
        for hi, lo, need in lvl:
            newG.append(G[hi] ^ prod[pos])
            newP.append(prod[pos + 1] if need else None)
            pos += 2 if need else 1
        if len(G) % 2:
            newG.append(G[-1])
            newP.append(P[-1])
        G, P = newG, newP
    if fused:   # a single block: mask slot values into a fresh 3-out-of-3 sharing
        shape = G[0].a.shape
        alpha = random_planes(p, "next", *shape, "one") ^ random_planes(p, "prev", *shape, "one")
        return G[0].a ^ leaves[0].a ^ alpha
    return G[0]


def _drelu_bits(p: Party, x: AShare, exact: bool, fused: bool, win=None):
    L, m = win or window(p, exact)
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))
    if fused:
        return run_steps(p, _drelu_masked_steps(p, flat, L, m))[0], flat
    return sign_of_leaves(p, *run_steps(p, leaves_steps(p, flat, L, m))[0], False), flat


def sign_of_leaves(p: Party, leaves: BShare, nb: int, fused: bool):
    """DReLU from its leaves (:mod:`mpc3.kernels.leaves`): c ^ the carry - an RSS BShare,
    or (fused) this party's masked 3-out-of-3 planes for the injection."""
    carry = _carry(p, leaves, nb, fused)
    return carry if fused else carry ^ leaves[0]


def _drelu_masked_steps(p: Party, flat: AShare, L: int, m: int):
    """The fused DReLU bits of ``flat`` as lockstep steps (:func:`drelu_masked_steps`),
    after its ``p.new_op()``: the same kernel counters as the blocking form, whose nested
    kernels run in ``run_steps`` (each restores the caller's counter when it ends)."""
    outer = p.kop
    if dealt_carry(flat.size):                 # few elements: 2 rounds instead of 4
        zero = np.zeros(1, dtype=np.uint64)
        bits = yield from thresholds.compare_steps(p, flat, zero, (L, m))
        p.kop = outer
        return bits.planes
    leaves, nb = yield from leaves_steps(p, flat, L, m)
    p.kop = outer
    return (yield from _carry_steps(p, leaves, nb, True))


def drelu_a(p: Party, x: AShare, exact: bool = False,
            win: tuple[int, int] | None = None, site: str | None = None) -> BShare:
    """DReLU(x) = [x >= 0] as a replicated boolean sharing (one plane).

    ``exact=True`` uses the full 64-bit window (no magnitude bound, no error region);
    ``win=(L, m)`` sets the window explicitly (|x| < 2^(L+m-2), error region [-2^L, 0)).
    Cost: :func:`cost_drelu`.
    """
    if p.shadow is not None:
        return p.shadow.drelu_a(x, site)
    p.new_op()
    bits, _ = _drelu_bits(p, x, exact, fused=False, win=win)
    return bits


def msb_a(p: Party, x: AShare, exact: bool = False) -> BShare:
    """Sign bit [x < 0] = 1 ^ DReLU(x) (the XOR with 1 is local). Cost: :func:`cost_msb`."""
    d = drelu_a(p, x, exact)
    one = np.uint64(0xFFFFFFFFFFFFFFFF)
    if p.rank == 0:
        return BShare(d.a ^ one, d.b, d.n)
    if p.rank == 2:
        return BShare(d.a, d.b ^ one, d.n)
    return d


def cost_msb(n: int, cfg, win: tuple[int, int] | None = None) -> Cost:
    return cost_drelu(n, cfg, win=win)


# --------------------------------------------------------------------- injection ------
def _inject(p: Party, x: AShare, bit, from_masked: bool, seg: int = 0) -> AShare:
    """d * x for a bit d given as RSS BShare (``from_masked=False``) or as this party's
    masked 3-out-of-3 planes (``from_masked=True``, the pair swaps its halves).

    ``x`` has shape (n,) or (n, c): bit e multiplies the c values of row e. ``seg`` > 0
    (x of shape (n,)): only the sums over consecutive runs of ``seg`` products are wanted
    (a table lookup): the resharing messages carry one sum per run and group."""
    return run_steps(p, inject_steps(p, x, bit, from_masked, seg))[0]


def inject_steps(p: Party, x: AShare, bit, from_masked: bool, seg: int = 0):
    """:func:`_inject` as lockstep steps (:func:`base.lockstep`)."""
    p.new_op()
    n = x.shape[0]
    r1, st = Round(p), []
    for g, (sl, wsl) in enumerate(zip(group_bounds(n), _word_bounds(n))):
        role, ng = p.role(g), sl.stop - sl.start
        fold = functools.partial(_run_sums, sl=sl, seg=seg) if seg else (lambda v: v)
        s = {"role": role, "n": ng, "fold": fold}
        if role == 0:
            e = bit[:, wsl] if from_masked else bit.a[:, wsl] ^ bit.b[:, wsl]
            u = _bits_u64(e, ng)
            shp = x.a[sl].shape
            rho1, rho2 = p.rand_with_many(0, 2, [(f"r1{g}", shp), (f"r2{g}", shp)])
            s["kappa"] = p.rand_with(0, 1, shp, f"k{g}")
            # A = x_g + x_{g+1}: m1 = A - 2 u A - rho1, m2 = u - rho2, s0 = u A - kappa
            m1, m2, s0 = fused.inject_single(x.a[sl], x.b[sl], u, s["kappa"], rho1, rho2)
            s["s0"] = fold(s0)
            s.update(m1=m1, m2=m2, rho1=rho1, rho2=rho2)
            r1.send(NEXT, m1, m2)                                   # to role 1
            r1.send(PREV, s["s0"])                                  # to role 2
        else:
            other = NEXT if role == 1 else PREV
            if from_masked:
                s["e"] = bit[:, wsl]
                r1.send(other, pack_planes(s["e"], ng))
                r1.recv(other, g, 1)
            else:
                s["beta"] = _bits_u64((bit.b if role == 1 else bit.a)[:, wsl], ng)
            r1.recv(PREV if role == 1 else NEXT, g, 2 if role == 1 else 1)
        st.append(s)
    got = yield r1

    shape = (n // seg,) if seg else x.shape
    a_out = (np.zeros if seg else np.empty)(shape, dtype=np.uint64)
    b_out = (np.zeros if seg else np.empty)(shape, dtype=np.uint64)
    r2 = Round(p)
    for g, (sl, s) in enumerate(zip(group_bounds(n), st)):
        role, ng = s["role"], s["n"]
        if role == 0:
            r2.recv(NEXT, g, 1)
            r2.recv(PREV, g, 1)
            continue
        other = NEXT if role == 1 else PREV
        if from_masked:
            s["beta"] = _bits_u64(s["e"] ^ unpack_planes(got[(other, g)][0], ng, (p, other)), ng)
        beta = s["beta"]                                     # one bit per row
        B = x.b[sl] if role == 1 else x.a[sl]
        shp = B.shape
        tau1, tau2 = p.rand_with_many(role, 3 - role, [(f"t1{g}", shp), (f"t2{g}", shp)])
        # sB = B - 2 beta B; role 1: y = beta V + u sB + beta B - tau1, s1 = kappa + y;
        # role 2: y = beta rho1 + rho2 sB - tau2, s0 = (u A - kappa) + y; s2 = tau1 + tau2
        fold = s["fold"]
        # without runs to sum, the pair's output slots are written in place: role 1 holds
        # (s1, s2), role 2 (s2, s0)
        dst = None if seg else ((a_out[sl], b_out[sl]) if role == 1 else (b_out[sl], a_out[sl]))
        if role == 1:
            V, u = got[(PREV, g)]
            kappa = p.rand_with(1, 0, shp, f"k{g}")
            y, s1, s2 = fused.inject_pair(B, beta, V, u, tau1, tau2, kappa, True, dst)
            s.update(m1=V, m2=u, kappa=kappa)
        else:
            rho1, rho2 = p.rand_with_many(2, 0, [(f"r1{g}", shp), (f"r2{g}", shp)])
            s0 = got[(NEXT, g)][0]
            y, s0y, s2 = fused.inject_pair(B, beta, rho1, rho2, tau2, tau1,
                                           np.zeros_like(B) if seg else s0, False, dst)
            s.update(s0=s0, rho1=rho1, rho2=rho2)
        s.update(y=y, tau1=tau1, tau2=tau2)
        if seg:                                 # this party's slots' run sums, added below
            s["ab"] = (fold(s1), fold(s2)) if role == 1 else (fold(s2), fold(s0y) + s0)
        r2.send(PREV if role == 1 else NEXT, fold(y))
    got2 = yield r2
    if p.checks is not None:                # malicious mode: the messages' claims
        p.checks.injection(p, x, bit, st, got2, from_masked, seg)

    for g, (sl, s) in enumerate(zip(group_bounds(n), st)):
        if not seg:                             # the pair's slots: written by inject_pair
            if s["role"] == 0:
                np.add(s["s0"], got2[(PREV, g)][0], out=a_out[sl])
                np.add(s["kappa"], got2[(NEXT, g)][0], out=b_out[sl])
            continue
        if s["role"] == 0:
            a, b = s["s0"] + got2[(PREV, g)][0], s["fold"](s["kappa"]) + got2[(NEXT, g)][0]
        else:
            a, b = s["ab"]
        sl = run_span(sl, seg)                  # a run may straddle groups: add the parts
        a_out[sl] += a
        b_out[sl] += b
    return AShare(a_out, b_out)


def _run_sums(v: np.ndarray, sl: slice, seg: int) -> np.ndarray:
    """Sums of a group's values (elements ``sl`` of the flat layout) over each run of
    ``seg`` consecutive elements it touches."""
    if v.size == 0:
        return v
    starts = _run_starts(sl.start, sl.stop, seg)
    if starts.size == 1:                    # one run (a decoding step's table lookup)
        return v.sum(dtype=np.uint64, keepdims=True)
    return np.add.reduceat(v, starts)


@functools.lru_cache(maxsize=1024)
def _run_starts(start: int, stop: int, seg: int) -> np.ndarray:
    """Offsets (from ``start``) where the runs of ``seg`` elements begin in [start, stop)."""
    first = (-start) % seg
    idx = np.arange(first, stop - start, seg)
    return idx if first == 0 else np.concatenate([[0], idx])


def _word_bounds(n: int) -> list[slice]:
    out, start = [], 0
    for m in group_sizes(n):
        out.append(slice(start, start + words(m)))
        start += words(m)
    return out


def cost_inject(n: int, cfg=None, fused: bool = False, cols: int = 1, seg: int = 0) -> Cost:
    """:func:`_inject` on ``n`` bits (``cols`` values each; ``seg``: summed runs)."""
    per = [0, 0, 0]
    for g, sl in enumerate(group_bounds(n)):
        ng = sl.stop - sl.start
        span = run_span(sl, seg) if seg else None
        out = span.stop - span.start if seg else ng * cols
        for rank in range(3):
            role = (rank - g) % 3
            per[rank] += (16 * ng * cols + 8 * out if role == 0
                          else 8 * out + (packed_bytes(ng, 1) if fused else 0))
    return Cost(2, tuple(per))


# ------------------------------------------------------------------ public kernels ----
@profiled
def relu_a(p: Party, x: AShare | SplitShare, site: str | None = None) -> AShare:
    """ReLU(x) = DReLU(x) * x with the injection fused onto the last AND layer. ``x`` may be
    a :class:`SplitShare` straight from mul_split_aa (the whole array: its element groups
    are this call's): the comparison's leaves and the injection read only A and B; a
    :class:`SignedSplit` already carries its sign bits, so only the injection runs.

    Inputs must satisfy |x| < 2^(frac + relu_bound_bits); output error < 2^relu_drop_bits
    ulp, only for inputs in [-2^drop, 0). Cost: :func:`cost_relu` (:func:`cost_relu_split`
    for mul_split_aa's output). ``site``: a shadow party's record (mpc3.shadow).
    """
    if p.shadow is not None:
        return p.shadow.relu_a(x, site)
    p.new_op()
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))      # a SplitShare's A and B as well
    if isinstance(x, SignedSplit):                 # MaskedBits, or (leaves, N) to finish
        sign = x.bits.planes if isinstance(x.bits, MaskedBits) else \
            sign_of_leaves(p, *x.bits, fused=True)
    else:
        sign, _ = _drelu_bits(p, flat, exact=False, fused=True)
    return _inject(p, flat, sign, from_masked=True).reshape(x.shape)


def mul_ab(p: Party, bit: BShare, x: AShare) -> AShare:
    """bit * x for a replicated boolean bit: one plane over x.size elements, or over
    x.shape[0] rows (then each bit scales its whole row). Cost: :func:`cost_inject`."""
    if bit.planes != 1 or bit.n not in (x.size, x.shape[0] if x.a.ndim else -1):
        raise ValueError(f"mul_ab: need one bit plane over {x.size} elements "
                         f"or {x.shape[0] if x.a.ndim else 0} rows, got {bit.n}")
    if p.shadow is not None:
        return p.shadow.mul_ab(bit, x)
    p.new_op()
    rows = x.reshape(bit.n, -1) if bit.n != x.size else x.reshape(-1)
    return _inject(p, rows, bit, from_masked=False).reshape(x.shape)


def drelu_masked(p: Party, x: AShare, win: tuple[int, int] | None = None) -> MaskedBits:
    """DReLU(x) as :class:`MaskedBits` (for :func:`mul_masked`). Cost:
    ``cost_drelu(n, cfg, fused=True, win=win)`` - one round less than drelu_a."""
    return run_steps(p, drelu_masked_steps(p, x, win))[0]


def drelu_masked_steps(p: Party, x: AShare, win: tuple[int, int] | None = None):
    """:func:`drelu_masked` as lockstep steps (:func:`base.lockstep`): e.g. a table
    lookup's comparisons beside the polynomial pieces they select."""
    p.new_op()
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))
    bits = yield from _drelu_masked_steps(p, flat, *(win or window(p, False)))
    return MaskedBits(bits, flat.size)


def mul_masked(p: Party, bits: MaskedBits, y: AShare, sum_runs: int = 0) -> AShare:
    """DReLU bit * y for the bits of :func:`drelu_masked` (y of their size, or one row of
    values per bit). Together with drelu_masked: DReLU(x) * y in the rounds of relu_a, e.g.
    a public-table lookup sum_j [x >= t_j] (V_{j+1} - V_j) with y computed meanwhile.
    ``sum_runs=k`` (y of the bits' size): the (n / k,) sums over runs of k products only
    (one resharing element per run). Cost: ``cost_inject(n, fused=True, cols, sum_runs)``."""
    if y.shape[0] != bits.n and y.size != bits.n:
        raise ValueError(f"mul_masked: {bits.n} bits for values of shape {y.shape}")
    if sum_runs and (y.size != bits.n or bits.n % sum_runs):
        raise ValueError(f"mul_masked: runs of {sum_runs} over {bits.n} bits")
    p.new_op()
    if sum_runs:
        return _inject(p, y.reshape(-1), bits.planes, from_masked=True, seg=sum_runs)
    rows = y.reshape(-1) if y.size == bits.n else y.reshape(bits.n, -1)
    return _inject(p, rows, bits.planes, from_masked=True).reshape(y.shape)


def select_ab(p: Party, bit: BShare, x: AShare, y: AShare) -> AShare:
    """bit ? y : x  (= x + bit * (y - x)). Cost: :func:`cost_inject`."""
    return x + mul_ab(p, bit, y - x)


def b2a(p: Party, bit: BShare) -> AShare:
    """Bit injection of a replicated boolean bit into Z_2^64 (0/1 at scale 1): mul_ab with
    the public one. Cost: :func:`cost_b2a`."""
    one = public_share(p, np.ones(bit.n, dtype=np.uint64))
    return mul_ab(p, bit, one)


def cost_b2a(n: int, cfg=None) -> Cost:
    return cost_inject(n, fused=False)


def cost_drelu(n: int, cfg, fused: bool = False, win: tuple[int, int] | None = None) -> Cost:
    """Leaves (2 rounds) + one round per tree level (the last one free when fused); fused
    on few elements (:func:`dealt_carry`): thresholds.cost_compare_public (2 rounds).
    ``win``: the window (L, m) if not cfg's (:func:`window_for`)."""
    L, m = win or window_for(cfg)
    if fused and dealt_carry(n):
        return thresholds.cost_compare_public(n, 1, L, m)
    cost, nb = leaf_cost(n, L, m)
    return cost + _cost_tree(n, nb, fused)


def _cost_tree(n: int, nb: int, fused: bool) -> Cost:
    cost = Cost(0, (0, 0, 0))
    levels = ands_per_level(nb)
    for li, k in enumerate(levels):
        if not (fused and li == len(levels) - 1):
            cost = cost + cost_and_bb(n, planes=k)
    return cost


def cost_relu(n: int, cfg, win: tuple[int, int] | None = None) -> Cost:
    return cost_drelu(n, cfg, fused=True, win=win) + cost_inject(n, fused=True)


def cost_relu_split(n: int, cfg, trunc: bool | int = True) -> Cost:
    """relu_a of mul_split_aa's ``n`` outputs truncated by ``trunc``: when the product took
    the sign (:func:`mpc3.kernels.arith.split_sign_window`) the injection alone, or for a
    call past ROUND_LEAN_ELEMENTS the carry tree over the leaves it took and the injection."""
    win = arith.split_sign_window(cfg, n, trunc)
    if win is None:
        return cost_relu(n, cfg)
    tree = Cost(0, (0, 0, 0)) if dealt_carry(n) else _cost_tree(n, leaf_cost(n, *win)[1], True)
    return tree + cost_inject(n, fused=True)
