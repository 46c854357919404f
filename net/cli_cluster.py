"""``mpc3`` subcommands for running a cluster and using it.

    mpc3 keys --dir D                         CA + party and client certificates
    mpc3 party --config C --id N              run party N (foreground)
    mpc3 cluster up --dir D                   three local parties; prints the config path
    mpc3 cluster down --dir D                 stop them
    mpc3 status --config C                    links, models and jobs of every party
    mpc3 share-model WEIGHTS --config C --model-id ID
    mpc3 models --config C [--delete ID]      list (checking the parties agree) / delete
    mpc3 infer --config C --model-id ID --input X.npy --output Y.npy

Every error prints one line and exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import config as cconf
from . import keys

INSECURE_FLAG = "--insecure-plaintext-for-local-dev"
_REPO = Path(__file__).resolve().parent.parent


def _add_insecure(p: argparse.ArgumentParser) -> None:
    p.add_argument(INSECURE_FLAG, dest="insecure", action="store_true",
                   help="DANGER: no TLS and no authentication; local development only")


def _add_client_creds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="cluster TOML")
    p.add_argument("--cert", help="client certificate (default: from [clients.ROLE])")
    p.add_argument("--key", help="client private key")
    _add_insecure(p)


def _load(args) -> cconf.ClusterConfig:
    cfg = cconf.load(args.config, insecure_flag=getattr(args, "insecure", False))
    if not cfg.tls:
        print("WARNING: INSECURE PLAINTEXT MODE - no TLS, no authentication; local "
              "development only", file=sys.stderr)
    return cfg


def register(sub) -> None:
    keys.register(sub)

    p = sub.add_parser("party", help="run one MPC party process")
    p.add_argument("--config", required=True)
    p.add_argument("--id", type=int, required=True, choices=(0, 1, 2))
    p.add_argument("--log-level", default="INFO")
    _add_insecure(p)
    p.set_defaults(func=_cmd_party)

    p = sub.add_parser("cluster", help="start/stop three local parties")
    csub = p.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="generate certs + config, start three parties, wait")
    up.add_argument("--dir", required=True)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--base-port", type=int, default=0, help="0 = free ephemeral ports")
    up.add_argument("--peer-timeout", type=float, default=30.0)
    up.add_argument("--wait", type=float, default=60.0, help="seconds to wait for health")
    _add_insecure(up)
    up.set_defaults(func=_cmd_up)
    down = csub.add_parser("down", help="stop the parties started by 'cluster up'")
    down.add_argument("--dir", required=True)
    down.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="health, links, models and jobs of every party")
    _add_client_creds(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("models", help="list the models on every party, or delete one")
    p.add_argument("--delete", metavar="MODEL_ID", help="delete this model (model owner)")
    _add_client_creds(p)
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("share-model", help="secret-share a model's MPC weights to the parties")
    p.add_argument("weights", help="model .npz (protocols/model.py format)")
    p.add_argument("--model-id", required=True)
    p.add_argument("--no-fold-omega", action="store_true",
                   help="share W^Q, W^K and Omega separately instead of W Omega")
    p.add_argument("--permit", metavar="COMPUTATIONS",
                   help="comma-separated computations query users may run (default: the "
                   "model's own inference, 'translate'; 'encoder' also returns encoder "
                   "outputs, an intermediate value)")
    _add_client_creds(p)
    p.set_defaults(func=_cmd_share)

    p = sub.add_parser("infer", help="run a job on a shared model; writes the output")
    p.add_argument("--model-id", required=True)
    p.add_argument("--input", required=True, help=".npy of the embedded input X")
    p.add_argument("--output", required=True, help=".npy to write the output to")
    p.add_argument("--kind", default="encoder", help="job kind (default: encoder)")
    p.add_argument("--params", default="{}", help="public job parameters (JSON object)")
    _add_client_creds(p)
    p.set_defaults(func=_cmd_infer)


# --------------------------------------------------------------------------- party ----
def _cmd_party(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = _load(args)
    from .server import serve
    return serve(cfg, args.id)


# ------------------------------------------------------------------------- cluster ----
def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pids(d: Path) -> dict[int, int]:
    out = {}
    for n in range(3):
        f = d / f"party-{n}.pid"
        if f.exists():
            out[n] = int(f.read_text().strip())
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def write_local_config(d: Path, host: str = "127.0.0.1", base_port: int = 0,
                       peer_timeout: float = 30.0, insecure: bool = False,
                       limits: dict | None = None) -> Path:
    """Certificates (unless insecure) and ``cluster.toml`` for three parties on one host."""
    d.mkdir(parents=True, exist_ok=True)
    if not insecure and not (d / "certs" / "ca.key").exists():
        keys.generate(d / "certs", hosts=("localhost", "127.0.0.1", host))
    ports = [base_port + n if base_port else _free_port(host) for n in range(3)]
    cluster = {"peer_timeout_s": peer_timeout, "job_timeout_s": 600.0, "frac": 18}
    if insecure:
        cluster[cconf.INSECURE_KEY] = True
    else:
        cluster["ca"] = "certs/ca.pem"
    parties = []
    for n in range(3):
        p = {"id": n, "address": f"{host}:{ports[n]}", "data_dir": f"data/party-{n}"}
        if not insecure:
            p.update(cert=f"certs/party-{n}.pem", key=f"certs/party-{n}.key")
        parties.append(p)
    clients = {} if insecure else {
        "model-owner": {"cert": "certs/owner.pem", "key": "certs/owner.key"},
        "query-user": {"cert": "certs/user.pem", "key": "certs/user.key"}}
    path = d / "cluster.toml"
    path.write_text(cconf.render(parties, cluster, clients, limits))
    return path


def start_party(cfg_path: Path, n: int, log_path: Path, insecure: bool = False,
                bench: bool = False) -> subprocess.Popen:
    """Start ``mpc3 party`` (or, with ``bench``, the benchmark/test party process
    :mod:`app.bench_party`) as a detached process logging to ``log_path``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "app.bench_party" if bench else "net.cli"] + \
        ([] if bench else ["party"]) + ["--config", str(cfg_path), "--id", str(n)]
    if insecure:
        argv.append(INSECURE_FLAG)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def wait_healthy(cfg: cconf.ClusterConfig, timeout: float, procs=None) -> list[str]:
    """Poll the parties' Status until all three have both links up; returns problems left."""
    from .client import ClusterError, ModelOwner, QueryUser
    from .proto import mpc3_pb2 as pb
    role_cls = QueryUser if "query-user" in cfg.clients or not cfg.tls else ModelOwner
    deadline = time.monotonic() + timeout
    problems = ["not checked"]
    with role_cls(cfg, rpc_timeout=2.0) as cl:
        while time.monotonic() < deadline:
            problems = []
            for n in range(3):
                if procs and procs[n].poll() is not None:
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


def _cmd_up(args) -> int:
    d = Path(args.dir).resolve()
    running = {n: p for n, p in _pids(d).items() if _alive(p)}
    if running:
        raise RuntimeError(f"a cluster is already running in {d} (pids "
                           f"{sorted(running.values())}); run 'mpc3 cluster down --dir {d}'")
    path = write_local_config(d, args.host, args.base_port, args.peer_timeout, args.insecure)
    cfg = cconf.load(path)
    procs = []
    for n in range(3):
        proc = start_party(path, n, d / f"party-{n}.log", args.insecure)
        (d / f"party-{n}.pid").write_text(f"{proc.pid}\n")
        procs.append(proc)
    problems = wait_healthy(cfg, args.wait, procs)
    if problems:
        _stop(d)
        raise RuntimeError("cluster did not become healthy: " + "; ".join(problems)
                           + f" (see {d}/party-N.log)")
    print(path)
    return 0


def _stop(d: Path, grace: float = 5.0) -> list[int]:
    stopped = []
    for n, pid in _pids(d).items():
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            stopped.append(n)
        (d / f"party-{n}.pid").unlink(missing_ok=True)
    return stopped


def _cmd_down(args) -> int:
    d = Path(args.dir).resolve()
    if not _pids(d):
        raise RuntimeError(f"no cluster pid files in {d}")
    stopped = _stop(d)
    print(f"stopped parties {stopped}" if stopped else "no party was running")
    return 0


# ------------------------------------------------------------------------- clients ----
def _cmd_status(args) -> int:
    from .client import ClusterError, ModelOwner, QueryUser
    from .proto import mpc3_pb2 as pb
    cfg = _load(args)
    cls = QueryUser if (args.cert or "query-user" in cfg.clients or not cfg.tls) else ModelOwner
    bad = 0
    with cls(cfg, args.cert, args.key, rpc_timeout=5.0) as cl:
        for n in range(3):
            addr = cfg.dial_address(None, n)
            try:
                st = cl._call(n, "Status", pb.Empty(), 5.0)
            except ClusterError as exc:
                print(f"party {n} {addr}: DOWN ({exc})")
                bad += 1
                continue
            links = sorted(st.links_up)
            ok = len(links) == 2
            bad += not ok
            print(f"party {n} {addr}: {'OK' if ok else 'DEGRADED'} links={links} "
                  f"models={st.models} jobs_running={st.jobs_running} "
                  f"{'mTLS' if st.tls else 'PLAINTEXT'}")
    return 1 if bad else 0


def _cmd_models(args) -> int:
    from .client import ModelOwner, QueryUser
    cfg = _load(args)
    if args.delete:
        with ModelOwner(cfg, args.cert, args.key) as owner:
            owner.delete(args.delete)
        print(f"model {args.delete} deleted from the three parties")
        return 0
    cls = QueryUser if (args.cert or "query-user" in cfg.clients or not cfg.tls) else ModelOwner
    with cls(cfg, args.cert, args.key) as cl:
        per_party = [{m.model_id: m for m in ms} for ms in cl.list_models()]
    bad = 0
    for model_id in sorted(set().union(*per_party)):
        infos = [p.get(model_id) for p in per_party]
        ok = all(i is not None and i.complete and i.upload_id == infos[0].upload_id
                 for i in infos)
        bad += not ok
        first = next(i for i in infos if i is not None)
        print(f"{model_id}: {'OK' if ok else 'INCONSISTENT'} upload={first.upload_id} "
              f"owner={first.owner} tensors={len(first.tensors)} bytes/party="
              f"{first.total_bytes} on parties "
              f"{[n for n, i in enumerate(infos) if i is not None and i.complete]}")
    return 1 if bad else 0


def _cmd_share(args) -> int:
    from app.owner import share_transformer
    from protocols.model import load_model
    cfg = _load(args)
    mcfg, weights, _user = load_model(args.weights)   # user-side tensors are never shared
    permit = [p for p in args.permit.split(",") if p] if args.permit is not None else None
    t0 = time.monotonic()
    upload_id = share_transformer(cfg, args.model_id, mcfg, weights, permit, args.cert,
                                  args.key, source=Path(args.weights).name,
                                  fold_omega=not args.no_fold_omega)
    print(f"model {args.model_id}: {weights.n_params()} parameters shared to 3 parties "
          f"(upload {upload_id}, verified) in {time.monotonic() - t0:.1f} s")
    return 0


def _cmd_infer(args) -> int:
    from .client import QueryUser
    cfg = _load(args)
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise ValueError(f"--params: {exc}") from None
    x = np.load(args.input, allow_pickle=False)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{args.input}: expected a numeric array, got dtype {x.dtype}")
    t0 = time.monotonic()
    with QueryUser(cfg, args.cert, args.key) as user:
        out = user.run(args.model_id, args.kind, {"X": x.astype(np.float64)}, params)
    y = out["Y"] if "Y" in out else (next(iter(out.values())) if len(out) == 1 else None)
    if y is None:
        raise RuntimeError(f"job returned several outputs {sorted(out)} and none named 'Y'")
    np.save(args.output, y)
    print(f"{args.output}: output {y.shape} in {time.monotonic() - t0:.2f} s")
    return 0
