"""What one party lets its users hold: typed limits from the ``[limits]`` table of the
cluster TOML, and the per-user counters that enforce them.

Every refusal is RESOURCE_EXHAUSTED with a message naming the party, the user, the limit's
key in ``[limits]`` and what to do; nothing is allocated before the counter admits it.
Defaults suit a small cluster; deploy/cluster.toml documents each key.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:                 # net.errors imports gRPC, which net.config does not need
    from .errors import BadRequest


@dataclass(frozen=True)
class Limits:
    running_jobs: int = 8             # jobs computing at once (party 0 admits; the others follow)
    queued_jobs: int = 64             # jobs waiting for a running slot, all users together
    queue_timeout_s: float = 300.0    # a job that waited this long in the queue fails
    user_jobs: int = 12               # queued + running jobs of one user
    user_streams: int = 4             # open upload / submit / fetch streams of one user
    streams: int = 32                 # open streams of all users together
    stream_idle_s: float = 30.0       # a stream silent for this long is cancelled
    user_sessions: int = 8            # open decode sessions of one user
    sessions: int = 64                # open decode sessions of all users together
    session_idle_s: float = 300.0     # an idle session is dropped after this long
    user_input_bytes: int = 1 << 30   # input shares held for one user's jobs and streams
    tensor_bytes: int = 1 << 31       # one tensor (model weight or job input)
    owner_model_bytes: int = 1 << 36  # all models stored for one model owner
    job_memory_bytes: int = 1 << 31   # one job's estimated working memory (protocols.jobs.memory)
    user_memory_bytes: int = 1 << 32  # estimated working memory of one user's queued + running jobs
    party_memory_bytes: int = 3 << 31  # the same for all users' queued + running jobs

    @classmethod
    def from_table(cls, table: dict, where: str = "[limits]") -> "Limits":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(known)})")
        values = {}
        for key, value in table.items():
            kind = int if known[key].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 \
                    or (kind is int and value != int(value)):
                raise ValueError(f"{where} {key} must be a positive "
                                 f"{'integer' if kind is int else 'number'}, got {value!r}")
            values[key] = kind(value)
        return cls(**values)

    def to_table(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Quotas:
    """Per-user and total counters of one party (thread-safe)."""

    def __init__(self, limits: Limits, rank: int) -> None:
        self.limits = limits
        self.rank = rank
        self._lock = threading.Lock()
        self._streams: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def _refuse(self, user: str, what: str, key: str, advice: str) -> BadRequest:
        from .errors import BadRequest, Code
        return BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: {what} (limit "
                          f"{key} = {getattr(self.limits, key)} in [limits]); {advice}")

    @contextmanager
    def stream(self, user: str):
        """Hold one of the user's (and the party's) open streams for the ``with`` body."""
        with self._lock:
            mine = self._streams.get(user, 0)
            if mine >= self.limits.user_streams:
                raise self._refuse(user, f"user {user!r} already has {mine} open streams",
                                   "user_streams", "wait for them to finish or cancel them")
            if sum(self._streams.values()) >= self.limits.streams:
                raise self._refuse(user, "too many open streams", "streams",
                                   "retry in a few seconds")
            self._streams[user] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._streams[user] -= 1
                if not self._streams[user]:
                    del self._streams[user]

    def charge(self, user: str, nbytes: int) -> None:
        """Count ``nbytes`` of input shares held for ``user``; refuses beyond the limit."""
        with self._lock:
            held = self._bytes.get(user, 0) + nbytes
            if held > self.limits.user_input_bytes:
                raise self._refuse(user, f"user {user!r} would hold {held} bytes of input "
                                   "shares", "user_input_bytes",
                                   "wait for running jobs to finish or send smaller inputs")
            self._bytes[user] = held

    def release(self, user: str, nbytes: int) -> None:
        with self._lock:
            left = self._bytes.get(user, 0) - nbytes
            if left > 0:
                self._bytes[user] = left
            else:
                self._bytes.pop(user, None)

    def held_bytes(self, user: str) -> int:
        with self._lock:
            return self._bytes.get(user, 0)

    def open_streams(self, user: str | None = None) -> int:
        with self._lock:
            return self._streams.get(user, 0) if user else sum(self._streams.values())
