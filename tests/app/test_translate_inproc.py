"""Secure translation on three in-process parties: agreement with plaintext, per-layer split."""
import numpy as np
import pytest

from mpc3 import ring
from mpc3.sharing import reveal
from mpc3.sim import make_parties, run_parties
from app import translate as T
from protocols.stacks import decoder as D
from protocols.layers import ln_proj as LP
from protocols import jobs as J
from protocols import model as M
from app import textdata as TD
from protocols.layers.secure_model import share_input, share_model

shipped = pytest.mark.skipif(not TD.SHIPPED_MODEL.exists(), reason="no shipped model")


def heldout(n, digits, seed=11):
    nums = [int(x) for x in TD.sample_numbers(400, seed=seed, split="test")
            if len(str(int(x))) == digits]
    return [str(x) for x in nums[:n]]


@shipped
def test_shipped_secure_translation_agrees_with_plaintext():
    cfg, w, user, vocab = TD.load_shipped()
    texts = heldout(5, 4)
    assert len(texts) == 5 and all(TD.split_of(int(t)) == "test" for t in texts)
    be = T.InprocBackend(cfg, w)
    res, cost, pairs = T.translate_texts(be, cfg, user, texts, vocab, plaintext_weights=w)
    assert [r.secure for r in res] == [r.plaintext for r in res]
    same, total = T.token_agreement(pairs)
    assert same == total > 0
    assert cost.jobs == 1 + max(len(p[1]) for p in pairs)    # one open, one job per step
    assert cost.bytes_total == sum(cost.bytes_per_party) > 0
    assert set(cost.layers.rows) == {"enc.0", "enc.1", "dec.cross_kv", "dec.0", "dec.1"}


def _small_cfg(norm_first=False, attention=M.PERFORMER):
    return M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32,
                         n_enc_layers=1, n_dec_layers=2, attn_c=0.125, attn_norm="mean",
                         ln_eps=1e-5, norm_first=norm_first, src_vocab=7, tgt_vocab=9,
                         max_len=6, attention=attention).validate()


@pytest.mark.parametrize("norm_first", [False, True])
def test_on_layer_hook_marks_every_layer_and_changes_nothing(norm_first):
    """decoder_step with an on_layer hook makes exactly the same kernel calls (same seed ->
    bit-identical shares) and the per-layer costs it marks sum to the step's total."""
    cfg = _small_cfg(norm_first)
    w = M.random_weights(cfg, 3)
    rng = np.random.default_rng(0)
    shares = share_model(cfg, w, rng=rng)
    enc = share_input(rng.uniform(-2, 2, (2, 3, cfg.d_model)), rng=rng)
    ys = [share_input(rng.uniform(-2, 2, (2, cfg.d_model)), rng=rng) for _ in range(3)]

    def run(hooked):
        def fn(p, sh, e, yy):
            st = D.DecodeState.start(p, cfg, sh, e)
            rec, totals, outs = J.CostRecorder(p), [], []
            for y in yy:
                s0 = p.stats.snapshot()
                rec.mark("before")
                outs.append(D.decoder_step(p, cfg, sh, st, y,
                                           on_layer=rec.mark if hooked else None))
                totals.append((p.stats.snapshot() - s0).bytes_sent)
            return outs, rec.entries, totals
        return run_parties(fn, [(shares[i], enc[i], [y[i] for y in ys]) for i in range(3)],
                           parties=make_parties(seed=b"layer-split"))

    plain, hooked = run(False), run(True)
    for t in range(3):
        assert np.array_equal(reveal([r[0][t] for r in plain]),
                              reveal([r[0][t] for r in hooked]))
    entries, totals = hooked[0][1], hooked[0][2]
    names = [f"dec.{i}" for i in range(cfg.n_dec_layers)] + (["dec.final_ln"] if norm_first
                                                              else [])
    per_step = len(names) + 1
    for t in range(3):
        block = entries[t * per_step:(t + 1) * per_step]
        assert [e["layer"] for e in block] == ["before"] + names
        assert sum(e["bytes"] for e in block[1:]) == totals[t]


def test_over_long_input_is_refused_before_any_job():
    cfg = _small_cfg()
    be = T.InprocBackend(cfg, M.random_weights(cfg))
    with pytest.raises(ValueError, match="too long"):
        T.Session(be).open(np.zeros((1, cfg.max_len + 1, cfg.d_model)))
    with pytest.raises(ValueError, match="too long"):
        T.translate_texts(be, cfg, M.random_user(cfg), ["1234567890"])


@pytest.mark.parametrize("fuse,attention", [(None, M.PERFORMER), ("all", M.PERFORMER),
                                             ("none", M.PERFORMER), ("ffn, cross", M.PERFORMER),
                                             ("all", "softmax"), ("all", "sigma-relu")])
def test_session_fusions_change_rounds_not_the_function(fuse, attention):
    """Every in-process decode step equals the plaintext step, and its measured rounds and
    bytes are those declared - for each choice of decode_open's ``fuse`` parameter (None:
    the parties' default; all: fewest rounds)."""
    from mpc3.party import RingConfig
    cfg = _small_cfg(attention=attention)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    be = T.InprocBackend(cfg, w, fuse=fuse)
    chosen = LP.fusion_choice(fuse, D.FUSIONS, D.DEFAULT_FUSE, "test")
    src = np.array([[3, 4, 5], [6, 1, 2]])
    x = M.embed(cfg, user["embed.src"], src)
    session = T.Session(be)
    session.open(x)
    ref = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x))
    for t, tok in enumerate([1, 4, 7]):
        y = M.embed(cfg, user["embed.tgt"], np.full((2, 1), tok), offset=t)[:, 0]
        got = ring.decode(session.step(y))
        traffic = session.last
        np.testing.assert_allclose(got, M.ref_decoder_step(cfg, w, ref, y), atol=2e-2)
        declared = D.cost_decoder_step(RingConfig(), cfg, 2, t, fuse=chosen, n_enc=3, wide=True)
        assert traffic.rounds == declared.rounds
        assert tuple(traffic.bytes_per_party) == declared.bytes_per_party
    session.close()
    assert not be.open_sessions()
    if attention == M.PERFORMER:
        # two post-LN layers: 48 rounds each unfused, 2 fewer per fused kind and layer
        # ("self" fuses the next layer's projection into this layer's last LayerNorm:
        # once), and one fewer for the wide output row
        # ("wo" folds nothing here: no calibration, protocols.stacks.schedule.folded_wo)
        assert declared.rounds == {(): 95, ("ffn",): 91, ("cross", "ffn"): 87,
                                   ("cross", "ffn", "wo"): 87, D.FUSIONS: 85}[chosen]


def test_unknown_fusions_are_refused_before_any_round():
    cfg = _small_cfg()
    x = np.zeros((1, 3, cfg.d_model))
    for bad in ("bogus", "ffn,self,attn", 3, ""):
        be = T.InprocBackend(cfg, M.random_weights(cfg), fuse=bad)
        with pytest.raises(ValueError, match="fuse"):
            T.Session(be).open(x)
        assert not be.open_sessions()
    assert LP.fusion_choice("all", D.FUSIONS, D.DEFAULT_FUSE, "t") == D.FUSIONS
    assert LP.fusion_choice("none", D.FUSIONS, D.DEFAULT_FUSE, "t") == ()
    assert LP.fusion_choice(" ffn , self", D.FUSIONS, D.DEFAULT_FUSE, "t") == ("self", "ffn")
    assert LP.fusion_choice(None, D.FUSIONS, D.DEFAULT_FUSE, "t") == D.DEFAULT_FUSE
