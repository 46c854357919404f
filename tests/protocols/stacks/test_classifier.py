"""Encoder classifier (arch encoder-classifier): secure classify and arg-max against the
float64 reference, measured traffic against the declared cost, the production job kinds
(permissions, wrong arch, wrong shapes) and calibration.

Shapes: B=3, S=7, d=16, h=2, r=8, d_ff=32, 2 layers, 5 classes. Bound: 2e-3 absolute on the
logits (the encoder's outputs are LayerNorm-scale, error ~1e-4 measured; the head adds a
d-term sum and one truncation)."""
import numpy as np
import pytest

from conftest import run_job, share, share_inputs, value
from mpc3.party import RingConfig
from net.party.inproc import InprocParties
from protocols.calibration import calibrate as C
from protocols.stacks import classifier as CL
from protocols import model as M
from protocols.layers import secure_model as SM
from helpers import shadow_run as SR
TOL = 2e-3


def clf_cfg(**kw):
    base = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                attn_norm="mean", norm_first=False, max_len=12, arch="encoder-classifier",
                n_enc_layers=2, src_vocab=11, n_classes=5)
    return M.ModelConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("norm_first", [False, True])
def test_classify_matches_reference_and_declared_cost(run, rng, norm_first):
    cfg = clf_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (3, 7, 16))
    res = run(lambda p, s, xs: CL.classify(p, cfg, s, xs), SM.share_model(cfg, w), share(x))
    assert np.max(np.abs(value(res) - M.ref_classify(cfg, w, x))) < TOL
    run.assert_cost(CL.cost_classify(RingConfig(), cfg, 3, 7))


def test_pool_head_cost_and_value(run, rng):
    cfg = clf_cfg()
    w = M.random_weights(cfg, 3)
    h = rng.uniform(-2, 2, (2, 9, 16))
    sh = SM.share_model(cfg, w, prefixes=("head",))
    res = run(lambda p, s, hs: CL.pool_head(p, cfg, s, hs), sh, share(h))
    ref = h.mean(1) @ w["head.w"] + w["head.b"]
    assert np.max(np.abs(value(res) - ref)) < 1e-4
    run.assert_cost(CL.cost_pool_head(RingConfig(), 2, 5))


# ------------------------------------------------------------------------ job kinds ----
def test_jobs_permissions_and_refusals(rng):
    cfg = clf_cfg()
    w = M.random_weights(cfg, 4)
    x = rng.uniform(-1, 1, (2, 5, 16))
    ref = M.ref_classify(cfg, w, x)
    default = InprocParties.for_model(cfg, w)                   # permits classify only
    out, jobs = run_job(default, "classify", x)
    assert np.max(np.abs(out["logits"] - ref)) < TOL
    assert [e["layer"] for e in jobs[0].costs] == ["enc.0", "enc.1", "head"]
    with pytest.raises(ValueError, match="does not permit 'classify-argmax'.*permitted: "
                       "classify"):
        run_job(default, "classify_argmax", x)
    only = InprocParties.for_model(cfg, w, permitted=["classify-argmax"])
    out, jobs = run_job(only, "classify_argmax", x)
    assert set(out) == {"class"} and list(out["class"]) == list(ref.argmax(1).astype(float))
    assert jobs[0].costs[-1]["layer"] == "argmax"
    with pytest.raises(ValueError, match="does not permit 'classify'"):
        run_job(only, "classify", x)
    for kind in ("decode_open", "encoder"):                     # translator kinds: wrong arch
        with pytest.raises(ValueError, match=f"job kind '{kind}' does not apply to model "
                           "'inproc' \\(a encoder-classifier model\\)"):
            run_job(default, kind, x)
    with pytest.raises(ValueError, match="width d = 16"):
        run_job(default, "classify", rng.uniform(-1, 1, (2, 5, 12)))
    with pytest.raises(ValueError, match="too long"):
        run_job(default, "classify", rng.uniform(-1, 1, (1, 13, 16)))
    with pytest.raises(ValueError, match="takes inputs"):
        default.run("classify", {}, [{"Y": s["X"]} for s in share_inputs(x)])
    with pytest.raises(ValueError, match="unknown parameters"):
        default.run("classify", {"weight": "head.w"}, share_inputs(x))


def test_translator_refuses_classifier_kinds():
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=False, max_len=8, n_enc_layers=1,
                        n_dec_layers=1, src_vocab=5, tgt_vocab=5).validate()
    tr = InprocParties.for_model(cfg, M.random_weights(cfg), permitted=["translate", "encoder"])
    with pytest.raises(ValueError, match="'classify' does not apply.*encoder-decoder model"):
        run_job(tr, "classify", np.zeros((1, 3, 16)))


def test_owner_permits_per_arch():
    from app.owner import check_permit
    assert check_permit(None, "encoder-classifier") == ("classify",)
    assert check_permit(["classify-argmax"], "encoder-classifier") == ("classify-argmax",)
    with pytest.raises(ValueError, match=r"cannot permit \['translate'\]: an "
                       "encoder-classifier model offers classify, classify-argmax"):
        check_permit(["translate"], "encoder-classifier")
    assert check_permit(None) == ("translate",)


# ---------------------------------------------------------------------- calibration ----
def test_classifier_calibrates_and_its_calibration_runs_the_reference(rng):
    cfg = clf_cfg(norm_first=True)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    x = rng.normal(size=(2, 6, 16))
    SR.close(SR.classifier(cfg, w, x), M.ref_classify(cfg, w, x))
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    assert {"head", "argmax"} <= set(cal.layers["head"])      # 1/S rides in head's truncation
    assert set(cal.input_range) == {"X"}
    assert cal.input_range["X"] == C.embedding_range(cfg, user["embed.src"])
    hot = M.Weights(dict(w.tensors))
    hot["head.w"] = w["head.w"] * 2e5
    with pytest.raises(C.RangeError, match="^head: difference of two logits .*rescale head.w"):
        C.calibrate(cfg, hot, C.default_samples(cfg, user, rng), user=user)
