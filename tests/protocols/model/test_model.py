import dataclasses
import functools

import conftest

import numpy as np
import pytest

from protocols import model as M

B, S, T = 2, 7, 6


make_cfg = functools.partial(conftest.make_cfg, src_vocab=13, tgt_vocab=11)


@pytest.fixture(params=[("mean", False), ("const", False), ("mean", True)])
def setup(request):
    norm, nf = request.param
    cfg = make_cfg(attn_norm=norm, norm_first=nf, attn_c=0.5 if norm == "mean" else 0.05)
    w = M.random_weights(cfg, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, S, cfg.d_model))
    y = rng.standard_normal((B, T, cfg.d_model))
    return cfg, w, x, y


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("kw,msg", [
    (dict(n_heads=5, d_head=4), "d_model=24 is not divisible by n_heads=5"),
    (dict(d_head=6), "d_head=6 must equal d_model // n_heads"),
    (dict(attn_norm="softmax"), "attn_norm='softmax'"),
    (dict(d_ff=0), "d_ff=0 must be >= 1"),
    (dict(n_features=2.5), "n_features must be an int"),
    (dict(ln_eps=0.0), "ln_eps"),
    (dict(attn_c=float("nan")), "attn_c"),
    (dict(norm_first="yes"), "norm_first"),
])
def test_config_validation(kw, msg):
    base = dataclasses.asdict(make_cfg())
    base.update(kw)
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        M.ModelConfig(**base).validate()


def test_config_dict_roundtrip():
    cfg = make_cfg(norm_first=True)
    assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg
    d = cfg.to_dict()
    d.pop("max_len")
    with pytest.raises(ValueError, match="missing config keys: \\['max_len'\\]"):
        M.ModelConfig.from_dict(d)
    with pytest.raises(ValueError, match="unknown config keys"):
        M.ModelConfig.from_dict({**cfg.to_dict(), "dropout": 0.1})


def test_default_ln_eps_inside_sqrt_inv_range():
    """LayerNorm computes 1/sqrt(var + eps) with sqrt_inv_a: the default eps alone must be a
    value that kernel computes correctly (a constant row has var = 0)."""
    from mpc3.kernels import fxp
    lo, hi = fxp.SQRT_INV_RANGE
    assert lo <= M.DEFAULT_LN_EPS <= hi
    assert make_cfg().ln_eps == M.DEFAULT_LN_EPS
    assert make_cfg(ln_eps=1e-5).ln_eps == 1e-5       # trained models keep their own eps


# ------------------------------------------------------------------ weights


def test_weight_validation():
    cfg = make_cfg()
    w = M.random_weights(cfg, 0)
    w.validate(cfg)
    assert w["enc.0.attn.omega"].shape == (3, 8, 10)
    t = dict(w.tensors); del t["enc.0.ffn.w1"]
    with pytest.raises(ValueError, match="missing tensor 'enc.0.ffn.w1'"):
        M.Weights(t).validate(cfg)
    t = dict(w.tensors); t["enc.0.attn.wq"] = np.zeros((24, 23))
    with pytest.raises(ValueError, match=r"tensor 'enc.0.attn.wq' has shape \(24, 23\), expected \(24, 24\)"):
        M.Weights(t).validate(cfg)
    t = dict(w.tensors); t["enc.9.bogus"] = np.zeros(3)
    with pytest.raises(ValueError, match="unexpected weight tensor.*enc.9.bogus"):
        M.Weights(t).validate(cfg)
    # pre-LN needs final LNs
    cfg2 = make_cfg(norm_first=True)
    with pytest.raises(ValueError, match="missing tensor 'enc.final_ln.gamma'"):
        w.validate(cfg2)


def test_omega_orthogonal_blocks():
    rng = np.random.default_rng(0)
    om = M.orthogonal_features(rng, 8, 20)  # blocks 8, 8, 4
    assert om.shape == (8, 20)
    for a, b in ((0, 8), (8, 16), (16, 20)):
        blk = om[:, a:b].T
        u = blk / np.linalg.norm(blk, axis=1, keepdims=True)
        np.testing.assert_allclose(u @ u.T, np.eye(b - a), atol=1e-12)


def test_save_load_roundtrip(tmp_path):
    cfg = make_cfg(norm_first=True)
    w = M.random_weights(cfg, 3)
    u = M.random_user(cfg, 3)
    p = tmp_path / "m.npz"
    M.save_model(p, cfg, w, u)
    cfg2, w2, u2 = M.load_model(p)
    assert cfg2 == cfg
    assert set(w2.keys()) == set(w.keys())
    for k in w.keys():
        np.testing.assert_array_equal(w2[k], w[k])
    for k in u:
        np.testing.assert_array_equal(u2[k], u[k])
    # without user tensors
    M.save_model(p, cfg, w)
    assert M.load_model(p)[2] == {}
    # corrupt files: missing / misshaped tensor
    with np.load(p, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    bad = dict(data); del bad["dec.1.cross.omega"]
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match="missing tensor 'dec.1.cross.omega'"):
        M.load_model(tmp_path / "bad.npz")
    bad = dict(data); bad["dec.0.ffn.b1"] = np.zeros(39)
    np.savez(tmp_path / "bad2.npz", **bad)
    with pytest.raises(ValueError, match=r"tensor 'dec.0.ffn.b1' has shape \(39,\), expected \(40,\)"):
        M.load_model(tmp_path / "bad2.npz")


# ------------------------------------------------------------------ semantics


def test_masked_attention_three_ways(setup):
    cfg, w, x, _ = setup
    p = w.sub("dec.0.self")
    outs = [M.ref_mha(cfg, p, x, x, causal=True, form=f) for f in ("kv", "qk", "loop")]
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(outs[0], outs[2], rtol=0, atol=1e-12)
    assert outs[0].shape == (B, S, cfg.d_model)
    # explicit Eq. 14 for head 0 of batch 0 via the definitions
    h0 = slice(0, cfg.d_head)
    qf = np.maximum(x[0] @ p["wq"][:, h0] @ p["omega"][0], 0)
    kf = np.maximum(x[0] @ p["wk"][:, h0] @ p["omega"][0], 0)
    v = x[0] @ p["wv"][:, h0]
    scale = M.attn_norm(cfg, np.arange(1, S + 1))[:, None]
    head0 = scale * (np.tril(qf @ kf.T) @ v)
    # recover head outputs: compare against full concat path
    hq = M.ref_features(cfg, p, x, "q")[0, 0]
    np.testing.assert_allclose(hq, qf, atol=1e-12)
    G = np.cumsum(np.einsum("sr,sd->srd", kf, v), axis=0)
    np.testing.assert_allclose(scale * np.einsum("sr,srd->sd", qf, G), head0, atol=1e-12)


def test_unmasked_attention_forms(setup):
    cfg, w, x, y = setup
    p = w.sub("dec.1.cross")
    a = M.ref_mha(cfg, p, y, x, form="kv")
    b = M.ref_mha(cfg, p, y, x, form="qk")
    c = M.ref_mha(cfg, p, y, x, form="loop")
    assert a.shape == (B, T, cfg.d_model)
    np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(a, c, atol=1e-12)


def test_fold_omega_identical(setup):
    cfg, w, x, y = setup
    folded = M.fold_omega(w)
    assert folded["enc.0.attn.wq_omega"].shape == (cfg.d_model, cfg.n_heads * cfg.n_features)
    for prefix, causal in (("enc.0.attn", False), ("dec.0.self", True)):
        a = M.ref_mha(cfg, w.sub(prefix), x, x, causal=causal)
        b = M.ref_mha(cfg, M.attn_params(w, prefix, folded), x, x, causal=causal)
        np.testing.assert_allclose(a, b, atol=1e-12)
    e1 = M.ref_encoder(cfg, w, x)
    e2 = M.ref_encoder(cfg, w, x, folded=folded)
    np.testing.assert_allclose(e1, e2, atol=1e-12)
    np.testing.assert_allclose(M.ref_decoder(cfg, w, y, e1),
                               M.ref_decoder(cfg, w, y, e1, folded=folded), atol=1e-12)


def test_step_decoder_matches_full(setup):
    cfg, w, x, y = setup
    enc = M.ref_encoder(cfg, w, x)
    assert enc.shape == (B, S, cfg.d_model)
    full = M.ref_decoder(cfg, w, y, enc)
    full_qk = M.ref_decoder(cfg, w, y, enc, form="qk")
    np.testing.assert_allclose(full, full_qk, atol=1e-12)
    st = M.RefDecodeState(cfg, w, enc)
    for t in range(T):
        out_t = M.ref_decoder_step(cfg, w, st, y[:, t], enc)
        prefix = M.ref_decoder(cfg, w, y[:, : t + 1], enc)
        np.testing.assert_allclose(out_t, prefix[:, t], rtol=0, atol=1e-12)
        np.testing.assert_allclose(out_t, full[:, t], rtol=0, atol=1e-12)
    assert st.t == T


def test_batch_dim(setup):
    cfg, w, x, y = setup
    enc = M.ref_encoder(cfg, w, x)
    dec = M.ref_decoder(cfg, w, y, enc)
    for b in range(B):
        eb = M.ref_encoder(cfg, w, x[b:b + 1])
        np.testing.assert_allclose(eb[0], enc[b], atol=1e-12)
        np.testing.assert_allclose(M.ref_decoder(cfg, w, y[b:b + 1], eb)[0], dec[b], atol=1e-12)
    assert np.all(np.isfinite(dec)) and np.abs(dec).max() < 100


def test_postln_layer_by_hand():
    cfg = make_cfg(n_enc_layers=1)
    w = M.random_weights(cfg, 5)
    x = np.random.default_rng(0).standard_normal((1, S, cfg.d_model))
    p = w.sub("enc.0.attn")
    # single-head definition, written out
    heads = []
    for hh in range(cfg.n_heads):
        sl = slice(hh * cfg.d_head, (hh + 1) * cfg.d_head)
        qf = np.maximum(x[0] @ p["wq"][:, sl] @ p["omega"][hh], 0)
        kf = np.maximum(x[0] @ p["wk"][:, sl] @ p["omega"][hh], 0)
        heads.append(cfg.attn_c / S * qf @ (kf.T @ (x[0] @ p["wv"][:, sl])))
    att = np.concatenate(heads, axis=1) @ p["wo"]

    def ln(z, g, b):
        return (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + cfg.ln_eps) * g + b

    h1 = ln(x[0] + att, w["enc.0.ln1.gamma"], w["enc.0.ln1.beta"])
    f = np.maximum(h1 @ w["enc.0.ffn.w1"] + w["enc.0.ffn.b1"], 0) @ w["enc.0.ffn.w2"] + w["enc.0.ffn.b2"]
    h2 = ln(h1 + f, w["enc.0.ln2.gamma"], w["enc.0.ln2.beta"])
    np.testing.assert_allclose(M.ref_encoder(cfg, w, x)[0], h2, atol=1e-12)


def test_positional_encoding_and_greedy():
    pe = M.positional_encoding(5, 6)
    assert pe.shape == (5, 6)
    np.testing.assert_allclose(pe[3, 0], np.sin(3.0))
    np.testing.assert_allclose(pe[3, 3], np.cos(3.0 / 10000 ** (2 / 6)))
    cfg = make_cfg()
    w, u = M.random_weights(cfg, 0), M.random_user(cfg, 0)
    out = M.greedy_decode(cfg, w, u, np.array([[1, 2, 3], [4, 5, 6]]), bos=1, eos=2, max_steps=5)
    assert len(out) == 2 and all(len(o) <= 5 for o in out)
