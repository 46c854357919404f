"""Checks of the calibration stored with a shared transformer ("right or refused" where the
job runs, not only where the model was shared).

``share-model`` calibrates a model (:mod:`protocols.calibration.calibrate`) and stores the result in
the model's public metadata; the parties then run only what it allows and the query user's
client refuses inputs outside its input range. A model uploaded without that step
(``ModelOwner.upload`` with metadata of its own) or whose stored metadata was edited would
otherwise run, and a value that leaves a kernel's range comes back as garbage with no error.
So the parties (at upload and before a model's jobs) and the query user's client (before it
shares inputs) check, with :func:`check_stored`, that the calibration

* is there, parses, has the current :data:`protocols.calibration.calibrate.VERSION`, a finite margin
  >= 1, and was taken as the model runs: the ring's frac and ReLU bound, the model's
  ``ln_eps``, its ``fold_omega`` and its decode block;
* records every value as a finite magnitude (or a [min, max] span, as the calibration
  records that site) inside its kernel's range with the margin (:meth:`Calibration.check`);
* covers every (layer, site) the model's protocols reach (:func:`sites_reached`: the
  calibration's own run - the secure stacks on a shadow party - on a copy of the config
  shrunk to a tiny width - same architecture, layers, attention, norms and flags - with
  random weights on short samples; the sites a model reaches do not depend on its widths,
  ``tests/protocols/calibration/test_calibration_check.py``);
* gives a finite, positive input range for every input the model's job kinds take.

The work is bounded by the metadata's size, never by the config's widths or length: the
config's layers must each have a row in the (size-limited) calibration, at most
:data:`MAX_LAYERS`, before anything is traced, and the trace runs at the tiny width on at
most :data:`TRACE_LEN` positions.

What no check here can catch: a calibration that is self-consistent but false - an owner
recording values its model does not reach. Parties hold only shares of the weights, so they
cannot recompute the values; they trust the owner's calibration of its own model as they
trust its weights (README, threat model).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Mapping

import numpy as np

from mpc3.party import RingConfig
from protocols import model as M
from protocols.layers.attention import default_decode_block

from .calibrate import VERSION, Calibration, RangeError, Samples, calibrate

#: The shrunk copy's widths (:func:`narrowed`); tests trace at others to show they do not
#: matter.
NARROW = {"n_heads": 2, "d_head": 2, "n_features": 2, "d_ff": 4, "vocab": 4}
#: Positions of the longer trace sample (capped at max_len): enough for several keys per row
#: and for decode blocks on either side of the block boundary.
TRACE_LEN = 4
#: Most layers a stored calibration can cover: it takes >= 230 bytes of JSON per layer
#: (measured over the grid of tests/protocols/calibration/test_calibration_check.py), and a
#: party takes at most 64 KB of public metadata (``net.party.service.MAX_META``): ~280 layers.
#: More are refused before anything is run (the calibration of 320 tiny layers takes 9-11 s,
#: benchmarks/calibration_cost.py; a config is checked once, :func:`_reached`).
MAX_LAYERS = 320


def narrowed(cfg: M.ModelConfig, n_heads: int = NARROW["n_heads"],
             d_head: int = NARROW["d_head"], n_features: int = NARROW["n_features"],
             d_ff: int = NARROW["d_ff"], vocab: int = NARROW["vocab"]) -> M.ModelConfig:
    """``cfg`` at a tiny width: the same architecture, layers, attention, norms, flags and
    max_len; d_model = n_heads * d_head, d_ff, the Performer features, the vocabularies and
    classes at most ``vocab``."""
    small = {k: min(getattr(cfg, k), vocab) for k in ("src_vocab", "tgt_vocab", "n_classes",
                                                     "type_vocab") if getattr(cfg, k)}
    return dataclasses.replace(cfg, d_model=n_heads * d_head, n_heads=n_heads, d_head=d_head,
                               n_features=n_features, d_ff=d_ff, **small).validate()


def sites_reached(cfg: M.ModelConfig, fold_omega: bool = True, **widths) -> dict:
    """The (layer, site) values the calibration of ``cfg`` records - ``layers[layer][site]``,
    a magnitude or a [min, max] span - from :func:`protocols.calibration.calibrate.calibrate` itself
    (unchecked) on :func:`narrowed` ``cfg`` with random weights: one sample of
    min(max_len, TRACE_LEN) positions and one of a single position, as the default samples
    go from max_len down to 1. A Performer's decode blocks reach their sites by how max_len
    compares with the model's decode block (below: no block is folded; at it: one; above:
    a folded prefix as well), so the short trace keeps that comparison with a small block.
    ``widths``: :func:`narrowed`'s."""
    small = narrowed(cfg, **widths)
    block = default_decode_block(cfg.n_features, cfg.d_head)     # what the model's jobs use
    T = min(cfg.max_len, TRACE_LEN)
    small_block = T if cfg.max_len == block else (T + 1 if cfg.max_len < block else T - 1)
    rng = np.random.default_rng(0)
    X = [rng.standard_normal((1, n, small.d_model)) for n in sorted({T, 1}, reverse=True)]
    Y = [rng.standard_normal((1, T, small.d_model)) for _ in X]
    return calibrate(small, M.random_weights(small, 0), Samples(X, Y), fold_omega=fold_omega,
                     decode_block=small_block, check=False).layers


@functools.lru_cache(maxsize=64)
def _reached(cfg: M.ModelConfig, fold_omega: bool) -> dict:
    """:func:`sites_reached` of a config, kept (read-only): a party checks a model when it is
    shared and again before its first job, and the sites depend on the config alone."""
    return sites_reached(cfg, fold_omega)


def _value_error(layer: str, site: str, v, span: bool) -> str | None:
    """Why a recorded value is not a finite magnitude / [min, max] span, or None."""
    def real(a) -> bool:
        return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a)

    if span:
        if isinstance(v, list) and len(v) == 2 and all(real(a) for a in v) and v[0] <= v[1]:
            return None
        return f"{layer}.{site} is {v!r}, not a finite [min, max] span"
    if real(v) and v >= 0:
        return None
    return f"{layer}.{site} is {v!r}, not a finite magnitude >= 0"


def check_stored(stored, cfg: M.ModelConfig, fold_omega: bool, inputs: Iterable[str],
                 ring: RingConfig) -> Calibration:
    """The calibration ``stored`` in a shared model's metadata (``Calibration.to_dict()``)
    of a model of config ``cfg`` (shared with ``fold_omega``, its jobs taking ``inputs``,
    run on ``ring``), checked as the module docstring says; ValueError with one line saying
    what is wrong, from the model's side ("its calibration ...")."""
    if stored is None:
        raise ValueError("it has no calibration")
    if not isinstance(stored, Mapping):
        raise ValueError("its calibration is not a JSON object")
    if stored.get("version") != VERSION:
        raise ValueError(f"its calibration is version {stored.get('version')!r}, not the "
                         f"current {VERSION} (the protocols changed since it was calibrated)")
    try:
        cal = Calibration.from_dict(stored)
    except KeyError as exc:
        raise ValueError(f"its calibration is malformed (no {exc.args[0]!r})") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"its calibration is malformed ({exc})") from None
    if not (math.isfinite(cal.margin) and cal.margin >= 1.0):
        raise ValueError(f"its calibration's safety margin {cal.margin!r} is not >= 1")
    runs = {"frac": ring.frac, "relu_bound_bits": ring.relu_bound_bits,
            "ln_eps": float(cfg.ln_eps), "fold_omega": bool(fold_omega),
            "decode_block": default_decode_block(cfg.n_features, cfg.d_head)}
    for key, want in runs.items():
        if getattr(cal, key) != want:
            raise ValueError(f"its calibration was taken with {key} = {getattr(cal, key)!r}; "
                             f"the model runs with {want!r}")
    layers = cfg.n_enc_layers + cfg.n_dec_layers
    if layers > min(len(cal.layers), MAX_LAYERS):   # bounds the trace below
        raise ValueError(f"its calibration has {len(cal.layers)} rows for a model of "
                         f"{layers} layers" + (f" (at most {MAX_LAYERS} fit the metadata)"
                                               if layers > MAX_LAYERS else ""))
    reached = _reached(cfg, bool(fold_omega))
    missing = [f"{layer}.{site}" for layer, row in reached.items() for site in row
               if site not in cal.layers.get(layer, {})]
    if missing:
        total = sum(len(row) for row in reached.values())
        raise ValueError(f"its calibration lacks {len(missing)} of the {total} sites the "
                         f"model reaches ({', '.join(missing[:5])}"
                         f"{', ...' if len(missing) > 5 else ''})")
    for layer, row in cal.layers.items():
        for site, v in row.items():
            span = isinstance(reached.get(layer, {}).get(site, v), list)
            why = _value_error(layer, site, v, span)
            if why:
                raise ValueError(f"its calibration is malformed: {why}")
    try:
        cal.check()
    except RangeError as exc:
        raise ValueError(f"its calibration is out of range at {exc}") from None
    for name in sorted(inputs):
        r = cal.input_range.get(name)
        if r is None:
            raise ValueError(f"its calibration has no input range for {name} (has: "
                             f"{', '.join(sorted(cal.input_range)) or 'none'})")
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"its calibrated input range for {name} is {r!r}, not a finite "
                             "bound > 0")
    return cal


def refusal(model_id: str, why: str) -> str:
    """The one line that refuses a model ``check_stored`` found wrong (upload, job, client)."""
    return (f"model {model_id!r} cannot run: {why}; its owner must share it again with "
            "'mpc3 share-model', which calibrates it")
