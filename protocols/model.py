"""Plaintext definition of the Privformer-style transformer (single source of truth).

The MPC parties compute exactly the float64 semantics defined in this module on
secret shares.  numpy only (no torch).

Architecture
------------
Encoder-decoder transformer (Vaswani et al.) in which softmax attention is
replaced by Performer ReLU attention (Privformer Sec. 5, Eq. 12-15):

* Per head ``h`` (``d_head = d_model // n_heads``)::

      Q_h = Xq  @ W^Q[:, h*d_head:(h+1)*d_head]        (no biases anywhere in MHA)
      K_h = Xkv @ W^K[:, h-slice],  V_h = Xkv @ W^V[:, h-slice]
      Q'_h = ReLU(Q_h @ Omega_h),  K'_h = ReLU(K_h @ Omega_h)   Omega_h: (d_head, r)

  unmasked (Eq. 12):   out_h[i] = norm_i * Q'_h[i] @ (K'_h^T V_h)
  masked   (Eq. 14/15): out_h[i] = norm_i * Q'_h[i] @ G_i,  G_i = sum_{j<=i} K'_h[j]^T V_h[j]
                        (== norm * tril(Q'_h K'_h^T) V_h)

  ``norm_i = c`` for ``attn_norm == "const"`` and ``norm_i = c / n_i`` for
  ``attn_norm == "mean"``, where ``n_i`` is the (public) number of keys query
  ``i`` attends to: ``n_i = S_kv`` unmasked, ``n_i = i + 1`` (0-based ``i``)
  masked.  ``c = cfg.attn_c`` is a public constant.  Heads are concatenated
  (head-major column order) and multiplied by ``W^O``.

* FFN(x) = ReLU(x W1 + b1) W2 + b2.
* LayerNorm over the last dim: ``(x - mean) / sqrt(var + eps) * gamma + beta``
  with the biased (population) variance.
* Post-LN (``norm_first=False``, Vaswani)::

      enc: x = LN1(x + MHA(x, x));        x = LN2(x + FFN(x))
      dec: x = LN1(x + MaskedMHA(x, x));  x = LN2(x + MHA(x, enc_out));  x = LN3(x + FFN(x))

  Pre-LN (``norm_first=True``): ``x = x + sublayer(LN(x))`` (cross attention
  uses ``LN2(x)`` as query and ``enc_out`` as key/value) and a final LayerNorm
  (``enc.final_ln`` / ``dec.final_ln``) on each stack output.
* User side (never secret-shared): ``emb(tok) = embed[tok] * sqrt(d_model) +
  PE[pos]`` with the standard sinusoidal PE (:func:`positional_encoding`), and
  ``logits = h @ out.w + out.b``.

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
* optionally the query-user tensors ``embed.src``, ``embed.tgt``, ``out.w``,
  ``out.b`` (float64).

Tensor names and shapes are given by :func:`expected_shapes` /
:func:`expected_user_shapes`.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Mapping

import numpy as np

FORMAT_VERSION = 1
ATTN_NORMS = ("const", "mean")
USER_NAMES = ("embed.src", "embed.tgt", "out.w", "out.b")
_META_KEYS = ("format", "config.json")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    n_heads: int
    d_head: int
    n_features: int  # r, random features per head
    d_ff: int
    n_enc_layers: int
    n_dec_layers: int
    attn_c: float
    attn_norm: str  # "const" | "mean"
    ln_eps: float
    norm_first: bool
    src_vocab: int
    tgt_vocab: int
    max_len: int

    def validate(self) -> "ModelConfig":
        def posint(name, minimum=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an int, got {type(v).__name__} {v!r}")
            if v < minimum:
                raise ValueError(f"{name}={v} must be >= {minimum}")

        for n in ("d_model", "n_heads", "d_head", "n_features", "d_ff", "n_enc_layers",
                  "src_vocab", "tgt_vocab", "max_len"):
            posint(n)
        posint("n_dec_layers", 0)
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_head != self.d_model // self.n_heads:
            raise ValueError(f"d_head={self.d_head} must equal d_model // n_heads = "
                             f"{self.d_model} // {self.n_heads} = {self.d_model // self.n_heads}")
        if isinstance(self.attn_c, bool) or not isinstance(self.attn_c, (int, float, np.floating)):
            raise ValueError(f"attn_c must be a float, got {self.attn_c!r}")
        if not math.isfinite(float(self.attn_c)):
            raise ValueError(f"attn_c={self.attn_c} must be finite")
        if self.attn_norm not in ATTN_NORMS:
            raise ValueError(f"attn_norm={self.attn_norm!r} must be one of {ATTN_NORMS}")
        if isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, (int, float, np.floating)) \
                or not (float(self.ln_eps) > 0 and math.isfinite(float(self.ln_eps))):
            raise ValueError(f"ln_eps={self.ln_eps!r} must be a finite float > 0")
        if not isinstance(self.norm_first, (bool, np.bool_)):
            raise ValueError(f"norm_first must be a bool, got {self.norm_first!r}")
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, np.generic):
                d[k] = v.item()
        d["attn_c"] = float(d["attn_c"])
        d["ln_eps"] = float(d["ln_eps"])
        d["norm_first"] = bool(d["norm_first"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "ModelConfig":
        names = [f.name for f in fields(cls)]
        extra = sorted(set(d) - set(names))
        if extra:
            raise ValueError(f"unknown config keys: {extra}")
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"missing config keys: {missing}")
        return cls(**{n: d[n] for n in names}).validate()


# --------------------------------------------------------------------------- weights


def attn_prefixes(cfg: ModelConfig) -> list[str]:
    p = [f"enc.{i}.attn" for i in range(cfg.n_enc_layers)]
    for i in range(cfg.n_dec_layers):
        p += [f"dec.{i}.self", f"dec.{i}.cross"]
    return p


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Every MPC (secret-shared) tensor name -> exact shape."""
    d, f, h, dh, r = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head, cfg.n_features
    out: dict[str, tuple] = {}

    def attn(p):
        for n in ("wq", "wk", "wv", "wo"):
            out[f"{p}.{n}"] = (d, d)
        out[f"{p}.omega"] = (h, dh, r)

    def ln(p):
        out[f"{p}.gamma"] = (d,)
        out[f"{p}.beta"] = (d,)

    def ffn(p):
        out[f"{p}.w1"] = (d, f)
        out[f"{p}.b1"] = (f,)
        out[f"{p}.w2"] = (f, d)
        out[f"{p}.b2"] = (d,)

    for i in range(cfg.n_enc_layers):
        attn(f"enc.{i}.attn"); ln(f"enc.{i}.ln1"); ffn(f"enc.{i}.ffn"); ln(f"enc.{i}.ln2")
    for i in range(cfg.n_dec_layers):
        attn(f"dec.{i}.self"); ln(f"dec.{i}.ln1")
        attn(f"dec.{i}.cross"); ln(f"dec.{i}.ln2")
        ffn(f"dec.{i}.ffn"); ln(f"dec.{i}.ln3")
    if cfg.norm_first:
        ln("enc.final_ln")
        if cfg.n_dec_layers:
            ln("dec.final_ln")
    return out


def expected_user_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    d = cfg.d_model
    return {"embed.src": (cfg.src_vocab, d), "embed.tgt": (cfg.tgt_vocab, d),
            "out.w": (d, cfg.tgt_vocab), "out.b": (cfg.tgt_vocab,)}


def _check_tensors(tensors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple], what: str):
    for name, shape in shapes.items():
        if name not in tensors:
            raise ValueError(f"missing tensor {name!r}")
        got = tuple(np.shape(tensors[name]))
        if got != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {got}, expected {tuple(shape)}")
        a = np.asarray(tensors[name])
        if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"tensor {name!r} has non-numeric dtype {a.dtype}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"tensor {name!r} contains non-finite values")
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise ValueError(f"unexpected {what} tensor(s): {extra}")


class Weights:
    """MPC-side model weights: name -> float64 array (see :func:`expected_shapes`)."""

    def __init__(self, tensors: Mapping[str, np.ndarray] | None = None):
        self.tensors: dict[str, np.ndarray] = {
            k: np.asarray(v, dtype=np.float64) for k, v in (tensors or {}).items()}

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
        return {k[len(p):]: v for k, v in self.tensors.items() if k.startswith(p)}

    def validate(self, cfg: ModelConfig) -> "Weights":
        cfg.validate()
        _check_tensors(self.tensors, expected_shapes(cfg), "weight")
        return self

    def n_params(self) -> int:
        return int(sum(v.size for v in self.tensors.values()))


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


def random_weights(cfg: ModelConfig, seed: int = 0) -> Weights:
    """Random (Xavier-scaled) weights for tests/benchmarks; activations stay O(1)."""
    cfg.validate()
    rng = np.random.default_rng(seed)
    w = Weights()
    for name, shape in expected_shapes(cfg).items():
        leaf = name.rsplit(".", 1)[1]
        if leaf == "omega":
            w[name] = make_omega(cfg, rng)
        elif leaf in ("wq", "wk", "wv", "wo", "w1", "w2"):
            std = math.sqrt(2.0 / (shape[0] + shape[1]))
            w[name] = rng.standard_normal(shape) * std
        elif leaf == "gamma":
            w[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:  # beta, b1, b2
            w[name] = 0.1 * rng.standard_normal(shape)
    return w


def random_user(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 7919)
    d = cfg.d_model
    return {"embed.src": rng.standard_normal((cfg.src_vocab, d)) / math.sqrt(d),
            "embed.tgt": rng.standard_normal((cfg.tgt_vocab, d)) / math.sqrt(d),
            "out.w": rng.standard_normal((d, cfg.tgt_vocab)) * math.sqrt(2.0 / (d + cfg.tgt_vocab)),
            "out.b": np.zeros(cfg.tgt_vocab)}


# --------------------------------------------------------------------------- save / load


def save_model(path, cfg: ModelConfig, weights: Weights, user: Mapping | None = None) -> None:
    cfg.validate()
    weights.validate(cfg)
    arrays: dict[str, np.ndarray] = {
        "format": np.array([FORMAT_VERSION], dtype=np.int64),
        "config.json": np.frombuffer(json.dumps(cfg.to_dict(), sort_keys=True).encode("utf-8"),
                                     dtype=np.uint8).copy(),
    }
    for k, v in weights.items():
        arrays[k] = np.asarray(v, dtype=np.float64)
    if user is not None:
        validate_user(cfg, user)
        for k in USER_NAMES:
            arrays[k] = np.asarray(user[k], dtype=np.float64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(buf.getvalue())
    os.replace(tmp, path)


def load_model(path) -> tuple[ModelConfig, Weights, dict[str, np.ndarray]]:
    """Load ``(cfg, weights, user)``; ``user`` is ``{}`` if the file has no user tensors."""
    with np.load(path, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    for k in _META_KEYS:
        if k not in data:
            raise ValueError(f"{path}: missing entry {k!r} (not an mpc3 model file)")
    fmt = int(np.asarray(data.pop("format")).reshape(-1)[0])
    if fmt != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported format version {fmt} (expected {FORMAT_VERSION})")
    raw = data.pop("config.json")
    if raw.dtype != np.uint8:
        raise ValueError(f"{path}: 'config.json' must be a uint8 array")
    cfg = ModelConfig.from_dict(json.loads(raw.tobytes().decode("utf-8")))
    user = {k: data.pop(k).astype(np.float64) for k in USER_NAMES if k in data}
    if user:
        validate_user(cfg, user)
    w = Weights(data)
    w.validate(cfg)
    return cfg, w, user


# --------------------------------------------------------------------------- primitives


def positional_encoding(S: int, d: int) -> np.ndarray:
    """Standard sinusoidal PE (S, d): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    pos = np.arange(S, dtype=np.float64)[:, None]
    i2 = np.arange(0, d, 2, dtype=np.float64)
    ang = pos / np.power(10000.0, i2 / d)
    pe = np.zeros((S, d))
    pe[:, 0::2] = np.sin(ang)
    pe[:, 1::2] = np.cos(ang[:, : d // 2])
    return pe


def relu(x):
    return np.maximum(x, 0.0)


def ref_layernorm(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def ref_ffn(x, w1, b1, w2, b2):
    return relu(x @ w1 + b1) @ w2 + b2


def attn_norm(cfg: ModelConfig, n_keys) -> np.ndarray:
    """Public scale per query row: c (const) or c / n_keys (mean)."""
    n = np.asarray(n_keys, dtype=np.float64)
    if cfg.attn_norm == "const":
        return np.full(n.shape, float(cfg.attn_c))
    return float(cfg.attn_c) / n


def fold_omega(weights: Weights | Mapping, cfg: ModelConfig | None = None) -> dict[str, np.ndarray]:
    """Fold Omega into W^Q / W^K.

    Returns for every attention prefix ``p`` (``enc.0.attn``, ``dec.0.self``,
    ...) the tensors ``p.wq_omega`` and ``p.wk_omega`` of shape
    ``(d_model, n_heads * r)`` with column block ``h`` equal to
    ``W^Q[:, h-slice] @ Omega_h`` so that ``Q'_h = ReLU(X @ W^{QOmega})[..., h*r:(h+1)*r]``.

    Folding removes one matmul (and its MPC communication / truncation) per
    attention input per layer, but multiplies the size of the folded weight by
    ``r / d_head`` (``d_model x h*r`` instead of ``d_model x d_model``).
    """
    t = weights.tensors if isinstance(weights, Weights) else weights
    out = {}
    for k in sorted(t):
        if not k.endswith(".omega"):
            continue
        p = k[: -len(".omega")]
        om = np.asarray(t[k], dtype=np.float64)
        h, dh, r = om.shape
        for src, dst in (("wq", "wq_omega"), ("wk", "wk_omega")):
            W = np.asarray(t[f"{p}.{src}"], dtype=np.float64)
            out[f"{p}.{dst}"] = np.concatenate(
                [W[:, j * dh:(j + 1) * dh] @ om[j] for j in range(h)], axis=1)
    return out


def attn_params(w: Weights, prefix: str, folded: Mapping | None = None) -> dict[str, np.ndarray]:
    p = w.sub(prefix)
    if folded is not None:
        p["wq_omega"] = folded[f"{prefix}.wq_omega"]
        p["wk_omega"] = folded[f"{prefix}.wk_omega"]
    return p


def _split_heads(x, h):
    # (..., S, h*k) -> (..., h, S, k)
    *lead, S, D = x.shape
    return np.moveaxis(x.reshape(*lead, S, h, D // h), -2, -3)


def _merge_heads(x):
    # (..., h, S, k) -> (..., S, h*k)
    x = np.moveaxis(x, -3, -2)
    *lead, S, h, k = x.shape
    return x.reshape(*lead, S, h * k)


def ref_features(cfg: ModelConfig, p: Mapping, x, which: str) -> np.ndarray:
    """ReLU random features per head: (..., h, S, r) for which in {'q','k'}."""
    h = cfg.n_heads
    if f"w{which}_omega" in p:
        return _split_heads(relu(x @ p[f"w{which}_omega"]), h)
    proj = _split_heads(x @ p[f"w{which}"], h)  # (..., h, S, dh)
    return relu(np.einsum("...hsd,hdr->...hsr", proj, p["omega"]))


def ref_mha(cfg: ModelConfig, p: Mapping, xq, xkv, causal: bool = False,
            form: str = "kv", q_offset: int = 0) -> np.ndarray:
    """Multi-head ReLU attention.

    ``p`` holds ``wq, wk, wv, wo, omega`` (or folded ``wq_omega, wk_omega`` +
    ``wv, wo``).  ``xq``: (B, Sq, d), ``xkv``: (B, Sk, d).  ``causal`` requires
    Sq == Sk (query i sees keys j <= i).  ``form``: "kv" (K'^T V first, running
    sums G_i for causal, Eq. 12/15), "qk" (norm * tril(Q'K'^T) V, Eq. 14) or
    "loop" (naive per-(i, j) loop).  All forms are mathematically identical.
    """
    h = cfg.n_heads
    qf = ref_features(cfg, p, xq, "q")  # (B,h,Sq,r)
    kf = ref_features(cfg, p, xkv, "k")  # (B,h,Sk,r)
    v = _split_heads(xkv @ p["wv"], h)  # (B,h,Sk,dh)
    Sq, Sk = qf.shape[-2], kf.shape[-2]
    if causal:
        if Sq != Sk:
            raise ValueError(f"causal attention needs Sq == Sk, got {Sq} != {Sk}")
        n = np.arange(1, Sq + 1)
    else:
        n = np.full(Sq, Sk)
    scale = attn_norm(cfg, n)[:, None]  # (Sq,1)
    if form == "kv":
        if causal:
            G = np.cumsum(np.einsum("...sr,...sd->...srd", kf, v), axis=-3)  # (B,h,S,r,dh)
            o = np.einsum("...sr,...srd->...sd", qf, G)
        else:
            o = qf @ (np.swapaxes(kf, -1, -2) @ v)
    elif form == "qk":
        A = qf @ np.swapaxes(kf, -1, -2)
        if causal:
            A = np.tril(A)
        o = A @ v
    elif form == "loop":
        o = np.zeros(qf.shape[:-1] + (v.shape[-1],))
        for i in range(Sq):
            for j in range(i + 1 if causal else Sk):
                s = np.sum(qf[..., i, :] * kf[..., j, :], axis=-1)  # (B,h)
                o[..., i, :] += s[..., None] * v[..., j, :]
    else:
        raise ValueError(f"unknown attention form {form!r}")
    o = o * scale
    return _merge_heads(o) @ p["wo"]


# --------------------------------------------------------------------------- stacks


def _ln(cfg, w, prefix, x):
    return ref_layernorm(x, w[f"{prefix}.gamma"], w[f"{prefix}.beta"], cfg.ln_eps)


def _ffn(w, prefix, x):
    return ref_ffn(x, w[f"{prefix}.w1"], w[f"{prefix}.b1"], w[f"{prefix}.w2"], w[f"{prefix}.b2"])


def ref_encoder(cfg: ModelConfig, w: Weights, x, form: str = "kv", folded=None) -> np.ndarray:
    """Encoder stack: x (B, S, d) -> (B, S, d)."""
    x = np.asarray(x, dtype=np.float64)
    for i in range(cfg.n_enc_layers):
        p = attn_params(w, f"enc.{i}.attn", folded)
        if cfg.norm_first:
            u = _ln(cfg, w, f"enc.{i}.ln1", x)
            x = x + ref_mha(cfg, p, u, u, form=form)
            x = x + _ffn(w, f"enc.{i}.ffn", _ln(cfg, w, f"enc.{i}.ln2", x))
        else:
            x = _ln(cfg, w, f"enc.{i}.ln1", x + ref_mha(cfg, p, x, x, form=form))
            x = _ln(cfg, w, f"enc.{i}.ln2", x + _ffn(w, f"enc.{i}.ffn", x))
    if cfg.norm_first:
        x = _ln(cfg, w, "enc.final_ln", x)
    return x


def ref_decoder(cfg: ModelConfig, w: Weights, y, enc_out, form: str = "kv",
                folded=None) -> np.ndarray:
    """Full (teacher-forced, causally masked) decoder: y (B,T,d), enc_out (B,S,d) -> (B,T,d)."""
    x = np.asarray(y, dtype=np.float64)
    for i in range(cfg.n_dec_layers):
        ps = attn_params(w, f"dec.{i}.self", folded)
        pc = attn_params(w, f"dec.{i}.cross", folded)
        if cfg.norm_first:
            u = _ln(cfg, w, f"dec.{i}.ln1", x)
            x = x + ref_mha(cfg, ps, u, u, causal=True, form=form)
            x = x + ref_mha(cfg, pc, _ln(cfg, w, f"dec.{i}.ln2", x), enc_out, form=form)
            x = x + _ffn(w, f"dec.{i}.ffn", _ln(cfg, w, f"dec.{i}.ln3", x))
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + ref_mha(cfg, ps, x, x, causal=True, form=form))
            x = _ln(cfg, w, f"dec.{i}.ln2", x + ref_mha(cfg, pc, x, enc_out, form=form))
            x = _ln(cfg, w, f"dec.{i}.ln3", x + _ffn(w, f"dec.{i}.ffn", x))
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(cfg, w, "dec.final_ln", x)
    return x


class RefDecodeState:
    """Incremental decoder state (Privformer Alg. 3 / Eq. 15).

    Per decoder layer: ``G[i]`` (B, h, r, d_head) running sum
    ``sum_{j<=t} K'_j^T V_j`` of the masked self-attention, ``cross_kv[i]``
    (B, h, r, d_head) = ``K'^T V`` of the cross attention (computed once from
    ``enc_out``), ``n_enc`` the number of encoder positions and ``t`` the number
    of tokens consumed so far (so the masked count is ``n = t + 1``).
    """

    def __init__(self, cfg: ModelConfig, w: Weights, enc_out):
        enc_out = np.asarray(enc_out, dtype=np.float64)
        B, S, _ = enc_out.shape
        h, r, dh = cfg.n_heads, cfg.n_features, cfg.d_head
        self.t = 0
        self.n_enc = S
        self.G = [np.zeros((B, h, r, dh)) for _ in range(cfg.n_dec_layers)]
        self.cross_kv = []
        for i in range(cfg.n_dec_layers):
            p = w.sub(f"dec.{i}.cross")
            kf = ref_features(cfg, p, enc_out, "k")  # (B,h,S,r)
            v = _split_heads(enc_out @ p["wv"], h)  # (B,h,S,dh)
            self.cross_kv.append(np.swapaxes(kf, -1, -2) @ v)


def _step_attn(cfg, p, x_t, kv, scale):
    # x_t (B,d); kv (B,h,r,dh) -> (B,d)
    qf = ref_features(cfg, p, x_t[:, None, :], "q")[:, :, 0, :]  # (B,h,r)
    o = np.einsum("bhr,bhrd->bhd", qf, kv) * scale
    return o.reshape(o.shape[0], -1) @ p["wo"]


def _step_self(cfg, w, prefix, state, i, x_t):
    p = w.sub(prefix)
    kf = ref_features(cfg, p, x_t[:, None, :], "k")[:, :, 0, :]  # (B,h,r)
    v = _split_heads((x_t @ p["wv"])[:, None, :], cfg.n_heads)[:, :, 0, :]  # (B,h,dh)
    state.G[i] = state.G[i] + np.einsum("bhr,bhd->bhrd", kf, v)
    return _step_attn(cfg, p, x_t, state.G[i], float(attn_norm(cfg, state.t + 1)))


def ref_decoder_step(cfg: ModelConfig, w: Weights, state: RefDecodeState | None, y_t,
                     enc_out=None) -> np.ndarray:
    """One decoder step: y_t (B, d) (embedded token at position state.t) -> (B, d).

    O(1) in the prefix length.  Mutates ``state`` (t += 1).  ``enc_out`` is
    only needed to build a state when ``state`` is None (prefer
    ``RefDecodeState(cfg, w, enc_out)``).
    """
    if state is None:
        raise ValueError("pass a RefDecodeState(cfg, w, enc_out)")
    x = np.asarray(y_t, dtype=np.float64)
    cscale = float(attn_norm(cfg, state.n_enc))
    for i in range(cfg.n_dec_layers):
        pc = w.sub(f"dec.{i}.cross")
        if cfg.norm_first:
            x = x + _step_self(cfg, w, f"dec.{i}.self", state, i, _ln(cfg, w, f"dec.{i}.ln1", x))
            x = x + _step_attn(cfg, pc, _ln(cfg, w, f"dec.{i}.ln2", x), state.cross_kv[i], cscale)
            x = x + _ffn(w, f"dec.{i}.ffn", _ln(cfg, w, f"dec.{i}.ln3", x))
        else:
            x = _ln(cfg, w, f"dec.{i}.ln1", x + _step_self(cfg, w, f"dec.{i}.self", state, i, x))
            x = _ln(cfg, w, f"dec.{i}.ln2", x + _step_attn(cfg, pc, x, state.cross_kv[i], cscale))
            x = _ln(cfg, w, f"dec.{i}.ln3", x + _ffn(w, f"dec.{i}.ffn", x))
    if cfg.norm_first and cfg.n_dec_layers:
        x = _ln(cfg, w, "dec.final_ln", x)
    state.t += 1
    return x


# --------------------------------------------------------------------------- user side


def embed(cfg: ModelConfig, table: np.ndarray, ids, offset: int = 0) -> np.ndarray:
    """embed[tok] * sqrt(d_model) + PE[offset + pos]; ids (B, S) -> (B, S, d)."""
    ids = np.asarray(ids, dtype=np.int64)
    S = ids.shape[-1]
    pe = positional_encoding(offset + S, cfg.d_model)[offset:]
    return table[ids] * math.sqrt(cfg.d_model) + pe


def output_logits(user: Mapping, h) -> np.ndarray:
    return h @ user["out.w"] + user["out.b"]


def greedy_decode(cfg: ModelConfig, w: Weights, user: Mapping, src_ids, bos: int, eos: int,
                  max_steps: int | None = None) -> list[list[int]]:
    """Greedy decoding with the numpy reference (ref_encoder + ref_decoder_step).

    ``src_ids`` (B, S): all rows must have the same length (no padding; every
    source position is a real key).  Returns token lists without BOS/EOS.
    """
    src_ids = np.asarray(src_ids, dtype=np.int64)
    if src_ids.ndim == 1:
        src_ids = src_ids[None]
    B = src_ids.shape[0]
    max_steps = cfg.max_len if max_steps is None else max_steps
    enc = ref_encoder(cfg, w, embed(cfg, user["embed.src"], src_ids))
    state = RefDecodeState(cfg, w, enc)
    tok = np.full(B, bos, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(B)]
    done = np.zeros(B, dtype=bool)
    for t in range(max_steps):
        y = embed(cfg, user["embed.tgt"], tok[:, None], offset=t)[:, 0, :]
        hdec = ref_decoder_step(cfg, w, state, y, enc)
        tok = output_logits(user, hdec).argmax(-1)
        for b in range(B):
            if not done[b]:
                if tok[b] == eos:
                    done[b] = True
                else:
                    out[b].append(int(tok[b]))
        if done.all():
            break
    return out
