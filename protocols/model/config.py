"""Model configuration: the public hyper-parameters of a Privformer-style transformer, and the
names and shapes of every tensor such a model has (:func:`expected_shapes` for the MPC weights,
:func:`expected_user_shapes` for the query user's embedding and output tables).

Architectures (``arch``, :data:`ARCHS`; docs/MODELS.md lists every key per architecture):

* ``encoder-decoder`` (default): Privformer's translator. Its dictionary has no ``arch`` key,
  so configs and model files written before architectures existed read and write unchanged.
* ``encoder-classifier`` (BERT-style): encoder, mean pooling over the sequence, classifier head
  ``head.w`` (d, n_classes), ``head.b`` (MPC weights); keys ``n_enc_layers``, ``src_vocab``,
  ``n_classes``; the user holds ``embed.src``.
* ``decoder-only`` (GPT-style causal LM): ``n_dec_layers`` layers of causally masked
  self-attention and FFN, no cross-attention; keys ``n_dec_layers``, ``tgt_vocab``; the user
  holds ``embed.tgt`` and the LM head ``out.w``, ``out.b``.
* ``encoder`` (a headless encoder: BertModel, sentence-transformers): the encoder, then the
  ``pool`` of its positions (mean, cls, max) and, with ``normalize``, the L2-normalised
  embedding (B, d_model); keys ``n_enc_layers``, ``src_vocab``; the user holds ``embed.src``.

Keys that do not apply to an architecture are absent from its dictionary (and 0 in the
dataclass); :meth:`ModelConfig.from_dict` refuses them by name.

Optional keys (absent from the dictionary at their default, so files written before them read
and write unchanged): ``ffn_act``, ``attention``, ``softmax_form`` (:data:`SOFTMAX_FORMS`),
``norm`` (:data:`NORMS`); ``ffn_scale`` and
``ffn_pruned`` (AERO's scaled / pruned FFN, decoder-only softmax-only blocks: per-layer
``dec.i.ffn.alpha``, ``beta`` (1,); the deepest ``ffn_pruned`` layers have no FFN); ``ffn_bn``
(seed 002's BatchNorm inside the MLP: ``p.ffn.bn_gamma, bn_beta, bn_mean, bn_var`` (d_ff));
and for models imported from other frameworks (:mod:`.hf_import`) ``attn_bias`` (biases
``bq, bk, bv, bo`` (d) on the attention projections), ``pool`` (:data:`POOLS`,
encoder-classifier: ``cls-tanh`` adds ``pool.w`` (d, d), ``pool.b``; encoder: ``cls``,
``max``), ``normalize`` (encoder), ``embedding``
(:data:`EMBEDDINGS`: learned positions ``embed.pos`` (max_len, d), ``learned-ln`` also
``embed.ln.gamma/beta``, user-side) and ``type_vocab`` (``embed.type``); for LLaMA-family
decoders ``norm`` rmsnorm, ``ffn_act`` swiglu (:data:`GATED`), ``embedding`` rotary with
``rope_theta`` (default 10000) and ``n_kv_heads`` (grouped-query attention: W^K, W^V of
shape (d, n_kv_heads * d_head); 0 = n_heads).

``ln_eps`` defaults to :data:`DEFAULT_LN_EPS` = 2^-10, the lower end of the secure inverse square
root's range (:data:`mpc3.kernels.fxp.SQRT_INV_RANGE`): LayerNorm computes 1/sqrt(var + eps) with
that kernel, so with eps inside its range a row of (near-)constant values still yields a value
the kernel computes correctly (the output is then beta, as in float). A smaller eps (the
customary 1e-5) is accepted - trained models carry the eps they were trained with - and
:mod:`protocols.calibration.calibrate` checks that var + eps stays inside the range on real inputs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

import numpy as np

ATTN_NORMS = ("const", "mean")
#: FFN activations (``ffn_act``): ReLU (Privformer), exact-erf GELU (mpc3.kernels.activations,
#: |x| <= 2^13), or none (a linear FFN, as in AERO's softmax-only block).
FFN_ACTS = ("relu", "gelu", "none", "swiglu")
#: The gated FFN of LLaMA-family models (``ffn_act`` swiglu): (silu(x W1) * (x W3)) W2, no
#: biases (tensors ``w1`` gate, ``w3`` up (d, d_ff), ``w2`` down (d_ff, d)).
GATED = "swiglu"
#: Attention of the model (``attention``; float64 references in :mod:`.variants`), every one
#: for every architecture: relu-performer decodes with Performer's prefix sums, the others
#: with a secret KV cache (protocols.layers.kv_cache; the encoder-decoder's cross attention keeps
#: the encoder output's K, V from the session's start).
ATTENTIONS = ("relu-performer", "softmax", "power-softmax", "sigma-relu")
PERFORMER = "relu-performer"
#: How softmax attention is computed on shares (``softmax_form``, attention softmax only):
#: ``max`` (default) subtracts each row's secret maximum first, so exp only sees s - max <= 0
#: and any score range runs (pretrained models reach scores of 40); ``max-free`` is
#: Privformer's exp(s) / sum exp(s), cheaper but exact only while every score stays inside
#: exp's range [-48, 9.5] (models trained for it, e.g. with a range penalty).
SOFTMAX_FORMS = ("max", "max-free")
#: Pooling (``pool``) of an encoder classifier: the mean over the positions, or BERT's
#: tanh(h[CLS] @ pool.w + pool.b) of the first position; of a headless encoder (arch
#: ``encoder``, a sentence embedding): the mean, the first ([CLS]) row, or the maximum over
#: the positions per coordinate (sentence-transformers' pooling modes).
POOLS = ("mean", "cls-tanh", "cls", "max")
#: The pools each architecture offers (the others run no pooling).
ARCH_POOLS = {"encoder-classifier": ("mean", "cls-tanh"), "encoder": ("mean", "cls", "max")}
#: How the query user embeds tokens (``embedding``): ``embed[tok] * sqrt(d) + sinusoidal PE``,
#: learned positions ``embed[tok] + embed.pos[pos] (+ embed.type[type])`` (GPT-2), or the
#: same followed by a LayerNorm ``embed.ln`` (BERT). All user-side, never shared.
EMBEDDINGS = ("sinusoidal", "learned", "learned-ln", "rotary")
#: ``rotary`` (LLaMA-family): the user embeds ``embed.tgt[tok]`` alone; positions enter as
#: rotary embeddings of q and k inside every self attention (:mod:`.rotary`, base
#: ``rope_theta``), on shares.
ROTARY = "rotary"
#: Normalization where a transformer has its LayerNorms (``norm``): LayerNorm (tensors
#: ``gamma, beta``); none (the identity, AERO's softmax-only block: no tensors); or BatchNorm
#: with running statistics (seed 002's normalization of its vision transformers: tensors
#: ``gamma, beta, mean, var``, eps = ``ln_eps``; at inference a per-channel affine map); or
#: RMSNorm (LLaMA-family: ``x / sqrt(mean(x^2) + eps) * gamma``, tensor ``gamma``).
NORMS = ("layernorm", "none", "batchnorm", "rmsnorm")
#: Keys every architecture may carry and omits from its dictionary at their default value.
_OPTIONAL = {"ffn_act": "relu", "attention": PERFORMER, "attn_bias": False, "pool": "mean",
             "embedding": "sinusoidal", "type_vocab": 0, "norm": "layernorm",
             "ffn_scale": False, "ffn_pruned": 0, "ffn_bn": False, "softmax_form": "max",
             "normalize": False, "n_kv_heads": 0, "rope_theta": 10000.0}
ENCODER_DECODER, ENCODER_CLASSIFIER, DECODER_ONLY, ENCODER = \
    "encoder-decoder", "encoder-classifier", "decoder-only", "encoder"
ARCHS = (ENCODER_DECODER, ENCODER_CLASSIFIER, DECODER_ONLY, ENCODER)
_COMMON = ("d_model", "n_heads", "d_head", "n_features", "d_ff", "attn_c", "attn_norm",
           "ln_eps", "norm_first", "max_len")
#: Keys of each architecture's dictionary beyond the common ones (``arch`` is written for the
#: new architectures only, so encoder-decoder dictionaries stay as they were).
ARCH_KEYS = {
    ENCODER_DECODER: ("n_enc_layers", "n_dec_layers", "src_vocab", "tgt_vocab"),
    ENCODER_CLASSIFIER: ("arch", "n_enc_layers", "src_vocab", "n_classes"),
    DECODER_ONLY: ("arch", "n_dec_layers", "tgt_vocab"),
    ENCODER: ("arch", "n_enc_layers", "src_vocab"),
}
#: Keys that must be >= 1 in each architecture (the others of ARCH_KEYS may be 0).
_POSITIVE = {
    ENCODER_DECODER: ("n_enc_layers", "src_vocab", "tgt_vocab"),
    ENCODER_CLASSIFIER: ("n_enc_layers", "src_vocab", "n_classes"),
    DECODER_ONLY: ("n_dec_layers", "tgt_vocab"),
    ENCODER: ("n_enc_layers", "src_vocab"),
}

#: Default LayerNorm epsilon: 2^-10, the lower bound of fxp.SQRT_INV_RANGE (tests check this).
DEFAULT_LN_EPS = 2.0 ** -10


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    n_heads: int
    d_head: int
    n_features: int  # r, random features per head
    d_ff: int
    attn_c: float
    attn_norm: str  # "const" | "mean"
    norm_first: bool
    max_len: int
    # keyword only; the keys of another architecture stay 0 (checked by validate)
    n_enc_layers: int = field(default=0, kw_only=True)
    n_dec_layers: int = field(default=0, kw_only=True)
    src_vocab: int = field(default=0, kw_only=True)
    tgt_vocab: int = field(default=0, kw_only=True)
    ln_eps: float = field(default=DEFAULT_LN_EPS, kw_only=True)
    arch: str = field(default=ENCODER_DECODER, kw_only=True)
    n_classes: int = field(default=0, kw_only=True)
    ffn_act: str = field(default="relu", kw_only=True)
    attention: str = field(default=PERFORMER, kw_only=True)
    attn_bias: bool = field(default=False, kw_only=True)
    pool: str = field(default="mean", kw_only=True)
    embedding: str = field(default="sinusoidal", kw_only=True)
    type_vocab: int = field(default=0, kw_only=True)
    norm: str = field(default="layernorm", kw_only=True)
    ffn_scale: bool = field(default=False, kw_only=True)
    ffn_pruned: int = field(default=0, kw_only=True)
    ffn_bn: bool = field(default=False, kw_only=True)
    softmax_form: str = field(default="max", kw_only=True)
    normalize: bool = field(default=False, kw_only=True)
    n_kv_heads: int = field(default=0, kw_only=True)   # grouped-query attention; 0: n_heads
    rope_theta: float = field(default=10000.0, kw_only=True)

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``n_kv_heads``, or n_heads without grouping)."""
        return self.n_kv_heads or self.n_heads

    def validate(self) -> "ModelConfig":
        def posint(name, minimum=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an int, got {type(v).__name__} {v!r}")
            if v < minimum:
                raise ValueError(f"{name}={v} must be >= {minimum}")

        if self.arch not in ARCHS:
            raise ValueError(f"arch={self.arch!r} must be one of {ARCHS}")
        for n in ("d_model", "n_heads", "d_head", "n_features", "d_ff", "max_len"):
            posint(n)
        keys = ARCH_KEYS[self.arch]
        for n in ("n_enc_layers", "n_dec_layers", "src_vocab", "tgt_vocab", "n_classes"):
            if n in _POSITIVE[self.arch]:
                posint(n)
            elif n in keys:
                posint(n, 0)
            elif getattr(self, n) != 0:
                raise ValueError(f"{n}={getattr(self, n)!r} does not apply to arch "
                                 f"{self.arch!r} (leave it 0)")
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
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention={self.attention!r} must be one of {ATTENTIONS}")
        if self.softmax_form not in SOFTMAX_FORMS:
            raise ValueError(f"softmax_form={self.softmax_form!r} must be one of "
                             f"{SOFTMAX_FORMS}")
        if self.softmax_form != "max" and self.attention != "softmax":
            raise ValueError(f"softmax_form={self.softmax_form!r} applies to attention "
                             f"'softmax' only (got {self.attention!r})")
        self._validate_extras(posint)
        self._validate_llama(posint)
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} must be one of {NORMS}")
        self._validate_aero(posint)
        if self.ffn_act not in FFN_ACTS:
            raise ValueError(f"ffn_act={self.ffn_act!r} must be one of {FFN_ACTS}")
        if self.ffn_act == GATED and (self.ffn_bn or self.ffn_scale):
            raise ValueError("ffn_act 'swiglu' (the gated FFN) takes no ffn_bn / ffn_scale")
        if not isinstance(self.norm_first, (bool, np.bool_)):
            raise ValueError(f"norm_first must be a bool, got {self.norm_first!r}")
        return self

    def _validate_extras(self, posint) -> None:
        """The optional keys of imported models: attention biases, pooling, embedding."""
        if not isinstance(self.attn_bias, (bool, np.bool_)):
            raise ValueError(f"attn_bias must be a bool, got {self.attn_bias!r}")
        if self.pool not in POOLS:
            raise ValueError(f"pool={self.pool!r} must be one of {POOLS}")
        if self.pool != "mean" and self.pool not in ARCH_POOLS.get(self.arch, ()):
            offers = " / ".join(repr(a) for a, p in ARCH_POOLS.items() if self.pool in p)
            raise ValueError(f"pool={self.pool!r} applies to arch {offers} only")
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise ValueError(f"normalize must be a bool, got {self.normalize!r}")
        if self.normalize and self.arch != ENCODER:
            raise ValueError(f"normalize (an L2-normalised embedding) applies to arch "
                             f"{ENCODER!r} only")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"embedding={self.embedding!r} must be one of {EMBEDDINGS}")
        if self.embedding != "sinusoidal" and self.arch == ENCODER_DECODER:
            raise ValueError(f"embedding={self.embedding!r} needs one input table (arch "
                             f"{ENCODER_CLASSIFIER!r} or {DECODER_ONLY!r})")
        posint("type_vocab", 0)
        if self.type_vocab and self.embedding == "sinusoidal":
            raise ValueError("type_vocab (token-type embeddings) needs a learned embedding")

    def _validate_llama(self, posint) -> None:
        """LLaMA-family keys: grouped-query attention, rotary positions."""
        posint("n_kv_heads", 0)
        if self.n_kv_heads:
            if self.arch != DECODER_ONLY:
                raise ValueError(f"n_kv_heads (grouped-query attention) applies to arch "
                                 f"{DECODER_ONLY!r} only")
            if self.attention == PERFORMER:
                raise ValueError("n_kv_heads (grouped-query attention) needs a softmax-style "
                                 "attention, not relu-performer")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads="
                                 f"{self.n_heads}")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)) \
                or not (float(theta) > 1 and math.isfinite(float(theta))):
            raise ValueError(f"rope_theta={theta!r} must be a finite float > 1")
        if self.embedding != ROTARY:
            if float(theta) != 10000.0:
                raise ValueError("rope_theta applies to embedding 'rotary' only")
            return
        if self.arch != DECODER_ONLY or self.attention == PERFORMER:
            raise ValueError(f"embedding 'rotary' needs arch {DECODER_ONLY!r} with a "
                             f"softmax-style attention (got {self.arch!r}, "
                             f"{self.attention!r})")
        if self.d_head % 2:
            raise ValueError(f"rotary embeddings need an even d_head, got {self.d_head}")
        if self.type_vocab:
            raise ValueError("type_vocab needs a learned embedding, not 'rotary'")

    def _validate_aero(self, posint) -> None:
        """AERO's scaled / pruned FFN (seed 001, Eq. 6 and ScFuFFN_x): softmax-only blocks of
        a decoder-only LM (norm none, ffn_act none)."""
        for key in ("ffn_scale", "ffn_bn"):
            if not isinstance(getattr(self, key), (bool, np.bool_)):
                raise ValueError(f"{key} must be a bool, got {getattr(self, key)!r}")
        posint("ffn_pruned", 0)
        if not (self.ffn_scale or self.ffn_pruned):
            return
        what = "ffn_scale" if self.ffn_scale else f"ffn_pruned={self.ffn_pruned}"
        if self.arch != DECODER_ONLY or self.norm != "none" or self.ffn_act != "none":
            raise ValueError(f"{what} (AERO's scaled / pruned FFN) needs AERO's softmax-only "
                             f"block: arch {DECODER_ONLY!r}, norm 'none', ffn_act 'none' "
                             f"(got {self.arch!r}, {self.norm!r}, {self.ffn_act!r})")
        if self.ffn_pruned > self.n_dec_layers:
            raise ValueError(f"ffn_pruned={self.ffn_pruned} exceeds n_dec_layers="
                             f"{self.n_dec_layers}")

    def has_ffn(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has an FFN (the deepest ``ffn_pruned`` do not)."""
        return layer < self.n_dec_layers - self.ffn_pruned

    def to_dict(self) -> dict:
        """The public dictionary: only the keys of this architecture (an encoder-decoder
        writes no ``arch`` key, exactly as before architectures existed)."""
        full = asdict(self)
        keys = config_keys(self.arch)
        d = {k: full[k] for k in (f.name for f in fields(self)) if k in keys}
        for k, v in d.items():
            if isinstance(v, np.generic):
                d[k] = v.item()
        d["attn_c"] = float(d["attn_c"])
        d["ln_eps"] = float(d["ln_eps"])
        d["norm_first"] = bool(d["norm_first"])
        opt = {k: getattr(self, k) for k, v in _OPTIONAL.items() if getattr(self, k) != v}
        d.update({k: v.item() if isinstance(v, np.generic) else v for k, v in opt.items()})
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "ModelConfig":
        arch = d.get("arch", ENCODER_DECODER)
        if arch not in ARCHS:
            raise ValueError(f"arch={arch!r} must be one of {ARCHS}")
        names = config_keys(arch)
        extra = sorted(set(d) - set(names) - {"arch"} - set(_OPTIONAL))     # "arch" may be explicit for ED
        if extra:
            other = sorted(set(extra) & {f.name for f in fields(cls)})
            why = (f" ({', '.join(other)} do not apply to arch {arch!r})" if other else "")
            raise ValueError(f"unknown config keys: {extra}{why}")
        missing = [n for n in names if n not in d and n != "arch"]
        if missing:
            raise ValueError(f"missing config keys: {missing}")
        opt = {k: d[k] for k in _OPTIONAL if k in d}
        return cls(**{n: d[n] for n in names if n in d and n != "arch"}, arch=arch,
                   **opt).validate()


#: The largest value of each size key a model file may carry (docs/MODELS.md, "Untrusted model
#: files"): far beyond the models mpc3 runs, small enough that a config cannot make the
#: owner's tools allocate without end. ``max_len`` has its own, lower ceiling
#: (:class:`.files.FileLimits`, ``MPC3_MAX_LEN``, default 2048): calibration traces sequences
#: of max_len tokens, at a cost quadratic in it whatever the model's width (a tiny softmax
#: model: 57 s and 1.4 GB at 2048, 4x that per doubling); a longer learned position table
#: is cut with ``--max-len``.
CEILINGS = {"d_model": 1 << 16, "n_heads": 1 << 10, "n_features": 1 << 16, "d_ff": 1 << 18,
            "n_enc_layers": 1 << 10, "n_dec_layers": 1 << 10, "src_vocab": 1 << 24,
            "tgt_vocab": 1 << 24, "n_classes": 1 << 24, "type_vocab": 1 << 16,
            "ffn_pruned": 1 << 10, "max_len": None}


def check_ceilings(cfg: ModelConfig, where: str = "model config", keys=tuple(CEILINGS),
                   source: Mapping[str, str] | None = None) -> ModelConfig:
    """ValueError naming the first key of ``cfg`` (of ``keys``) above its :data:`CEILINGS`
    value (and ``source[key]``, the key it was read from, e.g. config.json's)."""
    from .files import ENV, FileLimits
    for key in keys:
        top = CEILINGS[key] if key != "max_len" else FileLimits.from_env().max_len
        if getattr(cfg, key) > top:
            fix = (f"; raise {ENV['max_len'][0]}, or cut a learned position table with "
                   f"--max-len" if key == "max_len" else "")
            src = f" (config.json {source[key]})" if source and key in source else ""
            raise ValueError(f"{where}: {key}={getattr(cfg, key)}{src} exceeds mpc3's ceiling "
                             f"{top} (docs/MODELS.md, Untrusted model files{fix})")
    return cfg


def check_layers(cfg: ModelConfig, names, where: str = "model config") -> ModelConfig:
    """ValueError unless ``cfg``'s layer counts are at most the layers whose tensors are in
    ``names`` (``enc.i.``, ``dec.i.``) and within :data:`CEILINGS` - checked before
    :func:`expected_shapes` (whose size grows with the layers) is formed."""
    check_ceilings(cfg, where)
    for key, stack in (("n_enc_layers", "enc"), ("n_dec_layers", "dec")):
        present = {n.split(".", 2)[1] for n in names if n.startswith(stack + ".")}
        have = len({p for p in present if p.isdigit()})
        if getattr(cfg, key) > have:
            raise ValueError(f"{where}: {key}={getattr(cfg, key)} but the file holds "
                             f"tensors of {have} {stack}.* layers")
    return cfg


def config_keys(arch: str) -> tuple[str, ...]:
    """Every key of an ``arch`` config dictionary (ModelConfig.to_dict / from_dict)."""
    return _COMMON + ARCH_KEYS[arch]



def attn_prefixes(cfg: ModelConfig) -> list[str]:
    p = [f"enc.{i}.attn" for i in range(cfg.n_enc_layers)]
    for i in range(cfg.n_dec_layers):
        p += [f"dec.{i}.self"] + ([f"dec.{i}.cross"] if cfg.arch == ENCODER_DECODER else [])
    return p


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Every MPC (secret-shared) tensor name -> exact shape."""
    d, f, h, dh, r = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head, cfg.n_features
    out: dict[str, tuple] = {}

    dkv = cfg.kv_heads * dh

    def attn(p):
        for n in ("wq", "wk", "wv", "wo"):
            out[f"{p}.{n}"] = (d, dkv if n in ("wk", "wv") else d)
        if cfg.attn_bias:
            for n in ("bq", "bk", "bv", "bo"):
                out[f"{p}.{n}"] = (dkv if n in ("bk", "bv") else d,)
        if cfg.attention == PERFORMER:
            out[f"{p}.omega"] = (h, dh, r)

    def ln(p):
        names = {"layernorm": ("gamma", "beta"), "none": (), "rmsnorm": ("gamma",),
                 "batchnorm": ("gamma", "beta", "mean", "var")}[cfg.norm]
        for n in names:
            out[f"{p}.{n}"] = (d,)

    def ffn(p):
        if cfg.ffn_act == GATED:          # LLaMA: gate, up, down; no biases
            out[f"{p}.w1"] = (d, f)
            out[f"{p}.w3"] = (d, f)
            out[f"{p}.w2"] = (f, d)
            return
        if cfg.ffn_scale:                 # AERO Eq. 6: x = beta x_SA + FFN(x_SA) / alpha
            out[f"{p}.alpha"] = (1,)
            out[f"{p}.beta"] = (1,)
        out[f"{p}.w1"] = (d, f)
        out[f"{p}.b1"] = (f,)
        if cfg.ffn_bn:                    # seed 002's BatchNorm between W1 and the activation
            for n in ("bn_gamma", "bn_beta", "bn_mean", "bn_var"):
                out[f"{p}.{n}"] = (f,)
        out[f"{p}.w2"] = (f, d)
        out[f"{p}.b2"] = (d,)

    for i in range(cfg.n_enc_layers):
        attn(f"enc.{i}.attn")
        ln(f"enc.{i}.ln1")
        ffn(f"enc.{i}.ffn")
        ln(f"enc.{i}.ln2")
    for i in range(cfg.n_dec_layers):
        attn(f"dec.{i}.self")
        ln(f"dec.{i}.ln1")
        if cfg.arch == DECODER_ONLY:      # self attention and FFN only, like an encoder layer
            if cfg.has_ffn(i):
                ffn(f"dec.{i}.ffn")
            ln(f"dec.{i}.ln2")
            continue
        attn(f"dec.{i}.cross")
        ln(f"dec.{i}.ln2")
        ffn(f"dec.{i}.ffn")
        ln(f"dec.{i}.ln3")
    if cfg.norm_first:
        if cfg.n_enc_layers:
            ln("enc.final_ln")
        if cfg.n_dec_layers:
            ln("dec.final_ln")
    if cfg.arch == ENCODER_CLASSIFIER:
        if cfg.pool == "cls-tanh":
            out["pool.w"] = (d, d)
            out["pool.b"] = (d,)
        out["head.w"] = (d, cfg.n_classes)
        out["head.b"] = (cfg.n_classes,)
    return out


def expected_user_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """The query user's tensors (never secret-shared): embedding tables and output layer."""
    d = cfg.d_model
    src = {"embed.src": (cfg.src_vocab, d)}
    tgt = {"embed.tgt": (cfg.tgt_vocab, d), "out.w": (d, cfg.tgt_vocab),
           "out.b": (cfg.tgt_vocab,)}
    extra: dict[str, tuple] = {}
    if cfg.embedding not in ("sinusoidal", ROTARY):
        extra["embed.pos"] = (cfg.max_len, d)
        if cfg.type_vocab:
            extra["embed.type"] = (cfg.type_vocab, d)
        if cfg.embedding == "learned-ln":
            extra["embed.ln.gamma"] = (d,)
            extra["embed.ln.beta"] = (d,)
    if cfg.arch in (ENCODER_CLASSIFIER, ENCODER):
        return {**src, **extra}
    if cfg.arch == DECODER_ONLY:
        return {**tgt, **extra}
    return {**src, **tgt}
