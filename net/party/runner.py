"""Running jobs on one party: a fair, bounded admission queue with one order for all parties.

Why one order. A job computes only when all three parties run it; if parties admitted jobs to
their running slots in different orders, two of them could each wait for a job the other has
queued. So **party 0 admits** and parties 1 and 2 follow: party 0 keeps the queue, starts a job
when one of its ``running_jobs`` slots is free and tells the other two over the peer links
(a ``start`` control frame, :meth:`net.peer.router.PeerRouter.send_control`); they start exactly the
jobs party 0 started, whenever both the submission and the start have arrived.

Arrival. A job enters party 0's queue only once parties 1 and 2 said they hold its
submission (a ``have`` control each); one that has not reached all three parties within
``job_arrival_s`` fails on party 0 without ever taking a running slot, and party 0 tells the
others to ``drop`` it (so does a ``have`` of a job party 0 never received). A follower that
will not run a job party 0 holds - cancelled there, or started by party 0 but unknown - says
``gone``, and party 0 cancels or aborts it. So a job submitted to a subset of the parties
holds no slot anywhere for longer than ``job_arrival_s`` (it held party 0's slot for the
peer timeout, and 8 such jobs kept every other user's job waiting 22-29.5 s).

Fairness. Party 0's queue is one FIFO per user, served round robin, so a user with many jobs
does not delay the others' next job by more than one job each. Bounded everywhere: at most
``user_jobs`` queued + running jobs per user and ``queued_jobs`` waiting in all; a job that
waits longer than ``queue_timeout_s`` fails with a message saying so (resubmit). A running job
is aborted at ``job_timeout_s``; peers that stop answering abort it after the peer timeout.

The runner is transport-agnostic: it gets a Party per started job from ``open_party`` and
runs the job through :func:`protocols.jobs.execute`, exactly as the in-process backend does;
with ``security = "malicious"`` verified, or refused, by :mod:`net.party.malicious`.
"""
from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from mpc3.comm import Aborted
from mpc3.party import Party
from mpc3.shares import AShare
from net.errors import BadRequest, Code, check_id
from net.limits import Limits, memory_refusal
from net.proto import mpc3_pb2 as pb
from protocols.jobs import (
    JobContext,
    JobRefused,
    JobRegistry,
    JobSpec,
    ModelView,
    admit,
    execute,
)
from protocols.jobs.memory import job_memory

from . import malicious, malloc
from .sessions import Session, SessionStore

log = logging.getLogger("mpc3.runner")

S = pb.JobStatusReply
LEADER = 0
FOLLOWERS = (1, 2)
MAX_DONE_JOBS = 1000
#: A job estimated to need at least this much working memory returns it to the OS when it
#: ends with no other job running (:func:`net.party.malloc.trim`); smaller ones (decode steps)
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
    org: str = ""                 # the owner's organisation (sessions' org_sessions)
    have: set = field(default_factory=set)   # party 0: followers holding the submission
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
    ``tell(peer, job_id, control)`` sends a control to another party (BadRequest
    UNAVAILABLE if it cannot): ``start``, ``drop`` from party 0, ``have``, ``gone`` to it."""

    def __init__(self, rank: int, registry: JobRegistry, limits: Limits,
                 sessions: SessionStore, open_party: Callable[[str], Party],
                 close_party: Callable[[str], None],
                 tell: Callable[[int, str, str], None], job_timeout_s: float,
                 release_bytes: Callable[[str, int], None] = lambda user, n: None,
                 metrics=None, security: str = malicious.SEMI_HONEST,
                 mode_problem: Callable[[], str] = lambda: "") -> None:
        """``metrics``: a :class:`net.party.metrics.Metrics` told of every job that ends;
        ``mode_problem()``: why the parties' security modes disagree ('' if they do not)."""
        self.rank = rank
        self.registry = registry
        self.limits = limits
        self.sessions = sessions
        self.open_party = open_party
        self.close_party = close_party
        self.tell = tell
        self.job_timeout_s = job_timeout_s
        self.release_bytes = release_bytes
        self.metrics = metrics
        self.security, self.mode_problem = security, mode_problem
        self._lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self._queues: dict[str, collections.deque] = {}    # party 0: user -> queued jobs
        self._turn: collections.deque = collections.deque()  # party 0: users, round robin
        self._pending: dict[str, Job] = {}                 # party 0: not yet on every party
        self._early: dict[str, tuple[set, float]] = {}     # party 0: 'have' before the job
        self._waiting: dict[str, Job] = {}                 # parties 1, 2: submitted, not started
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
               params: dict, inputs: dict[str, AShare], input_bytes: int = 0,
               org: str = "") -> Job:
        """Admit a submission (:func:`protocols.jobs.admit`), bind its session and queue it.
        Raises BadRequest (nothing started, the session unchanged) when it is refused."""
        if self.mode_problem():
            raise BadRequest(Code.FAILED_PRECONDITION, self.mode_problem())
        try:
            spec = admit(self.registry, kind, model, {k: v.shape for k, v in inputs.items()},
                         params)
        except JobRefused as exc:
            raise BadRequest(REFUSAL_CODES[exc.reason], f"party {self.rank}: {exc}") from None
        shapes = {k: v.shape for k, v in inputs.items()}
        job = Job(job_id=job_id, owner=owner, kind=kind, model_id=model.model_id, spec=spec,
                  model=model, inputs=inputs, params=params, input_bytes=input_bytes, org=org,
                  memory_bytes=job_memory(spec, model, shapes))
        if spec.session is not None:
            sid = check_id(params.get("session"), "session id")
            if spec.session == "close":
                self.sessions.acquire(sid, owner, model.model_id, upload_id, closing=True)
                self.release_bytes(owner, input_bytes)
                job.input_bytes = 0
                return self.record_done(job)
            if spec.session == "open":
                job.session = self.sessions.open(sid, owner, model.model_id, upload_id, org)
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
            job.queue_position = queued
            starts = []
            if self.leader:
                job.have = self._early.pop(job.job_id, (set(), 0.0))[0]
                if job.have.issuperset(FOLLOWERS):
                    starts = self._enqueue_locked(job)
                else:
                    self._pending[job.job_id] = job
            else:
                self._waiting[job.job_id] = job
        if not self.leader:
            self._tell_quietly(LEADER, job.job_id, "have")
        self._start_all(starts)
        return job

    def _enqueue_locked(self, job: Job) -> list[Job]:
        """Party 0: the job is on every party - into its owner's FIFO; the jobs to start."""
        if job.owner not in self._queues:
            self._queues[job.owner] = collections.deque()
            self._turn.append(job.owner)
        self._queues[job.owner].append(job)
        return self._dispatch_locked()

    def _tell_quietly(self, peer: int, job_id: str, control: str) -> None:
        try:
            self.tell(peer, job_id, control)
        except BadRequest as exc:
            log.info("party %d: could not tell party %d %r of job %s (%s)", self.rank, peer,
                     control, job_id, exc)

    def on_control(self, peer: int, job_id: str, control: str) -> None:
        """A control of another party about ``job_id`` (see the module's docstring)."""
        if self.leader and peer in FOLLOWERS and control == "have":
            self._on_have(peer, job_id)
        elif self.leader and peer in FOLLOWERS and control == "gone":
            job = self.get(job_id)
            if job is not None:
                self.cancel(job, f"party {peer} will not run it (cancelled or expired there)")
            with self._lock:
                self._early.get(job_id, (set(), 0.0))[0].discard(peer)
        elif not self.leader and peer == LEADER and control == "start":
            self.on_start(job_id)
        elif not self.leader and peer == LEADER and control == "drop":
            with self._lock:
                job = self._waiting.pop(job_id, None)
            if job is not None:
                self._finish(job, S.FAILED, f"party {self.rank}: party 0 dropped the job (it "
                             "did not reach all three parties in time, or was refused or "
                             "cancelled there); it was not run - resubmit it", started=False)
        else:
            log.warning("party %d: ignored control %r from party %d", self.rank,
                        control[:20], peer)

    def _on_have(self, peer: int, job_id: str) -> None:
        drop = False
        with self._lock:
            job, starts = self._pending.get(job_id), []
            if job is not None:
                job.have.add(peer)
                if job.have.issuperset(FOLLOWERS):
                    del self._pending[job_id]
                    starts = self._enqueue_locked(job)
            elif job_id in self.jobs:     # ended here before it arrived there: not to be run
                drop = self.jobs[job_id].state in (S.FAILED, S.CANCELLED) and \
                    self.jobs[job_id].started is None
            elif job_id in self._early or len(self._early) < 4 * self.limits.queued_jobs:
                self._early.setdefault(job_id, (set(), time.monotonic()))[0].add(peer)
            else:
                drop = True
        if drop:
            self._tell_quietly(peer, job_id, "drop")
        self._start_all(starts)

    def _check_memory_locked(self, job: Job) -> None:
        """Refuse a job beyond the [limits] memory keys (:func:`net.limits.memory_refusal`)."""
        active = [(j.owner, j.memory_bytes) for j in self.jobs.values()
                  if j.state in (S.QUEUED, S.RUNNING)]
        refusal = memory_refusal(self.limits, self.rank, job.kind, job.owner,
                                 job.memory_bytes, active)
        if refusal:
            raise BadRequest(Code.RESOURCE_EXHAUSTED, refusal)

    def on_start(self, job_id: str) -> None:
        """Party 0 started ``job_id`` (parties 1 and 2); one not waiting here is gone."""
        with self._lock:
            job = self._waiting.pop(job_id, None)
        if job is None:
            self._tell_quietly(LEADER, job_id, "gone")
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
                if self.leader:
                    for peer in FOLLOWERS:
                        self.tell(peer, job.job_id, "start")
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
                 job.model_id, extra={"event": "job_started", "job": job.job_id,
                                      "user": job.owner, "kind": job.kind})
        state, error = S.DONE, ""
        try:
            costs = malicious.start(party, self.security, self.mode_problem(), job.inputs,
                                    job.model)
            outputs = execute(job.spec, JobContext(party, job.model, job.params, costs,
                                                   job.session), job.inputs)
            if party.checks is not None:
                malicious.finish(costs)        # verified before any output share is kept
            job.outputs, job.costs = outputs, costs.entries
        except Aborted as exc:
            state = S.CANCELLED if "cancelled" in str(exc) else S.FAILED
            error = str(exc)
            party.comm.abort(error)
        except Exception as exc:  # noqa: BLE001 - any failure ends the job, not the process
            refused = malicious.refusal(self.rank, job.job_id, exc)
            state, error = S.FAILED, refused or f"party {self.rank}: {type(exc).__name__}: {exc}"
            if not malicious.raised_everywhere(exc):   # a failed flush fails everywhere
                party.comm.abort(error)
        finally:
            watchdog.cancel()
            malicious.end(party)               # its checks' scratch serves the next job
            self.close_party(job.job_id)
        # A job that never exchanged a message cannot have changed its session's state
        # (session job kinds change state only after communicating): the session survives.
        self._finish(job, state, error, started=party.comm.op > 0)

    def _finish(self, job: Job, state: int, error: str, started: bool) -> None:
        """``started``: the job may have changed its session's state (drop it on failure)."""
        job.inputs = {}
        nbytes = job.input_bytes
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
            job.wall_s = time.monotonic() - job.started if job.started else 0.0
            self._count(job, state, nbytes)      # before the state: a client that saw the
            job.state, job.error = state, error  # job end sees it counted and logged
            starts = self._dispatch_locked() if self.leader else []
            idle = self._running == 0 and not starts
        log.info("party %d: job %s %s in %.3f s%s", self.rank, job.job_id,
                 S.State.Name(state), job.wall_s, f" ({error})" if error else "",
                 extra={"event": "job_" + S.State.Name(state).lower(), "job": job.job_id,
                        "user": job.owner, "kind": job.kind})
        if idle and job.memory_bytes >= TRIM_AFTER_BYTES:
            gc.collect()             # cycles holding arrays, then the freed heap
            malloc.trim()
        job.done.set()
        self._start_all(starts)

    def record_done(self, job: Job) -> Job:
        """A job that needs no computation (closing a session): done at once."""
        with self._lock:
            if job.job_id in self.jobs:
                raise BadRequest(Code.ALREADY_EXISTS, f"job id {job.job_id!r} already used")
            job.state, job.outputs = S.DONE, {}
            self._count(job, S.DONE, 0)
            job.done.set()
            self.jobs[job.job_id] = job
            self._trim_locked()
        return job

    def _count(self, job: Job, state: int, input_bytes: int) -> None:
        if self.metrics is not None:
            self.metrics.job_finished(
                job.kind, job.owner, S.State.Name(state).lower(),
                job.party.stats if job.party is not None else None, job.wall_s,
                job.started - job.submitted if job.started else None, input_bytes)

    # ------------------------------------------------------------- cancel, expiry ----
    def _unqueue_locked(self, job: Job) -> bool:
        if self.leader:
            if self._pending.pop(job.job_id, None) is not None:
                return True
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
            self._tell_dropped(job)
        elif job.state == S.RUNNING and job.party is not None:
            job.party.comm.abort(reason)

    def _tell_dropped(self, job: Job) -> None:
        """A job that will not run here: party 0 tells followers to drop it, others: gone."""
        if self.leader:
            for peer in FOLLOWERS:
                self._tell_quietly(peer, job.job_id, "drop")
        else:
            self._tell_quietly(LEADER, job.job_id, "gone")

    def expire(self, peer_timeout_s: float) -> list[str]:
        """Fail jobs that waited too long (party 0: to arrive on every party, or in the
        queue; others: for the start)."""
        now = time.monotonic()
        limit = self.limits.queue_timeout_s + (0 if self.leader else peer_timeout_s)
        arrival = self.limits.job_arrival_s
        with self._lock:
            late = [j for j in self._pending.values() if now - j.submitted > arrival]
            for j in late:
                del self._pending[j.job_id]
            strays = [(k, peers) for k, (peers, t) in self._early.items() if now - t > arrival]
            for k, _ in strays:
                del self._early[k]
            old = [j for j in self.jobs.values()
                   if j.state == S.QUEUED and now - j.submitted > limit]
            old = [j for j in old if self._unqueue_locked(j)]
        for job in late:
            missing = " and ".join(f"party {p}" for p in FOLLOWERS if p not in job.have)
            self._finish(job, S.FAILED, f"party {self.rank}: job did not reach {missing} "
                         f"within {arrival:g} s (limit job_arrival_s in [limits]); it was not "
                         "run - submit it to all three parties", started=False)
            self._tell_dropped(job)
        for job_id, peers in strays:
            for peer in peers:
                self._tell_quietly(peer, job_id, "drop")
        for job in old:
            why = (f"waited {limit:g} s in party 0's queue without a free slot" if self.leader
                   else f"party 0 did not start it within {limit:g} s")
            self._finish(job, S.FAILED, f"party {self.rank}: job {why}; it was not run - "
                         "resubmit it later", started=False)
            self._tell_dropped(job)
        return [j.job_id for j in late + old]

    def _trim_locked(self) -> None:
        done = [j for j in self.jobs.values() if j.state not in (S.QUEUED, S.RUNNING)]
        for j in done[:max(0, len(done) - MAX_DONE_JOBS)]:
            del self.jobs[j.job_id]
