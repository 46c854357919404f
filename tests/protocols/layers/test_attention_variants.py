"""Attention variants of protocols.layers.attention_variants (PowerSoftmax, scaled
sigma-attention) and the softmax's fused division (tests/protocols/layers/test_softmax.py: the
softmax itself): values against their float64 references and measured traffic equal to the
declared cost, unmasked and causal.

Shapes small and odd (B=2, h=3, S=7, dh=8), |q|, |k|, |v| <= 1.5 (scores |s| <= ~6).
Stated bound: max |secure - reference| <= 2e-3 (measured over 25 runs of fresh shares:
PowerSoftmax <= 1.3e-3, sigma <= 6.0e-4, softmax "limit" 7.7e-5); every case also checks
bytes per party and rounds. PowerSoftmax's error is ~2 ulp * sum_j |v_j| / den: largest in
a causal row whose only score is ~0 (den ~ eps = 1e-2, plain p = 6: 1.3e-3).
"""
import numpy as np
import pytest

from conftest import share, value
from protocols.layers import attention_variants as V
from protocols.layers import softmax as SM
from protocols.model import variants as MV

B, H, S, DH = 2, 3, 7, 8
BOUND = 2e-3


@pytest.fixture
def qkv(rng):
    return tuple(rng.uniform(-1.5, 1.5, (B, H, S, DH)) for _ in range(3))


def _check(run, fn, ref, cost, qkv):
    q, k, v = qkv
    got = value(run(fn, share(q), share(k), share(v)))
    assert np.abs(got - ref).max() <= BOUND, np.abs(got - ref).max()
    run.assert_cost(cost)
    return got


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("form,power", [("plain", 2), ("plain", 4), ("plain", 6),
                                        ("stable", 4), ("length", 4), ("length", 6)])
def test_power_softmax(run, qkv, form, power, masked):
    _check(run, lambda p, a, b, c: V.power_softmax(p, a, b, c, power, 1e-2, form, masked),
           MV.ref_power_softmax(*qkv, power, 1e-2, form, masked),
           V.cost_power_softmax(run.cfg, B, H, S, S, DH, power, form, masked), qkv)


def test_stable_form_is_scale_free(run, qkv):
    """Eq. 5 divides each row by its largest |score|: shrinking q by 4 (every row's max
    |s| stays inside the stated [2^-6, 2^7)) leaves the stable output unchanged, while the
    plain form's output is pulled towards 0 by eps."""
    q, k, v = qkv
    k = k.copy()
    k[:, :, 0] = q[:, :, 0]                        # causal row 0 sees one score, |q_0|^2
    small = q / 4
    s = small @ np.swapaxes(k, -1, -2) / np.sqrt(DH)
    assert np.abs(s * np.tril(np.ones((S, S)))).max(-1).min() >= 2.0 ** -6
    got = value(run(lambda p, a, b, c: V.power_softmax(p, a, b, c, 4, 1e-2, "stable", True),
                    share(small), share(k), share(v)))
    ref = MV.ref_power_softmax(q, k, v, 4, 1e-2, "stable", True)
    assert np.abs(got - ref).max() <= BOUND
    plain = MV.ref_power_softmax(small, k, v, 4, 1e-2, "plain", True)
    assert np.abs(plain - ref).max() > 0.1


def test_length_form_equals_eq6_and_plain_with_eps_times_l(qkv):
    """Eq. 6 with eps is Eq. 4 with eps * L_i (the float references agree)."""
    q, k, v = qkv
    a = MV.ref_power_softmax(q, k, v, 4, 1e-2, "length", False)
    b = MV.ref_power_softmax(q, k, v, 4, 1e-2 * S, "plain", False)
    assert np.abs(a - b).max() < 1e-12


def test_power_softmax_refuses_out_of_range_parameters(run, qkv):
    q, k, v = (share(x) for x in qkv)
    for kwargs, match in (({"eps": 1e-4}, "reciprocal's range"), ({"power": 3}, "even"),
                          ({"form": "huge"}, "form")):
        with pytest.raises(ValueError, match=match):
            run(lambda p, a, b, c: V.power_softmax(p, a, b, c, **kwargs), q, k, v)
    with pytest.raises(ValueError, match="Sq == Sk"):
        run(lambda p, a, b, c: V.power_softmax(p, a, b, c, masked=True),
            share(qkv[0][:, :, :3]), k, v)


SIGMAS = ["relu", (0.0, 0.0, 1.0), (0.1, 0.5, 0.25), (0.2, 0.5, 0.3, 0.1, -0.02)]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("sigma", SIGMAS, ids=["relu", "square", "quadratic", "quartic"])
def test_sigma_attention(run, qkv, sigma, masked):
    _check(run, lambda p, a, b, c: V.sigma_attention(p, a, b, c, sigma, masked),
           MV.ref_sigma_attention(*qkv, sigma, masked),
           V.cost_sigma_attention(run.cfg, B, H, S, S, DH, sigma, masked), qkv)


def test_sigma_attention_length_and_refusals(run, qkv):
    _check(run, lambda p, a, b, c: V.sigma_attention(p, a, b, c, "relu", True, length=64),
           MV.ref_sigma_attention(*qkv, "relu", True, length=64),
           V.cost_sigma_attention(run.cfg, B, H, S, S, DH, "relu", True, length=64), qkv)
    q, k, v = (share(x) for x in qkv)
    with pytest.raises(ValueError, match="sigma"):
        run(lambda p, a, b, c: V.sigma_attention(p, a, b, c, "gelu"), q, k, v)
    with pytest.raises(ValueError, match="coefficients"):
        run(lambda p, a, b, c: V.sigma_attention(p, a, b, c, (1.0,)), q, k, v)


@pytest.mark.parametrize("masked", [False, True])
def test_sigma_attention_per_row_length(run, qkv, masked):
    """length="keys": each row divided by its own number of keys (i + 1 when causal), the
    form models use; unmasked it is the paper's constant Sk."""
    want = MV.ref_sigma_attention(*qkv, "relu", masked, length="keys")
    rows = np.arange(1, S + 1)[:, None] if masked else S
    by_hand = (np.maximum(MV.scores(*qkv[:2]), 0) * (np.tril(np.ones((S, S))) if masked else 1)
               ) @ qkv[2] / rows
    assert np.abs(want - by_hand).max() < 1e-12
    _check(run, lambda p, a, b, c: V.sigma_attention(p, a, b, c, "relu", masked, "keys"),
           want, V.cost_sigma_attention(run.cfg, B, H, S, S, DH, "relu", masked, "keys"), qkv)
    with pytest.raises(ValueError, match="relu' only"):
        V.cost_sigma_attention(run.cfg, B, H, S, S, DH, (0.0, 1.0), masked, "keys")


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", ["softmax", "power-plain", "power-stable"])
def test_fused_division_matches_and_saves_four_rounds(run, qkv, kind, masked):
    """fused=True (the models' form): (e @ v) / den with e @ v and the product by 1/den
    riding in the reciprocal's Newton products - same values, 4 rounds fewer."""
    if kind == "softmax":
        fn = lambda fused: lambda p, a, b, c: SM.softmax_attention(  # noqa: E731
            p, a, b, c, masked=masked, exp="limit", fused=fused)
        ref = MV.ref_softmax_attention(*qkv, masked=masked)
        cost = lambda fused: SM.cost_softmax_attention(  # noqa: E731
            run.cfg, B, H, S, S, DH, masked, "limit", fused)
    else:
        form = kind.split("-")[1]
        fn = lambda fused: lambda p, a, b, c: V.power_softmax(  # noqa: E731
            p, a, b, c, 4, 1e-2, form, masked, fused)
        ref = MV.ref_power_softmax(*qkv, 4, 1e-2, form, masked)
        cost = lambda fused: V.cost_power_softmax(  # noqa: E731
            run.cfg, B, H, S, S, DH, 4, form, masked, 1e-2, fused)
    _check(run, fn(True), ref, cost(True), qkv)
    assert cost(True).rounds == cost(False).rounds - 4
