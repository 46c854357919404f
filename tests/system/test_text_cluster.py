"""Text in, text out over real party processes (`mpc3 party` on loopback, mTLS): a tiny
sentence-transformers directory imported with `mpc3 import`, shared with `mpc3 share-model`
(calibrated) and queried with `mpc3 embed "text" ...` against SentenceTransformer.encode;
an encoder classifier with its class names queried with `mpc3 classify "text"`; an LM that
carries a tokenizer continued from a text prompt with `mpc3 generate` (ids decoded back to
text). Bounds as tests/protocols/model/test_sentence_import.py: cosine >= 0.9999, max abs 2e-3.

The same with the embedding tables kept secret by their owner (`share-model
--secret-embeddings`, protocols/stacks/secret_encoder.py): a tiny random
BertForSequenceClassification gives transformers' class alone through `mpc3 classify`, a
sentence-transformers BERT its embeddings through `mpc3 embed`; `mpc3 models` shows the mode;
bad input and an architecture without the mode are refused in one line, nothing stored."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

from app.localcluster import LocalCluster  # noqa: E402
from conftest import mpc3_cli  # noqa: E402
from protocols import model as M  # noqa: E402
from helpers.hf_models import TEXTS, make_bert, make_st, make_tokenizer  # noqa: E402

IDS = [[2, 17, 33, 4, 41, 9, 3], [2, 8, 30, 11, 3, 26, 19]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    c = LocalCluster(d, peer_timeout=5.0)
    c.start()
    yield c
    c.stop()


def test_cli_embed_text_matches_sentence_transformers(cluster, tmp_path):
    st = make_st(tmp_path / "st", "mean", True)
    r = mpc3_cli("import", tmp_path / "st", "--out", tmp_path / "st.npz")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("share-model", tmp_path / "st.npz", "--config", cluster.path, "--model-id", "st")
    assert r.returncode == 0 and "(encoder, permits embed)" in r.stdout, r.stderr
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "st", "--model",
              tmp_path / "st.npz", *TEXTS, "--output", tmp_path / "E.npy")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "E.npy")
    want = st.encode(TEXTS, convert_to_numpy=True).astype(np.float64)
    assert got.shape == want.shape == (len(TEXTS), 32)
    cos = np.sum(got * want, -1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() >= 0.9999 and np.abs(got - want).max() < 2e-3
    lines = r.stdout.splitlines()
    assert len(lines) == len(TEXTS) + 1 and lines[0].startswith("0: 8 tokens, norm 1.000")
    assert lines[0].endswith(repr(TEXTS[0]))
    assert "4 inputs in 3 job(s)" in r.stderr            # texts 1 and 4: one length, one job
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "st", "--model",
              tmp_path / "st.npz", "the cat sat on the mat " * 4)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "text 1 ('the cat sat on the mat the cat sat on th...') is 26 tokens with its " \
        "special tokens; the model takes at most 24 (max_len)" in r.stderr


def test_cli_classify_text_prints_the_label(cluster, tmp_path):
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=True, max_len=16,
                        arch="encoder-classifier", n_enc_layers=1, src_vocab=61,
                        n_classes=3).validate()
    w, user = M.random_weights(cfg, 7), M.random_user(cfg, 7)
    make_tokenizer(tmp_path)
    M.save_model(tmp_path / "clf.npz", cfg, w, user,
                 tokenizer=(tmp_path / "tokenizer.json").read_text(),
                 labels=["neg", "neutral", "pos"])
    r = mpc3_cli("share-model", tmp_path / "clf.npz", "--config", cluster.path, "--model-id",
              "clf", "--permit", "classify,classify-argmax")
    assert r.returncode == 0, r.stderr
    tok = M.load_tokenizer(tmp_path / "clf.npz")
    ref = M.ref_classify(cfg, w, M.embed_tokens(cfg, user, [tok.encode(TEXTS[1]).ids]))[0]
    k = int(ref.argmax())
    assert np.sort(ref)[-1] - np.sort(ref)[-2] > 1e-2
    for kind in ("classify", "classify_argmax"):
        r = mpc3_cli("classify", "--config", cluster.path, "--model-id", "clf", "--model",
                  tmp_path / "clf.npz", "--kind", kind, TEXTS[1])
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"0: {['neg', 'neutral', 'pos'][k]} (class {k})")
        assert ("logits [" in r.stdout) == (kind == "classify")


def test_cli_generate_decodes_tokenizer_text(cluster, tmp_path):
    """A decoder-only LM whose file carries a tokenizer: the prompt goes through it and the
    generated ids come back as the tokenizer's text (the plaintext greedy ids, decoded)."""
    from tokenizers import Tokenizer
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=True, max_len=16, arch="decoder-only",
                        n_dec_layers=2, tgt_vocab=61).validate()
    w, user = M.random_weights(cfg, 8), M.random_user(cfg, 8)
    make_tokenizer(tmp_path)
    text = (tmp_path / "tokenizer.json").read_text()
    M.save_model(tmp_path / "lm.npz", cfg, w, user, tokenizer=text)
    r = mpc3_cli("share-model", tmp_path / "lm.npz", "--config", cluster.path, "--model-id", "lm")
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.from_str(text)
    prompt = tok.encode("the cat").ids                     # [CLS] the cat [SEP]
    ref = M.greedy_generate(cfg, w, user, [prompt], 5)[0]
    r = mpc3_cli("generate", "--config", cluster.path, "--model-id", "lm", "--model",
              tmp_path / "lm.npz", "--tokens", 5, "the cat")
    assert r.returncode == 0, r.stderr
    assert f"tokens: {ref}" in r.stderr
    assert r.stdout.rstrip("\n") == tok.decode(ref, skip_special_tokens=True)
    assert json.loads(r.stderr.split("tokens: ", 1)[1].splitlines()[0]) == ref


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
    st = make_st(tmp_path / "sts", "mean", True)
    r = mpc3_cli("import", tmp_path / "sts", "--out", tmp_path / "sts.npz")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("share-model", tmp_path / "sts.npz", "--config", cluster.path, "--model-id",
                 "sts", "--secret-embeddings")
    assert r.returncode == 0 and "(encoder, permits embed-secret; embeddings secret)" \
        in r.stdout, r.stderr
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "sts", "--model",
                 tmp_path / "sts.npz", *TEXTS, "--output", tmp_path / "E.npy")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "E.npy")
    want = st.encode(TEXTS, convert_to_numpy=True).astype(np.float64)
    cos = np.sum(got * want, -1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() >= 0.9999 and np.abs(got - want).max() < 2e-3
    r = mpc3_cli("embed", "--config", cluster.path, "--model-id", "sts", "--model",
                 tmp_path / "sts.npz", "the cat sat on the mat " * 4)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the model takes at most 24 (max_len)" in r.stderr


def test_a_model_without_a_secure_lookup_is_refused_and_nothing_stored(cluster, tmp_path):
    """An encoder-decoder has no secret-embeddings mode: share-model refuses it in one line
    before anything is uploaded."""
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
