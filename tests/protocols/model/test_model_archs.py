"""ModelConfig.arch (encoder-decoder, encoder-classifier, decoder-only): validation, keys,
tensor shapes, the model file, and the float64 references of the new architectures."""
import json

import numpy as np
import pytest

from protocols import model as M
from app import textdata as TD

COMMON = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
              attn_norm="mean", norm_first=False, max_len=12)


def clf_cfg(**kw):
    return M.ModelConfig(**{**COMMON, "arch": "encoder-classifier", "n_enc_layers": 2,
                            "src_vocab": 11, "n_classes": 5, **kw}).validate()


def lm_cfg(**kw):
    return M.ModelConfig(**{**COMMON, "arch": "decoder-only", "n_dec_layers": 2,
                            "tgt_vocab": 13, **kw}).validate()


def test_encoder_decoder_dict_is_unchanged():
    """The shipped translator's config.json has no arch key and reads and writes the same
    bytes; the default arch is encoder-decoder."""
    with np.load(TD.SHIPPED_MODEL, allow_pickle=False) as z:
        raw = z["config.json"].tobytes()
    cfg = M.ModelConfig.from_dict(json.loads(raw))
    assert cfg.arch == "encoder-decoder" and "arch" not in cfg.to_dict()
    assert json.dumps(cfg.to_dict(), sort_keys=True).encode() == raw
    explicit = M.ModelConfig.from_dict({**json.loads(raw), "arch": "encoder-decoder"})
    assert explicit == cfg and "arch" not in explicit.to_dict()


@pytest.mark.parametrize("make,keys", [
    (clf_cfg, {"arch", "n_enc_layers", "src_vocab", "n_classes"}),
    (lm_cfg, {"arch", "n_dec_layers", "tgt_vocab"})])
def test_arch_dict_roundtrip_and_keys(make, keys):
    cfg = make()
    d = cfg.to_dict()
    assert set(d) == set(M.config_keys(cfg.arch)) and keys <= set(d)
    assert M.ModelConfig.from_dict(d) == cfg
    assert M.ModelConfig.from_dict(json.loads(json.dumps(d))) == cfg


@pytest.mark.parametrize("d,msg", [
    ({**clf_cfg().to_dict(), "tgt_vocab": 4}, "tgt_vocab do not apply to arch "
     "'encoder-classifier'"),
    ({**lm_cfg().to_dict(), "n_enc_layers": 1}, "n_enc_layers do not apply"),
    ({**lm_cfg().to_dict(), "dropout": 0.1}, r"unknown config keys: \['dropout'\]"),
    ({**clf_cfg().to_dict(), "arch": "seq2seq"}, "arch='seq2seq' must be one of"),
    ({k: v for k, v in clf_cfg().to_dict().items() if k != "n_classes"},
     r"missing config keys: \['n_classes'\]"),
    ({**clf_cfg().to_dict(), "n_classes": 0}, "n_classes=0 must be >= 1"),
    ({**lm_cfg().to_dict(), "n_dec_layers": 0}, "n_dec_layers=0 must be >= 1"),
    ({**clf_cfg().to_dict(), "n_enc_layers": 0}, "n_enc_layers=0 must be >= 1"),
])
def test_arch_config_errors(d, msg):
    with pytest.raises(ValueError, match=msg):
        M.ModelConfig.from_dict(d)


def test_fields_of_another_arch_must_stay_zero():
    with pytest.raises(ValueError, match="n_classes=3 does not apply to arch "
                       "'encoder-decoder'"):
        M.ModelConfig(**COMMON, n_enc_layers=1, n_dec_layers=1, src_vocab=3, tgt_vocab=3,
                      n_classes=3).validate()


def test_shapes_per_arch():
    s = M.expected_shapes(clf_cfg(norm_first=True))
    assert s["head.w"] == (16, 5) and s["head.b"] == (5,) and "enc.final_ln.gamma" in s
    assert not any(k.startswith("dec.") for k in s)
    assert set(M.expected_user_shapes(clf_cfg())) == {"embed.src"}
    s = M.expected_shapes(lm_cfg(norm_first=True))
    assert {"dec.1.self.wq", "dec.1.ln2.gamma", "dec.1.ffn.w1", "dec.final_ln.beta"} <= set(s)
    assert not any(".cross" in k or ".ln3" in k or k.startswith("enc.") for k in s)
    assert set(M.expected_user_shapes(lm_cfg())) == {"embed.tgt", "out.w", "out.b"}
    assert M.attn_prefixes(lm_cfg()) == ["dec.0.self", "dec.1.self"]


@pytest.mark.parametrize("make", [clf_cfg, lm_cfg])
def test_save_load_per_arch(tmp_path, make):
    cfg = make(norm_first=True)
    w, u = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    M.save_model(tmp_path / "m.npz", cfg, w, u)
    cfg2, w2, u2 = M.load_model(tmp_path / "m.npz")
    assert cfg2 == cfg and set(w2.keys()) == set(w.keys()) and set(u2) == set(u)
    other = {**u, "embed.src": np.zeros((3, 16))} if cfg.arch == "decoder-only" else \
        {**u, "out.b": np.zeros(3)}
    with pytest.raises(ValueError, match="unexpected user tensor"):
        M.save_model(tmp_path / "bad.npz", cfg, w, other)


def test_ref_classify_by_hand():
    cfg = clf_cfg()
    w = M.random_weights(cfg, 2)
    x = np.random.default_rng(0).standard_normal((3, 7, 16))
    h = M.ref_encoder(cfg, w, x)
    np.testing.assert_allclose(M.ref_classify(cfg, w, x),
                               h.mean(1) @ w["head.w"] + w["head.b"], atol=1e-12)
    with pytest.raises(ValueError, match="needs an encoder-classifier model"):
        M.ref_classify(lm_cfg(), M.random_weights(lm_cfg()), x)


@pytest.mark.parametrize("norm_first", [False, True])
def test_ref_lm_steps_equal_the_full_causal_stack(norm_first):
    cfg = lm_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 3)
    x = np.random.default_rng(1).standard_normal((2, 9, 16))
    full = M.ref_lm(cfg, w, x)
    np.testing.assert_allclose(full, M.ref_lm(cfg, w, x, form="loop"), atol=1e-10)
    st = M.RefLMState(cfg, 2)
    for t in range(9):
        np.testing.assert_allclose(M.ref_lm_step(cfg, w, st, x[:, t]), full[:, t], atol=1e-10)
    # causal: a later token never changes an earlier row
    x2 = x.copy()
    x2[:, 5:] += 1.0
    np.testing.assert_allclose(M.ref_lm(cfg, w, x2)[:, :5], full[:, :5], atol=1e-12)


def test_greedy_generate_recomputes_consistently():
    cfg = lm_cfg()
    w, u = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    got = M.greedy_generate(cfg, w, u, prompt, 5)
    for b in range(2):         # each token is the argmax of the full stack on the prefix
        ids = list(prompt[b])
        for tok in got[b]:
            h = M.ref_lm(cfg, w, M.embed(cfg, u["embed.tgt"], np.array([ids])))[0, -1]
            assert tok == int(M.output_logits(u, h).argmax())
            ids.append(tok)
    with pytest.raises(ValueError, match="exceeds max_len"):
        M.greedy_generate(cfg, w, u, prompt, 11)
