"""Running jobs on one party: a fair, bounded admission queue with one order for all parties.

Why one order. A job computes only when all three parties run it; if parties admitted jobs to
their running slots in different orders, two of them could each wait for a job the other has
queued. So **party 0 admits** and parties 1 and 2 follow: party 0 keeps the queue, starts a job
when one of its ``running_jobs`` slots is free and tells the other two over the peer links
(a ``start`` control frame, :meth:`net.link.PeerRouter.send_control`); they start exactly the
jobs party 0 started, whenever both the submission and the start have arrived.

Fairness. Party 0's queue is one FIFO per user, served round robin, so a user with many jobs
does not delay the others' next job by more than one job each. Bounded everywhere: at most
``user_jobs`` queued + running jobs per user and ``queued_jobs`` waiting in all; a job that
waits longer than ``queue_timeout_s`` fails with a message saying so (resubmit). A running job
is aborted at ``job_timeout_s``; peers that stop answering abort it after the peer timeout.

The runner is transport-agnostic: it gets a Party per started job from ``open_party`` and
runs the job through :func:`protocols.jobs.execute`, exactly as the in-process backend does.
"""
from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from mpc3.comm import Aborted, ProtocolError
from mpc3.party import Party
from mpc3.shares import AShare
from protocols.jobs import (CostRecorder, JobContext, JobRefused, JobRegistry, JobSpec,
                            ModelView, admit, execute)
from protocols.jobs.memory import job_memory

from . import malloc

from .errors import BadRequest, Code, check_id
from .limits import Limits
from .proto import mpc3_pb2 as pb
from .sessions import Session, SessionStore

log = logging.getLogger("mpc3.runner")

S = pb.JobStatusReply
LEADER = 0
MAX_DONE_JOBS = 1000
#: A job estimated to need at least this much working memory returns it to the OS when it
#: ends with no other job running (:func:`net.malloc.trim`); smaller ones (decode steps)
#: keep the heap warm for the next job.
TRIM_AFTER_BYTES = 64 << 20
REFUSAL_CODES = {"unknown": Code.NOT_FOUND, "forbidden": Code.PERMISSION_DENIED,
                 "invalid": Code.INVALID_ARGUMENT}


@dataclass
class Job:
    job_id: str
    owner: str
    kind: str
    model_id: str
    spec: JobSpec | None = None
    model: ModelView | None = None
    inputs: dict[str, AShare] = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    input_bytes: int = 0
    session: Session | None = None
    state: int = S.QUEUED
    error: str = ""
    outputs: dict[str, AShare] | None = None
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    wall_s: float = 0.0
    party: Party | None = None
    done: threading.Event = field(default_factory=threading.Event)
    costs: list = field(default_factory=list)
    queue_position: int = 0
    memory_bytes: int = 0           # estimated working memory (protocols.jobs.memory)

    def reply(self) -> pb.JobStatusReply:
        st = self.party.stats if self.party is not None else None
        wall = self.wall_s or (time.monotonic() - self.started if self.started else 0.0)
        return pb.JobStatusReply(job_id=self.job_id, state=self.state, error=self.error,
                                 wall_s=wall, bytes_sent=st.bytes_sent if st else 0,
                                 messages=st.messages if st else 0,
                                 rounds=st.rounds if st else 0,
                                 queue_position=self.queue_position)


class JobRunner:
    """Jobs of one party. ``open_party(job_id)`` gives the job's Party (raising
    BadRequest UNAVAILABLE if links are down), ``close_party(job_id)`` releases it, and
    ``announce(job_id)`` (party 0 only) tells the other parties to start the job."""

    def __init__(self, rank: int, registry: JobRegistry, limits: Limits,
                 sessions: SessionStore, open_party: Callable[[str], Party], close_party: Callable[[str], None],
                 announce: Callable[[str], None] | None, job_timeout_s: float,
                 release_bytes: Callable[[str, int], None] = lambda user, n: None) -> None:
        self.rank = rank
        self.registry = registry
        self.limits = limits
        self.sessions = sessions
        self.open_party = open_party
        self.close_party = close_party
        self.announce = announce
        self.job_timeout_s = job_timeout_s
        self.release_bytes = release_bytes
        self._lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self._queues: dict[str, collections.deque] = {}    # party 0: user -> queued jobs
        self._turn: collections.deque = collections.deque()  # party 0: users, round robin
        self._waiting: dict[str, Job] = {}                 # parties 1, 2: submitted, not started
        self._early: dict[str, float] = {}                 # parties 1, 2: started, not submitted
        self._running = 0

    @property
    def leader(self) -> bool:
        return self.rank == LEADER

    # -------------------------------------------------------------------- queries ----
    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def counts(self) -> tuple[int, int]:
        """(running, queued) jobs on this party."""
        with self._lock:
            queued = sum(1 for j in self.jobs.values() if j.state == S.QUEUED)
            return self._running, queued

    # ----------------------------------------------------------------- admission ----
    def accept(self, kind: str, job_id: str, owner: str, model: ModelView, upload_id: str,
               params: dict, inputs: dict[str, AShare], input_bytes: int = 0) -> Job:
        """Admit a submission (:func:`protocols.jobs.admit`), bind its session and queue it.
        Raises BadRequest (nothing started, the session unchanged) when it is refused."""
        try:
            spec = admit(self.registry, kind, model, {k: v.shape for k, v in inputs.items()},
                         params)
        except JobRefused as exc:
            raise BadRequest(REFUSAL_CODES[exc.reason], f"party {self.rank}: {exc}") from None
        shapes = {k: v.shape for k, v in inputs.items()}
        job = Job(job_id=job_id, owner=owner, kind=kind, model_id=model.model_id, spec=spec,
                  model=model, inputs=inputs, params=params, input_bytes=input_bytes,
                  memory_bytes=job_memory(spec, model, shapes))
        if spec.session is not None:
            sid = check_id(params.get("session"), "session id")
            if spec.session == "close":
                self.sessions.acquire(sid, owner, model.model_id, upload_id, closing=True)
                self.release_bytes(owner, input_bytes)
                job.input_bytes = 0
                return self.record_done(job)
            if spec.session == "open":
                job.session = self.sessions.open(sid, owner, model.model_id, upload_id)
            else:
                job.session = self.sessions.acquire(sid, owner, model.model_id, upload_id)
        try:
            return self.submit(job)
        except BadRequest as exc:
            if spec.session == "open":
                self.sessions.forget(job.session)          # a refused open leaves nothing
            elif job.session is not None:
                self.sessions.release(job.session, True, str(exc))
            raise

    def submit(self, job: Job) -> Job:
        """Queue an admitted job (party 0) or wait for party 0's start (parties 1, 2)."""
        with self._lock:
            if job.job_id in self.jobs:
                raise BadRequest(Code.ALREADY_EXISTS, f"job id {job.job_id!r} already used")
            mine = sum(1 for j in self.jobs.values()
                       if j.owner == job.owner and j.state in (S.QUEUED, S.RUNNING))
            if mine >= self.limits.user_jobs:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: user "
                                 f"{job.owner!r} already has {mine} jobs queued or running "
                                 f"(limit user_jobs = {self.limits.user_jobs} in [limits]); "
                                 "wait for one to finish")
            queued = sum(1 for j in self.jobs.values() if j.state == S.QUEUED)
            if queued >= self.limits.queued_jobs:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: the queue "
                                 f"holds {queued} jobs (limit queued_jobs = "
                                 f"{self.limits.queued_jobs} in [limits]); retry later")
            self._check_memory_locked(job)
            job.state = S.QUEUED
            self.jobs[job.job_id] = job
            self._trim_locked()
            if self.leader:
                if job.owner not in self._queues:
                    self._queues[job.owner] = collections.deque()
                    self._turn.append(job.owner)
                self._queues[job.owner].append(job)
                job.queue_position = queued
                starts = self._dispatch_locked()
            elif self._early.pop(job.job_id, None) is not None:
                starts = [job]
            else:
                self._waiting[job.job_id] = job
                starts = []
        self._start_all(starts)
        return job

    def _check_memory_locked(self, job: Job) -> None:
        """Refuse a job whose estimated working memory exceeds job_memory_bytes, or would
        bring its user's or all queued and running jobs' estimates beyond user_memory_bytes
        or party_memory_bytes (RESOURCE_EXHAUSTED with the figures)."""
        lim, need = self.limits, job.memory_bytes
        active = [j for j in self.jobs.values() if j.state in (S.QUEUED, S.RUNNING)]
        mine = sum(j.memory_bytes for j in active if j.owner == job.owner)
        held = sum(j.memory_bytes for j in active)
        what = f"party {self.rank}: job {job.kind} needs ~{_mib(need)} of working memory"
        if need > lim.job_memory_bytes:
            raise BadRequest(Code.RESOURCE_EXHAUSTED, f"{what} (estimated), more than "
                             f"job_memory_bytes = {lim.job_memory_bytes} in [limits]; send "
                             "a smaller batch or shorter inputs")
        if mine + need > lim.user_memory_bytes:
            raise BadRequest(Code.RESOURCE_EXHAUSTED, f"{what} (estimated) and user "
                             f"{job.owner!r}'s queued and running jobs {_mib(mine)}, more "
                             f"than user_memory_bytes = {lim.user_memory_bytes} in [limits];"
                             " wait for them to finish")
        if held + need > lim.party_memory_bytes:
            raise BadRequest(Code.RESOURCE_EXHAUSTED, f"{what} (estimated) and the queued "
                             f"and running jobs {_mib(held)}, more than party_memory_bytes "
                             f"= {lim.party_memory_bytes} in [limits]; retry later")

    def on_start(self, job_id: str) -> None:
        """Party 0 started ``job_id`` (parties 1 and 2)."""
        with self._lock:
            job = self._waiting.pop(job_id, None)
            if job is None:
                if job_id not in self.jobs and len(self._early) < 4 * self.limits.queued_jobs:
                    self._early[job_id] = time.monotonic()
                return
        self._start_all([job])

    def _dispatch_locked(self) -> list[Job]:
        starts = []
        while self._running < self.limits.running_jobs and self._turn:
            user = self._turn.popleft()
            q = self._queues[user]
            job = q.popleft()
            if q:
                self._turn.append(user)
            else:
                del self._queues[user]
            self._running += 1
            job.state = S.RUNNING
            starts.append(job)
        if starts:
            pos = 0
            for user in self._turn:
                for j in self._queues[user]:
                    j.queue_position = pos
                    pos += 1
        return starts

    def _start_all(self, jobs: list[Job]) -> None:
        for job in jobs:
            if not self.leader:
                with self._lock:
                    self._running += 1
                    job.state = S.RUNNING
            job.started = time.monotonic()
            try:
                job.party = self.open_party(job.job_id)
                if self.announce is not None:
                    self.announce(job.job_id)
            except BadRequest as exc:
                self._finish(job, S.FAILED, f"party {self.rank}: {exc}", started=False)
                continue
            threading.Thread(target=self._run, args=(job,), daemon=True,
                             name=f"mpc3-job-{job.job_id}").start()

    # ------------------------------------------------------------------- running ----
    def _run(self, job: Job) -> None:
        party = job.party
        watchdog = threading.Timer(self.job_timeout_s, party.comm.abort,
                                   args=(f"job deadline of {self.job_timeout_s:g} s "
                                         "exceeded",))
        watchdog.daemon = True
        watchdog.start()
        log.info("party %d: job %s (%s on %s) started", self.rank, job.job_id, job.kind,
                 job.model_id)
        state, error = S.DONE, ""
        try:
            ctx = JobContext(party, job.model, job.params, CostRecorder(party), job.session)
            job.outputs = execute(job.spec, ctx, job.inputs)
            job.costs = ctx.costs.entries
        except Aborted as exc:
            state = S.CANCELLED if "cancelled" in str(exc) else S.FAILED
            error = str(exc)
            party.comm.abort(error)
        except Exception as exc:  # noqa: BLE001 - any failure ends the job, not the process
            state, error = S.FAILED, f"party {self.rank}: {type(exc).__name__}: {exc}"
            party.comm.abort(error)
        finally:
            watchdog.cancel()
            self.close_party(job.job_id)
        # A job that never exchanged a message cannot have changed its session's state
        # (session job kinds change state only after communicating): the session survives.
        self._finish(job, state, error, started=party.comm.op > 0)

    def _finish(self, job: Job, state: int, error: str, started: bool) -> None:
        """``started``: the job may have changed its session's state (drop it on failure)."""
        job.inputs = {}
        self.release_bytes(job.owner, job.input_bytes)
        job.input_bytes = 0
        if job.session is not None:
            if job.spec is not None and job.spec.session == "open" and state != S.DONE:
                self.sessions.forget(job.session)   # never opened: the id may be used again
            else:
                self.sessions.release(job.session, state == S.DONE or not started, error)
        with self._lock:
            if job.state == S.RUNNING:
                self._running -= 1
            job.state, job.error = state, error
            job.wall_s = time.monotonic() - job.started if job.started else 0.0
            starts = self._dispatch_locked() if self.leader else []
            idle = self._running == 0 and not starts
        if idle and job.memory_bytes >= TRIM_AFTER_BYTES:
            gc.collect()             # cycles holding arrays, then the freed heap
            malloc.trim()
        job.done.set()
        log.info("party %d: job %s %s in %.3f s%s", self.rank, job.job_id,
                 S.State.Name(state), job.wall_s, f" ({error})" if error else "")
        self._start_all(starts)

    def record_done(self, job: Job) -> Job:
        """A job that needs no computation (closing a session): done at once."""
        with self._lock:
            if job.job_id in self.jobs:
                raise BadRequest(Code.ALREADY_EXISTS, f"job id {job.job_id!r} already used")
            job.state, job.outputs = S.DONE, {}
            job.done.set()
            self.jobs[job.job_id] = job
            self._trim_locked()
        return job

    # ------------------------------------------------------------- cancel, expiry ----
    def _unqueue_locked(self, job: Job) -> bool:
        if self.leader:
            q = self._queues.get(job.owner)
            if q is None or job not in q:
                return False
            q.remove(job)
            if not q:
                del self._queues[job.owner]
                self._turn.remove(job.owner)
            return True
        return self._waiting.pop(job.job_id, None) is not None

    def cancel(self, job: Job, reason: str) -> None:
        with self._lock:
            queued = job.state == S.QUEUED and self._unqueue_locked(job)
        if queued:
            self._finish(job, S.CANCELLED, reason, started=False)
        elif job.state == S.RUNNING and job.party is not None:
            job.party.comm.abort(reason)

    def expire(self, peer_timeout_s: float) -> list[str]:
        """Fail jobs that waited too long (party 0: in the queue; others: for the start)."""
        now = time.monotonic()
        limit = self.limits.queue_timeout_s + (0 if self.leader else peer_timeout_s)
        with self._lock:
            old = [j for j in self.jobs.values()
                   if j.state == S.QUEUED and now - j.submitted > limit]
            old = [j for j in old if self._unqueue_locked(j)]
            for jid in [k for k, t in self._early.items() if now - t > limit]:
                del self._early[jid]
        for job in old:
            why = (f"waited {limit:g} s in party 0's queue without a free slot" if self.leader
                   else f"party 0 did not start it within {limit:g} s")
            self._finish(job, S.FAILED, f"party {self.rank}: job {why}; it was not run - "
                         "resubmit it later", started=False)
        return [j.job_id for j in old]

    def _trim_locked(self) -> None:
        done = [j for j in self.jobs.values() if j.state not in (S.QUEUED, S.RUNNING)]
        for j in done[:max(0, len(done) - MAX_DONE_JOBS)]:
            del self.jobs[j.job_id]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def party_unavailable(exc: ProtocolError) -> BadRequest:
    return BadRequest(Code.UNAVAILABLE, str(exc))
