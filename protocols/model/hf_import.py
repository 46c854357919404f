"""Checkpoints laid out like Hugging Face BERT, GPT-2 and LLaMA -> mpc3 models (``mpc3 import``).

A source is a directory as ``save_pretrained`` writes it: ``config.json`` and
``model.safetensors`` (or shards listed in ``model.safetensors.index.json``), read with mpc3's
own safetensors reader - no torch, no transformers, no pickle (a directory holding only
``pytorch_model.bin`` is refused: pickled files can run code when read). Formats
(:data:`FORMATS`; ``auto`` picks by config.json's ``model_type``):

* ``hf-bert`` - ``BertForSequenceClassification`` -> arch ``encoder-classifier``, softmax
  attention with biases, post-LN, GELU, pool ``cls-tanh`` (BERT's pooler), embedding
  ``learned-ln`` (word + position + token-type tables, then the embedding LayerNorm);
  ``BertModel`` -> arch ``encoder`` (a sentence embedding: pool mean, cls or max, optionally
  normalized; its pooler is left out, with a note);
* ``hf-gpt2`` - ``GPT2LMHeadModel`` (or ``GPT2Model``) -> arch ``decoder-only``, softmax
  attention with biases, pre-LN with the final ``ln_f``, GELU, embedding ``learned``
  (``wte`` + ``wpe``), LM head tied to ``wte`` unless the file holds its own ``lm_head``;
* ``hf-llama`` - ``LlamaForCausalLM`` -> arch ``decoder-only`` with rmsnorm, swiglu, rotary
  positions and grouped-query heads: :mod:`.llama_import` (which imports this module's
  readers, so :func:`.st_import.import_checkpoint` calls it, not :func:`load_hf`);
* ``sentence-transformers`` (a directory with ``modules.json``) and the checkpoints'
  tokenizers: :mod:`.st_import`. ``--max-len`` (:func:`cap_max_len`) applies to every one.

Name mapping (torch ``nn.Linear`` stores (out, in) and is transposed; GPT-2's ``Conv1D``
stores (in, out) and is taken as it is, ``c_attn`` split into q | k | v columns):

==========================================  ====================================  ==========
Hugging Face (``bert.`` / ``transformer.``)  mpc3                                   side
==========================================  ====================================  ==========
embeddings.word_embeddings / wte            embed.src / embed.tgt                  user
embeddings.position_embeddings / wpe        embed.pos                              user
embeddings.token_type_embeddings            embed.type                             user
embeddings.LayerNorm                        embed.ln.gamma, embed.ln.beta          user
lm_head (tied: wte), transposed             out.w; out.b = 0                       user
encoder.layer.i.attention.self.query ...    enc.i.attn.wq, bq (wk, bk, wv, bv)     shared
encoder.layer.i.attention.output.dense      enc.i.attn.wo, bo                      shared
encoder.layer.i.attention.output.LayerNorm  enc.i.ln1                              shared
encoder.layer.i.intermediate.dense          enc.i.ffn.w1, b1                       shared
encoder.layer.i.output.dense / LayerNorm    enc.i.ffn.w2, b2 / enc.i.ln2           shared
pooler.dense / classifier                   pool.w, pool.b / head.w, head.b        shared
h.i.attn.c_attn / c_proj                    dec.i.self.wq|wk|wv, bq|bk|bv / wo, bo shared
h.i.ln_1 / ln_2 / ln_f                      dec.i.ln1 / dec.i.ln2 / dec.final_ln   shared
h.i.mlp.c_fc / c_proj                       dec.i.ffn.w1, b1 / w2, b2              shared
==========================================  ====================================  ==========

What the query user holds follows the threat model (README): the tables that turn its tokens
into the first layer's input (including, for BERT, the embedding LayerNorm, which runs on the
user's plaintext) and the LM head; the owner reveals them by handing them out.

Refused, naming the feature: any activation but relu / gelu / gelu_new / gelu_pytorch_tanh,
relative position embeddings, cross-attention or decoder use of BERT, GPT-2's
``scale_attn_by_inverse_layer_idx`` or unscaled scores, heads and tensors of other tasks
(masked-LM, sequence classification on GPT-2, ...), tensors of unexpected shape.

GELU: ``gelu_new`` / ``gelu_pytorch_tanh`` (GPT-2's default) are the tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); mpc3 computes the exact-erf GELU, which
differs from it by at most :data:`GELU_TANH_GAP` = 4.8e-4 (at |x| ~ 2.7; measured on a 2e6
point grid of [-10, 10]) - below the secure kernel's own 6e-4 error, so such models are
imported with that difference stated in the import's notes, not refused.
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from .config import (CEILINGS, DECODER_ONLY, ENCODER, ENCODER_CLASSIFIER, ModelConfig,
                     check_ceilings)
from .files import Budget, FileLimits, ModelFileError, limits, read_json
from .safetensors import SafetensorsFile
from .weights import Weights, validate_user

FORMATS = ("mpc3", "hf-bert", "hf-gpt2", "hf-llama", "sentence-transformers")
#: The file sentence-transformers writes at the top of a model directory (its modules).
ST_MODULES = "modules.json"
HF_MODEL_TYPES = {"bert": "hf-bert", "gpt2": "hf-gpt2", "llama": "hf-llama"}
#: max |GELU_tanh(x) - GELU_erf(x)| over all x (4.73e-4 at |x| = 2.70).
GELU_TANH_GAP = 4.8e-4
_ACTS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
#: The config sizes checked as soon as the config is read (max_len after --max-len), and
#: the config.json keys they come from.
_SIZES = tuple(k for k in CEILINGS if k != "max_len")
_BERT_KEYS = {"d_model": "hidden_size", "n_heads": "num_attention_heads",
              "n_enc_layers": "num_hidden_layers", "d_ff": "intermediate_size",
              "src_vocab": "vocab_size", "type_vocab": "type_vocab_size",
              "n_classes": "num_labels / id2label", "max_len": "max_position_embeddings"}
_GPT2_KEYS = {"d_model": "n_embd", "n_heads": "n_head", "n_dec_layers": "n_layer",
              "d_ff": "n_inner", "tgt_vocab": "vocab_size", "max_len": "n_positions"}


class ImportRefused(ValueError):
    """The checkpoint uses a feature mpc3 cannot run (the message names it)."""


def detect_format(path) -> str:
    """``sentence-transformers`` for a directory with modules.json, ``hf-bert`` /
    ``hf-gpt2`` / ``hf-llama`` for a save_pretrained directory (by ``model_type``), else
    ``mpc3`` (an mpc3 .npz or .safetensors file)."""
    p = Path(path)
    if not p.is_dir():
        return "mpc3"
    if (p / ST_MODULES).is_file():
        return "sentence-transformers"
    conf = _read_config(p)
    kind = conf.get("model_type")
    if not isinstance(kind, str) or kind not in HF_MODEL_TYPES:
        raise ImportRefused(f"{p}: model_type {kind!r} is not supported (importable: "
                            f"{', '.join(sorted(HF_MODEL_TYPES))}, as "
                            f"{' / '.join(HF_MODEL_TYPES.values())})")
    return HF_MODEL_TYPES[kind]


def _read_config(p: Path) -> dict:
    f = p / "config.json"
    if not f.is_file():
        raise ValueError(f"{p}: no config.json (a directory as save_pretrained writes it)")
    return read_json(f, "config.json")


def _shard_names(index: Path, lim: FileLimits) -> list[str]:
    """The shard files an index.json lists: plain file names in its directory."""
    weight_map = read_json(index, "shard index", lim).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise ModelFileError(f"{index}: weight_map is not an object of file names")
    shards = sorted(set(weight_map.values()))
    for name in shards:
        if os.path.basename(name) != name or name in ("", ".", "..") or "\\" in name:
            raise ModelFileError(f"{index}: shard {name[:80]!r} is not a file name in "
                                 f"{index.parent} (no directories, no '..', no absolute "
                                 f"paths)")
    return shards


def checkpoint_files(path, lim: FileLimits | None = None) -> list[SafetensorsFile]:
    """The safetensors files of a save_pretrained directory, every header checked and the
    model's ceilings (:class:`.files.FileLimits`) applied over all of them before any
    tensor is read; the caller closes them (:func:`read_checkpoint` reads them all)."""
    p, lim = Path(path), limits(lim)
    single, index = p / "model.safetensors", p / "model.safetensors.index.json"
    if single.exists() or single.is_symlink():
        names = [single.name]
    elif index.exists() or index.is_symlink():
        names = _shard_names(index, lim)
    elif any((p / n).exists() for n in ("pytorch_model.bin", "model.bin", "tf_model.h5")):
        raise ImportRefused(f"{p}: only a pickled/TF checkpoint is there; mpc3 reads "
                            f"safetensors only (re-save with model.save_pretrained(dir), "
                            f"whose default is safetensors)")
    else:
        raise ValueError(f"{p}: no model.safetensors or model.safetensors.index.json")
    budget, files, seen = Budget(p, lim), [], {}
    try:
        for name in names:
            if not ((p / name).exists() or (p / name).is_symlink()):
                raise ModelFileError(f"{p}: its shard index lists {name[:80]!r}, which is not "
                                     f"in the directory")
            files.append(SafetensorsFile(p / name, lim, budget))
            for t in files[-1].names:
                if seen.setdefault(t, name) != name:
                    raise ModelFileError(f"{p}: tensor {t[:80]!r} is in both {seen[t]} and "
                                         f"{name}")
    except BaseException:
        for f in files:
            f.close()
        raise
    return files


def read_checkpoint(path, lim: FileLimits | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, tensors) of a save_pretrained directory (single or sharded
    safetensors, :func:`checkpoint_files`)."""
    conf = _read_config(Path(path))
    tensors: dict[str, np.ndarray] = {}
    files = checkpoint_files(path, lim)
    try:
        for f in files:
            tensors.update({name: f.read(name) for name in f.names})
    finally:
        for f in files:
            f.close()
    return conf, tensors


def _check_layers(layers, tensors: dict, pattern: str, key: str, name: str) -> None:
    """A config's layer count is at most the layers whose tensors the checkpoint holds."""
    have = len({m.group(1) for k in tensors for m in [re.search(pattern, k)] if m})
    if isinstance(layers, int) and layers > have:
        raise ImportRefused(f"{name}: config.json {key}={layers} but the checkpoint holds "
                            f"tensors of {have} layers")


class _Tensors:
    """The checkpoint's tensors under one prefix; every tensor must be taken (or ignored)."""

    def __init__(self, tensors: dict, prefix: str, ignore: tuple[str, ...], what: str):
        self.t = {}
        for k, v in tensors.items():
            k = k[len(prefix):] if k.startswith(prefix) else k
            k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                          "LayerNorm.bias")
            if not any(k.endswith(s) for s in ignore):
                self.t[k] = v
        self.what = what

    def has(self, name: str) -> bool:
        return name in self.t

    def take(self, name: str, shape: tuple) -> np.ndarray:
        if name not in self.t:
            raise ImportRefused(f"{self.what}: tensor {name!r} is missing")
        a = np.asarray(self.t.pop(name), dtype=np.float64)
        if a.shape != tuple(shape):
            raise ImportRefused(f"{self.what}: tensor {name!r} has shape {a.shape}, expected "
                                f"{tuple(shape)}")
        return a

    def linear(self, name: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
        """torch nn.Linear ``name``: (x @ W, b) form, W transposed to (in, out)."""
        return self.take(f"{name}.weight", (n_out, n_in)).T.copy(), \
            self.take(f"{name}.bias", (n_out,))

    def layernorm(self, name: str, d: int) -> tuple[np.ndarray, np.ndarray]:
        return self.take(f"{name}.weight", (d,)), self.take(f"{name}.bias", (d,))

    def done(self) -> None:
        if self.t:
            left = sorted(self.t)
            more = " ..." if len(left) > 6 else ""
            raise ImportRefused(f"{self.what}: tensor(s) {left[:6]}{more} are not part of "
                                f"what mpc3 imports (other heads or features are not "
                                f"supported)")


def _act(conf: dict, key: str, notes: list[str]) -> str:
    act = conf.get(key, "gelu")
    if not isinstance(act, str) or act not in _ACTS:
        raise ImportRefused(f"activation {key}={act!r} is not supported (mpc3 FFN "
                            f"activations: relu, gelu; accepted names {sorted(_ACTS)})")
    if act in _TANH_GELUS:
        notes.append(f"GELU: the checkpoint's {act} (tanh approximation) runs as exact-erf "
                     f"GELU, at most {GELU_TANH_GAP:g} apart per activation")
    return _ACTS[act]


def _heads(d: int, h: int) -> int:
    if h < 1 or d % h:
        raise ImportRefused(f"hidden size {d} is not divisible by {h} attention heads")
    return d // h


def _common(d: int, h: int, d_ff: int, max_len: int, eps: float) -> dict:
    """Config keys that do not matter for softmax attention take neutral values
    (n_features 1, attn_c 1, attn_norm const)."""
    return dict(d_model=d, n_heads=h, d_head=_heads(d, h), n_features=1, d_ff=d_ff,
                attn_c=1.0, attn_norm="const", max_len=max_len, ln_eps=float(eps),
                attention="softmax", attn_bias=True)


def _sizes(conf: dict, name: str, **keys) -> list:
    """config.json's values of ``keys`` (key=default, ``...`` for a required key), each an
    int >= 0 (None allowed where the default is None), or ImportRefused naming the key."""
    out = []
    for key, default in keys.items():
        if default is ... and key not in conf:
            raise ImportRefused(f"{name}: config.json has no {key}")
        v = conf.get(key, None if default is ... else default)
        if v is None and default is None:
            out.append(v)
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ImportRefused(f"{name}: config.json {key}={str(v)[:40]} is not an integer "
                                f">= 0")
        out.append(v)
    return out


def _eps(conf: dict, key: str, default: float, name: str) -> float:
    v = conf.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ImportRefused(f"{name}: config.json {key}={str(v)[:40]} is not a number")
    return float(v)


def _refuse_flags(conf: dict, flags: dict) -> None:
    for key, (bad, feature) in flags.items():
        if key in conf and bad(conf[key]):
            raise ImportRefused(f"{feature} ({key}={conf[key]!r}) is not supported")


# ------------------------------------------------------------------------------ BERT ----
#: BERT architectures mpc3 imports: the classifier (encoder, pooler, head) and the headless
#: encoder (BertModel: sentence embeddings, the pooler ignored).
BERT_ARCHS = ("BertForSequenceClassification", "BertModel")


def bert(conf: dict, tensors: dict, name: str = "BERT", pool: str | None = None,
         normalize: bool | None = None) -> tuple:
    """(cfg, weights, user, notes) of a BertForSequenceClassification checkpoint (arch
    encoder-classifier) or a BertModel (arch encoder: ``pool`` mean (default) / cls / max,
    ``normalize``; its pooler tensors are left out, with a note)."""
    if conf.get("model_type") != "bert":
        raise ImportRefused(f"{name}: model_type {conf.get('model_type')!r} is not 'bert'")
    arch = conf.get("architectures") or ["BertForSequenceClassification"]
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        raise ImportRefused(f"{name}: config.json architectures is not a list of names")
    headless = "BertModel" in arch
    if not set(BERT_ARCHS) & set(arch):
        raise ImportRefused(f"{name}: architecture {arch} is not supported (mpc3 imports "
                            f"BertForSequenceClassification: encoder, pooler, classifier; "
                            f"BertModel: a sentence-embedding encoder)")
    if not headless and (pool is not None or normalize is not None):
        raise ImportRefused(f"{name}: --pool and --normalize apply to a headless encoder "
                            f"(BertModel, sentence-transformers), not to {arch[0]}")
    _refuse_flags(conf, {
        "position_embedding_type": (lambda v: v != "absolute", "relative position embeddings"),
        "is_decoder": (bool, "BERT as a decoder (causal attention)"),
        "add_cross_attention": (bool, "cross-attention")})
    notes: list[str] = []
    d, h, L, f, V, P, T = _sizes(
        conf, name, hidden_size=..., num_attention_heads=..., num_hidden_layers=...,
        intermediate_size=..., vocab_size=..., max_position_embeddings=..., type_vocab_size=2)
    _check_layers(L, tensors, r"^(?:bert\.)?encoder\.layer\.(\d+)\.", "num_hidden_layers",
                  name)
    common = dict(**_common(d, h, f, P, _eps(conf, "layer_norm_eps", 1e-12, name)),
                  norm_first=False, n_enc_layers=L, src_vocab=V,
                  ffn_act=_act(conf, "hidden_act", notes),
                  embedding="learned-ln", type_vocab=T)
    if headless:
        cfg = ModelConfig(**common, arch=ENCODER, pool=pool or "mean",
                          normalize=bool(normalize)).validate()
        ignore = ("embeddings.position_ids", "embeddings.token_type_ids", "pooler.dense.weight",
                  "pooler.dense.bias")
        if any(k.endswith("pooler.dense.weight") for k in tensors):
            notes.append("BertModel's pooler (pooler.dense, the [CLS]-tanh layer) is not part "
                         f"of a sentence embedding: left out (pool {cfg.pool})")
    else:
        if conf.get("id2label") and not isinstance(conf["id2label"], dict):
            raise ImportRefused(f"{name}: config.json id2label is not an object")
        C = len(conf["id2label"]) if conf.get("id2label") else _sizes(conf, name,
                                                                       num_labels=2)[0]
        cfg = ModelConfig(**common, arch=ENCODER_CLASSIFIER, n_classes=C,
                          pool="cls-tanh").validate()
        ignore = ("embeddings.position_ids", "embeddings.token_type_ids")
    check_ceilings(cfg, name, _SIZES, _BERT_KEYS)
    t = _Tensors(tensors, "bert.", ignore, name)
    if not headless and not t.has("classifier.weight"):
        raise ImportRefused(f"{name}: no classifier head (classifier.weight): import a "
                            f"BertForSequenceClassification checkpoint")
    user = {"embed.src": t.take("embeddings.word_embeddings.weight", (V, d)),
            "embed.pos": t.take("embeddings.position_embeddings.weight", (P, d))}
    if T:
        user["embed.type"] = t.take("embeddings.token_type_embeddings.weight", (T, d))
    user["embed.ln.gamma"], user["embed.ln.beta"] = t.layernorm("embeddings.LayerNorm", d)
    w = Weights()
    for i in range(L):
        src, dst = f"encoder.layer.{i}", f"enc.{i}"
        for hf, q in (("query", "q"), ("key", "k"), ("value", "v")):
            w[f"{dst}.attn.w{q}"], w[f"{dst}.attn.b{q}"] = \
                t.linear(f"{src}.attention.self.{hf}", d, d)
        w[f"{dst}.attn.wo"], w[f"{dst}.attn.bo"] = t.linear(f"{src}.attention.output.dense", d, d)
        w[f"{dst}.ln1.gamma"], w[f"{dst}.ln1.beta"] = \
            t.layernorm(f"{src}.attention.output.LayerNorm", d)
        w[f"{dst}.ffn.w1"], w[f"{dst}.ffn.b1"] = t.linear(f"{src}.intermediate.dense", d, f)
        w[f"{dst}.ffn.w2"], w[f"{dst}.ffn.b2"] = t.linear(f"{src}.output.dense", f, d)
        w[f"{dst}.ln2.gamma"], w[f"{dst}.ln2.beta"] = t.layernorm(f"{src}.output.LayerNorm", d)
    if not headless:
        if not t.has("pooler.dense.weight"):
            raise ImportRefused(f"{name}: no pooler (pooler.dense): mpc3 imports BERT's "
                                f"[CLS]-tanh pooling")
        w["pool.w"], w["pool.b"] = t.linear("pooler.dense", d, d)
        w["head.w"], w["head.b"] = t.linear("classifier", d, cfg.n_classes)
    t.done()
    w.validate(cfg)
    validate_user(cfg, user)
    return cfg, w, user, notes


def labels_of(conf: dict, n_classes: int) -> list[str] | None:
    """A classifier's class names from config.json's ``id2label`` (None when it has none
    for every class)."""
    names = conf.get("id2label")
    if not isinstance(names, dict):
        return None
    got = [names.get(str(i), names.get(i)) for i in range(n_classes)]
    return [str(v) for v in got] if all(v is not None for v in got) else None


# ----------------------------------------------------------------------------- GPT-2 ----
def gpt2(conf: dict, tensors: dict, name: str = "GPT-2") -> tuple:
    """(cfg, weights, user, notes) of a GPT2LMHeadModel (or GPT2Model) checkpoint."""
    if conf.get("model_type") != "gpt2":
        raise ImportRefused(f"{name}: model_type {conf.get('model_type')!r} is not 'gpt2'")
    arch = conf.get("architectures") or ["GPT2LMHeadModel"]
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        raise ImportRefused(f"{name}: config.json architectures is not a list of names")
    if not {"GPT2LMHeadModel", "GPT2Model"} & set(arch):
        raise ImportRefused(f"{name}: architecture {arch} is not supported (mpc3 imports "
                            f"GPT2LMHeadModel / GPT2Model as a decoder-only LM)")
    _refuse_flags(conf, {
        "scale_attn_by_inverse_layer_idx": (bool, "attention scaled by 1 / layer index"),
        "scale_attn_weights": (lambda v: not v, "unscaled attention scores"),
        "add_cross_attention": (bool, "cross-attention")})
    notes: list[str] = []
    d, h, L, V, P, f = _sizes(conf, name, n_embd=..., n_head=..., n_layer=..., vocab_size=...,
                              n_positions=..., n_inner=None)
    f = f or 4 * d
    _check_layers(L, tensors, r"^(?:transformer\.)?h\.(\d+)\.", "n_layer", name)
    cfg = ModelConfig(**_common(d, h, f, P, _eps(conf, "layer_norm_epsilon", 1e-5, name)),
                      norm_first=True, arch=DECODER_ONLY, n_dec_layers=L, tgt_vocab=V,
                      ffn_act=_act(conf, "activation_function", notes),
                      embedding="learned").validate()
    check_ceilings(cfg, name, _SIZES, _GPT2_KEYS)
    t = _Tensors(tensors, "transformer.", (".attn.bias", ".attn.masked_bias"), name)
    wte = t.take("wte.weight", (V, d))
    head = t.take("lm_head.weight", (V, d)) if t.has("lm_head.weight") else wte
    user = {"embed.tgt": wte, "embed.pos": t.take("wpe.weight", (P, d)),
            "out.w": head.T.copy(), "out.b": np.zeros(V)}

    def conv1d(src, n_in, n_out):          # Conv1D: weight (in, out), x @ W + b
        shape = t.t[f"{src}.weight"].shape if t.has(f"{src}.weight") else None
        if shape == (n_out, n_in) != (n_in, n_out):
            raise ImportRefused(f"{name}: {src}.weight is (out, in) = ({n_out}, {n_in}): "
                                f"GPT-2 stores Conv1D weights as (in, out)")
        return t.take(f"{src}.weight", (n_in, n_out)), t.take(f"{src}.bias", (n_out,))

    w = Weights()
    for i in range(L):
        src, dst = f"h.{i}", f"dec.{i}"
        W, b = conv1d(f"{src}.attn.c_attn", d, 3 * d)
        for j, q in enumerate("qkv"):
            w[f"{dst}.self.w{q}"] = W[:, j * d:(j + 1) * d]
            w[f"{dst}.self.b{q}"] = b[j * d:(j + 1) * d]
        w[f"{dst}.self.wo"], w[f"{dst}.self.bo"] = conv1d(f"{src}.attn.c_proj", d, d)
        w[f"{dst}.ln1.gamma"], w[f"{dst}.ln1.beta"] = t.layernorm(f"{src}.ln_1", d)
        w[f"{dst}.ffn.w1"], w[f"{dst}.ffn.b1"] = conv1d(f"{src}.mlp.c_fc", d, f)
        w[f"{dst}.ffn.w2"], w[f"{dst}.ffn.b2"] = conv1d(f"{src}.mlp.c_proj", f, d)
        w[f"{dst}.ln2.gamma"], w[f"{dst}.ln2.beta"] = t.layernorm(f"{src}.ln_2", d)
    w["dec.final_ln.gamma"], w["dec.final_ln.beta"] = t.layernorm("ln_f", d)
    t.done()
    w.validate(cfg)
    validate_user(cfg, user)
    return cfg, w, user, notes


def cap_max_len(cfg: ModelConfig, user: dict, max_len: int | None,
                name: str) -> ModelConfig:
    """``--max-len``: the model takes at most ``max_len`` tokens; its learned position
    table is cut to that many rows (``user`` is changed). Refuses more positions than the
    checkpoint has."""
    if max_len is None:
        return cfg
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ImportRefused(f"{name}: --max-len {max_len!r} must be an integer >= 1")
    if max_len > cfg.max_len:
        raise ImportRefused(f"{name}: --max-len {max_len} exceeds the checkpoint's "
                            f"{cfg.max_len} positions")
    if "embed.pos" in user:
        user["embed.pos"] = np.ascontiguousarray(user["embed.pos"][:max_len])
    return replace(cfg, max_len=max_len).validate()


def load_hf(path, fmt: str = "auto", pool: str | None = None, normalize: bool | None = None,
            max_len: int | None = None) -> tuple[ModelConfig, Weights, dict, list[str]]:
    """(cfg, weights, user tensors, notes) of a save_pretrained directory in ``fmt``
    (``auto``, ``hf-bert``, ``hf-gpt2``); ``pool`` / ``normalize``: a BertModel's sentence
    embedding; ``max_len``: :func:`cap_max_len`. :class:`ImportRefused` names an
    unsupported feature. (A sentence-transformers or LLaMA directory, and the tokenizer of
    any: :func:`protocols.model.st_import.import_checkpoint`.)"""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in ("hf-bert", "hf-gpt2"):
        raise ValueError(f"format {fmt!r}: load_hf reads hf-bert, hf-gpt2 (every format: "
                         f"protocols.model.st_import.import_checkpoint)")
    if not Path(path).is_dir():
        raise ValueError(f"{path}: format {fmt} reads a directory (config.json + "
                         f"model.safetensors, as save_pretrained writes it)")
    conf, tensors = read_checkpoint(path)
    name = f"{path} ({fmt})"
    if fmt == "hf-bert":
        cfg, w, user, notes = bert(conf, tensors, name, pool, normalize)
    elif pool is not None or normalize is not None:
        raise ImportRefused(f"{name}: --pool and --normalize apply to a headless encoder "
                            f"(BertModel, sentence-transformers), not to GPT-2")
    else:
        cfg, w, user, notes = gpt2(conf, tensors, name)
    keys = _BERT_KEYS if fmt == "hf-bert" else _GPT2_KEYS
    return check_ceilings(cap_max_len(cfg, user, max_len, name), name, source=keys), w, user, \
        notes
