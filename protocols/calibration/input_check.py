"""The parties check a query user's secret input against the model's calibrated range.

The honest client refuses an input outside the range stored with the model before sharing
it (:func:`protocols.calibration.calibrate.check_input`); a modified client that skips that check
would otherwise get silent garbage, since the parties only hold shares. With this check (an
owner's choice at ``share-model --check-inputs``, stored in the model's metadata so that all
three parties run it) every job first computes, on shares, whether every element x of every
input with a calibrated range satisfies |x| <= lim, and opens that one bit - nothing else:

1. ``d = DReLU(L - x) , DReLU(L + x)`` over the full 64-bit window (``exact=True``: no
   magnitude bound, so a client cannot slip a huge value past it by wrapping the ring;
   ``L`` is the range in ring units, rounded up as the client's own check rounds). In
   Z_2^64, ``L - x >= 0`` exactly for x in [L - 2^63, L] and ``L + x >= 0`` exactly for x in
   [-L, 2^63 - 1 - L], so both bits are 1 exactly when -L <= x <= L.
2. ``s = sum(b2a(d))`` counts the satisfied comparisons; ``ok = DReLU(s - 2n)`` is 1 exactly
   when s = 2n (s never exceeds 2n); only ``ok`` is opened (injected and opened as one ring
   element), so an out-of-range input reveals one bit - that it was out of range - and not
   how many elements or which.

Cost (:func:`cost_input_check`): two exact DReLUs and two injections per element plus a
constant tail of one exact DReLU, one injection and one opening; rounds do not grow with n
beyond the DReLU's carry tree (log2 of the 64-bit window's blocks).
"""
from __future__ import annotations

import math

import numpy as np

from mpc3.kernels import arith, convert
from mpc3.kernels.base import Cost
from mpc3.kernels.thresholds import window_for
from mpc3.party import Party
from mpc3.shares import AShare

#: Model metadata key: the parties check inputs against the calibrated range.
META_KEY = "check_inputs"


class InputOutOfRange(ValueError):
    """An input's secret values left the model's calibrated range (only that is known)."""


def ring_limit(lim: float, frac: int) -> int:
    """The range in ring units, rounded up like the client's check (relative 1e-9 slack
    plus one ulp for the encoding's rounding)."""
    return math.floor(lim * (1 + 1e-9) * 2.0 ** frac) + 1


def in_range(p: Party, x: AShare, lim: float) -> bool:
    """Whether every element of the shared ``x`` lies in [-lim, lim] (real units); the
    three parties learn this bit and nothing else."""
    n = x.size
    L = np.full(n, ring_limit(lim, p.cfg.frac), dtype=np.uint64)
    flat = AShare(x.a.reshape(-1), x.b.reshape(-1))
    both = AShare(np.concatenate([-flat.a, flat.a]), np.concatenate([-flat.b, flat.b]))
    both = arith.add_public(p, both, np.concatenate([L, L]))       # L - x, L + x
    d = convert.b2a(p, convert.drelu_a(p, both, exact=True))
    s = AShare(np.atleast_1d(d.a.sum(dtype=np.uint64)), np.atleast_1d(d.b.sum(dtype=np.uint64)))
    short = arith.add_public(p, s, np.array([(-2 * n) % (1 << 64)], dtype=np.uint64))
    ok = convert.b2a(p, convert.drelu_a(p, short, exact=True))
    return int(arith.open_a(p, ok)[0]) == 1


def cost_input_check(n: int, cfg) -> Cost:
    """Declared cost of :func:`in_range` on ``n`` elements."""
    win = window_for(cfg, exact=True)
    return (convert.cost_drelu(2 * n, cfg, win=win) + convert.cost_b2a(2 * n)
            + convert.cost_drelu(1, cfg, win=win) + convert.cost_b2a(1) + arith.cost_open_a(1))


def checked_inputs(meta: dict, inputs: dict) -> list[tuple[str, float]]:
    """(input name, calibrated range) of the inputs a model's jobs check, [] if its owner
    did not ask for the check."""
    if not meta.get(META_KEY):
        return []
    ranges = (meta.get("calibration") or {}).get("input_range") or {}
    return [(name, float(ranges[name])) for name in sorted(inputs) if name in ranges]


def check_inputs(p: Party, meta: dict, inputs: dict) -> bool:
    """Raise :class:`InputOutOfRange` (at every party alike) if an input leaves its range;
    whether the model asked for any check."""
    checks = checked_inputs(meta, inputs)
    for name, lim in checks:
        if not in_range(p, inputs[name], lim):
            raise InputOutOfRange(
                f"input {name} lies outside the model's calibrated range [-{lim:.4g}, "
                f"{lim:.4g}] (checked on shares; the client should have refused it before "
                f"sharing: use an unmodified mpc3 client)")
    return bool(checks)
