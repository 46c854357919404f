"""Decoder-only LMs with softmax-style attention (softmax, power-softmax, sigma-relu) and the
secret KV cache (protocols.layers.kv_cache): secure prefill + steps against the float64 reference
(the full masked stack at every position), declared == measured traffic for prefill and every
step, the job kinds and greedy generation in-process, calibration of the decode sites.

Shapes: B=2, d=16, h=2, d_head=8, d_ff=32, 2 layers, max_len 12; inputs uniform in [-1, 1]
(unit scale). Bound 1e-2 absolute on the hidden rows (issue 14); measured max errors are
printed by ``-s`` and quoted in docs/MODELS.md."""
import numpy as np
import pytest

from conftest import assert_lm_costs, lm_run, lm_session, share, value
from mpc3.party import RingConfig
from app import generate as G
from app import translate as T
from protocols.calibration import calibrate as C
from protocols.stacks import causal_lm as LM
from protocols.layers import kv_cache as KV
from protocols import model as M
from protocols.layers import secure_model as SM
from helpers import shadow_run as SR
TOL = 1e-2
VARIANTS = ["softmax", "power-softmax", "sigma-relu"]


def lm_cfg(attention, **kw):
    base = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                attn_norm="mean", norm_first=False, max_len=12, arch="decoder-only",
                n_dec_layers=2, tgt_vocab=13, attention=attention)
    return M.ModelConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("norm_first,prompt", [(False, 4), (True, 1)])
def test_prefill_and_steps_match_reference_and_declared_cost(run, rng, attention, norm_first,
                                                            prompt):
    cfg = lm_cfg(attention, norm_first=norm_first)
    w = M.random_weights(cfg, 2)
    steps = 4
    x = rng.uniform(-1, 1, (2, prompt + steps, 16))
    rows, measured, st = lm_run(run, cfg, SM.share_model(cfg, w), x, prompt)
    assert st.t == prompt + steps and [c.t for c in st.prefix] == [prompt + steps] * 2
    full = M.ref_lm(cfg, w, x)
    err = max(np.max(np.abs(h - full[:, prompt - 1 + k])) for k, h in enumerate(rows))
    print(f"{attention} norm_first={norm_first}: max abs error {err:.2e}")
    assert err < TOL
    assert_lm_costs(cfg, measured, 2, prompt)
    costs = [LM.cost_lm_step(RingConfig(), cfg, 2, t) for t in range(1, 12)]
    # rounds independent of t - but for the max-subtracted softmax's row maximum, whose
    # ReLU tournament over the t + 1 keys takes ceil(log2(t + 1)) levels of 4 rounds
    levels = [int(np.ceil(np.log2(t + 1))) if attention == "softmax" else 0
              for t in range(1, 12)]
    assert len({c.rounds - 4 * cfg.n_dec_layers * n for c, n in zip(costs, levels)}) == 1
    grow = [costs[k + 1].bytes_per_party[0] - costs[k].bytes_per_party[0] for k in range(10)]
    assert min(grow) > 0                                       # bytes grow with the prefix


@pytest.mark.parametrize("norm_first", [False, True])
def test_steps_with_every_layernorm_fusion(run, rng, norm_first):
    """Q, K, V and W1 formed inside the LayerNorms before them (LM_FUSIONS; the default forms
    W1 only): the KV cache gets the same rows, declared == measured, 2 rounds per fusion."""
    cfg = lm_cfg("softmax", norm_first=norm_first)
    w = M.random_weights(cfg, 4)
    x = rng.uniform(-1, 1, (2, 6, 16))
    rows, steps = lm_session(run, cfg, SM.share_model(cfg, w), x, 3, fuse=LM.LM_FUSIONS)
    full = M.ref_lm(cfg, w, x)
    for k, h in enumerate(rows):
        assert np.max(np.abs(h - full[:, 2 + k])) < TOL
    rc, fused = RingConfig(), LM.lm_fusions(cfg, LM.LM_FUSIONS)
    for t, got in steps.items():
        declared = LM.cost_lm_step(rc, cfg, 2, t, fuse=LM.LM_FUSIONS)
        assert got == (declared.bytes_per_party, declared.rounds)
        assert LM.cost_lm_step(rc, cfg, 2, t, fuse=()).rounds == declared.rounds + 2 * len(fused)


def test_cache_rows_are_the_projected_keys_and_refuse_overflow(run, rng):
    """The cache holds exactly the k, v rows appended (shares, capacity max_len) and the
    newest row attends to all of them like the masked attention's last row (q as a model's
    projection gives it: times 1/sqrt(d_head), folded into W^Q)."""
    q, k, v = (rng.uniform(-1, 1, (1, 2, 5, 4)) for _ in range(3))
    qs = q / 2.0

    def fn(p, qq, kk, vv):
        st = KV.KVCache.empty(1, 2, 4, 6)
        first = KV.attend(p, "softmax", st, qq[:, :, :4], kk[:, :, :4], vv[:, :, :4])
        allocated = st.k.shape[2]              # grows as tokens arrive, not max_len at once
        nxt = KV.attend(p, "softmax", st, qq[:, :, 4:], kk[:, :, 4:], vv[:, :, 4:])
        rows = st.rows()
        try:
            KV.attend(p, "softmax", st, qq[:, :, :1], kk[:, :, :2], vv[:, :, :2])
        except ValueError as e:
            refused = str(e)
        return first, nxt, rows, refused, (allocated, st.k.shape[2])

    res = run(fn, share(qs), share(k), share(v))
    from protocols.model.variants import ref_softmax_attention
    full = ref_softmax_attention(q, k, v, masked=True)
    assert np.max(np.abs(value([r[0] for r in res]) - full[:, :, :4])) < 1e-3
    assert np.max(np.abs(value([r[1] for r in res]) - full[:, :, 4:])) < 1e-3
    assert np.max(np.abs(value([r[2][0] for r in res]) - k)) < 1e-5
    assert np.max(np.abs(value([r[2][1] for r in res]) - v)) < 1e-5
    assert "capacity of 6" in res[0][3] and res[0][4] == (4, 6)
    with pytest.raises(ValueError, match="one row per token on an empty cache"):
        KV.cost_attend(RingConfig(), "softmax", 1, 2, 4, 3, 2, 2)


@pytest.mark.parametrize("attention", VARIANTS)
def test_secure_generation_agrees_with_plaintext_greedy(attention):
    """lm_prefill / lm_step / lm_close over the in-process transport; token agreement 1.0
    where the reference's top-2 margin exceeds the secure error."""
    from helpers.cases import top2_gap
    cfg = lm_cfg(attention, norm_first=True)
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    prompt = np.array([[1, 5, 2], [3, 3, 0]])
    be = T.InprocBackend(cfg, w)
    res = G.generate(be, cfg, user, prompt, 6)
    ref = M.greedy_generate(cfg, w, user, prompt, 6)
    assert top2_gap(cfg, w, user, prompt, ref) > 2e-2 and len({*ref[0], *ref[1]}) >= 5
    assert res.tokens == ref and res.steps == 5 and not be.open_sessions()
    rc = RingConfig()
    assert res.step_cost.rounds == sum(LM.cost_lm_step(rc, cfg, 2, t).rounds for t in range(3, 8))
    assert res.step_cost.bytes_total == sum(sum(LM.cost_lm_step(rc, cfg, 2, t).bytes_per_party)
                                            for t in range(3, 8))
    be2 = T.InprocBackend(cfg, w)                 # the session refuses past max_len
    x = np.random.default_rng(0).uniform(-1, 1, (1, 11, 16))
    s = T.Session(be2, T.LM)
    s.open(x)
    s.step(x[:, 0])
    with pytest.raises(RuntimeError, match="length limit of 12"):
        s.step(x[:, 1])


@pytest.mark.parametrize("attention,form,site,hot,refusal", [
    ("softmax", "max-free", "exp", 5.0, "max-free softmax exponent"),
    ("power-softmax", "max", "den", 5.0, "max-free softmax / PowerSoftmax row denominator"),
    ("sigma-relu", "max", "sigma_sum", 400.0, r"sigma-attention ReLU\(s\) V before its 1/L")])
def test_calibration_covers_the_decode_and_refuses(rng, attention, form, site, hot, refusal):
    """The LM calibration records the variant's sites on the causal rows (= the decode steps'
    rows); scores pushed out of a kernel's range by W^Q are refused at that kernel."""
    cfg = lm_cfg(attention, norm_first=True, softmax_form=form)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    x = rng.normal(size=(2, 12, 16))
    SR.close(SR.lm(cfg, w, x), M.ref_lm(cfg, w, x))
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    # sigma-attention's output reaches no kernel before W^O: no vout (docs/CALIBRATION.md)
    assert {"vscores", site} | ({"vout"} if attention != "sigma-relu" else set()) \
        <= set(cal.layers["dec.1.self"])
    hot = M.Weights({**w.tensors, "dec.0.self.wq": w["dec.0.self.wq"] * hot})
    with pytest.raises(C.RangeError, match=f"^dec.0.self: {refusal}"):
        C.calibrate(cfg, hot, C.default_samples(cfg, user, rng), user=user)


def test_max_subtracted_softmax_is_never_refused_for_its_scores(rng):
    """The same scores pushed far past exp's range (W^Q times 40: scores ~100) are accepted
    with the max-subtracted softmax (sites rowmax, vout; no exp or den), refused max-free,
    and the secure prefill and steps still match float64."""
    cfg = lm_cfg("softmax", norm_first=True)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    hot = M.Weights({**w.tensors, **{f"dec.{i}.self.wq": w[f"dec.{i}.self.wq"] * 40
                                     for i in range(2)}})
    cal = C.calibrate(cfg, hot, C.default_samples(cfg, user, rng), user=user)
    row = cal.layers["dec.0.self"]
    assert {"vscores", "rowmax", "vout"} <= set(row) and not {"exp", "den"} & set(row)
    assert row["vscores"] > 50
    with pytest.raises(C.RangeError, match="max-free softmax exponent"):
        C.calibrate(lm_cfg("softmax", norm_first=True, softmax_form="max-free"), hot,
                    C.default_samples(cfg, user, rng), user=user)


def test_config_accepts_every_architecture():
    for attention in VARIANTS:
        for cfg in (lm_cfg(attention), M.ModelConfig(
                d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                attn_norm="mean", norm_first=True, max_len=12, n_enc_layers=1, n_dec_layers=1,
                src_vocab=5, tgt_vocab=5, attention=attention).validate()):
            assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg
            assert not any(k.endswith(".omega") for k in M.expected_shapes(cfg))
