"""Malicious mode for the fused product kernels (mpc3.kernels.checked): mul_many_aa with
mixed items, keep masks and Scaled items, mul_split_aa with biases and replicated items,
Scaled mul_aa / matmul_aa. Each: the flush accepts an honest run, the values are the exact
ones within the kernel's rounding (one stochastic rounding: < 1 ulp; a Scaled truncation
in malicious mode: < 2 ulps), bytes and rounds equal checked.cost_checked, and a changed
message of the kernel aborts with CheatingDetected."""
import numpy as np
import pytest

from mpc3 import dzkp, tamper
from mpc3.checks import Checks
from mpc3.kernels import arith, checked, convert
from mpc3.kernels.base import Cost, run_steps
from mpc3.kernels.checked import as_shift, cost_checked
from mpc3.kernels.truncation import MAX_MULT, Scaled, scaled
from mpc3.party import RingConfig
from mpc3.sharing import deal
from mpc3.shares import SignedSplit
from mpc3.sim import make_parties, run_parties
from protocols.layers import attention

F = RingConfig().frac


def _ints(rng, shape, scale=2.0):
    return np.round(rng.normal(size=shape) * scale * 2.0 ** F).astype(np.int64)


def _deal(rng, *arrays):
    dealt = [deal(a.astype(np.uint64), rng) for a in arrays]
    return [tuple(d[i] for d in dealt) for i in range(3)]


def _job(kernel, malicious=True, span=None):
    """Run ``kernel(p, *operands)`` -> list of AShares; open them all; flush."""
    def job(p, *operands):
        if malicious:
            p.checks = Checks(p)
        first, before = p.comm.op, p.stats.snapshot()
        outs = kernel(p, *operands)
        spent = p.stats - before
        if span is not None:
            span[p.rank] = (first, p.comm.op)            # the kernel's rounds
        opened = [arith.open_a(p, o).astype(np.int64) for o in outs]
        if malicious:
            p.checks.flush(p)
        return opened, spent
    return job


def _check(kernel, args, declared, refs, tols, cfg=None, seed=0):
    """Honest run: accepted, values within ``tols`` ulps of ``refs``, cost as declared;
    then in each of the kernel's rounds one message (drawn) changed: each caught."""
    cfg, span = cfg or RingConfig(), {}
    clean = tamper.run(_job(kernel, span=span), args, make_parties(cfg))
    assert clean.error is None, clean.error
    for got, ref, tol in zip(clean.results[0][0], refs, tols):
        assert np.abs(got - ref).max() < tol, (np.abs(got - ref).max(), tol)
    for r, (_, spent) in enumerate(clean.results):
        assert (spent.rounds, spent.bytes_sent) == (declared.rounds,
                                                    declared.bytes_per_party[r])
    msgs = [s for s in clean.sent if span[s.party][0] < s.op <= span[s.party][1]
            and s.entries]
    rng = np.random.default_rng(seed)
    for trial, op in enumerate(sorted({s.op for s in msgs})):
        target = tamper.draw([s for s in msgs if s.op == op], rng, "add")
        got = tamper.run(_job(kernel), args, make_parties(cfg), target,
                         tamper.Deviation("add", error=int(rng.integers(1, 1 << 62)),
                                          seed=trial))
        assert isinstance(got.error, dzkp.CheatingDetected), (target, got.error)
    return clean


def _scaled_ref(z, sc: Scaled):
    """floor(z m / 2^S) as a real (z m exact in Python integers)."""
    m = np.broadcast_to(sc.mult, z.shape)
    return np.array([int(a) * int(b) for a, b in zip(z.reshape(-1), m.reshape(-1))],
                    dtype=object).reshape(z.shape).astype(np.float64) / 2.0 ** sc.shift


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_mul_many_mixed_items_keep_masks_and_scaled(mode):
    rng = np.random.default_rng([35, len(mode)])
    a, w, u, v = _ints(rng, (6, 40)), _ints(rng, (40, 5)), _ints(rng, (6, 5)), _ints(rng, (6, 5))
    keep = rng.random((6, 5)) < 0.6
    rows = scaled(1.0 / np.arange(1, 7)[:, None], F)
    shifts = rng.integers(F - 4, F + 4, size=int(keep.sum()))
    items = lambda a, w, u, v: [
        (a, w, "matmul", True), (u, v, "mul", False), (u, v, "mul", shifts, keep),
        (a, w, "matmul", rows, keep), (u, v, "mul", rows), (a, w, "matmul", False, keep)]
    aw, uv = a @ w, u * v
    refs = [aw / 2.0 ** F, uv, np.where(keep, 0, 0).astype(float), np.where(
        keep, _scaled_ref(aw, rows), 0), _scaled_ref(uv, rows), np.where(keep, aw, 0)]
    refs[2][keep] = uv[keep] / 2.0 ** shifts
    declared = cost_checked([(it[0].shape if it[2] == "mul" else (6, 5), *it[2:])
                             for it in items(a, w, u, v)], RingConfig(trunc=mode))
    rounds = 5 if mode == "exact" else 4   # product, truncation, Scaled's second (exact)
    assert declared.rounds == rounds
    _check(lambda p, *ops: arith.mul_many_aa(p, items(*ops)), _deal(rng, a, w, u, v),
           declared, refs, [1, 1, 1, 2, 2, 1], RingConfig(trunc=mode), seed=len(mode))


def test_mul_many_steps_without_truncation_is_one_round():
    rng = np.random.default_rng(7)
    u, v = _ints(rng, (4, 3)), _ints(rng, (4, 3))
    declared = cost_checked([((4, 3), "mul", False)] * 2, RingConfig())
    assert declared.rounds == 1
    _check(lambda p, u, v: arith.mul_many_aa(p, [(u, v, "mul", False), (v, u, "mul", False)]),
           _deal(rng, u, v), declared, [u * v, u * v], [1, 1])


def test_mul_many_steps_in_lockstep_share_rounds_and_stay_covered():
    """Two mul_many_steps in lockstep (as kernels built on them run it): the rounds they
    share carry both kernels' claims; cost Cost.parallel of the two."""
    rng = np.random.default_rng(9)
    u, v = _ints(rng, (4, 6)), _ints(rng, (4, 6))
    rows = scaled(1.0 / np.arange(1, 5)[:, None], F)

    def kernel(p, u, v):
        (a,), (b, c) = run_steps(p, arith.mul_many_steps(p, [(u, v, "mul", rows)]),
                                 arith.mul_many_steps(p, [(u, u, "mul", True),
                                                          (v, v, "mul", False)]))
        return [a, b, c]
    declared = Cost.parallel(cost_checked([((4, 6), "mul", rows)], RingConfig()),
                             cost_checked([((4, 6), "mul", True), ((4, 6), "mul", False)],
                                          RingConfig()))
    _check(kernel, _deal(rng, u, v), declared,
           [_scaled_ref(u * v, rows), u * u / 2.0 ** F, v * v], [2, 1, 1])


def test_dot_products_and_four_dimensional_batches_are_verified():
    """Per-element dot products (..., 1, K) @ (..., K, 1) (the piecewise activations', one
    gate of 2K terms each, claims.dot_claims) and matrix products batched over two leading
    dimensions (freivalds.matmul_claims, per batch item), in mul_many and in matmul_aa."""
    rng = np.random.default_rng(13)
    x, y = _ints(rng, (5, 3, 1, 4)), _ints(rng, (5, 3, 4, 1))
    a, b = _ints(rng, (2, 3, 4, 6)), _ints(rng, (2, 3, 6, 2))
    xy, ab = x @ y, a @ b

    def kernel(p, x, y, a, b):
        return arith.mul_many_aa(p, [(x, y, "matmul", True), (a, b, "matmul", False)]) + \
            [arith.matmul_aa(p, a, b)]
    declared = cost_checked([(xy.shape, "matmul", True), (ab.shape, "matmul", False)],
                            RingConfig()) + cost_checked([(ab.shape, "matmul", True)],
                                                         RingConfig())
    args = _deal(rng, x, y, a, b)
    _check(kernel, args, declared, [xy / 2.0 ** F, ab, ab / 2.0 ** F], [1, 1, 1])
    for element in (0, xy.size + ab.size - 1):      # first and last entries of op 1's
        got = tamper.run(_job(kernel), args, make_parties(), tamper.Target(1, -1, op=1),
                         tamper.Deviation("add", error=1 << 63, element=element))
        assert isinstance(got.error, dzkp.CheatingDetected), (element, got.error)
        assert got.error.prover == 1


def test_vector_operands_and_broadcast_batches_are_verified():
    """Matrix products with a vector operand or batches that broadcast against each other
    (freivalds.as_matrices: a one-row / one-column matrix, equal batches) are verified with
    numpy's output shapes, truncated or plain, keep masks and Scaled multipliers of the
    output's shape included: in matmul_aa (each on the fused route) and in one mul_many_aa
    whose keep mask takes the unfused route; every round's changed message is caught.
    Semi-honest mode gives the same shapes (mul_many's vector operand included)."""
    rng = np.random.default_rng(17)
    v, w, m = _ints(rng, (6,)), _ints(rng, (6,)), _ints(rng, (6, 5))
    a, b, c = _ints(rng, (2, 1, 3, 6)), _ints(rng, (1, 4, 6, 2)), _ints(rng, (3, 6, 2))
    vm, mv, ab, vv, vc = v @ m, m.T @ v, a @ b, v @ w, v @ c
    keep = rng.random(ab.shape) < 0.5
    sc = scaled(rng.uniform(0.2, 1.0, size=vm.shape), F)

    def kernel(p, v, w, m, a, b, c):
        mt = m.transpose()
        return [arith.matmul_aa(p, v, m), arith.matmul_aa(p, mt, v, trunc=False),
                arith.matmul_aa(p, a, b), arith.matmul_aa(p, v, c)] + arith.mul_many_aa(
            p, [(a, b, "matmul", True, keep), (v, w, "matmul", False), (v, m, "matmul", sc)])
    declared = (cost_checked([(vm.shape, "matmul", True)], RingConfig())
                + Cost.uniform(1, 8 * mv.size)
                + cost_checked([(ab.shape, "matmul", True)], RingConfig())
                + cost_checked([(vc.shape, "matmul", True)], RingConfig())
                + cost_checked([(ab.shape, "matmul", True, keep), (vv.shape, "matmul", False),
                                (vm.shape, "matmul", sc)], RingConfig()))
    args = _deal(rng, v, w, m, a, b, c)
    clean = _check(kernel, args, declared,
                   [vm / 2.0 ** F, mv, ab / 2.0 ** F, vc / 2.0 ** F,
                    np.where(keep, ab / 2.0 ** F, 0), vv, _scaled_ref(vm, sc)],
                   [1, 1, 1, 1, 1, 1, 2])
    refs = [vm, mv, ab, vc, ab, vv, vm]
    assert [o.shape for o in clean.results[0][0]] == [r.shape for r in refs]
    semi = tamper.run(_job(kernel, malicious=False), args, make_parties())   # the same shapes
    assert [o.shape for o in semi.results[0][0]] == [r.shape for r in refs]



def test_each_slot_of_a_matrix_product_is_reduced_once_a_party(monkeypatch):
    """The three proofs share one set of random vectors (freivalds.reduce_mats), so a party
    reduces each of its two slots of x and of y once - not once for each role that reads it
    (the prover's slot a is also its slot as V_R of prev, its b as V_L of next) - and the
    honest product is still accepted. x (3, 5) @ y (5, 7): per party, rho^T X for two slots
    (X^T: (5, 3)), Y kappa for two (Y: (5, 7)) and rho^T T for its three targets (T^T: (7, 3))."""
    from collections import Counter
    from mpc3 import freivalds
    rng = np.random.default_rng(19)
    x, y = _ints(rng, (3, 5)), _ints(rng, (5, 7))
    calls, real = Counter(), freivalds.long_matmul

    def counted(a, b):
        calls[a.shape] += 1
        return real(a, b)
    monkeypatch.setattr(freivalds, "long_matmul", counted)
    got = tamper.run(_job(lambda p, x, y: [arith.matmul_aa(p, x, y)]), _deal(rng, x, y),
                     make_parties())
    assert got.error is None, got.error
    assert np.abs(got.results[0][0][0] - x @ y / 2.0 ** F).max() < 1
    assert calls == Counter({(5, 3): 3 * 2, (5, 7): 3 * 2, (7, 3): 3 * 3}), calls

@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_fused_truncation_of_mixed_items_costs_what_semi_honest_mode_does(mode):
    """Items without Scaled truncations or masked matrix products take the fused route
    (checked.fused_steps): a matrix product, a batch of dot products, an elementwise
    product with a keep mask and per-element shifts, plain items beside them - semi-honest
    mode's rounds and bytes (arith.cost_mul_many), every message of the kernel checked."""
    rng = np.random.default_rng([17, len(mode)])
    a, w, u, v = _ints(rng, (6, 40)), _ints(rng, (40, 5)), _ints(rng, (6, 5)), _ints(rng, (6, 5))
    x, y = _ints(rng, (4, 1, 7)), _ints(rng, (4, 7, 1))
    keep = rng.random((6, 5)) < 0.6
    shifts = rng.integers(F - 4, F + 4, size=int(keep.sum()))
    items = lambda a, w, u, v, x, y: [                                   # noqa: E731
        (a, w, "matmul", True), (u, v, "mul", shifts, keep), (x, y, "matmul", F - 2),
        (u, v, "mul", False), (a, w, "matmul", False)]
    aw, uv, xy = a @ w, u * v, x @ y
    kept = np.zeros((6, 5))
    kept[keep] = uv[keep] / 2.0 ** shifts
    refs = [aw / 2.0 ** F, kept, xy / 2.0 ** (F - 2), uv, aw]
    cfg = RingConfig(trunc=mode)
    semi = arith.cost_mul_many(np.concatenate([np.full(aw.size, F), shifts,
                                               np.full(xy.size, F - 2)]), uv.size + aw.size,
                               mode)
    declared = cost_checked([(aw.shape, "matmul", True), ((6, 5), "mul", shifts, keep),
                             (xy.shape, "matmul", F - 2), ((6, 5), "mul", False),
                             (aw.shape, "matmul", False)], cfg)
    assert declared == semi
    _check(lambda p, *ops: arith.mul_many_aa(p, items(*ops)), _deal(rng, a, w, u, v, x, y),
           declared, refs, [1, 1, 1, 1, 1], cfg, seed=len(mode))


@pytest.mark.parametrize("rows", [5, 2000])
def test_mul_split_takes_the_fused_route_with_the_sign_in_its_rounds(rows):
    """Without Scaled truncations or masked matrix products mul_split_aa runs as in
    semi-honest mode, every output completed (the single's Uk sent), the sign's comparison
    in the products' rounds - the dealt carry (few elements) or the leaves (many) in the
    late form, reading A's bits from the fused truncation - and relu_a of the result only
    injects: semi-honest mode's rounds. Every message of the kernel and of the ReLU is
    checked."""
    rng = np.random.default_rng(12)
    x, w1, w2, b = _ints(rng, (rows, 24)), _ints(rng, (24, 6)), _ints(rng, (24, 3)), \
        _ints(rng, (6,))

    def kernel(p, x, w1, w2, b):
        split, (rep,) = arith.mul_split_aa(p, [(x, w1, "matmul"), (x, w2, "matmul")],
                                           replicated=[(x, w2, "matmul")], biases=[b, None])
        assert isinstance(split, SignedSplit)
        return [split, rep, convert.relu_a(p, split)]
    z1, z2 = x @ w1 / 2.0 ** F, x @ w2 / 2.0 ** F
    flat = np.concatenate([(z1 + b).reshape(-1), z2.reshape(-1)])
    refs = [flat, z2, np.maximum(flat, 0)]
    n = flat.size
    cfg = RingConfig()
    declared = arith.cost_mul_split(n, cfg, n_rep=z2.size, malicious=True) + \
        convert.cost_relu_split(n, cfg)
    assert declared.rounds == arith.cost_mul_split(n, cfg, n_rep=z2.size).rounds + \
        convert.cost_relu_split(n, cfg).rounds                      # semi-honest mode's
    _check(kernel, _deal(rng, x, w1, w2, b), declared, refs, [1, 1, 2 ** 6])


def test_mul_split_with_biases_and_replicated_items():
    rng = np.random.default_rng(11)
    x, w1, w2, b = _ints(rng, (5, 24)), _ints(rng, (24, 6)), _ints(rng, (24, 3)), \
        _ints(rng, (6,))
    keep = np.tril(np.ones((5, 6), bool))

    def kernel(p, x, w1, w2, b):
        split, (rep,) = arith.mul_split_aa(p, [(x, w1, "matmul", keep), (x, w2, "matmul")],
                                           replicated=[(x, w1, "matmul")], biases=[b, None])
        return [split, rep]
    z1, z2 = x @ w1 / 2.0 ** F, x @ w2 / 2.0 ** F
    refs = [np.concatenate([(z1 + b)[keep], z2.reshape(-1)]), z1]
    declared = cost_checked([((5, 6), "matmul", True, keep), ((5, 3), "matmul", True),
                             ((5, 6), "matmul", True)], RingConfig())
    _check(kernel, _deal(rng, x, w1, w2, b), declared, refs, [1, 1])


@pytest.mark.parametrize("kind", ["mul", "matmul"])
def test_scaled_products_are_verified(kind):
    rng = np.random.default_rng([3, len(kind)])
    x = _ints(rng, (7, 9))
    y = _ints(rng, (7, 9) if kind == "mul" else (9, 4))
    sc = scaled(1.0 / np.arange(1, 8)[:, None], F, F + 4)     # catalog matmul-rowscale's
    fn = arith.mul_aa if kind == "mul" else arith.matmul_aa
    z = x * y if kind == "mul" else x @ y
    declared = cost_checked([(z.shape, kind, sc)], RingConfig())
    _check(lambda p, x, y: [fn(p, x, y, sc)], _deal(rng, x, y), declared,
           [_scaled_ref(z, sc)], [2], seed=len(kind))


@pytest.mark.parametrize("n", [64, 48])
def test_a_row_scale_of_one_power_of_two_is_a_plain_shift(n):
    """Attention's row scale 1/n, the same for every row (relu-performer's o W^O): for n a
    power of two the Scaled truncation is the shift S - e exactly (checked.as_shift) and
    takes the fused route - semi-honest mode's rounds and bytes for the plain shift, values
    within 1 ulp; any other n keeps the Scaled route (5 rounds in exact mode, not 2)."""
    rng = np.random.default_rng([5, n])
    x, w = _ints(rng, (6, 12)), _ints(rng, (12, 5))
    sc = attention.row_scale_trunc(np.full((6, 1), 1.0 / n), F)
    shift = as_shift(sc)
    assert (shift == F + 6) if n == 64 else (shift is sc)
    declared = cost_checked([((6, 5), "matmul", sc)], RingConfig())
    semi = arith.cost_mul_many(np.full(30, F + 6), 0, "exact")
    assert (declared == semi) == (n == 64)
    assert declared.rounds == (2 if n == 64 else 5)     # Scaled: reshare, two truncations
    _check(lambda p, x, w: [arith.matmul_aa(p, x, w, sc)], _deal(rng, x, w), declared,
           [_scaled_ref(x @ w, sc)], [1 if n == 64 else 2], seed=n)


@pytest.mark.parametrize("n", [4, 3])
def test_trunc_scaled_of_a_replicated_value(n):
    """checked.trunc_scaled (a sentence embedding's mean pooling in malicious mode): the
    scale 1/n as a plain shift for n a power of two, else the Scaled route; values within
    its rounding, and the flush accepts."""
    rng = np.random.default_rng([11, n])
    z = _ints(rng, (5, 7))
    sc = scaled(1.0 / n, F)

    def job(p, z):
        p.checks = Checks(p)
        out = arith.open_a(p, checked.trunc_scaled(p, z, sc)).astype(np.int64)
        p.checks.flush(p)
        return out

    got = run_parties(job, _deal(rng, z), parties=make_parties(RingConfig()))[0]
    assert np.abs(got - _scaled_ref(z, sc)).max() < 2


def test_a_flush_counts_its_bytes_by_part():
    """Checks.flush_bytes: a fused truncating matrix product's single sends 16 bytes an
    element (A's bits and M'; every element has one single), each flush 64 bytes of
    digests, and the proof the rest of the flush's bytes."""
    rng = np.random.default_rng(9)
    x, w = _ints(rng, (6, 12)), _ints(rng, (12, 5))

    def job(p, x, w):
        p.checks = Checks(p)
        arith.matmul_aa(p, x, w)
        before = p.stats.snapshot()
        p.checks.flush(p)
        return dict(p.checks.flush_bytes), (p.stats - before).bytes_sent

    got = run_parties(job, _deal(rng, x, w), parties=make_parties(RingConfig()))
    assert sum(parts["witness fused_claims"] for parts, _ in got) == 16 * 30
    for parts, sent in got:
        assert parts["digests"] == 64 and parts["proof"] > 0
        assert sum(parts.values()) == sent


def test_scaled_truncation_keeps_the_product_range():
    """Products just below arith.product_limit(frac) = 2^26 (|z| ~ 2^62 at scale 2^(2 frac)),
    scaled by any multiplier up to MAX_MULT: still within 2 ulps (exact mode)."""
    rng = np.random.default_rng(5)
    n, lim = 400, arith.product_limit(F)
    x = (rng.uniform(0.5, 1, n) * rng.choice([-1, 1], n) * np.sqrt(lim) * 2.0 ** F)
    x = x.astype(np.int64)
    y = (rng.uniform(0.9, 0.999, n) * np.sqrt(lim) * 2.0 ** F).astype(np.int64)
    assert np.abs(x.astype(float) * y).max() > 2.0 ** 61
    mult = rng.integers(1, MAX_MULT + 1, size=n, dtype=np.uint64)
    mult[:2] = [1, MAX_MULT]
    sc = Scaled(F + 32, mult)

    def job(p, x, y):
        p.checks = Checks(p)
        out = arith.open_a(p, arith.mul_aa(p, x, y, sc)).astype(np.int64)
        p.checks.flush(p)
        return out
    got = run_parties(job, _deal(rng, x, y))[0]
    ref = _scaled_ref(np.array([int(a) * int(b) for a, b in zip(x, y)], dtype=object), sc)
    assert np.abs(got - ref).max() < 2


def test_a_scaled_shift_below_the_multipliers_bits_is_refused():
    rng = np.random.default_rng(6)
    x = _ints(rng, (4,))

    def job(p, x):
        p.checks = Checks(p)
        return arith.mul_aa(p, x, x, Scaled(20, np.uint64(1 << 20)))
    with pytest.raises(ValueError, match="bit length"):
        run_parties(job, _deal(rng, x))
