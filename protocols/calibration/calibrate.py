"""Calibration of a model before it is shared ("right or refused").

Every range-limited kernel of the secure model (:mod:`protocols.calibration.site_catalog`) is exact
only on its documented range; outside it the ring wraps and the output is garbage with no error.
So:

* the model owner's ``share-model`` calls :func:`calibrate` on sample inputs: it runs the
  secure stacks themselves on a shadow party (:mod:`protocols.calibration.shadow`: each kernel's
  ideal functionality on plaintext fixed point, docs/CALIBRATION.md) - the encoder and every
  decode step over a full ``max_len``-token target (so the Performer prefix sums reach their
  largest size) -, records per layer and site the largest value reaching the kernel, and
  refuses (:class:`RangeError`) a model whose values leave a kernel's range divided by the
  safety margin;
* per architecture (``cfg.arch``): an encoder classifier is traced through its encoder and
  head (sites ``head``, ``pool``, ``argmax``), a headless encoder through its encoder,
  pooling and normalization (layer ``pool``: ``pool_max``, ``norm_sumsq``, ``norm_sq``,
  ``norm_scale``), a decoder-only LM through its prefill and every
  decode step of ``max_len``-token samples embedded with ``embed.tgt`` (input range ``X`` for
  the prompt, ``Y`` for a step, the same table);
* the result, :class:`Calibration`, is small and JSON-able (:meth:`Calibration.to_dict`) and is
  stored in the model's public metadata together with the **calibrated input range**; every
  party checks it at upload and before a model's jobs, the query user's client before it
  shares inputs (:mod:`protocols.calibration.check`);
* the query user's client calls :func:`check_input` on the plaintext before sharing it and
  refuses inputs outside that range.

Safety margin (:data:`DEFAULT_MARGIN` = 4). Magnitudes must stay below limit / margin, and a
data-dependent lower bound (sqrt_inv's 2^-10 when ln_eps is below it) above lo * margin: two
bits of headroom, so an input inside the calibrated input range that differs from the samples
(other tokens, positions, lengths) may push a linear site 4x and a quadratic one (sum of
squares, scores) 2x beyond the largest sample value before a kernel leaves its range. The
guarantee is empirical - it covers inputs like the samples, not every vector in the range -
which is why samples should be real (or realistic) inputs at the model's full length.

Input range. For a model with embedding tables (``embed.src`` / ``embed.tgt``) it is exact:
the largest |embed[tok] * sqrt(d) + PE[pos]| over every token and position < max_len, so it
covers every embedded token sequence. For a bare model it is the largest |x| of the owner's
samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from mpc3.party import RingConfig
from protocols import model as M
from protocols.layers.attention import default_decode_block
from protocols.stacks.schedule import GAIN_MAX, rms_gain

from .shadow import trace, trace_secret_encoder
from .site_catalog import SITES, site_range

#: 2: an LM step's LayerNorm forms its FFN's W1 (causal_lm.lm_fusions), so a version-1
#: calibration of an LM lacks sites its decode steps now reach: refused, re-share the model.
#: 3: attention's 1/n row scale rides in the truncation of o W^O, so site ``wo`` records the
#: unnormalised product (up to n times the version-2 value): refused, re-share the model.
#: 4: softmax-style attentions hold W^Q / sqrt(d_head) (secure_model.fold_scales) and the
#: softmax subtracts each row's maximum by default (site ``rowmax``): a model shared before
#: holds W^Q unscaled - refused, re-share the model.
VERSION = 4
DEFAULT_MARGIN = 4.0


class RangeError(ValueError):
    """A value leaves a kernel's documented range (model refused / input refused)."""


# ----------------------------------------------------------------------- samples ----
@dataclass
class Samples:
    """Calibration inputs: encoder inputs ``X`` (each (B, S, d), any S <= max_len) and, for an
    encoder-decoder model, decoder inputs ``Y`` paired with them (each (B, T, d), T = max_len
    so that the decode steps' prefix sums reach their largest size)."""

    X: list[np.ndarray]
    Y: list[np.ndarray] = field(default_factory=list)
    #: the token ids (B, S) embedded as each X, and their token types: what an encoder whose
    #: owner keeps the embedding tables secret is traced on (its embedding LayerNorm runs
    #: on shares); :func:`default_samples` fills them
    ids: list[np.ndarray] = field(default_factory=list)
    types: list[np.ndarray] = field(default_factory=list)

    def validate(self, cfg: M.ModelConfig) -> "Samples":
        if not self.X:
            raise ValueError("calibration needs at least one encoder sample X")
        if _needs_y(cfg) and len(self.Y) != len(self.X):
            raise ValueError(f"an encoder-decoder model needs one decoder sample Y per X "
                             f"(got {len(self.X)} X, {len(self.Y)} Y)")
        for name, arrs in (("X", self.X), ("Y", self.Y)):
            for a in arrs:
                if a.ndim != 3 or a.shape[-1] != cfg.d_model or not 1 <= a.shape[1] <= cfg.max_len:
                    raise ValueError(f"sample {name} must be (B, 1..{cfg.max_len}, "
                                     f"{cfg.d_model}), got {a.shape}")
                if not np.all(np.isfinite(a)):
                    raise ValueError(f"sample {name} contains non-finite values")
        for x, y in zip(self.X, self.Y):
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"paired samples differ in batch size: {x.shape} vs {y.shape}")
        return self


def _needs_y(cfg: M.ModelConfig) -> bool:
    """Only an encoder-decoder pairs each encoder sample with a decoder sample."""
    return cfg.arch == M.ENCODER_DECODER and cfg.n_dec_layers > 0


def _input_table(cfg: M.ModelConfig) -> str:
    """The embedding table of the model's first input ``X``."""
    return M.input_table(cfg)


def load_samples(path) -> Samples:
    """Owner-supplied samples: an ``.npy`` (B, S, d) of encoder inputs, or an ``.npz`` with
    ``X`` (and ``Y``) arrays, or several as ``X.0``, ``X.1``, ... / ``Y.0``, ``Y.1``, ..."""
    if str(path).endswith(".npy"):
        return Samples([np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)])
    with np.load(path, allow_pickle=False) as z:
        data = {k: np.asarray(z[k], dtype=np.float64) for k in z.files}

    def pick(name):
        if name in data:
            return [data[name]]
        keys = sorted((k for k in data if k.startswith(name + ".")),
                      key=lambda k: int(k.split(".", 1)[1]))
        return [data[k] for k in keys]
    return Samples(pick("X"), pick("Y"))


def embedding_range(cfg: M.ModelConfig, table: np.ndarray,
                    user: Mapping[str, np.ndarray] | None = None) -> float:
    """Largest |x| of an embedded input over every token (and token type) and position <
    max_len: |table[tok] * sqrt(d) + PE[pos]| (sinusoidal), |table[tok] + embed.pos[pos] +
    embed.type[type]| (learned). For ``learned-ln`` a bound instead: a LayerNorm output is
    at most |gamma_k| sqrt(d - 1) + |beta_k| in coordinate k, whatever its input."""
    if cfg.embedding == "learned-ln":
        g, b = (np.abs(np.asarray(user[k], dtype=np.float64)) for k in
                ("embed.ln.gamma", "embed.ln.beta"))
        return float((g * math.sqrt(max(cfg.d_model - 1, 1)) + b).max())
    if cfg.embedding == "learned":
        e = np.asarray(table, dtype=np.float64)
        pe = np.asarray(user["embed.pos"], dtype=np.float64)
        if "embed.type" in user:
            t = np.asarray(user["embed.type"], dtype=np.float64)
            e = np.concatenate([e + t.max(0), e + t.min(0)])
        hi, lo = e.max(0)[None, :] + pe, e.min(0)[None, :] + pe
        return float(max(np.abs(hi).max(), np.abs(lo).max()))
    e = np.asarray(table, dtype=np.float64) * math.sqrt(cfg.d_model)
    pe = M.positional_encoding(cfg.max_len, cfg.d_model)
    hi = e.max(0)[None, :] + pe
    lo = e.min(0)[None, :] + pe
    return float(max(np.abs(hi).max(), np.abs(lo).max()))


def default_samples(cfg: M.ModelConfig, user: Mapping[str, np.ndarray],
                    rng: np.random.Generator, n_seq: int = 4) -> Samples:
    """Samples for a model with embedding tables: ``n_seq`` sequences of uniformly random
    token ids (every id, specials included: a client may submit any) at each of the lengths
    max_len, max_len/2, max_len/4 and 1, embedded like the query user does
    (:func:`protocols.model.embed`), each paired with ``n_seq`` random targets: ``max_len``
    tokens for the full-length sources (the decode steps' prefix sums at their largest size),
    max_len/4 for the shorter ones (cross attention on short sources; this halves the cost).
    A bare model (no ``embed.src``) needs samples from its owner. A classifier has no
    targets; a decoder-only LM's samples are token sequences embedded with ``embed.tgt``."""
    table = _input_table(cfg)
    if table not in user or (_needs_y(cfg) and "embed.tgt" not in user):
        raise ValueError("the model has no embedding tables: calibrating it needs sample "
                         "inputs from its owner (an .npy/.npz of embedded inputs)")
    vocab = cfg.tgt_vocab if cfg.arch == M.DECODER_ONLY else cfg.src_vocab
    X, Y, quarter = [], [], max(1, cfg.max_len // 4)
    ids, types, trng = [], [], np.random.default_rng(1)     # (types: their own stream)
    for S in sorted({cfg.max_len, max(1, cfg.max_len // 2), quarter, 1}, reverse=True):
        ids.append(rng.integers(0, vocab, (n_seq, S)))
        X.append(M.embed_tokens(cfg, user, ids[-1], table=table))
        types.append(trng.integers(0, max(1, cfg.type_vocab), (n_seq, S)))
        if _needs_y(cfg):
            T = cfg.max_len if S == cfg.max_len else quarter
            Y.append(M.embed(cfg, user["embed.tgt"], rng.integers(0, cfg.tgt_vocab, (n_seq, T))))
    return Samples(X, Y, ids, types)


# ------------------------------------------------------------------- calibration ----
@dataclass
class Calibration:
    """Per-layer maxima per kernel site (``layers[layer][site]``: largest |value|, for
    ``var_eps`` [min, max]), the calibrated input range per job input (``X``: encoder input,
    ``Y``: decoder step input; max |x| allowed), and how they were obtained."""

    layers: dict[str, dict[str, float | list[float]]]
    input_range: dict[str, float]
    margin: float = DEFAULT_MARGIN
    frac: int = 18
    relu_bound_bits: int = 14
    fold_omega: bool = True
    decode_block: int = 1
    ln_eps: float = M.DEFAULT_LN_EPS
    version: int = VERSION
    #: RMSNorm prefix -> its input gain exponent (protocols.stacks.schedule.rms_gain); the
    #: sites of that norm are checked as the gained rows reach them
    norm_gain: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"version": self.version, "margin": self.margin, "frac": self.frac,
             "relu_bound_bits": self.relu_bound_bits, "fold_omega": self.fold_omega,
             "decode_block": self.decode_block, "ln_eps": self.ln_eps,
             "input_range": dict(self.input_range),
             "layers": {k: dict(v) for k, v in self.layers.items()}}
        if self.norm_gain:                 # absent without RMSNorms: older dicts unchanged
            d["norm_gain"] = dict(self.norm_gain)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Calibration":
        if d.get("version") != VERSION:
            raise ValueError(f"calibration version {d.get('version')!r} is not {VERSION}: the "
                             f"protocols changed since the model was calibrated; the model "
                             f"owner re-shares it (mpc3 share-model calibrates it again)")
        unknown = sorted({s for row in d["layers"].values() for s in row} - set(SITES))
        if unknown:
            raise ValueError(f"calibration has unknown sites {unknown}")
        return cls(layers={k: dict(v) for k, v in d["layers"].items()},
                   input_range={k: float(v) for k, v in d["input_range"].items()},
                   margin=float(d["margin"]), frac=int(d["frac"]),
                   relu_bound_bits=int(d["relu_bound_bits"]), fold_omega=bool(d["fold_omega"]),
                   decode_block=int(d["decode_block"]), ln_eps=float(d["ln_eps"]),
                   norm_gain=_gains(d.get("norm_gain", {}), d["layers"]))

    def ring(self) -> RingConfig:
        return RingConfig(frac=self.frac, relu_bound_bits=self.relu_bound_bits)

    def value(self, layer: str, site: str):
        """What reaches ``site`` of ``layer`` as the secure model computes it: the recorded
        value, for an RMSNorm with a gain k (:attr:`norm_gain`) its rows scaled by 2^k
        (``var_eps`` and ``sumsq`` times 4^k, ``xgamma`` times 2^k)."""
        v, k = self.layers[layer][site], self.norm_gain.get(layer, 0)
        f = {"var_eps": 4.0 ** k, "sumsq": 4.0 ** k, "xgamma": 2.0 ** k}.get(site, 1.0)
        if f == 1.0:
            return v
        return [e * f for e in v] if isinstance(v, list) else v * f

    def fill(self, layer: str, site: str) -> float:
        """Fraction of the allowed range a site uses; above 1 means outside limit / margin.
        var_eps: also its minimum against lo * margin when ln_eps < lo (with ln_eps >= lo,
        var + eps >= lo holds for every input); other sqrt_inv sites (``norm_sq``) always."""
        v, m = self.value(layer, site), self.margin
        lo, hi = site_range(site, self.ring())
        if not isinstance(v, list):
            return v * m / hi
        if SITES[site].kernel == "exp":
            # the margin bounds exp's output, e^max * m <= e^hi (what overflows); below lo
            # the kernel still returns 0 or 1 ulp down to ~-120 (fxp docstring), so the
            # lower side needs no margin
            return max((v[1] + math.log(m)) / hi, v[0] / lo)
        if SITES[site].kernel == "reciprocal":
            return max(v[1] * m / hi, lo * m / max(v[0], 1e-300))
        floor = self.ln_eps * 4.0 ** self.norm_gain.get(layer, 0) if site == "var_eps" else 0.0
        low = 0.0 if floor >= lo else lo * m / max(v[0], 1e-300)
        return max(v[1] * m / hi, low)

    def fills(self) -> list[tuple[float, str, str]]:
        """(fill, layer, site) of every site that limits the model (not the schedule-only
        ones, :attr:`protocols.calibration.site_catalog.Site.schedule`), largest first."""
        return sorted(((self.fill(layer, site), layer, site) for layer, site in self._limits()),
                      reverse=True)

    def _limits(self):
        """(layer, site) of every recorded site that limits the model, in execution order
        (schedule-only sites, ``Site.schedule``, choose a schedule and never refuse)."""
        return ((layer, site) for layer, row in self.layers.items() for site in row
                if not SITES[site].schedule)

    def check(self) -> "Calibration":
        """Raise :class:`RangeError` naming the first site (in execution order) outside its
        range - later values are computed from wrapped ones and only follow - and counting
        the others."""
        bad = [(layer, site) for layer, site in self._limits() if self.fill(layer, site) > 1.0]
        if bad:
            more = ""
            if len(bad) > 1:
                names = ", ".join(f"{a}.{b}" for a, b in bad[1:6])
                more = f" (and {len(bad) - 1} more: {names}{'...' if len(bad) > 6 else ''})"
            raise RangeError(self._explain(*bad[0]) + more)
        return self

    def _explain(self, layer: str, site: str) -> str:
        s, v = SITES[site], self.value(layer, site)
        lo, hi = site_range(site, self.ring())
        m = self.margin
        if s.kernel in ("exp", "reciprocal"):
            return (f"{layer}: {s.what} spans [{v[0]:.3g}, {v[1]:.3g}], outside {s.kernel}'s "
                    f"range [{lo:.3g}, {hi:.6g}] with safety margin {m:g} "
                    f"(allowed [{lo if s.kernel == 'exp' else lo * m:.3g}, "
                    f"{hi - math.log(m) if s.kernel == 'exp' else hi / m:.3g}]); "
                    f"{s.advice}")
        if s.kernel == "sqrt_inv":
            name = "sqrt_inv's range"
            if v[1] * m > hi:
                return (f"{layer}: {s.what} reaches {v[1]:.3g}, above {name} [{lo:.2g}, {hi:.6g}]"
                        f" with safety margin {m:g} (max {hi / m:.3g}); {s.advice}")
            advice = (f"raise ln_eps to at least {lo:.3g} (the default "
                      f"{M.DEFAULT_LN_EPS:.3g})" if site == "var_eps" else s.advice)
            return (f"{layer}: {s.what} falls to {v[0]:.3g}, below {name} [{lo:.2g}, {hi:.6g}]"
                    f" with safety margin {m:g} (min {lo * m:.3g}); {advice}")
        kernel = {"product": "a truncated product", "relu": "ReLU", "gelu": "GELU",
                  "silu": "SiLU", "tanh": "tanh"}[s.kernel] + \
            (f" (+{s.extra} fractional bits)" if s.extra else "")
        return (f"{layer}: {s.what} reaches {v:.3g}, above the limit {hi:.6g} of {kernel} "
                f"with safety margin {m:g} (max {hi / m:.3g}); {s.advice}")


def calibrate(cfg: M.ModelConfig, weights: M.Weights, samples: Samples,
              ring: RingConfig = RingConfig(), margin: float = DEFAULT_MARGIN,
              user: Mapping[str, np.ndarray] | None = None, fold_omega: bool = True,
              decode_block: int | None = None, check: bool = True,
              secret: bool = False) -> Calibration:
    """Run the secure stacks on ``samples`` on a shadow party (:mod:`protocols.calibration.shadow`:
    every kernel's ideal functionality, recording what reaches each range-limited one);
    return the checked :class:`Calibration` or raise :class:`RangeError` (model refused).

    ``user``: the query-user tensors, when the model has them (exact input range);
    ``fold_omega`` / ``decode_block``: as the model will be shared and decoded
    (defaults: folded, :func:`protocols.layers.attention.default_decode_block`); ``check`` False:
    the values as traced, unchecked (which sites a model reaches,
    :func:`protocols.calibration.check.sites_reached`); ``secret``: the owner keeps the LM
    head secret (``user``'s ``out.w``, ``out.b``): its product and arg-max are calibrated too;
    of an encoder, its embedding tables: the model is traced from ``samples.ids`` (one-hot
    rows, the embedding LayerNorm on shares: layer ``embed.ln``)."""
    if not margin >= 1.0:
        raise ValueError(f"margin={margin} must be >= 1")
    weights.validate(cfg)
    samples.validate(cfg)
    block = (default_decode_block(cfg.n_features, cfg.d_head) if decode_block is None
             else int(decode_block))
    encoder = cfg.arch in (M.ENCODER_CLASSIFIER, M.ENCODER)
    if secret and encoder:
        if not (user and "embed.src" in user) or not samples.ids:
            raise ValueError("calibrating an encoder's secret embeddings needs its tables and "
                             "token samples (the default samples, not embedded ones)")
        rec = trace_secret_encoder(cfg, weights, samples.ids, samples.types, user, ring,
                                   fold_omega)
    elif secret and not (user and "out.w" in user):
        raise ValueError("calibrating a secret LM head needs the model's out.w, out.b")
    else:
        rec = trace(cfg, weights, samples.X, samples.Y, ring, fold_omega, block,
                    head=user if secret else None)
    rng_in = {"X": max(float(np.abs(x).max()) for x in samples.X)}
    if _needs_y(cfg):
        rng_in["Y"] = max(float(np.abs(y).max()) for y in samples.Y)
    table = _input_table(cfg)
    if user and table in user:
        rng_in["X"] = embedding_range(cfg, user[table], user)
        if _needs_y(cfg) and "embed.tgt" in user:
            rng_in["Y"] = embedding_range(cfg, user["embed.tgt"])
    if cfg.arch == M.DECODER_ONLY:        # prefill X and step Y embed the same tokens
        rng_in["Y"] = rng_in["X"]
    gains = {} if cfg.norm != "rmsnorm" else {
        layer: k for layer, row in rec.values.items()
        if (k := rms_gain(row, float(margin), ring.frac))}
    cal = Calibration(rec.values, rng_in, margin=float(margin), frac=ring.frac,
                      relu_bound_bits=ring.relu_bound_bits, fold_omega=fold_omega,
                      decode_block=block, ln_eps=float(cfg.ln_eps), norm_gain=gains)
    return cal.check() if check else cal


def _gains(got, layers) -> dict[str, int]:
    """A stored ``norm_gain``: layer -> an int in [0, GAIN_MAX] for a calibrated layer."""
    if not isinstance(got, Mapping) or not all(
            isinstance(k, str) and k in layers and isinstance(v, int) and not isinstance(v, bool)
            and 0 <= v <= GAIN_MAX for k, v in got.items()):
        raise ValueError(f"calibration norm_gain must map calibrated layers to ints in "
                         f"[0, {GAIN_MAX}]")
    return dict(got)


def check_input(calibration: Calibration | Mapping, name: str, x) -> None:
    """Query-user check on plaintext before sharing: refuse an input outside the model's
    calibrated input range with a one-line :class:`RangeError`."""
    cal = calibration if isinstance(calibration, Calibration) else \
        Calibration.from_dict(calibration)
    if name not in cal.input_range:
        raise RangeError(f"input {name}: the model's calibration has no range for it "
                         f"(known: {sorted(cal.input_range)})")
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise RangeError(f"input {name} contains non-finite values")
    top, lim = (float(np.abs(a).max()) if a.size else 0.0), cal.input_range[name]
    if top > lim * (1 + 1e-9):
        raise RangeError(f"input {name}: max |x| = {top:.4g} is outside the model's calibrated "
                         f"input range [-{lim:.4g}, {lim:.4g}]; embed tokens as the model "
                         f"expects (embed[tok] * sqrt(d_model) + PE) or ask the model owner "
                         f"to recalibrate with such inputs")
