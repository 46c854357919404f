"""The query user's client: :class:`QueryUser` runs jobs on a model the parties hold.

It checks that the three parties hold the same upload of the model (same upload id, tensor
names and shapes), shares its inputs with ``os.urandom``-keyed randomness, submits the job to
the three parties under one fresh job id, waits, fetches the three output pairs and
reconstructs (:mod:`net.client.outputs`). Every element of a replicated sharing is held twice
(slot ``j`` by parties ``j`` and ``j-1``); reconstruction checks that the two copies agree
and raises :class:`~net.client.failures.TamperingDetected` otherwise - copies are never averaged or
trusted one-sided.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Mapping

import grpc
import numpy as np

from mpc3 import ring
from mpc3.shares import AShare
from net.codec import TensorAssembler, share_from_payload, tensor_chunks
from net.proto import mpc3_pb2 as pb

from .base import Client
from .failures import (
    _BLAME,
    RETRY_WINDOWS,
    ClusterError,
    InconsistentModel,
    JobFailed,
    TamperingDetected,
)
from .outputs import reconstruct, same_scales

S = pb.JobStatusReply


class JobResult(list):
    """A finished job's status on each party (a list of JobStatusReply) and ``costs``: the
    per-layer costs (public) each party reported with it."""

    def __init__(self, states, costs) -> None:
        super().__init__(states)
        self.costs: list[list[dict]] = costs


class QueryUser(Client):
    role = "query-user"

    def __init__(self, *args, retry_s: float = 120.0, **kw) -> None:
        super().__init__(*args, **kw)
        self.retry_s = retry_s
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
        from protocols.calibration.calibrate import Calibration, check_input
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
        for a few seconds when a party is unreachable. ``upload_id``: the model's upload as returned
        by :meth:`model` (saves the consistency check's round trip when a caller submits many jobs,
        e.g. decoding steps). ``allow_empty``: submit without input tensors (closing a session).
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

        nbytes = sum(s.a.nbytes + s.b.nbytes for s in shares[0].values())
        try:               # the call's deadline grows by one second per 10 MB of shares
            self._each(lambda n: self._call(n, "SubmitJob", chunks(n),
                                            timeout=self.timeout + nbytes / 1e7))
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
        return reply, costs

    def wait(self, job_id: str, timeout: float | None = None) -> "JobResult":
        """Wait until the job is done on the three parties: their final statuses, with the
        per-layer costs each party reported (:class:`JobResult`).

        Long-polls the parties (no busy polling). As soon as one party reports the job
        failed or cancelled, cancels it everywhere and raises :class:`JobFailed` naming the
        party that failed or stopped answering; after ``timeout`` seconds (default: the
        cluster's job deadline + 10 s) cancels it and raises too.
        """
        deadline = time.monotonic() + (timeout or self.cfg.job_timeout_s + 10)
        silent: set[int] = set()
        busy: set[int] = set()
        while True:
            left = deadline - time.monotonic()
            poll = max(0.0, min(5.0, left))
            states, costs, errors = self._poll(job_id, poll, short=busy)
            busy = set()
            for n, e in enumerate(errors):
                if e is None:
                    continue
                if isinstance(e, ClusterError) and e.code == grpc.StatusCode.NOT_FOUND:
                    raise e
                if isinstance(e, ClusterError) and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    busy.add(n)           # long-polls at their limit there: ask, do not wait
                else:
                    silent.add(n)
            failed = [(n, s) for n, s in enumerate(states)
                      if s is not None and s.state in (S.FAILED, S.CANCELLED)]
            if failed:
                self.cancel(job_id, skip=silent | {n for n, s in enumerate(states)
                                                   if s is None})
                raise self._failure(job_id, failed, silent)
            if all(s is not None and s.state == S.DONE for s in states):
                return JobResult(states, costs)
            if time.monotonic() > deadline:
                self.cancel(job_id)
                raise JobFailed(None, grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"job {job_id} was not done in time and was cancelled" +
                                (f"; party {sorted(silent)[0]} stopped answering" if silent
                                 else "") + "; resubmit it")
            if busy:
                time.sleep(0.1 + 0.4 * random.random())

    def _poll(self, job_id: str, wait_s: float, short=()) -> tuple[list, list, list]:
        """Long-poll the three parties (those in ``short`` without waiting): (state or None,
        per-layer costs, error or None) per party, as soon as all answered or one reports
        the job failed - a party that stopped answering does not delay the failure the
        others report."""
        states: list = [None] * 3
        costs: list = [[], [], []]
        errors: list = [None] * 3
        answered = [0]
        cond = threading.Condition()

        def body(n: int) -> None:
            reply = error = None
            cost: list = []
            try:
                reply, cost = self._status(n, job_id, 0.0 if n in short else wait_s,
                                           timeout=min(self.timeout, 10.0))
            except ClusterError as exc:
                error = exc
            with cond:
                states[n], costs[n], errors[n] = reply, cost, error
                answered[0] += 1
                cond.notify_all()

        def ended() -> bool:
            return answered[0] == 3 or any(s is not None and s.state in (S.FAILED, S.CANCELLED)
                                           for s in states)

        for n in range(3):
            threading.Thread(target=body, args=(n,), daemon=True).start()
        with cond:
            cond.wait_for(ended)
            return list(states), list(costs), list(errors)

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

    def cancel(self, job_id: str, skip: set[int] = frozenset()) -> None:
        """Cancel the job on the three parties; those in ``skip`` (not answering) are told
        in the background, not waited for."""
        def one(n: int) -> None:
            try:
                self._call(n, "CancelJob", pb.JobRef(job_id=job_id), timeout=5)
            except ClusterError:
                pass
        for n in skip:
            threading.Thread(target=one, args=(n,), daemon=True).start()
        self._settled(lambda n: None if n in skip else one(n))

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
