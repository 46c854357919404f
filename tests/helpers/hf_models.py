"""Tiny Hugging Face checkpoints built here with a fixed seed and saved with
``save_pretrained`` (no hub downloads), every parameter perturbed by N(0, NOISE^2) after
HF's initialisation: a BertForSequenceClassification (tests/protocols/model/test_hf_import.py)
and a sentence-transformers directory around a BertModel with its WordPiece tokenizer
(tests/protocols/model/test_sentence_import.py). Needs torch and transformers (skips
without)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NOISE = 0.15


def _perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NOISE)
    return model.eval()


def make_bert(path, **kw):
    torch.manual_seed(0)
    conf = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=16, type_vocab_size=2,
                                   num_labels=3, **kw)
    model = _perturb(transformers.BertForSequenceClassification(conf), 1)
    model.save_pretrained(path)
    return model


WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "runs", "fast", "slow"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = ["the cat sat on the mat", "a dog runs fast", "slow", "The DOG sat on a cat"]


def make_tokenizer(path):
    """A BERT-style WordPiece tokenizer.json (lower-casing normalizer, [CLS] ... [SEP])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    vocab = SPECIAL + WORDS + list("abcdefghijklmnopqrstuvwxyz") + \
        ["##" + c for c in "abcdefghijklmnopqrst"]
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"), unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(path)          # tokenizer_config.json: what AutoTokenizer reads
    return len(vocab)


def make_bertmodel(path, positions=32, seed=0):
    """A tiny random BertModel with its tokenizer, as save_pretrained writes them."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(path)
    torch.manual_seed(seed)
    conf = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=positions, type_vocab_size=2)
    model = transformers.BertModel(conf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NOISE)
    model.eval().save_pretrained(path)
    return path


def make_st(path, pool="mean", normalize=True, max_seq_length=24, seed=0):
    """A sentence-transformers directory around a tiny BertModel (SentenceTransformer.save)."""
    from sentence_transformers import SentenceTransformer
    try:                                    # sentence-transformers >= 6; before: .models
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    bert = make_bertmodel(path.parent / f"{path.name}-bert", seed=seed)
    mods = [modules.Transformer(str(bert), max_seq_length=max_seq_length),
            modules.Pooling(32, pool)]
    if normalize:
        mods.append(modules.Normalize())
    model = SentenceTransformer(modules=mods, device="cpu")
    model.save(str(path))
    return model
