"""Clients of a cluster: :class:`ModelOwner` (uploads shared weights) and :class:`QueryUser`.

ModelOwner encodes float weights in fixed point (:func:`mpc3.ring.encode`), splits each into
replicated shares with ``os.urandom`` randomness (:func:`mpc3.sharing.deal`) and streams party
``i`` its pair ``(x_i, x_{i+1})`` in chunks of at most 1 MiB, each tensor with a SHA-256.
All three uploads carry the same random ``upload_id``; if any party refuses, the owner
deletes the model from the others, so the cluster never holds a partial model.

QueryUser checks that the three parties hold the same upload of the model (same upload id,
tensor names and shapes), shares its inputs the same way, submits the job to the three
parties under one fresh job id, waits, fetches the three output pairs and reconstructs.
Every element of a replicated sharing is held twice (slot ``j`` by parties ``j`` and
``j-1``); reconstruction checks that the two copies agree and raises
:class:`TamperingDetected` otherwise - copies are never averaged or trusted one-sided.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Callable, Mapping

import grpc
import numpy as np

from mpc3 import ring
from mpc3.shares import AShare
from mpc3.sharing import deal

from . import keys
from .codec import TensorAssembler, share_from_payload, tensor_chunks
from .config import ClusterConfig
from .failures import (
    _BLAME,
    RETRY_WINDOWS,
    ClusterError,
    InconsistentModel,
    JobFailed,
    TamperingDetected,
    diagnose_tls,
    rpc_error,
)
from .link import GRPC_OPTIONS
from .outputs import reconstruct, same_scales  # noqa: F401 - reconstruct: callers' import
from .proto import mpc3_pb2 as pb
from .proto import mpc3_pb2_grpc as pb_grpc

S = pb.JobStatusReply


class _Client:
    role = ""

    def __init__(self, cfg: ClusterConfig, cert=None, key=None, rpc_timeout: float = 60.0,
                 dev_identity: str = "dev") -> None:
        self.cfg = cfg
        self.frac = cfg.frac
        self.timeout = rpc_timeout
        self.metadata: tuple = ()
        self._tls_files = None
        if cfg.tls:
            creds_cfg = cfg.clients.get(self.role)
            where = keys.cred_sources(self.role, cfg.path, cert, key)
            cert = cert or (creds_cfg.cert if creds_cfg else None)
            key = key or (creds_cfg.key if creds_cfg else None)
            if cert is None or key is None:
                raise ValueError(f"no client certificate for role {self.role!r}: pass "
                                 f"--cert/--key or add [clients.{self.role}] to the config")
            creds = keys.channel_credentials(cert, key, cfg.ca, where)
            self._tls_files = (cert, key, cfg.ca)
        else:
            self.metadata = (("x-mpc3-identity", dev_identity), ("x-mpc3-role", self.role))
        self.channels, self.stubs = [], []
        for n in range(3):
            addr = cfg.dial_address(None, n)
            if cfg.tls:
                opts = GRPC_OPTIONS + [("grpc.ssl_target_name_override",
                                        keys.party_target_name(n))]
                ch = grpc.secure_channel(addr, creds, options=opts)
            else:
                ch = grpc.insecure_channel(addr, options=GRPC_OPTIONS)
            self.channels.append(ch)
            self.stubs.append(pb_grpc.ClientServiceStub(ch))

    def close(self) -> None:
        for ch in self.channels:
            ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, n: int, method: str, request, timeout: float | None = None):
        try:
            return getattr(self.stubs[n], method)(request, metadata=self.metadata,
                                                  timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise self._error(n, exc) from None

    def _error(self, n: int, exc: grpc.RpcError) -> "ClusterError":
        """rpc_error, with the TLS handshake diagnosed when a party is unavailable."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and self._tls_files is not None:
            why = diagnose_tls(self.cfg.dial_address(None, n), *self._tls_files,
                               keys.party_target_name(n))
            if why:
                return ClusterError(n, exc.code(), why)
        return rpc_error(n, exc)

    def _settled(self, fn: Callable[[int], object]) -> list[tuple[object, BaseException | None]]:
        """Run ``fn(party)`` for the three parties concurrently; (result, error) of each."""
        out: list = [(None, None)] * 3

        def body(n: int) -> None:
            try:
                out[n] = (fn(n), None)
            except BaseException as exc:  # noqa: BLE001 - returned to the caller
                out[n] = (None, exc)

        threads = [threading.Thread(target=body, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def _each(self, fn: Callable[[int], object]) -> list:
        """Run ``fn(party)`` for the three parties concurrently; raise the first error."""
        settled = self._settled(fn)
        errors = [e for _, e in settled]
        for e in errors:
            if e is not None:
                e.party_errors = errors      # which parties failed, for the caller's cleanup
                raise e
        return [r for r, _ in settled]

    def list_models(self) -> list[list[pb.ModelInfo]]:
        return self._each(lambda n: list(self._call(n, "ListModels",
                                                    pb.ListModelsRequest()).models))

    def status(self) -> list[pb.StatusReply]:
        return self._each(lambda n: self._call(n, "Status", pb.Empty(), timeout=5))

    def verify(self, model_id: str) -> list[pb.VerifyReply]:
        """Compare every replicated share slot of the model between the parties holding it
        (the parties exchange digests); raises :class:`InconsistentModel` on a mismatch."""
        vid = os.urandom(8).hex()
        timeout = self.cfg.peer_timeout_s + 10
        replies = self._each(lambda n: self._call(n, "VerifyModel", pb.VerifyRequest(
            model_id=model_id, verify_id=vid), timeout=timeout))
        bad = [(n, r) for n, r in enumerate(replies) if r.state != "verified"]
        if bad:
            raise InconsistentModel(None, grpc.StatusCode.DATA_LOSS, f"model {model_id!r} "
                                    "failed verification: " + "; ".join(
                                        f"party {n}: {r.problem}" for n, r in bad) +
                                    f"; its owner must delete it ('mpc3 models --delete "
                                    f"{model_id}') and share it again")
        return replies

    def _share(self, tensors: Mapping[str, np.ndarray], encoded: bool,
               extra_frac: Mapping[str, int] | None = None) -> list[dict]:
        per_party: list[dict] = [{}, {}, {}]
        for name, value in tensors.items():
            frac = self.frac + (extra_frac or {}).get(name, 0)
            x = ring.check_ring(np.asarray(value), name) if encoded else ring.encode(
                value, frac)
            for n, s in enumerate(deal(x)):
                per_party[n][name] = s
        return per_party


class ModelOwner(_Client):
    role = "model-owner"

    def upload(self, model_id: str, weights: Mapping[str, np.ndarray],
               public_meta: Mapping | None = None, encoded: bool = False,
               extra_frac: Mapping[str, int] | None = None) -> str:
        """Share and upload ``weights`` (floats, or ring arrays if ``encoded``), then verify
        that the parties hold consistent copies.

        ``extra_frac``: tensors encoded with more fractional bits than the cluster's frac
        (name -> extra bits); recorded per tensor by the parties.

        Returns the upload id. On any refusal the model is deleted from the parties that
        accepted it and :class:`ClusterError` is raised.
        """
        if not weights:
            raise ValueError("no tensors to upload")
        upload_id = os.urandom(8).hex()
        shares = self._share(weights, encoded, extra_frac)
        fracs = {k: self.frac + (extra_frac or {}).get(k, 0) for k in weights}
        meta = json.dumps(dict(public_meta or {}), sort_keys=True)

        def chunks(n: int):
            first = True
            for name, share in shares[n].items():
                for c in tensor_chunks(name, share, fracs[name]):
                    msg = pb.UploadChunk(model_id=model_id, upload_id=upload_id, tensor=c)
                    if first:
                        msg.public_meta, msg.n_tensors, first = meta, len(shares[n]), False
                    yield msg

        try:
            self._each(lambda n: self._call(n, "UploadModelShares", chunks(n),
                                            timeout=max(self.timeout, 600)))
            self.verify(model_id)
        except ClusterError as exc:
            errors = getattr(exc, "party_errors", [None, None, None])
            for n, err in enumerate(errors):
                if err is None:
                    self._delete_quietly(n, model_id)
            raise
        return upload_id

    def _delete_quietly(self, n: int, model_id: str) -> None:
        try:
            self._call(n, "DeleteModel", pb.ModelRef(model_id=model_id))
        except ClusterError:
            pass

    def delete(self, model_id: str) -> list[str]:
        """Delete the model from every party that holds it; returns one line per party.
        Raises if no party held it or a party refused (other than not holding it)."""
        results = self._settled(lambda n: self._call(n, "DeleteModel",
                                                     pb.ModelRef(model_id=model_id)))
        lines, missing = [], 0
        for n, (_, err) in enumerate(results):
            if err is None:
                lines.append(f"party {n}: deleted")
            elif isinstance(err, ClusterError) and err.code == grpc.StatusCode.NOT_FOUND:
                lines.append(f"party {n}: did not hold it")
                missing += 1
            else:
                raise err
        if missing == 3:
            raise ClusterError(None, grpc.StatusCode.NOT_FOUND,
                               f"no party holds a model {model_id!r}")
        return lines


class QueryUser(_Client):
    role = "query-user"

    def __init__(self, *args, retry_s: float = 120.0, **kw) -> None:
        super().__init__(*args, **kw)
        self.retry_s = retry_s
        self._costs: dict[tuple[str, int], list] = {}
        self._models: dict[str, pb.ModelInfo] = {}
        self._refusals: dict[tuple[str, str], str] = {}    # (model, upload) -> why refused

    def model(self, model_id: str) -> pb.ModelInfo:
        """The model as stored on the three parties; raises unless they hold the same,
        intact upload. A model not yet verified since a party loaded it is verified here."""
        infos = []
        for n, models in enumerate(self.list_models()):
            found = [m for m in models if m.model_id == model_id]
            if not found:
                raise ClusterError(n, grpc.StatusCode.NOT_FOUND, f"unknown model "
                                   f"{model_id!r} (see 'mpc3 models')")
            if not found[0].complete:
                raise ClusterError(n, grpc.StatusCode.FAILED_PRECONDITION,
                                   f"model {model_id!r} is still being uploaded")
            if found[0].state == "corrupt":
                raise InconsistentModel(n, grpc.StatusCode.DATA_LOSS, f"model {model_id!r} "
                                        f"is corrupt: {found[0].problem}; its owner must "
                                        f"delete it ('mpc3 models --delete {model_id}') and "
                                        "share it again")
            infos.append(found[0])
        sig = [(m.upload_id, [(t.name, tuple(t.shape)) for t in m.tensors]) for m in infos]
        if sig[1] != sig[0] or sig[2] != sig[0]:
            raise InconsistentModel(None, grpc.StatusCode.FAILED_PRECONDITION,
                                    f"model {model_id!r}: the parties hold different uploads "
                                    f"({', '.join(m.upload_id for m in infos)}); its owner "
                                    "must delete it and share it again")
        if any(m.state != "verified" for m in infos):
            self.verify(model_id)
        self._models[model_id] = infos[0]
        return infos[0]

    def check_inputs(self, model_id: str, inputs: Mapping[str, np.ndarray]) -> None:
        """Refuse plaintext inputs outside the model's calibrated input range (stored by the
        owner's share-model) - they would wrap in the ring and come back as garbage - and,
        with :class:`ClusterError`, any input of a transformer without a valid calibration
        (:func:`protocols.jobs.model_problem`, once per upload). Bare tensors have none."""
        from mpc3.party import RingConfig
        from protocols.calibrate import Calibration, check_input
        from protocols.jobs import PRODUCTION, TRANSFORMER_LAYOUT, model_problem
        info = self._models.get(model_id) or self.model(model_id)
        meta = json.loads(info.public_meta or "{}")
        if meta.get("layout") != TRANSFORMER_LAYOUT:
            return
        key = (model_id, info.upload_id)
        if key not in self._refusals:
            self._refusals[key] = model_problem(model_id, meta, PRODUCTION,
                                                RingConfig(frac=self.frac))
        if self._refusals[key]:       # the parties refuse it as well; nothing is shared
            raise ClusterError(None, grpc.StatusCode.FAILED_PRECONDITION, self._refusals[key])
        cal = Calibration.from_dict(meta["calibration"])
        for name, value in inputs.items():
            if name in cal.input_range:
                check_input(cal, name, value)

    def submit(self, model_id: str, kind: str, inputs: Mapping[str, np.ndarray],
               params: Mapping | None = None, encoded: bool = False,
               job_id: str | None = None, upload_id: str | None = None,
               allow_empty: bool = False) -> str:
        """Share ``inputs`` and start the job on the three parties; returns the job id.

        Work a party refuses for now is cancelled on the others and resubmitted under a new
        job id with exponential backoff: for up to ``retry_s`` seconds when a limit is full,
        for a few seconds when a party is unreachable. ``upload_id``: the model's upload as returned by :meth:`model` (saves the
        consistency check's round trip when a caller submits many jobs, e.g. decoding
        steps). ``allow_empty``: submit without input tensors (closing a session).
        """
        if not inputs and not allow_empty:
            raise ValueError("no input tensors")
        upload_id = upload_id or self.model(model_id).upload_id
        if not encoded:
            self.check_inputs(model_id, inputs)
        shares = self._share(inputs, encoded)
        params_json = json.dumps(dict(params or {}), sort_keys=True)
        def attempt() -> str:
            jid = job_id or os.urandom(12).hex()
            self._submit_once(jid, model_id, upload_id, kind, params_json, shares)
            return jid
        return self._retrying(attempt, lambda exc: job_id is None)

    def _retrying(self, attempt: Callable[[], object], may_retry: Callable[[ClusterError], bool]):
        """``attempt()`` again with exponential backoff while it fails with a ClusterError that
        ``may_retry`` allows, for up to ``retry_s`` when a limit is full (RESOURCE_EXHAUSTED),
        a few seconds when a party is unreachable (failures.RETRY_WINDOWS)."""
        t0, delay = time.monotonic(), 0.2
        while True:
            try:
                return attempt()
            except ClusterError as exc:
                window = RETRY_WINDOWS.get(exc.code, 0.0) * self.retry_s
                if not may_retry(exc) or time.monotonic() + delay > t0 + window:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(2 * delay, 5.0)

    def _submit_once(self, job_id, model_id, upload_id, kind, params_json, shares) -> None:
        def chunks(n: int):
            head = pb.SubmitChunk(job_id=job_id, model_id=model_id, upload_id=upload_id,
                                  kind=kind, params_json=params_json, n_tensors=len(shares[n]))
            first = True
            for name, share in shares[n].items():
                for c in tensor_chunks(name, share, self.frac):
                    msg = pb.SubmitChunk(job_id=job_id, tensor=c)
                    if first:
                        head.tensor.CopyFrom(c)
                        msg, first = head, False
                    yield msg
            if first:
                yield head

        try:
            self._each(lambda n: self._call(n, "SubmitJob", chunks(n)))
        except ClusterError as exc:
            for n, err in enumerate(exc.party_errors):
                if err is None:
                    try:
                        self._call(n, "CancelJob", pb.JobRef(job_id=job_id), timeout=10)
                    except ClusterError:
                        pass
            raise

    def job_status(self, job_id: str, wait_s: float = 0.0) -> list[pb.JobStatusReply]:
        """The job's status on the three parties; ``wait_s`` > 0 long-polls (each party
        answers when the job ends there or after ``wait_s`` seconds)."""
        return [r for r, _ in self._each(lambda n: self._status(n, job_id, wait_s))]

    def _status(self, n: int, job_id: str, wait_s: float,
                timeout: float | None = None) -> tuple[pb.JobStatusReply, list]:
        md = self.metadata + ((("x-mpc3-wait-s", f"{wait_s:.3f}"),) if wait_s > 0 else ())
        try:
            reply, call = self.stubs[n].JobStatus.with_call(
                pb.JobRef(job_id=job_id), metadata=md,
                timeout=(timeout or self.timeout) + wait_s)
        except grpc.RpcError as exc:
            raise self._error(n, exc) from None
        costs = []
        for key, value in call.trailing_metadata() or ():
            if key == "x-mpc3-costs":
                try:
                    costs = json.loads(value)
                except ValueError:
                    costs = []
        self._costs[(job_id, n)] = costs
        return reply, costs

    def job_costs(self, job_id: str) -> list[list[dict]]:
        """Per-party public per-layer costs of a finished job (as seen by the last status)."""
        return [self._costs.get((job_id, n), []) for n in range(3)]

    def forget(self, job_id: str) -> None:
        for n in range(3):
            self._costs.pop((job_id, n), None)

    def wait(self, job_id: str, timeout: float | None = None) -> list[pb.JobStatusReply]:
        """Wait until the job is done on the three parties.

        Long-polls the parties (no busy polling). As soon as one party reports the job
        failed or cancelled, cancels it everywhere and raises :class:`JobFailed` naming the
        party that failed or stopped answering; after ``timeout`` seconds (default: the
        cluster's job deadline + 10 s) cancels it and raises too.
        """
        deadline = time.monotonic() + (timeout or self.cfg.job_timeout_s + 10)
        silent: set[int] = set()
        while True:
            left = deadline - time.monotonic()
            poll = max(0.0, min(5.0, left))
            settled = self._settled(lambda n: self._status(n, job_id, poll,
                                                           timeout=min(self.timeout, 10.0)))
            states = [None if e else r[0] for r, e in settled]
            for n, (_, e) in enumerate(settled):
                if e is not None:
                    if isinstance(e, ClusterError) and e.code == grpc.StatusCode.NOT_FOUND:
                        raise e
                    silent.add(n)
            failed = [(n, s) for n, s in enumerate(states)
                      if s is not None and s.state in (S.FAILED, S.CANCELLED)]
            if failed:
                self.cancel(job_id)
                raise self._failure(job_id, failed, silent)
            if all(s is not None and s.state == S.DONE for s in states):
                return states
            if time.monotonic() > deadline:
                self.cancel(job_id)
                raise JobFailed(None, grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"job {job_id} was not done in time and was cancelled" +
                                (f"; party {sorted(silent)[0]} stopped answering" if silent
                                 else "") + "; resubmit it")

    @staticmethod
    def _failure(job_id: str, failed, silent: set[int]) -> JobFailed:
        n, s = failed[0]
        blamed = sorted(silent) or sorted({int(m) for _, st in failed
                                           for m in _BLAME.findall(st.error)})
        who = (f"party {blamed[0]} stopped answering; " if blamed else "")
        return JobFailed(n, None, f"job {job_id} was aborted ({S.State.Name(s.state)}: "
                                  f"{s.error}); {who}nothing of it was kept - resubmit it" +
                                  (f" when party {blamed[0]} is back ('mpc3 status')"
                                   if blamed else ""))

    def cancel(self, job_id: str) -> None:
        self._settled(lambda n: self._call(n, "CancelJob", pb.JobRef(job_id=job_id),
                                           timeout=5))

    def fetch_pairs(self, job_id: str, wide: dict | None = None) -> list[dict[str, AShare]]:
        """Each party's output shares; a fetch refused by a full limit (e.g. the user's open
        streams, while its other jobs fetch) is retried with backoff for up to ``retry_s``.
        ``wide`` (filled in): outputs carried with more fractional bits than the cluster's
        frac (``TensorSpec.wide``) -> how many more, the same from every party."""
        fracs: list[dict[str, int]] = [{}, {}, {}]

        def one(n: int) -> dict[str, AShare]:
            return self._retrying(lambda: fetch_once(n),
                                  lambda exc: exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED)

        def fetch_once(n: int) -> dict[str, AShare]:
            asm = TensorAssembler(self.frac, self.cfg.limits.tensor_bytes,
                                  fracs=(self.frac, 2 * self.frac))
            out = {}
            try:
                for c in self.stubs[n].FetchOutput(pb.JobRef(job_id=job_id),
                                                   metadata=self.metadata,
                                                   timeout=max(self.timeout, 600)):
                    done = asm.feed(c)
                    if done is not None:
                        name, shape, payload, _, frac = done
                        out[name] = share_from_payload(payload, shape)
                        fracs[n][name] = frac
            except grpc.RpcError as exc:
                raise self._error(n, exc) from None
            except Exception as exc:  # BadRequest from the assembler: a party sent garbage
                raise TamperingDetected(f"party {n} sent a malformed output: {exc}") from None
            asm.finish()
            return out
        pairs = self._each(one)
        if wide is not None:
            wide.update(same_scales(fracs, self.frac))
        return pairs

    def fetch(self, job_id: str) -> dict[str, np.ndarray]:
        """Reconstructed ring outputs at the cluster's frac (checked replicas)."""
        wide: dict[str, int] = {}
        pairs = self.fetch_pairs(job_id, wide)
        return reconstruct(pairs, wide)

    def run(self, model_id: str, kind: str, inputs: Mapping[str, np.ndarray],
            params: Mapping | None = None) -> dict[str, np.ndarray]:
        """Submit, wait, fetch and decode: float outputs."""
        job_id = self.submit(model_id, kind, inputs, params)
        self.wait(job_id)
        return {k: ring.decode(v, self.frac) for k, v in self.fetch(job_id).items()}
