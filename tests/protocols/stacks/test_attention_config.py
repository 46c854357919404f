"""ModelConfig.attention: the seed papers' attention variants selectable in an
encoder-classifier (softmax, power-softmax, sigma-relu; relu-performer stays the default;
decoder-only LMs: tests/protocols/stacks/test_kv_cache_lm.py; the encoder-decoder:
tests/protocols/stacks/test_encdec_variants.py) -
config, weights (no Omega), float64 reference, secure classify against it, declared cost,
calibration."""
import json

import numpy as np
import pytest

from mpc3.party import RingConfig
from protocols.calibration import calibrate as C
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks.classifier import classify, cost_classify

from conftest import share, value

COMMON = {"d_model": 16, "n_heads": 2, "d_head": 8, "n_features": 8, "d_ff": 32,
          "attn_c": 0.125, "attn_norm": "mean", "norm_first": False, "max_len": 12}
VARIANTS = ["softmax", "power-softmax", "sigma-relu"]


def clf(attention, **kw):
    return M.ModelConfig(**COMMON, arch="encoder-classifier", n_enc_layers=2, src_vocab=11,
                         n_classes=4, attention=attention, **kw).validate()


def test_config_weights_and_refusals(tmp_path):
    assert "attention" not in clf("relu-performer").to_dict()
    cfg = clf("softmax", ffn_act="gelu")
    assert M.ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert not any(k.endswith(".omega") for k in M.expected_shapes(cfg))
    M.save_model(tmp_path / "m.npz", cfg, M.random_weights(cfg, 1))
    assert M.load_model(tmp_path / "m.npz")[0] == cfg
    with pytest.raises(ValueError, match="attention='linear'"):
        clf("linear")


@pytest.mark.parametrize("attention", VARIANTS)
def test_reference_uses_the_variant(attention):
    cfg, base = clf(attention), clf("relu-performer")
    w = M.random_weights(cfg, 2)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 5, 16))
    p = w.sub("enc.0.attn")
    q, k, v = (M.split_heads(x @ p[n], 2) for n in ("wq", "wk", "wv"))
    from protocols.model.variants import ref_heads
    want = M.merge_heads(ref_heads(attention, q, k, v)) @ p["wo"]
    assert np.allclose(M.ref_mha(cfg, p, x, x), want)
    assert M.ref_classify(cfg, w, x).shape == (1, 4)
    assert base.attention == "relu-performer"


@pytest.mark.parametrize("attention", VARIANTS)
def test_secure_classify_matches_reference_and_declared_cost(run, rng, attention):
    cfg = clf(attention)
    w = M.random_weights(cfg, 3)
    sh = SM.share_model(cfg, w)
    SM.check_shares(cfg, sh[0])
    x = rng.uniform(-1, 1, (2, 6, cfg.d_model))
    out = run(lambda p, s, xi: classify(p, cfg, s, xi), sh, share(x))
    assert np.max(np.abs(value(out) - M.ref_classify(cfg, w, x))) < 5e-3
    run.assert_cost(cost_classify(RingConfig(), cfg, 2, 6))


@pytest.mark.parametrize("attention,form,site", [
    ("softmax", "max", "rowmax"), ("softmax", "max-free", "exp"),
    ("power-softmax", "max", "den"), ("sigma-relu", "max", "sigma")])
def test_calibration_records_and_refuses_the_variant_sites(attention, form, site):
    cfg = clf(attention, softmax_form=form)
    w = M.random_weights(cfg, 4)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 6, cfg.d_model))
    cal = C.calibrate(cfg, w, C.Samples([x]))
    # sigma-attention's output reaches no kernel before W^O: no vout (docs/CALIBRATION.md)
    assert {"vscores", site, "wo"} | ({"vout"} if attention != "sigma-relu" else set()) \
        <= set(cal.layers["enc.0.attn"])
    assert "features" not in cal.layers["enc.0.attn"]
    w["enc.1.attn.wq"] = w["enc.1.attn.wq"] * 400.0       # scores far outside the ranges
    w["enc.1.attn.wk"] = w["enc.1.attn.wk"] * 400.0
    with pytest.raises(C.RangeError, match=r"enc\.1\.attn: "):
        C.calibrate(cfg, w, C.Samples([x]))
