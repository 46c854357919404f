"""silu_a: the error claim across its one range |x| <= silu_limit (2^13), dense where the
polynomials are, in both truncation modes and both methods; exactly 0 and x beyond them;
what it does just outside the range; its rounds and declared cost; the float64 tables behind
it; its site on a shadow party and the calibration's range check there. (Value and declared
traffic at catalog sizes: tests/mpc3/test_kernel_catalog.py.)"""
import numpy as np
import pytest

from helpers.piecewise_checks import (CFG, F, METHODS, Activation, check_outside_the_range,
                                      check_rounds_and_cost, quantized, quartic_segments)

from mpc3 import ring
from mpc3.kernels import silu as S
from mpc3.kernels import thresholds
from mpc3.party import RingConfig
from mpc3.shadow import ShadowParty

SILU = Activation(S.silu_a, S.cost_silu, S.silu_ref, S.SILU_ERROR, S.SILU_PROB_FAILURE,
                  lambda method: S.SILU_BREAKS[-1] if method == "segments"
                  else S.silu_cheb_threshold())
_q, _outer, _allowed = quantized, SILU.outer, SILU.allowed


def _silu(x, mode="exact", method="auto"):
    return SILU.secure(x, mode, method)


def _breaks(method):
    T = _outer(method)
    return np.array(S.SILU_BREAKS if method == "segments" else (-T, T))


def test_auto_picks_by_call_size():
    lean = thresholds.ROUND_LEAN_ELEMENTS
    assert S.silu_method("auto", lean) == "segments"
    assert S.silu_method("auto", lean + 1) == "cheb"
    with pytest.raises(ValueError, match="silu_a: unknown method"):
        S.silu_method("spline", 10)


def test_range_is_half_the_relu_limit():
    assert S.silu_limit(CFG) == 2.0 ** 13
    assert S.silu_limit(RingConfig(relu_bound_bits=12)) == 2.0 ** 11


def test_reference_in_the_tails():
    """silu_ref keeps its relative precision far left (no 1 - 1 cancellation) and is x
    far right; SiLU(-x) = SiLU(x) - x."""
    assert S.silu_ref(-16.0) == pytest.approx(-16 / (1 + np.exp(16)), rel=1e-14)
    assert S.silu_ref(-800.0) == 0.0 and S.silu_ref(800.0) == 800.0
    x = np.linspace(-20, 20, 4001)
    np.testing.assert_allclose(S.silu_ref(-x), S.silu_ref(x) - x, atol=1e-14)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_error_bound_over_dense_grid_and_range(mode, method, rng):
    """4e4 points on [-14, 14] (every threshold +- a few ulp and DReLU's either-answer
    region included), a log sweep to the range's ends and the ends themselves: max |err| <=
    SILU_ERROR (measured exact: segments 3.62e-4, cheb 5.63e-4 - both the tails at the
    outermost threshold; prob: 4.11e-4, 5.77e-4)."""
    lim = S.silu_limit(CFG)
    T, t = _outer(method), _breaks(method)
    sweep = 2.0 ** np.linspace(-3, np.log2(lim), 600)
    x = _q(np.concatenate([np.linspace(-14, 14, 40001),
                           (t[:, None] + np.arange(-4, 5) * 2.0 ** -F).ravel(),
                           t - 2.0 ** -12, sweep, -sweep, [lim, -lim],
                           rng.uniform(-lim, lim, 2000)]))
    err = np.abs(_silu(x, mode, method) - S.silu_ref(x))
    assert (err > S.SILU_ERROR[mode]).sum() <= _allowed(mode, method, x), \
        (x[err.argmax()], err.max())
    if mode == "exact":                                 # the claim is not vacuous
        lo, hi = (3e-4, 4e-4) if method == "segments" else (5e-4, 6e-4)
        assert lo < err.max() < hi
        tails = np.abs(x) > T + 2.0 ** -12             # beyond DReLU's either-answer region
        # exact by construction there: |SiLU - ReLU| <= T sigmoid(-T)
        assert (err[tails] <= -S.silu_ref(-T) + 2 * 2.0 ** -F).all()


@pytest.mark.parametrize("method", METHODS)
def test_extremes_are_exactly_zero_or_x(method):
    """Beyond the outermost thresholds (and DReLU's region) the telescoping injection
    gives 0 or x exactly, in the ring: at the range's ends, one ulp inside them, and just
    past the thresholds."""
    lim, T = S.silu_limit(CFG), _outer(method)
    x = _q(np.array([lim, lim - 2.0 ** -F, T + 2.0 ** -11, 100.0]))
    x = np.concatenate([x, -x])
    got = _silu(x, method=method)
    np.testing.assert_array_equal(got[x > 0], x[x > 0])
    np.testing.assert_array_equal(got[x < 0], 0.0)


@pytest.mark.parametrize("method", METHODS)
def test_outside_the_range(method):
    """Up to |x| < 2^15 - 10.25 the comparisons stay in DReLU's window (one bit of margin):
    still right. From 2^15 + 10.25 to 2^16 - 10.25 every comparison is wrong: positive x
    give 0, negative x give x. (Further out about half are wrong: garbage.)"""
    check_outside_the_range(SILU, method, S.silu_limit(CFG), S.SILU_BREAKS[-1])


@pytest.mark.parametrize("method,mode,rounds", [
    ("segments", "exact", 6), ("segments", "prob", 4), ("cheb", "exact", 12), ("cheb", "prob", 7)])
def test_rounds_and_declared_cost(method, mode, rounds, rng):
    check_rounds_and_cost(SILU, method, mode, rounds, 12.0, rng)


def test_cheb_sends_about_seventy_percent_of_the_bytes():
    """Per element at 2^16 elements, exact mode: 2 comparisons, 6 products, 2 injections
    (286.9 B over the three parties) against 6, 6, 6 (409.9 B); gelu_a's: 223.5 / 348.8 B."""
    n = 1 << 16
    cheb, seg = (S.cost_silu(n, CFG, m).bytes_total / n for m in METHODS[::-1])
    assert cheb < 0.71 * seg and 280 < cheb < 295 and 400 < seg < 420, (cheb, seg)
    assert S.cost_silu(n, CFG).bytes_total == S.cost_silu(n, CFG, "cheb").bytes_total
    assert S.cost_silu(1 << 14, CFG) == S.cost_silu(1 << 14, CFG, "segments")


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_table_in_float64(mode):
    """The quantised quartics alone (no fixed point) meet 3.3e-4 (exact) / 4.1e-4 (prob)
    on their segments with the 2^-10 fitting margin, their selected products stay below
    3.5 (the scales' headroom, module docstring); the tails meet 3.63e-4."""
    e, K = S.SILU_SCALES[mode]
    table = S.silu_table(e, K)
    a = table[1]
    worst = 0.0
    for j, x, u, poly in quartic_segments(table, S.SILU_BREAKS, e, K):
        worst = max(worst, np.abs(poly - S.silu_ref(x)).max())
        assert np.abs(poly - a[j, 0]).max() < 3.5
    assert worst < {"exact": 3.3e-4, "prob": 4.1e-4}[mode]
    x = np.linspace(S.SILU_BREAKS[-1], 60, 2000)
    assert np.abs(S.silu_ref(x) - x).max() < 3.63e-4
    assert np.abs(S.silu_ref(-x)).max() < 3.63e-4


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_cheb_table_in_float64(mode):
    """T^2 = 2^12 / 43 exactly as the ring computes z; the product basis spans the
    Chebyshev polynomials of degree <= 12 in z (one degree-12 Chebyshev series reproduces
    the fitted polynomial); its coefficients are K-bit; without fixed point it meets
    5.35e-4 (prob, K = 13) / 4.7e-4 (exact, K = 18) on |x| <= T + 2^-10, and |value| <= 6.8
    (the headroom of the scales); beyond T, |SiLU - ReLU| < 5.64e-4."""
    K = S.SILU_CHEB_SCALES[mode][1]
    T = S.silu_cheb_threshold()
    assert T * T * 43 == pytest.approx(2 ** 12)
    c = S.silu_cheb_table(K)
    assert (c[1:] * 2 ** K == np.round(c[1:] * 2 ** K)).all()
    x = np.linspace(-T - 2.0 ** -10, T + 2.0 ** -10, 20001)
    z = 43 * x * x / 2 ** 11 - 1
    poly = S._cheb_basis(z) @ c
    series = np.polynomial.chebyshev.chebfit(z, poly, 12)
    assert np.abs(np.polynomial.chebyshev.chebval(z, series) - poly).max() < 1e-9
    low = np.polynomial.chebyshev.chebfit(z, poly, 10)        # T_11, T_12 are needed
    assert np.abs(np.polynomial.chebyshev.chebval(z, low) - poly).max() > 1e-4
    err = np.abs(poly + x / 2 - S.silu_ref(x)).max()
    assert err < {"exact": 4.7e-4, "prob": 5.35e-4}[mode]
    assert np.abs(poly - c[0] + x / 2).max() < 6.8
    x = np.linspace(T, 60, 2000)
    assert np.abs(S.silu_ref(x) - x).max() < 5.64e-4


def test_site_is_recorded_on_a_shadow_party_and_checked_by_the_calibration():
    """On a shadow party silu_a is the ideal SiLU and reports |x| at its site; the site's
    range is silu_limit, so a calibration whose hidden_silu exceeds it (with the margin)
    refuses the model naming the site and the kernel."""
    from protocols.calibration import calibrate as C
    from protocols.calibration.shadow import ShadowRecorder
    from protocols.calibration.site_catalog import SITES, site_range
    rec = ShadowRecorder(CFG)
    p = ShadowParty(CFG, rec).at("dec.0.ffn")
    x = _q([-3.0, 0.5, 7.25, -20.0])
    out = S.silu_a(p, ShadowParty.share(ring.encode(x)), site="hidden_silu")
    np.testing.assert_allclose(ring.decode(out.a + out.b), S.silu_ref(x), atol=2.0 ** -F)
    assert rec.values == {"dec.0.ffn": {"hidden_silu": 20.0}}
    assert SITES["hidden_silu"].kernel == "silu"
    assert site_range("hidden_silu", CFG) == (0.0, S.silu_limit(CFG))
    ok = C.Calibration(layers=rec.values, input_range={"X": 1.0})
    assert ok.fill("dec.0.ffn", "hidden_silu") == 20.0 * ok.margin / 2 ** 13
    ok.check()
    bad = C.Calibration(layers={"dec.0.ffn": {"hidden_silu": 2.0 ** 13}}, input_range={"X": 1.0})
    with pytest.raises(C.RangeError, match="dec.0.ffn: FFN hidden .* limit 8192 of SiLU"):
        bad.check()
