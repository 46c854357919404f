"""What every client of a cluster does: one channel per party (mTLS with the client's
certificate, or the dev identity in plaintext), calls that name the party when they fail,
the three parties asked concurrently, model listing, status and verification, and the
replicated sharing of inputs (:class:`net.client.owner.ModelOwner`,
:class:`net.client.user.QueryUser`).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

import grpc
import numpy as np

from mpc3 import ring
from mpc3.sharing import deal
from net import keys
from net.config import ClusterConfig
from net.grpcopts import GRPC_OPTIONS
from net.proto import mpc3_pb2 as pb
from net.proto import mpc3_pb2_grpc as pb_grpc

from .failures import ClusterError, InconsistentModel, diagnose_tls, rpc_error


class Client:
    role = ""

    def __init__(self, cfg: ClusterConfig, cert=None, key=None, rpc_timeout: float | None = None,
                 dev_identity: str = "dev") -> None:
        """``rpc_timeout``: how long a call waits for a party (default: the cluster's
        ``peer_timeout_s``, after which the parties give up on a silent peer too)."""
        self.cfg = cfg
        self.frac = cfg.frac
        self.timeout = rpc_timeout or cfg.peer_timeout_s
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

    def _error(self, n: int, exc: grpc.RpcError) -> ClusterError:
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

    def _share(self, tensors: Mapping[str, np.ndarray], encoded: bool) -> list[dict]:
        per_party: list[dict] = [{}, {}, {}]
        for name, value in tensors.items():
            x = ring.check_ring(np.asarray(value), name) if encoded else ring.encode(
                value, self.frac)
            for n, s in enumerate(deal(x)):
                per_party[n][name] = s
        return per_party
