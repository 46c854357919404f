"""Communicator interface shared by every transport (in-process threads, gRPC).

Party ``i`` talks only to its ring neighbours ``next = i+1`` and ``prev = i-1`` (mod 3).
One call to :meth:`Communicator.exchange` is one communication round: the party posts at most
one message to each neighbour and then waits for the messages it expects. Every message is
keyed by the operation counter ``op``, which advances identically on all three parties
(SPMD), so a protocol bug that makes parties disagree on the order of messages fails loudly
with :class:`ProtocolError` instead of silently combining unrelated arrays.

Transports implement two primitives, :meth:`_post` and :meth:`_take`; counting of bytes,
messages and rounds is done here, once, from the payload actually handed to the transport.
Bytes are payload bytes only (``ndarray.nbytes``): ring elements count 8 bytes, boolean
shares are sent bit-packed (see :func:`mpc3.ring.pack_bits`).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

NEXT = 1
PREV = -1

Payload = list[np.ndarray]


class ProtocolError(RuntimeError):
    """Parties disagree on the protocol state (wrong op counter, shape, peer)."""

    #: whether every party raises this failure by itself, at the same point (then no party
    #: needs to tell the others: a job runner sends an abort only for the other failures)
    everywhere = False


class PeerTimeout(ProtocolError):
    """A peer did not deliver an expected message within the deadline."""


class Aborted(ProtocolError):
    """The job was aborted (another party failed or the job was cancelled)."""


class CheatingDetected(ProtocolError):
    """A proof was rejected: the prover deviated, or a verifier fed the check wrong values
    (a message it sent the prover that a claim reads on both sides, or its shares of the
    check) or reports falsely. ``rejected``: every party whose proof some party rejected.
    Raised at every party together, from the verdicts each receives."""

    everywhere = True

    def __init__(self, prover: int, reporter: int, detail: str,
                 message: str | None = None, rejected: frozenset = frozenset()) -> None:
        others = sorted(set(rejected) - {prover})
        also = f"; the proof(s) of part{'ies' if len(others) > 1 else 'y'} " \
            f"{', '.join(map(str, others))} failed too" if others else ""
        super().__init__(message or (
            f"the proof of party {prover}'s messages was rejected by party {reporter} "
            f"({detail}): party {prover} deviated from the protocol, or one of its two "
            f"verifiers fed the check wrong values or reports falsely{also}; the job is "
            f"aborted"))
        self.prover, self.reporter = prover, reporter
        self.rejected = frozenset(rejected) | {prover}


class MalformedMessage(CheatingDetected):
    """A party received a message that is not in its canonical form: a byte-packed message
    of the wrong length or whose padding bits (past its packed data, in its last byte or in
    a width run's) are not zero. Honest senders zero them, and no party reads them, so only a
    deviating sender makes one: the receiver refuses it at once (``prover`` is the sender),
    alone: the others learn of it from its abort."""

    everywhere = False

    def __init__(self, sender: int, receiver: int, detail: str) -> None:
        super().__init__(sender, receiver, detail, message=(
            f"party {receiver} received from party {sender} a malformed message ({detail}): "
            f"party {sender} deviated from the protocol; the job is aborted"))


class SeedMismatch(CheatingDetected):
    """The prover's two verifiers sent it different challenge seeds of a proof
    (:mod:`mpc3.dzkp`, :mod:`mpc3.dzkp_bits`): one of them deviated (the prover cannot tell
    which). Raised by the prover alone, before it answers: answering other challenges than
    its partner checks would let a verifier learn a linear function of the prover's secret
    values from its partner's opened checks."""

    everywhere = False

    def __init__(self, rank: int) -> None:
        nxt, prv = (rank + 1) % 3, (rank - 1) % 3
        super().__init__(nxt, rank, "challenge seeds", rejected=frozenset({prv}), message=(
            f"party {rank} received different challenge seeds from its verifiers, parties "
            f"{prv} and {nxt}: one of them deviated; the job is aborted"))


def one_array(got, sender: int, receiver: int, dtype, size: int, what: str) -> np.ndarray:
    """The one array of ``size`` elements of ``dtype`` a message must carry, flat; else
    :class:`mpc3.comm.MalformedMessage` (never an IndexError or ValueError)."""
    if not got or len(got) != 1 or got[0].dtype != dtype or got[0].size != size:
        raise MalformedMessage(sender, receiver, f"{what}: not one {np.dtype(dtype)} array "
                                                 f"of {size} elements")
    return got[0].reshape(-1)


@dataclass
class CommStats:
    """Traffic counted by the communicator itself (never estimated)."""

    bytes_sent: int = 0
    messages: int = 0
    rounds: int = 0
    bytes_received: int = 0        # payload bytes taken from the neighbours (party metrics)

    def snapshot(self) -> "CommStats":
        return CommStats(self.bytes_sent, self.messages, self.rounds, self.bytes_received)

    def __sub__(self, other: "CommStats") -> "CommStats":
        return CommStats(self.bytes_sent - other.bytes_sent, self.messages - other.messages,
                         self.rounds - other.rounds,
                         self.bytes_received - other.bytes_received)


@dataclass
class Communicator(abc.ABC):
    """Base class: op-counter keyed rounds between ring neighbours."""

    rank: int
    timeout: float = 60.0
    op: int = 0
    stats: CommStats = field(default_factory=CommStats)
    #: malicious mode (:class:`mpc3.checks.Checks`): called with (op, payload bytes) for
    #: every message this party sends, so no message escapes its verification
    watch = None

    def peer(self, direction: int) -> int:
        return (self.rank + direction) % 3

    def exchange(self, to_next: Sequence[np.ndarray] | None = None,
                 to_prev: Sequence[np.ndarray] | None = None,
                 from_next: bool = False, from_prev: bool = False
                 ) -> tuple[Payload | None, Payload | None]:
        """One round: send to neighbours, then receive what this party expects.

        Returns ``(received_from_next, received_from_prev)``; an entry is ``None`` when
        nothing was expected from that neighbour.
        """
        self.op += 1
        op = self.op
        active = False
        for direction, payload in ((NEXT, to_next), (PREV, to_prev)):
            if payload is None:
                continue
            arrays = [np.ascontiguousarray(a) for a in payload]
            nbytes = sum(a.nbytes for a in arrays)
            self.stats.bytes_sent += nbytes
            self.stats.messages += 1
            self._post(direction, op, arrays)
            if self.watch is not None:
                self.watch(op, nbytes)
            active = True
        got_next = self._take(NEXT, op) if from_next else None
        got_prev = self._take(PREV, op) if from_prev else None
        for got in (got_next, got_prev):
            if got is not None:
                self.stats.bytes_received += sum(a.nbytes for a in got)
        if active or from_next or from_prev:
            self.stats.rounds += 1
        return got_next, got_prev

    @abc.abstractmethod
    def _post(self, direction: int, op: int, arrays: Payload) -> None:
        """Deliver ``arrays`` tagged with ``op`` to the neighbour in ``direction``."""

    @abc.abstractmethod
    def _take(self, direction: int, op: int) -> Payload:
        """Return the message tagged ``op`` from the neighbour in ``direction``.

        Must raise :class:`ProtocolError` if the next message carries another op counter and
        :class:`PeerTimeout` if none arrives within ``self.timeout`` seconds.
        """

    def abort(self, reason: str) -> None:  # pragma: no cover - transports override
        """Tell the transport the job failed so peers stop waiting."""
