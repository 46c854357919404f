"""One documented range per range-limited kernel: the stated error bound holds across the
whole range (edges included), and just outside it the kernel does what its documentation
says. Constants: arith.product_limit, convert.relu_limit, fxp.SQRT_INV_RANGE,
fxp.RECIPROCAL_RANGE, fxp.EXP_RANGE and the fxp *_ERROR claims.

"prob" truncation fails with a documented probability per element (~|z|/2^64 per product);
where a prob-mode check could meet such an event, it allows as many elements as the documented
rate (fxp.PROB_FAILURE) makes likely (conftest.failure_allowance; each failure is a garbage
value, far outside any bound).
"""
import numpy as np
import pytest

from conftest import Run, failure_allowance, share, value
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.shares import planes_to_bits
from mpc3.kernels import arith, convert, fxp

F = ring.DEFAULT_FRAC
ULP = 2.0 ** -F
MODES = ["exact", "prob"]


def _q(x):
    """The values actually shared (encoding rounds to the nearest ulp)."""
    return ring.decode(ring.encode(np.asarray(x, dtype=float)))


def _claim(got, ref, rel, ulps, failures=0):
    bad = np.abs(got - ref) > rel * np.abs(ref) + ulps * ULP
    assert bad.sum() <= failures, (np.flatnonzero(bad)[:5], got[bad][:5], ref[bad][:5])


def _allowed(mode, kernel, n):
    return failure_allowance(n, fxp.PROB_FAILURE[kernel]) if mode == "prob" else 0


def _wrong(got, ref, tol=1e-3):
    return np.abs(got - ref) > tol * np.maximum(np.abs(ref), 1.0)


# ------------------------------------------------------------ products: product_limit ----
def _factors(rng, lo, hi, n):
    z = rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)
    return np.sign(z) * np.sqrt(np.abs(z)), np.sqrt(np.abs(z))


def test_products_exact_inside_product_limit(rng):
    lim = arith.product_limit(F)
    assert lim == 2.0 ** 26
    x, y = _factors(rng, 0, 0.999 * lim, 2000)
    x[:2], y[:2] = [-np.sqrt(0.999 * lim), np.sqrt(0.999 * lim)], np.sqrt(0.999 * lim)
    x, y = _q(x), _q(y)
    got = value(Run()(lambda p, a, b: arith.mul_aa(p, a, b), share(x), share(y)))
    _claim(got, x * y, 0, 1)
    # matmul: every output a sum of 8 products, near +-lim
    c = np.sqrt(0.999 * lim / 8)
    a, b = _q(rng.choice([-1.0, 1.0], (6, 1)) * np.full((6, 8), c)), _q(np.full((8, 3), c))
    got = value(Run()(lambda p, u, v: arith.matmul_aa(p, u, v), share(a), share(b)))
    assert np.abs(a @ b).max() > 0.99 * lim
    _claim(got, a @ b, 0, 1)
    # a frac-bit operand times a (frac + 8)-bit one, truncated by frac + 8: limit 2^18
    lim8 = arith.product_limit(F, 8)
    x, y = _factors(rng, 0, 0.999 * lim8, 2000)
    x, y8 = _q(x), ring.decode(ring.encode(y, F + 8), F + 8)
    got = value(Run()(lambda p, u, v: arith.mul_aa(p, u, v, trunc=F + 8),
                      share(x), share(y8, F + 8)))
    _claim(got, x * y8, 0, 1)


def test_products_outside_product_limit(rng):
    """Exact mode: from 2^26 the truncation's offset no longer covers the sum (part of the
    results wrong), from 2^27 the product wraps in the ring (nearly all wrong)."""
    lim = arith.product_limit(F)
    for lo, hi, share_wrong in ((lim, 2 * lim, 0.05), (2 * lim, 4 * lim, 0.5)):
        x, y = _factors(rng, lo, hi, 2000)
        got = value(Run()(lambda p, a, b: arith.mul_aa(p, a, b), share(x), share(y)))
        assert _wrong(got, _q(x) * _q(y)).mean() > share_wrong
    a = np.full((40, 4), np.sqrt(3 * lim / 4))                # matmul sums of 3 * 2^26
    got = value(Run()(lambda p, u, v: arith.matmul_aa(p, u, v), share(a), share(a.T.copy())))
    assert _wrong(got, _q(a) @ _q(a).T).mean() > 0.5


def test_prob_products_fail_with_documented_probability(rng):
    """prob mode has no sharp limit: a product z fails w.p. ~|z| 2^(2f) / 2^64."""
    x, y = _factors(rng, 2.0 ** 22, 2.0 ** 23, 6000)
    got = value(Run(RingConfig(trunc="prob"))(lambda p, a, b: arith.mul_aa(p, a, b),
                                              share(x), share(y)))
    rate = _wrong(got, _q(x) * _q(y)).mean()
    expected = np.mean(np.abs(x * y)) * 2.0 ** (2 * F - 64)               # ~2.3 %
    assert 0.5 * expected < rate < 1.5 * expected, (rate, expected)


# -------------------------------------------------------------- DReLU: relu_limit ----
CFG = RingConfig()
DROP = 2.0 ** (CFG.relu_drop_bits - CFG.frac)             # documented error region [-DROP, 0)


def _drelu(x):
    out = Run()(lambda p, a: convert.drelu_a(p, a), share(x))
    return planes_to_bits(out[0].a ^ out[1].a ^ out[2].a, x.size)[0]


def test_drelu_relu_exact_inside_relu_limit(rng):
    lim = convert.relu_limit(CFG)
    assert lim == 2.0 ** 14
    x = _q(np.concatenate([[lim - ULP, -(lim - ULP), lim / 2, -lim / 2, 0.0, -DROP * 1.01],
                           rng.uniform(-lim, lim, 3000)]))
    d = _drelu(x)
    outside = (x >= 0) | (x < -DROP)
    assert (d[outside] == (x[outside] >= 0)).all()
    relu = value(Run()(lambda p, a: convert.relu_a(p, a), share(x)))
    _claim(relu, np.maximum(x, 0), 0, DROP / ULP)
    msb = Run()(lambda p, a: convert.msb_a(p, a), share(x))
    m = planes_to_bits(msb[0].a ^ msb[1].a ^ msb[2].a, x.size)[0]
    assert (m[outside] == (x[outside] < 0)).all()


def test_drelu_outside_relu_limit(rng):
    """The window keeps one bit of margin: signs are still right up to 2^15 - 2^-8; on
    [2^15, 2^16) every sign is wrong, on [2^16, 2^17) about half."""
    lim = convert.relu_limit(CFG)
    sign = rng.choice([-1.0, 1.0], 2000)
    x = _q(sign * rng.uniform(lim, 2 * lim - 2.0 ** -8, 2000))
    assert (_drelu(x) == (x >= 0)).all()
    x = _q(sign * rng.uniform(2 * lim, 4 * lim, 2000))
    assert (_drelu(x) != (x >= 0)).mean() > 0.99
    x = _q(sign * rng.uniform(4 * lim, 8 * lim, 2000))
    assert 0.4 < (_drelu(x) != (x >= 0)).mean() < 0.6


# ---------------------------------------------------- sqrt_inv, reciprocal: ranges ----
def _log_sweep(rng, lo, hi, n):
    return _q(np.concatenate([[lo, hi], 2.0 ** np.linspace(np.log2(lo), np.log2(hi), n // 2),
                              2.0 ** rng.uniform(np.log2(lo), np.log2(hi), n - n // 2)]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ["fast", "lean"])
def test_sqrt_inv_bound_across_range(mode, method, rng):
    lo, hi = fxp.SQRT_INV_RANGE
    assert (lo, hi) == (2.0 ** -12, 2.0 ** 16)
    x = _log_sweep(rng, lo, hi, 2000 if method == "lean" else 320)
    f = lambda p, a: fxp.sqrt_inv_a(p, a, method)                          # noqa: E731
    got = np.concatenate([value(Run(RingConfig(trunc=mode))(f, share(c)))
                          for c in np.array_split(x, 1 if method == "lean" else 20)])
    rel, ulps = fxp.SQRT_INV_ERROR[method][mode]
    _claim(got, 1 / np.sqrt(x), rel, ulps, _allowed(mode, "sqrt_inv", x.size))


@pytest.mark.parametrize("method,span", [("fast", (-3, 7)), ("lean", (2, 5)),
                                         ("fast", (fxp.LOG_HI - 1, fxp.LOG_HI))])
def test_sqrt_inv_span_keeps_the_bound_on_its_octaves(method, span, rng):
    """A table narrowed to the octaves ``span`` (a calibrated LayerNorm) meets the same error
    claim there, saturates at the span's ends outside it, declares its (smaller) cost and
    sends exactly that; a span outside [LOG_LO, LOG_HI] or not whole octaves is refused."""
    lo, hi = 2.0 ** span[0], 2.0 ** span[1]
    x = _log_sweep(rng, lo, hi, 320)
    def f(p, a):
        before = p.stats.snapshot()
        return fxp.sqrt_inv_a(p, a, method, span), p.stats.snapshot() - before
    from mpc3.sim import run_parties
    shares = share(x)
    out = run_parties(f, [(shares[i],) for i in range(3)])
    got = value([o[0] for o in out])
    rel, ulps = fxp.SQRT_INV_ERROR[method]["exact"]
    _claim(got, 1 / np.sqrt(x), rel, ulps, 0)
    declared = fxp.cost_sqrt_inv(x.size, RingConfig(frac=18, trunc="exact"), method, span)
    assert tuple(o[1].bytes_sent for o in out) == declared.bytes_per_party
    assert max(o[1].rounds for o in out) == declared.rounds \
        == fxp.cost_sqrt_inv(x.size, RingConfig(frac=18, trunc="exact"), method).rounds
    assert declared.bytes_total < \
        fxp.cost_sqrt_inv(x.size, RingConfig(frac=18, trunc="exact"), method).bytes_total
    if method == "fast":                          # outside: the span's end values
        edge = value(Run()(lambda p, a: fxp.sqrt_inv_a(p, a, "fast", span),
                           share(_q([lo / 4, hi * 1.4]))))   # below 2^17: the window
        np.testing.assert_allclose(edge, [lo ** -0.5, hi ** -0.5], rtol=1e-4, atol=2 * ULP)
    for bad in ((fxp.LOG_LO - 1, 0), (3, 3), (0.5, 2), (2, fxp.LOG_HI + 1)):
        with pytest.raises(ValueError, match="span"):
            fxp.check_span(bad)


@pytest.mark.parametrize("mode", MODES)
def test_reciprocal_bound_across_range(mode, rng):
    lo, hi = fxp.RECIPROCAL_RANGE
    assert (lo, hi) == (2.0 ** -12, 2.0 ** 16)
    x = _log_sweep(rng, lo, hi, 2000)
    got = value(Run(RingConfig(trunc=mode))(lambda p, a: fxp.reciprocal_a(p, a), share(x)))
    rel, ulps = fxp.RECIPROCAL_ERROR[mode]
    _claim(got, 1 / x, rel, ulps, _allowed(mode, "reciprocal", x.size))


def test_sqrt_inv_reciprocal_outside_range():
    """Below 2^-12 the table saturates: "fast" gives exactly 2^6 (also for x <= 0), lean and
    reciprocal no longer converge (x = 0: 1.5^2 * 2^6.0625 and 4 * 2^12). Above 2^16 "fast"
    gives exactly 2^-8, lean drifts (0.1 % off at 2^16.5, 6 % at 2^16.99), reciprocal stays within 3 ulp (its output is
    below 4 ulp); from 2^17 the comparisons leave their window: garbage."""
    below = _q([2.0 ** -14, 2.0 ** -12.5, 0.0, -ULP, -1.0, -1000.0])
    above = _q([2.0 ** 16.5, 2.0 ** 16.99])
    far = _q([2.0 ** 18, 2.0 ** 20])
    x = np.concatenate([below, above, far])
    fast = value(Run()(lambda p, a: fxp.sqrt_inv_a(p, a, "fast"), share(x)))
    lean = value(Run()(lambda p, a: fxp.sqrt_inv_a(p, a, "lean"), share(x)))
    recip = value(Run()(lambda p, a: fxp.reciprocal_a(p, a), share(x)))
    nb, na = below.size, above.size
    assert (fast[:nb] == 2.0 ** 6).all() and (fast[nb:nb + na] == 2.0 ** -8).all()
    assert np.abs(lean[0] * np.sqrt(x[0]) - 1) > 1e-3                       # 2^-14: 0.6 % off
    assert np.abs(lean[2] / (1.5 ** 2 * 2 ** 6.0625) - 1) < 1e-3             # x = 0
    assert np.abs(recip[0] * x[0] - 1) > 0.1                                 # 2^-14: 32 % off
    assert np.abs(recip[2] - 2.0 ** 14) < 1e-3                               # x = 0
    drift = np.abs(lean[nb:nb + na] * np.sqrt(above) - 1)                # guess saturates
    assert drift[0] < 1e-2 and 0.03 < drift[1] < 0.1                     # <= 0.1 % / 6 % off
    _claim(recip[nb:nb + na], 1 / above, 0, 3)
    for got, ref in ((fast, 1 / np.sqrt(far)), (lean, 1 / np.sqrt(far)), (recip, 1 / far)):
        assert (np.abs(got[-far.size:] / ref - 1) > 0.5).all()


# ------------------------------------------------------------------ exp: EXP_RANGE ----
def _exp(x, mode="exact"):
    return value(Run(RingConfig(trunc=mode))(lambda p, a: fxp.exp_a(p, a), share(x)))


@pytest.mark.parametrize("mode", MODES)
def test_exp_bound_across_range(mode, rng):
    """|error| <= EXP_ERROR ulps on [lo, 0], <= EXP_ERROR rel on [0, hi]; never negative."""
    lo, hi = fxp.EXP_RANGE
    assert (lo, hi) == (-48.0, 9.5)
    x = _q(np.concatenate([[lo, 0.0, hi, -ULP, ULP], np.linspace(lo, hi, 4000),
                           rng.uniform(lo, hi, 4000), rng.uniform(-2, 2, 2000)]))
    got = _exp(x, mode)
    rel, ulps = fxp.EXP_ERROR[mode]
    neg = x <= 0
    failures = _allowed(mode, "exp", x.size)
    _claim(got[neg], np.exp(x[neg]), 0, ulps, failures)
    _claim(got[~neg], np.exp(x[~neg]), rel, 0, failures)
    assert (got < 0).sum() <= failures


def test_exp_outside_range(rng):
    """Below -48 the polynomial's product wraps by exactly 1.0, so results still round to
    0 or 1 ulp down to -96 (garbage from about -120); above 9.5 exact mode is still right
    up to 14 ln 2 = 9.70, then the last square wraps for a growing share of inputs."""
    lo, hi = fxp.EXP_RANGE
    got = _exp(_q(rng.uniform(-96, lo, 3000)))
    assert ((got == 0) | (got == ULP)).all()
    got = _exp(_q(rng.uniform(-400, -200, 1000)))
    assert (np.abs(got) > ULP).mean() > 0.9
    x = _q(rng.uniform(hi, 9.69, 1000))
    _claim(_exp(x), np.exp(x), fxp.EXP_ERROR["exact"][0], 0)
    x = _q(rng.uniform(10, 11, 1000))
    assert _wrong(_exp(x), np.exp(x)).mean() > 0.3
