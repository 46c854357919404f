"""The party process: one gRPC server with three services on one port, and the peer links.

* the links to the two other parties: TLS sockets on the party's ``peer_address``
  (:mod:`net.peer.tlslink`, default), or ``mpc3.PeerService`` streams on the gRPC port with
  ``peer_transport = "grpc"`` (:mod:`net.peer.streams`);
* ``mpc3.ClientService`` - model owners and query users (:mod:`net.party.service`);
* ``grpc.health.v1.Health`` - SERVING once both peer links are up, NOT_SERVING otherwise.

A :class:`PartyServer` wires the pieces: the model store (:mod:`net.party.store`), per-user limits
(:mod:`net.limits`), decode sessions (:mod:`net.party.sessions`), the job runner with party 0's
admission queue (:mod:`net.party.runner`) and the cross-party model check (:mod:`net.party.verify`).
Which job kinds it runs is fixed by the registry it is built with: ``mpc3 party`` and
``cluster up`` use :data:`protocols.jobs.PRODUCTION` (model inference only); benchmark
harnesses start their own processes with :func:`protocols.jobs.benchmark_registry`, which
say so loudly in their log and in Status.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from mpc3.comm import ProtocolError
from mpc3.party import RingConfig
from net import keys
from net.config import ClusterConfig
from net.errors import BadRequest, Code
from net.grpcopts import SERVER_OPTIONS
from net.limits import Quotas
from net.peer.router import PeerRouter, PeerUnavailable
from net.peer.streams import PeerServicer, StreamTransport
from net.proto import mpc3_pb2_grpc as pb_grpc
from protocols.jobs import PRODUCTION, JobRegistry

from . import malloc
from .metrics import Metrics, MetricsServer
from .runner import JobRunner
from .service import VERSION, ClientServicer
from .sessions import SessionStore
from .store import CORRUPT, ModelStore
from .verify import compare_slots

log = logging.getLogger("mpc3.server")


class PartyServer:
    """One party: gRPC server + peer router + store + jobs. ``start()`` then ``wait()``."""

    def __init__(self, cfg: ClusterConfig, rank: int,
                 registry: JobRegistry = PRODUCTION) -> None:
        self.cfg = cfg
        self.rank = rank
        self.registry = registry
        self.limits = cfg.limits
        self.pcfg = cfg.party(rank)
        self.ring = RingConfig(frac=cfg.frac)
        self.store = ModelStore(self.pcfg.data_dir, rank)
        self.quotas = Quotas(self.limits, rank)
        creds = None
        if cfg.tls:
            creds = keys.channel_credentials(self.pcfg.cert, self.pcfg.key, cfg.ca)
        self.router = PeerRouter(rank, self._peer_transport(creds), cfg.security)
        self.sessions = SessionStore(rank, self.limits)
        self.metrics = Metrics(rank, VERSION)
        self.kernels: tuple[int, float] | None = None   # (compiled forms, seconds): serve()
        self.metrics_server: MetricsServer | None = None
        self.runner = JobRunner(rank, registry, self.limits, self.sessions, self._open_party,
                                self.router.close_job, self._tell,
                                cfg.job_timeout_s, self.quotas.release, self.metrics,
                                cfg.security, self.router.security_problem)
        # controls are handled in order on one thread of their own, not on a link's reader:
        # handling one may send a control, which may wait for a busy link to the sender
        self._controls = futures.ThreadPoolExecutor(1, thread_name_prefix="mpc3-control")
        self.router.on_control = lambda *control: self._controls.submit(self._control,
                                                                        *control)
        # every stream and blocking call of every user at once still leaves threads for
        # cheap calls (Status, a JobStatus without wait) and the peer streams of jobs
        workers = (self.limits.streams + self.limits.blocking_calls +
                   4 * self.limits.running_jobs + 16)
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                options=SERVER_OPTIONS)
        self.service = ClientServicer(self)
        pb_grpc.add_PeerServiceServicer_to_server(PeerServicer(self.router), self.grpc)
        pb_grpc.add_ClientServiceServicer_to_server(self.service, self.grpc)
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

    def _peer_transport(self, creds):
        """The TLS socket links (default), or the gRPC streams (``creds``: this party's
        channel credentials, None in plaintext)."""
        if self.cfg.peer_transport != "tls":
            return StreamTransport(self.cfg.dial_address(self.rank, (self.rank + 1) % 3),
                                   creds, tls=self.cfg.tls)
        from net.peer.tlslink import SocketTransport
        from net.peer.tlssock import tls_contexts
        nxt = (self.rank + 1) % 3
        ctx = (tls_contexts(self.pcfg.cert, self.pcfg.key, self.cfg.ca) if self.cfg.tls
               else None)
        try:
            return SocketTransport(self.pcfg.peer_listen, self.cfg.peer_dial_address(
                self.rank, nxt), ctx, self.cfg.connect_timeout_s, self.cfg.peer_timeout_s)
        except OSError as exc:
            raise RuntimeError(f"party {self.rank}: cannot listen for peers on "
                               f"{self.pcfg.peer_listen} ({exc})") from None

    # ------------------------------------------------------------------ job wiring ----
    def _open_party(self, job_id: str):
        try:
            return self.router.open_job(job_id, self.ring, self.cfg.peer_timeout_s)
        except PeerUnavailable as exc:
            raise BadRequest(Code.UNAVAILABLE, f"{exc}; retry when all parties are up") \
                from None
        except ValueError as exc:
            raise BadRequest(Code.ALREADY_EXISTS, str(exc)) from None

    def _control(self, peer: int, job_id: str, control: str) -> None:
        try:
            self.runner.on_control(peer, job_id, control)
        except Exception:  # noqa: BLE001 - logged; the next control is handled all the same
            log.exception("party %d: control %r of job %s from party %d failed", self.rank,
                          control[:20], job_id[:64], peer)

    def _tell(self, peer: int, job_id: str, control: str) -> None:
        try:
            self.router.send_control(peer, job_id, control)
        except (PeerUnavailable, ProtocolError) as exc:
            raise BadRequest(Code.UNAVAILABLE, str(exc)) from None

    def verify_model(self, model_id: str, verify_id: str) -> tuple[str, str]:
        """Compare this party's two share slots of the model with the neighbours'."""
        rec = self.store.info(model_id)
        if rec is None:
            raise BadRequest(Code.NOT_FOUND, f"unknown model {model_id!r} on party "
                             f"{self.rank}")
        party = self._open_party(f"verify.{verify_id}")
        try:
            state, problem = compare_slots(party, rec)
        except ProtocolError as exc:
            party.comm.abort(str(exc))
            raise BadRequest(Code.ABORTED, f"party {self.rank}: verification of model "
                             f"{model_id!r} failed: {exc}") from None
        finally:
            self.router.close_job(f"verify.{verify_id}")
        if rec.state != CORRUPT:
            self.store.set_state(model_id, rec.meta["upload_id"], state, problem)
        else:
            state, problem = CORRUPT, rec.problem
        log.info("party %d: model %s %s%s", self.rank, model_id, state,
                 f" ({problem})" if problem else "")
        return state, problem

    # ------------------------------------------------------------------- lifecycle ----
    def start(self) -> None:
        if self.pcfg.metrics_listen:
            self.metrics.gauges = self._gauges
            self.metrics_server = MetricsServer(self.metrics, self.pcfg.metrics_listen)
            log.info("party %d: metrics on http://%s/metrics", self.rank,
                     self.metrics_server.address)
        self.grpc.start()
        self.router.start()
        threading.Thread(target=self._health_loop, daemon=True, name="mpc3-health").start()
        threading.Thread(target=self._upkeep_loop, daemon=True, name="mpc3-upkeep").start()
        log.info("party %d listening on %s, peers on %s (%s, security %s)", self.rank,
                 self.pcfg.listen,
                 self.pcfg.peer_listen if not isinstance(self.router.transport, StreamTransport)
                 else "the same port",
                 "mTLS" if self.cfg.tls else "INSECURE PLAINTEXT", self.cfg.security)
        if self.registry.diagnostic:
            log.warning("party %d: BENCHMARK/TEST PROCESS - diagnostic job kinds enabled "
                        "(they return model weights); never share real models with it",
                        self.rank)

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

    def _upkeep_loop(self) -> None:
        period = min(5.0, max(0.1, min(self.limits.session_idle_s, self.limits.job_arrival_s,
                                       self.limits.queue_timeout_s) / 4))
        while not self._stopped.wait(period):
            for sid in self.sessions.expire():
                log.info("party %d: session %s expired (idle)", self.rank, sid)
            for jid in self.runner.expire(self.cfg.peer_timeout_s):
                log.info("party %d: job %s expired in the queue", self.rank, jid)

    def _gauges(self) -> dict[str, float]:
        recs, _ = self.store.list()
        running, queued = self.runner.counts()
        return {"jobs_running": running, "jobs_queued": queued,
                "models": sum(1 for r in recs if r.state != CORRUPT)}

    def stop(self, grace: float = 1.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.service.reaper.stop()
        self.router.stop()
        self.grpc.stop(grace).wait()
        self._controls.shutdown(wait=False)

    def wait(self) -> None:
        self._stopped.wait()


def runtime_defaults(env=os.environ) -> None:
    """Process settings of a party, unless the operator set them: the parallel ring
    matmul's OpenMP workers sleep between calls instead of spinning (libgomp's default spins
    for a while after each call), since a party shares its cores with its own gRPC
    threads - and, on one host, with the other parties (Table 2 encoder over three local
    party processes 2.28 -> 1.96 s, benchmarks/paper.py). Must run before the first
    parallel kernel loads the OpenMP runtime."""
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _one_compiler(cache: Path):
    """Parties sharing a kernel cache (one host) warm up one at a time: the first compiles,
    the others load what it cached, instead of three compiling the same kernels at once
    (cold, 3 x 53 CPU-s semi-honest on this box). The lock is released when the holder exits,
    however it ends; a party that waits for it says so in its log."""
    import fcntl
    try:
        cache.mkdir(parents=True, exist_ok=True)
        f = open(cache / "mpc3-warmup.lock", "a")
    except OSError:                 # no lock where none can be made: numba reports the cache
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is compiling the kernels into %s: waiting for it, then "
                     "loading them", cache, extra={"event": "kernels_wait"})
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def prepare_kernels(data_dir, rank: int = 0, env=os.environ,
                    security: str = "semi-honest") -> tuple[int, float]:
    """Compile the secure kernels a job in ``security`` mode reaches, every size's form
    (:mod:`mpc3.warmup`), before the party serves: (compiled kernel forms, seconds). numba caches
    compiled code beside the package's sources; a read-only install (systemd's
    ProtectSystem=strict, ProtectHome) has no such place, and the first job failed with
    "cannot cache function ...: no locator available" - so, unless the operator set
    NUMBA_CACHE_DIR, an unwritable install caches in ``data_dir/numba-cache``. Must run
    before numba is imported. RuntimeError in one line if the kernels cannot be compiled."""
    import mpc3
    t0 = time.monotonic()
    beside = Path(mpc3.__file__).parent / "__pycache__"        # numba's default cache
    try:
        if "NUMBA_CACHE_DIR" not in env and not _writable(beside):
            cache = Path(data_dir) / "numba-cache"
            cache.mkdir(parents=True, exist_ok=True, mode=0o700)
            env["NUMBA_CACHE_DIR"] = str(cache)
        from mpc3 import warmup  # imports numba only when kernels compile
        with _one_compiler(Path(env.get("NUMBA_CACHE_DIR") or beside)):
            forms = warmup.warm_up(security)
    except Exception as exc:  # noqa: BLE001 - any compile failure: one line, party not started
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"party {rank} cannot compile its secure kernels ({first}); give "
                           "it a writable NUMBA_CACHE_DIR (its data_dir is used when the "
                           "install is read-only)") from None
    return forms, time.monotonic() - t0


def serve(cfg: ClusterConfig, rank: int, registry: JobRegistry = PRODUCTION) -> int:
    """Run party ``rank`` until SIGTERM/SIGINT: its kernels compiled first
    (:func:`prepare_kernels`, so no job waits for them and a party that cannot compile does
    not start). Freed buffers stay in the heap for the next round's
    (:func:`net.party.malloc.keep_freed_memory`: no page faults for every fresh buffer)."""
    runtime_defaults()
    malloc.keep_freed_memory()
    forms, took = prepare_kernels(cfg.party(rank).data_dir, rank, security=cfg.security)
    log.info("party %d: secure kernels ready in %.1f s (%d compiled forms)", rank, took, forms,
             extra={"event": "kernels_ready"})
    srv = PartyServer(cfg, rank, registry)
    srv.kernels = (forms, took)
    srv.metrics.kernels_s = took
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=srv.stop).start())
    srv.start()
    srv.wait()
    return 0
