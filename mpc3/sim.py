"""Three parties as threads in one process over in-memory links (tests, quick benchmarks).

:func:`run_parties` starts one thread per party, hands each a :class:`~mpc3.party.Party`
wired to the others through queues, runs the same SPMD function on all three, and returns
the three results. If one party raises, the others are aborted promptly (no hang) and the
first error is re-raised. Messages are copied on send, so no party can see another's memory.

Seeds for the pairwise PRG keys come from ``os.urandom`` unless a test passes ``seed`` (a
loudly named, test-only option: fixed seeds make every mask predictable).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .comm import Aborted, Communicator, Payload, PeerTimeout, ProtocolError
from .party import Party, RingConfig
from .prg import PRG


@dataclass
class _Net:
    # SimpleQueue: put/get in C (no Python Condition per message; a blocked get waits on one
    # lock with the GIL released), the per-round cost of in-process parties
    links: dict[tuple[int, int], queue.SimpleQueue] = field(
        default_factory=lambda: {(s, d): queue.SimpleQueue() for s in range(3) for d in range(3)
                                 if s != d})
    failed: threading.Event = field(default_factory=threading.Event)
    reason: list[str] = field(default_factory=list)


@dataclass
class InProcComm(Communicator):
    net: _Net = field(default_factory=_Net)

    def _post(self, direction: int, op: int, arrays: Payload) -> None:
        self.net.links[(self.rank, self.peer(direction))].put((op, [a.copy() for a in arrays]))

    def _take(self, direction: int, op: int) -> Payload:
        src = self.peer(direction)
        q = self.net.links[(src, self.rank)]
        deadline = time.monotonic() + self.timeout
        while True:
            if self.net.failed.is_set():
                raise Aborted(f"party {self.rank}: job aborted ({self.net.reason[0]})")
            try:
                got_op, arrays = q.get(timeout=0.05)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise PeerTimeout(f"party {self.rank}: no message {op} from party {src} "
                                      f"within {self.timeout:.0f} s") from None
        if got_op != op:
            raise ProtocolError(f"party {self.rank}: expected message {op} from party {src}, "
                                f"got {got_op}")
        return arrays

    def abort(self, reason: str) -> None:
        if not self.net.failed.is_set():
            self.net.reason.append(reason)
            self.net.failed.set()


def make_parties(cfg: RingConfig | None = None, job_id: str = "job",
                 timeout: float = 60.0, seed: bytes | None = None) -> list[Party]:
    """Three connected parties. ``seed`` is for deterministic tests only."""
    cfg = cfg or RingConfig()
    if seed is None:
        pair = [os.urandom(32) for _ in range(3)]   # pair[i]: shared by parties i and i+1
        priv = [os.urandom(32) for _ in range(3)]
    else:
        pair = [seed + b"pair%d" % i for i in range(3)]
        priv = [seed + b"priv%d" % i for i in range(3)]
    net = _Net()
    parties = []
    for r in range(3):
        prg = PRG.for_job(pair[(r - 1) % 3], pair[r], priv[r], job_id)
        comm = InProcComm(rank=r, timeout=timeout, net=net)
        parties.append(Party(rank=r, comm=comm, prg=prg, cfg=cfg))
    return parties


def run_parties(fn: Callable[..., Any], per_party_args: list[tuple] | None = None,
                parties: list[Party] | None = None, **kw) -> list[Any]:
    """Run ``fn(party, *args)`` on three threads; return the three results.

    ``kw`` goes to :func:`make_parties` when ``parties`` is not given.
    """
    parties = parties or make_parties(**kw)
    args = per_party_args or [()] * 3
    results: list[Any] = [None] * 3
    errors: list[BaseException | None] = [None] * 3

    def body(r: int) -> None:
        try:
            results[r] = fn(parties[r], *args[r])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors[r] = exc
            parties[r].comm.abort(f"party {r} failed: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), name=f"mpc3-party{r}") for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, Aborted)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
