"""DReLU / ReLU / select / b2a and the fixed-point functions."""
import numpy as np
import pytest

from conftest import EDGE, Run, prob_trunc_allowance, share, value
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.shares import AShare, BShare, SplitShare, bits_to_planes, planes_to_bits
from mpc3.sharing import reveal
from mpc3.kernels import arith, convert, fxp, leaves, thresholds

ULP = 2.0 ** -ring.DEFAULT_FRAC
CFG = RingConfig()
DROP = 2.0 ** (CFG.relu_drop_bits - CFG.frac)      # documented DReLU error region [-DROP, 0)


def _bits(out, n):
    return planes_to_bits(out[0].a ^ out[1].a ^ out[2].a, n)[0]


def _inputs(rng, n=3000):
    return np.concatenate([EDGE, [-DROP * 1.5, DROP * 1.5], rng.normal(size=n) * 50,
                           rng.uniform(-16000, 16000, size=50)])


def test_drelu(run, rng):
    x = _inputs(rng)
    xs = ring.decode(ring.encode(x))                     # the encoded values
    out = run(lambda p, a: convert.drelu_a(p, a), share(x))
    d = _bits(out, x.size)
    outside = (xs >= 0) | (xs < -DROP)
    assert (d[outside] == (xs[outside] >= 0)).all()
    assert d[xs == 0].all()                              # DReLU(0) = 1 as in the paper
    L, m = convert.window(run.parties[0])
    run.assert_cost(convert.cost_drelu(x.size, RingConfig(), win=(L, m)))


def test_drelu_exact_and_msb(run, rng):
    x = np.concatenate([_inputs(rng), [-ULP, ULP, 1e9, -1e9]])
    xs = ring.decode(ring.encode(x))
    out = run(lambda p, a: convert.msb_a(p, a, exact=True), share(x))
    assert (_bits(out, x.size) == (xs < 0)).all()


def test_relu_bytes_and_values(run, rng):
    x = _inputs(rng)
    out = run(lambda p, a: convert.relu_a(p, a), share(x))
    err = np.abs(value(out) - np.maximum(x, 0))
    assert err.max() <= DROP + ULP
    L, m = convert.window(run.parties[0])
    cost = convert.cost_relu(x.size, RingConfig(), win=(L, m))
    run.assert_cost(cost)
    assert cost.rounds == 4                     # few elements: the two-round comparison
    big = 1 << 17                               # whole sequences: the bytes-lean tree
    # issue target: <= 60 B
    assert convert.cost_relu(big, RingConfig(), win=(L, m)).bytes_total / big <= 60


def test_select_b2a_mul(run, rng):
    n = 500
    bits = rng.integers(0, 2, size=n).astype(np.uint8)
    planes = bits_to_planes(bits[None, :])
    r1, r2 = (rng.integers(0, 2**63, size=planes.shape, dtype=np.uint64) for _ in range(2))
    slots = [r1, r2, planes ^ r1 ^ r2]
    b = [BShare(slots[i], slots[(i + 1) % 3], n) for i in range(3)]
    x, y = rng.normal(size=n), rng.normal(size=n)
    out = run(lambda p, bb, xx, yy: (convert.select_ab(p, bb, xx, yy), convert.b2a(p, bb)),
              b, share(x), share(y))
    sel = value([o[0] for o in out])
    assert np.abs(sel - np.where(bits == 1, y, x)).max() <= 2 * ULP
    assert (reveal([o[1] for o in out]) == bits).all()


@pytest.mark.parametrize("n,mode", [(16, "fast"), (17, "lean")])
def test_sqrt_inv_auto_picks_by_size(run, rng, n, mode):
    """Values and bounds over the whole range: tests/mpc3/test_kernels_ranges.py."""
    x = 2.0 ** rng.uniform(-12, 16, n)
    out = run(lambda p, a: fxp.sqrt_inv_a(p, a), share(x))
    rel, ulps = fxp.SQRT_INV_ERROR[mode]["exact"]
    xq = ring.decode(ring.encode(x))
    assert (np.abs(value(out) - 1 / np.sqrt(xq)) <= rel / np.sqrt(xq) + ulps * ULP).all()
    run.assert_cost(fxp.cost_sqrt_inv(n, RingConfig(trunc="exact"), mode))
    assert fxp.cost_sqrt_inv(n, RingConfig(trunc="exact")) == \
        fxp.cost_sqrt_inv(n, RingConfig(trunc="exact"), mode)


def test_select_broadcasts_a_bit_over_a_row(run, rng):
    bits = rng.integers(0, 2, size=30).astype(np.uint8)
    planes = bits_to_planes(bits[None, :])
    zero = np.zeros_like(planes)
    b = [BShare(planes, zero, 30), BShare(zero, zero.copy(), 30), BShare(zero.copy(), planes, 30)]
    x = rng.normal(size=(30, 4))
    out = run(lambda p, bb, xx: convert.mul_ab(p, bb, xx), b, share(x))
    assert np.abs(value(out) - bits[:, None] * x).max() <= ULP
    run.assert_cost(convert.cost_inject(30, fused=False, cols=4))


def test_masked_bits_times_rows(run, rng):
    """drelu_masked then mul_masked with one row of values per bit (the pair writes its
    2-D output slots in place): DReLU(x)[:, None] * y at the declared cost."""
    x, y = rng.normal(size=30), rng.normal(size=(30, 4))
    out = run(lambda p, xx, yy: convert.mul_masked(p, convert.drelu_masked(p, xx), yy),
              share(x), share(y))
    assert np.abs(value(out) - (x >= 0)[:, None] * y).max() <= ULP
    run.assert_cost(convert.cost_drelu(30, CFG, fused=True)
                    + convert.cost_inject(30, fused=True, cols=4))


def _paper_poly(x):
    """1 + x + 0.5x^2 + 0.1665x^3 + 0.0438x^4 with the coefficients as encoded."""
    c = ring.decode(ring.encode(np.array([0.5, 0.1665, 0.0438])))
    return 1 + x + c[0] * x**2 + c[1] * x**3 + c[2] * x**4


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_exp_poly_is_the_paper_polynomial(mode, rng):
    """exp_a(method="poly"): Privformer's baseline polynomial (not exp) within a few ulp;
    exp_a("limit") is tested against exp over EXP_RANGE in tests/mpc3/test_kernels_ranges.py."""
    run = Run(RingConfig(trunc=mode))
    x = np.concatenate([[0.0, -4.0, 4.0], rng.uniform(-4, 4, 200)])
    out = run(lambda p, a: fxp.exp_a(p, a, "poly"), share(x))
    xq = ring.decode(ring.encode(x))
    # x^2, x^3, x^4 carry < 1, |x| + 1, 2 x^2 + 1 ulp; weighted by the coefficients, plus
    # the final truncation: < 4 ulp for |x| <= 4
    err = np.abs(value(out) - _paper_poly(xq))
    bad = err >= 4 * ULP
    if mode == "prob":
        # each truncated value z (x^2, x^3, x^4 and the sum, at 2 frac bits) fails w.p.
        # ~|z| / 2^64 (~6e-5 expected failures here, conftest.prob_trunc_allowance); a failure
        # is off by 2^(64 - 2 frac) = 2^28 times a coefficient >= 0.0438: garbage
        zs = np.concatenate([xq ** 2, np.abs(xq) ** 3, xq ** 4, _paper_poly(xq) - 1])
        assert bad.sum() <= prob_trunc_allowance(zs * 2.0 ** (2 * ring.DEFAULT_FRAC))
        assert (err[bad] > 1e6).all()
    else:
        assert not bad.any()
    run.assert_cost(fxp.cost_exp(x.size, RingConfig(trunc=mode), "poly"))


@pytest.mark.parametrize("n,rounds", [(300, 4), (thresholds.ROUND_LEAN_ELEMENTS, 4),
                                      (thresholds.ROUND_LEAN_ELEMENTS + 1, 7)])
def test_relu_round_lean_for_few_elements(rng, n, rounds):
    """Calls on few elements take the two-round comparison of mpc3.kernels.thresholds (a
    dealt carry: 4 rounds with the injection); whole sequences keep the tree over 3-bit
    blocks (fewest bytes). The non-fused drelu_a on few elements takes wider leaf blocks
    (one tree level less). All: values exact outside the error region, declared = measured."""
    win = convert.window_for(RingConfig())
    assert [k for _, k in leaves.leaf_blocks(win[1] - 1, n)] == \
        ([4] * 6 + [3] if rounds == 4 else [3] * 9)
    x = rng.uniform(-100, 100, n)
    run = Run()
    got = value(run(lambda p, a: convert.relu_a(p, a), share(x)))
    np.testing.assert_allclose(got, np.maximum(x, 0), atol=2 ** -11)
    run.assert_cost(convert.cost_relu(n, RingConfig(), win=win))
    assert run.rounds == rounds


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_products_in_split_form_feed_relu(mode, rng):
    """mul_split_aa (a matmul and an elementwise product, plus a replicated bias added to
    the split form) -> relu_a: the value of ReLU(products + bias), at exactly 8 bytes per
    element less than the replicated path mul_many_aa -> relu_a (role 0 never sends U)."""
    cfg = RingConfig(trunc=mode)
    x, w, y = rng.normal(size=(5, 16)), rng.normal(size=(16, 30)) * 0.3, rng.normal(size=7)
    bias = rng.normal(size=157)
    ref = np.maximum(np.concatenate([(x @ w).ravel(), y * y]) + bias, 0)

    def split(p, X, W, Y, B):
        return convert.relu_a(p, arith.mul_split_aa(p, [(X, W, "matmul"), (Y, Y, "mul")],
                                                    biases=[B[:150].reshape(5, 30), B[150:]]))

    def replicated(p, X, W, Y, B):
        z = arith.mul_many_aa(p, [(X, W, "matmul", True), (Y, Y, "mul", True)])
        return convert.relu_a(p, AShare.concat([t.reshape(-1) for t in z]) + B)

    got = {}
    for name, fn in (("split", split), ("replicated", replicated)):
        run = Run(cfg)
        got[name] = (value(run(fn, share(x), share(w), share(y), share(bias))), run)
        # prob: the 157 products fail w.p. ~|z| / 2^64 each (~6e-7 expected failures per run,
        # conftest.prob_trunc_allowance); a failure is off by 2^28 before the ReLU
        z = np.concatenate([(x @ w).ravel(), y * y]) * 2.0 ** (2 * ring.DEFAULT_FRAC)
        bad = np.abs(got[name][0] - ref) >= 2.0 ** -12 + 2.0 ** -16
        assert bad.sum() <= (prob_trunc_allowance(z) if mode == "prob" else 0)
    run = got["split"][1]
    run.assert_cost(arith.cost_mul_split(157, cfg, True) + convert.cost_relu_split(157, cfg, True))
    saved = sum(got["replicated"][1].bytes_per_party) - sum(run.bytes_per_party)
    assert saved == 8 * 157


def test_split_share_only_adds_replicated_shares():
    s = SplitShare(np.zeros(3, np.uint64), np.zeros(3, np.uint64))
    assert isinstance(s + AShare(np.ones(3, np.uint64), np.ones(3, np.uint64)), SplitShare)
    with pytest.raises(TypeError, match="only replicated shares"):
        s + s


def test_split_products_take_their_sign_in_their_own_rounds(rng):
    """On few elements mul_split_aa compares the untruncated products (+ biases) with 0 in
    its two truncation rounds (the pair's sum from the first is the comparison's B), so
    ReLU(x W + b) costs 4 rounds instead of 6 at the same bytes; the value is ReLU's. Past
    ROUND_LEAN_ELEMENTS, or when the shifted window would leave the ring, the split share
    comes back unsigned and relu_a compares (6 rounds)."""
    from mpc3.shares import SignedSplit
    x, w, b = rng.normal(size=(3, 16)), rng.normal(size=(16, 9)) * 0.3, rng.normal(size=9)
    ref = np.maximum(x @ w + b, 0)
    for trunc, signed in ((True, True), (40, False)):   # x at 40 bits: window 6 + 40 + 28
        run = Run()

        def fn(p, X, W, B):
            z = arith.mul_split_aa(p, [(X, W, "matmul")], trunc=trunc, biases=[B])
            assert isinstance(z, SignedSplit) == signed
            mid = p.stats.rounds
            return convert.relu_a(p, z.reshape(3, 9)), mid
        out = run(fn, share(x, 18 if signed else 40), share(w), share(b))
        np.testing.assert_allclose(value([o[0] for o in out]), ref, atol=2 ** -12)
        run.assert_cost(arith.cost_mul_split(27, RingConfig(), trunc)
                        + convert.cost_relu_split(27, RingConfig(), trunc))
        assert run.rounds == (4 if signed else 6) and out[0][1] == 2
    same = arith.cost_mul_split(27, RingConfig()) + convert.cost_relu_split(27, RingConfig())
    apart = arith.cost_trunc_shifts(np.full(27, ring.DEFAULT_FRAC), "exact", from_rss=False,
                                    split=True) + convert.cost_relu(27, RingConfig())
    assert same.bytes_per_party == apart.bytes_per_party and same.rounds == apart.rounds - 2


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_split_products_past_the_lean_size_take_their_leaves_in_their_own_rounds(rng, mode):
    """Past ROUND_LEAN_ELEMENTS mul_split_aa runs the DReLU's leaves (not the whole
    comparison) in its truncation's rounds: relu_a then runs the carry tree and the
    injection - 7 rounds from product to ReLU instead of 9 (exact truncation), the same
    bytes; with probabilistic truncation the same values."""
    from mpc3.shares import SignedSplit
    n = thresholds.ROUND_LEAN_ELEMENTS + 7
    x, w, b = rng.normal(size=(1, 8)), rng.normal(size=(8, n)) * 0.5, rng.normal(size=n)
    run = Run(RingConfig(trunc=mode))

    def fn(p, X, W, B):
        z = arith.mul_split_aa(p, [(X, W, "matmul")], biases=[B])
        assert isinstance(z, SignedSplit) and isinstance(z.bits, tuple)
        return convert.relu_a(p, z)
    got = value(run(fn, share(x), share(w), share(b)))
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0).reshape(-1), atol=2 ** -12)
    cfg = RingConfig(trunc=mode)
    run.assert_cost(arith.cost_mul_split(n, cfg, True) + convert.cost_relu_split(n, cfg, True))
    if mode == "prob":
        return
    apart = arith.cost_trunc_shifts(np.full(n, cfg.frac), "exact", from_rss=False, split=True) \
        + convert.cost_relu(n, cfg)
    assert run.rounds == apart.rounds - 2 == 7
    assert sum(run.bytes_per_party) == apart.bytes_total


def test_signed_split_refuses_additions_and_keeps_its_bits_when_reshaped():
    from mpc3.shares import SignedSplit
    s = SignedSplit(np.zeros(6, np.uint64), np.zeros(6, np.uint64), bits="b")
    assert s.reshape(2, 3).bits == "b" and s.reshape(2, 3).shape == (2, 3)
    with pytest.raises(TypeError, match="pass biases to mul_split_aa"):
        s + AShare(np.ones(6, np.uint64), np.ones(6, np.uint64))
