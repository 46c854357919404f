"""protocols.model.torch_ref.TorchModel == the float64 reference for every config: the
whole grid arch x attention x ffn_act (swiglu too) x norm (rmsnorm too) x norm_first x
attn_bias x pool (x normalize, for the headless encoder) x embedding (with and without token
types; rotary for the decoder-only softmax-style LMs) x ffn_bn x AERO's ffn_scale /
ffn_pruned where they apply, with grouped-query attention (n_kv_heads < n_heads) on half the
softmax-style LMs, each with random small shapes and weights; logits from token ids within
1e-9 (relative to max(1, |logit|): without normalization a random Performer stack can reach
large values). Plus a LLaMA-shaped decoder (rotary, 4 query / 2 kv heads, rmsnorm, swiglu,
pre-norm, softmax) on longer sequences, the decode paths (the reference's incremental LM
and translator steps give the same rows), export, and a training step with BatchNorm."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from protocols import model as M  # noqa: E402
from protocols.model.config import EMBEDDINGS, FFN_ACTS  # noqa: E402
from protocols.model.torch_ref import TorchModel  # noqa: E402

TOL = 1e-9


def grid():
    archs = {"encoder-decoder": dict(attention=list(M.ATTENTIONS), pool=["mean"],
                                     embedding=["sinusoidal"]),
             "encoder-classifier": dict(attention=list(M.ATTENTIONS), pool=["mean", "cls-tanh"],
                                        embedding=["sinusoidal", "learned", "learned-ln"]),
             "decoder-only": dict(attention=list(M.ATTENTIONS), pool=["mean"],
                                  embedding=["sinusoidal", "learned", "learned-ln",
                                             M.ROTARY]),
             # the headless encoder: its encoder is the classifier's (run on the whole grid
             # above), so only pooling x normalize ("mean+n", ...) x embedding x norm_first
             "encoder": dict(attention=list(M.ATTENTIONS),
                             pool=["mean", "cls", "max", "mean+n", "cls+n", "max+n"],
                             embedding=["sinusoidal", "learned-ln"], act=("gelu",),
                             norm=("layernorm",), bias=(True,), bn=(False,))}
    for arch, opts in archs.items():
        for att, pool, emb, act, norm, first, bias, bn in itertools.product(
                opts["attention"], opts["pool"], opts["embedding"],
                opts.get("act", ("relu", "gelu", "none", M.GATED)), opts.get("norm", M.NORMS),
                (False, True), opts.get("bias", (False, True)), opts.get("bn", (False, True))):
            if (act == M.GATED and bn) or (emb == M.ROTARY and att == M.PERFORMER):
                continue                    # configs validate() refuses
            aero = arch == "decoder-only" and norm == "none" and act == "none"
            for scale, pruned in ((False, 0), (True, 0), (False, 1), (True, 1)) if aero else \
                    ((False, 0),):
                yield arch, att, pool, emb, act, norm, first, bias, scale, pruned, bn


def make(arch, att, pool, emb, act, norm, first, bias, rng, scale=False, pruned=0, bn=False):
    h = int(rng.integers(1, 3))
    dh = int(rng.integers(2, 5)) if emb != M.ROTARY else 2 * int(rng.integers(1, 3))
    kw = dict(d_model=h * dh, n_heads=h, d_head=dh, n_features=int(rng.integers(2, 6)),
              d_ff=int(rng.integers(3, 9)), attn_c=float(rng.uniform(0.1, 0.6)),
              attn_norm=str(rng.choice(["const", "mean"])), norm_first=first, max_len=7,
              attention=att, ffn_act=act, norm=norm, attn_bias=bias, pool=pool, embedding=emb,
              ln_eps=float(rng.choice([M.DEFAULT_LN_EPS, 1e-5])), ffn_scale=scale,
              ffn_bn=bn)
    pool, kw["normalize"] = pool.split("+")[0], pool.endswith("+n")
    kw["pool"] = pool
    layers = int(rng.integers(1, 3))
    if arch == "encoder-decoder":
        kw.update(n_enc_layers=layers, n_dec_layers=int(rng.integers(0, 3)), src_vocab=6,
                  tgt_vocab=5)
    elif arch == "encoder-classifier":
        kw.update(arch=arch, n_enc_layers=layers, src_vocab=6, n_classes=3)
    elif arch == "encoder":
        kw.update(arch=arch, n_enc_layers=layers, src_vocab=6)
    else:
        kw.update(arch=arch, n_dec_layers=layers, tgt_vocab=6, ffn_pruned=pruned)
    if emb not in ("sinusoidal", M.ROTARY) and rng.random() < 0.5:
        kw["type_vocab"] = 2
    if att != M.PERFORMER and arch == M.DECODER_ONLY and rng.random() < 0.5:
        # grouped-query (decoder-only LMs, the one architecture with its secure protocol):
        # 2 heads share 1 K, V
        kw.update(n_heads=2, d_model=2 * dh, n_kv_heads=1)
    if emb == M.ROTARY:
        kw["rope_theta"] = float(rng.choice([10000.0, 500.0]))
    return M.ModelConfig(**kw).validate()


def reference_logits(cfg, w, user, ids, tgt, types):
    if cfg.arch == "encoder-classifier":
        return M.ref_classify(cfg, w, M.embed_tokens(cfg, user, ids, types=types))
    if cfg.arch == "encoder":
        return M.ref_embed(cfg, w, M.embed_tokens(cfg, user, ids, types=types))
    if cfg.arch == "decoder-only":
        return M.output_logits(user, M.ref_lm(cfg, w, M.embed_tokens(cfg, user, ids,
                                                                     types=types)))
    enc = M.ref_encoder(cfg, w, M.embed(cfg, user["embed.src"], ids))
    return M.output_logits(user, M.ref_decoder(cfg, w, M.embed(cfg, user["embed.tgt"], tgt),
                                               enc))


def close(got, ref, tol=TOL):
    return np.max(np.abs(got - ref)) <= tol * max(1.0, float(np.max(np.abs(ref))))


def test_forward_equals_reference_on_the_whole_config_grid():
    rng = np.random.default_rng(0)
    n = 0
    seen, grouped = set(), set()
    for case in grid():
        cfg = make(*case[:8], rng, *case[8:])
        w, user = M.random_weights(cfg, n), M.random_user(cfg, n)
        model = TorchModel(cfg, w, user).eval()
        B, S = 2, int(rng.integers(2, 6))
        ids = rng.integers(0, 5, (B, S))
        tgt = rng.integers(0, 5, (B, int(rng.integers(1, 6))))
        types = rng.integers(0, 2, (B, S)) if cfg.type_vocab else None
        ref = reference_logits(cfg, w, user, ids, tgt, types)
        with torch.no_grad():
            got = model(torch.tensor(ids), torch.tensor(tgt),
                        None if types is None else torch.tensor(types)).numpy()
        assert got.shape == ref.shape and close(got, ref), (case, cfg.to_dict())
        seen.add(case)
        grouped.add((cfg.arch, cfg.embedding, cfg.kv_heads < cfg.n_heads))
        n += 1
    # every value of every key was run
    assert {c[0] for c in seen} == set(M.ARCHS) and {c[1] for c in seen} == set(M.ATTENTIONS)
    assert {c[3] for c in seen} == set(EMBEDDINGS) and {c[4] for c in seen} == set(FFN_ACTS)
    assert {a for a, _, g in grouped if g} == {M.DECODER_ONLY}       # grouped-query: LMs
    assert {("decoder-only", M.ROTARY, g) for g in (False, True)} <= grouped
    assert {c[5] for c in seen} == set(M.NORMS) and {c[8:10] for c in seen} == {
        (False, 0), (True, 0), (False, 1), (True, 1)} and {c[10] for c in seen} == {False, True}
    assert n >= 3000


@pytest.mark.parametrize("att,norm", [("relu-performer", "batchnorm"), ("softmax", "none"),
                                      ("sigma-relu", "layernorm")])
def test_lm_rows_equal_the_reference_decode_steps(att, norm):
    cfg = make("decoder-only", att, "mean", "learned", "gelu", norm, True, True,
               np.random.default_rng(3))
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    ids = np.random.default_rng(4).integers(0, 5, (2, 6))
    with torch.no_grad():
        got = TorchModel(cfg, w, user).eval()(torch.tensor(ids)).numpy()
    st = M.RefLMState(cfg, 2)
    for t in range(6):
        row = M.ref_lm_step(cfg, w, st, M.embed_tokens(cfg, user, ids[:, t:t + 1], t)[:, 0])
        assert close(got[:, t], M.output_logits(user, row))


def llama_shaped(theta=10000.0, kv=2, layers=2):
    """A LLaMA-shaped decoder: rotary, 4 query heads sharing ``kv`` K/V heads, RMSNorm,
    SwiGLU without biases, pre-norm with a final norm, softmax attention."""
    return M.ModelConfig(arch="decoder-only", d_model=32, n_heads=4, d_head=8, n_features=1,
                         d_ff=48, attn_c=1.0, attn_norm="const", norm_first=True, max_len=24,
                         n_dec_layers=layers, tgt_vocab=40, attention="softmax",
                         norm="rmsnorm", ffn_act=M.GATED, embedding=M.ROTARY,
                         n_kv_heads=0 if kv == 4 else kv, rope_theta=theta,
                         ln_eps=1e-5).validate()


@pytest.mark.parametrize("theta,kv", [(10000.0, 2), (500.0, 1), (10000.0, 4)])
def test_llama_shaped_forward_and_decode_steps_equal_the_reference(theta, kv):
    """Rotary at every position of a 20-token sequence (the angles reach 19 rad for the
    fastest pair), grouped-query heads, RMSNorm and SwiGLU: the torch forward == ref_lm, and
    its row t == the reference's KV-cache step t (q rotated at t, cached keys at theirs)."""
    cfg = llama_shaped(theta, kv)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    assert w["dec.0.self.wk"].shape == (32, 8 * cfg.kv_heads) and "embed.pos" not in user
    assert {"dec.0.ffn.w1", "dec.0.ffn.w3", "dec.0.ffn.w2", "dec.final_ln.gamma"} <= set(w)
    ids = np.random.default_rng(9).integers(0, 40, (2, 20))
    ref = M.output_logits(user, M.ref_lm(cfg, w, M.embed_tokens(cfg, user, ids)))
    model = TorchModel(cfg, w, user).eval()
    with torch.no_grad():
        got = model(torch.tensor(ids)).numpy()
    assert np.abs(ref).max() > 0.1 and close(got, ref)
    st = M.RefLMState(cfg, 2)
    for t in range(ids.shape[1]):
        row = M.ref_lm_step(cfg, w, st, M.embed_tokens(cfg, user, ids[:, t:t + 1], t)[:, 0])
        assert close(got[:, t], M.output_logits(user, row)), t
    # the positions matter: the same tokens shifted by one give other logits (not a bag)
    with torch.no_grad():
        shifted = model(torch.tensor(np.concatenate([ids[:, :1], ids], 1))).numpy()
    assert np.abs(shifted[:, 1:] - got).max() > 1e-3
    w2, u2 = model.export()
    assert set(w2.tensors) == set(w.tensors) and set(u2) == set(user)


@pytest.mark.parametrize("att,first", [("softmax", False), ("power-softmax", True),
                                       ("sigma-relu", False), ("softmax", True)])
def test_translator_rows_equal_the_reference_decode_steps(att, first):
    """The teacher-forced torch decoder == the reference's incremental decode (KV cache of
    the target prefix, cross-attention K, V of the encoder output from the state's start)."""
    from dataclasses import replace
    cfg = make("encoder-decoder", att, "mean", "sinusoidal", "relu", "layernorm", first, True,
               np.random.default_rng(7))
    cfg = replace(cfg, n_dec_layers=2).validate()
    w, user = M.random_weights(cfg, 2), M.random_user(cfg, 2)
    rng = np.random.default_rng(8)
    src, tgt = rng.integers(0, 5, (2, 4)), rng.integers(0, 5, (2, 6))
    with torch.no_grad():
        got = TorchModel(cfg, w, user).eval()(torch.tensor(src), torch.tensor(tgt)).numpy()
    st = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, M.embed(cfg, user["embed.src"], src)))
    for t in range(6):
        y = M.embed(cfg, user["embed.tgt"], tgt[:, t:t + 1], t)[:, 0]
        row = M.ref_decoder_step(cfg, w, st, y)
        assert close(got[:, t], M.output_logits(user, row)), t


def test_export_round_trips_and_training_updates_batchnorm(tmp_path):
    cfg = make("decoder-only", "softmax", "mean", "sinusoidal", "gelu", "batchnorm", True,
               False, np.random.default_rng(5), bn=True)
    model = TorchModel(cfg, seed=2)
    w, user = model.export()
    M.save_model(tmp_path / "m.npz", cfg, w, user)
    c2, w2, u2 = M.load_model(tmp_path / "m.npz")
    again = TorchModel(c2, w2, u2).eval()
    ids = torch.tensor(np.random.default_rng(6).integers(0, 5, (3, 5)))
    with torch.no_grad():
        assert torch.equal(model.eval()(ids), again(ids))
    model.train()
    before = model.p("dec.0.ln1.mean").clone()
    loss = model(ids).logsumexp(-1).mean()
    loss.backward()
    assert not torch.equal(before, model.p("dec.0.ln1.mean"))      # running stats moved
    assert not torch.equal(again.p("dec.0.ffn.bn_var"), model.p("dec.0.ffn.bn_var"))
    assert model.p("dec.0.ffn.w1").grad is not None
    assert "dec__0__ln1__mean" in dict(model.named_buffers())
