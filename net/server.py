"""The party process: peer links, model-share storage, jobs, outputs and health.

One process per party. It serves three gRPC services on one port:

* ``mpc3.PeerService`` - the share streams to the two other parties (:mod:`net.link`);
* ``mpc3.ClientService`` - model owners upload/list/delete model shares; query users submit
  jobs on a stored model, poll them, fetch their own output shares, cancel them;
* ``grpc.health.v1.Health`` - SERVING once both peer links are up, NOT_SERVING otherwise.

Authorization comes from the verified client certificate (:mod:`net.keys`): OU
``model-owner`` may upload and delete (its own) models; OU ``query-user`` may submit jobs and
see, fetch or cancel only jobs submitted under its own CN.

Storage. Each model is a directory ``<data_dir>/models/<model_id>/`` holding one file per
tensor (this party's pair ``(x_i, x_{i+1})`` as raw little-endian uint64) and ``meta.json``
with shapes and SHA-256 checksums. An upload is written into a staging directory (every file
tmp + fsync + rename) and becomes visible by one directory rename, so a crash or a rejected
upload never leaves a half model behind, and models survive restarts (checksums are verified
when loaded).

Jobs. A job kind is a function ``fn(party, model, inputs, params) -> outputs`` over
``dict[str, AShare]`` registered in :data:`JOB_KINDS` (:func:`register_job_kind`), with an
optional ``validate(model_shapes, input_shapes, params)`` run before the job is accepted, so
bad input is refused with a precise status and nothing is started. ``params`` is the
client's public JSON parameters plus ``model_meta``, the public description stored with the
model. Each job runs on its own thread with its own Party, GrpcComm and PRG; at most
``max_jobs`` run at once (more are refused rather than queued, so parties can never wait on
each other in different orders).

Sessions. A job kind registered with ``session="open" | "step" | "close"`` belongs to a
*session*: state a party keeps between jobs (the incremental decode state of
:mod:`protocols.jobs`), named by ``params["session"]``, owned by the query user who opened it
and bound to one upload of one model. Every job of a session - each decoding step - is its
own job with its own job id, so PRG keys are never reused. One job of a session runs at a
time; a failed or cancelled job drops the session (its state may be half updated); a session
idle for ``session_idle_s`` is dropped; ``close`` drops it at once (no peer traffic). The job
function sees the session as ``params["_session"]``; client parameters starting with ``_``
are refused.

Costs. JobStatus replies carry the job's traffic counters; a job function may also append
public per-layer costs to ``params["_costs"]``, returned as JSON in the trailing metadata
``x-mpc3-costs`` of JobStatus once the job is done. A JobStatus request with metadata
``x-mpc3-wait-s`` waits up to that long (at most 30 s) for a running job to end (long poll).

Nothing secret is logged: only ids, names, shapes, states and error messages.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc
import numpy as np

from mpc3.comm import Aborted
from mpc3.kernels.arith import matmul_aa
from mpc3.party import Party, RingConfig
from mpc3.shares import AShare

from . import keys
from .config import ClusterConfig
from .link import CHUNK_BYTES, SERVER_OPTIONS, PeerRouter, PeerUnavailable
from .proto import mpc3_pb2 as pb
from .proto import mpc3_pb2_grpc as pb_grpc

log = logging.getLogger("mpc3.server")

VERSION = "mpc3-net/1"
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TENSOR_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$")
MAX_TENSORS = 10_000
MAX_META = 1 << 16
#: A tensor may carry up to this many fractional bits more than the cluster's ``frac``
#: (e.g. projection weights encoded with frac + PROJ_EXTRA, see protocols.secure_model).
MAX_EXTRA_FRAC = 16
MAX_DONE_JOBS = 1000
MAX_SESSIONS = 64
#: Seconds a decode session may stay idle before the party drops it (env override for tests).
SESSION_IDLE_S = float(os.environ.get("MPC3_SESSION_IDLE_S", "300"))
MAX_WAIT_S = 30.0
SESSION_MODES = ("open", "step", "close")
Code = grpc.StatusCode

#: Modules imported by every party process so they can call :func:`register_job_kind`
#: (a missing module is skipped); ``[cluster] job_modules = [...]`` adds more.
JOB_KIND_MODULES = ("protocols.jobs",)

JobFn = Callable[[Party, dict, dict, dict], dict]
JOB_KINDS: dict[str, JobFn] = {}
JOB_VALIDATORS: dict[str, Callable[[dict, dict, dict], None]] = {}
JOB_SESSION: dict[str, str] = {}


def register_job_kind(name: str, fn: JobFn,
                      validate: Callable[[dict, dict, dict], None] | None = None,
                      session: str | None = None) -> None:
    """Make job kind ``name`` available; ``validate`` raises ValueError on bad shapes/params.

    ``session``: None (a stand-alone job) or the kind's role in a session, "open", "step" or
    "close" (see the module docstring).
    """
    if not ID_RE.match(name):
        raise ValueError(f"invalid job kind name {name!r}")
    if session is not None and session not in SESSION_MODES:
        raise ValueError(f"session must be one of {SESSION_MODES}, got {session!r}")
    JOB_KINDS[name] = fn
    if validate is not None:
        JOB_VALIDATORS[name] = validate
    else:
        JOB_VALIDATORS.pop(name, None)
    if session is not None:
        JOB_SESSION[name] = session
    else:
        JOB_SESSION.pop(name, None)


def load_job_kinds(extra: tuple[str, ...] = ()) -> None:
    """Import the modules that register job kinds (see :data:`JOB_KIND_MODULES`)."""
    import importlib
    for name in (*JOB_KIND_MODULES, *extra):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name or name in extra:
                raise
            continue
        hook = getattr(module, "register_job_kinds", None)
        if hook is not None:      # modules below net in the layering cannot import us
            hook(register_job_kind)


# ---------------------------------------------------------------- built-in job kinds ----
def _linear_relu(party: Party, model: dict, inputs: dict, params: dict) -> dict:
    """Y = X @ W (fixed point, truncated); ``repeat`` > 1 applies W again (square W)."""
    w = model[params.get("weight", "W")]
    y = inputs["X"]
    for _ in range(int(params.get("repeat", 1))):
        y = matmul_aa(party, y, w)
    return {"Y": y}


def _validate_linear(model: dict, inputs: dict, params: dict) -> None:
    wname = params.get("weight", "W")
    if wname not in model:
        raise ValueError(f"model has no tensor {wname!r}")
    if set(inputs) != {"X"}:
        raise ValueError(f"linear_relu takes exactly one input 'X', got {sorted(inputs)}")
    w, x = model[wname], inputs["X"]
    if len(w) != 2 or len(x) < 1 or x[-1] != w[0]:
        raise ValueError(f"shapes do not compose: X {tuple(x)} @ {wname} {tuple(w)}")
    repeat = params.get("repeat", 1)
    if not isinstance(repeat, int) or not 1 <= repeat <= 100_000:
        raise ValueError("repeat must be an integer in 1..100000")
    if repeat > 1 and w[0] != w[1]:
        raise ValueError("repeat > 1 needs a square weight")


register_job_kind("linear_relu", _linear_relu, _validate_linear)


# ------------------------------------------------------------------------ requests ----
class BadRequest(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _check_id(value: str, what: str) -> str:
    if not ID_RE.match(value or ""):
        raise BadRequest(Code.INVALID_ARGUMENT,
                         f"{what} {value!r} is invalid (1-64 of A-Z a-z 0-9 _ . -)")
    return value


def share_payload(s: AShare) -> bytes:
    return np.ascontiguousarray(s.a, "<u8").tobytes() + np.ascontiguousarray(s.b, "<u8").tobytes()


def share_from_payload(data, shape) -> AShare:
    flat = np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=True)
    n = flat.size // 2
    return AShare(flat[:n].reshape(shape), flat[n:].reshape(shape))


def tensor_chunks(name: str, share: AShare, frac: int):
    """The TensorChunk messages carrying one share pair (used by server and client)."""
    payload = share_payload(share)
    digest = hashlib.sha256(payload).digest()
    total = len(payload)
    off = 0
    while True:
        end = min(off + CHUNK_BYTES, total)
        yield pb.TensorChunk(name=name, dtype="uint64", shape=share.shape, ring_bits=64,
                             frac=frac, offset=off, total_bytes=total,
                             data=payload[off:end], sha256=digest if end == total else b"")
        off = end
        if off >= total:
            return


class TensorAssembler:
    """Validates a stream of TensorChunks and rebuilds the tensors, one at a time."""

    def __init__(self, frac: int, max_tensor_bytes: int) -> None:
        self.frac = frac
        self.max_bytes = max_tensor_bytes
        self.cur: pb.TensorChunk | None = None
        self.buf: bytearray | None = None
        self.filled = 0
        self.names: set[str] = set()

    def feed(self, c: pb.TensorChunk) -> tuple[str, tuple, bytes, str] | None:
        """Returns (name, shape, payload, sha256 hex, frac) when a tensor completes."""
        bad = lambda msg: BadRequest(Code.INVALID_ARGUMENT, f"tensor {c.name!r}: {msg}")  # noqa: E731
        if len(c.data) > CHUNK_BYTES:
            raise bad(f"chunk of {len(c.data)} bytes exceeds the {CHUNK_BYTES}-byte limit")
        if self.cur is None:
            if not TENSOR_RE.match(c.name):
                raise BadRequest(Code.INVALID_ARGUMENT, f"invalid tensor name {c.name!r}")
            if c.name in self.names:
                raise bad("sent twice")
            if c.dtype != "uint64":
                raise bad(f"dtype {c.dtype!r} is not uint64 (shares are ring elements)")
            if c.ring_bits != 64:
                raise bad(f"ring Z_2^{c.ring_bits} is not the cluster's Z_2^64")
            if not self.frac <= c.frac <= self.frac + MAX_EXTRA_FRAC:
                raise bad(f"fixed-point frac {c.frac} outside the cluster's {self.frac}.."
                          f"{self.frac + MAX_EXTRA_FRAC}")
            if any(d < 0 for d in c.shape) or len(c.shape) > 8:
                raise bad(f"invalid shape {tuple(c.shape)}")
            n = int(np.prod(c.shape, dtype=np.int64)) if c.shape else 1
            if c.total_bytes != 16 * n:
                raise bad(f"total_bytes {c.total_bytes} does not match shape {tuple(c.shape)} "
                          f"(expected {16 * n}: two uint64 shares per element)")
            if c.total_bytes > self.max_bytes:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"tensor {c.name!r} of "
                                 f"{c.total_bytes} bytes exceeds the limit {self.max_bytes}")
            if c.offset != 0:
                raise bad("first chunk must have offset 0")
            self.cur, self.buf, self.filled = c, bytearray(c.total_bytes), 0
        elif (c.name != self.cur.name or tuple(c.shape) != tuple(self.cur.shape)
              or c.total_bytes != self.cur.total_bytes):
            raise BadRequest(Code.INVALID_ARGUMENT, f"tensor {self.cur.name!r} truncated: "
                             f"{self.filled} of {self.cur.total_bytes} bytes before "
                             f"tensor {c.name!r} started")
        if c.offset != self.filled:
            raise bad(f"chunk offset {c.offset}, expected {self.filled} (missing or "
                      "reordered chunk)")
        end = self.filled + len(c.data)
        if end > len(self.buf):
            raise bad(f"chunk overruns the tensor ({end} > {len(self.buf)} bytes)")
        self.buf[self.filled:end] = c.data
        self.filled = end
        if end < len(self.buf):
            if c.sha256:
                raise bad("checksum sent before the last chunk")
            return None
        digest = hashlib.sha256(self.buf).hexdigest()
        if not c.sha256:
            raise bad("last chunk lacks the sha256 checksum")
        if c.sha256.hex() != digest:
            raise BadRequest(Code.DATA_LOSS, f"tensor {c.name!r}: checksum mismatch")
        out = (self.cur.name, tuple(self.cur.shape), bytes(self.buf), digest, self.cur.frac)
        self.names.add(self.cur.name)
        self.cur, self.buf = None, None
        return out

    def finish(self) -> None:
        if self.cur is not None:
            raise BadRequest(Code.INVALID_ARGUMENT, f"tensor {self.cur.name!r} truncated: "
                             f"{self.filled} of {self.cur.total_bytes} bytes")


# ------------------------------------------------------------------------- storage ----
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync(dir): the file is either old or new, never partial."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class ModelStore:
    """Persisted model shares of this party (see module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "models"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._meta: dict[str, dict] = {}
        self._cache: dict[str, dict[str, AShare]] = {}
        self._uploading: set[str] = set()
        for p in self.root.iterdir():
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)      # staging left by a crash
            elif (p / "meta.json").is_file():
                try:
                    self._meta[p.name] = json.loads((p / "meta.json").read_text())
                    self._load(p.name)
                except (ValueError, OSError, KeyError) as exc:
                    self._meta.pop(p.name, None)
                    log.error("model %s in %s is unreadable, ignored: %s", p.name, p, exc)

    def _load(self, model_id: str) -> dict[str, AShare]:
        meta, d = self._meta[model_id], self.root / model_id
        out = {}
        for t in meta["tensors"]:
            data = (d / t["file"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != t["sha256"]:
                raise ValueError(f"tensor {t['name']!r}: checksum mismatch on disk")
            out[t["name"]] = share_from_payload(data, tuple(t["shape"]))
        self._cache[model_id] = out
        return out

    def info(self, model_id: str) -> dict | None:
        with self._lock:
            return self._meta.get(model_id)

    def is_uploading(self, model_id: str) -> bool:
        with self._lock:
            return model_id in self._uploading

    def list(self) -> tuple[list[dict], list[str]]:
        with self._lock:
            return list(self._meta.values()), sorted(self._uploading)

    def get(self, model_id: str) -> tuple[dict, dict[str, AShare]]:
        with self._lock:
            meta = self._meta.get(model_id)
            if meta is None:
                raise KeyError(model_id)
            shares = self._cache.get(model_id) or self._load(model_id)
            return meta, shares

    def begin(self, model_id: str) -> Path:
        with self._lock:
            if model_id in self._meta:
                raise BadRequest(Code.ALREADY_EXISTS, f"model {model_id!r} exists; delete it "
                                 "first to replace it")
            if model_id in self._uploading:
                raise BadRequest(Code.ABORTED, f"model {model_id!r} is being uploaded by "
                                 "another call")
            self._uploading.add(model_id)
        stage = self.root / f".staging-{model_id}-{os.urandom(6).hex()}"
        stage.mkdir()
        return stage

    def write_tensor(self, stage: Path, index: int, payload: bytes) -> str:
        name = f"t{index:05d}.bin"
        atomic_write(stage / name, payload)
        return name

    def commit(self, model_id: str, stage: Path, meta: dict) -> None:
        atomic_write(stage / "meta.json", json.dumps(meta, sort_keys=True).encode())
        os.rename(stage, self.root / model_id)
        _fsync_dir(self.root)
        with self._lock:
            self._meta[model_id] = meta
            self._uploading.discard(model_id)

    def abandon(self, model_id: str, stage: Path) -> None:
        shutil.rmtree(stage, ignore_errors=True)
        with self._lock:
            self._uploading.discard(model_id)

    def delete(self, model_id: str) -> None:
        with self._lock:
            if model_id not in self._meta:
                raise KeyError(model_id)
            del self._meta[model_id]
            self._cache.pop(model_id, None)
            trash = self.root / f".deleted-{model_id}-{os.urandom(6).hex()}"
            os.rename(self.root / model_id, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)


# ---------------------------------------------------------------------------- jobs ----
S = pb.JobStatusReply


@dataclass
class Job:
    job_id: str
    owner: str
    kind: str
    model_id: str
    state: int = S.RUNNING
    error: str = ""
    outputs: dict[str, AShare] | None = None
    started: float = field(default_factory=time.monotonic)
    wall_s: float = 0.0
    party: Party | None = None
    done: threading.Event = field(default_factory=threading.Event)
    costs: list = field(default_factory=list)
    session: "Session | None" = None

    def reply(self) -> pb.JobStatusReply:
        st = self.party.stats if self.party is not None else None
        return pb.JobStatusReply(job_id=self.job_id, state=self.state, error=self.error,
                                 wall_s=self.wall_s or (time.monotonic() - self.started),
                                 bytes_sent=st.bytes_sent if st else 0,
                                 messages=st.messages if st else 0,
                                 rounds=st.rounds if st else 0)


@dataclass
class Session:
    """State a party keeps between the jobs of one session (see the module docstring)."""

    session_id: str
    owner: str
    model_id: str
    upload_id: str
    state: object = None          # owned by the job kinds (e.g. protocols.jobs.DecodeSession)
    busy: bool = True             # a job of the session is running (true while opening)
    last_used: float = field(default_factory=time.monotonic)
    jobs: int = 0


class SessionStore:
    """Sessions of one party: at most :data:`MAX_SESSIONS`, dropped when idle too long."""

    def __init__(self, rank: int, idle_s: float = SESSION_IDLE_S) -> None:
        self.rank = rank
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._live: dict[str, Session] = {}
        self._gone: dict[str, str] = {}       # recently ended session -> why (clear errors)
        self._used: set[str] = set()

    def _bury_locked(self, sid: str, why: str) -> None:
        self._live.pop(sid, None)
        self._gone[sid] = why
        while len(self._gone) > 4 * MAX_SESSIONS:
            self._gone.pop(next(iter(self._gone)))

    def count(self) -> int:
        with self._lock:
            return len(self._live)

    def open(self, sid: str, owner: str, model_id: str, upload_id: str) -> Session:
        with self._lock:
            if sid in self._used:
                raise BadRequest(Code.ALREADY_EXISTS, f"session id {sid!r} already used")
            if len(self._live) >= MAX_SESSIONS:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank} already keeps "
                                 f"{MAX_SESSIONS} sessions; close some or retry later")
            self._used.add(sid)
            sess = Session(sid, owner, model_id, upload_id)
            self._live[sid] = sess
            return sess

    def acquire(self, sid: str, owner: str, model_id: str, upload_id: str,
                closing: bool = False) -> Session:
        """The caller's idle session, marked busy (or removed, when ``closing``)."""
        with self._lock:
            sess = self._live.get(sid)
            if sess is None:
                why = self._gone.get(sid)
                raise BadRequest(Code.NOT_FOUND, f"session {sid!r} " + (
                    f"has ended: {why}" if why else "is unknown on this party"))
            if sess.owner != owner:
                raise BadRequest(Code.PERMISSION_DENIED, f"session {sid!r} belongs to "
                                 "another user")
            if (sess.model_id, sess.upload_id) != (model_id, upload_id):
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} runs on model "
                                 f"{sess.model_id!r}, not {model_id!r}")
            if sess.busy and not closing:
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} still runs a "
                                 "job; wait for it before the next step")
            if closing:
                sess.state = None
                self._bury_locked(sid, "closed by its owner")
            else:
                sess.busy = True
                sess.jobs += 1
            return sess

    def release(self, sess: Session, ok: bool, why: str = "") -> None:
        with self._lock:
            if self._live.get(sess.session_id) is not sess:
                return
            if ok:
                sess.busy = False
                sess.last_used = time.monotonic()
            else:
                sess.state = None
                self._bury_locked(sess.session_id, f"dropped after a failed job ({why})")

    def expire(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            old = [sid for sid, s in self._live.items()
                   if not s.busy and now - s.last_used > self.idle_s]
            for sid in old:
                self._live[sid].state = None
                self._bury_locked(sid, f"idle for more than {self.idle_s:g} s")
        return old


class JobManager:
    def __init__(self, rank: int, router: PeerRouter, cfg: ClusterConfig,
                 sessions: SessionStore | None = None) -> None:
        self.rank = rank
        self.router = router
        self.cfg = cfg
        self.ring = RingConfig(frac=cfg.frac)
        self._lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.sessions = sessions or SessionStore(rank)

    def running(self) -> int:
        with self._lock:
            return sum(1 for j in self.jobs.values() if j.state == S.RUNNING)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def record_done(self, job: Job) -> Job:
        """A job that needs no computation (closing a session): done at once."""
        with self._lock:
            if job.job_id in self.jobs:
                raise BadRequest(Code.ALREADY_EXISTS, f"job id {job.job_id!r} already used")
            job.state, job.outputs, job.wall_s = S.DONE, {}, time.monotonic() - job.started
            job.done.set()
            self.jobs[job.job_id] = job
            self._trim_locked()
        return job

    def submit(self, job: Job, fn: JobFn, model: dict, inputs: dict, params: dict) -> Job:
        with self._lock:
            if job.job_id in self.jobs:
                raise BadRequest(Code.ALREADY_EXISTS, f"job id {job.job_id!r} already used")
            if sum(1 for j in self.jobs.values() if j.state == S.RUNNING) >= self.cfg.max_jobs:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank} already runs "
                                 f"{self.cfg.max_jobs} jobs; retry later")
            try:
                job.party = self.router.open_job(job.job_id, self.ring, self.cfg.peer_timeout_s)
            except PeerUnavailable as exc:
                raise BadRequest(Code.UNAVAILABLE, str(exc)) from None
            except ValueError as exc:
                raise BadRequest(Code.ALREADY_EXISTS, str(exc)) from None
            self.jobs[job.job_id] = job
            self._trim_locked()
        threading.Thread(target=self._run, args=(job, fn, model, inputs, params), daemon=True,
                         name=f"mpc3-job-{job.job_id}").start()
        return job

    def _run(self, job: Job, fn: JobFn, model, inputs, params) -> None:
        party = job.party
        watchdog = threading.Timer(self.cfg.job_timeout_s, party.comm.abort,
                                   args=(f"job deadline of {self.cfg.job_timeout_s:g} s "
                                         "exceeded",))
        watchdog.daemon = True
        watchdog.start()
        log.info("party %d: job %s (%s on %s) started", self.rank, job.job_id, job.kind,
                 job.model_id)
        try:
            out = fn(party, model, inputs, params)
            if not isinstance(out, dict) or not all(isinstance(v, AShare) for v in out.values()):
                raise TypeError(f"job kind {job.kind!r} must return dict[str, AShare]")
            job.outputs, job.state = out, S.DONE
        except Aborted as exc:
            job.state = S.CANCELLED if "cancelled" in str(exc) else S.FAILED
            job.error = str(exc)
            party.comm.abort(job.error)
        except Exception as exc:  # noqa: BLE001 - any failure ends the job, not the process
            job.state, job.error = S.FAILED, f"party {self.rank}: {type(exc).__name__}: {exc}"
            party.comm.abort(job.error)
        finally:
            watchdog.cancel()
            job.wall_s = time.monotonic() - job.started
            self.router.close_job(job.job_id)
            if job.session is not None:
                self.sessions.release(job.session, job.state == S.DONE, job.error)
            job.done.set()
        log.info("party %d: job %s %s in %.3f s%s", self.rank, job.job_id,
                 S.State.Name(job.state), job.wall_s, f" ({job.error})" if job.error else "")

    def cancel(self, job: Job) -> None:
        if job.state == S.RUNNING:
            job.party.comm.abort(f"cancelled by {job.owner}")

    def _trim_locked(self) -> None:
        done = [j for j in self.jobs.values() if j.state != S.RUNNING]
        for j in done[:max(0, len(done) - MAX_DONE_JOBS)]:
            del self.jobs[j.job_id]


# ----------------------------------------------------------------- client service ----
def _model_info(meta: dict, complete: bool = True) -> pb.ModelInfo:
    return pb.ModelInfo(model_id=meta["model_id"], upload_id=meta["upload_id"],
                        owner=meta["owner"], total_bytes=meta["total_bytes"],
                        public_meta=meta.get("public_meta", ""), complete=complete,
                        tensors=[pb.TensorInfo(name=t["name"], shape=t["shape"],
                                               frac=t.get("frac", meta.get("frac", 0)))
                                 for t in meta["tensors"]])


def _rpc(roles: tuple[str, ...]):
    """Decorator: authenticate the caller, check its role, map BadRequest to a status."""
    def wrap(method):
        def handler(self, request, context):
            ident = self.identity(context)
            if ident.role not in roles:
                context.abort(Code.PERMISSION_DENIED, f"role {ident.role!r} may not call "
                              f"{method.__name__} (allowed: {', '.join(roles)})")
            try:
                return method(self, request, context, ident)
            except BadRequest as exc:
                context.abort(exc.code, str(exc))
        handler.__name__ = method.__name__
        return handler
    return wrap


def _rpc_stream(roles: tuple[str, ...]):
    """Like :func:`_rpc` for server-streaming methods (generators)."""
    def wrap(method):
        def handler(self, request, context):
            ident = self.identity(context)
            if ident.role not in roles:
                context.abort(Code.PERMISSION_DENIED, f"role {ident.role!r} may not call "
                              f"{method.__name__}")
            try:
                yield from method(self, request, context, ident)
            except BadRequest as exc:
                context.abort(exc.code, str(exc))
        handler.__name__ = method.__name__
        return handler
    return wrap


ANY = keys.ROLES
OWNER = ("model-owner",)
USER = ("query-user",)


class ClientServicer(pb_grpc.ClientServiceServicer):
    def __init__(self, server: "PartyServer") -> None:
        self.srv = server
        self.cfg = server.cfg

    def identity(self, context) -> keys.Identity:
        if not self.cfg.tls:
            md = dict(context.invocation_metadata())
            return keys.Identity(md.get("x-mpc3-identity", "dev"),
                                 md.get("x-mpc3-role", "query-user"))
        ident = keys.peer_identity(context)
        if ident is None:
            context.abort(Code.UNAUTHENTICATED, "a client certificate is required")
        return ident

    # -------------------------------------------------------------------- models ----
    @_rpc(OWNER)
    def UploadModelShares(self, request_iterator, context, ident):
        store = self.srv.store
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise BadRequest(Code.INVALID_ARGUMENT, "empty upload")
        model_id = _check_id(first.model_id, "model id")
        upload_id = _check_id(first.upload_id, "upload id")
        if not 1 <= first.n_tensors <= MAX_TENSORS:
            raise BadRequest(Code.INVALID_ARGUMENT, f"n_tensors must be 1..{MAX_TENSORS}")
        if len(first.public_meta) > MAX_META:
            raise BadRequest(Code.INVALID_ARGUMENT, "public_meta too long")
        stage = store.begin(model_id)
        try:
            asm = TensorAssembler(self.cfg.frac, self.cfg.max_tensor_bytes)
            tensors, total = [], 0
            chunk = first
            while chunk is not None:
                if chunk.model_id != model_id or chunk.upload_id != upload_id:
                    raise BadRequest(Code.INVALID_ARGUMENT, "model_id/upload_id changed "
                                     "within one upload")
                done = asm.feed(chunk.tensor)
                if done is not None:
                    name, shape, payload, digest, frac = done
                    if len(tensors) >= first.n_tensors:
                        raise BadRequest(Code.INVALID_ARGUMENT, f"more than {first.n_tensors} "
                                         "tensors sent")
                    fname = store.write_tensor(stage, len(tensors), payload)
                    tensors.append({"name": name, "shape": list(shape), "sha256": digest,
                                    "frac": frac, "file": fname})
                    total += len(payload)
                chunk = next(it, None)
            asm.finish()
            if len(tensors) != first.n_tensors:
                raise BadRequest(Code.INVALID_ARGUMENT, f"upload truncated: {len(tensors)} of "
                                 f"{first.n_tensors} tensors received")
            meta = {"model_id": model_id, "upload_id": upload_id, "owner": ident.name,
                    "total_bytes": total, "public_meta": first.public_meta,
                    "tensors": tensors, "frac": self.cfg.frac, "created": time.time()}
            store.commit(model_id, stage, meta)
        except BaseException:
            store.abandon(model_id, stage)
            raise
        log.info("party %d: model %s stored (%d tensors, %d bytes) for %s", self.srv.rank,
                 model_id, len(tensors), total, ident.name)
        return pb.UploadReply(model=_model_info(meta))

    @_rpc(ANY)
    def ListModels(self, request, context, ident):
        metas, uploading = self.srv.store.list()
        models = [_model_info(m) for m in sorted(metas, key=lambda m: m["model_id"])]
        models += [pb.ModelInfo(model_id=m, complete=False) for m in uploading]
        return pb.ListModelsReply(models=models)

    @_rpc(OWNER)
    def DeleteModel(self, request, context, ident):
        info = self.srv.store.info(request.model_id)
        if info is None:
            raise BadRequest(Code.NOT_FOUND, f"unknown model {request.model_id!r}")
        if info["owner"] != ident.name:
            raise BadRequest(Code.PERMISSION_DENIED, f"model {request.model_id!r} belongs to "
                             "another owner")
        self.srv.store.delete(request.model_id)
        log.info("party %d: model %s deleted by %s", self.srv.rank, request.model_id,
                 ident.name)
        return pb.Empty()

    # ---------------------------------------------------------------------- jobs ----
    @_rpc(USER)
    def SubmitJob(self, request_iterator, context, ident):
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise BadRequest(Code.INVALID_ARGUMENT, "empty submission")
        job_id = _check_id(first.job_id, "job id")
        if first.kind not in JOB_KINDS:
            raise BadRequest(Code.NOT_FOUND, f"unknown job kind {first.kind!r} (known: "
                             f"{', '.join(sorted(JOB_KINDS))})")
        store = self.srv.store
        if store.is_uploading(first.model_id):
            raise BadRequest(Code.FAILED_PRECONDITION, f"model {first.model_id!r} is still "
                             "being uploaded")
        try:
            meta, model = store.get(first.model_id)
        except KeyError:
            raise BadRequest(Code.NOT_FOUND, f"unknown model {first.model_id!r}") from None
        except (OSError, ValueError) as exc:
            raise BadRequest(Code.DATA_LOSS, f"model {first.model_id!r}: {exc}") from None
        if first.upload_id != meta["upload_id"]:
            raise BadRequest(Code.FAILED_PRECONDITION, f"model {first.model_id!r} here is "
                             "upload " + meta["upload_id"] + f", not {first.upload_id!r}: "
                             "the parties hold different uploads")
        if self.srv.jobs.get(job_id) is not None:
            raise BadRequest(Code.ALREADY_EXISTS, f"job id {job_id!r} already used")
        try:
            params = json.loads(first.params_json or "{}")
        except ValueError as exc:
            raise BadRequest(Code.INVALID_ARGUMENT, f"params_json: {exc}") from None
        if not isinstance(params, dict):
            raise BadRequest(Code.INVALID_ARGUMENT, "params_json must be a JSON object")
        reserved = sorted(k for k in params if k.startswith("_"))
        if reserved:
            raise BadRequest(Code.INVALID_ARGUMENT, f"reserved job parameters {reserved}")
        mode = JOB_SESSION.get(first.kind)
        min_tensors = 0 if mode == "close" else 1
        if not min_tensors <= first.n_tensors <= MAX_TENSORS:
            raise BadRequest(Code.INVALID_ARGUMENT,
                             f"n_tensors must be {min_tensors}..{MAX_TENSORS}")
        sid = None
        if mode is not None:
            sid = _check_id(str(params.get("session", "")), "session id")
        asm = TensorAssembler(self.cfg.frac, self.cfg.max_tensor_bytes)
        inputs: dict[str, AShare] = {}
        chunk = first
        while chunk is not None:
            if chunk.job_id != job_id:
                raise BadRequest(Code.INVALID_ARGUMENT, "job_id changed within one submission")
            if not chunk.HasField("tensor"):
                chunk = next(it, None)
                continue
            done = asm.feed(chunk.tensor)
            if done is not None:
                name, shape, payload, _, _ = done
                inputs[name] = share_from_payload(payload, shape)
            chunk = next(it, None)
        asm.finish()
        if len(inputs) != first.n_tensors:
            raise BadRequest(Code.INVALID_ARGUMENT, f"submission truncated: {len(inputs)} of "
                             f"{first.n_tensors} input tensors received")
        params["model_meta"] = json.loads(meta["public_meta"]) if meta.get("public_meta") else {}
        params["model_frac"] = {t["name"]: t.get("frac", self.cfg.frac) for t in meta["tensors"]}
        validate = JOB_VALIDATORS.get(first.kind)
        if validate is not None:
            try:
                validate({k: v.shape for k, v in model.items()},
                         {k: v.shape for k, v in inputs.items()}, params)
            except (ValueError, KeyError, TypeError) as exc:
                raise BadRequest(Code.INVALID_ARGUMENT, f"{first.kind}: {exc}") from None
        job = Job(job_id=job_id, owner=ident.name, kind=first.kind, model_id=first.model_id)
        params["_costs"] = job.costs
        sessions = self.srv.jobs.sessions
        if mode == "close":
            sessions.acquire(sid, ident.name, first.model_id, meta["upload_id"], closing=True)
            return self.srv.jobs.record_done(job).reply()
        if mode == "open":
            job.session = sessions.open(sid, ident.name, first.model_id, meta["upload_id"])
        elif mode == "step":
            job.session = sessions.acquire(sid, ident.name, first.model_id, meta["upload_id"])
        params["_session"] = job.session
        try:
            self.srv.jobs.submit(job, JOB_KINDS[first.kind], model, inputs, params)
        except BadRequest as exc:
            if job.session is not None:
                sessions.release(job.session, mode == "step", str(exc))
            raise
        return job.reply()

    def _own_job(self, job_id: str, ident) -> Job:
        job = self.srv.jobs.get(job_id)
        if job is None:
            raise BadRequest(Code.NOT_FOUND, f"unknown job {job_id!r}")
        if job.owner != ident.name:
            raise BadRequest(Code.PERMISSION_DENIED, f"job {job_id!r} belongs to another user")
        return job

    @_rpc(USER)
    def JobStatus(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        wait = dict(context.invocation_metadata()).get("x-mpc3-wait-s")
        if wait and job.state == S.RUNNING:
            try:
                job.done.wait(min(max(float(wait), 0.0), MAX_WAIT_S))
            except ValueError:
                raise BadRequest(Code.INVALID_ARGUMENT, f"x-mpc3-wait-s {wait!r} is not a "
                                 "number") from None
        reply = job.reply()
        if job.costs and job.done.is_set():
            context.set_trailing_metadata((("x-mpc3-costs", json.dumps(job.costs)),))
        return reply

    @_rpc(USER)
    def CancelJob(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        self.srv.jobs.cancel(job)
        job.done.wait(5.0)
        return job.reply()

    @_rpc_stream(USER)
    def FetchOutput(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        if job.state != S.DONE:
            raise BadRequest(Code.FAILED_PRECONDITION, f"job {job.job_id!r} is "
                             f"{S.State.Name(job.state)}" + (f": {job.error}" if job.error
                                                            else ""))
        for name, share in job.outputs.items():
            yield from tensor_chunks(name, share, self.cfg.frac)

    @_rpc(ANY)
    def Status(self, request, context, ident):
        metas, _ = self.srv.store.list()
        return pb.StatusReply(rank=self.srv.rank, links_up=self.srv.router.links_up(),
                              jobs_running=self.srv.jobs.running(), models=len(metas),
                              tls=self.cfg.tls, version=VERSION)


# -------------------------------------------------------------------------- process ----
class PartyServer:
    """One party: gRPC server + peer router + store + jobs. ``start()`` then ``wait()``."""

    def __init__(self, cfg: ClusterConfig, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.pcfg = cfg.party(rank)
        load_job_kinds(cfg.job_modules)
        self.store = ModelStore(self.pcfg.data_dir)
        creds = None
        if cfg.tls:
            creds = keys.channel_credentials(self.pcfg.cert, self.pcfg.key, cfg.ca)
        self.router = PeerRouter(rank, cfg.dial_address(rank, (rank + 1) % 3), creds,
                                 tls=cfg.tls)
        self.sessions = SessionStore(rank)
        self.jobs = JobManager(rank, self.router, cfg, self.sessions)
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=16 + 4 * cfg.max_jobs),
                                options=SERVER_OPTIONS)
        pb_grpc.add_PeerServiceServicer_to_server(self.router.servicer, self.grpc)
        pb_grpc.add_ClientServiceServicer_to_server(ClientServicer(self), self.grpc)
        self.health = None
        try:
            from grpc_health.v1 import health, health_pb2_grpc
            self.health = health.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        except ImportError:
            log.warning("grpcio-health-checking not installed: no grpc.health.v1 service")
        if cfg.tls:
            bound = self.grpc.add_secure_port(self.pcfg.listen, keys.server_credentials(
                self.pcfg.cert, self.pcfg.key, cfg.ca))
        else:
            bound = self.grpc.add_insecure_port(self.pcfg.listen)
        if not bound:
            raise RuntimeError(f"party {rank}: cannot listen on {self.pcfg.listen}")
        self._stopped = threading.Event()

    def start(self) -> None:
        self.grpc.start()
        self.router.start()
        threading.Thread(target=self._health_loop, daemon=True, name="mpc3-health").start()
        threading.Thread(target=self._session_loop, daemon=True, name="mpc3-sessions").start()
        log.info("party %d listening on %s (%s)", self.rank, self.pcfg.listen,
                 "mTLS" if self.cfg.tls else "INSECURE PLAINTEXT")

    def _health_loop(self) -> None:
        if self.health is None:
            return
        from grpc_health.v1 import health_pb2
        last = None
        while not self._stopped.is_set():
            ok = len(self.router.links_up()) == 2
            if ok != last:
                status = (health_pb2.HealthCheckResponse.SERVING if ok
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
                for svc in ("", "mpc3.ClientService"):
                    self.health.set(svc, status)
                last = ok
            self._stopped.wait(0.2)

    def _session_loop(self) -> None:
        while not self._stopped.wait(min(5.0, max(0.1, self.sessions.idle_s / 4))):
            for sid in self.sessions.expire():
                log.info("party %d: session %s expired (idle)", self.rank, sid)

    def stop(self, grace: float = 1.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.router.stop()
        self.grpc.stop(grace).wait()

    def wait(self) -> None:
        self._stopped.wait()


def serve(cfg: ClusterConfig, rank: int) -> int:
    """Run party ``rank`` until SIGTERM/SIGINT."""
    srv = PartyServer(cfg, rank)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=srv.stop).start())
    srv.start()
    srv.wait()
    return 0


__all__ = ["JOB_KINDS", "JOB_SESSION", "SessionStore", "register_job_kind", "PartyServer", "serve", "ModelStore",
           "TensorAssembler", "tensor_chunks", "share_payload", "share_from_payload",
           "load_job_kinds"]
