"""Three party processes on this machine: the one launcher behind ``mpc3 cluster up/down``,
``mpc3 demo``, the benchmark harness and the tests.

:class:`LocalCluster` writes certificates (unless insecure) and ``cluster.toml`` into a
directory, starts ``mpc3 party`` three times - or, with ``bench=True``, the benchmark/test
party process :mod:`app.bench_party` - each logging to ``party-N.log`` with its pid in
``party-N.pid``, and waits until every party reports both peer links up. A cluster directory
keeps its ports: starting again reuses the addresses in its ``cluster.toml`` (``new_ports``
picks fresh ones). Stopping signals only processes whose command line is a party of this very
cluster (a recycled pid is never signalled). ``launch`` lets a caller start the processes
elsewhere (e.g. inside emulated network namespaces, :mod:`app.bench.remote`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from net import config as cconf
from net import keys

REPO = Path(__file__).resolve().parent.parent
INSECURE_FLAG = "--insecure-plaintext-for-local-dev"


#: Ports this process has handed out: never handed out twice (a cluster binds them later).
_GIVEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now, outside the kernel's ephemeral range where
    there is room (else from it). A port from that range can be taken by any outgoing
    connection's source port before its party binds it - even by a peer dialling that very
    port before it listens (a TCP self-connect) - which failed a CI run: "cannot listen for
    peers ... Address already in use". The sockets stay bound until all ``n`` are picked."""
    import random
    lo, hi = _ephemeral_range()
    pool = [p for p in (*range(max(1024, lo - 12000), lo), *range(hi + 1, 65536))
            if p not in _GIVEN]
    random.shuffle(pool)
    held: list[socket.socket] = []
    try:
        for port in pool:
            if len(held) == n:
                break
            s = socket.socket()
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        while len(held) < n:                 # no room outside the range: the kernel's pick
            s = socket.socket()
            s.bind((host, 0))
            held.append(s)
        ports = [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
    _GIVEN.update(ports)
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def write_config(d: Path, host: str = "127.0.0.1", base_port: int = 0,
                 peer_timeout: float = 30.0, insecure: bool = False,
                 limits: dict | None = None, new_ports: bool = False,
                 parties: list[dict] | None = None, job_timeout: float = 600.0,
                 peer_transport: str = "tls", security: str = "semi-honest") -> Path:
    """Certificates (unless insecure) and ``cluster.toml`` for three parties.

    ``parties``: the [[party]] tables to use (address, listen, dial...; cert, key and
    data_dir are filled in, peer_address too when missing: a free port); default: ``host``
    with ``base_port + n`` (peers ``base_port + 3 + n``) or the ports of an existing config in
    ``d`` (unless ``new_ports``) or free ports. ``security``: [cluster] security (written
    when not the default).
    """
    d.mkdir(parents=True, exist_ok=True)
    if not insecure and not (d / "certs" / "ca.key").exists():
        keys.generate(d / "certs", hosts=("localhost", "127.0.0.1", host))
    path = d / "cluster.toml"
    if parties is None:
        old = None
        if path.exists() and not new_ports and not base_port:
            try:
                old = cconf.load(path, insecure_flag=insecure)
            except (ValueError, OSError):
                old = None
        if old is not None:
            parties = [{"id": n, "address": old.parties[n].address,
                        "peer_address": old.parties[n].peer_address} for n in range(3)]
        else:
            ports = [base_port + n for n in range(6)] if base_port else free_ports(6, host)
            parties = [{"id": n, "address": f"{host}:{ports[n]}",
                        "peer_address": f"{host}:{ports[3 + n]}"} for n in range(3)]
    cluster = {"peer_timeout_s": peer_timeout, "job_timeout_s": job_timeout, "frac": 18,
               "peer_transport": peer_transport}
    if security != "semi-honest":
        cluster["security"] = security
    if insecure:
        cluster[cconf.INSECURE_KEY] = True
    else:
        cluster["ca"] = "certs/ca.pem"
    tables = []
    for n, p in enumerate(parties):
        p = {"id": n, **p}
        if "peer_address" not in p:         # a free port, not the default gRPC port + 1
            p["peer_address"] = f"{p['address'].rpartition(':')[0]}:{free_port(host)}"
        p["data_dir"] = f"data/party-{n}"
        if not insecure:
            p.update(cert=f"certs/party-{n}.pem", key=f"certs/party-{n}.key")
        tables.append(p)
    clients = {} if insecure else {
        "model-owner": {"cert": "certs/owner.pem", "key": "certs/owner.key"},
        "query-user": {"cert": "certs/user.pem", "key": "certs/user.key"}}
    path.write_text(cconf.render(tables, cluster, clients, limits))
    return path


def party_argv(cfg_path: Path, n: int, bench: bool = False, insecure: bool = False,
               log_level: str = "INFO", tied: bool = False) -> list[str]:
    module = ["app.bench_party"] if bench else ["app.cli", "party"]
    argv = [sys.executable, "-m", *module, "--config", str(cfg_path), "--id", str(n),
            "--log-level", log_level]
    return argv + ([INSECURE_FLAG] if insecure else []) + \
        (["--exit-with-parent", str(os.getpid())] if tied else [])


def exit_with_parent(pid: int | None, poll_s: float = 1.0) -> None:
    """Party side of ``tied``: SIGTERM ourselves (the normal shutdown) once process ``pid``,
    the launcher, is gone - so a benchmark or demo killed hard (SIGKILL, the OOM killer)
    leaves no orphaned parties behind. A cluster started by ``mpc3 cluster up`` is not tied:
    it outlives its command by design."""
    if pid is None:
        return
    import threading
    child = os.getppid() == pid      # then a change of parent is the race-free sign

    def gone() -> bool:
        if child:                    # (a dead launcher's pid may be reused before we look)
            return os.getppid() != pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="mpc3-exit-with-parent").start()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("NUMBA_NUM_THREADS", str(shared_host_threads()))
    return env


def shared_host_threads(cpus: int | None = None) -> int:
    """Threads of one party's parallel ring matmul when the three parties share this host
    (a local cluster): its cores split three ways, at least one. A party alone on its host
    uses them all (numba's default); with all three on the 2-core machine, the Table 2
    encoder over party processes took 1.07 s with two threads each and 1.00 s with one,
    0.63 -> 0.55 s of CPU per party (`python -m app.bench.remote layer encoder`, repeat 6)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1
    return max(1, cpus // 3)


def is_own_party(pid: int, cfg_path: Path) -> bool:
    """True if ``pid`` is alive and runs a party of the cluster configured at ``cfg_path``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    if state == "Z":
        return False
    args = [a.decode(errors="replace") for a in argv]
    return str(cfg_path) in args and ("party" in args or "app.bench_party" in args)


def wait_healthy(cfg: cconf.ClusterConfig, timeout: float, procs=None) -> list[str]:
    """Poll the parties' Status until all three have both links up; returns problems left."""
    from net.client.failures import ClusterError
    from net.client.owner import ModelOwner
    from net.client.user import QueryUser
    from net.proto import mpc3_pb2 as pb
    role_cls = QueryUser if "query-user" in cfg.clients or not cfg.tls else ModelOwner
    deadline = time.monotonic() + timeout
    problems = ["not checked"]
    with role_cls(cfg, rpc_timeout=2.0) as cl:
        while time.monotonic() < deadline:
            problems = []
            for n in range(3):
                if procs and procs[n] is not None and procs[n].poll() is not None:
                    return [f"party {n} exited with code {procs[n].returncode}"]
                try:
                    st = cl._call(n, "Status", pb.Empty(), 2.0)
                    if len(st.links_up) != 2:
                        problems.append(f"party {n}: links up to {list(st.links_up)}")
                except ClusterError as exc:
                    problems.append(str(exc))
            if not problems:
                return []
            time.sleep(0.2)
    return problems


#: How long starting parties may take to link up: each compiles its secure kernels first
#: (:mod:`mpc3.warmup`: with an empty numba cache 53 CPU-s, 120 in malicious mode, the
#: parties of one host one after another, the others then loading the cache; 6-9 cached).
START_WAIT_S = 240.0


class LocalCluster:
    def __init__(self, directory, *, bench: bool = False, insecure: bool = False,
                 log_level: str = "INFO", launch: Callable | None = None, tied: bool = False,
                 **config) -> None:
        """``config``: keyword arguments of :func:`write_config`; ``launch(n, argv, **popen)``
        starts party ``n`` (default: a new session on this host); ``tied``: the parties exit
        when this process does (benchmarks, demos, tests), see :func:`exit_with_parent`."""
        self.tied = tied
        self.dir = Path(directory).resolve()
        self.bench = bench
        self.insecure = insecure
        self.log_level = log_level
        self.launch = launch
        self.config = config
        self.path = self.dir / "cluster.toml"
        self.cfg: cconf.ClusterConfig | None = None
        self.procs: list[subprocess.Popen | None] = [None, None, None]

    # ------------------------------------------------------------------- lifecycle ----
    def running_pids(self) -> dict[int, int]:
        """Parties of this cluster still running, from the pid files (verified)."""
        out = {}
        for n in range(3):
            f = self.dir / f"party-{n}.pid"
            try:
                pid = int(f.read_text().strip())
            except (OSError, ValueError):
                continue
            if is_own_party(pid, self.path):
                out[n] = pid
        return out

    def start(self, wait: float = START_WAIT_S) -> "LocalCluster":
        """Start the three parties; where some still run (one crashed or was killed), start
        only the missing ones on the existing config, so the survivors keep their sessions."""
        running = self.running_pids()
        if len(running) == 3:
            raise RuntimeError(f"a cluster is already running in {self.dir} (pids "
                               f"{sorted(running.values())}); run 'mpc3 cluster down --dir "
                               f"{self.dir}'")
        if not running:
            write_config(self.dir, insecure=self.insecure, **self.config)
        self.cfg = cconf.load(self.path, insecure_flag=self.insecure)
        missing = [n for n in range(3) if n not in running]
        try:
            for n in missing:
                self.start_party(n)
            problems = wait_healthy(self.cfg, wait, self.procs)
            if problems:
                raise RuntimeError("cluster did not become healthy: " + "; ".join(problems)
                                   + f" (see {self.dir}/party-N.log)")
        except BaseException:
            self.stop() if not running else self._stop_started(missing)
            raise
        return self

    def _stop_started(self, parties: list[int]) -> None:
        for n in parties:
            proc = self.procs[n]
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)

    def start_party(self, n: int) -> subprocess.Popen:
        argv = party_argv(self.path, n, self.bench, self.insecure, self.log_level, self.tied)
        with open(self.dir / f"party-{n}.log", "ab") as log:
            kw = dict(stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                      env=_env(), cwd=str(REPO))
            proc = (self.launch(n, argv, **kw) if self.launch is not None else
                    subprocess.Popen(argv, start_new_session=True, **kw))
        self.procs[n] = proc
        (self.dir / f"party-{n}.pid").write_text(f"{proc.pid}\n")
        return proc

    def wait_healthy(self, timeout: float = 60.0) -> list[str]:
        return wait_healthy(self.cfg, timeout, self.procs)

    def stop(self, grace: float = 5.0) -> list[int]:
        """Stop the parties (this object's processes, else those in the pid files)."""
        stopped = []
        pids = {n: p.pid for n, p in enumerate(self.procs) if p is not None and p.poll() is None}
        for n, pid in self.running_pids().items():
            pids.setdefault(n, pid)
        for n, pid in sorted(pids.items()):
            try:
                os.kill(pid, signal.SIGTERM)
                stopped.append(n)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for n, pid in pids.items():
            proc = self.procs[n]
            while time.monotonic() < deadline and (
                    proc.poll() is None if proc is not None else is_own_party(pid, self.path)):
                time.sleep(0.05)
            if proc is not None and proc.poll() is None or proc is None and \
                    is_own_party(pid, self.path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if proc is not None:
                    proc.wait()
        for n in range(3):
            (self.dir / f"party-{n}.pid").unlink(missing_ok=True)
        return stopped

    def __enter__(self) -> "LocalCluster":
        return self.start() if self.cfg is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------------ users ----
    def creds(self, stem: str) -> tuple[Path, Path]:
        """(cert, key) of a client: ``owner`` (model-owner), ``user`` / ``user2`` (query-user)."""
        return self.dir / "certs" / f"{stem}.pem", self.dir / "certs" / f"{stem}.key"

    def owner(self, **kw):
        from net.client.owner import ModelOwner
        return ModelOwner(self.cfg, *(() if self.insecure else self.creds("owner")), **kw)

    def user(self, stem: str = "user", **kw):
        from net.client.user import QueryUser
        return QueryUser(self.cfg, *(() if self.insecure else self.creds(stem)), **kw)


@contextlib.contextmanager
def temporary_cluster(prefix: str, keep_dir: bool = False, **kw):
    """A tied LocalCluster in a fresh temporary directory for one command (the demos):
    started, yielded, stopped; SIGTERM ends it like Ctrl-C; the directory (certificates,
    logs) is removed unless ``keep_dir``."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = LocalCluster(d, tied=True, **kw)

    def interrupt(*_):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, interrupt)
    try:
        cluster.start()
        yield cluster
    finally:
        signal.signal(signal.SIGTERM, old_term)
        cluster.stop()
        if keep_dir:
            print(f"cluster files kept in {d}", file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)
