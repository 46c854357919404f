"""The tamper harness (issue 35): one party deviates in one message, for tests and the
semi-honest baseline (``benchmarks/tamper_semihonest.py``). No module of mpc3/, protocols/,
net/ or app/ imports it (``tests/system/test_layering.py`` checks), so no party process can
be made to cheat through it.

:func:`attach` wraps a party's :class:`~mpc3.comm.Communicator` in a :class:`TamperComm`: the
same ``op`` counter and the same :class:`~mpc3.comm.CommStats` object, every message handed to
the wrapped transport's ``_post``/``_take`` unchanged - so an untampered run is bit-identical
with and without the wrapper (same bytes, rounds, values) - except the one message a
:class:`Target` names, to which the wrapper applies one :class:`Deviation` as the sender
(the cheating party is the target's ``party``; ``direction`` is NEXT or PREV).

A target names its message by the op counter (``op``), or as the ``k``-th message (from 0)
the party sends in that direction inside a named kernel (``kernel``, ``k``), or it is drawn
at random by :func:`draw` from the messages of an untampered run (:func:`run` returns their
log: messages are data-independent in this SPMD code, so the tampered run sends the same
ones up to the deviation). The kernel a message belongs to is a label, set around a call by
:func:`scope` (``labelled(kernel)`` for a catalog kernel), read only by the harness; a
kernel's own code does not know it. The innermost label counts: kernels called inside a
labelled one (a relu's comparisons) send under its label, and the kernels of a layer are
labelled only where a test puts a scope around them (nothing patches kernel functions).
The wrapper needs only its transport's ``_post``/``_take``/``abort``, so it fits the gRPC
transport (net.peer.router.PeerComm) too; only the in-process simulator is wired up here.

Deviations, on the arrays as they travel (ring elements are uint64; boolean shares and
width-packed values travel as bytes, :func:`mpc3.ring.pack_bits`), so an "element" is one
entry of a payload array, counted flat across the message's arrays:

* ``add``: entry += ``error`` modulo its width (2^64 for a ring element, 2^8 for a byte; an
  error that is 0 modulo a byte's width becomes 1 there - the record keeps the one applied);
* ``flip``: one bit of one entry;
* ``replace``: every array of the message by fresh uniform entries of its shape ("replace a
  share": the whole message is the cheater's choice, not the protocol's);
* ``duplicate``: the message is posted twice under its op. Messages are keyed by the op
  counter (mpc3.comm), so the receiver takes the first copy and meets the second where it
  expects the next op (:class:`~mpc3.comm.ProtocolError`); after a party's last message the
  copy is never read;
* ``replay``: in place of the message, the latest earlier message this party sent in the
  same direction, re-tagged with the current op - preferably one of the same array shapes
  and dtypes (a replay the receiver cannot tell from the real message by its form), else
  the latest at all; :class:`NotApplicable` if there is none (:func:`draw` picks only
  messages with an earlier one for ``replay``).

Elements, bits and random entries come from ``Deviation.seed`` when not given, so a trial
is reproducible. Each applied deviation leaves a :class:`Record` (party, direction, op,
kernel, k, array, element, bit, kind, the entry before and after).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .comm import NEXT, PREV, Communicator, CommStats, Payload
from .kernels import catalog
from .party import RingConfig
from .sim import make_parties, run_parties

KINDS = ("add", "flip", "replace", "duplicate", "replay")


class NotApplicable(ValueError):
    """The deviation cannot be applied to the targeted message (nothing to replay, no entry
    to change)."""


@dataclass(frozen=True)
class Sent:
    """One message as its sender handed it to the transport (before any deviation)."""

    party: int
    direction: int                # NEXT or PREV
    op: int                       # the communicator's op counter
    kernel: str | None            # the innermost label set by scope(), None outside any
    k: int                        # this party's k-th message in ``direction`` inside ``kernel``
    kop: int | None               # the party's kernel counter (Party.kop) when it was sent
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    entries: int                  # entries across the arrays (what ``add``/``flip`` choose from)


@dataclass(frozen=True)
class Target:
    """Which message the cheating ``party`` tampers with: by ``op``, or the ``k``-th it sends
    in ``direction`` inside ``kernel``."""

    party: int
    direction: int
    op: int | None = None
    kernel: str | None = None
    k: int = 0

    def __post_init__(self) -> None:
        if self.party not in (0, 1, 2) or self.direction not in (NEXT, PREV):
            raise ValueError(f"target party {self.party}, direction {self.direction}")
        if (self.op is None) == (self.kernel is None):
            raise ValueError("a target names its message by op or by kernel (one of them)")

    def matches(self, sent: Sent) -> bool:
        if (sent.party, sent.direction) != (self.party, self.direction):
            return False
        if self.op is not None:
            return sent.op == self.op
        return sent.kernel == self.kernel and sent.k == self.k


@dataclass(frozen=True)
class Deviation:
    """What is done to the targeted message (see the module docstring for each kind)."""

    kind: str
    error: int = 1                 # add: the error, taken modulo the entry's width
    element: int | None = None     # add/flip: flat entry index; None: drawn from ``seed``
    bit: int | None = None         # flip: bit of the entry; None: drawn from ``seed``
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"deviation {self.kind!r}, expected one of {KINDS}")


@dataclass(frozen=True)
class Record:
    """What the harness did to one message."""

    party: int
    direction: int
    op: int
    kernel: str | None
    k: int
    kind: str
    array: int | None = None       # add/flip: which array of the message
    element: int | None = None     # add/flip: flat entry index across the message
    bit: int | None = None         # flip
    error: int | None = None       # add: the error applied (modulo the entry's width)
    before: int | None = None      # add/flip: the entry as the protocol made it
    after: int | None = None       # add/flip: the entry as sent
    replayed_op: int | None = None  # replay: the op whose payload was sent instead

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class TamperComm(Communicator):
    """A party's communicator with the harness in front of its transport (see
    :func:`attach`)."""

    inner: Communicator | None = None
    target: Target | None = None
    deviation: Deviation | None = None
    keep: bool = False             # keep copies of every payload sent and received
    party: Any = field(default=None, repr=False)
    sent: list[Sent] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    payloads: dict = field(default_factory=dict, repr=False)   # (direction, op) -> as sent
    received: dict = field(default_factory=dict, repr=False)   # (direction, op) -> as taken
    labels: list[str] = field(default_factory=list)
    _counts: dict = field(default_factory=dict, repr=False)
    _history: dict = field(default_factory=lambda: {NEXT: [], PREV: []}, repr=False)

    def exchange(self, *args, **kwargs):
        got = super().exchange(*args, **kwargs)
        self.inner.op = self.op                     # the transport sees the counter it would
        return got

    def _post(self, direction: int, op: int, arrays: Payload) -> None:
        label = self.labels[-1] if self.labels else None
        k = self._counts.get((label, direction), 0)
        self._counts[(label, direction)] = k + 1
        sent = Sent(self.rank, direction, op, label, k,
                    getattr(self.party, "kop", None), tuple(a.shape for a in arrays),
                    tuple(a.dtype.str for a in arrays), sum(a.size for a in arrays))
        self.sent.append(sent)
        out, twice = arrays, False
        if self.target is not None and not self.records and self.target.matches(sent):
            out, twice = self._deviate(sent, arrays)
        if self.target is not None and self.deviation.kind == "replay":
            self._history[direction].append((op, [a.copy() for a in arrays]))
        if self.keep:
            self.payloads[(direction, op)] = [a.copy() for a in out]
        self.inner._post(direction, op, out)
        if twice:
            self.inner._post(direction, op, out)

    def _take(self, direction: int, op: int) -> Payload:
        got = self.inner._take(direction, op)
        if self.keep:
            self.received[(direction, op)] = [a.copy() for a in got]
        return got

    def abort(self, reason: str) -> None:
        self.inner.abort(reason)

    # -- the deviations ----------------------------------------------------------------
    def _deviate(self, sent: Sent, arrays: Payload) -> tuple[Payload, bool]:
        dev = self.deviation
        base = dict(party=sent.party, direction=sent.direction, op=sent.op,
                    kernel=sent.kernel, k=sent.k, kind=dev.kind)
        rng = np.random.default_rng(dev.seed)
        if dev.kind == "duplicate":
            self.records.append(Record(**base))
            return arrays, True
        if dev.kind == "replay":
            earlier = self._history[sent.direction]
            if not earlier:
                raise NotApplicable(f"party {sent.party}: no earlier message to replay "
                                    f"before op {sent.op}")
            form = [(a.shape, a.dtype) for a in arrays]
            same = [e for e in earlier if [(a.shape, a.dtype) for a in e[1]] == form]
            op, payload = (same or earlier)[-1]
            self.records.append(Record(**base, replayed_op=op))
            return [a.copy() for a in payload], False
        if dev.kind == "replace":
            self.records.append(Record(**base))
            return [_uniform_like(a, rng) for a in arrays], False
        out = [a.copy() for a in arrays]
        element = dev.element if dev.element is not None else (
            int(rng.integers(sent.entries)) if sent.entries else 0)
        if not 0 <= element < sent.entries:
            raise NotApplicable(f"element {element} of a message of {sent.entries} entries")
        i, j = _locate([a.size for a in out], element)
        flat = out[i].reshape(-1)
        width = 8 * flat.dtype.itemsize
        mod = 1 << width
        before = int(flat[j])
        if dev.kind == "add":
            error = dev.error % mod or 1
            after, bit = (before + error) % mod, None
        else:
            bit = dev.bit if dev.bit is not None else int(rng.integers(width))
            if not 0 <= bit < width:
                raise NotApplicable(f"bit {bit} of a {width}-bit entry")
            after, error = before ^ (1 << bit), None
        flat[j] = after
        self.records.append(Record(**base, array=i, element=element, bit=bit, error=error,
                                   before=before, after=after))
        return out, False

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self.labels.append(name)
        try:
            yield
        finally:
            self.labels.pop()


def _locate(sizes: Sequence[int], element: int) -> tuple[int, int]:
    """(array, index inside it) of a flat entry index across arrays of ``sizes``."""
    for i, size in enumerate(sizes):
        if element < size:
            return i, element
        element -= size
    raise NotApplicable(f"entry {element} past the message")


def _uniform_like(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    raw = rng.integers(0, 256, size=a.nbytes, dtype=np.uint8)
    return raw.view(a.dtype).reshape(a.shape) if a.nbytes else a.copy()


# ------------------------------------------------------------------ wiring ----
def attach(party, target: Target | None = None, deviation: Deviation | None = None,
           keep: bool = False) -> TamperComm:
    """Put a :class:`TamperComm` in front of ``party.comm`` (in place; returns it). With no
    target it only records (and, with ``keep``, copies) the messages."""
    if (target is None) != (deviation is None):
        raise ValueError("a target needs a deviation and a deviation a target")
    inner = party.comm
    if isinstance(inner, TamperComm):
        raise ValueError(f"party {party.rank} is already wrapped")
    comm = TamperComm(rank=inner.rank, timeout=inner.timeout, op=inner.op, stats=inner.stats,
                      inner=inner, keep=keep, party=party,
                      target=target if target is not None and target.party == party.rank
                      else None, deviation=deviation)
    party.comm = comm
    return comm


@contextlib.contextmanager
def scope(party, name: str) -> Iterator[None]:
    """Messages sent inside are labelled ``name`` (no effect on an unwrapped party)."""
    comm = party.comm
    with comm.scope(name) if isinstance(comm, TamperComm) else contextlib.nullcontext():
        yield


def labelled(kernel) -> Callable[..., Any]:
    """``kernel.run`` (a catalog :class:`~mpc3.kernels.catalog.Kernel`) under its name."""
    def fn(party, *operands):
        with scope(party, kernel.name):
            return kernel.run(party, *operands)
    return fn


@dataclass
class Outcome:
    """One run: the three results, or the first error; what each party sent; the records."""

    results: list | None
    error: BaseException | None
    comms: list[TamperComm]

    @property
    def sent(self) -> list[Sent]:
        return [s for c in self.comms for s in c.sent]

    @property
    def records(self) -> list[Record]:
        return [r for c in self.comms for r in c.records]

    @property
    def stats(self) -> list[CommStats]:
        return [c.stats for c in self.comms]


def run(fn: Callable[..., Any], per_party_args: list[tuple], parties: list,
        target: Target | None = None, deviation: Deviation | None = None,
        keep: bool = False) -> Outcome:
    """``mpc3.sim.run_parties(fn, ...)`` with every party wrapped (the cheater's wrapper
    deviates, the others record); an error any party raises is returned, not raised."""
    comms = [attach(p, target, deviation, keep) for p in parties]
    try:
        results = run_parties(fn, per_party_args, parties=parties)
    except Exception as exc:  # noqa: BLE001 - the outcome of a trial
        return Outcome(None, exc, comms)
    return Outcome(results, None, comms)


def draw(sent: Sequence[Sent], rng: np.random.Generator, kind: str = "add",
         kernel: str | None = None) -> Target:
    """A uniformly random message of an untampered run's log ``sent`` (of ``kernel`` if
    given) to which ``kind`` applies, as a target by op."""
    pool = [s for s in sent if kernel is None or s.kernel == kernel]
    if kind in ("add", "flip"):
        pool = [s for s in pool if s.entries]
    if kind == "replay":
        pool = [s for s in pool if any(e.op < s.op and (e.party, e.direction) ==
                                       (s.party, s.direction) for e in sent)]
    if not pool:
        raise NotApplicable(f"no message for {kind!r}" + (f" in {kernel}" if kernel else ""))
    s = pool[int(rng.integers(len(pool)))]
    return Target(s.party, s.direction, op=s.op)


# ------------------------------------------------------- catalog kernels as cases ----
@dataclass
class Case:
    """One catalog kernel on fixed operands and fixed PRG seeds: every run of it is the same
    job (bit-identical when untampered), so a tampered run differs by the deviation only."""

    kernel: Any                    # mpc3.kernels.catalog.Kernel
    cfg: RingConfig
    plain: tuple
    args: list[tuple]
    seed: bytes

    def run(self, target: Target | None = None, deviation: Deviation | None = None,
            keep: bool = False) -> Outcome:
        return run(labelled(self.kernel), self.args, make_parties(self.cfg, seed=self.seed),
                   target, deviation, keep)


def catalog_case(name: str, n: int, shape: tuple[int, int, int],
                 cfg: RingConfig | None = None) -> Case:
    """The catalog kernel ``name`` on the operands tests/mpc3/test_kernel_catalog.py's
    exact-cost test draws for it (its generator seed, size and MxKxN, its PRG seeds): the
    same job."""
    cfg = cfg or RingConfig()
    kernel = catalog.KERNELS[name]
    rng = np.random.default_rng([n, len(name), ord(name[0]), cfg.trunc == "prob"])
    plain = kernel.plaintext(rng, n, shape, cfg)
    return Case(kernel, cfg, plain, kernel.deal(plain, cfg, rng),
                f"catalog/{name}/{n}/{cfg.trunc}".encode())
