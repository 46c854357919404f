"""BERT-style encoders with secret embedding tables (protocols.stacks.secret_encoder): the
user's tokens and token types go in as one-hot rows, the lookup, positions and embedding
LayerNorm run on shares; the secure logits / class / sentence embedding equal transformers'
own forward pass of a tiny random BertForSequenceClassification / BertModel built here
(tests/helpers/hf_models.py), declared == measured traffic, the calibration covers the
embedding LayerNorm (layer ``embed.ln``), and the production job kinds refuse bad input
with one line."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import value  # noqa: E402
from helpers.hf_models import make_bert, make_bertmodel  # noqa: E402
from mpc3 import ring  # noqa: E402
from mpc3.party import RingConfig  # noqa: E402
from mpc3.sharing import deal  # noqa: E402
from net.client.outputs import reconstruct  # noqa: E402
from net.party.inproc import InprocParties  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.calibration import calibrate as C  # noqa: E402
from protocols.layers import secure_model as SM  # noqa: E402
from protocols.model import hf_import as HF  # noqa: E402
from protocols.stacks import secret_encoder as SE  # noqa: E402


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(transformers model, cfg, weights, user tables) of a tiny BertForSequenceClassification."""
    path = tmp_path_factory.mktemp("bert-secret")
    model = make_bert(path)
    cfg, w, user, _ = HF.load_hf(path)
    return model, cfg, w, user


@pytest.fixture(scope="module")
def bertmodel(tmp_path_factory):
    """The same for a tiny BertModel read as a headless encoder (mean pooling, normalized)."""
    path = make_bertmodel(tmp_path_factory.mktemp("bertmodel-secret") / "m")
    model = transformers.BertModel.from_pretrained(path).eval()
    cfg, w, user, _ = HF.load_hf(path, pool="mean", normalize=True)
    return model, cfg, w, user


def tokens(rng, cfg, B, S):
    return rng.integers(0, cfg.src_vocab, (B, S)), rng.integers(0, cfg.type_vocab, (B, S))


def theirs(model, ids, types):
    """transformers' output for ids, types: a classifier's logits, else the mean-pooled,
    L2-normalized last hidden state (the sentence embedding of the imported config)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types))
    if isinstance(model, transformers.BertForSequenceClassification):
        return out.logits.numpy()
    return torch.nn.functional.normalize(out.last_hidden_state.mean(1), dim=-1).numpy()


@pytest.mark.parametrize("which,B,S", [("bert", 3, 9), ("bertmodel", 2, 11)])
def test_secret_encoder_equals_transformers_and_declared_cost(run, request, which, B, S):
    model, cfg, w, user = request.getfixturevalue(which)
    clf = cfg.arch == M.ENCODER_CLASSIFIER
    ids, types = tokens(np.random.default_rng(B), cfg, B, S)
    stack, cost = (SE.classify_secret, SE.cost_classify_secret) if clf else \
        (SE.embed_secret, SE.cost_embed_secret)
    res = run(lambda p, s, oh: stack(p, cfg, s, oh), SM.share_model(cfg, w, secret_user=user),
              deal(SE.encoder_onehot(ids, cfg, types)))
    want = theirs(model, ids, types)
    assert np.abs(want).max() > 0.1
    assert np.max(np.abs(value(res) - want)) < 1e-2
    run.assert_cost(cost(RingConfig(), cfg, B, S))


@pytest.mark.parametrize("embedding,arch", [("sinusoidal", "encoder-classifier"),
                                            ("learned", "encoder")])
def test_secret_lookup_without_layernorm_equals_the_reference(run, embedding, arch):
    """Privformer's sinusoidal positions (the table times sqrt(d), the public PE added on
    shares; no token types) and learned positions without a LayerNorm, on the float64
    reference of the user-held embedding."""
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=True, max_len=12, arch=arch,
                        n_enc_layers=1, src_vocab=29, embedding=embedding,
                        n_classes=3 if arch == M.ENCODER_CLASSIFIER else 0,
                        type_vocab=2 if embedding == "learned" else 0,
                        pool="mean").validate()
    w, user = M.random_weights(cfg, 3), M.random_user(cfg, 3)
    ids = np.random.default_rng(9).integers(0, 29, (2, 6))
    types = ids % 2 if cfg.type_vocab else None
    x = M.embed_tokens(cfg, user, ids, types=types)
    stack, cost, ref = (SE.classify_secret, SE.cost_classify_secret, M.ref_classify) \
        if arch == M.ENCODER_CLASSIFIER else (SE.embed_secret, SE.cost_embed_secret, M.ref_embed)
    res = run(lambda p, s, oh: stack(p, cfg, s, oh), SM.share_model(cfg, w, secret_user=user),
              deal(SE.encoder_onehot(ids, cfg, types)))
    assert np.max(np.abs(value(res) - ref(cfg, w, x))) < 2e-3
    run.assert_cost(cost(RingConfig(), cfg, 2, 6))


def test_layout_and_onehot_rows_refuse_bad_tokens_in_one_line(bert):
    _, cfg, _, user = bert
    assert SM.secret_shapes(cfg) == {"embed.tokens": (52, 32), "embed.pos": (16, 32),
                                     "embed.ln.gamma": (32,), "embed.ln.beta": (32,)}
    tokens_table = SM.secret_layout(cfg, user)["embed.tokens"][0]()     # types under words
    np.testing.assert_array_equal(tokens_table, np.concatenate([user["embed.src"],
                                                                user["embed.type"]]))
    ok = SE.encoder_onehot([[2, 7]], cfg, [[0, 1]])
    assert ok.shape == (1, 2, cfg.src_vocab + 2) and ok.dtype == np.uint64
    assert ok[0, 1, 7] == 1 and ok[0, 1, cfg.src_vocab + 1] == 1
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 50\)"):
        SE.encoder_onehot([[2, 50]], cfg)
    with pytest.raises(ValueError, match=r"token types must be integers in \[0, 2\)"):
        SE.encoder_onehot([[2, 3]], cfg, [[0, 2]])
    with pytest.raises(ValueError, match=r"1 <= S <= 16 \(max_len\)"):
        SE.encoder_onehot(np.zeros((1, 17), int), cfg)
    with pytest.raises(ValueError, match="entries"):
        SE.check_onehot_shape(cfg, (1, 3, cfg.src_vocab))


def calibrated(cfg, w, user):
    return C.calibrate(cfg, w, C.default_samples(cfg, user, np.random.default_rng(0)),
                       user=user, secret=True)


def test_calibration_traces_the_embedding_layernorm_on_shares(bert):
    """With the tables secret the trace starts from one-hot token samples: the embedding
    LayerNorm's sites (layer embed.ln) are recorded; a user-held model has none. An
    embedding whose variance leaves sqrt_inv's range is refused there, by name."""
    _, cfg, w, user = bert
    cal = calibrated(cfg, w, user)
    assert {"var_eps", "scale"} <= set(cal.layers["embed.ln"])
    assert {"argmax", "head"} <= set(cal.layers["head"])
    plain = C.calibrate(cfg, w, C.default_samples(cfg, user, np.random.default_rng(0)),
                        user=user)
    assert "embed.ln" not in plain.layers
    hot = {**user, "embed.src": user["embed.src"] * 1e4}
    with pytest.raises(C.RangeError, match="^embed.ln: "):
        calibrated(cfg, w, hot)
    with pytest.raises(ValueError, match="token samples"):
        C.calibrate(cfg, w, C.Samples([M.embed_tokens(cfg, user, [[1, 2]])]), user=user,
                    secret=True)


def _job(parties, kind, oh):
    jobs = parties.run(kind, {}, [{"ONEHOT": s} for s in deal(oh)])
    return {k: ring.decode(v) for k, v in reconstruct([j.outputs for j in jobs]).items()}, jobs


def test_secret_jobs_return_the_permitted_output_and_refuse_bad_input(bert):
    """The production job kinds in process: by default only the class (classify-argmax-
    secret), transformers' arg-max; the logits only if the owner permits classify-secret;
    one-line refusals of rows of the wrong width, over max_len, a model whose owner hands
    out its tables, and a calibration without the embedding LayerNorm."""
    model, cfg, w, user = bert
    cal = calibrated(cfg, w, user).to_dict()
    ids, types = tokens(np.random.default_rng(5), cfg, 4, 7)
    want = theirs(model, ids, types)
    parties = InprocParties.for_model(cfg, w, calibration=cal, secret_user=user)
    out, jobs = _job(parties, "classify_argmax_secret", SE.encoder_onehot(ids, cfg, types))
    assert np.rint(out["class"]).astype(int).tolist() == want.argmax(1).tolist()
    assert [e["layer"] for e in jobs[0].costs] == ["embed", "enc.0", "enc.1", "head", "argmax"]
    with pytest.raises(ValueError, match="does not permit 'classify-secret'"):
        _job(parties, "classify_secret", SE.encoder_onehot(ids, cfg, types))
    with pytest.raises(ValueError, match="entries"):
        _job(parties, "classify_argmax_secret", SE.encoder_onehot(ids, cfg, types)[..., 1:])
    with pytest.raises(ValueError, match=r"takes 1\.\.16 \(max_len\)"):
        _job(parties, "classify_argmax_secret",
             np.zeros((1, 17, cfg.src_vocab + 2), np.uint64))
    both = InprocParties.for_model(cfg, w, calibration=cal, secret_user=user,
                                   permitted=("classify-secret",))
    out, _ = _job(both, "classify_secret", SE.encoder_onehot(ids, cfg, types))
    assert np.max(np.abs(out["logits"] - want)) < 1e-2
    plain = InprocParties.for_model(cfg, w, calibration=cal,
                                    permitted=("classify-argmax-secret",))
    with pytest.raises(ValueError, match="hands its embedding tables"):
        _job(plain, "classify_argmax_secret", SE.encoder_onehot(ids, cfg, types))
    old = {**cal, "layers": {k: v for k, v in cal["layers"].items() if k != "embed.ln"}}
    stale = InprocParties.for_model(cfg, w, calibration=old, secret_user=user)
    with pytest.raises(ValueError, match=r"lacks the secret embeddings' sites \(embed.ln"):
        _job(stale, "classify_argmax_secret", SE.encoder_onehot(ids, cfg, types))


def test_secret_embed_job_is_the_embedding(bertmodel):
    model, cfg, w, user = bertmodel
    cal = calibrated(cfg, w, user).to_dict()
    ids, types = tokens(np.random.default_rng(6), cfg, 2, 5)
    parties = InprocParties.for_model(cfg, w, calibration=cal, secret_user=user)
    out, jobs = _job(parties, "embed_secret", SE.encoder_onehot(ids, cfg, types))
    assert np.max(np.abs(out["E"] - theirs(model, ids, types))) < 1e-2
    assert jobs[0].costs[0]["layer"] == "embed"
