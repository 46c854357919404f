"""Sentence-transformers directories and the text assets of imported checkpoints
(``mpc3 import DIR``, ``mpc3 share-model DIR``): :func:`import_checkpoint` reads every
Hugging Face layout (:mod:`.hf_import`, LLaMA: :mod:`.llama_import`) with its tokenizer and
class names.

A sentence-transformers directory (``SentenceTransformer.save``) lists its modules in
``modules.json``; mpc3 imports exactly

* ``Transformer`` (path ``""`` or a subdirectory): a ``BertModel`` checkpoint
  (:func:`protocols.model.hf_import.bert`) with its ``tokenizer.json``;
* ``Pooling`` (its ``config.json``): exactly one of the modes cls / mean / max -> the
  config's ``pool``; both layouts are read, the older booleans
  (``pooling_mode_cls_token``, ``pooling_mode_mean_tokens``, ``pooling_mode_max_tokens``,
  ...) and the newer ``pooling_mode`` string; ``word_embedding_dimension`` /
  ``embedding_dimension`` must be the encoder's hidden size. mean_sqrt_len_tokens,
  weightedmean, lasttoken and several modes at once (concatenated) are refused by name;
* an optional ``Normalize`` -> ``normalize`` true (sentence-transformers divides by
  max(||e||, 1e-12)),

and refuses any other module (Dense, LayerNorm, ...) by name, in that order only. ``max_len``
defaults to the directory's ``max_seq_length`` (``sentence_bert_config.json``, or the
tokenizer_config.json's ``model_max_length`` that newer versions write instead) - inputs
sentence-transformers would truncate are refused at the user, never cut.

Text assets: ``tokenizer.json`` (the ``tokenizers`` library's format, beside the checkpoint)
is checked (it parses; its vocabulary fits the embedding table) and stored in the model file
(:func:`protocols.model.weights.load_tokenizer`); a checkpoint whose tokenizer exists only in
another form (vocab.txt, a sentencepiece model, ...) is refused with how to write
tokenizer.json; a sentence-transformers directory must have one; a bare model checkpoint
without any tokenizer imports with a note (its users pass token ids). A classifier's
``id2label`` becomes the file's class names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .config import ModelConfig, check_ceilings
from .files import ModelFileError, read_json, read_small
from .hf_import import (ST_MODULES, ImportRefused, bert, cap_max_len, detect_format, labels_of,
                        load_hf, read_checkpoint)
from .llama_import import FORMAT as LLAMA_FORMAT, load_llama
from .weights import Weights

#: Files that hold a tokenizer in a form mpc3 does not read (it reads tokenizer.json).
OTHER_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                         "sentencepiece.bpe.model", "tokenizer.model")
#: sentence-transformers' pooling modes, newer names (``pooling_mode``) and older booleans.
ST_POOLS = {"cls": "cls", "mean": "mean", "max": "max"}
_LEGACY_POOLS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean",
                 "pooling_mode_lasttoken": "lasttoken"}
_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass
class Imported:
    """A converted checkpoint: what :func:`protocols.model.save_model` writes."""

    cfg: ModelConfig
    weights: Weights
    user: dict
    notes: list[str] = field(default_factory=list)
    tokenizer: str | None = None          # tokenizer.json's text
    labels: list[str] | None = None       # a classifier's class names


def _json(path: Path, what: str, kind=dict) -> dict | list:
    """A JSON file of the checkpoint, bounded (:func:`.files.read_json`), of type ``kind``."""
    return read_json(path, what, kind=kind)


def _inside(root: Path, sub: str, name: str) -> Path:
    """``root / sub``, refused when a link takes it outside ``root``."""
    d = root / sub
    if not d.resolve().is_relative_to(root.resolve()):
        raise ImportRefused(f"{name}: module path {sub!r} leads outside the directory")
    return d


def tokenizer_text(d: Path, rows: int, name: str, required: bool,
                   notes: list[str]) -> str | None:
    """tokenizer.json of checkpoint directory ``d``, checked against an embedding table of
    ``rows`` rows (None, with a note, when the directory has no tokenizer at all)."""
    f = d / "tokenizer.json"
    if not f.is_file():
        other = [n for n in OTHER_TOKENIZER_FILES if (d / n).is_file()]
        if other:
            raise ImportRefused(f"{name}: its tokenizer is there only as {', '.join(other)}; "
                                f"mpc3 reads tokenizer.json (write it with transformers: "
                                f"AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))")
        if required:
            raise ImportRefused(f"{name}: no tokenizer.json (a sentence-transformers model "
                                f"embeds text: save it with its tokenizer)")
        notes.append("no tokenizer.json: query users pass token ids (--ids), not text")
        return None
    try:
        text = read_small(f, "tokenizer.json").decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFileError(f"{f}: tokenizer.json is not UTF-8 text") from None
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception types
        raise ImportRefused(f"{name}: tokenizer.json cannot be read by the tokenizers "
                            f"library: {exc}") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > rows:
        raise ImportRefused(f"{name}: tokenizer.json has {size} tokens but the embedding "
                            f"table {rows} rows: it is another model's tokenizer")
    if size < rows:
        notes.append(f"the tokenizer has {size} tokens, the embedding table {rows} rows "
                     f"(the rest are never produced by the tokenizer)")
    return text


# --------------------------------------------------------------- sentence-transformers ----
def _module_kind(entry, name: str) -> tuple[str, str]:
    """(kind, path) of one modules.json entry; refuses modules mpc3 does not import."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ImportRefused(f"{name}: {ST_MODULES} entry {entry!r} has no module type")
    kind = entry["type"].rsplit(".", 1)[-1]
    if not entry["type"].startswith("sentence_transformers.") or kind not in _MODULES:
        raise ImportRefused(f"{name}: sentence-transformers module {kind} "
                            f"({entry['type']}) is not supported (mpc3 imports Transformer, "
                            f"Pooling and an optional Normalize)")
    path = entry.get("path", "")
    if not isinstance(path, str) or Path(path).is_absolute() or ".." in Path(path).parts:
        raise ImportRefused(f"{name}: module {kind} has path {path!r}, not a subdirectory")
    return kind, path


def st_pooling(conf: dict, hidden: int, name: str) -> str:
    """The pool of a Pooling module's config.json (the module docstring)."""
    dim = conf.get("embedding_dimension", conf.get("word_embedding_dimension"))
    if dim != hidden:
        raise ImportRefused(f"{name}: the Pooling module expects embeddings of dimension "
                            f"{dim!r}, the encoder's hidden size is {hidden}")
    if "pooling_mode" in conf:
        mode = conf["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [m for k, m in _LEGACY_POOLS.items() if conf.get(k)]
    if len(modes) != 1:
        raise ImportRefused(f"{name}: pooling modes {modes} - mpc3 pools with exactly one of "
                            f"{', '.join(ST_POOLS)} (concatenated modes are not supported)")
    if modes[0] not in ST_POOLS:
        raise ImportRefused(f"{name}: pooling mode {modes[0]!r} is not supported (mpc3: "
                            f"{', '.join(ST_POOLS)})")
    return ST_POOLS[modes[0]]


def st_max_len(d: Path, positions: int) -> int | None:
    """The longest input sentence-transformers gives the encoder (None: unstated)."""
    sb = d / "sentence_bert_config.json"
    if sb.is_file():
        conf = _json(sb, "sentence_bert_config.json")
        if conf.get("do_lower_case"):
            raise ImportRefused(f"{d}: do_lower_case (sentence-transformers lowercases the "
                                f"text before its tokenizer) is not supported")
        if isinstance(conf.get("max_seq_length"), int):
            return min(conf["max_seq_length"], positions)
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        n = _json(tc, "tokenizer_config.json").get("model_max_length")
        if isinstance(n, int) and 1 <= n <= positions:
            return n
    return None


def sentence_transformers(path, max_len: int | None = None) -> Imported:
    """A sentence-transformers directory (the module docstring) -> an arch encoder model."""
    root = Path(path)
    name = f"{root} (sentence-transformers)"
    modules = _json(root / ST_MODULES, ST_MODULES, kind=None)
    if not isinstance(modules, list):
        raise ImportRefused(f"{name}: {ST_MODULES} is not a list of modules")
    kinds = [_module_kind(e, name) for e in sorted(
        modules, key=lambda e: e.get("idx", 0) if isinstance(e, dict) else 0)]
    order = [k for k, _ in kinds]
    if order not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ImportRefused(f"{name}: modules {order}; mpc3 imports Transformer, Pooling and "
                            f"an optional Normalize, in that order")
    cst = root / "config_sentence_transformers.json"
    if cst.is_file() and _json(cst, cst.name).get("default_prompt_name"):
        raise ImportRefused(f"{name}: a default prompt (default_prompt_name) is not "
                            f"supported: mpc3 embeds the text as given")
    tdir = _inside(root, kinds[0][1], name)
    conf, tensors = read_checkpoint(tdir)
    arch = conf.get("architectures") or ["BertModel"]
    if conf.get("model_type") != "bert" or "BertModel" not in arch:
        raise ImportRefused(f"{name}: its Transformer module is {conf.get('model_type')!r} "
                            f"{arch}; mpc3 imports a BertModel encoder")
    pool = st_pooling(_json(_inside(root, kinds[1][1], name) / "config.json",
                            "the Pooling config"),
                      conf.get("hidden_size"), name)
    cfg, w, user, notes = bert({**conf, "architectures": arch}, tensors, name, pool,
                               len(kinds) == 3)
    default = st_max_len(tdir, cfg.max_len)
    cfg = check_ceilings(cap_max_len(cfg, user, max_len if max_len is not None else default,
                                     name), name)
    text = tokenizer_text(tdir, cfg.src_vocab, name, True, notes)
    return Imported(cfg, w, user, notes, text)


# --------------------------------------------------------------------------- any format ----
def import_checkpoint(path, fmt: str = "auto", pool: str | None = None,
                      normalize: bool | None = None, max_len: int | None = None) -> Imported:
    """Any Hugging Face layout (``auto``, ``hf-bert``, ``hf-gpt2``, ``hf-llama``,
    ``sentence-transformers``) with its tokenizer and class names; ``pool`` /
    ``normalize`` (a BertModel), ``max_len`` (:func:`.hf_import.cap_max_len`)."""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "sentence-transformers":
        if not (Path(path) / ST_MODULES).is_file():
            raise ValueError(f"{path}: no {ST_MODULES} (a directory as "
                             f"SentenceTransformer.save writes it)")
        if pool is not None or normalize is not None:
            raise ImportRefused(f"{path}: a sentence-transformers directory's modules.json "
                                f"sets its pooling and normalization (leave out --pool, "
                                f"--normalize)")
        return sentence_transformers(path, max_len)
    if fmt == LLAMA_FORMAT and (pool is not None or normalize is not None):
        raise ImportRefused(f"{path}: --pool and --normalize apply to a headless encoder "
                            f"(BertModel, sentence-transformers), not to LLaMA")
    cfg, w, user, notes = load_llama(path, max_len) if fmt == LLAMA_FORMAT else \
        load_hf(path, fmt, pool, normalize, max_len)
    rows = cfg.tgt_vocab if cfg.arch == "decoder-only" else cfg.src_vocab
    text = tokenizer_text(Path(path), rows, f"{path}", False, notes)
    labels = labels_of(read_checkpoint_config(path), cfg.n_classes) if cfg.n_classes else None
    return Imported(cfg, w, user, notes, text, labels)


def read_checkpoint_config(path) -> dict:
    return _json(Path(path) / "config.json", "config.json")


__all__ = ["Imported", "import_checkpoint", "read_checkpoint", "sentence_transformers",
           "st_pooling", "tokenizer_text"]
