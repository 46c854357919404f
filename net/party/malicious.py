"""Malicious-mode jobs on one party (``[cluster] security = "malicious"``, issue 35).

The job runner (:mod:`net.party.runner`) calls these around :func:`protocols.jobs.execute`:

* :func:`start` in every mode: the job's cost recorder - or :class:`ModeMismatch` if a
  peer's hello named another mode since the job was admitted (submissions are refused
  then already; this covers a link that came up in between), which fails the job there
  before it sends anything, and its abort fails it at the peers;
* :func:`begin` (through :func:`start`, in malicious mode): the job's Party gets a
  :class:`mpc3.checks.Checks`, and every sharing the job received from outside - the query
  user's input shares and the model owner's weight shares as loaded for the job - goes
  through ``Checks.shared_input``, so the two holders of each slot compare them at the
  first flush. A weight goes as the digests of its two slots (:func:`slot_digest`),
  computed once per loaded array rather than per job (GPT-2-small's slots are 2 GB; this
  machine hashes 120-260 MB/s): both holders of a slot digest the same bytes, so the
  comparison is the same. It returns the job's cost recorder, a :class:`FlushingCosts`:
  the protocols mark every layer's end on it (``on_layer``), and it flushes there once
  the pending checks are large (:data:`FLUSH_AT`; :data:`MAX_FLUSHES` per job at most).
* :func:`finish` after the job's last message and before its outputs are kept: the last
  flush. No output share leaves a party before it (clients fetch outputs only of a job
  that is DONE).
* :func:`refusal`: the job's error when a flush raised - :class:`mpc3.checks.Unverified`
  (a kernel without verification ran: the job is refused, never run unchecked) or
  :class:`mpc3.dzkp.CheatingDetected` (a proof or a digest failed; the suspect is named).
  Both are raised at every party together (the first before any check, from the same op
  counters; the second from the verdicts every party receives), so all three fail the job
  with the same reason - the runner sends no abort of its own for them
  (:func:`raised_everywhere`), which would race the peers' verdicts - and the party goes on
  serving other jobs. (A cheater that withholds its verdicts makes the others fail at the
  peer timeout instead.) A :class:`mpc3.comm.MalformedMessage` (a packed message whose
  padding or length no honest sender makes; in either mode) is raised by its receiver
  alone: the runner names the sender and sends the abort to the peers.

Soundness per job: a flush proves three batches (each party's). The job's first
:data:`EARLY_FLUSHES` prove with :class:`mpc3.dzkp.Params`' defaults (GR(2^64, 32), two
repetitions: a false batch passes with probability <= 2^-47.7 up to 10^11 gate terms,
:func:`mpc3.dzkp.soundness_bits`), later ones with :data:`LATE_PARAMS` (GR(2^64, 64), one
repetition: <= 2^-55.8), and each its mod-2 gates over GF(2^64) (<= 2^-55.5 up to 10^11
gates, :func:`mpc3.dzkp_bits.soundness_bits`), so that :data:`MAX_FLUSHES` flushes stay below
2^-40 by the union bound (:func:`job_soundness_bits`; docs/MALICIOUS.md). A short job pays the cheaper proof; a
long one (a GPT-2-small prompt flushes between kernels ~15 times a layer) can split as
often as its memory needs. A job with more flushes than that flushes at the first ones and
once at its end, which covers the rest.
"""
from __future__ import annotations

import hashlib
import math
import threading
import weakref
from typing import NamedTuple

import numpy as np

from mpc3 import dzkp, dzkp_bits
from mpc3.checks import Checks, Unverified
from mpc3.comm import MalformedMessage, ProtocolError, SeedMismatch
from mpc3.dzkp import CheatingDetected
from mpc3.party import Party
from mpc3.shares import AShare
from protocols.jobs import CostRecorder, ModelView

SEMI_HONEST = "semi-honest"
MALICIOUS = "malicious"
#: flushes per job at most (3 proofs each; see the module docstring)
MAX_FLUSHES = 4096
#: a job's first flushes prove with dzkp.Params() (cheaper: GR(2^64, 32) has a quarter of
#: GR(2^64, 64)'s multiply-adds per product, and two repetitions half of them per element)
EARLY_FLUSHES = 31
#: the proof parameters of a job's later flushes
LATE_PARAMS = dzkp.Params(degree=64, reps=1)
#: a layer's end flushes only from this many pending gates and elements on
#: (``Checks.pending``, the same at every party): a prompt's layers flush one by one (a
#: Table 2 layer registers millions), which bounds a flush's memory, while a decoding
#: step's small layers are proven together at the job's end - one proof's rounds per
#: generated token, not one per layer
FLUSH_AT = 1 << 17
#: inside a layer, the checks flush between two kernels once this many are pending
#: (:meth:`mpc3.checks.Checks.checkpoint`): a flush's memory grows with what it proves, and
#: one GPT-2-small layer on a 128-token prompt registers more than this machine holds. A
#: Table 2 encoder layer reaches 1.73 M at its end (0.99 M after its Q/K/V features, its
#: largest kernel); a decoding step stays below :data:`FLUSH_AT`, so it never splits
SPLIT_AT = 1 << 19
#: what :func:`job_soundness_bits` assumes a proof holds at most: gate terms (800 GB of
#: one side's words, more than a party holds) and matrix products' inner terms
MAX_TERMS, MAX_RING_TERMS = 10 ** 11, 10 ** 9


def job_soundness_bits(flushes: int = MAX_FLUSHES) -> float:
    """-log2 of the union bound on a job of ``flushes`` flushes passing a false batch: three
    ring proofs and three proofs of mod-2 gates a flush, each of at most :data:`MAX_TERMS`
    gate terms and :data:`MAX_RING_TERMS` (the bound grows with both), the first
    :data:`EARLY_FLUSHES` ring proofs with the defaults."""
    def fails(params: dzkp.Params) -> float:
        return 2.0 ** -dzkp.soundness_bits(MAX_TERMS, 1, params, ring_len=MAX_RING_TERMS)
    early = min(flushes, EARLY_FLUSHES)
    bits = 2.0 ** -dzkp_bits.soundness_bits([(MAX_TERMS // 64, 1)])
    return -math.log2(3 * early * fails(dzkp.Params())
                      + 3 * (flushes - early) * fails(LATE_PARAMS) + 3 * flushes * bits)


class ModeMismatch(ProtocolError):
    """The parties' [cluster] security modes differ: no job runs."""


class FlushingCosts(CostRecorder):
    """The per-layer cost recorder of a malicious-mode job: it flushes the party's checks at
    a layer's end once they are large (:data:`FLUSH_AT`; the flush's traffic is counted in
    that layer), keeping the last of :data:`MAX_FLUSHES` for :func:`finish`."""

    def flush(self) -> None:
        self.party.checks.flush(self.party)

    def mark(self, layer: str) -> None:
        checks = self.party.checks
        if checks.flushes < MAX_FLUSHES - 1 and checks.pending >= FLUSH_AT:
            self.flush()
        super().mark(layer)


class Slots(NamedTuple):
    """What ``Checks.shared_input`` reads of a sharing: its two slots (here, digests)."""

    a: np.ndarray
    b: np.ndarray


_digests: dict[int, tuple[weakref.ref, np.ndarray]] = {}
_digests_lock = threading.Lock()


def slot_digest(arr: np.ndarray) -> np.ndarray:
    """32 bytes naming ``arr``'s dtype, shape and contents, cached while ``arr`` lives: a
    stored model's arrays are loaded once and never written (jobs compute new arrays)."""
    key = id(arr)
    with _digests_lock:
        hit = _digests.get(key)
    if hit is not None and hit[0]() is arr:
        return hit[1]
    h = hashlib.blake2b(digest_size=32, person=b"mpc3-weight")
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    digest = np.frombuffer(h.digest(), np.uint8)
    try:
        ref = weakref.ref(arr, lambda _, k=key: _digests.pop(k, None))
    except TypeError:                  # not an ndarray: not cached
        return digest
    with _digests_lock:
        _digests[key] = (ref, digest)
    return digest


def begin(party: Party, inputs: dict[str, AShare], model: ModelView | None) -> FlushingCosts:
    """Attach the checks to the job's ``party`` and register the sharings it received from
    outside (in name order, the same at every party); the job's cost recorder."""
    party.checks = Checks(party, split_at=SPLIT_AT, limit=MAX_FLUSHES - 1,
                          later=(EARLY_FLUSHES, LATE_PARAMS))
    for name in sorted(inputs):
        party.checks.shared_input(inputs[name])
    shares = model.shares if model is not None else {}
    for name in sorted(shares):
        x = shares[name]
        party.checks.shared_input(Slots(slot_digest(x.a), slot_digest(x.b)))
    return FlushingCosts(party)


def start(party: Party, security: str, problem: str, inputs: dict[str, AShare],
          model: ModelView | None) -> CostRecorder:
    """The job's cost recorder: :func:`begin`'s in malicious mode, a plain one otherwise;
    ``problem``: the modes' disagreement ('' if none), raised as :class:`ModeMismatch`."""
    if problem:
        raise ModeMismatch(problem)
    if security == MALICIOUS:
        return begin(party, inputs, model)
    return CostRecorder(party)


def finish(costs: FlushingCosts) -> None:
    """The job's last flush, before any of its outputs is kept."""
    costs.flush()


def end(party: Party) -> None:
    """The job ended (either way): its checks give their scratch back for the next job's
    flushes (:mod:`mpc3.scratch`)."""
    if party.checks is not None:
        party.checks.release()


def refusal(rank: int, job_id: str, exc: BaseException) -> str | None:
    """The job's error for a failed flush or a refused message (None for any other
    failure)."""
    if isinstance(exc, MalformedMessage):      # either mode: the receiver refused it
        return f"party {rank}: job {job_id} aborted, suspect party {exc.prover}: {exc}"
    if isinstance(exc, Unverified):
        return f"party {rank}: job {job_id} refused: {exc}"
    if isinstance(exc, SeedMismatch):          # one of its two verifiers: it cannot tell
        return (f"party {rank}: job {job_id} aborted in malicious mode, suspect parties "
                f"{' or '.join(map(str, sorted(exc.rejected)))}; nothing was revealed: {exc}")
    if isinstance(exc, CheatingDetected):
        return (f"party {rank}: job {job_id} aborted in malicious mode, suspect party "
                f"{exc.prover} (reported by party {exc.reporter}); nothing was revealed: {exc}")
    return None


def raised_everywhere(exc: BaseException) -> bool:
    """Whether every party raises ``exc``'s failure by itself (``ProtocolError.everywhere``:
    a failed flush - refused before any check, or rejected by the verdicts every party
    receives). Any other failure - a malformed message included, which only its receiver
    sees - must be sent to the peers as an abort, or they would wait for the peer timeout."""
    return getattr(exc, "everywhere", False)
