"""ModelConfig.ffn_act: the FFN activation (relu | gelu | none) from the config through the
float64 reference, the secure FFN and classifier (value and declared cost), the model file and
the calibration (GELU's range 2^13 is checked like ReLU's)."""
import json

import numpy as np
import pytest

from mpc3.party import RingConfig
from protocols.calibration import calibrate as C
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks.classifier import classify, cost_classify
from protocols.layers.ffn import cost_ffn, ffn

from conftest import share, value

COMMON = {"d_model": 16, "n_heads": 2, "d_head": 8, "n_features": 8, "d_ff": 32,
          "attn_c": 0.125, "attn_norm": "mean", "norm_first": False, "max_len": 12}


def clf_cfg(act):
    return M.ModelConfig(**COMMON, arch="encoder-classifier", n_enc_layers=2, src_vocab=11,
                         n_classes=5, ffn_act=act).validate()


def test_config_key_is_optional_and_checked(tmp_path):
    ed = M.ModelConfig(**COMMON, n_enc_layers=1, n_dec_layers=1, src_vocab=5, tgt_vocab=5)
    assert "ffn_act" not in ed.to_dict()                    # relu: dictionaries unchanged
    g = clf_cfg("gelu")
    assert g.to_dict()["ffn_act"] == "gelu"
    assert M.ModelConfig.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    with pytest.raises(ValueError, match="ffn_act='tanh'"):
        M.ModelConfig.from_dict({**g.to_dict(), "ffn_act": "tanh"})
    w = M.random_weights(g, 1)
    M.save_model(tmp_path / "g.npz", g, w)
    assert M.load_model(tmp_path / "g.npz")[0].ffn_act == "gelu"


@pytest.mark.parametrize("act", ["gelu", "none"])
def test_secure_ffn_matches_reference_and_declared_cost(run, rng, act):
    d, dff = 16, 40
    w = {"w1": rng.normal(0, 0.4, (d, dff)), "b1": rng.normal(0, 0.1, dff),
         "w2": rng.normal(0, 0.3, (dff, d)), "b2": rng.normal(0, 0.1, d)}
    x = rng.uniform(-1.5, 1.5, (2, 5, d))
    ws = {k: share(v) for k, v in w.items()}
    out = run(lambda p, xs, *wv: ffn(p, dict(zip(w, wv)), xs, act), share(x), *ws.values())
    ref = M.ref_ffn(x, w["w1"], w["b1"], w["w2"], w["b2"], act)
    # GELU: 6e-4 per hidden unit (activations.GELU_ERROR) times sum |W2| over the hidden units
    bound = 6e-4 * np.abs(w["w2"]).sum(axis=0).max() + 1e-3 if act == "gelu" else 1e-3
    assert np.max(np.abs(value(out) - ref)) < bound
    assert act == "none" or np.max(np.abs(M.ref_ffn(x, *w.values(), "relu") - ref)) > 1e-2
    run.assert_cost(cost_ffn(RingConfig(), 2 * 5, d, dff, act, fused=False))  # w2 shared


def test_gelu_classifier_end_to_end(run, rng):
    cfg = clf_cfg("gelu")
    w = M.random_weights(cfg, 5)
    sh = SM.share_model(cfg, w)
    x = rng.uniform(-1, 1, (2, 6, cfg.d_model))
    xs = share(x)
    out = run(lambda p, s, xi: classify(p, cfg, s, xi), sh, xs)
    assert np.max(np.abs(value(out) - M.ref_classify(cfg, w, x))) < 5e-3
    run.assert_cost(cost_classify(RingConfig(), cfg, 2, 6))


def test_calibration_checks_gelu_range():
    cfg = clf_cfg("gelu")
    w = M.random_weights(cfg, 6)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 6, cfg.d_model))
    cal = C.calibrate(cfg, w, C.Samples([x]))
    assert "hidden_gelu" in cal.layers["enc.0.ffn"] and "hidden" not in cal.layers["enc.0.ffn"]
    w["enc.1.ffn.w1"] = w["enc.1.ffn.w1"] * 3000.0      # hidden units far beyond 2^13 / 4
    with pytest.raises(C.RangeError, match=r"enc\.1\.ffn: FFN hidden .*GELU"):
        C.calibrate(cfg, w, C.Samples([x]))
