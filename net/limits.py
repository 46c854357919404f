"""What one party lets its users hold: typed limits from the ``[limits]`` table of the
cluster TOML, and the per-user counters that enforce them.

Every refusal is RESOURCE_EXHAUSTED with a message naming the party, the user, the limit's
key in ``[limits]`` and what to do; nothing is allocated before the counter admits it.
Defaults suit a small cluster; deploy/cluster.toml documents each key.

Three kinds of holding are counted per user, per organisation and for all users together:
open streams, decode sessions and *blocking calls* - unary calls that wait (a JobStatus
long-poll, a model verification waiting for the peers, a cancellation waiting for its job).
A blocking call over its limit is refused at once, so it never queues on a server thread;
the party's thread pool is sized above ``streams + blocking_calls`` (net.party.server), so cheap
calls and other users always find a thread. The organisation of a user is its certificate's
O attribute (:attr:`net.keys.Identity.org`): the ``org_*`` limits keep one organisation's
many identities from taking every slot of a cluster-wide limit from another organisation.
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
    org_streams: int = 16             # open streams of one organisation's users together
    streams: int = 32                 # open streams of all users together
    stream_idle_s: float = 30.0       # a stream silent for this long is cancelled
    user_sessions: int = 8            # open decode sessions of one user
    org_sessions: int = 32            # open decode sessions of one organisation's users
    sessions: int = 64                # open decode sessions of all users together
    session_idle_s: float = 300.0     # an idle session is dropped after this long
    user_blocking_calls: int = 8      # waiting unary calls (long-polls, verify, cancel) of a user
    org_blocking_calls: int = 12      # waiting unary calls of one organisation's users
    blocking_calls: int = 24          # waiting unary calls of all users together
    job_arrival_s: float = 3.0        # a job not submitted to all three parties by then is dropped
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
        for pool in ("streams", "sessions", "blocking_calls"):
            total = values.get(pool, known[pool].default)
            if f"org_{pool}" not in values:     # a smaller total lowers the default
                values[f"org_{pool}"] = min(known[f"org_{pool}"].default, total)
                continue
            user, org = values.get(f"user_{pool}", known[f"user_{pool}"].default), \
                values[f"org_{pool}"]
            if not user <= org <= total:
                raise ValueError(f"{where}: user_{pool} = {user} <= org_{pool} = {org} <= "
                                 f"{pool} = {total} must hold")
        return cls(**values)

    def to_table(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def org_of(user: str, org: str | None) -> str:
    """The accounting key of a user's organisation (its own name when it has none)."""
    return f"org:{org}" if org else f"user:{user}"


class Quotas:
    """Per-user, per-organisation and total counters of one party (thread-safe)."""

    def __init__(self, limits: Limits, rank: int) -> None:
        self.limits = limits
        self.rank = rank
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, int]] = {"streams": {}, "blocking_calls": {}}
        self._orgs: dict[str, dict[str, int]] = {"streams": {}, "blocking_calls": {}}
        self._bytes: dict[str, int] = {}

    def _refuse(self, user: str, what: str, key: str, advice: str) -> BadRequest:
        from .errors import BadRequest, Code
        return BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: {what} (limit "
                          f"{key} = {getattr(self.limits, key)} in [limits]); {advice}")

    @contextmanager
    def _hold(self, pool: str, what: str, user: str, org: str | None, advice: str):
        okey = org_of(user, org)
        held, orgs = self._held[pool], self._orgs[pool]
        with self._lock:
            mine = held.get(user, 0)
            if mine >= getattr(self.limits, f"user_{pool}"):
                raise self._refuse(user, f"user {user!r} already has {mine} {what}",
                                   f"user_{pool}", advice)
            ours = orgs.get(okey, 0)
            if org and ours >= getattr(self.limits, f"org_{pool}"):
                raise self._refuse(user, f"organisation {org!r} already has {ours} {what}",
                                   f"org_{pool}", advice)
            if sum(held.values()) >= getattr(self.limits, pool):
                raise self._refuse(user, f"too many {what} of all users", pool,
                                   "retry in a few seconds")
            held[user] = mine + 1
            orgs[okey] = ours + 1
        try:
            yield
        finally:
            with self._lock:
                for table, key in ((held, user), (orgs, okey)):
                    table[key] -= 1
                    if not table[key]:
                        del table[key]

    def stream(self, user: str, org: str | None = None):
        """Hold one of the user's (its organisation's, the party's) open streams for the
        ``with`` body."""
        return self._hold("streams", "open streams", user, org,
                          "wait for them to finish or cancel them")

    def blocking_call(self, user: str, org: str | None = None):
        """Hold one of the user's (its organisation's, the party's) blocking calls."""
        return self._hold("blocking_calls", "calls waiting on this party", user, org,
                          "wait for them to return before starting more")

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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def memory_refusal(lim: Limits, rank: int, kind: str, owner: str, need: int,
                   active: list[tuple[str, int]]) -> str | None:
    """Why a job estimated to need ``need`` bytes of working memory is refused, given the
    (owner, estimate) of the queued and running jobs - beyond job_memory_bytes, or its
    user's or all jobs' estimates beyond user_memory_bytes or party_memory_bytes - else
    None."""
    mine = sum(n for o, n in active if o == owner)
    held = sum(n for _, n in active)
    what = f"party {rank}: job {kind} needs ~{_mib(need)} of working memory"
    if need > lim.job_memory_bytes:
        return (f"{what} (estimated), more than job_memory_bytes = {lim.job_memory_bytes} "
                "in [limits]; send a smaller batch or shorter inputs")
    if mine + need > lim.user_memory_bytes:
        return (f"{what} (estimated) and user {owner!r}'s queued and running jobs "
                f"{_mib(mine)}, more than user_memory_bytes = {lim.user_memory_bytes} in "
                "[limits]; wait for them to finish")
    if held + need > lim.party_memory_bytes:
        return (f"{what} (estimated) and the queued and running jobs {_mib(held)}, more "
                f"than party_memory_bytes = {lim.party_memory_bytes} in [limits]; retry later")
    return None
