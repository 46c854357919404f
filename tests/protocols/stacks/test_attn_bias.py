"""Attention biases (``attn_bias``), BERT's pooler (``pool`` cls-tanh) and learned embeddings
(``embedding``): config round trips, the float64 trace, and the secure protocols against the
float64 reference in every architecture, with the declared costs unchanged (biases are added
locally) and checked against measured traffic.

Shapes: B=2, d=16, h=2, r=8, d_ff=32, 2 layers. Bounds: 2e-3 absolute on logits and on
LayerNorm-scale hidden rows, as tests/protocols/stacks/test_classifier.py and
tests/protocols/stacks/test_causal_lm.py."""
import numpy as np
import pytest

from conftest import share, value
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties
from protocols.calibration import calibrate as C
from protocols.stacks import causal_lm as LM
from protocols.stacks import classifier as CL
from protocols.stacks import decoder as D
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks.encoder import encoder
from helpers import shadow_run as SR
TOL = 2e-3
BASE = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
            attn_norm="mean", norm_first=False, max_len=12, attn_bias=True)


def clf(**kw):
    return M.ModelConfig(**{**BASE, "arch": "encoder-classifier", "n_enc_layers": 2,
                            "src_vocab": 11, "n_classes": 5, **kw}).validate()


def test_config_keys_are_optional_and_checked():
    plain = clf(attn_bias=False)
    assert not {"attn_bias", "pool", "embedding", "type_vocab"} & set(plain.to_dict())
    cfg = clf(pool="cls-tanh", embedding="learned-ln", type_vocab=2)
    d = cfg.to_dict()
    assert (d["attn_bias"], d["pool"], d["embedding"], d["type_vocab"]) == \
        (True, "cls-tanh", "learned-ln", 2)
    assert M.ModelConfig.from_dict(d) == cfg
    shapes = M.expected_shapes(cfg)
    assert shapes["enc.0.attn.bq"] == (16,) and shapes["enc.1.attn.bo"] == (16,)
    assert shapes["pool.w"] == (16, 16) and shapes["pool.b"] == (16,)
    assert M.expected_user_shapes(cfg) == {
        "embed.src": (11, 16), "embed.pos": (12, 16), "embed.type": (2, 16),
        "embed.ln.gamma": (16,), "embed.ln.beta": (16,)}
    with pytest.raises(ValueError, match="pool='cls-tanh' applies to arch 'encoder-classifier'"):
        M.ModelConfig(**{**BASE, "arch": "decoder-only", "n_dec_layers": 1, "tgt_vocab": 5,
                         "pool": "cls-tanh"}).validate()
    with pytest.raises(ValueError, match="pool='max' applies to arch 'encoder' only"):
        clf(pool="max")
    with pytest.raises(ValueError, match="normalize .* applies to arch 'encoder' only"):
        clf(normalize=True)
    with pytest.raises(ValueError, match="type_vocab .* needs a learned embedding"):
        clf(type_vocab=2)
    with pytest.raises(ValueError, match="embedding='learned' needs one input table"):
        M.ModelConfig(**{**BASE, "n_enc_layers": 1, "n_dec_layers": 1, "src_vocab": 5,
                         "tgt_vocab": 5, "embedding": "learned"}).validate()


def test_learned_embedding_is_user_side_and_its_range_covers_every_token(tmp_path):
    cfg = clf(pool="cls-tanh", embedding="learned-ln", type_vocab=2)
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    ids = np.array([[1, 4, 2, 9]])
    x = M.embed_tokens(cfg, user, ids, types=np.array([[0, 0, 1, 1]]))
    raw = user["embed.src"][ids] + user["embed.pos"][:4] + user["embed.type"][[[0, 0, 1, 1]]]
    np.testing.assert_allclose(x, M.ref_layernorm(raw, user["embed.ln.gamma"],
                                                  user["embed.ln.beta"], cfg.ln_eps))
    with pytest.raises(ValueError, match="learned positions .* embed_tokens"):
        M.embed(cfg, user["embed.src"], ids)
    with pytest.raises(ValueError, match="exceed the model's 12 learned positions"):
        M.embed_tokens(cfg, user, np.zeros((1, 13), dtype=int))
    every = np.repeat(np.arange(11)[:, None], 12, 1)              # each token, each position
    for t in (0, 1):
        got = M.embed_tokens(cfg, user, every, types=np.full(every.shape, t))
        assert np.abs(got).max() <= C.embedding_range(cfg, user["embed.src"], user)
    path = tmp_path / "m.npz"
    M.save_model(path, cfg, w, user)
    cfg2, w2, user2 = M.load_model(path)
    assert cfg2 == cfg and sorted(user2) == sorted(user)
    gpt = M.ModelConfig(**{**BASE, "arch": "decoder-only", "n_dec_layers": 1, "tgt_vocab": 7,
                           "embedding": "learned"}).validate()
    ug = M.random_user(gpt, 2)
    every = np.stack([M.embed_tokens(gpt, ug, np.full((1, 12), t))[0] for t in range(7)])
    assert np.isclose(np.abs(every).max(), C.embedding_range(gpt, ug["embed.tgt"], ug))


@pytest.mark.parametrize("attention,pool,fold", [("relu-performer", "mean", True),
                                                 ("relu-performer", "cls-tanh", False),
                                                 ("softmax", "cls-tanh", True),
                                                 ("softmax", "mean", True)])
def test_classifier_with_biases_matches_reference_and_declared_cost(run, rng, attention,
                                                                    pool, fold):
    cfg = clf(attention=attention, pool=pool, norm_first=pool == "mean")
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (2, 6, 16))
    ref = M.ref_classify(cfg, w, x)
    SR.close(SR.classifier(cfg, w, x), ref)          # the calibration runs it too
    res = run(lambda p, s, xs: CL.classify(p, cfg, s, xs), SM.share_model(cfg, w, fold),
              share(x))
    assert np.max(np.abs(value(res) - ref)) < TOL
    if fold:                                   # cost_classify declares folded Omega
        run.assert_cost(CL.cost_classify(RingConfig(), cfg, 2, 6))
    without = M.Weights({k: v for k, v in w.items() if k.rsplit(".", 1)[1] not in
                         ("bq", "bk", "bv", "bo")})
    assert np.abs(M.ref_classify(clf(attention=attention, pool=pool, attn_bias=False,
                                     norm_first=pool == "mean"), without, x) - ref).max() > 1e-2


@pytest.mark.parametrize("norm_first,fold", [(False, True), (True, False)])
def test_translator_with_biases_encoder_and_decode_steps(rng, norm_first, fold):
    cfg = M.ModelConfig(**{**BASE, "norm_first": norm_first, "n_enc_layers": 1,
                           "n_dec_layers": 2, "src_vocab": 5, "tgt_vocab": 5}).validate()
    w = M.random_weights(cfg, 3)
    x, y = rng.uniform(-1, 1, (2, 5, 16)), rng.uniform(-1, 1, (2, 4, 16))
    enc_ref = M.ref_encoder(cfg, w, x)
    dec_ref = M.ref_decoder(cfg, w, y, enc_ref)
    SR.close(SR.translator(cfg, w, x, y, fold=fold, block=2)[1], dec_ref)
    sh = SM.share_model(cfg, w, fold_omega=fold)

    def fn(p, s, xs, ys):
        enc = encoder(p, cfg, s, xs)
        st = D.DecodeState.start(p, cfg, s, enc, block=2)
        return enc, [D.decoder_step(p, cfg, s, st, ys[:, t]) for t in range(4)]

    xs, ys = share(x), share(y)
    res = run_parties(fn, [(sh[i], xs[i], ys[i]) for i in range(3)], parties=make_parties())
    assert np.max(np.abs(value([r[0] for r in res]) - enc_ref)) < TOL
    steps = np.stack([value([r[1][t] for r in res]) for t in range(4)], 1)
    assert np.max(np.abs(steps - dec_ref)) < TOL


def test_lm_with_biases_prefill_and_steps(run, rng):
    cfg = M.ModelConfig(**{**BASE, "norm_first": True, "arch": "decoder-only",
                           "n_dec_layers": 2, "tgt_vocab": 9}).validate()
    w = M.random_weights(cfg, 4)
    x = rng.uniform(-1, 1, (2, 7, 16))
    full = M.ref_lm(cfg, w, x)
    SR.close(SR.lm(cfg, w, x), full)

    def fn(p, s, xs):
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :4], block=3)
        return [h] + [LM.lm_step(p, cfg, s, st, xs[:, t]) for t in range(4, 7)]

    res = run(fn, SM.share_model(cfg, w), share(x))
    for k in range(4):
        assert np.max(np.abs(value([r[k] for r in res]) - full[:, 3 + k])) < TOL


def test_calibration_covers_the_pooler_and_refuses_a_saturating_tanh():
    cfg = clf(attention="softmax", pool="cls-tanh", embedding="learned-ln", type_vocab=2)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    samples = C.default_samples(cfg, user, np.random.default_rng(0))
    cal = C.calibrate(cfg, w, samples, user=user)
    assert {"pool_dense", "tanh", "head", "argmax"} <= set(cal.layers["head"])
    assert "pool" not in cal.layers["head"]
    w["pool.w"] = w["pool.w"] * 400
    with pytest.raises(C.RangeError, match="head: pooler tanh input .* above the limit 24 of "
                       "tanh with safety margin 4"):
        C.calibrate(cfg, w, samples, user=user)


def test_softmax_lm_with_biases_decodes_securely(run):
    """A GPT-2-like LM (softmax attention with biases, learned embeddings, pre-LN): secure
    prefill and KV-cache steps equal the reference; plaintext greedy generation runs."""
    cfg = M.ModelConfig(**{**BASE, "norm_first": True, "arch": "decoder-only", "n_dec_layers": 1,
                           "tgt_vocab": 9, "attention": "softmax",
                           "embedding": "learned"}).validate()
    w, user = M.random_weights(cfg, 6), M.random_user(cfg, 6)
    assert len(M.greedy_generate(cfg, w, user, [[1, 2, 3]], 4)[0]) == 4
    x = M.embed_tokens(cfg, user, np.array([[1, 2, 3, 4, 5]]))

    def fn(p, s, xs):
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :3])
        return [h] + [LM.lm_step(p, cfg, s, st, xs[:, t]) for t in (3, 4)]

    res = run(fn, SM.share_model(cfg, w), share(x))
    full = M.ref_lm(cfg, w, x)
    for k in range(3):
        assert np.max(np.abs(value([r[k] for r in res]) - full[:, 2 + k])) < 2e-3
