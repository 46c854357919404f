"""LLaMA-family decoders on shares (issue 36): RMSNorm, rotary positions, the SiLU-gated FFN
and grouped-query attention in the secure decoder-only LM - prefill and KV-cache steps
against the float64 reference (protocols.model.ref_lm: the whole masked stack at every
position), declared == measured traffic, each layer alone against its float64 form, and the
calibration (the same stacks on a shadow party) reaching their sites.

Shapes: B=2, d=16, 4 query heads of 4, 2 KV heads, d_ff=24, 2 layers, max_len 12; inputs
uniform in [-1, 1]. Bound 1e-2 absolute on the hidden rows, as for the other LMs."""
import numpy as np
import pytest

from conftest import assert_lm_costs, lm_run, share, value
from mpc3.party import RingConfig
from protocols import model as M
from protocols.calibration import calibrate as C
from protocols.layers import ffn as F
from protocols.layers import layernorm as LN
from protocols.layers import rotary as R
from protocols.layers import secure_model as SM
from protocols.stacks import causal_lm as LM
from helpers import shadow_run as SR
TOL = 1e-2


def llama_cfg(**kw):
    base = dict(d_model=16, n_heads=4, d_head=4, n_features=4, d_ff=24, attn_c=1.0,
                attn_norm="const", norm_first=True, max_len=12, arch="decoder-only",
                n_dec_layers=2, tgt_vocab=13, attention="softmax", norm="rmsnorm",
                ffn_act="swiglu", embedding="rotary", n_kv_heads=2, rope_theta=100.0,
                ln_eps=1e-5)
    return M.ModelConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("kv,prompt", [(2, 4), (4, 1), (1, 3)])
def test_prefill_and_steps_match_reference_and_declared_cost(run, rng, kv, prompt):
    cfg = llama_cfg(n_kv_heads=kv if kv != 4 else 0)
    w = M.random_weights(cfg, 3)
    steps = 4
    x = rng.uniform(-1, 1, (2, prompt + steps, 16))
    rows, measured, st = lm_run(run, cfg, SM.share_model(cfg, w), x, prompt)
    assert [c.k.shape[1] for c in st.prefix] == [cfg.kv_heads] * 2   # the KV heads only
    full = M.ref_lm(cfg, w, x)
    err = max(np.max(np.abs(h - full[:, prompt - 1 + k])) for k, h in enumerate(rows))
    print(f"kv heads {cfg.kv_heads}, prompt {prompt}: max abs error {err:.2e}")
    assert err < TOL
    assert_lm_costs(cfg, measured, 2, prompt)


def test_incremental_reference_is_the_whole_sequence():
    """ref_lm_step (rotary at the state's position, grouped KV cache) == ref_lm's rows."""
    cfg = llama_cfg()
    w = M.random_weights(cfg, 1)
    x = np.random.default_rng(2).uniform(-1, 1, (2, 7, 16))
    st = M.RefLMState(cfg, 2)
    rows = np.stack([M.ref_lm_step(cfg, w, st, x[:, t]) for t in range(7)], axis=1)
    assert np.max(np.abs(rows - M.ref_lm(cfg, w, x))) < 1e-12


def test_rotary_is_position_dependent_and_relative():
    """rope rotates pairs: norms kept, and q.k after rotation depends on the position
    difference only (why the KV cache may keep rotated keys)."""
    q, k = np.random.default_rng(3).normal(size=(2, 8))
    def dot(i, j):
        return float(M.ref_rope(q[None], [i], 50.0)[0] @ M.ref_rope(k[None], [j], 50.0)[0])
    assert abs(dot(5, 2) - dot(9, 6)) < 1e-12 and abs(dot(5, 2) - dot(5, 3)) > 1e-3
    assert abs(np.linalg.norm(M.ref_rope(q[None], [7], 50.0)) - np.linalg.norm(q)) < 1e-12


def test_layers_alone_match_float_and_declared_cost(run, rng):
    """rmsnorm, rope_many and the gated FFN each against float64 and their cost functions."""
    d, f = 16, 24
    x = rng.uniform(-2, 2, (3, 5, d))
    gamma = rng.uniform(0.5, 1.5, d)
    q = rng.uniform(-2, 2, (1, 2, 5, 8))
    w1, w3, w2 = (rng.normal(size=s) / 4 for s in ((d, f), (d, f), (f, d)))
    costs = {}

    def fn(p, xs, g, qs, a, b, c):
        out = []
        for name, call in (("rms", lambda: LN.rmsnorm(p, xs, g, 1e-5)),
                           ("rope", lambda: R.rope_many(p, [(qs, np.arange(3, 8))], 10.0)[0]),
                           ("ffn", lambda: F.ffn(p, {"w1": a, "w3": b, "w2": c}, xs,
                                                 "swiglu"))):
            c0 = p.stats.snapshot()
            out.append(call())
            costs.setdefault(name, {})[p.rank] = p.stats.snapshot() - c0
        return out

    res = run(fn, share(x), share(gamma), share(q), share(w1), share(w3), share(w2))
    got = [value([r[k] for r in res]) for k in range(3)]
    assert np.max(np.abs(got[0] - M.ref_rmsnorm(x, gamma, 1e-5))) < 2e-3
    assert np.max(np.abs(got[1] - M.ref_rope(q, np.arange(3, 8), 10.0))) < 1e-4
    assert np.max(np.abs(got[2] - M.ref_swiglu(x, w1, w3, w2))) < 5e-3
    rc = RingConfig()
    for name, declared in (("rms", LN.cost_rmsnorm(rc, 15, d)),
                           ("rope", R.cost_rope(rc, q.size)),
                           ("ffn", F.cost_ffn(rc, 15, d, f, "swiglu"))):
        m = costs[name]
        assert tuple(m[r].bytes_sent for r in range(3)) == declared.bytes_per_party, name
        assert max(m[r].rounds for r in range(3)) == declared.rounds, name


def test_calibration_runs_the_llama_stack_and_refuses_a_hot_gate(rng):
    """The shadow party runs the same stack (== float64), the calibration records the new
    sites (RMSNorm's var_eps, the gate's SiLU input and product), and a gate pushed past
    SiLU's range is refused there by name."""
    cfg = llama_cfg()
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    x = rng.normal(size=(2, 12, 16))
    SR.close(SR.lm(cfg, w, x), M.ref_lm(cfg, w, x))
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    assert {"hidden_silu", "w1", "w3", "gate", "w2"} <= set(cal.layers["dec.0.ffn"])
    assert "var_eps" in cal.layers["dec.0.ln1"] and "vscores" in cal.layers["dec.1.self"]
    hot = M.Weights({**w.tensors, "dec.1.ffn.w1": w["dec.1.ffn.w1"] * 3e4})
    with pytest.raises(C.RangeError, match="^dec.1.ffn: "):
        C.calibrate(cfg, hot, C.default_samples(cfg, user, rng), user=user)


def test_config_refuses_what_has_no_protocol():
    with pytest.raises(ValueError, match="must divide n_heads"):
        llama_cfg(n_kv_heads=3)
    with pytest.raises(ValueError, match="softmax-style"):
        llama_cfg(attention="relu-performer", n_kv_heads=0)
    with pytest.raises(ValueError, match="applies to arch 'decoder-only'"):
        M.ModelConfig(d_model=16, n_heads=4, d_head=4, n_features=4, d_ff=24, attn_c=1.0,
                      attn_norm="const", norm_first=True, max_len=12, n_enc_layers=1,
                      n_dec_layers=1, src_vocab=5, tgt_vocab=5, attention="softmax",
                      n_kv_heads=2).validate()
    with pytest.raises(ValueError, match="no ffn_bn"):
        llama_cfg(ffn_bn=True)
    cfg = llama_cfg()
    assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert LM.lm_fusions(cfg, LM.LM_FUSIONS) == {}


def test_secure_generation_agrees_with_plaintext_greedy():
    """The LM job in-process (prefill, KV-cache steps, the user's head): the reference's
    greedy tokens, where its top-2 margin exceeds the secure error."""
    from app import generate as G
    from app import translate as T
    from helpers.cases import top2_gap
    cfg = llama_cfg()
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    prompt = np.array([[1, 5, 2], [3, 3, 0]])
    ref = M.greedy_generate(cfg, w, user, prompt, 6)
    assert top2_gap(cfg, w, user, prompt, ref) > 2e-2
    res = G.generate(T.InprocBackend(cfg, w), cfg, user, prompt, 6)
    assert res.tokens == ref and res.steps == 5


def test_rmsnorm_gain_keeps_small_streams_exact_and_inside_the_range(run, rng):
    """A LLaMA-like stream (embeddings of RMS ~0.02, eps 1e-6: mean square ~4e-4, below
    sqrt_inv's range with the margin) is refused at gain 0 and accepted by the calibration,
    which stores a gain per RMSNorm (schedule.rms_gain); the secure prefill with the
    session's schedule then meets float64 ~10x closer than without the gain, and the gain
    changes no byte or round."""
    from protocols.stacks import schedule as S
    cfg = llama_cfg(ln_eps=1e-6, d_model=64, n_heads=4, d_head=16, d_ff=96, max_len=8)
    w = M.random_weights(cfg, 2)
    user = {**M.random_user(cfg, 2)}
    user["embed.tgt"] = user["embed.tgt"] * (0.02 * 8)        # RMS ~0.02 per row (d 64)
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    assert set(cal.norm_gain) >= {"dec.0.ln1"} and min(cal.norm_gain.values()) >= 3
    assert C.Calibration.from_dict(cal.to_dict()).norm_gain == cal.norm_gain
    with pytest.raises(C.RangeError, match="var_eps|variance"):
        C.Calibration(cal.layers, cal.input_range, margin=cal.margin,
                      ln_eps=cal.ln_eps).check()
    with pytest.raises(ValueError, match="norm_gain"):
        C.Calibration.from_dict({**cal.to_dict(), "norm_gain": {"dec.0.ln1": 99}})
    sched = S.session_schedule(cfg, cal.to_dict(), RingConfig())
    x = M.embed_tokens(cfg, user, rng.integers(0, 13, (2, 8)))
    ref = M.ref_lm(cfg, w, x)[:, -1]
    errs, costs = [], []

    for schedule in (S.GENERAL, sched):
        def fn(p, s, xs):
            c0 = p.stats.snapshot()
            h = LM.lm_prefill(p, cfg, s, xs, schedule=schedule)[0]
            return h, p.stats.snapshot() - c0

        res = run(fn, SM.share_model(cfg, w), share(x))
        errs.append(np.max(np.abs(value([r[0] for r in res]) - ref)))
        costs.append([(r[1].bytes_sent, r[1].rounds) for r in res])
    print(f"RMSNorm gain: max abs error {errs[0]:.2e} without, {errs[1]:.2e} with")
    assert errs[1] < errs[0] / 4 and errs[1] < 2e-3 and costs[0] == costs[1]
