"""The shadow party: the kernels' ideal functionalities on plaintext ring values (SPU's
"ref2k" idea), for running the secure stacks themselves as a float64-checked plaintext
program that reports what reaches every range-limited kernel.

A :class:`ShadowParty` stands where a :class:`mpc3.party.Party` does. Its shares are
``AShare(x, 0)``: slot a holds the whole ring value, slot b zero, so every local operation
the stacks do on shares (sums, slices, ``scale``, public additions at rank 0, cumulative
sums over ``uint64``) computes the plaintext ring value exactly as the three parties'
shares would sum to it. Every kernel that communicates checks ``p.shadow`` at its entry and
hands over to the same-named method here, which

* computes the kernel's *ideal* output (the exact product truncated to the nearest, exact
  ReLU / 1/sqrt / exp / reciprocal / GELU / SiLU / tanh) in float64 on the decoded ring
  values and encodes it back, so the stacks go on with fixed-point values as the parties
  would, without the protocols' approximation errors or their randomness (and, past a
  kernel's range, with the true value where the parties' would be garbage, while it fits
  64 bits);
* calls ``record(layer, site, kind, values)`` with the values *as the range-limited step
  sees them*, in ring units (integer-valued floats, never reduced mod 2^64): a product
  before its truncation and before a public scale in it (``kind`` "product"), any other
  kernel's input ("relu", "sqrt_inv", ...). ``site`` is the name the stack passed
  (``site=`` / ``sites=`` keywords of the kernels, None for a kernel the calibration does
  not track) and ``layer`` the scope the stack set with :meth:`at`. The recorder (in
  ``protocols``: :mod:`protocols.calibration.shadow`) turns ring units into the site's real units.

Nothing here runs on a party of a job: a ShadowParty has no communicator, no PRG and no
secret; it exists for the calibration of a model by its owner and for tests. A real
:class:`Party` has ``shadow = None`` and its kernels take the ``site`` keywords and ignore
them, so rounds, bytes and values of the secure run are unchanged.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import ring
from .kernels.activations import gelu_ref
from .kernels.silu import silu_ref
from .party import RingConfig
from .shares import AShare, BShare, SplitShare, bits_to_planes, planes_to_bits

Record = Callable[[str, str, str, "float | tuple[float, float] | None"], None]

#: kernels with a two-sided range: their inputs are reported as (min, max)
SPAN_KINDS = ("sqrt_inv", "exp", "reciprocal")

#: the "max-subtracted" exp's floor (mpc3.kernels.fxp.EXP_NEG_FLOOR), copied: fxp imports
#: party and arith, which would import this module's users back.
_EXP_NEG_FLOOR = 32.0


def _ignore(layer: str, site: str, kind: str, values: np.ndarray) -> None:
    return None


class _Constant(AShare):
    """A shadow share of a model constant held as its ring units alone (float64 integers,
    exact: encoded values stay below 2^62 and weights' far below 2^53), which the products
    use as they are; its ring halves are made when a local operation asks for them (slot b
    a read-only zero view). ``units`` may map a file
    (protocols.calibration.shadow.ShadowTensors)."""

    def __init__(self, units: np.ndarray) -> None:          # (not the dataclass's fields)
        self.units = units

    @property
    def a(self) -> np.ndarray:
        return self.units.astype(np.int64).view(np.uint64)

    @property
    def b(self) -> np.ndarray:
        return np.broadcast_to(np.zeros((), np.uint64), self.units.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.units.shape

    @property
    def size(self) -> int:
        return self.units.size


class ShadowParty:
    """A party whose kernels run their ideal functionality on plaintext ring values."""

    rank = 0
    kop = 0                     # (mpc3.kernels.base.run_steps saves and restores it)
    checks = None               # nothing to verify: no messages (mpc3.checks)

    def __init__(self, cfg: RingConfig = RingConfig(), record: Record = _ignore,
                 layer: str = "") -> None:
        self.cfg, self.record, self.layer = cfg, record, layer
        self.shadow = self

    def at(self, layer: str) -> "ShadowParty":
        """The same party with its records filed under ``layer`` (a view: the caller's own
        scope is unchanged, so ``f(p.at(a), g(p.at(b)))`` files each call right)."""
        return ShadowParty(self.cfg, self.record, layer)

    def new_op(self) -> int:
        return 0

    # ------------------------------------------------------------------ values ----
    @staticmethod
    def share(x: np.ndarray) -> AShare:
        """The shadow share of a ring array."""
        x = ring.check_ring(np.asarray(x), "x")
        return AShare(x.copy(), np.zeros_like(x))

    @staticmethod
    def constant(t: np.ndarray, frac: int) -> AShare:
        """A model constant (a float tensor, used as it is by many calls) encoded at ``frac``
        fractional bits (:func:`mpc3.ring.encode`) as a shadow share."""
        return _Constant(ring.to_signed(ring.encode(t, frac)).astype(np.float64))

    @staticmethod
    def constant_units(units: np.ndarray) -> AShare:
        """A model constant from the ring units :meth:`constant` made (``.units``)."""
        return _Constant(units)

    @staticmethod
    def value(x) -> np.ndarray:
        """Ring units (signed, as float64) of a shadow share or split share."""
        if isinstance(x, _Constant):
            return x.units
        return ring.to_signed(np.asarray(x.a + x.b)).astype(np.float64)

    def _enc(self, v: np.ndarray) -> AShare:
        """Ring units (float) -> a shadow share, rounded to the nearest. A value beyond a
        kernel's range (a product above its limit) goes on with its true value, as the
        float64 trace it replaced did, while it fits 64 bits; beyond, it wraps."""
        v = np.rint(np.asarray(v, dtype=np.float64))
        if v.size and np.abs(v).max() >= 2.0 ** 63:
            v = np.mod(v + 2.0 ** 63, 2.0 ** 64) - 2.0 ** 63
        a = v.astype(np.int64).view(np.uint64)
        return AShare(a, np.zeros(a.shape, np.uint64))

    def _real(self, x, frac: int | None = None) -> np.ndarray:
        return self.value(x) / 2.0 ** (self.cfg.frac if frac is None else frac)

    def _note(self, site: str | None, kind: str, values: np.ndarray) -> None:
        """Report ``values`` reaching a ``kind`` kernel at ``site``: their (min, max) for a
        kernel with a two-sided range (sqrt_inv, exp, reciprocal), else their largest
        magnitude (both 0.0 for no values)."""
        if site is None:
            return
        v = np.asarray(values, dtype=np.float64)
        if kind in SPAN_KINDS:
            got = (float(v.min()), float(v.max())) if v.size else None
        else:
            got = float(np.abs(v).max()) if v.size else 0.0
        self.record(self.layer, site, kind, got)

    # ---------------------------------------------------------------- products ----
    def _shift(self, trunc):
        """(shift, multipliers or None) of a ``trunc`` argument (arith.mul_aa's)."""
        if trunc is True:
            return self.cfg.frac, None
        if trunc is False:
            return 0, None
        if hasattr(trunc, "mult"):                       # arith.Scaled
            return trunc.shift, np.asarray(trunc.mult, dtype=np.float64)
        return np.asarray(trunc), None

    def _product(self, x, y, kind: str, trunc, site, keep=None) -> np.ndarray:
        """The ring units of one (mat)product after its truncation; records it before."""
        xv, yv = self.value(x), self.value(y)
        if kind == "mul":
            z = xv * yv
        elif yv.ndim == 2 and xv.ndim > 2:      # rows of a batch times a weight: one GEMM
            z = (xv.reshape(-1, xv.shape[-1]) @ yv).reshape(xv.shape[:-1] + yv.shape[-1:])
        else:
            z = np.matmul(xv, yv)
        if keep is not None:
            z = np.where(np.broadcast_to(keep, z.shape), z, 0.0)
        self._note(site, "product", z)
        shift, mult = self._shift(trunc)
        if mult is not None:
            z = z * np.broadcast_to(mult, z.shape)
        return z / np.exp2(shift)

    def trunc(self, x, bits, mult=None) -> AShare:
        """x * mult / 2^bits (a standalone truncation, mpc3.kernels.truncation)."""
        v = self.value(x)
        if mult is not None:
            v = v * np.asarray(mult, dtype=np.float64)
        return self._enc(v / np.exp2(np.asarray(bits, dtype=np.float64)))

    def mul_aa(self, x, y, trunc=True, site=None) -> AShare:
        return self._enc(self._product(x, y, "mul", trunc, site))

    def matmul_aa(self, x, y, trunc=True, site=None) -> AShare:
        return self._enc(self._product(x, y, "matmul", trunc, site))

    def mul_many_aa(self, items: list[tuple], sites=None) -> list[AShare]:
        sites = sites or [None] * len(items)
        return [self._enc(self._product(it[0], it[1], it[2], it[3], s,
                                        it[4] if len(it) > 4 else None))
                for it, s in zip(items, sites)]

    def mul_split_aa(self, items, trunc=True, replicated=None, biases=None, sites=None):
        """Split items flattened (kept entries, biases added) as one SplitShare; the
        ``replicated`` ones completed. ``sites``: one per item, then one per replicated."""
        sites = list(sites or [None] * (len(items) + len(replicated or [])))
        flat = []
        for it, b, s in zip(items, biases or [None] * len(items), sites):
            keep = it[3] if len(it) > 3 else None
            z = self._product(it[0], it[1], it[2], trunc, s, keep)
            if b is not None:
                z = z + np.broadcast_to(self.value(b), z.shape)
            flat.append(z[np.broadcast_to(keep, z.shape)] if keep is not None else z.reshape(-1))
        v = self._enc(np.concatenate(flat) if flat else np.zeros(0))
        split = SplitShare(v.a, v.b)
        if replicated is None:
            return split
        rest = sites[len(items):]
        return split, [self._enc(self._product(x, y, kind, trunc, s))
                       for (x, y, kind), s in zip(replicated, rest)]

    # ------------------------------------------------------------- nonlinear ----
    def relu_a(self, x, site=None) -> AShare:
        v = self.value(x)
        self._note(site, "relu", v)
        return self._enc(np.maximum(v, 0.0))

    def drelu_a(self, x, site=None) -> BShare:
        v = self.value(x).reshape(-1)
        self._note(site, "relu", v)
        bits = bits_to_planes((v >= 0).astype(np.uint8)[None])
        return BShare(bits, np.zeros_like(bits), v.size)

    def mul_ab(self, bit: BShare, x) -> AShare:
        b = planes_to_bits(bit.a ^ bit.b, bit.n)[0].astype(np.float64)
        v = self.value(x)
        return self._enc(v * (b.reshape(v.shape) if bit.n == v.size else
                              b.reshape(v.shape[:1] + (1,) * (v.ndim - 1))))

    def _func(self, x, site, kind, fn) -> AShare:
        r = self._real(x)
        self._note(site, kind, self.value(x))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = fn(r)
        return self._enc(np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
                         * 2.0 ** self.cfg.frac)

    def sqrt_inv_a(self, x, site=None) -> AShare:
        return self._func(x, site, "sqrt_inv", lambda r: 1.0 / np.sqrt(r))

    def reciprocal_a(self, x, site=None) -> AShare:
        return self._func(x, site, "reciprocal", lambda r: 1.0 / r)

    def exp_a(self, x, site=None) -> AShare:
        return self._func(x, site, "exp", np.exp)

    def exp_neg_a(self, x, site=None) -> AShare:
        """exp of x <= 0; its floor comparison sees |x| + the floor at most (recorded as
        that bound, a "relu" site)."""
        v = self.value(x)
        self._note(site, "relu", np.abs(v) + _EXP_NEG_FLOOR * 2.0 ** self.cfg.frac)
        return self._func(x, None, "exp", np.exp)

    def gelu_a(self, x, site=None) -> AShare:
        return self._func(x, site, "gelu", gelu_ref)

    def silu_a(self, x, site=None) -> AShare:
        return self._func(x, site, "silu", silu_ref)

    def tanh_a(self, x, site=None) -> AShare:
        return self._func(x, site, "tanh", np.tanh)

    def argmax_a(self, x, site=None) -> AShare:
        """The index of each row's largest entry (the lowest among ties), in fixed point;
        every difference the tournament compares lies within its row's spread max - min,
        recorded (a "relu" site)."""
        v = self.value(x)
        self._note(site, "relu", v.max(axis=1) - v.min(axis=1))
        return self._enc(np.argmax(v, axis=1) * 2.0 ** self.cfg.frac)

    def max_rows_a(self, x, lengths, site=None) -> AShare:
        """Row maxima; every difference the tournament compares lies within its row's
        spread max - min, recorded (a "relu" site)."""
        v = self.value(x).reshape(-1)
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        hi, lo = np.maximum.reduceat(v, starts), np.minimum.reduceat(v, starts)
        self._note(site, "relu", hi - lo)
        return self._enc(hi)
