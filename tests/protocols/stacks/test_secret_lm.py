"""A decoder-only LM with secret embeddings and LM head (protocols.stacks.secret_lm): the
user's tokens go in as one-hot rows, the parties embed them on shares, run the LM and the
head's arg-max, and only the token is opened - greedy generation equal to the float64
reference's (protocols.model.greedy_generate), declared == measured traffic for the prefill
and every step, for sinusoidal, learned (GPT-2) and rotary (LLaMA) positions."""
import numpy as np
import pytest

from mpc3 import ring
from mpc3.kernels import arith
from mpc3.party import RingConfig
from mpc3.sharing import deal
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.layers.vocab import onehot
from protocols.stacks import secret_lm as S

V = 23


def lm_cfg(embedding, **kw):
    base = dict(d_model=16, n_heads=4, d_head=4, n_features=4, d_ff=24, attn_c=1.0,
                attn_norm="const", norm_first=True, max_len=10, arch="decoder-only",
                n_dec_layers=2, tgt_vocab=V, attention="softmax", ffn_act="gelu",
                embedding=embedding)
    if embedding == "rotary":
        base.update(norm="rmsnorm", ffn_act="swiglu", n_kv_heads=2, ln_eps=1e-5)
    return M.ModelConfig(**{**base, **kw}).validate()


@pytest.mark.parametrize("embedding", ["sinusoidal", "learned", "rotary"])
def test_secret_generation_equals_the_reference_and_declared_cost(run, embedding):
    cfg = lm_cfg(embedding)
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    user["out.w"] = user["out.w"] * 6                 # clear margins between the top logits
    prompt, n = np.array([[1, 5, 2, 9], [3, 3, 0, 7]]), 5
    ref = M.greedy_generate(cfg, w, user, prompt, n)
    measured = {}

    def fn(p, s, oh):
        def tok(t):                                   # opened here for the test's loop only
            return np.rint(ring.decode(arith.open_a(p, t), 18)).astype(int)
        c0 = p.stats.snapshot()
        t, st = S.lm_prefill_token(p, cfg, s, oh)
        measured.setdefault(-1, {})[p.rank] = p.stats.snapshot() - c0
        toks = [tok(t)]
        for k in range(n - 1):
            row = arith.public_share(p, onehot(toks[-1], V))   # the user's next one-hot
            c0 = p.stats.snapshot()
            t = S.lm_step_token(p, cfg, s, st, row)
            measured.setdefault(st.t - 1, {})[p.rank] = p.stats.snapshot() - c0
            toks.append(tok(t))
        return np.stack(toks, axis=1)

    res = run(fn, SM.share_model(cfg, w, secret_user=user), deal(onehot(prompt, V)))
    assert res[0].tolist() == ref
    rc = RingConfig()
    for t, got in measured.items():
        declared = S.cost_prefill_token(rc, cfg, 2, 4) if t < 0 else \
            S.cost_step_token(rc, cfg, 2, t)
        assert tuple(got[r].bytes_sent for r in range(3)) == declared.bytes_per_party, t
        assert max(got[r].rounds for r in range(3)) == declared.rounds, t


def test_secret_layout_refuses_what_it_cannot_look_up():
    cfg = lm_cfg("learned")
    assert set(SM.secret_layout(cfg, M.random_user(cfg))) == {"embed.tgt", "embed.pos",
                                                             "out.w", "out.b"}
    with pytest.raises(ValueError, match="learned-ln"):
        SM.check_secret(lm_cfg("learned-ln"))


def test_calibration_covers_the_secret_head_and_refuses_it_out_of_range():
    """With the head secret the calibration runs every step's row through lm_head_token on
    the shadow party (sites lm_head, argmax under ``out``); a head whose logits leave the
    arg-max's comparison range is refused there, by name."""
    from protocols.calibration import calibrate as C
    cfg = lm_cfg("learned")
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    rng = np.random.default_rng(0)
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user, secret=True)
    assert {"lm_head", "argmax"} <= set(cal.layers["out"])
    assert "out" not in C.calibrate(cfg, w, C.default_samples(cfg, user, rng),
                                    user=user).layers
    hot = {**user, "out.w": user["out.w"] * 1e5}
    with pytest.raises(C.RangeError, match="^out: "):
        C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=hot, secret=True)


@pytest.mark.parametrize("embedding", ["learned", "rotary"])
def test_secret_jobs_generate_the_reference_tokens_and_refuse_other_models(embedding):
    """The production job kinds in process (lm_prefill_token, lm_step_token, lm_close_token
    through app.generate.generate_tokens): the reference's greedy tokens, no hidden row; a
    model shared with user-held tables refuses them, and the secret model refuses
    ``generate`` unless its owner permits it."""
    from app import generate as G
    from app import translate as T
    from protocols.calibration import calibrate as C
    cfg = lm_cfg(embedding)
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    user["out.w"] = user["out.w"] * 6
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, np.random.default_rng(0)),
                      user=user, secret=True).to_dict()
    prompt = np.array([[1, 5, 2, 9], [3, 3, 0, 7]])
    be = T.InprocBackend(cfg, w, calibration=cal, secret_user=user)
    res = G.generate_tokens(be, cfg, prompt, 5)
    assert res.tokens == M.greedy_generate(cfg, w, user, prompt, 5)
    assert res.steps == 4 and not res.hidden and not be.open_sessions()
    rc = RingConfig()
    assert res.step_cost.rounds == sum(S.cost_step_token(rc, cfg, 2, t).rounds
                                       for t in range(4, 8))
    with pytest.raises(Exception, match="not permitted|permit"):
        G.generate(be, cfg, user, prompt, 2)
    plain = T.InprocBackend(cfg, w, calibration=cal)
    with pytest.raises(Exception, match="does not permit 'generate-token'"):
        G.generate_tokens(plain, cfg, prompt, 2)
    from net.party.inproc import InprocParties      # permitted, but no secret tables
    from protocols.jobs.causal_lm import _validate_step_token
    view = InprocParties.for_model(cfg, w, permitted=("generate-token",),
                                   calibration=cal).models[0]
    with pytest.raises(ValueError, match="hands its embedding tables"):
        _validate_step_token(view, {"ONEHOT": (2, V)}, {})
