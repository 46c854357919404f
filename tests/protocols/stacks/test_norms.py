"""ModelConfig.norm (layernorm | none | batchnorm) and the fused linear FFN (ffn_act none):
config and file, float64 reference, share layout, and the secure stacks of all three
architectures against the reference with measured traffic == declared cost.

Shapes: B=2, d=16, h=2, r=8, d_ff=32, 2 layers. Bound 2e-3 relative to max(1, |reference|):
without LayerNorm the residual stream is not renormalised and its rows grow to ~60 in a
pre-norm decoder; fixed point has an absolute resolution, its products relative errors."""
import dataclasses
import json

import numpy as np
import pytest

from conftest import share, value
from mpc3.kernels import arith
from mpc3.party import RingConfig
from mpc3.sim import run_parties
from protocols.stacks import causal_lm as LM
from protocols.stacks import decoder as D
from protocols import model as M
from protocols.layers import norms as N
from protocols.layers import secure_model as SM
from protocols.stacks.classifier import classify, cost_classify
from protocols.stacks.encoder import encoder

TOL = 2e-3


def close(got, ref) -> bool:
    return np.max(np.abs(got - ref)) < TOL * max(1.0, float(np.max(np.abs(ref))))
BASE = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
            attn_norm="mean", max_len=12)


def cfg_of(arch, **kw):
    extra = {"encoder-decoder": dict(n_enc_layers=1, n_dec_layers=2, src_vocab=7, tgt_vocab=7),
             "encoder-classifier": dict(arch=arch, n_enc_layers=2, src_vocab=7, n_classes=3),
             "decoder-only": dict(arch=arch, n_dec_layers=2, tgt_vocab=7)}[arch]
    return M.ModelConfig(**{**BASE, "norm_first": False, **extra, **kw}).validate()


def test_norm_key_is_optional_checked_and_round_trips(tmp_path):
    ln = cfg_of("decoder-only")
    assert "norm" not in ln.to_dict()                      # layernorm: dictionaries unchanged
    for norm, leaves in (("none", set()), ("batchnorm", {"gamma", "beta", "mean", "var"}),
                         ("rmsnorm", {"gamma"})):
        c = cfg_of("decoder-only", norm=norm, norm_first=True)
        assert c.to_dict()["norm"] == norm
        assert M.ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
        got = {n.rsplit(".", 1)[1] for n in M.expected_shapes(c) if ".ln" in n or "final_ln" in n}
        assert got == leaves
        w = M.random_weights(c, 1)
        M.save_model(tmp_path / f"{norm}.npz", c, w)
        c2, w2, _ = M.load_model(tmp_path / f"{norm}.npz")
        assert c2 == c and set(w2) == set(w)
    with pytest.raises(ValueError, match="norm='groupnorm' must be one of"):
        M.ModelConfig.from_dict({**ln.to_dict(), "norm": "groupnorm"})


def test_reference_norms():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, (3, 4, 16))
    g, b, mu, var = (rng.normal(0, 1, 16) for _ in range(4))
    var = np.abs(var) + 0.1
    bn = M.ref_batchnorm(x, g, b, mu, var, 1e-5)
    a, c = M.batchnorm_affine(g, b, mu, var, 1e-5)
    np.testing.assert_allclose(bn, x * a + c, atol=1e-12)
    np.testing.assert_allclose(bn[..., 3], (x[..., 3] - mu[3]) / np.sqrt(var[3] + 1e-5) * g[3]
                               + b[3], atol=1e-12)
    with pytest.raises(ValueError, match="running var"):
        M.batchnorm_affine(g, b, mu, -var, 1e-5)
    cfg = cfg_of("decoder-only", norm="none")
    assert M.ref_norm(cfg, {}, "dec.0.ln1", x) is x
    # norm none: pre-LN and post-LN are the same network (x + f(x) either way)
    w = M.random_weights(cfg, 3)
    np.testing.assert_allclose(M.ref_lm(cfg, w, x), M.ref_lm(cfg_of("decoder-only", norm="none",
                                                                     norm_first=True), w, x))


def test_ffn_batchnorm_folds_exactly():
    cfg = cfg_of("encoder-classifier", ffn_bn=True, ffn_act="gelu")
    assert cfg.to_dict()["ffn_bn"] is True and "ffn_bn" not in cfg_of("decoder-only").to_dict()
    w = M.random_weights(cfg, 3)
    assert M.expected_shapes(cfg)["enc.1.ffn.bn_var"] == (32,)
    x = np.random.default_rng(0).normal(0, 1, (2, 5, 16))
    c2, w2 = M.fold_ffn_bn(cfg, w)
    assert not c2.ffn_bn and not any(".bn_" in n for n in w2)
    ref = M.ref_classify(cfg, w, x)
    np.testing.assert_allclose(M.ref_classify(c2, w2, x), ref, atol=1e-12)
    w3 = M.Weights(dict(w.tensors))
    w3["enc.0.ffn.bn_mean"] = w3["enc.0.ffn.bn_mean"] + 1.0
    assert not np.allclose(M.ref_classify(cfg, w3, x), ref)    # the statistics matter
    sh = SM.share_model(cfg, w)[0]
    SM.check_shares(cfg, sh)
    assert not any(".bn_" in n for n in sh)


def test_share_layout_folds_batchnorm_and_fuses_the_linear_ffn():
    cfg = cfg_of("decoder-only", norm="batchnorm", ffn_act="none")
    w = M.random_weights(cfg, 4)
    plain = SM.plain_tensors(cfg, w)
    a, b = M.batchnorm_affine(*(w[f"dec.0.ln1.{n}"] for n in ("gamma", "beta", "mean", "var")),
                              cfg.ln_eps)
    np.testing.assert_array_equal(plain["dec.0.ln1.scale"][0], a)
    np.testing.assert_array_equal(plain["dec.0.ln1.shift"][0], b)
    assert "dec.0.ln1.gamma" not in plain and "dec.0.ffn.w2" not in plain
    x = np.random.default_rng(1).normal(0, 1, (5, 16))
    f = w.sub("dec.1.ffn")
    fused = x @ plain["dec.1.ffn.w1"][0] + plain["dec.1.ffn.b1"][0]
    np.testing.assert_allclose(fused, M.ref_ffn(x, f["w1"], f["b1"], f["w2"], f["b2"], "none"),
                               atol=1e-12)
    SM.check_shares(cfg, SM.share_model(cfg, w)[0])        # names and shapes agree
    rc = RingConfig()
    assert N.cost_norm(rc, cfg, 10) == arith.cost_mul(160, rc)
    assert N.cost_norm(rc, cfg_of("decoder-only", norm="none"), 10).rounds == 0


#: (norm, ffn_act, norm_first, ffn_bn): ffn_bn is seed 002's BatchNorm in the MLP, folded
NORM_CASES = [("none", "none", False, False), ("batchnorm", "relu", False, False),
              ("batchnorm", "none", True, False), ("layernorm", "none", True, False),
              ("layernorm", "gelu", False, True), ("batchnorm", "relu", True, True)]


@pytest.mark.parametrize("norm,act,norm_first,bn", NORM_CASES)
def test_classifier(run, rng, norm, act, norm_first, bn):
    cfg = cfg_of("encoder-classifier", norm=norm, ffn_act=act, norm_first=norm_first, ffn_bn=bn)
    w = M.random_weights(cfg, 5)
    x = rng.uniform(-1, 1, (2, 6, 16))
    out = run(lambda p, s, xi: classify(p, cfg, s, xi), SM.share_model(cfg, w), share(x))
    assert close(value(out), M.ref_classify(cfg, w, x))
    run.assert_cost(cost_classify(RingConfig(), cfg, 2, 6))


@pytest.mark.parametrize("norm,act,norm_first,bn", NORM_CASES)
@pytest.mark.parametrize("attention", ["relu-performer", "softmax"])
def test_lm_prefill_and_steps(run, rng, norm, act, norm_first, bn, attention):
    cfg = cfg_of("decoder-only", norm=norm, ffn_act=act, norm_first=norm_first,
                 attention=attention, ffn_bn=bn)
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (2, 7, 16))

    res = run(_lm_run(cfg), SM.share_model(cfg, w), share(x))
    _check_lm_run(cfg, w, x, res)


@pytest.mark.parametrize("norm,act,norm_first,bn", NORM_CASES)
@pytest.mark.parametrize("fuse", [D.DEFAULT_FUSE, D.FUSIONS])
def test_translator_encoder_and_decode_steps(rng, norm, act, norm_first, bn, fuse):
    """Encoder-decoder: the secure encoder and decode steps (LayerNorm fusions: only a
    LayerNorm fuses; ``ln_fusions`` is empty for the other norms) against the reference."""
    cfg = cfg_of("encoder-decoder", norm=norm, ffn_act=act, norm_first=norm_first, ffn_bn=bn)
    assert (D.ln_fusions(cfg, fuse) == {}) == (norm != "layernorm")
    w = M.random_weights(cfg, 3)
    x, y = rng.uniform(-1, 1, (2, 5, 16)), rng.uniform(-1, 1, (2, 4, 16))
    xs, ys = share(x), share(y)

    def fn(p, s, xi, yi):
        enc = encoder(p, cfg, s, xi)
        st = D.DecodeState.start(p, cfg, s, enc, block=2, fuse=fuse)
        outs, costs = [], []
        for t in range(4):
            c0 = p.stats.snapshot()
            outs.append(D.decoder_step(p, cfg, s, st, yi[:, t]))
            costs.append(p.stats.snapshot() - c0)
        return enc, outs, costs

    sh = SM.share_model(cfg, w)
    res = run_parties(fn, [(sh[i], xs[i], ys[i]) for i in range(3)])
    enc = M.ref_encoder(cfg, w, x)
    assert close(value([r[0] for r in res]), enc)
    dec = M.ref_decoder(cfg, w, y, enc)
    for t in range(4):
        assert close(value([r[1][t] for r in res]), dec[:, t])
        declared = D.cost_decoder_step(RingConfig(), cfg, 2, t, block=2, fuse=fuse)
        assert tuple(r[2][t].bytes_sent for r in res) == declared.bytes_per_party
        assert max(r[2][t].rounds for r in res) == declared.rounds


def test_aero_preset():
    base = cfg_of("decoder-only", norm_first=True)
    c = M.aero(base)
    assert (c.norm, c.ffn_act, c.attention) == ("none", "none", "softmax")
    assert M.apply_preset(base, "aero") == c
    assert M.aero(base, attention=None).attention == "relu-performer"
    sp = M.aero(base, scale=True, pruned=1)
    assert (sp.ffn_scale, sp.ffn_pruned) == (True, 1) and "dec.1.ffn.w1" not in \
        M.expected_shapes(sp) and "dec.0.ffn.alpha" in M.expected_shapes(sp)
    assert not any(".ln" in n or "final_ln" in n for n in M.expected_shapes(c))
    assert M.aero(cfg_of("encoder-decoder")).attention == "softmax"    # every arch
    assert M.aero(cfg_of("encoder-decoder"), attention=None).norm == "none"
    with pytest.raises(ValueError, match="unknown preset"):
        M.apply_preset(base, "bert")


def test_fused_linear_ffn_saves_a_round_and_bytes(rng):
    """The same linear FFN, shared fused (the layout of every ffn_act none model) and unfused:
    both equal the unfused float64 reference; fused measures fewer rounds and bytes, each
    as declared."""
    from protocols.layers.ffn import cost_ffn, ffn
    cfg = M.aero(cfg_of("decoder-only", norm_first=True))
    w = M.random_weights(cfg, 6)
    f = w.sub("dec.0.ffn")
    x = rng.uniform(-1.5, 1.5, (2, 5, 16))
    ref = M.ref_ffn(x, f["w1"], f["b1"], f["w2"], f["b2"], "none")
    fused = SM.share_model(cfg, w, prefixes=("dec.0.ffn",))
    assert set(fused[0]) == {"dec.0.ffn.w1", "dec.0.ffn.b1"}
    plain = {k: share(v) for k, v in f.items()}
    got = {}
    for name, ws in (("fused", fused), ("unfused", [{k: s[i] for k, s in plain.items()}
                                                    for i in range(3)])):
        def fn(p, s, xs):
            c0 = p.stats.snapshot()
            out = ffn(p, SM.sub(s, "dec.0.ffn") if name == "fused" else s, xs, "none")
            return out, p.stats.snapshot() - c0
        xs = share(x)
        res = run_parties(fn, [(ws[i], xs[i]) for i in range(3)])
        assert close(value([r[0] for r in res]), ref)
        got[name] = (max(r[1].rounds for r in res), tuple(r[1].bytes_sent for r in res))
        declared = cost_ffn(RingConfig(), 10, 16, 32, "none", fused=name == "fused")
        assert got[name] == (declared.rounds, declared.bytes_per_party)
    assert got["fused"][0] < got["unfused"][0]
    assert sum(got["fused"][1]) < sum(got["unfused"][1]) / 2   # d vs d_ff + d outputs per row


def aero_lm(attention="softmax", **kw):
    return M.aero(cfg_of("decoder-only", n_dec_layers=3, norm_first=True, **kw), attention)


def test_aero_scaled_pruned_ffn_config_and_folding():
    c = M.ModelConfig(**{**aero_lm().to_dict(), "ffn_scale": True, "ffn_pruned": 1})
    assert M.ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    shapes = M.expected_shapes(c)
    assert shapes["dec.0.ffn.alpha"] == (1,) and "dec.2.ffn.w1" not in shapes
    assert [c.has_ffn(i) for i in range(3)] == [True, True, False]
    for bad in (dict(norm="layernorm"), dict(ffn_act="relu"), dict(ffn_pruned=4)):
        with pytest.raises(ValueError, match="ffn_scale|ffn_pruned"):
            M.ModelConfig.from_dict({**c.to_dict(), **bad})
    with pytest.raises(ValueError, match="AERO's softmax-only block"):
        M.ModelConfig(**{**BASE, "norm_first": True, "n_enc_layers": 1, "src_vocab": 7,
                         "n_classes": 3}, arch="encoder-classifier", norm="none",
                      ffn_act="none", ffn_pruned=1).validate()
    for attention, bias in (("softmax", True), ("relu-performer", False)):
        cb = M.ModelConfig(**{**aero_lm(attention, attn_bias=bias).to_dict(),
                              "ffn_scale": True, "ffn_pruned": 1})
        w = M.random_weights(cb, 2)
        x = np.random.default_rng(2).uniform(-1, 1, (2, 5, 16))
        c2, w2, C = M.fold_ffn_scales(cb, w)
        assert not c2.ffn_scale and C == np.prod([w[f"dec.{i}.ffn.beta"][0] for i in (0, 1)])
        ref = M.ref_lm(cb, w, x)
        assert np.max(np.abs(C * M.ref_lm(c2, w2, x) - ref)) < 1e-12 * np.max(np.abs(ref))
        assert not np.allclose(ref, M.ref_lm(c2, w2, x))      # the scales change the model


@pytest.mark.parametrize("attention", ["softmax", "relu-performer"])
def test_aero_scaled_pruned_lm_secure(run, rng, attention):
    """Scales folded into the shares (one product by their product at the end), the pruned
    layer's FFN skipped: secure prefill + steps == the scaled reference, declared == measured,
    and cheaper than the unscaled, unpruned model by the pruned FFN minus one product."""
    from protocols.calibration import calibrate as C
    base = aero_lm(attention, attn_c=0.05)
    cfg = M.ModelConfig(**{**base.to_dict(), "ffn_scale": True, "ffn_pruned": 1})
    w = M.random_weights(cfg, 2)
    for i in range(3):                  # without any norm, keep the softmax scores in range
        w[f"dec.{i}.self.wq"] = 0.35 * w[f"dec.{i}.self.wq"]
    x = rng.uniform(-1, 1, (2, 7, 16))
    C.calibrate(cfg, w, C.Samples([x]))               # the folded trace: in range
    from helpers import shadow_run as SR              # ... and it computes the reference
    SR.close(SR.lm(cfg, w, x), M.ref_lm(cfg, w, x))

    fn = _lm_run(cfg)
    shares = SM.share_model(cfg, w)
    assert SM.OUT_SCALE in shares[0] and not any(k.endswith(".alpha") for k in shares[0])
    res = run(fn, shares, share(x))
    _check_lm_run(cfg, w, x, res)
    rc = RingConfig()
    plain = LM.cost_lm_step(rc, base, 2, 5, 3)
    got = LM.cost_lm_step(rc, cfg, 2, 5, 3)
    from protocols.layers.ffn import cost_ffn
    saved = cost_ffn(rc, 2, 16, 32, "none")
    scale = arith.cost_mul(2 * 16, rc)
    assert got.rounds == plain.rounds - saved.rounds + scale.rounds
    assert got.bytes_total == plain.bytes_total - saved.bytes_total + scale.bytes_total


@pytest.mark.parametrize("variant", ["aero-scaled-pruned", "batchnorm-bnffn"])
def test_secure_generation_agrees_with_plaintext_greedy(variant, tmp_path):
    """The production LM path (model file -> lm_prefill / lm_step / lm_close over the
    in-process transport, app.generate) generates the reference's greedy tokens."""
    from app import generate as G
    from app import translate as T
    from helpers.cases import top2_gap
    if variant == "aero-scaled-pruned":
        cfg = M.aero(cfg_of("decoder-only", n_dec_layers=3, attn_c=0.05, tgt_vocab=13),
                     scale=True, pruned=1)
    else:
        cfg = cfg_of("decoder-only", norm="batchnorm", ffn_bn=True, ffn_act="gelu",
                     norm_first=True, tgt_vocab=13)
    from protocols.calibration import calibrate as C          # what share-model checks first
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    samples = C.default_samples(cfg, user, np.random.default_rng(0))
    if variant.startswith("aero"):      # nothing bounds the stream: its scores grow with depth
        free = dataclasses.replace(cfg, softmax_form="max-free")
        with pytest.raises(C.RangeError, match="max-free softmax exponent"):
            C.calibrate(free, w, samples, user=user)
        C.calibrate(cfg, w, samples, user=user)         # the max-subtracted softmax takes them
    for i in range(cfg.n_dec_layers):   # softmax scores inside exp's range without any norm
        w[f"dec.{i}.self.wq"] = 0.03 * w[f"dec.{i}.self.wq"]
    M.save_model(tmp_path / "m.npz", cfg, w, user)
    cfg, w, user = M.load_model(tmp_path / "m.npz")
    prompt = np.array([[1, 5, 2], [3, 3, 0]])
    C.calibrate(cfg, w, samples, user=user)
    be = T.InprocBackend(cfg, w)
    res = G.generate(be, cfg, user, prompt, 6)
    ref = M.greedy_generate(cfg, w, user, prompt, 6)
    assert top2_gap(cfg, w, user, prompt, ref) > 2e-2 and len({*ref[0], *ref[1]}) >= 2
    assert res.tokens == ref and not be.open_sessions()
    assert res.step_cost.bytes_total == sum(sum(LM.cost_lm_step(RingConfig(), cfg, 2, t)
                                                .bytes_per_party) for t in range(3, 8))


def _check_lm_run(cfg, w, x, res):
    """A prompt of 4 then 3 steps (block 3): hidden rows vs ref_lm, traffic vs declared."""
    full = M.ref_lm(cfg, w, x)
    for k in range(4):
        assert close(value([r[0][k] for r in res]), full[:, 3 + k])
    rc = RingConfig()
    for k, t in enumerate([-1, 4, 5, 6]):
        declared = LM.cost_lm_prefill(rc, cfg, 2, 4, 3) if t < 0 else \
            LM.cost_lm_step(rc, cfg, 2, t, 3)
        assert tuple(r[1][k].bytes_sent for r in res) == declared.bytes_per_party
        assert max(r[1][k].rounds for r in res) == declared.rounds


def _lm_run(cfg):
    """Per party: a prompt of 4 tokens (block 3), then 3 steps; hidden rows and traffic."""
    def fn(p, s, xs):
        measured, c0 = [], p.stats.snapshot()
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :4], block=3)
        measured.append(p.stats.snapshot() - c0)
        hs = [h]
        for t in range(4, 7):
            c0 = p.stats.snapshot()
            hs.append(LM.lm_step(p, cfg, s, st, xs[:, t]))
            measured.append(p.stats.snapshot() - c0)
        return hs, measured
    return fn
