"""Malicious-mode jobs on one party (``[cluster] security = "malicious"``, issue 35).

The job runner (:mod:`net.party.runner`) calls these around :func:`protocols.jobs.execute`:

* :func:`begin` at job start: the job's Party gets a :class:`mpc3.checks.Checks`, and every
  sharing the job received from outside - the query user's input shares and the model
  owner's weight shares as loaded for the job - goes through ``Checks.shared_input``, so
  the two holders of each slot compare them at the first flush. It returns the job's cost
  recorder, a :class:`FlushingCosts`: the protocols mark every layer's end on it
  (``on_layer``), and it flushes there (:data:`MAX_FLUSHES` per job at most).
* :func:`finish` after the job's last message and before its outputs are kept: the last
  flush. No output share leaves a party before it (clients fetch outputs only of a job
  that is DONE).
* :func:`refusal`: the job's error when a flush raised - :class:`mpc3.checks.Unverified`
  (a kernel without verification ran: the job is refused, never run unchecked) or
  :class:`mpc3.dzkp.CheatingDetected` (a proof or a digest failed; the suspect is named).
  Both are raised at every party together (the first before any check, from the same op
  counters; the second from the verdicts every party receives), so all three fail the job
  with the same reason - the runner sends no abort of its own for them, which would race
  the peers' verdicts - and the party goes on serving other jobs. (A cheater that withholds
  its verdicts makes the others fail at the peer timeout instead.)

Soundness per job: a flush proves three batches (each party's), each failing to catch a
false one with probability <= 2^-49 (:func:`mpc3.dzkp.soundness_bits`); :data:`MAX_FLUSHES`
keeps a job at <= 2^9 proofs, below 2^-40 (docs/MALICIOUS.md). A job with more layers than
that flushes at the first ones and once at its end, which covers the rest.
"""
from __future__ import annotations

from mpc3.checks import Checks, Unverified
from mpc3.dzkp import CheatingDetected
from mpc3.party import Party
from mpc3.shares import AShare
from protocols.jobs import CostRecorder, ModelView

SEMI_HONEST = "semi-honest"
MALICIOUS = "malicious"
#: flushes per job at most (3 proofs each: 384 <= 2^9, see the module docstring)
MAX_FLUSHES = 128


class FlushingCosts(CostRecorder):
    """The per-layer cost recorder of a malicious-mode job: it flushes the party's checks at
    each layer's end (the flush's traffic is counted in that layer), keeping the last of
    :data:`MAX_FLUSHES` for :func:`finish`."""

    def __init__(self, party: Party) -> None:
        super().__init__(party)
        self.flushes = 0

    def flush(self) -> None:
        self.party.checks.flush(self.party)
        self.flushes += 1

    def mark(self, layer: str) -> None:
        if self.flushes < MAX_FLUSHES - 1:
            self.flush()
        super().mark(layer)


def begin(party: Party, inputs: dict[str, AShare], model: ModelView | None) -> FlushingCosts:
    """Attach the checks to the job's ``party`` and register the sharings it received from
    outside (in name order, the same at every party); the job's cost recorder."""
    party.checks = Checks(party)
    for name in sorted(inputs):
        party.checks.shared_input(inputs[name])
    shares = model.shares if model is not None else {}
    for name in sorted(shares):
        party.checks.shared_input(shares[name])
    return FlushingCosts(party)


def finish(costs: FlushingCosts) -> None:
    """The job's last flush, before any of its outputs is kept."""
    costs.flush()


def refusal(rank: int, job_id: str, exc: BaseException) -> str | None:
    """The job's error for a failed flush (None for any other failure)."""
    if isinstance(exc, Unverified):
        return f"party {rank}: job {job_id} refused: {exc}"
    if isinstance(exc, CheatingDetected):
        return (f"party {rank}: job {job_id} aborted in malicious mode, suspect party "
                f"{exc.prover} (reported by party {exc.reporter}); nothing was revealed: {exc}")
    return None
