"""The party context: everything a kernel needs, passed explicitly (no module globals).

A :class:`Party` carries its rank, communicator, job PRG keys, the ring configuration and a
kernel-call counter ``kop`` used to key correlated randomness (see :mod:`mpc3.prg`). Three
parties can live in one process (tests, :mod:`mpc3.sim`) because nothing is global.

Roles. Asymmetric protocols are written for three roles relative to a *leader* ``g``:
``role = (rank - g) % 3``. Role 0 (the "single") holds slots ``g, g+1`` of a replicated
sharing, so it knows ``A = x_g + x_{g+1}``; roles 1 and 2 (the "pair") both hold slot
``g+2 = B``. Elements are split into three groups led by parties 0, 1, 2 so that every party
plays every role on a third of the data and the traffic stays balanced.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from . import ring
from .comm import Communicator, CommStats
from .prg import PRG

TRUNC_MODES = ("exact", "prob")


@dataclass(frozen=True)
class RingConfig:
    """Typed knobs of the arithmetic.

    frac: fixed-point fractional bits (default 18: ulp 3.8e-6, products carry 36 fractional
        bits; truncated products are exact while |x*y| < 2^26: arith.product_limit).
    trunc: "exact" (default) - truncation never fails for |x| < 2^62, costs 3*frac extra
        bits per element and a second round; "prob" - the classic share-local truncation
        (SecureML/ABY3) in one round at the RSS minimum of one ring element per party,
        failing with probability ~|x|/2^64 per element (|x| the value at scale 2*frac before
        truncation). Both round stochastically (mpc3.kernels.arith): the result is
        floor(x/2^f) or floor(x/2^f) + 1 with mean exactly x/2^f (unbiased), so every
        error is below 1 ulp and chained products do not drift.
    relu_bound_bits: DReLU/ReLU/MSB inputs must satisfy |x| < 2^relu_bound_bits in real units
        (mpc3.kernels.convert.relu_limit; 2^(frac + relu_bound_bits) at scale frac).
    relu_drop_bits: low bits ignored by DReLU; DReLU(x) may be 1 for x in [-2^drop, 0) ulp
        (DReLU(x) is exact for x >= 0, in particular DReLU(0) = 1).
    """

    frac: int = ring.DEFAULT_FRAC
    trunc: str = "exact"
    relu_bound_bits: int = 14
    relu_drop_bits: int = 6

    def __post_init__(self) -> None:
        if not 1 <= self.frac <= 30:
            raise ValueError(f"frac={self.frac} outside 1..30")
        if self.trunc not in TRUNC_MODES:
            raise ValueError(f"trunc={self.trunc!r}, expected one of {TRUNC_MODES}")
        if self.frac + self.relu_bound_bits > 60:
            raise ValueError("frac + relu_bound_bits must be <= 60")
        if not 0 <= self.relu_drop_bits < self.frac + self.relu_bound_bits:
            raise ValueError("relu_drop_bits out of range")


@dataclass
class Party:
    rank: int
    comm: Communicator
    prg: PRG
    cfg: RingConfig = field(default_factory=RingConfig)
    kop: int = 0
    kop_top: int = field(default=0, repr=False)   # highest counter handed out so far
    #: a real party runs the protocols; a :class:`mpc3.shadow.ShadowParty` sets this to
    #: itself and the kernels hand over to it (their ``site`` keywords are for it only)
    shadow = None
    #: malicious mode: a :class:`mpc3.checks.Checks` that verified kernels register their
    #: messages with (None: semi-honest, nothing extra is done)
    checks = None
    #: a benchmark's profiler (:class:`protocols.jobs.breakdown.Recorder`), told of every
    #: call of a :func:`profiled` entry point; None: nothing is told
    profiler = None

    def __post_init__(self) -> None:
        if self.rank not in (0, 1, 2):
            raise ValueError(f"rank must be 0, 1 or 2, got {self.rank}")
        if self.comm.rank != self.rank:
            raise ValueError("communicator rank differs from party rank")

    @property
    def stats(self) -> CommStats:
        return self.comm.stats

    def new_op(self) -> int:
        """Start a kernel invocation: a fresh key for its correlated randomness - above every
        key handed out before, also when lockstep kernels (mpc3.kernels.base.lockstep) have
        switched ``kop`` back to one of theirs."""
        self.kop = self.kop_top = max(self.kop, self.kop_top) + 1
        return self.kop

    def at(self, layer: str) -> "Party":
        """This party (a shadow party files its records under ``layer``)."""
        return self

    def role(self, leader: int) -> int:
        return (self.rank - leader) % 3

    # -- randomness -------------------------------------------------------------------
    def rand(self, stream: str, shape, tag: str) -> np.ndarray:
        return self.prg.ring(stream, self.kop, tag, shape)

    def rand_with(self, my_role: int, other_role: int, shape, tag: str) -> np.ndarray:
        """Randomness shared with the party playing ``other_role`` (roles of one group)."""
        return self.rand(self._stream_to(my_role, other_role), shape, tag)

    def rand_many(self, stream: str, items) -> list[np.ndarray]:
        """Several draws ``(tag, shape)`` of one stream, equal to :meth:`rand` each."""
        return self.prg.ring_many(stream, self.kop, items)

    def rand_with_many(self, my_role: int, other_role: int, items) -> list[np.ndarray]:
        return self.rand_many(self._stream_to(my_role, other_role), items)

    @staticmethod
    def _stream_to(my_role: int, other_role: int) -> str:
        d = (other_role - my_role) % 3
        if d == 0:
            raise ValueError("no shared stream with oneself")
        return "next" if d == 1 else "prev"

    def zero_share(self, shape, tag: str) -> np.ndarray:
        """3-out-of-3 additive sharing of zero: next-stream minus prev-stream."""
        return self.add_zero_share(np.zeros(shape, dtype=np.uint64), tag)

    def add_zero_share(self, z: np.ndarray, tag: str) -> np.ndarray:
        """``z`` plus this party's share of zero (:meth:`zero_share`), in place with one draw
        alive at a time (a product's mask: no array of the zero sharing itself); returns
        ``z``."""
        z += self.rand("next", z.shape, tag)
        z -= self.rand("prev", z.shape, tag)
        return z


def profiled(fn):
    """An entry point a profiler attributes costs to (:mod:`protocols.jobs.breakdown`): a
    call whose party has a ``profiler`` opens a region named ``module.function`` while it runs
    (``profiler.enter(name)``, then ``profiler.exit()`` if it returned True); with none (every
    party of a job, a shadow party) the call goes straight on. In malicious mode the return
    from an outermost entry point is a point between kernels, where the party's checks may
    flush (:meth:`mpc3.checks.Checks.checkpoint`)."""
    name = f"{fn.__module__}.{fn.__name__}"

    def run(p, args, kw):
        prof = getattr(p, "profiler", None)
        if prof is None or not prof.enter(name):
            return fn(p, *args, **kw)
        try:
            return fn(p, *args, **kw)
        finally:
            prof.exit()

    @functools.wraps(fn)
    def entry(p, *args, **kw):
        checks = getattr(p, "checks", None)
        if checks is None:
            return run(p, args, kw)
        if not checks.depth:
            checks.entry = name      # the outermost entry point open (Checks.between_blocks)
        checks.depth += 1
        try:
            out = run(p, args, kw)
        finally:
            checks.depth -= 1
        checks.checkpoint(p, name)   # between two kernels: malicious mode may flush here
        return out
    entry.profiled = name
    return entry
