"""Arithmetic kernels against numpy, measured traffic against declared cost."""
import numpy as np
import pytest

from conftest import EDGE, Run, prob_trunc_allowance, share, value
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sharing import deal, reveal
from mpc3.kernels import arith, truncation

ULP = 2.0 ** -ring.DEFAULT_FRAC
F = ring.DEFAULT_FRAC


def _allowed(mode, z):
    """How many elements a check may lose to "prob" truncation's documented failure event
    (w.p. ~|z| / 2^64 per truncated ring value z, conftest.prob_trunc_allowance); each such
    failure leaves the output off by 2^(64 - shift) in the ring - garbage, far beyond any
    bound here. Exact mode: none."""
    return prob_trunc_allowance(z) if mode == "prob" else 0


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_mul_fixed_point(mode, rng):
    run = Run(RingConfig(trunc=mode))
    x = np.concatenate([EDGE, rng.normal(size=200) * 30])
    y = np.concatenate([EDGE[::-1] / 1000, rng.normal(size=200)])
    out = run(lambda p, a, b: arith.mul_aa(p, a, b), share(x), share(y))
    # inputs carry 1/2 ulp encoding error each; the truncated product adds less than one ulp
    bound = ULP + ULP / 2 * (np.abs(x) + np.abs(y)) + ULP ** 2
    err = np.abs(value(out) - x * y)
    # prob: ~1.4e-5 expected failures here (a failure is off by 2^(64 - 2f) = 2^28)
    bad = err > bound
    assert bad.sum() <= _allowed(mode, x * y * 2.0 ** (2 * F)) and (err[bad] > 2.0 ** 27).all()
    run.assert_cost(arith.cost_mul(x.size, RingConfig(trunc=mode)))


def test_mul_integer_and_open(run, rng):
    x = rng.integers(0, 2**64, size=(5, 7), dtype=np.uint64)
    y = rng.integers(0, 2**64, size=(5, 7), dtype=np.uint64)
    out = run(lambda p, a, b: arith.open_a(p, arith.mul_aa(p, a, b, trunc=False)), deal(x), deal(y))
    assert all((o == x * y).all() for o in out)
    assert run.rounds == 2


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_matmul_fixed_point(mode, rng):
    run = Run(RingConfig(trunc=mode))
    a, b = rng.normal(size=(2, 9, 33)), rng.normal(size=(33, 5))
    out = run(lambda p, x, y: arith.matmul_aa(p, x, y), share(a), share(b))
    err = np.abs(value(out) - a @ b)
    bad = err >= 40 * ULP                  # prob: ~1.7e-6 expected failures, each off by 2^28
    assert bad.sum() <= _allowed(mode, a @ b * 2.0 ** (2 * F)) and (err[bad] > 2.0 ** 27).all()
    run.assert_cost(arith.cost_mul(2 * 9 * 5, RingConfig(trunc=mode)))


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_trunc(mode, rng):
    run = Run(RingConfig(trunc=mode))
    x = np.concatenate([EDGE, rng.normal(size=100) * 100])
    out = run(lambda p, a: truncation.trunc_a(p, a, 7), share(x * 128))
    assert np.abs(value(out) - x).max() < ULP * (1 + 2.0 ** -8)   # stochastic rounding + encoding
    run.assert_cost(truncation.cost_trunc(x.size, RingConfig(trunc=mode), 7))


def _forced_wrap_shares(x_ring):
    """Shares whose split form puts A in the probabilistic truncation's failure window."""
    n = x_ring.size
    slot0 = np.full(n, (1 << 63) - 10, dtype=np.uint64)   # A = 2^63 - 5: B wraps for x < 0
    slot1 = np.full(n, 5, dtype=np.uint64)
    slot2 = x_ring - slot0 - slot1
    return [arith.AShare(s1.copy(), s2.copy()) for s1, s2 in
            ((slot0, slot1), (slot1, slot2), (slot2, slot0))]


def test_exact_truncation_never_fails_where_share_truncation_does():
    x = np.full(6, -3.25)
    shares = _forced_wrap_shares(ring.encode(x * 2.0 ** 18))
    exact = Run(RingConfig(trunc="exact"))(lambda p, a: truncation.trunc_a(p, a), shares)
    assert np.abs(value(exact) - x).max() <= ULP
    prob = Run(RingConfig(trunc="prob"))(lambda p, a: truncation.trunc_a(p, a), shares)
    assert np.abs(value(prob) - x).max() > 1e8          # the classic failure event (group 0)


def test_public_ops(run, rng):
    x, c = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    def f(p, a):
        y = arith.matmul_public(a, ring.encode(c))
        y = truncation.trunc_a(p, y)
        return arith.add_public(p, y, ring.encode(np.ones((4, 3))))
    assert np.abs(value(run(f, share(x))) - (x @ c + 1)).max() < 10 * ULP


def test_open_to_one_party(run, rng):
    x = rng.integers(0, 2**64, size=10, dtype=np.uint64)
    out = run(lambda p, a: arith.open_a(p, a, to=2), deal(x))
    assert out[0] is None and out[1] is None and (out[2] == x).all()
    run.assert_cost(arith.cost_open_a(10, to=2))


def test_bad_inputs_raise(run):
    good = share(np.ones(3))
    with pytest.raises(TypeError, match="uint64"):
        arith.AShare(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        arith.AShare(np.zeros(3, np.uint64), np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="shapes differ"):
        run(lambda p, a, b: arith.mul_aa(p, a, b), good, share(np.ones(4)))
    with pytest.raises(ValueError, match="inner dimensions"):
        run(lambda p, a, b: arith.matmul_aa(p, a, b), share(np.ones((2, 3))), share(np.ones((4, 2))))
    with pytest.raises(ValueError):
        RingConfig(trunc="zero-masks")


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_mul_many_mixed_truncation(mode, rng):
    run = Run(RingConfig(trunc=mode))
    x, y, w = rng.normal(size=(5, 8)), rng.normal(size=(5, 8)), rng.normal(size=(8, 3))
    keep = np.tril(np.ones((5, 8), dtype=bool))
    sc = truncation.scaled(0.5, ring.DEFAULT_FRAC, 12)
    def f(p, a, b, c):
        return arith.mul_many_aa(p, [(a, b, "mul", True), (a, c, "matmul", False),
                                     (a, b, "mul", 10, keep), (a, b, "mul", False, keep),
                                     (a, b, "mul", sc, keep)])
    out = run(f, share(x), share(y), share(w))
    got = [reveal([o[k] for o in out]) for k in range(5)]
    assert np.abs(ring.decode(got[0]) - x * y).max() < 3 * ULP
    assert np.abs(ring.decode(got[1], 36) - x @ w).max() < 1e-4
    assert np.abs(ring.decode(got[2], 26) - np.where(keep, x * y, 0)).max() < 1e-4
    assert np.abs(ring.decode(got[3], 36) - np.where(keep, x * y, 0)).max() < 1e-4
    assert np.abs(ring.decode(got[4]) - np.where(keep, x * y / 2, 0)).max() < 3 * ULP
    k = int(keep.sum())
    shifts = np.concatenate([np.full(40, 18), np.full(k, 10), np.full(k, sc.shift)])
    run.assert_cost(arith.cost_mul_many(shifts, 15 + k, mode))


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_mul_split_with_replicated_items(mode, rng):
    """mul_split_aa(..., replicated=[...]): in the same rounds the split items feed relu_a
    (their own element groups) and the replicated ones come back completed; traffic is the
    declared cost_mul_split(n, ..., n_rep) - role 0 sends U for the replicated elements only."""
    from mpc3.kernels import convert
    from mpc3.shares import SplitShare
    cfg = RingConfig(trunc=mode)
    x, w1, w2 = rng.normal(size=(1, 16)), rng.normal(size=(16, 23)) * 0.3, \
        rng.normal(size=(16, 7)) * 0.3
    y, v = rng.normal(size=5), rng.normal(size=5)
    run = Run(cfg)

    def fn(p, xs, a, b, ys, vs):
        s0 = p.stats.snapshot()
        z, (m, e) = arith.mul_split_aa(p, [(xs, a, "matmul")],
                                       replicated=[(xs, b, "matmul"), (ys, vs, "mul")])
        assert isinstance(z, SplitShare) and z.shape == (23,) and m.shape == (1, 7)
        mid = p.stats.snapshot() - s0
        return convert.relu_a(p, z), m, e, mid
    out = run(fn, share(x), share(w1), share(w2), share(y), share(v))
    ulp = 2.0 ** -ring.DEFAULT_FRAC
    np.testing.assert_allclose(value([o[0] for o in out]), np.maximum(x @ w1, 0).reshape(-1),
                               atol=8 * ulp)
    np.testing.assert_allclose(value([o[1] for o in out]), x @ w2, atol=8 * ulp)
    np.testing.assert_allclose(value([o[2] for o in out]), y * v, atol=8 * ulp)
    declared = arith.cost_mul_split(23, cfg, True, n_rep=12)
    assert tuple(o[3].bytes_sent for o in out) == declared.bytes_per_party
    assert max(o[3].rounds for o in out) == declared.rounds
    assert declared.bytes_total == arith.cost_mul_split(23, cfg, True).bytes_total \
        + arith.cost_mul(12, RingConfig(frac=cfg.frac, trunc=mode)).bytes_total


# ------------------------------------------------ scaled truncation (public factor) ----
@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_scaled_truncation_equals_the_wide_product(mode, rng):
    """floor(z * m / 2^shift) for multipliers up to 2^31 - 1, per element or one for all, z
    anywhere in the exact range (|z| < 2^62; prob: small z): never reduced mod 2^64 before
    the shift, within one unit of the 128-bit result; same rounds and bytes as an unscaled
    truncation by the same shift."""
    run = Run(RingConfig(trunc=mode))
    lim = 2 ** 61 if mode == "exact" else 2 ** 36
    z = np.concatenate([[0, 1, -1, lim - 1, -lim, 12345, -98765],
                        rng.integers(-lim, lim, 500)]).astype(np.int64)
    for shift, m in [(48, rng.integers(1, truncation.MAX_MULT + 1, z.size)),
                     (40, np.uint64(1 << 22)), (31, np.uint64(12345)), (10, np.uint64(3)),
                     (61, np.uint64(truncation.MAX_MULT))]:
        m = np.asarray(m, dtype=np.uint64)
        out = run(lambda p, a: truncation.trunc_split(
            p, arith.AShare(a.a.reshape(-1), a.b.reshape(-1)), shift, from_rss=True, mult=m),
            deal(z.astype(np.uint64), rng))
        want = [(int(a) * int(b)) >> shift for a, b in
                zip(z.tolist(), np.broadcast_to(m, z.shape).tolist())]
        err = [int(g) - w for g, w in zip(reveal(out).view(np.int64).tolist(), want)]
        # prob (|z| < 2^36, ~4.7e-6 expected failures in all): a failed element is off by
        # exactly m 2^(64 - shift) mod 2^64 (the omitted carry term, scaled like the rest)
        bad = [k for k, e in enumerate(err) if not 0 <= e <= 1]
        assert len(bad) <= _allowed(mode, z), (shift, bad)
        mk = np.broadcast_to(m, z.shape).tolist()
        assert all(any((err[k] + sg * int(mk[k]) * 2 ** (64 - shift)) % 2 ** 64 in (0, 1)
                       for sg in (1, -1)) for k in bad), (shift, [err[k] for k in bad])
        run.assert_cost(truncation.cost_trunc(z.size, RingConfig(trunc=mode), shift))


def test_matmul_times_public_row_scales(run, rng):
    """o W times 1/n_i per row inside the product's truncation (attention's row scale):
    the product's rounding plus the encoding of 1/n_i with 22 fractional bits (relative
    n_i 2^-23), the rounds of one product."""
    o, w = (ring.decode(ring.encode(v)) for v in (rng.normal(size=(2, 5, 8)) * 30,
                                                  rng.normal(size=(8, 3))))
    n = np.array([1, 2, 3, 64, 1 << 20], dtype=np.float64)
    sc = truncation.scaled(1.0 / n[:, None], ring.DEFAULT_FRAC, 22)
    out = run(lambda p, a, b: arith.matmul_aa(p, a, b, sc), share(o), share(w))
    want = (o @ w) / n[:, None]
    bound = 2 * ULP + np.abs(want) * n[:, None] * 2.0 ** -23
    assert (np.abs(value(out) - want) <= bound).all()
    run.assert_cost(arith.cost_mul(2 * 5 * 3, RingConfig(trunc="exact"),
                                   sc.shift))
    mixed = run(lambda p, a, b: arith.mul_many_aa(p, [(a, b, "matmul", sc),
                                                      (a, a, "mul", True)]), share(o), share(w))
    got = [reveal([m[k] for m in mixed]) for k in range(2)]
    assert (np.abs(ring.decode(got[0]) - want) <= bound).all()
    assert np.abs(ring.decode(got[1]) - o * o).max() < 2 * ULP


def test_scaled_truncation_refuses_bad_factors(run):
    for s in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="factor"):
            truncation.scaled(s, 18)
    x = share(np.ones(4))
    for m in (0, 1 << 31):
        with pytest.raises(ValueError, match="multipliers"):
            run(lambda p, a: arith.matmul_aa(p, a.reshape(2, 2), a.reshape(2, 2),
                                             arith.Scaled(30, np.uint64(m))), x)


@pytest.mark.parametrize("force", [None, 0])
@pytest.mark.parametrize("xs, ys", [
    ((64, 100), (100, 40)), ((3, 20, 50), (50, 17)), ((2, 4, 30, 60), (2, 4, 60, 33)),
    ((40, 64), (5, 64, 20)), ((300, 49), (49, 18)), ((17, 48), (48, 16)),
    ((1, 512), (512, 64)), ((64,), (64, 30)), ((20, 47), (47, 20)), ((256, 512), (512, 256))])
def test_local_matmul_terms_sum_to_the_product(xs, ys, force, rng, monkeypatch):
    """The three parties' local terms are a 3-out-of-3 sharing of x y, exactly (Python
    integers): by the policy, and with the five-product form wherever K allows it
    (``force`` 0: FIVE_MIN_RATIO 0)."""
    if force is not None:
        monkeypatch.setattr(arith, "FIVE_MIN_RATIO", force)
    X = rng.integers(0, 2**64, size=xs, dtype=np.uint64)
    Y = rng.integers(0, 2**64, size=ys, dtype=np.uint64)
    sx, sy = deal(X, rng), deal(Y, rng)
    z = sum(arith._local_matmul(sx[i], sy[i], i) for i in range(3))
    ref = np.matmul(X.astype(object), Y.astype(object)) % (1 << 64)
    assert z.shape == ref.shape and (z.astype(object) == ref).all()


@pytest.mark.parametrize("M, K, N, five", [(256, 512, 256, True), (512, 512, 2048, True),
                                           (64, 512, 2048, True), (32, 512, 2048, False),
                                           (1, 512, 512, False), (256, 40, 256, False)])
def test_local_matmul_multiply_adds(M, K, N, five, rng, monkeypatch):
    """Each party's multiply-adds: 5/3 M K N in the five-product form (block j: one product
    at party j, two at the others) - used from FIVE_MIN_RATIO multiply-adds per operand
    element with three blocks of FIVE_MIN_K - else 2 M K N."""
    macs = []
    real = ring.matmul

    def counting(a, b, out=None, like=None):
        macs.append(int(np.prod(a.shape)) * b.shape[-1])
        return real(a, b, out, like)

    monkeypatch.setattr(arith.ring, "matmul", counting)
    sx = deal(rng.integers(0, 2**64, size=(M, K), dtype=np.uint64), rng)
    sy = deal(rng.integers(0, 2**64, size=(K, N), dtype=np.uint64), rng)
    blocks = [kb.stop - kb.start for kb in arith.k_blocks(K)]
    for rank in range(3):
        macs.clear()
        arith._local_matmul(sx[rank], sy[rank], rank)
        if five:
            own = [1 if (rank - j) % 3 == 0 else 2 for j in range(3)]
            assert sum(macs) == M * N * sum(o * b for o, b in zip(own, blocks))
            assert len(macs) == 5
        else:
            assert sum(macs) == 2 * M * K * N and len(macs) == 2
