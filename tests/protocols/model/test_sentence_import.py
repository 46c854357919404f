"""Sentence-embedding checkpoints, text in and text out: a tiny random BertModel and a tiny
WordPiece tokenizer built here (transformers, tokenizers), a sentence-transformers directory
around them (``SentenceTransformer.save``), imported with ``mpc3 import`` and embedded
securely from text (three in-process parties, the production ``embed`` job) against
``SentenceTransformer.encode``; every refusal of the import; texts over max_len; old model
files. No hub downloads.

Shapes: vocab 60 (WordPiece: letters, ##letters, a few words), d=32, 2 layers, 4 heads,
d_ff 64, 32 positions; every parameter perturbed by N(0, 0.15^2) after HF's initialisation.

Bounds: secure vs sentence-transformers (float32 torch): cosine >= 0.9999 per text, and max
abs error 2e-3 normalized (measured ~2e-4) / 1e-2 unnormalized (rows of norm ~5); the
reference (ref_embed of the imported model) vs sentence-transformers 1e-5 (float32).
"""
import json
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

from app.cli import main as cli  # noqa: E402
from app.owner import calibration_samples  # noqa: E402
from conftest import run_job  # noqa: E402
from helpers.hf_models import TEXTS, make_bertmodel, make_st, make_tokenizer  # noqa: E402
from net.party.inproc import InprocParties  # noqa: E402
from protocols.calibration import calibrate as C  # noqa: E402
from protocols import model as M  # noqa: E402

def _import(tmp_path, src, *opts):
    out = tmp_path / "imported.npz"
    assert cli(["import", str(src), "--out", str(out), *map(str, opts)]) == 0
    return out


def _ids(tok, text):
    return np.array([tok.encode(text).ids])


def cosine(a, b):
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("pool,normalize", [("mean", True), ("cls", True), ("max", False),
                                            ("mean", False)])
def test_st_directory_imports_and_embeds_text_securely(tmp_path, capsys, pool, normalize):
    model = make_st(tmp_path / "st", pool, normalize)
    out = _import(tmp_path, tmp_path / "st")
    assert "; its tokenizer;" in capsys.readouterr().out
    cfg, w, user = M.load_model(out)
    assert (cfg.arch, cfg.pool, cfg.normalize, cfg.max_len, cfg.attention, cfg.embedding) == \
        ("encoder", pool, normalize, 24, "softmax", "learned-ln")
    assert user["embed.pos"].shape == (24, 32)               # cut to max_seq_length
    tok = M.load_tokenizer(out)
    cal = C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)   # share-model
    parties = InprocParties.for_model(cfg, w, calibration=cal.to_dict())
    want = model.encode(TEXTS, convert_to_numpy=True).astype(np.float64)
    for text, ref in zip(TEXTS, want):
        ids = _ids(tok, text)
        assert ids[0, 0] == 2 and ids[0, -1] == 3           # [CLS] ... [SEP]
        x = M.embed_tokens(cfg, user, ids)
        C.check_input(cal, "X", x)
        got = run_job(parties, "embed", x)[0]["E"][0]
        plain = M.ref_embed(cfg, w, x)[0]
        assert np.max(np.abs(plain - ref)) < 1e-5 * max(1, np.abs(ref).max())
        assert cosine(got, ref) >= 0.9999
        assert np.max(np.abs(got - ref)) < (2e-3 if normalize else 1e-2)
        if normalize:
            assert abs(np.linalg.norm(got) - 1) < 1e-3


def test_bertmodel_import_options_and_max_len(tmp_path, capsys):
    bert = make_bertmodel(tmp_path / "b")
    cfg, _, user = M.load_model(_import(tmp_path, bert))
    assert (cfg.arch, cfg.pool, cfg.normalize, cfg.max_len) == ("encoder", "mean", False, 32)
    assert "pooler" in capsys.readouterr().out                  # ignored, with a note
    cfg, w, user = M.load_model(_import(tmp_path, bert, "--pool", "max", "--normalize",
                                        "--max-len", 8))
    assert (cfg.pool, cfg.normalize, cfg.max_len, user["embed.pos"].shape) == \
        ("max", True, 8, (8, 32))
    hf = transformers.BertModel.from_pretrained(bert).eval()
    ids = np.array([[2, 7, 9, 3]])
    with torch.no_grad():
        h = hf.double()(input_ids=torch.tensor(ids)).last_hidden_state.numpy()[0]
    e = h.max(0) / np.linalg.norm(h.max(0))
    np.testing.assert_allclose(M.ref_embed(cfg, w, M.embed_tokens(cfg, user, ids))[0], e,
                               atol=1e-10)
    from app.cli.common import load_model_file       # share-model takes the directory too
    got = load_model_file(str(bert), options={"pool": "cls", "max_len": 16})[0]
    assert (got.pool, got.max_len) == ("cls", 16)


def _refused(tmp_path, capsys, src, *opts):
    capsys.readouterr()
    out = tmp_path / "x.npz"
    assert cli(["import", str(src), "--out", str(out), *map(str, opts)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpc3 import: error: ") and len(err.splitlines()) == 1, err
    assert not out.exists()
    return err


def _edit_json(f, **changes):
    conf = json.loads(f.read_text())
    conf.update(changes)
    f.write_text(json.dumps(conf))


def test_import_refusals_name_the_problem(tmp_path, capsys):
    make_st(tmp_path / "st", "mean", True)
    base = tmp_path / "st"

    def case(name, edit, message, *opts):
        d = tmp_path / name
        shutil.copytree(base, d)
        edit(d)
        err = _refused(tmp_path, capsys, d, *opts)
        assert re.search(message, err), (name, err)

    def modules(d, extra):
        f = d / "modules.json"
        f.write_text(json.dumps(json.loads(f.read_text()) + [extra]))

    pool = "1_Pooling/config.json"
    case("dense", lambda d: modules(d, {"idx": 3, "name": "3", "path": "3_Dense",
                                         "type": "sentence_transformers.models.Dense"}),
         "module Dense .* is not supported")
    case("sqrt", lambda d: _edit_json(d / pool, pooling_mode="mean_sqrt_len_tokens"),
         "pooling mode 'mean_sqrt_len_tokens' is not supported")
    case("weighted", lambda d: _edit_json(d / pool, pooling_mode="weightedmean"),
         "pooling mode 'weightedmean' is not supported")
    case("last", lambda d: _edit_json(d / pool, pooling_mode="lasttoken"),
         "pooling mode 'lasttoken' is not supported")
    case("concat", lambda d: (d / pool).write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
         "pooling_mode_mean_tokens": True})), r"pooling modes \['cls', 'mean'\].*concatenated")
    case("dim", lambda d: (d / pool).write_text(json.dumps(
        {"word_embedding_dimension": 16, "pooling_mode_mean_tokens": True})),
         "expects embeddings of dimension 16, the encoder's hidden size is 32")
    case("notok", lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json")
    case("vocabtxt", lambda d: ((d / "tokenizer.json").unlink(),
                                (d / "vocab.txt").write_text("[PAD]\n")),
         "tokenizer is there only as vocab.txt; mpc3 reads tokenizer.json")
    case("bigvocab", lambda d: _edit_tokenizer(d), r"tokenizer.json has 6\d tokens but the "
         "embedding table 61 rows: it is another model's tokenizer")
    case("badtok", lambda d: (d / "tokenizer.json").write_text("{}"),
         "tokenizer.json cannot be read")
    case("masked", lambda d: _edit_json(d / "config.json", architectures=["BertForMaskedLM"]),
         r"Transformer module is 'bert' \['BertForMaskedLM'\]; mpc3 imports a BertModel")
    case("prompt", lambda d: _edit_json(d / "config_sentence_transformers.json",
                                        default_prompt_name="query"),
         "a default prompt .* is not supported")
    case("pool", lambda d: None, "modules.json sets its pooling", "--pool", "cls")
    case("long", lambda d: None, "--max-len 64 exceeds the checkpoint's 32 positions",
         "--max-len", 64)
    case("pickle", lambda d: ((d / "model.safetensors").unlink(),
                              (d / "pytorch_model.bin").write_bytes(b"x")),
         "only a pickled/TF checkpoint is there")
    make_bertmodel(tmp_path / "b")
    _edit_json(tmp_path / "b" / "config.json", architectures=["BertForTokenClassification"])
    err = _refused(tmp_path, capsys, tmp_path / "b")
    assert "architecture ['BertForTokenClassification'] is not supported" in err


def test_older_st_layout_imports(tmp_path):
    """sentence-transformers 2.x wrote sentence_transformers.models.* module types, the
    pooling as booleans and max_seq_length in sentence_bert_config.json (all-MiniLM-L6-v2's
    layout): read the same way."""
    make_st(tmp_path / "st", "max", False)
    d = tmp_path / "st"
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True,
         "pooling_mode_mean_sqrt_len_tokens": False}))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16,
                                                             "do_lower_case": False}))
    cfg = M.load_model(_import(tmp_path, d))[0]
    assert (cfg.arch, cfg.pool, cfg.normalize, cfg.max_len) == ("encoder", "max", True, 16)


def _edit_tokenizer(d):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_tokens(["zz1", "zz2", "zz3", "zz4", "zz5"])
    tok.save(str(d / "tokenizer.json"))


def test_classifier_import_keeps_labels_and_refuses_pool(tmp_path, capsys):
    from helpers.hf_models import make_bert
    make_bert(tmp_path / "c", id2label={0: "neg", 1: "neutral", 2: "pos"},
              label2id={"neg": 0, "neutral": 1, "pos": 2})
    out = _import(tmp_path, tmp_path / "c")
    assert "no tokenizer.json: query users pass token ids" in capsys.readouterr().out
    assert M.load_labels(out) == ["neg", "neutral", "pos"] and M.load_tokenizer(out) is None
    err = _refused(tmp_path, capsys, tmp_path / "c", "--normalize")
    assert "--pool and --normalize apply to a headless encoder" in err


def test_old_model_files_load_unchanged(tmp_path):
    from app import textdata as TD
    for path in (TD.SHIPPED_CLASSIFIER, TD.SHIPPED_MODEL):   # written before tokenizers
        cfg, w, user = M.load_model(path)
        assert M.load_tokenizer(path) is None and M.load_labels(path) is None
    cfg = M.ModelConfig(d_model=8, n_heads=2, d_head=4, n_features=4, d_ff=8, attn_c=0.5,
                        attn_norm="mean", norm_first=True, max_len=4, arch="encoder",
                        n_enc_layers=1, src_vocab=61).validate()
    w, user = M.random_weights(cfg), M.random_user(cfg)
    make_tokenizer(tmp_path)
    M.save_model(tmp_path / "m.npz", cfg, w, user,
                 tokenizer=(tmp_path / "tokenizer.json").read_text())
    got = M.load_model(tmp_path / "m.npz")
    assert got[0] == cfg and sorted(got[1].tensors) == sorted(w.tensors)
    tok = M.load_tokenizer(tmp_path / "m.npz")
    assert tok.encode("the cat " * 40).ids[:3] == [2, 5, 6]      # no truncation, no padding
    assert len(tok.encode("the cat " * 40).ids) == 82


def test_texts_over_max_len_are_refused_and_token_streams_decode(tmp_path):
    """app.text: a text of more tokens than max_len (its [CLS] and [SEP] counted) is refused
    naming its count; generated byte-level tokens decode to text incrementally, a character
    split over several tokens appearing once it is whole."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from app.text import TokenStream, by_length, parse_ids, token_ids
    make_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert token_ids(tok, ["the cat sat"], 5) == [[2, 5, 6, 8, 3]]
    with pytest.raises(ValueError, match=r"^text 2 \('the cat sat on'\) is 6 tokens with its "
                       r"special tokens; the model takes at most 5 \(max_len\)"):
        token_ids(tok, ["the cat", "the cat sat on"], 5)
    with pytest.raises(ValueError, match="text 1 is empty"):
        token_ids(tok, ["  "], 5)
    assert by_length([[1, 2], [3], [4, 5]]) == {2: [0, 2], 1: [1]}
    with pytest.raises(ValueError, match=r"token ids in 0\.\.60"):
        parse_ids("1,61", 61)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["plain words and more words"], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    text = "words \u00e9t\u00e9 \U0001f600 and"               # 2- and 4-byte characters
    ids = bpe.encode(text).ids
    assert len(ids) > len(text.split())                      # bytes as separate tokens
    stream = TokenStream(bpe)
    parts = [stream.feed(t) for t in ids] + [stream.flush()]
    assert "".join(parts) == text and not any("\ufffd" in p for p in parts)
