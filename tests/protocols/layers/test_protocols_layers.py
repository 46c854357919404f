"""MHA (Alg. 6), FFN (Alg. 7), LayerNorm (Alg. 5) and model sharing against protocols.model.

Small odd shapes: B=2, S=7, d_model=24, h=3, r=10, d_ff=40. Inputs uniform in [-1, 1] (MHA,
FFN) or [-5, 5] (LN). Bounds: |err| <= 1e-3 * (1 + max|ref|) for MHA/FFN (a handful of
18-bit truncations; measured ~2e-5), LN 2e-3 absolute (sqrt_inv_a relative error <= 1e-3).
"""
import functools

import conftest
import numpy as np
import pytest

from mpc3.kernels import arith, convert
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.layers.ffn import ffn
from mpc3.party import RingConfig
from protocols.layers.layernorm import cost_layernorm, layernorm
from protocols.layers.mha import mha

from conftest import Run, share, value


make_cfg = functools.partial(conftest.make_cfg, n_enc_layers=1, n_dec_layers=1)


def close(got, ref, tol=1e-3):
    err = np.max(np.abs(got - ref))
    assert err <= tol * (1 + np.max(np.abs(ref))), err


def model_shares(cfg, fold, seed=3):
    w = M.random_weights(cfg, seed)
    return w, SM.share_model(cfg, w, fold_omega=fold)


def args(sh, *xs):
    return [(sh[i],) + tuple(x[i] for x in xs) for i in range(3)]


@pytest.mark.parametrize("norm,c", [("mean", 0.5), ("const", -0.05)])
@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_mha_matches_reference(run, rng, norm, c, fold, causal):
    cfg = make_cfg(attn_norm=norm, attn_c=c)
    w, sh = model_shares(cfg, fold)
    x = rng.uniform(-1, 1, (2, 7, 24))
    pre = "dec.0.self"
    out = run(lambda p, s, xs: mha(p, cfg, SM.sub(s, pre), xs, causal=causal),
              *zip(*args(sh, share(x))))
    ref = M.ref_mha(cfg, w.sub(pre), x, x, causal=causal)
    close(value(out), ref)


@pytest.mark.parametrize("order", ["kv", "qk"])
def test_cross_mha(run, rng, order):
    cfg = make_cfg()
    w, sh = model_shares(cfg, True)
    xq, xkv = rng.uniform(-1, 1, (2, 5, 24)), rng.uniform(-1, 1, (2, 9, 24))
    pre = "dec.0.cross"
    out = run(lambda p, s, a, b: mha(p, cfg, SM.sub(s, pre), a, b, order=order),
              *zip(*args(sh, share(xq), share(xkv))))
    close(value(out), M.ref_mha(cfg, w.sub(pre), xq, xkv))


def test_mha_realistic_shape(run, rng):
    """S=32, d_model=128, h=4, r=64 (d ln d / h scale), both masked forms."""
    cfg = make_cfg(d_model=128, n_heads=4, d_head=32, n_features=64, d_ff=256,
                   attn_c=1 / 64)
    w, sh = model_shares(cfg, True)
    x = rng.uniform(-3, 3, (1, 32, 128))
    pre = "dec.0.self"
    for form in ("qk", "vk"):
        out = run(lambda p, s, xs: mha(p, cfg, SM.sub(s, pre), xs, causal=True,
                                       masked_form=form, block=8),
                  *zip(*args(sh, share(x))))
        close(value(out), M.ref_mha(cfg, w.sub(pre), x, x, causal=True))


def test_ffn_value_and_cost(run, rng):
    cfg = make_cfg()
    w, sh = model_shares(cfg, True)
    x = rng.uniform(-1, 1, (2, 7, 24))
    out = run(lambda p, s, xs: ffn(p, SM.sub(s, "enc.0.ffn"), xs), *zip(*args(sh, share(x))))
    ref = M.ref_ffn(x, *(w[f"enc.0.ffn.{k}"] for k in ("w1", "b1", "w2", "b2")))
    close(value(out), ref)
    # x W1 stops at the split form relu_a reads (mul_split_aa)
    declared = (arith.cost_mul_split(2 * 7 * 40, run.cfg)
                + convert.cost_relu_split(2 * 7 * 40, run.cfg)
                + arith.cost_mul(2 * 7 * 24, run.cfg))
    run.assert_cost(declared)


@pytest.mark.parametrize("shape", [(2, 7, 24), (3, 512), (1, 768), (2, 3, 100)])
def test_layernorm(run, rng, shape):
    d = shape[-1]
    x = rng.uniform(-5, 5, shape) + rng.uniform(-3, 3, shape[:-1] + (1,))
    g, b = 1 + 0.1 * rng.standard_normal(d), 0.1 * rng.standard_normal(d)
    eps = M.DEFAULT_LN_EPS
    out = run(lambda p, xs, gs, bs: layernorm(p, xs, gs, bs, eps), share(x), share(g), share(b))
    err = np.max(np.abs(value(out) - M.ref_layernorm(x, g, b, eps)))
    assert err < 2e-3, err
    rows = int(np.prod(shape[:-1]))
    run.assert_cost(cost_layernorm(RingConfig(), rows, d))
    if rows <= 16:      # decoding, any d (1/d a shift or a multiplier in the truncation):
        assert run.rounds == 2 + 4 + 2       # one product round before sqrt_inv, its
                                             # two-round comparison + injection, 1 product


@pytest.mark.parametrize("d", [512, 768])
def test_layernorm_large_mean_small_spread(run, rng, d):
    """var = E[x^2] - mu^2 cancels when the mean dominates the spread: a mean of 3 with a
    spread of 0.3 (E[x^2] / var ~ 100), d a power of two (exact shifts) or not (1/d as a
    multiplier with ~30 significant bits in E[x^2]'s truncation)."""
    x = 3.0 + 0.3 * rng.standard_normal((2, d))
    g, b = 1 + 0.1 * rng.standard_normal(d), 0.1 * rng.standard_normal(d)
    out = run(lambda p, xs, gs, bs: layernorm(p, xs, gs, bs, M.DEFAULT_LN_EPS), share(x),
              share(g), share(b))
    assert np.max(np.abs(value(out) - M.ref_layernorm(x, g, b, M.DEFAULT_LN_EPS))) < 2e-3


def test_layernorm_small_variance_needs_eps_in_range(rng):
    """Rows with std 0.01: var + 1e-5 lies below sqrt_inv_a's range and LayerNorm comes out
    wrong by O(1); with the default eps (inside the range) it matches the reference."""
    from mpc3.kernels import fxp
    x = 1.0 + 0.01 * rng.standard_normal((4, 16))
    g, b = np.ones(16), np.zeros(16)
    var = x.var(-1)
    errs = {}
    for eps in (1e-5, M.DEFAULT_LN_EPS):
        out = Run()(lambda p, xs, gs, bs: layernorm(p, xs, gs, bs, eps), share(x), share(g),
                    share(b))
        errs[eps] = np.max(np.abs(value(out) - M.ref_layernorm(x, g, b, eps)))
    assert np.all(var + 1e-5 < fxp.SQRT_INV_RANGE[0]) and errs[1e-5] > 0.1
    assert np.all(var + M.DEFAULT_LN_EPS >= fxp.SQRT_INV_RANGE[0]) and errs[M.DEFAULT_LN_EPS] < 2e-3


def test_share_model_layout_and_errors():
    cfg = make_cfg()
    w = M.random_weights(cfg, 0)
    for fold in (True, False):
        parts = SM.share_model(cfg, w, fold_omega=fold)
        for part in parts:
            SM.check_shares(cfg, part)
        assert ("dec.0.self.omega" in parts[0]) == (not fold)
        wide = parts[0]["enc.0.attn.wq_proj"].shape
        assert wide == ((24, 30) if fold else (24, 24))
    bad = dict(parts[0])
    del bad["enc.0.ffn.w1"]
    with pytest.raises(ValueError, match="lack"):
        SM.check_shares(cfg, bad)
    bad = dict(parts[0])
    bad["enc.0.ffn.b1"] = bad["enc.0.ffn.b2"]
    with pytest.raises(ValueError, match="shape"):
        SM.check_shares(cfg, bad)
    with pytest.raises(ValueError):
        SM.share_model(cfg, M.Weights({}))


def test_bad_inputs(run, rng):
    cfg = make_cfg()
    _, sh = model_shares(cfg, True)
    x = rng.uniform(-1, 1, (2, 7, 20))
    with pytest.raises(ValueError, match="d_model"):
        run(lambda p, s, xs: mha(p, cfg, SM.sub(s, "enc.0.attn"), xs), *zip(*args(sh, share(x))))
    x = rng.uniform(-1, 1, (2, 7, 24))
    with pytest.raises(ValueError, match="self attention"):
        run(lambda p, s, xs: mha(p, cfg, SM.sub(s, "dec.0.self"), xs, xs, causal=True),
            *zip(*args(sh, share(x))))
    with pytest.raises(ValueError, match="gamma"):
        run(lambda p, xs, g: layernorm(p, xs, g, g, M.DEFAULT_LN_EPS), share(x),
            share(np.ones(3)))


def test_mha_small_c_large_inputs_keeps_precision(run, rng):
    """Privformer Sec. 9.1 inputs (uniform [-10, 10]) with a tiny c: folding c evenly into
    W^Q, W^K, W^V keeps every intermediate at a moderate magnitude (relative error < 1e-3)."""
    cfg = make_cfg(attn_norm="const", attn_c=1.0 / (10 * 7 * 40))
    w, sh = model_shares(cfg, True)
    x = rng.uniform(-10, 10, (1, 7, 24))
    for pre, causal in (("enc.0.attn", False), ("dec.0.self", True)):
        out = run(lambda p, s, xs: mha(p, cfg, SM.sub(s, pre), xs, causal=causal),
                  *zip(*args(sh, share(x))))
        ref = M.ref_mha(cfg, w.sub(pre), x, x, causal=causal)
        assert np.max(np.abs(value(out) - ref)) < 1e-3 * np.max(np.abs(ref))


@pytest.mark.parametrize("fold,causal,norm", [(True, False, "mean"), (False, True, "const"),
                                              (True, True, "mean")])
def test_mha_declared_cost(run, rng, fold, causal, norm):
    from protocols.layers.mha import cost_mha
    cfg = make_cfg(attn_norm=norm)
    _, sh = model_shares(cfg, fold)
    x = rng.uniform(-1, 1, (2, 7, 24))
    run(lambda p, s, xs: mha(p, cfg, SM.sub(s, "dec.0.self"), xs, causal=causal, block=3,
                             masked_form="vk"), *zip(*args(sh, share(x))))
    run.assert_cost(cost_mha(run.cfg, cfg, 2, 7, causal=causal, folded=fold, block=3))


def test_mha_rounds_do_not_depend_on_heads(run, rng):
    rounds = set()
    for h in (1, 3, 6):
        cfg = make_cfg(n_heads=h, d_head=24 // h)
        _, sh = model_shares(cfg, True)
        x = rng.uniform(-1, 1, (1, 7, 24))
        for causal in (False, True):
            run(lambda p, s, xs: mha(p, cfg, SM.sub(s, "dec.0.self"), xs, causal=causal,
                                     order="kv"), *zip(*args(sh, share(x))))
            rounds.add((causal, run.rounds))
    assert len(rounds) == 2
