"""Calibration as a by-product of the secure code: the secure stacks run on a
:class:`mpc3.shadow.ShadowParty` (each kernel's ideal functionality on plaintext ring values)
and every range-limited kernel call reports what reaches it, filed under the layer the stack
names (``p.at(prefix)``) and the site it names (the kernels' ``site=`` / ``sites=``
keywords, :data:`protocols.calibration.site_catalog.SITES`). No second copy of the model is written
for it: what the parties compute is what is measured, in their representation (folded scales,
split forms, row scales in truncations) because it *is* their code.

:class:`ShadowRecorder` turns the ring units a kernel reports into the site's real units -
a product's value before its truncation at 2 frac + the site's extra fractional bits (+ frac
for a ``raw`` site), any other kernel's input at frac - and keeps per (layer, site) the
largest magnitude, or the (min, max) span for the sqrt_inv / exp / reciprocal sites, as
the float64 trace it replaced did.

Drivers (:func:`trace`, one per architecture) run the jobs' stacks over the samples and every
alternative a job may take that the samples alone would not (docs/CALIBRATION.md): both
attention orders, every prefill row, every decode step, the decode schedules.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping

import numpy as np

from mpc3 import ring as R
from mpc3.party import RingConfig
from mpc3.shadow import SPAN_KINDS, ShadowParty
from mpc3.shares import AShare
from protocols import model as M
from protocols.layers.secure_model import layout
from protocols.stacks import causal_lm as LM
from protocols.stacks import decoder as D
from protocols.stacks.causal_lm import lm_open, lm_prefill, lm_step
from protocols.stacks.classifier import classify
from protocols.stacks.decoder import DecodeState, decoder_step
from protocols.stacks.encoder import encoder
from protocols.stacks.schedule import Schedule
from protocols.stacks.sentence import embed_sentence

from .site_catalog import SITES


class ShadowRecorder:
    """The ``record`` callback of a :class:`ShadowParty`: ring units -> the site's units;
    ``values[layer][site]``: the largest |value|, or [min, max] for a two-sided kernel."""

    def __init__(self, ring: RingConfig = RingConfig()) -> None:
        self.values: dict[str, dict[str, float | list[float]]] = {}
        self.frac = ring.frac

    def __call__(self, layer: str, site: str, kind: str, got) -> None:
        """``got``: a kernel's report in ring units (mpc3.shadow.ShadowParty._note)."""
        s = SITES[site]
        if kind != s.kernel:
            raise ValueError(f"{layer}: site {site!r} is a {s.kernel} site, reported by a "
                             f"{kind} kernel (a mis-tagged call)")
        f = self.frac
        unit = 2.0 ** (2 * f + s.extra + (f if s.raw else 0) if kind == "product" else f)
        row = self.values.setdefault(layer, {})
        if kind not in SPAN_KINDS:
            row[site] = max(row.get(site, 0.0), got / unit)
        elif got is not None:
            lo, hi = row.get(site, [np.inf, -np.inf])
            row[site] = [min(lo, got[0] / unit), max(hi, got[1] / unit)]

    def mag(self, layer: str, site: str, real: np.ndarray) -> None:
        """Record real values at a magnitude site directly (a bound a driver forms)."""
        row = self.values.setdefault(layer, {})
        row[site] = max(row.get(site, 0.0), float(np.abs(real).max()) if real.size else 0.0)


class ShadowTensors(Mapping):
    """The model's tensors as the parties hold them (:func:`protocols.layers.secure_model.layout`:
    folded, scaled, encoded) as shadow shares, made once: a decode step reads every weight
    again, so they are kept, as ring units (8 bytes per weight). Of a model in memory they
    are kept in memory. Of a model read from its file or drawn when used
    (:class:`protocols.model.OnDemandTensors`: the model owner's ``share-model``) they are
    written, one at a time, to an unlinked temporary file in ``tmp_dir`` (default: the
    system's) and each read maps its own slice: the owner then holds a few tensors at a time
    whatever the model's depth (the stacks look tensors up when they use them, through
    :func:`protocols.layers.secure_model.sub` views), and the disk holds the model's size."""

    def __init__(self, cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True,
                 frac: int = R.DEFAULT_FRAC, tmp_dir: str | None = None) -> None:
        self.recipes = layout(cfg, weights, fold_omega)
        self.kept: dict[str, AShare] = {}
        self.at: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.file = None
        if not isinstance(weights.tensors, M.OnDemandTensors):
            for name, (make, extra) in self.recipes.items():
                self.kept[name] = ShadowParty.constant(make(), frac + extra)
            return
        self.file = tempfile.TemporaryFile(prefix="mpc3-shadow-", dir=tmp_dir)
        for name, (make, extra) in self.recipes.items():
            units = np.ascontiguousarray(ShadowParty.constant(make(), frac + extra).units)
            self.at[name] = (self.file.tell(), units.shape)
            self.file.write(units.data)
            del units
        self.file.flush()

    def __getitem__(self, name: str) -> AShare:
        if self.file is None:
            return self.kept[name]
        offset, shape = self.at[name]
        if not math.prod(shape):
            return ShadowParty.constant_units(np.zeros(shape))
        return ShadowParty.constant_units(np.memmap(self.file, np.float64, "r", offset,
                                                    shape).view(np.ndarray))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def __contains__(self, name: object) -> bool:
        return name in self.recipes

    def __iter__(self):
        return iter(self.recipes)

    def __len__(self) -> int:
        return len(self.recipes)


def shadow_shares(cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True,
                  frac: int = R.DEFAULT_FRAC) -> ShadowTensors:
    return ShadowTensors(cfg, weights, fold_omega, frac)


def shadow_input(p: ShadowParty, x: np.ndarray) -> AShare:
    return p.share(R.encode(np.asarray(x, dtype=np.float64), p.cfg.frac))


def decode(p: ShadowParty, x: AShare) -> np.ndarray:
    return p.value(x) / 2.0 ** p.cfg.frac


def rows(cfg: M.ModelConfig, x: np.ndarray):
    """``x`` (B, S, ...) in slices of at most ``cfg.max_len`` rows (one full-length
    sequence): a pass over whole sequences then holds the activations of one sequence, not
    of the batch (4 by default). The decode steps go over the whole batch at once: their
    activations are one row per sequence, and each step reads every weight."""
    step = max(1, cfg.max_len // max(1, x.shape[1]))
    return [x[b:b + step] for b in range(0, len(x), step)]


def _start(cfg: M.ModelConfig, arch: str, need: str, weights: M.Weights, ring: RingConfig,
           fold_omega: bool, rec: ShadowRecorder | None):
    """(recorder, shadow party, the model's shadow tensors) of a driver for ``arch``."""
    if cfg.arch != arch:
        raise ValueError(f"{need}, got {cfg.arch!r}")
    rec = rec if rec is not None else ShadowRecorder(ring)
    return rec, ShadowParty(ring, rec), shadow_shares(cfg, weights, fold_omega, ring.frac)


def trace_classifier(cfg: M.ModelConfig, weights: M.Weights, X: list[np.ndarray],
                     ring: RingConfig = RingConfig(), fold_omega: bool = True,
                     rec: ShadowRecorder | None = None) -> ShadowRecorder:
    """Run :func:`protocols.stacks.classifier.classify` on a shadow party over the samples ``X``
    (each (B, S, d)); the recorder holds every (layer, site) it reached. The arg-max's
    tournament (site ``argmax``, run only by the classify-argmax job) is recorded as the
    bound every one of its comparisons stays within: the spread of the logits."""
    rec, p, shares = _start(cfg, M.ENCODER_CLASSIFIER,
                            "trace_classifier needs an encoder classifier",
                            weights, ring, fold_omega, rec)
    for x in (c for xs in X for c in rows(cfg, xs)):
        logits = decode(p, classify(p, cfg, shares, shadow_input(p, x)))
        rec.mag("head", "argmax", logits.max(axis=-1) - logits.min(axis=-1))
    return rec


def trace_embedding(cfg: M.ModelConfig, weights: M.Weights, X: list[np.ndarray],
                    ring: RingConfig = RingConfig(), fold_omega: bool = True,
                    rec: ShadowRecorder | None = None) -> ShadowRecorder:
    """:func:`protocols.stacks.sentence.embed_sentence` (a headless encoder: encoder, pooling,
    normalization) on a shadow party over the samples ``X``."""
    rec, p, shares = _start(cfg, M.ENCODER, "trace_embedding needs a headless encoder",
                            weights, ring, fold_omega, rec)
    for x in (c for xs in X for c in rows(cfg, xs)):
        embed_sentence(p, cfg, shares, shadow_input(p, x))
    return rec


def trace_secret_encoder(cfg: M.ModelConfig, weights: M.Weights, ids: list[np.ndarray],
                         types: list[np.ndarray], user: Mapping,
                         ring: RingConfig = RingConfig(), fold_omega: bool = True,
                         rec: ShadowRecorder | None = None) -> ShadowRecorder:
    """An encoder whose owner keeps its embedding tables secret
    (:mod:`protocols.stacks.secret_encoder`) on a shadow party over token samples ``ids``
    (each (B, S)) and their ``types``: their one-hot rows through the lookup and the
    embedding LayerNorm on shares (layer ``embed.ln``), then the classifier (with its
    arg-max's spread, as :func:`trace_classifier`) or the sentence embedding."""
    from collections import ChainMap

    from protocols.layers.secure_model import secret_layout
    from protocols.stacks import secret_encoder as SE
    if cfg.arch not in (M.ENCODER_CLASSIFIER, M.ENCODER):
        raise ValueError(f"trace_secret_encoder needs an encoder, got {cfg.arch!r}")
    rec = rec if rec is not None else ShadowRecorder(ring)
    p = ShadowParty(ring, rec)
    tables = {k: p.constant(make(), ring.frac + e)
              for k, (make, e) in secret_layout(cfg, user).items()}
    shares = ChainMap(tables, shadow_shares(cfg, weights, fold_omega, ring.frac))
    for i, t in zip(ids, types):
        for c, ct in zip(rows(cfg, i), rows(cfg, t)):
            oh = p.share(SE.encoder_onehot(c, cfg, ct if cfg.type_vocab else None))
            if cfg.arch == M.ENCODER:
                SE.embed_secret(p, cfg, shares, oh)
                continue
            logits = decode(p, SE.classify_secret(p, cfg, shares, oh))
            rec.mag("head", "argmax", logits.max(axis=-1) - logits.min(axis=-1))
    return rec


def trace_lm(cfg: M.ModelConfig, weights: M.Weights, X: list[np.ndarray],
             ring: RingConfig = RingConfig(), fold_omega: bool = True,
             block: int | None = None, rec: ShadowRecorder | None = None,
             head: Mapping | None = None) -> ShadowRecorder:
    """The decoder-only LM on a shadow party over the token sequences ``X`` (each (B, T, d),
    embedded): the prefill of each whole sequence (which, on a shadow party, takes every row
    through every layer: each row is the last of the prompt that ends there), then every
    token as a decode step from an empty session (:func:`protocols.stacks.causal_lm.lm_open`) - and
    a Performer's steps once more with every o W^O formed from the untruncated o (site
    ``wo_raw``: the schedule :func:`protocols.stacks.schedule.deferred_wo` may choose).
    ``head``: the LM head ``out.w``, ``out.b`` an owner keeps secret - every step's row then
    goes through :func:`protocols.layers.vocab.lm_head_token` too (sites ``lm_head``,
    ``argmax`` under ``out``)."""
    rec, p, shares = _start(cfg, M.DECODER_ONLY, "trace_lm needs a decoder-only LM",
                            weights, ring, fold_omega, rec)
    if head is not None:
        from protocols.layers.vocab import lm_head_token
        w, b = (p.constant(np.asarray(head[n], np.float64), ring.frac) for n in ("out.w", "out.b"))
    schedules = [frozenset()]
    if cfg.attention == M.PERFORMER:
        schedules.append(frozenset(f"dec.{i}.self" for i in range(cfg.n_dec_layers)))
    for x in X:
        for c in rows(cfg, x):
            lm_prefill(p, cfg, shares, shadow_input(p, c), block)
        xs = shadow_input(p, x)
        for raw in schedules:
            st = lm_open(p, cfg, shares, x.shape[0], block, LM.DEFAULT_LM_FUSE,
                         Schedule(raw_wo=raw))
            for t in range(x.shape[1]):
                h = lm_step(p, cfg, shares, st, xs[:, t])
                if head is not None and not raw:
                    lm_head_token(p.at("out"), h, w, b)
    return rec


def trace_translator(cfg: M.ModelConfig, weights: M.Weights, X: list[np.ndarray],
                     Y: list[np.ndarray], ring: RingConfig = RingConfig(),
                     fold_omega: bool = True, block: int | None = None,
                     rec: ShadowRecorder | None = None) -> ShadowRecorder:
    """The encoder-decoder on a shadow party over the paired samples ``X`` (encoder inputs)
    and ``Y`` (the targets, each token a decode step of the default session,
    :data:`protocols.stacks.decoder.DEFAULT_FUSE`, read when called). A Performer's sessions twice
    more, for the schedules (:mod:`protocols.stacks.schedule`) its calibration decides: every
    attention's o W^O deferred (steps again; site ``wo_raw``) and every cross attention's W^O folded
    into its K'^T V (the session start; site ``kvwo``)."""
    rec, p, shares = _start(cfg, M.ENCODER_DECODER, "trace_translator needs an encoder-decoder",
                            weights, ring, fold_omega, rec)
    every = frozenset(f"dec.{i}.{k}" for i in range(cfg.n_dec_layers) for k in ("self", "cross"))
    for i, x in enumerate(X):
        enc = AShare.concat([encoder(p, cfg, shares, shadow_input(p, c)) for c in rows(cfg, x)])
        if not cfg.n_dec_layers:                  # (no targets then: Samples.validate)
            continue
        y = Y[i]
        ys = shadow_input(p, y)
        sessions = [(frozenset(), frozenset(), True)]
        if cfg.attention == M.PERFORMER:
            sessions += [(every, frozenset(), True), (frozenset(), every, False)]
        for raw, fold, steps in sessions:
            st = DecodeState.start(p, cfg, shares, enc, block, D.DEFAULT_FUSE,
                                   Schedule(raw_wo=raw, fold_wo=fold))
            for t in range(y.shape[1] if steps else 0):
                decoder_step(p, cfg, shares, st, ys[:, t])
    return rec


def trace(cfg: M.ModelConfig, weights: M.Weights, X: list[np.ndarray], Y: list[np.ndarray],
          ring: RingConfig = RingConfig(), fold_omega: bool = True, block: int | None = None,
          rec: ShadowRecorder | None = None, head: Mapping | None = None) -> ShadowRecorder:
    """The model's architecture's driver (``cfg.arch``) on the samples ``X`` (and ``Y``,
    an encoder-decoder's targets): what :func:`protocols.calibration.calibrate.calibrate`
    records (``head``: an LM's secret head, :func:`trace_lm`)."""
    if cfg.arch == M.ENCODER_CLASSIFIER:
        return trace_classifier(cfg, weights, X, ring, fold_omega, rec)
    if cfg.arch == M.ENCODER:
        return trace_embedding(cfg, weights, X, ring, fold_omega, rec)
    if cfg.arch == M.DECODER_ONLY:
        return trace_lm(cfg, weights, X, ring, fold_omega, block, rec, head)
    return trace_translator(cfg, weights, X, Y, ring, fold_omega, block, rec)
