"""Parallel composition: independent sub-protocols sharing their communication rounds.

``parallel(p, f, g)`` runs ``f(pf)`` and ``g(pg)`` - two protocols that do not depend on each
other's results - in lockstep: in every round each party sends one message per neighbour that
carries both branches' payloads, so the pair costs ``max`` of the branches' rounds and the
sum of their bytes (:meth:`mpc3.kernels.base.Cost.parallel`) instead of the sum of both.
A decoding step is a chain of few-element protocols whose rounds, not bytes, set its latency
(e.g. LayerNorm's inverse square root and the next layer's projection, or a comparison and
the truncation of the same input).

How it works. Each branch runs on its own thread (the first on the caller's, the others on
reused workers) with a child :class:`~mpc3.party.Party` whose communicator hands every
exchange to a lockstep rendezvous; the branch that completes a round (every branch still
running has posted its exchange) performs ONE exchange on the parent communicator with the
branches' arrays in branch order, each branch's part closed by a zero-byte separator (an
empty int16 array of shape (0, nesting level), so byte counts are unchanged and merges
nest), splits what arrives the same way and resumes the branches. Every party runs the
same branches with the same number of exchanges (SPMD), so round k of branch i is merged
into the same parent round on all three parties.

Randomness. Branch ``i`` of a fork taken at kernel counter ``F`` numbers its kernel calls from
``(F << 40) | (i << 32)``: disjoint from the parent's counters (below 2^40), from every other
fork's, and recursively from nested forks', so no (op, tag) PRG draw is ever repeated.

Failures: the first exception of a branch (or of the parent exchange) aborts the others and is
re-raised in the caller; nothing is left running.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .comm import NEXT, PREV, Aborted, Communicator, Payload, ProtocolError
from .party import Party

_SEP_DTYPE = np.dtype("<i2")          # no protocol sends int16 arrays
_OP_BITS = 40
_BRANCH_BITS = 32


def _separator(level: int) -> np.ndarray:
    """The zero-byte separator of a merge at nesting ``level`` (shape (0, level))."""
    return np.empty((0, level), dtype=_SEP_DTYPE)


def _is_separator(a: np.ndarray, level: int) -> bool:
    return a.dtype == _SEP_DTYPE and a.shape == (0, level)


def _level(comm: Communicator) -> int:
    """Nesting level of a merge over ``comm``: 1 over a transport, one more per branch."""
    return comm.level + 1 if isinstance(comm, _BranchComm) else 1


class _Lockstep:
    """Rendezvous of the branches' exchanges: the branch that completes a round (the last to
    post, or to finish, while the others wait) performs the ONE merged parent exchange and
    hands every waiting branch its part - no scheduler thread, no extra hand-off per round."""

    def __init__(self, comm: Communicator, n: int) -> None:
        self.comm = comm
        self.cv = threading.Condition()
        self.requests: list[tuple | None] = [None] * n
        self.replies: list[tuple | None] = [None] * n
        self.live = [True] * n
        self.results: list[Any] = [None] * n
        self.error: BaseException | None = None

    def _complete_round(self) -> None:
        """Called with the lock held: if every live branch has posted, exchange (lock
        released meanwhile; the others are all waiting, so nothing else touches the state)."""
        if self.error is not None or not any(self.live) or any(
                live and req is None for live, req in zip(self.live, self.requests)):
            return
        posted = [(i, req) for i, (live, req) in enumerate(zip(self.live, self.requests))
                  if live]
        for i, _ in posted:
            self.requests[i] = None
        self.cv.release()
        try:
            replies, error = _merged_exchange(self.comm, posted), None
        except BaseException as exc:  # noqa: BLE001 - every branch gets it
            replies, error = {}, exc
        finally:
            self.cv.acquire()
        if error is not None:
            self.error = self.error or error
        for i, r in replies.items():
            self.replies[i] = r
        self.cv.notify_all()

    def request(self, i: int, req: tuple) -> tuple:
        with self.cv:
            if self.error is not None:
                raise Aborted(f"parallel branch {i}: aborted ({self.error})")
            self.requests[i] = req
            self._complete_round()
            while self.replies[i] is None and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise Aborted(f"parallel branch {i}: aborted ({self.error})")
            reply, self.replies[i] = self.replies[i], None
            return reply

    def fail(self, exc: BaseException) -> None:
        with self.cv:
            if self.error is None:
                self.error = exc
            self.cv.notify_all()

    def finish(self, i: int, value: Any) -> None:
        with self.cv:
            self.results[i] = value
            self.live[i] = False
            self._complete_round()          # the others may all be waiting on this one
            self.cv.notify_all()

    def wait_all(self) -> None:
        """Until every branch has returned (after a failure too: none is left running)."""
        with self.cv:
            while any(self.live):
                self.cv.wait()


class _Workers:
    """Reused daemon threads for branches (a fork per LayerNorm would otherwise start and
    join threads every few rounds); grows when every worker is busy, so nested forks never
    wait for a free thread."""

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0

    def submit(self, fn: Callable[[], None]) -> None:
        with self.lock:
            spawn = self.idle == 0
            if not spawn:
                self.idle -= 1
        self.tasks.put(fn)
        if spawn:
            threading.Thread(target=self._loop, daemon=True, name="mpc3-branch").start()

    def _loop(self) -> None:
        while True:
            self.tasks.get()()
            with self.lock:
                self.idle += 1


_WORKERS = _Workers()


@dataclass
class _BranchComm(Communicator):
    """A branch's communicator: every exchange goes through the lockstep scheduler."""

    sched: _Lockstep | None = field(default=None, repr=False)
    index: int = 0
    level: int = 1

    def exchange(self, to_next: Sequence[np.ndarray] | None = None,
                 to_prev: Sequence[np.ndarray] | None = None,
                 from_next: bool = False, from_prev: bool = False):
        self.op += 1
        payloads = []
        for payload in (to_next, to_prev):
            if payload is None:
                payloads.append(None)
                continue
            arrays = [np.ascontiguousarray(a) for a in payload]
            if any(a.dtype == _SEP_DTYPE and not (a.ndim == 2 and a.size == 0)
                   for a in arrays):                      # only nested merges' separators
                raise ProtocolError("int16 arrays are reserved for parallel composition")
            self.stats.bytes_sent += sum(a.nbytes for a in arrays)
            self.stats.messages += 1
            payloads.append(arrays)
        if payloads[0] is not None or payloads[1] is not None or from_next or from_prev:
            self.stats.rounds += 1
        return self.sched.request(self.index, (payloads[0], payloads[1], from_next, from_prev))

    def _post(self, direction: int, op: int, arrays: Payload) -> None:  # pragma: no cover
        raise NotImplementedError("branch communicators exchange through the scheduler")

    def _take(self, direction: int, op: int) -> Payload:  # pragma: no cover
        raise NotImplementedError("branch communicators exchange through the scheduler")

    def abort(self, reason: str) -> None:
        self.sched.fail(ProtocolError(reason))


def _split(got: Payload | None, n: int, rank: int, direction: int,
           level: int) -> list[Payload]:
    parts: list[Payload] = [[]]
    for a in got or ():
        if _is_separator(a, level):
            parts.append([])
        else:
            parts[-1].append(a)
    if parts[-1]:
        raise ProtocolError(f"party {rank}: merged message without its last separator")
    parts.pop()
    if len(parts) != n:
        side = "next" if direction == NEXT else "prev"
        raise ProtocolError(f"party {rank}: merged message from {side} has {len(parts)} "
                            f"branch parts, expected {n}")
    return parts


def _merged_exchange(comm: Communicator, posted: list[tuple[int, tuple]]) -> dict[int, tuple]:
    level = _level(comm)
    out = []
    for k in (0, 1):                                      # to_next, to_prev
        if all(req[k] is None for _, req in posted):
            out.append(None)
            continue
        msg: list[np.ndarray] = []
        for _, req in posted:
            msg.extend(req[k] or ())
            msg.append(_separator(level))
        out.append(msg)
    want_next = any(req[2] for _, req in posted)
    want_prev = any(req[3] for _, req in posted)
    got_next, got_prev = comm.exchange(out[0], out[1], want_next, want_prev)
    split = {NEXT: _split(got_next, len(posted), comm.rank, NEXT, level) if want_next else None,
             PREV: _split(got_prev, len(posted), comm.rank, PREV, level) if want_prev else None}
    replies = {}
    for j, (i, req) in enumerate(posted):
        reply = []
        for direction, wanted in ((NEXT, req[2]), (PREV, req[3])):
            part = None if split[direction] is None else split[direction][j]
            if not wanted and part:
                raise ProtocolError(f"party {comm.rank}: branch {i} got an unexpected message")
            reply.append(part if wanted else None)
        replies[i] = tuple(reply)
    return replies


def branch_party(p: Party, fork_op: int, index: int, sched: _Lockstep) -> Party:
    """The child party of branch ``index`` of a fork taken at kernel counter ``fork_op``."""
    comm = _BranchComm(rank=p.rank, timeout=p.comm.timeout, sched=sched, index=index,
                       level=_level(p.comm))
    return Party(rank=p.rank, comm=comm, prg=p.prg, cfg=p.cfg,
                 kop=(fork_op << _OP_BITS) | (index << _BRANCH_BITS))


def parallel(p: Party, *branches: Callable[[Party], Any]) -> list[Any]:
    """Run ``branches[i](child_i)`` in shared rounds; returns their results in order.

    The branches must be independent (none reads another's output) and each must be a
    complete SPMD protocol. Branch 0 runs in the calling thread, the others on reused worker
    threads. Cost: rounds = the largest branch's, bytes = the sum (:meth:`Cost.parallel`).
    """
    if not branches:
        return []
    if len(branches) > 1 << (_OP_BITS - _BRANCH_BITS):
        raise ValueError("too many parallel branches")
    fork_op = p.new_op()
    sched = _Lockstep(p.comm, len(branches))
    children = [branch_party(p, fork_op, i, sched) for i in range(len(branches))]

    def body(i: int) -> None:
        try:
            value = branches[i](children[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            sched.fail(exc)
            with sched.cv:
                sched.live[i] = False
                sched.cv.notify_all()
            return
        sched.finish(i, value)

    for i in range(1, len(branches)):
        _WORKERS.submit(lambda i=i: body(i))
    body(0)
    sched.wait_all()
    if sched.error is not None:
        raise sched.error
    return sched.results
