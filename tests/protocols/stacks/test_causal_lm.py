"""Decoder-only causal LM (arch decoder-only): secure prefill and incremental steps against
the float64 reference, measured traffic against the declared cost (O(1) per token), the
production job kinds and sessions, greedy generation in-process with token agreement 1.0,
and calibration.

Shapes: B=2, d=16, h=2, r=8 (decode block 11 by default, 3 where set), d_ff=32, 2 layers.
Bound: 2e-3 absolute on LayerNorm-scale hidden rows (measured 2e-4 post-LN, 6e-4 pre-LN)."""
import numpy as np
import pytest

from conftest import lm_session, share, value
from helpers.cases import top2_gap
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sharing import deal
from app import generate as G
from app import translate as T
from protocols.calibration import calibrate as C
from protocols.stacks import causal_lm as LM
from protocols.layers import ln_proj as LP
from protocols import model as M
from protocols.layers import secure_model as SM
from helpers import shadow_run as SR
TOL = 2e-3


def lm_cfg(**kw):
    base = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                attn_norm="mean", norm_first=False, max_len=16, arch="decoder-only",
                n_dec_layers=2, tgt_vocab=13)
    return M.ModelConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("norm_first,prompt", [(False, 5), (False, 6), (True, 3), (True, 7)])
def test_prefill_and_steps_match_reference_and_declared_cost(run, rng, norm_first, prompt):
    """Block 3: prompts that end inside a block (5, 7), on its boundary (6, 3)."""
    cfg = lm_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (2, prompt + 4, 16))
    measured = []

    def fn(p, s, xs):
        c0 = p.stats.snapshot()
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :prompt], block=3)
        measured.append((p.rank, -1, p.stats.snapshot() - c0))
        hs = [h]
        for t in range(prompt, prompt + 4):
            c0 = p.stats.snapshot()
            hs.append(LM.lm_step(p, cfg, s, st, xs[:, t]))
            measured.append((p.rank, t, p.stats.snapshot() - c0))
        return hs, st.t

    res = run(fn, SM.share_model(cfg, w), share(x))
    assert [r[1] for r in res] == [prompt + 4] * 3
    full = M.ref_lm(cfg, w, x)
    for k in range(5):
        got = value([r[0][k] for r in res])
        assert np.max(np.abs(got - full[:, prompt - 1 + k])) < TOL
    rc = RingConfig()
    for t in [-1] + list(range(prompt, prompt + 4)):
        declared = (LM.cost_lm_prefill(rc, cfg, 2, prompt, 3) if t < 0
                    else LM.cost_lm_step(rc, cfg, 2, t, 3))
        got = [m for r in range(3) for m in measured if m[0] == r and m[1] == t]
        assert tuple(m[2].bytes_sent for m in got) == declared.bytes_per_party
        assert max(m[2].rounds for m in got) == declared.rounds
    steps = [LM.cost_lm_step(rc, cfg, 2, t, 3) for t in range(3, 40)]
    assert all(steps[k] == steps[k + 3] for k in range(len(steps) - 3))   # O(1) per token
    assert len({c.rounds for c in steps}) == 1


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fuse", [(), ("self",), LM.LM_FUSIONS])
def test_fused_layernorm_projections_match_reference_and_save_two_rounds_each(
        run, rng, norm_first, fuse):
    """A step whose LayerNorms form the projections after them (lm_fusions): the same values,
    measured = declared traffic, and 2 rounds fewer per fused LayerNorm than unfused."""
    cfg = lm_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 3)
    x = rng.uniform(-1, 1, (2, 8, 16))
    rows, steps = lm_session(run, cfg, SM.share_model(cfg, w), x, 5, block=3, fuse=fuse)
    full = M.ref_lm(cfg, w, x)
    for k, h in enumerate(rows):
        assert np.max(np.abs(h - full[:, 4 + k])) < TOL
    rc, fused = RingConfig(), LM.lm_fusions(cfg, fuse)
    assert len(fused) == {(): 0, ("self",): 2 if norm_first else 1}.get(fuse, 4 if norm_first
                                                                             else 3)
    for t, got in steps.items():
        declared = LM.cost_lm_step(rc, cfg, 2, t, 3, fuse=fuse)
        assert got == (declared.bytes_per_party, declared.rounds)
        assert LM.cost_lm_step(rc, cfg, 2, t, 3, fuse=()).rounds - declared.rounds == \
            2 * len(fused)


@pytest.mark.parametrize("norm_first", [False, True])
def test_prefill_marks_sum_to_its_traffic_and_bad_fuse_is_refused_first(run, rng, norm_first):
    """The per-layer costs a prefill job reports (on_layer marks) cover all its traffic, the
    session's fused beta W1 included ("dec.ln_bias"); an unknown fusion is refused before
    the first round."""
    from protocols.jobs.contract import CostRecorder
    cfg = lm_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (2, 4, 16))

    def fn(p, s, xs):
        with pytest.raises(ValueError, match="unknown"):
            LM.lm_prefill(p, cfg, s, xs, fuse=("cross",))
        assert p.stats.rounds == 0
        rec = CostRecorder(p)
        LM.lm_prefill(p, cfg, s, xs, on_layer=rec.mark)
        return rec.entries, p.stats.bytes_sent, p.stats.rounds

    entries, total, rounds = run(fn, SM.share_model(cfg, w), share(x))[0]
    assert [e["layer"] for e in entries] == ["dec.0", "dec.1"] + ["dec.final_ln"] * norm_first \
        + ["dec.ln_bias"]
    assert entries[-1]["rounds"] == 2
    assert sum(e["bytes"] for e in entries) == total
    assert sum(e["rounds"] for e in entries) == rounds


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fuse", [LM.DEFAULT_LM_FUSE, LM.LM_FUSIONS])
def test_unfolded_omega_declares_what_it_measures(run, rng, norm_first, fuse):
    """Shares with Omega separate (share_model(fold_omega=False)): the projections are plain
    and the features take their own Omega product; the costs say so (folded=False)."""
    cfg = lm_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 6)
    x = rng.uniform(-1, 1, (2, 6, 16))
    rows, steps = lm_session(run, cfg, SM.share_model(cfg, w, fold_omega=False), x, 4,
                             block=3, fuse=fuse)
    full = M.ref_lm(cfg, w, x)
    for k, h in enumerate(rows):
        assert np.max(np.abs(h - full[:, 3 + k])) < TOL
    rc = RingConfig()
    prefill = LM.cost_lm_prefill(rc, cfg, 2, 4, 3, fuse=fuse, folded=False)
    assert run.bytes_per_party == tuple(
        sum(c) for c in zip(prefill.bytes_per_party, *(b for b, _ in steps.values())))
    for t, got in steps.items():
        declared = LM.cost_lm_step(rc, cfg, 2, t, 3, fuse=fuse, folded=False)
        assert got == (declared.bytes_per_party, declared.rounds)


def test_lm_fusions_need_layernorm_and_known_kinds():
    assert LM.lm_fusions(lm_cfg(norm_first=True), ("self", "ffn")) == {
        f"dec.{i}.ln{n}": [f"dec.{i}.{k}" for k in ks] for i in range(2)
        for n, ks in ((1, ("self.wq_proj", "self.wk_proj", "self.wv_c")), (2, ("ffn.w1",)))}
    post = LM.lm_fusions(lm_cfg(norm_first=False), ("self", "ffn"))
    assert post == {"dec.0.ln1": ["dec.0.ffn.w1"], "dec.1.ln1": ["dec.1.ffn.w1"],
                    "dec.0.ln2": ["dec.1.self.wq_proj", "dec.1.self.wk_proj", "dec.1.self.wv_c"]}
    assert LM.lm_fusions(lm_cfg(norm_first=True, norm="batchnorm"), LM.LM_FUSIONS) == {}
    with pytest.raises(ValueError, match="cross"):
        LM.lm_fusions(lm_cfg(), ("cross",))


def test_prefill_attention_leaves_the_decode_state(run, rng):
    """The state after a prefill of T rows continues exactly like T decode steps would."""
    from protocols.layers import attention as A
    qf, kf = rng.uniform(0, 1, (1, 2, 7, 4)), rng.uniform(0, 1, (1, 2, 7, 4))
    v = rng.uniform(-1, 1, (1, 2, 7, 3))

    def fn(p, q, k, vv):
        out, st = LM.prefill_attention(p, q[:, :, :5], k[:, :, :5], vv[:, :, :5], block=2)
        nxt = [A.attention_step(p, st, q[:, :, t:t + 1], k[:, :, t:t + 1], vv[:, :, t:t + 1])
               for t in (5, 6)]
        return out, nxt, (st.t, st.folded, st.cached)

    res = run(fn, share(qf), share(kf), share(v))
    ref = np.einsum("bhsr,bhsrd->bhsd", qf, np.cumsum(np.einsum("bhsr,bhsd->bhsrd", kf, v), 2))
    assert np.max(np.abs(value([r[0] for r in res]) - ref[:, :, :5])) < 1e-4
    for j, t in enumerate((5, 6)):
        assert np.max(np.abs(value([r[1][j] for r in res])[:, :, 0] - ref[:, :, t])) < 1e-4
    assert res[0][2] == (7, 6, 1)


@pytest.mark.parametrize("norm_first,seed,fuse", [(True, 1, None), (False, 3, None),
                                                   (False, 3, "all")])
def test_secure_generation_agrees_with_plaintext_greedy(norm_first, seed, fuse):
    """Seeds whose greedy paths vary and keep a top-2 logit margin > 1e-2 (the secure
    hidden rows are within 2e-3), so agreement is a real check, not luck. ``fuse``: the
    session's LayerNorm fusions (lm_prefill's parameter) - the rounds change, not the
    tokens."""
    cfg = lm_cfg(max_len=14, norm_first=norm_first)
    w, user = M.random_weights(cfg, seed), M.random_user(cfg, seed)
    prompt = np.array([[1, 5, 2, 9], [3, 3, 0, 12]])
    be = T.InprocBackend(cfg, w, fuse=fuse)
    streamed = []
    res = G.generate(be, cfg, user, prompt, 9, on_token=lambda k, tok: streamed.append(tok))
    ref = M.greedy_generate(cfg, w, user, prompt, 9)
    assert top2_gap(cfg, w, user, prompt, ref) > 1e-2 and len({*ref[0], *ref[1]}) >= 6
    assert res.tokens == ref and len(streamed) == 9               # token agreement 1.0
    assert res.steps == 8 and res.prefill_cost.jobs == 1 and res.step_cost.jobs == 8
    assert not be.open_sessions()
    st = M.RefLMState(cfg, 2)
    seq = np.concatenate([prompt, np.stack(res.fed, 1)], 1)
    for t in range(seq.shape[1]):             # hidden rows vs the reference on the same tokens
        h = M.ref_lm_step(cfg, w, st, M.embed(cfg, user["embed.tgt"], seq[:, t:t + 1], t)[:, 0])
        if t >= prompt.shape[1] - 1:
            assert np.max(np.abs(res.hidden[t - prompt.shape[1] + 1] - h)) < TOL
    per_token = res.step_cost.bytes_total / res.step_cost.jobs
    chosen = LP.fusion_choice(fuse, LM.LM_FUSIONS, LM.DEFAULT_LM_FUSE, "test")
    assert per_token > 0 and res.step_cost.rounds == 8 * LM.cost_lm_step(
        RingConfig(), cfg, 2, 4, fuse=chosen).rounds


def test_lm_jobs_refuse_misuse():
    cfg = lm_cfg(max_len=6)
    w = M.random_weights(cfg, 1)
    be = T.InprocBackend(cfg, w)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 4, 16))
    with pytest.raises(ValueError, match="session 'nope' is unknown"):
        T.Session(be, T.LM, sid="nope").step(x[:, 0])
    with pytest.raises(ValueError, match="too long"):
        T.Session(be, T.LM).open(np.zeros((1, 7, 16)))
    for kind in ("classify", "decode_open"):
        dealt = deal(ring.encode(x, ring.DEFAULT_FRAC))
        with pytest.raises(ValueError, match=f"'{kind}' does not apply to model 'inproc' "
                           r"\(a decoder-only model\)"):
            be.parties.run(kind, {"session": "s9"} if kind == "decode_open" else {},
                           [{"X": dealt[n]} for n in range(3)])
    s1 = T.Session(be, T.LM)
    s1.open(x)
    with pytest.raises(RuntimeError, match="step batch 2 differs"):     # fails at run time
        s1.step(np.zeros((2, 16)))
    be2 = T.InprocBackend(cfg, w)
    s2 = T.Session(be2, T.LM)
    s2.open(x)
    s2.step(x[:, 0])
    s2.step(x[:, 1])
    with pytest.raises(RuntimeError, match="length limit of 6"):
        s2.step(x[:, 2])
    with pytest.raises(ValueError, match="need 8 positions; the model takes at most 6"):
        G.generate(be2, cfg, M.random_user(cfg), [[1, 2, 3]], 6)


def test_lm_calibrates_and_its_calibration_runs_the_reference(rng):
    cfg = lm_cfg(norm_first=True, max_len=12)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    x = rng.normal(size=(2, 12, 16))
    SR.close(SR.lm(cfg, w, x), M.ref_lm(cfg, w, x))
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    assert set(cal.input_range) == {"X", "Y"}
    assert cal.input_range["X"] == cal.input_range["Y"] == \
        C.embedding_range(cfg, user["embed.tgt"])
    assert {"kv", "scores", "out"} <= set(cal.layers["dec.1.self"])
    # the steps' LN2 forms W1 (lm_fusions): its unscaled product and the rs scaling checked
    assert {"lnw1", "lnscale"} <= set(cal.layers["dec.1.ln2"])
    assert not {"lnw1", "lnproj"} & set(cal.layers["dec.1.ln1"])
    hot = M.ModelConfig.from_dict({**cfg.to_dict(), "attn_c": 64.0})
    with pytest.raises(C.RangeError, match="^dec.0."):
        C.calibrate(hot, w, C.default_samples(hot, user, rng), user=user)


def test_byte_text():
    cfg = lm_cfg(tgt_vocab=257)
    assert G.encode_text(cfg, "hé") == [104, 195, 169] and G.eos_of(cfg) == 256
    s = G.ByteStream()
    assert [s.feed(t) for t in (104, 195, 169, 256)] == ["h", "", "é", "<256>"]
    with pytest.raises(ValueError, match="needs at least 256"):
        G.encode_text(lm_cfg(), "hi")
