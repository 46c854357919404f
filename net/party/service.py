"""``mpc3.ClientService``: what model owners and query users may ask of one party.

Authorization comes from the verified client certificate (:mod:`net.keys`): OU
``model-owner`` may upload, delete (its own) and verify models; OU ``query-user`` may verify
models, submit jobs of the kinds this party runs (and the model's owner permitted) and see,
fetch or cancel only its own jobs. Every streaming call holds one of the user's
``user_streams`` and is cancelled when silent for ``stream_idle_s``; input bytes are charged to
the user as they arrive (:mod:`net.limits`). Every unary call that waits - a JobStatus
long-poll, VerifyModel (it waits for the peers; query users call it too, because a client
verifies a model no party has verified since it was loaded), CancelJob (it waits for the
job) - holds one of the user's ``user_blocking_calls``, refused at once beyond it (issue 33:
120 long-polls of one user took a party's threads and another user's Status took 27 s). Refusals
carry a gRPC status and one line naming the party, the object or limit concerned and the next step.
Nothing secret is logged.

Costs. JobStatus replies carry the job's traffic counters and, once the job is done, its
public per-layer costs as JSON in the trailing metadata ``x-mpc3-costs``. A JobStatus request
with metadata ``x-mpc3-wait-s`` waits up to that long (at most 30 s) for the job to end.
"""
from __future__ import annotations

import errno
import json
import logging
import re
import threading
import time
from contextlib import contextmanager

from net import keys
from net.codec import TensorAssembler, share_from_payload, tensor_chunks
from net.errors import BadRequest, Code, check_id
from net.proto import mpc3_pb2 as pb
from net.proto import mpc3_pb2_grpc as pb_grpc
from protocols.jobs import ModelView, model_problem, output_fracs

from .runner import Job
from .store import CORRUPT, StoredModel

log = logging.getLogger("mpc3.service")

VERSION = "mpc3-net/4"
MAX_TENSORS = 10_000
MAX_META = 1 << 16
MAX_WAIT_S = 30.0
MAX_PARAMS = 1 << 16          # characters of a job's params_json
MAX_JSON_DEPTH = 32           # nesting of params_json and public_meta
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
S = pb.JobStatusReply

ANY = keys.ROLES
OWNER = ("model-owner",)
USER = ("query-user",)


class StreamReaper:
    """Cancels streaming calls that stay silent for ``idle_s`` (a stalled client must not
    hold a server thread)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._live: dict[int, list] = {}
        self._next = 0
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="mpc3-reaper").start()

    @contextmanager
    def watch(self, context):
        with self._lock:
            key = self._next
            self._next += 1
            self._live[key] = [time.monotonic(), context]
        try:
            yield lambda: self._touch(key)
        finally:
            with self._lock:
                self._live.pop(key, None)

    def _touch(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is not None:
            entry[0] = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_s / 4)):
            now = time.monotonic()
            with self._lock:
                stale = [c for t, c in self._live.values() if now - t > self.idle_s]
            for context in stale:
                log.warning("cancelling a stream silent for more than %g s", self.idle_s)
                context.cancel()

    def stop(self) -> None:
        self._stop.set()


def _watched(iterator, touch):
    for item in iterator:
        touch()
        yield item


def bound_json(text: str, what: str, limit: int) -> None:
    """Refuse (INVALID_ARGUMENT, one line) JSON text beyond ``limit`` characters or
    MAX_JSON_DEPTH levels of nesting, counted without parsing it (a params_json nested 50,000
    deep answered UNKNOWN: maximum recursion depth exceeded)."""
    if len(text) > limit:
        raise BadRequest(Code.INVALID_ARGUMENT, f"{what} is {len(text)} characters long "
                         f"(at most {limit})")
    depth = deepest = 0
    for ch in _JSON_STRING.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > MAX_JSON_DEPTH:
        raise BadRequest(Code.INVALID_ARGUMENT, f"{what} is nested {deepest} levels deep "
                         f"(at most {MAX_JSON_DEPTH})")


def json_value(text: str, what: str, limit: int):
    """``text`` parsed as JSON once :func:`bound_json` let it through."""
    bound_json(text, what, limit)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadRequest(Code.INVALID_ARGUMENT, f"{what}: {exc}") from None


def _rpc(roles: tuple[str, ...], stream: bool = False, blocking: bool = False):
    """Decorator: authenticate, check the role, map BadRequest to a status; streaming
    calls (``stream=True``) also hold one of the user's streams and the idle watch,
    ``blocking`` unary calls one of the user's blocking calls."""
    def wrap(method):
        def unary(self, request, context):
            ident = self.authorize(context, roles, method.__name__)
            try:
                if not blocking:
                    return method(self, request, context, ident)
                with self.srv.quotas.blocking_call(ident.name, ident.org):
                    return method(self, request, context, ident)
            except BadRequest as exc:
                context.abort(exc.code, str(exc))

        def streaming(self, request, context):
            ident = self.authorize(context, roles, method.__name__)
            try:
                with self.srv.quotas.stream(ident.name, ident.org), \
                        self.reaper.watch(context) as touch:
                    if stream == "in":       # touch on every request message received
                        yield from method(self, _watched(request, touch), context, ident)
                    else:                    # touch on every response message sent
                        for item in method(self, request, context, ident):
                            touch()
                            yield item
            except BadRequest as exc:
                context.abort(exc.code, str(exc))

        def client_streaming(self, request, context):
            gen = streaming(self, request, context)
            try:
                return next(gen)
            finally:
                gen.close()

        fn = unary if not stream else (streaming if stream == "out" else client_streaming)
        fn.__name__ = method.__name__
        return fn
    return wrap


def _model_info(rec: StoredModel, complete: bool = True) -> pb.ModelInfo:
    """The model as clients see it; ``problem``: why it is corrupt, else why its jobs are
    refused (its calibration, once checked)."""
    meta = rec.meta
    return pb.ModelInfo(model_id=meta["model_id"], upload_id=meta.get("upload_id", ""),
                        owner=meta.get("owner", ""), total_bytes=meta.get("total_bytes", 0),
                        public_meta=meta.get("public_meta", ""), complete=complete,
                        state=rec.state, problem=rec.problem or rec.refusal or "",
                        tensors=[pb.TensorInfo(name=t["name"], shape=t["shape"],
                                               frac=t.get("frac", meta.get("frac", 0)))
                                 for t in meta.get("tensors", [])])


def _disk_error(rank: int, model_id: str, exc: OSError) -> BadRequest:
    """A failed write of an upload in one line, without the server's paths."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return BadRequest(Code.RESOURCE_EXHAUSTED, f"party {rank}: the disk of its data_dir "
                          f"is full ({exc.strerror}); model {model_id!r} was not stored and "
                          "nothing of it was kept - its operator must free space there "
                          "before the model is shared again")
    return BadRequest(Code.UNAVAILABLE, f"party {rank}: could not store model {model_id!r} "
                      f"({exc.strerror or type(exc).__name__}); nothing of it was kept - "
                      "retry, or ask its operator to check the party's data_dir")


class ClientServicer(pb_grpc.ClientServiceServicer):
    def __init__(self, server) -> None:
        self.srv = server
        self.cfg = server.cfg
        self.reaper = StreamReaper(server.limits.stream_idle_s)

    def authorize(self, context, roles, method: str) -> keys.Identity:
        if not self.cfg.tls:
            md = dict(context.invocation_metadata())
            ident = keys.Identity(md.get("x-mpc3-identity", "dev"),
                                  md.get("x-mpc3-role", "query-user"), md.get("x-mpc3-org", ""))
        else:
            ident = keys.peer_identity(context)
            if ident is None:
                context.abort(Code.UNAUTHENTICATED, "a client certificate is required")
        if ident.role not in roles:
            context.abort(Code.PERMISSION_DENIED, f"role {ident.role!r} may not call "
                          f"{method} (allowed: {', '.join(roles)})")
        return ident

    # -------------------------------------------------------------------- models ----
    def _upload(self, request_iterator, context, ident):
        store, rank = self.srv.store, self.srv.rank
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise BadRequest(Code.INVALID_ARGUMENT, "empty upload")
        model_id = check_id(first.model_id, "model id")
        upload_id = check_id(first.upload_id, "upload id")
        if not 1 <= first.n_tensors <= MAX_TENSORS:
            raise BadRequest(Code.INVALID_ARGUMENT, f"n_tensors must be 1..{MAX_TENSORS}")
        bound_json(first.public_meta, "public_meta", MAX_META)
        refusal = model_problem(model_id, first.public_meta, self.srv.registry, self.srv.ring)
        if refusal:                       # a transformer without a valid calibration
            log.warning("party %d: upload of model %s refused: %s", rank, model_id, refusal)
            raise BadRequest(Code.INVALID_ARGUMENT, f"party {rank}: {refusal}")
        limit = self.srv.limits.owner_model_bytes
        held = [store.owner_bytes(ident.name)]

        def budget(n: int) -> None:
            held[0] += n
            if held[0] > limit:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {rank}: owner "
                                 f"{ident.name!r} would store {held[0]} bytes of model "
                                 f"shares (limit owner_model_bytes = {limit} in [limits]); "
                                 "delete models it no longer needs")

        try:
            stage = store.begin(model_id)
        except OSError as exc:
            raise _disk_error(rank, model_id, exc) from None
        try:
            asm = TensorAssembler(self.cfg.frac, self.srv.limits.tensor_bytes, budget)
            tensors, shares, total = [], {}, 0
            chunk = first
            while chunk is not None:
                if chunk.model_id != model_id or chunk.upload_id != upload_id:
                    raise BadRequest(Code.INVALID_ARGUMENT, "model_id/upload_id changed "
                                     "within one upload")
                done = asm.feed(chunk.tensor)
                if done is not None:
                    name, shape, payload, digest, frac = done
                    if len(tensors) >= first.n_tensors:
                        raise BadRequest(Code.INVALID_ARGUMENT, f"more than "
                                         f"{first.n_tensors} tensors sent")
                    fname = store.write_tensor(stage, len(tensors), payload)
                    tensors.append({"name": name, "shape": list(shape), "sha256": digest,
                                    "frac": frac, "file": fname})
                    shares[name] = share_from_payload(payload, shape)
                    total += len(payload)
                chunk = next(it, None)
            asm.finish()
            if len(tensors) != first.n_tensors:
                raise BadRequest(Code.INVALID_ARGUMENT, f"upload truncated: {len(tensors)} "
                                 f"of {first.n_tensors} tensors received")
            meta = {"model_id": model_id, "upload_id": upload_id, "owner": ident.name,
                    "total_bytes": total, "public_meta": first.public_meta,
                    "tensors": tensors, "frac": self.cfg.frac, "created": time.time()}
            rec = store.commit(model_id, stage, meta, shares)
            rec.refusal = ""              # its metadata was checked above
        except OSError as exc:            # nothing of the upload is kept
            store.abandon(model_id, stage)
            raise _disk_error(rank, model_id, exc) from None
        except BaseException:
            store.abandon(model_id, stage)
            raise
        log.info("party %d: model %s stored (%d tensors, %d bytes) for %s", rank, model_id,
                 len(tensors), total, ident.name,
                 extra={"event": "model_stored", "user": ident.name})
        yield pb.UploadReply(model=_model_info(rec))

    UploadModelShares = _rpc(OWNER, stream="in")(_upload)

    def _refusal(self, rec: StoredModel) -> str:
        """Why the stored model's jobs are refused ('' if they are not): its public metadata
        checked once per upload (:func:`protocols.jobs.model_problem`) - a model stored
        before the check, or whose metadata was edited on disk, is refused here."""
        if rec.refusal is None:
            rec.refusal = model_problem(rec.meta["model_id"], rec.meta.get("public_meta", ""),
                                        self.srv.registry, self.srv.ring)
            if rec.refusal:
                log.warning("party %d: %s", self.srv.rank, rec.refusal)
        return rec.refusal

    @_rpc(ANY)
    def ListModels(self, request, context, ident):
        recs, uploading = self.srv.store.list()
        for r in recs:
            self._refusal(r)
        models = [_model_info(r) for r in sorted(recs, key=lambda r: r.meta["model_id"])]
        models += [pb.ModelInfo(model_id=m, complete=False) for m in uploading]
        return pb.ListModelsReply(models=models)

    @_rpc(OWNER)
    def DeleteModel(self, request, context, ident):
        rank = self.srv.rank
        rec = self.srv.store.info(request.model_id)
        if rec is None:
            raise BadRequest(Code.NOT_FOUND, f"unknown model {request.model_id!r} on party "
                             f"{rank}")
        owner = rec.meta.get("owner", "")
        if owner and owner != ident.name:
            raise BadRequest(Code.PERMISSION_DENIED, f"model {request.model_id!r} belongs to "
                             "another owner")
        self.srv.store.delete(request.model_id)
        log.info("party %d: model %s deleted by %s", rank, request.model_id, ident.name,
                 extra={"event": "model_deleted", "user": ident.name})
        return pb.Empty()

    @_rpc(ANY, blocking=True)
    def VerifyModel(self, request, context, ident):
        model_id = check_id(request.model_id, "model id")
        verify_id = check_id(request.verify_id, "verify id")
        state, problem = self.srv.verify_model(model_id, verify_id)
        return pb.VerifyReply(model_id=model_id, state=state, problem=problem)

    # ---------------------------------------------------------------------- jobs ----
    def _submit(self, request_iterator, context, ident):
        srv = self.srv
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise BadRequest(Code.INVALID_ARGUMENT, "empty submission")
        job_id = check_id(first.job_id, "job id")
        rec = srv.store.get(first.model_id)
        if first.upload_id != rec.meta["upload_id"]:
            raise BadRequest(Code.FAILED_PRECONDITION, f"model {first.model_id!r} on party "
                             f"{srv.rank} is upload {rec.meta['upload_id']}, not "
                             f"{first.upload_id!r}: the parties hold different uploads")
        refusal = self._refusal(rec)
        if refusal:
            raise BadRequest(Code.FAILED_PRECONDITION, f"party {srv.rank}: {refusal}")
        if srv.runner.get(job_id) is not None:
            raise BadRequest(Code.ALREADY_EXISTS, f"job id {job_id!r} already used")
        params = json_value(first.params_json or "{}", f"party {srv.rank}: params_json",
                            MAX_PARAMS)
        if not isinstance(params, dict):
            raise BadRequest(Code.INVALID_ARGUMENT, "params_json must be a JSON object")
        spec = srv.registry.get(first.kind)
        session_role = spec.session if spec is not None else None
        min_tensors = 0 if session_role == "close" else 1
        if not min_tensors <= first.n_tensors <= MAX_TENSORS:
            raise BadRequest(Code.INVALID_ARGUMENT,
                             f"n_tensors must be {min_tensors}..{MAX_TENSORS}")
        held = [0]

        def budget(n: int) -> None:
            srv.quotas.charge(ident.name, n)
            held[0] += n

        inputs = {}
        try:
            asm = TensorAssembler(self.cfg.frac, srv.limits.tensor_bytes, budget)
            chunk = first
            while chunk is not None:
                if chunk.job_id != job_id:
                    raise BadRequest(Code.INVALID_ARGUMENT, "job_id changed within one "
                                     "submission")
                if chunk.HasField("tensor"):
                    done = asm.feed(chunk.tensor)
                    if done is not None:
                        name, shape, payload, _, _ = done
                        inputs[name] = share_from_payload(payload, shape)
                chunk = next(it, None)
            asm.finish()
            if len(inputs) != first.n_tensors:
                raise BadRequest(Code.INVALID_ARGUMENT, f"submission truncated: {len(inputs)} "
                                 f"of {first.n_tensors} input tensors received")
            reply = self._admit(first, job_id, rec, params, inputs, ident, held[0])
        except BaseException:
            srv.quotas.release(ident.name, held[0])
            raise
        yield reply

    def _admit(self, first, job_id, rec: StoredModel, params, inputs, ident, nbytes):
        meta = rec.meta
        public = json.loads(meta["public_meta"]) if meta.get("public_meta") else {}
        model = ModelView(first.model_id, rec.shares, public,
                          {t["name"]: t.get("frac", self.cfg.frac) for t in meta["tensors"]})
        job = self.srv.runner.accept(first.kind, job_id, ident.name, model, meta["upload_id"],
                                     params, inputs, nbytes, ident.org)
        return job.reply()

    SubmitJob = _rpc(USER, stream="in")(_submit)

    def _own_job(self, job_id: str, ident) -> Job:
        job = self.srv.runner.get(job_id)
        if job is None:
            raise BadRequest(Code.NOT_FOUND, f"unknown job {job_id!r} on party "
                             f"{self.srv.rank}")
        if job.owner != ident.name:
            raise BadRequest(Code.PERMISSION_DENIED, f"job {job_id!r} belongs to another user")
        return job

    @_rpc(USER)
    def JobStatus(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        wait = dict(context.invocation_metadata()).get("x-mpc3-wait-s")
        if wait and not job.done.is_set():
            try:
                wait_s = min(max(float(wait), 0.0), MAX_WAIT_S)
            except ValueError:
                raise BadRequest(Code.INVALID_ARGUMENT, f"x-mpc3-wait-s {wait!r} is not a "
                                 "number") from None
            with self.srv.quotas.blocking_call(ident.name, ident.org):
                job.done.wait(wait_s)
        reply = job.reply()
        if job.costs and job.done.is_set():
            context.set_trailing_metadata((("x-mpc3-costs", json.dumps(job.costs)),))
        return reply

    @_rpc(USER, blocking=True)
    def CancelJob(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        self.srv.runner.cancel(job, f"cancelled by {job.owner}")
        job.done.wait(5.0)
        return job.reply()

    def _fetch(self, request, context, ident):
        job = self._own_job(request.job_id, ident)
        if job.state != S.DONE:
            raise BadRequest(Code.FAILED_PRECONDITION, f"job {job.job_id!r} is "
                             f"{S.State.Name(job.state)} on party {self.srv.rank}" +
                             (f": {job.error}" if job.error else ""))
        fracs = output_fracs(job.spec, self.cfg.frac)
        for name, share in job.outputs.items():
            yield from tensor_chunks(name, share, fracs[name])

    FetchOutput = _rpc(USER, stream="out")(_fetch)

    @_rpc(ANY)
    def Status(self, request, context, ident):
        recs, _ = self.srv.store.list()
        running, queued = self.srv.runner.counts()
        return pb.StatusReply(rank=self.srv.rank, links_up=self.srv.router.links_up(),
                              jobs_running=running, jobs_queued=queued,
                              models=sum(1 for r in recs if r.state != CORRUPT),
                              tls=self.cfg.tls, version=VERSION,
                              diagnostic=self.srv.registry.diagnostic,
                              job_kinds=self.srv.registry.names(),
                              security=self.cfg.security,
                              security_problem=self.srv.router.security_problem(),
                              **_doctor_fields(self.srv))


def _doctor_fields(srv) -> dict:
    """What ``mpc3 doctor`` checks beyond the above: the party's clock, its kernels
    (compiled before serving, net.party.server.serve) and its limits - all public."""
    import dataclasses
    compiled, took = srv.kernels or (0, 0.0)
    return dict(party_time=time.time(), kernels_ready=srv.kernels is not None,
                kernels_compiled=compiled, kernels_compile_s=took,
                limits_json=json.dumps(dataclasses.asdict(srv.limits), sort_keys=True),
                uptime_s=time.time() - srv.metrics.started)
