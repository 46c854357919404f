"""Malicious-mode routes of the fused product kernels (docs/MALICIOUS.md): the same values
from messages that :class:`mpc3.checks.Checks` covers (``p.checks`` set; semi-honest code
paths never come here).

* :func:`fused_steps`: products whose truncation is by public shifts and whose claims cover
  every output the kernel computes (:func:`fusable`: no :class:`Scaled` item, no matrix
  product with a keep mask) run as semi-honest mode runs them - the truncation fused into
  the resharing of the 3-out-of-3 sum, plain items beside it in its first round - with the
  fused form's claims (:mod:`mpc3.claims_trunc`; the single's witness is 16 bytes an
  element at the flush). Same rounds and messages as semi-honest mode. ``mul_aa`` and
  ``matmul_aa`` with truncation come here too; ``mul_split_aa`` runs its own kernel with
  the same claims (:func:`split_terms`, :func:`bias_slots`: every output completed, the
  sign's comparison in the products' rounds).
* otherwise (:func:`flat_steps`), round 1
  reshares every item's plain product, each under its own zero sharing (``reshare<i>``),
  registered as :meth:`Checks.product` / :meth:`Checks.matmul` claims; then the truncated
  items' replicated products are truncated together (``trunc_steps`` from_rss, the plain
  form :meth:`Checks.truncation` covers; per-element shifts). One round more than the
  semi-honest kernel. ``keep`` masks: an elementwise item reshares its kept outputs only; a
  matrix product reshares its whole output (its claim reads the whole message) and
  truncates the kept outputs only. Matrix products with a vector operand or broadcast
  batches take either route: their claims take every shape
  (:func:`mpc3.freivalds.as_matrices`).
* :class:`Scaled` truncations ``floor(z m / 2^S)`` (:func:`trunc_scaled`, and Scaled items
  of mul_many): with ``t`` the bit length of m (m < 2^t <= 2^31), the first truncation gives
  ``r = trunc(z, t)`` and ``z_lo = z - 2^t r``, |z_lo| < 2^t (stochastic rounding); then one
  more truncation gives ``trunc(r m, S - t) + trunc(z_lo m, S)``. Both inputs stay below
  2^62 for every |z| < 2^62 (|r m| < 2^(62 - t) 2^t, |z_lo m| < 2^(2t) <= 2^62), so the
  product range of the kernel is kept; the error is below 2 ulps (two stochastic roundings)
  instead of 1. The second truncation is exact-mode in either mode: in prob mode ``z_lo m``
  (up to 2^(2t), whatever z) would fail with probability ~2^(2t - 64) per element (2^-3
  for a multiplier near 2^30), so only the first truncation keeps prob mode's failure
  ~|z| / 2^64, that of the product itself. ``S <= t`` is refused (ValueError). Two rounds
  more than semi-honest in exact mode, three in prob mode. A Scaled truncation whose
  multipliers are all one power of two 2^e (e < S: attention's row scale 1/n for a power of
  two n, the same for every row) is the shift ``S - e`` exactly, and runs as one
  (:func:`as_shift`): the fused route, when nothing else in the call prevents it.
* :func:`split_checked` (``mul_split_aa`` with items :func:`fusable` refuses): the products
  of :func:`many_steps`, biases added after the truncation, as AShares (relu_a reads
  them); no sign in the products' rounds.

Costs: :func:`cost_checked` (measured = declared: tests/mpc3/test_checks_products.py).
"""
from __future__ import annotations

import numpy as np

from ..comm import NEXT, PREV
from ..party import Party
from ..shares import AShare
from .base import Cost, Round, run_steps
from .truncation import MAX_MULT, Scaled, cost_trunc_shifts, trunc_steps


def _kept(arr, shape: tuple, keep) -> np.ndarray:
    """A public array broadcast to an item's output ``shape``, over its kept outputs, flat."""
    full = np.broadcast_to(arr, shape)
    return full[keep] if keep is not None else full.reshape(-1)


def _scaled_plan(mult: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(t, shift) per element of a Scaled truncation: t the multiplier's bit length."""
    mult = np.asarray(mult, dtype=np.uint64)
    if mult.size and (mult.min() < 1 or mult.max() > MAX_MULT):
        raise ValueError(f"truncation multipliers must lie in [1, {MAX_MULT}]")
    t = np.frexp(mult.astype(np.float64))[1].astype(np.int64)      # m < 2^t, exactly
    if t.size and int(shift) <= int(t.max()):
        raise ValueError(f"malicious mode: a scaled truncation by {shift} bits needs a shift "
                         f"above the multipliers' bit length ({int(t.max())})")
    return t, np.full(t.shape, int(shift), dtype=np.int64)


def as_shift(trunc):
    """``trunc``, or the plain shift ``S - e`` that a :class:`Scaled` truncation
    ``floor(z 2^e / 2^S)`` whose multipliers are all 2^e (e < S) equals."""
    if not isinstance(trunc, Scaled):
        return trunc
    m = np.unique(np.asarray(trunc.mult, dtype=np.uint64))
    e = int(m[0]).bit_length() - 1 if m.size == 1 else -1
    if e < 0 or int(m[0]) != 1 << e or e >= int(trunc.shift):
        return trunc
    return int(trunc.shift) - e


def _shifted(items: list[tuple]) -> list[tuple]:
    """Items with their truncations as :func:`as_shift` gives them."""
    return [(*it[:3], as_shift(it[3]), *it[4:]) if len(it) > 3 else it for it in items]


def _item_plan(shape: tuple, kind: str, trunc, keep, frac: int):
    """(elements reshared in round 1, kept outputs, stage-1 shifts, multipliers (0: not
    scaled), final shifts) of one item with output ``shape``; shifts None if not truncated."""
    keep = None if keep is None else np.broadcast_to(keep, shape)
    kept = int(np.prod(shape)) if keep is None else int(keep.sum())
    sent = kept if kind == "mul" else int(np.prod(shape))
    if trunc is False:
        return sent, kept, None, None, None
    if isinstance(trunc, Scaled):
        mult = _kept(np.asarray(trunc.mult, dtype=np.uint64), shape, keep)
        t, s = _scaled_plan(mult, trunc.shift)
        return sent, kept, t, mult, s
    bits = frac if trunc is True else trunc
    bits = np.broadcast_to(np.asarray(bits, dtype=np.int64), (kept,))
    return sent, kept, bits, np.zeros(kept, np.uint64), bits


def cost_checked(items, cfg) -> Cost:
    """Malicious-mode rounds and bytes per party of mul_many_aa (and mul_split_aa, and a
    truncating mul_aa / matmul_aa: one item) on ``items`` ``(out_shape, kind, trunc)`` or
    ``(out_shape, kind, trunc, keep)``: the plain products, their truncation, and for
    Scaled items the second truncation. The flush's own bytes are not included."""
    items = [(*it[:2], as_shift(it[2]), *it[3:]) for it in items]
    plans = [_item_plan(it[0], it[1], it[2], it[3] if len(it) > 3 else None, cfg.frac)
             for it in items]
    if all(not isinstance(it[2], Scaled) and (it[1] == "mul" or len(it) < 4 or it[3] is None)
           for it in items):                                   # fused_steps: semi-honest's
        tr = [pl for pl in plans if pl[2] is not None]
        plain = sum(pl[1] for pl in plans if pl[2] is None)
        if not tr:
            return Cost.uniform(1, 8 * plain)
        return (cost_trunc_shifts(np.concatenate([pl[2] for pl in tr]), cfg.trunc, False)
                + Cost(0, (8 * plain,) * 3))
    cost = Cost.uniform(1, 8 * sum(pl[0] for pl in plans))      # arith.cost_reshare
    tr = [pl for pl in plans if pl[2] is not None]
    if not tr:
        return cost
    cost = cost + cost_trunc_shifts(np.concatenate([pl[2] for pl in tr]), cfg.trunc, True)
    mult = np.concatenate([pl[3] for pl in tr])
    sc = np.flatnonzero(mult)
    if sc.size:
        t, s = (np.concatenate([pl[j] for pl in tr])[sc] for j in (2, 4))
        cost = cost + cost_trunc_shifts(np.concatenate([s - t, s]), "exact", True)
    return cost


def _trunc_steps(p: Party, src: AShare, bits, mult, shifts):
    """Truncate the flat replicated ``src`` by ``bits``; where ``mult`` is non-zero, the
    Scaled route of the module docstring to ``floor(src mult / 2^shifts)``."""
    r = yield from trunc_steps(p, src, bits, from_rss=True)
    sc = np.flatnonzero(mult)
    if not sc.size:
        return r
    m, t, k = mult[sc], bits[sc].astype(np.uint64), sc.size
    hi = (r.a[sc] * m, r.b[sc] * m)
    lo = ((src.a[sc] - (r.a[sc] << t)) * m, (src.b[sc] - (r.b[sc] << t)) * m)
    both = AShare(np.concatenate([hi[0], lo[0]]), np.concatenate([hi[1], lo[1]]))
    u = yield from trunc_steps(p, both, np.concatenate([shifts[sc] - bits[sc], shifts[sc]]),
                               from_rss=True, mode="exact")
    a, b = r.a.copy(), r.b.copy()
    a[sc], b[sc] = u.a[:k] + u.a[k:], u.b[:k] + u.b[k:]
    return AShare(a, b)


def trunc_scaled(p: Party, z: AShare, trunc: Scaled) -> AShare:
    """A truncating product's Scaled truncation of its (verified) replicated product ``z``."""
    _, _, bits, mult, shifts = _item_plan(z.shape, "mul", as_shift(trunc), None, p.cfg.frac)
    flat = AShare(z.a.reshape(-1), z.b.reshape(-1))
    return run_steps(p, _trunc_steps(p, flat, bits, mult, shifts))[0].reshape(z.shape)


def _kept_operands(x: AShare, y: AShare, kind: str, keep):
    """An elementwise item's operands cut to its kept outputs, flat (others as they are)."""
    if kind != "mul" or keep is None or x.shape != y.shape:
        return x, y
    kb = np.broadcast_to(keep, x.shape)
    return AShare(x.a[kb], x.b[kb]), AShare(y.a[kb], y.b[kb])


def dot_shaped(x_shape: tuple, y_shape: tuple) -> bool:
    """Whether ``x @ y`` is a batch of dot products :func:`mpc3.claims.dot_claims` takes:
    (..., 1, K) @ (..., K, 1) with equal batch shapes."""
    return (len(x_shape) == len(y_shape) >= 3 and x_shape[:-2] == y_shape[:-2]
            and x_shape[-2] == 1 and y_shape[-1] == 1)


def fusable(items: list[tuple]) -> bool:
    """Whether mul_many's ``items`` take :func:`fused_steps`: no Scaled truncation, and each
    matrix product's claims cover its whole output (no keep mask)."""
    for item in items:
        kind, trunc = item[2:4]
        if isinstance(trunc, Scaled):
            return False
        if kind == "matmul" and len(item) > 4 and item[4] is not None:
            return False
    return True


def fused_steps(p: Party, items: list[tuple], product):
    """:func:`flat_steps`' results from semi-honest mode's messages: the truncated items'
    masked terms truncated together, fused (:func:`mpc3.kernels.truncation.trunc_steps`
    with their ``terms``), the plain items' reshared in its first round."""
    kop = p.new_op()
    made, flat, at = [], {True: [], False: []}, {True: 0, False: 0}
    for item in items:
        x, y, kind, trunc = item[:4]
        keep = item[4] if len(item) > 4 else None
        shape = x.shape
        x, y = _kept_operands(x, y, kind, keep)
        z = product(x, y, kind, None, p.rank)[0]
        shape = shape if kind == "mul" else z.shape
        keep = None if keep is None else np.broadcast_to(keep, shape)
        cut = at[trunc is not False]
        at[trunc is not False] += z.size
        flat[trunc is not False].append((x, y, kind, cut, cut + z.size, z))
        made.append((trunc, shape, keep, z.size))
    zt, zp = (np.concatenate([t[5].reshape(-1) for t in flat[k]]) if flat[k] else None
              for k in (True, False))
    terms = {k: [t[:5] for t in flat[k]] for k in (True, False)}
    del flat
    if zp is not None:
        p.add_zero_share(zp, "plainmask")                  # fresh: in place
    if zt is not None:
        p.add_zero_share(zt, "mulmask")
        bits = np.concatenate([np.broadcast_to(np.asarray(
            p.cfg.frac if trunc is True else trunc, dtype=np.int64), (n,))
            for trunc, _, _, n in made if trunc is not False])
        got = yield from trunc_steps(p, zt, bits, from_rss=False, plain=zp,
                                     terms={"kop": kop, "items": terms[True]})
        tr, pl = got if zp is not None else (got, None)
        back = int(p.cfg.trunc == "exact")
    else:
        r = Round(p)
        r.send(PREV, zp)
        r.recv(NEXT, 0, 1)
        tr, pl, back = None, AShare(zp, (yield r)[(NEXT, 0)][0]), 0
    if pl is not None:
        p.checks.reshared(p, terms[False], pl.a, pl.b, kop, "plainmask", back)
    out, at = [], {True: 0, False: 0}
    for trunc, shape, keep, n in made:
        src, lo = (tr, at[True]) if trunc is not False else (pl, at[False])
        at[trunc is not False] += n
        out.append((AShare(src.a[lo:lo + n], src.b[lo:lo + n]), shape, keep))
    return out


def split_terms(items: list[tuple], sizes: list[int], kop: int) -> dict:
    """The fused form's ``terms`` of mul_split_aa's products (``items`` ``(x, y, kind,
    trunc, keep)``, their kept outputs' ``sizes`` side by side; an elementwise item's
    operands cut to its kept outputs), masked under ``(kop, "mulmask")``."""
    out, at = [], 0
    for (x, y, kind, _, keep), n in zip(items, sizes):
        out.append((*_kept_operands(x, y, kind, keep), kind, at, at + n))
        at += n
    return {"kop": kop, "items": out, "bias": None}


def bias_slots(terms: dict, n: int, pos: int, a: np.ndarray, b: np.ndarray) -> None:
    """Record a bias added to the terms at ``pos``: this party's slots a (in its own term)
    and b (in next's), shifted (:func:`mpc3.claims_trunc.fused_claims`)."""
    if terms["bias"] is None:
        terms["bias"] = (np.zeros(n, np.uint64), np.zeros(n, np.uint64))
    terms["bias"][0][pos:pos + a.size] = a
    terms["bias"][1][pos:pos + b.size] = b


def flat_steps(p: Party, items: list[tuple], product):
    """mul_many's items in malicious mode, as steps: per item (its kept outputs, flat, as
    an AShare; its output shape; its keep mask broadcast, or None). ``product``: arith's
    ``_item_product`` (passed in: arith imports this module, not the other way)."""
    items = _shifted(items)
    if fusable(items):
        return (yield from fused_steps(p, items, product))
    kop = p.new_op()
    r, made = Round(p), []
    for i, item in enumerate(items):
        x, y, kind, trunc = item[:4]
        keep = item[4] if len(item) > 4 else None
        shape = x.shape
        x, y = _kept_operands(x, y, kind, keep)        # reshare the kept outputs only
        z = product(x, y, kind, None, p.rank)[0]
        shape = shape if kind == "mul" else z.shape
        p.add_zero_share(z, f"reshare{i}")
        r.send(PREV, z)
        r.recv(NEXT, i, 1)
        made.append((x, y, kind, trunc, z, shape,
                     None if keep is None else np.broadcast_to(keep, shape)))
    got = yield r
    plans, pieces = [], []
    for i, (x, y, kind, trunc, z, shape, keep) in enumerate(made):
        out = AShare(z, got[(NEXT, i)][0].reshape(z.shape))
        if kind == "mul":
            p.checks.product(p, x, y, out, False, kop, tag=f"reshare{i}")
        else:
            p.checks.matmul(p, x, y, out, False, kop, tag=f"reshare{i}")
        pieces.append(AShare(out.a[keep], out.b[keep]) if kind == "matmul" and keep is not None
                      else AShare(out.a.reshape(-1), out.b.reshape(-1)))
        plans.append(_item_plan(shape, kind, trunc, keep, p.cfg.frac))
    tr = [i for i, pl in enumerate(plans) if pl[2] is not None]
    if tr:
        src = AShare(np.concatenate([pieces[i].a for i in tr]),
                     np.concatenate([pieces[i].b for i in tr]))
        bits, mult, shifts = (np.concatenate([plans[i][j] for i in tr]) for j in (2, 3, 4))
        res = yield from _trunc_steps(p, src, bits, mult, shifts)
        cut = np.cumsum([0] + [plans[i][1] for i in tr])
        for i, lo, hi in zip(tr, cut, cut[1:]):
            pieces[i] = AShare(res.a[lo:hi], res.b[lo:hi])
    return [(v, m[5], m[6]) for v, m in zip(pieces, made)]


def many_steps(p: Party, items: list[tuple], product):
    """:func:`mpc3.kernels.arith.mul_many_steps` in malicious mode (module docstring)."""
    outs = []
    for v, shape, keep in (yield from flat_steps(p, items, product)):
        if keep is None:
            outs.append(v.reshape(shape))
        else:
            a, b = np.zeros(shape, np.uint64), np.zeros(shape, np.uint64)
            a[keep], b[keep] = v.a, v.b
            outs.append(AShare(a, b))
    return outs


def split_checked(p: Party, items: list[tuple], trunc, replicated, biases, product):
    """:func:`mpc3.kernels.arith.mul_split_aa` in malicious mode: its values, replicated -
    the split items' kept outputs flat and concatenated, biases added (an AShare), and
    with ``replicated`` ``(that, [outputs])``."""
    many = [(*it[:3], trunc, it[3] if len(it) > 3 else None) for it in items]
    many += [(*it[:3], trunc) for it in replicated or []]
    got = run_steps(p, flat_steps(p, many, product))[0]
    flats = []
    for (v, shape, keep), b in zip(got, biases or [None] * len(items)):
        if b is not None:
            v = AShare(v.a + _kept(b.a, shape, keep), v.b + _kept(b.b, shape, keep))
        flats.append(v)
    split = AShare(np.concatenate([v.a for v in flats] or [np.zeros(0, np.uint64)]),
                   np.concatenate([v.b for v in flats] or [np.zeros(0, np.uint64)]))
    if replicated is None:
        return split
    return split, [v.reshape(shape) for v, shape, _ in got[len(items):]]
