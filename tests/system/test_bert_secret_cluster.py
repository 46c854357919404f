"""BERT-style encoders with secret embedding tables over real party processes (`mpc3 party`
on loopback, mTLS): a tiny random BertForSequenceClassification and a sentence-transformers
directory around a BertModel, built here (tests/helpers/hf_models.py), imported with
`mpc3 import` and shared with `mpc3 share-model --secret-embeddings`. `mpc3 classify`
then sends one-hot rows and prints only the class - transformers' arg-max -, `mpc3 embed`
the embedding (cosine >= 0.9999 with SentenceTransformer.encode); `mpc3 models` shows the
mode; bad input and a model that cannot keep its tables secret are refused with one line,
nothing stored."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

from app.localcluster import LocalCluster  # noqa: E402
from conftest import mpc3_cli  # noqa: E402
from helpers.hf_models import TEXTS, make_bert, make_st  # noqa: E402

IDS = [[2, 17, 33, 4, 41, 9, 3], [2, 8, 30, 11, 3, 26, 19]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert-secret")
    c = LocalCluster(d, peer_timeout=5.0)
    c.start()
    yield c
    c.stop()


def test_secret_classifier_returns_transformers_class_only(cluster, tmp_path):
    model = make_bert(tmp_path / "bert")
    r = mpc3_cli("import", tmp_path / "bert", "--out", tmp_path / "bert.npz")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("share-model", tmp_path / "bert.npz", "--config", cluster.path, "--model-id",
                 "bert", "--secret-embeddings")
    assert r.returncode == 0, r.stderr
    assert "(encoder-classifier, permits classify-argmax-secret; embeddings secret)" in r.stdout
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(IDS)).logits.numpy()
    top = np.sort(logits, axis=1)
    assert (top[:, -1] - top[:, -2]).min() > 1e-2           # no class decided by a near-tie
    want = logits.argmax(1)
    for ids, k in zip(IDS, want):
        r = mpc3_cli("classify", "--config", cluster.path, "--model-id", "bert", "--model",
                     tmp_path / "bert.npz", "--kind", "classify_argmax",
                     "--ids", ",".join(map(str, ids)))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"0: LABEL_{k} (class {k})") and "logits" not in r.stdout
    r = mpc3_cli("classify", "--config", cluster.path, "--model-id", "bert", "--model",
                 tmp_path / "bert.npz", "--ids", "2,17,3")           # logits: not permitted
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "does not permit 'classify-secret'" in r.stderr
    assert "its owner permitted: classify-argmax-secret" in r.stderr
    r = mpc3_cli("classify", "--config", cluster.path, "--model-id", "bert", "--model",
                 tmp_path / "bert.npz", "--kind", "classify_argmax", "--ids", "2,50,3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "expected token ids in 0..49" in r.stderr
    r = mpc3_cli("models", "--config", cluster.path)
    assert "bert: OK" in r.stdout and "mode=secret-embeddings" in r.stdout, r.stdout


def test_secret_sentence_encoder_embeds_like_sentence_transformers(cluster, tmp_path):
    st = make_st(tmp_path / "st", "mean", True)
    r = mpc3_cli("import", tmp_path / "st", "--out", tmp_path / "st.npz")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("share-model", tmp_path / "st.npz", "--config", cluster.path, "--model-id",
                 "st", "--secret-embeddings")
    assert r.returncode == 0 and "(encoder, permits embed-secret; embeddings secret)" \
        in r.stdout, r.stderr
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "st", "--model",
                 tmp_path / "st.npz", *TEXTS, "--output", tmp_path / "E.npy")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "E.npy")
    want = st.encode(TEXTS, convert_to_numpy=True).astype(np.float64)
    cos = np.sum(got * want, -1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() >= 0.9999 and np.abs(got - want).max() < 2e-3
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "st", "--model",
                 tmp_path / "st.npz", "the cat sat on the mat " * 4)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the model takes at most 24 (max_len)" in r.stderr


def test_a_model_without_a_secure_lookup_is_refused_and_nothing_stored(cluster, tmp_path):
    """An encoder-decoder has no secret-embeddings mode: share-model refuses it in one line
    before anything is uploaded."""
    from protocols import model as M
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=True, max_len=8, n_enc_layers=1, n_dec_layers=1,
                        src_vocab=13, tgt_vocab=13).validate()
    M.save_model(tmp_path / "t.npz", cfg, M.random_weights(cfg, 1), M.random_user(cfg, 1))
    r = mpc3_cli("share-model", tmp_path / "t.npz", "--config", cluster.path, "--model-id",
                 "tr", "--secret-embeddings")
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "secret embeddings run decoder-only LMs and encoders" in r.stderr
    r = mpc3_cli("models", "--config", cluster.path)
    assert "tr:" not in r.stdout, r.stdout
