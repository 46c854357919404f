"""The party service without a network: three :class:`~net.party.runner.JobRunner` in one process
over :mod:`mpc3.sim`'s in-memory links (tests, quick benchmarks, ``--transport inproc``).

Jobs take exactly the path they take in party processes - :func:`protocols.jobs.admit`,
sessions, party 0's admission and start, :func:`protocols.jobs.execute` - only the
transport differs; every job gets fresh PRG keys (:func:`mpc3.sim.make_parties` per job id).
"""
from __future__ import annotations

import os
import threading

from mpc3.party import Party, RingConfig
from mpc3.shares import AShare
from mpc3.sim import make_parties
from net.errors import BadRequest
from net.limits import Limits
from net.proto import mpc3_pb2 as pb
from protocols.jobs import PRODUCTION, JobRegistry, ModelView

from .runner import Job, JobRunner
from .sessions import SessionStore

S = pb.JobStatusReply


class InprocParties:
    def __init__(self, models: list[ModelView], registry: JobRegistry = PRODUCTION,
                 ring: RingConfig | None = None, timeout: float = 120.0,
                 limits: Limits | None = None, job_timeout_s: float = 3600.0,
                 security: str = "semi-honest") -> None:
        """``security``: every runner's mode (:mod:`net.party.malicious`)."""
        if len(models) != 3:
            raise ValueError("one ModelView per party")
        self.models = models
        self.ring = ring or RingConfig()
        self.timeout = timeout
        self.limits = limits or Limits()
        self._lock = threading.Lock()
        self._parties: dict[str, list[Party]] = {}
        self.upload_id = "inproc"
        self.runners = [JobRunner(r, registry, self.limits, SessionStore(r, self.limits),
                                  self._opener(r), self._closer(r), self._teller(r),
                                  job_timeout_s, security=security)
                        for r in range(3)]

    @classmethod
    def for_model(cls, cfg, weights, permitted=None, frac: int | None = None,
                  model_id: str = "inproc", calibration: dict | None = None,
                  **kw) -> "InprocParties":
        """Three parties holding fresh shares of a transformer (``cfg``, ``weights``) with the
        public metadata ``share-model`` stores (kind = its arch; ``permitted`` default: the
        model's own inference; ``calibration``: its
        :meth:`protocols.calibration.calibrate.Calibration .to_dict`, from which the decode steps
        choose their schedule - none: the schedule of a model calibrated before that existed)."""
        from protocols.jobs import DEFAULT_PERMITTED, SECRET_PERMITTED
        from protocols.layers.secure_model import deal_tensors, plain_tensors
        secret = kw.pop("secret_user", None)
        ring_cfg = kw.pop("ring", None) or RingConfig(**({} if frac is None else
                                                         {"frac": frac}))
        plain = plain_tensors(cfg, weights, secret_user=secret)   # (+ the owner's secret tables)
        fracs = {k: ring_cfg.frac + e for k, (_, e) in plain.items()}
        shares = deal_tensors(plain, frac=ring_cfg.frac)
        default = (SECRET_PERMITTED if secret is not None else DEFAULT_PERMITTED)[cfg.arch]
        meta = {"model_config": cfg.to_dict(), "layout": "protocols.secure_model",
                "kind": cfg.arch, "permitted": list(default if permitted is None else permitted)}
        if secret is not None:
            meta["embeddings"] = "secret"
        if calibration is not None:
            meta["calibration"] = calibration
        meta.update(kw.pop("meta", {}))
        return cls([ModelView(model_id, shares[n], meta, fracs) for n in range(3)],
                   ring=ring_cfg, **kw)

    def _opener(self, rank: int):
        def open_party(job_id: str) -> Party:
            with self._lock:
                if job_id not in self._parties:
                    self._parties[job_id] = make_parties(self.ring, job_id=job_id,
                                                         timeout=self.timeout)
                return self._parties[job_id][rank]
        return open_party

    def _closer(self, rank: int):
        def close_party(job_id: str) -> None:
            return None
        return close_party

    def _teller(self, rank: int):
        def tell(peer: int, job_id: str, control: str) -> None:
            self.runners[peer].on_control(rank, job_id, control)
        return tell

    def run(self, kind: str, params: dict, inputs: list[dict[str, AShare]],
            owner: str = "inproc") -> list[Job]:
        """Submit to the three parties, wait, and return their jobs (raises on failure)."""
        job_id = os.urandom(12).hex()
        jobs = []
        try:
            for r in (1, 2, 0):           # followers first: party 0 starts it at once
                jobs.append(self.runners[r].accept(kind, job_id, owner, self.models[r],
                                                   self.upload_id, dict(params), inputs[r]))
        except BadRequest as exc:
            for r in range(3):
                job = self.runners[r].get(job_id)
                if job is not None:
                    self.runners[r].cancel(job, "refused by another party")
            raise ValueError(str(exc)) from None
        jobs = [self.runners[r].get(job_id) for r in range(3)]
        for job in jobs:
            job.done.wait()
        with self._lock:
            self._parties.pop(job_id, None)
        failed = [j for j in jobs if j.state != S.DONE]
        if failed:
            first = next((j for j in failed if "aborted" not in j.error), failed[0])
            raise RuntimeError(first.error or f"job {kind} {S.State.Name(first.state)}")
        return jobs
