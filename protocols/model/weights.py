"""MPC weights: the :class:`Weights` container, random (Xavier) weights and Omega for tests and
benchmarks, and the model file format.

Omega
-----
``omega`` has shape ``(n_heads, d_head, r)``; the ``r`` columns of ``Omega_h``
are random features: Gaussian vectors drawn in blocks of ``d_head``, each block
orthogonalised by Gram-Schmidt (the last block is partial when ``d_head`` does
not divide ``r``) and every row rescaled to the norm of an independent Gaussian
vector (Performer "orthogonal random features").  Omega is fixed (not trained)
but owned by the model owner and secret-shared like any weight.

File format (``.npz``, format version 1)
---------------------------------------
One ``np.savez`` archive (no pickled objects; read with ``allow_pickle=False``):

* ``"format"``: int64 array ``[1]``;
* ``"config.json"``: uint8 array holding the UTF-8 JSON of
  :meth:`ModelConfig.to_dict`;
* every MPC weight tensor under its name (``enc.0.attn.wq`` ...), float64;
* optionally the query-user tensors of its architecture (``embed.src``, ``embed.tgt``,
  ``out.w``, ``out.b`` for an encoder-decoder; see :func:`expected_user_shapes`), float64;
* optionally (models imported from Hugging Face / sentence-transformers, the query user's
  side of text in and out) ``"tokenizer.json"``: uint8 array holding the checkpoint's
  tokenizer (the ``tokenizers`` library's JSON, :func:`load_tokenizer`), and
  ``"labels.json"``: uint8 array holding the JSON list of a classifier's class names
  (Hugging Face ``id2label``, :func:`load_labels`). Files without them load as before.

Tensor names and shapes are given by :func:`expected_shapes` /
:func:`expected_user_shapes`.
"""
from __future__ import annotations

import json
import math
import os
import weakref
import zipfile
from collections.abc import MutableMapping
from typing import Callable, Mapping

import numpy as np

from .config import ModelConfig, check_layers, expected_shapes, expected_user_shapes
from .files import FileLimits, NpzReader, parse_json

FORMAT_VERSION = 1
USER_NAMES = ("embed.src", "embed.tgt", "out.w", "out.b", "embed.pos", "embed.type",
              "embed.ln.gamma", "embed.ln.beta")
_META_KEYS = ("format", "config.json")
#: Optional public entries beside config.json (UTF-8 JSON as uint8 arrays).
TOKENIZER_KEY, LABELS_KEY = "tokenizer.json", "labels.json"
_TEXT_KEYS = (TOKENIZER_KEY, LABELS_KEY)


def _check_values(name: str, a: np.ndarray) -> None:
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"tensor {name!r} has non-numeric dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"tensor {name!r} contains non-finite values")


def _shape(tensors: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    """A tensor's shape, without reading one that is read on demand."""
    return tensors.shape(name) if isinstance(tensors, OnDemandTensors) else \
        tuple(np.shape(tensors[name]))


def _check_tensors(tensors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple], what: str):
    """Names and shapes, and (tensors in memory) values; a :class:`OnDemandTensors` checks each
    tensor's values whenever it reads it, so it is not read here."""
    for name, shape in shapes.items():
        if name not in tensors:
            raise ValueError(f"missing tensor {name!r}")
        got = _shape(tensors, name)
        if got != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {got}, expected {tuple(shape)}")
        if not isinstance(tensors, OnDemandTensors):
            _check_values(name, np.asarray(tensors[name]))
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise ValueError(f"unexpected {what} tensor(s): {extra}")


class OnDemandTensors(MutableMapping):
    """name -> float64 tensor, read (from a model file, ``load_model(..., lazy=True)``) or
    drawn (``random_weights(..., lazy=True)``) when asked for and not kept: a model shared
    this way is held one tensor at a time. Every read is checked (shape, numeric dtype,
    finite values) and converted to float64; tensors set afterwards are held in memory.
    ``close``: called when the mapping is collected (the file's reader)."""

    def __init__(self, shapes: Mapping[str, tuple], read: Callable[[str], np.ndarray],
                 where: str, close: Callable[[], None] | None = None) -> None:
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self._read, self.where, self._held = read, where, {}
        if close is not None:
            weakref.finalize(self, close)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._held:
            return self._held[name]
        if name not in self.shapes:
            raise KeyError(name)
        a = np.asarray(self._read(name))
        if a.shape != self.shapes[name]:
            raise ValueError(f"{self.where}: tensor {name!r} now has shape {a.shape}, not "
                             f"{self.shapes[name]} (the file changed while read?)")
        _check_values(name, a)
        return a.astype(np.float64, copy=False)

    def __setitem__(self, name: str, value) -> None:
        self._held[name] = np.asarray(value, dtype=np.float64)
        self.shapes[name] = self._held[name].shape

    def __delitem__(self, name: str) -> None:
        del self.shapes[name]
        self._held.pop(name, None)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __contains__(self, name) -> bool:
        return name in self.shapes


class Weights:
    """MPC-side model weights: name -> float64 array (see :func:`expected_shapes`), held in
    memory or read from the model file when used (:class:`OnDemandTensors`)."""

    def __init__(self, tensors: Mapping[str, np.ndarray] | None = None):
        self.tensors: MutableMapping[str, np.ndarray] = tensors if isinstance(
            tensors, OnDemandTensors) else {k: np.asarray(v, dtype=np.float64)
                                        for k, v in (tensors or {}).items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def __setitem__(self, name: str, value) -> None:
        self.tensors[name] = np.asarray(value, dtype=np.float64)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    def sub(self, prefix: str) -> dict[str, np.ndarray]:
        """Tensors below ``prefix`` with the prefix stripped (``sub('enc.0.ffn')['w1']``)."""
        p = prefix + "."
        return {k[len(p):]: self.tensors[k] for k in self.tensors if k.startswith(p)}

    def validate(self, cfg: ModelConfig) -> "Weights":
        cfg.validate()
        _check_tensors(self.tensors, expected_shapes(cfg), "weight")
        return self

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape (without reading it from its file)."""
        return _shape(self.tensors, name)

    def n_params(self) -> int:
        return int(sum(math.prod(self.shape(k)) for k in self.tensors))


def validate_user(cfg: ModelConfig, user: Mapping[str, np.ndarray]) -> None:
    _check_tensors(user, expected_user_shapes(cfg), "user")


# --------------------------------------------------------------------------- init


def orthogonal_features(rng: np.random.Generator, d_head: int, r: int) -> np.ndarray:
    """Omega_h of shape (d_head, r): column k is feature vector omega_k.

    Gaussian blocks of ``d_head`` vectors orthogonalised with (modified)
    Gram-Schmidt; the last block holds ``r mod d_head`` vectors; each vector
    is rescaled to the norm of an independent N(0, I_{d_head}) sample.
    """
    rows = []
    remaining = r
    while remaining > 0:
        k = min(d_head, remaining)
        g = rng.standard_normal((k, d_head))
        basis: list[np.ndarray] = []
        for v in g:
            v = v.copy()
            for b in basis:
                v -= (v @ b) * b
            v /= np.linalg.norm(v)
            basis.append(v)
        rows.extend(basis)
        remaining -= k
    block = np.stack(rows)  # (r, d_head), orthonormal within blocks
    norms = np.linalg.norm(rng.standard_normal((r, d_head)), axis=1)
    return (block * norms[:, None]).T.copy()


def make_omega(cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    return np.stack([orthogonal_features(rng, cfg.d_head, cfg.n_features)
                     for _ in range(cfg.n_heads)])


def _random_tensor(cfg: ModelConfig, name: str, shape: tuple, rng: np.random.Generator
                   ) -> np.ndarray:
    leaf = name.rsplit(".", 1)[1]
    if leaf == "omega":
        return make_omega(cfg, rng)
    if leaf in ("wq", "wk", "wv", "wo", "w1", "w2", "w"):
        return rng.standard_normal(shape) * math.sqrt(2.0 / (shape[0] + shape[1]))
    if leaf in ("gamma", "bn_gamma"):
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if leaf in ("var", "bn_var"):    # BatchNorm running variance (norm batchnorm, ffn_bn)
        return 0.5 + rng.random(shape)
    if name.endswith((".ffn.alpha", ".ffn.beta")):    # AERO's FFN scales (ffn_scale)
        return 1.0 + rng.random(shape)
    return 0.1 * rng.standard_normal(shape)   # beta, mean, b1, b2, b, bq, bk, bv, bo


def random_weights(cfg: ModelConfig, seed: int = 0, lazy: bool = False) -> Weights:
    """Random (Xavier-scaled) weights for tests/benchmarks; activations stay O(1).
    ``lazy``: each tensor drawn when used from its own generator (seeded by ``seed`` and its
    index; other values than the eager draw), never held: a benchmark's model owner then
    holds one tensor at a time, as when sharing a model file."""
    cfg.validate()
    shapes = expected_shapes(cfg)
    if lazy:
        index = {name: i for i, name in enumerate(shapes)}
        return Weights(OnDemandTensors(shapes, lambda name: _random_tensor(
            cfg, name, tuple(shapes[name]), np.random.default_rng([seed, index[name]])),
            f"random weights (seed {seed})"))
    rng = np.random.default_rng(seed)
    return Weights({name: _random_tensor(cfg, name, tuple(shape), rng)
                    for name, shape in shapes.items()})


def random_user(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random query-user tensors of ``cfg``'s architecture (:func:`expected_user_shapes`)."""
    rng = np.random.default_rng(seed + 7919)
    d = cfg.d_model
    out = {"embed.src": rng.standard_normal((max(cfg.src_vocab, 1), d)) / math.sqrt(d),
           "embed.tgt": rng.standard_normal((max(cfg.tgt_vocab, 1), d)) / math.sqrt(d),
           "out.w": rng.standard_normal((d, max(cfg.tgt_vocab, 1)))
           * math.sqrt(2.0 / (d + cfg.tgt_vocab)),
           "out.b": np.zeros(max(cfg.tgt_vocab, 1)),
           "embed.pos": 0.5 * rng.standard_normal((cfg.max_len, d)),
           "embed.type": 0.5 * rng.standard_normal((max(cfg.type_vocab, 1), d)),
           "embed.ln.gamma": 1.0 + 0.1 * rng.standard_normal(d),
           "embed.ln.beta": 0.1 * rng.standard_normal(d)}
    return {k: out[k] for k in expected_user_shapes(cfg)}


# --------------------------------------------------------------------------- save / load


def _utf8(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def save_model(path, cfg: ModelConfig, weights: Weights, user: Mapping | None = None,
               tokenizer: str | None = None, labels: list[str] | None = None) -> None:
    """Write the model file (module docstring); ``tokenizer``: a tokenizer.json's text,
    ``labels``: the class names of a classifier (n_classes of them)."""
    cfg.validate()
    if labels is not None and len(labels) != cfg.n_classes:
        raise ValueError(f"{len(labels)} labels for a model of {cfg.n_classes} classes")
    weights.validate(cfg)
    arrays: dict[str, np.ndarray] = {
        "format": np.array([FORMAT_VERSION], dtype=np.int64),
        "config.json": np.frombuffer(json.dumps(cfg.to_dict(), sort_keys=True).encode("utf-8"),
                                     dtype=np.uint8).copy(),
    }
    if user is not None:
        validate_user(cfg, user)
    if tokenizer is not None:
        arrays[TOKENIZER_KEY] = _utf8(tokenizer)
    if labels is not None:
        arrays[LABELS_KEY] = _utf8(json.dumps([str(v) for v in labels]))
    names = [*arrays, *weights.keys(), *(expected_user_shapes(cfg) if user is not None else ())]
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for k in names:              # one tensor at a time (a lazily read model too)
                a = arrays[k] if k in arrays else np.asarray(
                    weights[k] if k in weights else user[k], dtype=np.float64)
                with zf.open(f"{k}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, a, allow_pickle=False)
                del a
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_model(path, lim: FileLimits | None = None, lazy: bool = False
               ) -> tuple[ModelConfig, Weights, dict[str, np.ndarray]]:
    """Load ``(cfg, weights, user)``; ``user`` is ``{}`` if the file has no user tensors
    (the tokenizer and labels: :func:`load_tokenizer`, :func:`load_labels`). The archive is
    read with bounded memory (:class:`.files.NpzReader`); its config is checked against its
    tensors (:func:`check_layers`) before any weight is read. ``lazy``: the weights stay in
    the file, each read when used (:class:`OnDemandTensors`: the model owner shares a model
    one tensor at a time); their names, shapes and dtypes are checked from the headers now,
    their values whenever read. The user tensors are read either way."""
    z = NpzReader(path, lim)
    try:
        for k in _META_KEYS:
            if k not in z:
                raise ValueError(f"{path}: missing entry {k!r} (not an mpc3 model file)")
        fmt = z.read("format").reshape(-1)
        if fmt.size != 1 or fmt.dtype.kind not in "iu" or int(fmt[0]) != FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported format version {fmt[:4].tolist()} "
                             f"(expected {FORMAT_VERSION})")
        raw = z.read("config.json")
        if raw.dtype != np.uint8:
            raise ValueError(f"{path}: 'config.json' must be a uint8 array")
        names = [k for k in z.names if k not in (*_TEXT_KEYS, *_META_KEYS)]
        cfg = check_layers(ModelConfig.from_dict(parse_json(raw.tobytes(), path, "config.json",
                                                            z.lim)), names, str(path))
        unknown = sorted(set(names) - set(USER_NAMES) - set(expected_shapes(cfg)))
        if unknown:
            raise ValueError(f"unexpected weight tensor(s): {unknown[:8]}")
        heads = {k: z.header(k) for k in names}
        for k, (_, dtype) in heads.items():
            if dtype.kind not in "fiu":
                raise ValueError(f"{path}: tensor {k!r} has non-numeric dtype {dtype}")
        user = {k: z.read(k).astype(np.float64) for k in USER_NAMES if k in heads}
        mpc = [k for k in names if k not in user]
        if lazy:
            w = Weights(OnDemandTensors({k: heads[k][0] for k in mpc}, z.read, str(path), z.close))
        else:
            w = Weights({k: z.read(k) for k in mpc})
    except BaseException:
        z.close()
        raise
    if not lazy:
        z.close()
    if user:
        validate_user(cfg, user)
    w.validate(cfg)
    return cfg, w, user


def text_entry(path, key: str, lim: FileLimits | None = None) -> str | None:
    """The text of an optional entry (TOKENIZER_KEY, LABELS_KEY) of a model file, or None."""
    with NpzReader(path, lim) as z:
        if key not in z:
            return None
        raw = z.read(key)
    if raw.dtype != np.uint8:
        raise ValueError(f"{path}: {key!r} must be a uint8 array")
    try:
        return raw.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: {key!r} is not UTF-8 text") from None


def load_tokenizer(path):
    """The model file's tokenizer (a ``tokenizers.Tokenizer``, padding and truncation off:
    an over-long text is refused by its user, never cut), or None when it has none."""
    text = text_entry(path, TOKENIZER_KEY)
    if text is None:
        return None
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception types
        raise ValueError(f"{path}: its tokenizer.json cannot be read: {exc}") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def load_labels(path) -> list[str] | None:
    """The class names stored with a classifier (Hugging Face ``id2label``), or None."""
    text = text_entry(path, LABELS_KEY)
    if text is None:
        return None
    labels = parse_json(text.encode("utf-8"), path, LABELS_KEY, kind=None)
    if not isinstance(labels, list) or not all(isinstance(v, str) for v in labels):
        raise ValueError(f"{path}: 'labels.json' must be a JSON list of strings")
    return labels
