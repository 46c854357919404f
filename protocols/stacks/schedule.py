"""A decode session's schedule from the model's calibration (its public metadata, stored by
``share-model``; :mod:`protocols.calibration.calibrate`): faster forms that are exact only on a
range the calibration shows the model's values keep to, with its safety margin. A schedule never
changes the function computed; a model without a (recent enough) calibration gets the
general schedule.

* :func:`deferred_wo`: attention sublayers whose o W^O truncates by 2 frac from an
  untruncated o (one round less each);
* :func:`ln_spans`: the octaves of var + eps each LayerNorm's sqrt_inv table covers (fewer
  thresholds: fewer bytes and less work, same rounds);
* :func:`folded_wo`: cross attention sublayers whose W^O a session may fold into K'^T V
  (one round less each, more bytes at decode_open);
* :func:`rms_gain`: the power of two an RMSNorm scales its input rows by before its
  statistics (RMSNorm is scale invariant, eps scaled alike): small residual streams (the
  embeddings of LLaMA-family models, RMS ~0.02) then keep full precision in the mean square
  and stay inside sqrt_inv's range. Unlike the others it is stored in the calibration
  (``norm_gain``), whose checks it enters, and applies to the prompt too;
* :func:`session_schedule`: all of them, as the :class:`Schedule` that ``DecodeState.start``,
  ``lm_prefill`` and their cost functions take.

They read the calibration as a dict (``Calibration.to_dict()``) so that a party applies the
metadata it stores without re-validating sites it does not use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from mpc3.kernels import arith, fxp
from protocols import model as M


@dataclass(frozen=True)
class Schedule:
    """A decode session's calibrated choices; the default is the general schedule (exact on
    every kernel's whole range). None of them changes the function computed.

    ``raw_wo``: attention sublayers (``dec.i.self``, ``dec.i.cross``) whose o W^O truncates
    by 2 frac (:func:`deferred_wo`); ``ln_spans``: LayerNorm prefix -> the octaves of its
    sqrt_inv table (:func:`ln_spans`); ``fold_wo``: cross attention sublayers whose W^O a
    session may fold into K'^T V (:func:`folded_wo`; folded only if the session's ``fuse``
    asks for "wo")."""

    raw_wo: frozenset = frozenset()
    ln_spans: Mapping = field(default_factory=dict)
    fold_wo: frozenset = frozenset()
    norm_gain: Mapping = field(default_factory=dict)

    def span(self, layernorm: str) -> tuple[int, int] | None:
        """The octaves of ``layernorm``'s table, or None for the whole table."""
        return self.ln_spans.get(layernorm)

    def gain(self, norm: str) -> int:
        """The power of two RMSNorm ``norm`` scales its rows by (:func:`rms_gain`; 0)."""
        return self.norm_gain.get(norm, 0)


GENERAL = Schedule()


def _read(calibration) -> tuple[Mapping, float]:
    """(layers, margin) of calibration metadata; ({}, 0) if it is missing or malformed (then
    every schedule choice falls back to the general one)."""
    if not isinstance(calibration, Mapping):
        return {}, 0.0
    layers, margin = calibration.get("layers"), calibration.get("margin")
    if not isinstance(layers, Mapping) or not isinstance(margin, (int, float)) \
            or not math.isfinite(margin):
        return {}, 0.0
    return layers, float(margin)


def deferred_wo(cfg: M.ModelConfig, calibration: Mapping | None, ring_cfg) -> frozenset:
    """The attention sublayers (``dec.i.self``, ``dec.i.cross``) whose decode-step o W^O may
    truncate by 2 frac, one round less each (:func:`protocols.layers.mha.finish` ``raw``): the
    product before it (cross: Q'(K'^T V); self: scores @ V, after Q'G and the scores took the
    row scale 1/n) is reshared untruncated. Exact while |o W^O| < ``arith.product_limit(frac,
    frac)`` (2^8 at frac 18), so only where the model's calibration (its public metadata,
    :mod:`protocols.calibration.calibrate`) records site ``wo_raw`` times its safety margin below
    that; none for a calibration of another frac, one without the site (calibrated before it
    existed), a softmax-style attention or "prob" truncation (which would fail with
    probability ~|z| 2^(3 frac - 64)). A schedule choice: the same function either way."""
    frac = ring_cfg.frac
    layers, margin = _read(calibration)
    if cfg.attention != M.PERFORMER or not layers or calibration.get("frac") != frac \
            or ring_cfg.trunc != "exact":
        return frozenset()
    limit = arith.product_limit(frac, frac)
    out = set()
    for i in range(cfg.n_dec_layers):
        for kind in ("self", "cross"):
            row = layers.get(f"dec.{i}.{kind}", {})
            v = row.get("wo_raw") if isinstance(row, Mapping) else None
            if isinstance(v, (int, float)) and margin >= 1.0 and 0 <= v * margin < limit:
                out.add(f"dec.{i}.{kind}")
    return frozenset(out)


def folded_wo(cfg: M.ModelConfig, calibration: Mapping | None, ring_cfg) -> frozenset:
    """The cross attention sublayers (``dec.i.cross``) whose W^O a decode session may fold
    into its K'^T V at decode_open (M_h = (K'^T V)_h W^O_h, h r d products once), so that
    each step forms o W^O = sum_h Q'_h M_h in one product: one round fewer per layer
    (:class:`protocols.stacks.decoder.FoldedWO`; the session asks for it with ``fuse`` "wo").
    Exact while |M| < ``arith.product_limit(frac)``, so only where the model's calibration
    records site ``kvwo`` times its safety margin below that (none for a calibration of
    another frac, one without the site, or a softmax-style attention). The steps' product
    is the o W^O every step forms (site ``wo``)."""
    layers, margin = _read(calibration)
    if cfg.attention != M.PERFORMER or not layers or calibration.get("frac") != ring_cfg.frac:
        return frozenset()
    limit = arith.product_limit(ring_cfg.frac)
    out = set()
    for i in range(cfg.n_dec_layers):
        row = layers.get(f"dec.{i}.cross", {})
        v = row.get("kvwo") if isinstance(row, Mapping) else None
        if isinstance(v, (int, float)) and margin >= 1.0 and 0 <= v * margin < limit:
            out.add(f"dec.{i}.cross")
    return frozenset(out)


def ln_spans(cfg: M.ModelConfig, calibration: Mapping | None) -> dict[str, tuple[int, int]]:
    """Decoder LayerNorm prefix -> the octaves (lo, hi) of var + eps its sqrt_inv table covers:
    the calibrated [min / margin^2, max * margin^2] (site ``var_eps``) rounded out to whole
    octaves, inside :data:`mpc3.kernels.fxp.FULL_SPAN`. The variance is quadratic in the
    LayerNorm's input, so margin^2 keeps the headroom the calibration gives every linear site:
    an input ``margin`` times larger or smaller in scale than the samples' stays inside its
    table (a narrower table is exact only inside it: outside it saturates). LayerNorms
    without a calibrated ``var_eps`` keep the whole table."""
    layers, margin = _read(calibration)
    margin = margin ** 2
    if cfg.norm != "layernorm" or not margin >= 1.0:
        return {}
    out = {}
    for layer, row in layers.items():
        v = row.get("var_eps") if isinstance(row, Mapping) else None
        if not layer.startswith("dec.") or not isinstance(v, (list, tuple)) or len(v) != 2 \
                or not all(isinstance(e, (int, float)) for e in v) or not 0 < v[0] <= v[1] \
                or not math.isfinite(v[1]):
            continue
        lo = max(fxp.LOG_LO, math.floor(math.log2(v[0] / margin)))
        hi = min(fxp.LOG_HI, math.ceil(math.log2(v[1] * margin)))
        out[layer] = (lo, max(hi, lo + 1)) if lo < fxp.LOG_HI else (fxp.LOG_HI - 1, fxp.LOG_HI)
    return out


#: the largest RMSNorm gain exponent (:func:`rms_gain`)
GAIN_MAX = 16


def rms_gain(row: Mapping, margin: float, frac: int) -> int:
    """The gain exponent k of an RMSNorm whose calibrated row ``row`` has sites ``var_eps``
    [min, max] of mean(x^2) + eps, ``sumsq`` (max sum_k x_k^2) and ``xgamma`` (max |x gamma|):
    its input rows are scaled by 2^k, so the mean square and the sum of squares grow by 4^k
    and x gamma by 2^k; the output does not change. k brings the geometric middle of the mean
    square's span to ~1, where both it and its inverse square root keep all ``frac``
    fractional bits (a mean square of 2^-11 keeps 7 significant bits, an inverse square root
    of 2^-7 only 11), as far as every site stays inside its range with the safety ``margin``;
    0 without the three sites or for spans already at or above 1 (k <= :data:`GAIN_MAX`)."""
    ve, sq, xg = row.get("var_eps"), row.get("sumsq"), row.get("xgamma")
    if not (isinstance(ve, (list, tuple)) and len(ve) == 2 and isinstance(sq, (int, float))
            and isinstance(xg, (int, float)) and margin >= 1.0 and 0 < ve[0] <= ve[1]):
        return 0
    want = min(GAIN_MAX, max(0, round(-math.log2(ve[0] * ve[1]) / 4)))
    limit = arith.product_limit(frac)
    k = 0
    while (k < want and ve[1] * 4.0 ** (k + 1) * margin <= fxp.SQRT_INV_RANGE[1]
           and sq * 4.0 ** (k + 1) * margin < limit and xg * 2.0 ** (k + 1) * margin < limit):
        k += 1
    return k


def norm_gains(calibration: Mapping | None) -> dict[str, int]:
    """The RMSNorm gains stored with a calibration (``norm_gain``; ints in [0, GAIN_MAX],
    anything else ignored: a malformed entry means gain 0, the general schedule)."""
    got = calibration.get("norm_gain") if isinstance(calibration, Mapping) else None
    if not isinstance(got, Mapping):
        return {}
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, int)
            and not isinstance(v, bool) and 0 <= v <= GAIN_MAX}


def session_schedule(cfg: M.ModelConfig, calibration: Mapping | None, ring_cfg) -> Schedule:
    """The :class:`Schedule` a model's calibration gives its decode sessions (``fold_wo`` for
    an encoder-decoder only)."""
    return Schedule(deferred_wo(cfg, calibration, ring_cfg), ln_spans(cfg, calibration),
                    folded_wo(cfg, calibration, ring_cfg)
                    if cfg.arch == M.ENCODER_DECODER else frozenset(),
                    norm_gains(calibration) if cfg.norm == "rmsnorm" else {})
