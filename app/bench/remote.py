"""Benchmarks over the network: three real party processes (gRPC, mTLS), optionally emulated.

    with RemoteCluster("wan") as rc:          # "none" = loopback, or lan | wan | custom:R:RTT
        rc.network                            # {"net", "emulation", "links": [verify_link...]}
        rc.bench_layer("mha", layer_config(seq=64), repeat=3)
        rc.bench_op("relu", n=131072, repeat=3)

:class:`RemoteCluster` generates certificates and a cluster config in a temporary directory
and starts ``mpc3 party`` three times: on 127.0.0.1 (``net="none"``) or each inside its own
network namespace of a :class:`net.peer.emulate.Emulation` (parties dial their peers through the
emulation's dial addresses, so every protocol byte crosses the shaped, delayed links). The
links are verified first (RTT, throughput; printed and kept in every result). The benchmark
client runs in the root namespace and reaches each party over an extra *unshaped* veth pair
(10.78.x.0/30) that carries only uploads, job submission and result fetching - never
party-to-party traffic.

A bench call uploads random model shares as the model owner (only the tensors the workload
reads), submits a ``bench_layer``/``bench_op`` job (:mod:`protocols.jobs.diagnostic`) as the query
user, and returns a result with DESIGN.md's metric names: ``wall_s`` measured on the parties
(protocol only, shares in place; per run the slowest party, min and median over runs),
``bytes_total``/``bytes_per_party``/``messages``/``rounds`` counted by the parties'
communicators, ``max_abs_err`` against the float64 reference, plus ``time_model``:
``compute_s + rounds * one_way_s + max_party_bytes / 2 / rate`` (each party sends on two links
in parallel; ``compute_s`` is supplied by the caller, e.g. the same workload with
``net="none"``).

Everything (parties, namespaces, relays, temp dir) is removed on exit, on exceptions and on
Ctrl-C. The parties are benchmark processes (:mod:`app.bench_party`): they run the diagnostic
job kinds ``bench_layer`` and ``bench_op``.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from protocols.jobs import workloads

REPO = Path(__file__).resolve().parent.parent
MGMT_NET = "10.78"          # client <-> party k management link: 10.78.<slot>.{1,2}/30




def layer_config(seq: int = 64, d_model: int = 512, heads: int = 8, features: int = 266,
                 d_ff: int = 2048, layers: int = 6, attn_norm: str = "const",
                 attn_c: float | None = None):
    """The ModelConfig of ``mpc3 bench layer`` (Privformer Table 2 defaults)."""
    from protocols import model as M
    c = attn_c if attn_c is not None else 1.0 / (features * seq)
    return M.ModelConfig(d_model=d_model, n_heads=heads, d_head=d_model // heads,
                         n_features=features, d_ff=d_ff, n_enc_layers=layers,
                         n_dec_layers=layers, attn_c=c, attn_norm=attn_norm,
                         norm_first=False, src_vocab=2, tgt_vocab=2, max_len=seq).validate()


def time_model(compute_s: float | None, rounds: int, bytes_per_party, net: dict) -> dict:
    """compute + rounds x one-way latency + bytes / bandwidth (seconds)."""
    prof = net.get("profile")
    if not prof:
        return {}
    lat = rounds * prof["rtt_ms"] / 2e3
    bw = max(bytes_per_party) / 2 * 8 / (prof["rate_mbit"] * 1e6)
    out = {"latency_s": lat, "bandwidth_s": bw, "compute_s": compute_s}
    if compute_s is not None:
        out["total_s"] = compute_s + lat + bw
    return out


def _sh(*cmd) -> None:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {r.stderr.strip()}")


def add_peer_transport(parser) -> None:
    """``--peer-transport``: how the benchmark's party processes link to each other."""
    parser.add_argument("--peer-transport", choices=("tls", "grpc"), default="tls",
                        help="party processes' peer links: TLS sockets (default) or gRPC "
                             "streams (net.config peer_transport)")


class RemoteCluster:
    """Three party processes on loopback or in an emulated network (context manager)."""

    def __init__(self, net: str = "none", verify_seconds: float = 1.0, quiet: bool = False,
                 job_timeout_s: float = 4 * 3600.0, peer_timeout_s: float = 900.0,
                 peer_transport: str = "tls", insecure: bool = False,
                 security: str = "semi-honest") -> None:
        self.net = net.strip().lower()
        self.security = security             # the parties' [cluster] security mode
        self.peer_transport = peer_transport
        # development plaintext, to measure what TLS costs: the results keep peer_transport
        # (the socket links, "tls", or gRPC streams) and say tls: false
        self.insecure = insecure
        self.verify_seconds = verify_seconds
        self.quiet = quiet
        self.job_timeout_s = job_timeout_s
        self.peer_timeout_s = peer_timeout_s
        self.emu = None
        self.dir: Path | None = None
        self.procs: list[subprocess.Popen] = []
        self.network: dict = {"net": "none", "emulation": "none", "transport": "grpc",
                              "peer_transport": peer_transport, "tls": not insecure}
        self.cfg = None
        self.cluster = None
        self._mgmt: list[str] = []
        self._counter = 0
        self._warm: set[str] = set()
        self._closed = True

    # ------------------------------------------------------------------ lifecycle ----
    def __enter__(self) -> "RemoteCluster":
        self._closed = False
        atexit.register(self.close)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def _start(self) -> None:
        from ..localcluster import LocalCluster, free_ports
        self.dir = Path(tempfile.mkdtemp(prefix="mpc3-bench-"))
        launch = None
        if self.net == "none":
            ports = free_ports(6)
            parties = [{"address": f"127.0.0.1:{ports[n]}",
                        "peer_address": f"127.0.0.1:{ports[3 + n]}"} for n in range(3)]
        else:
            self._start_emulation()
            parties = []
            for n in range(3):    # clients use the management link; peers the emulated one
                port, peer_port = self.emu.port(n), self.emu.peer_port(n)
                parties.append({"address": f"{self._mgmt_ip(n)}:{port}",
                                "listen": f"0.0.0.0:{port}", "dial": self.emu.peers(n),
                                "peer_address": self.emu.listen_addr(n, peer_port),
                                "peer_listen": f"0.0.0.0:{peer_port}",
                                "peer_dial": self.emu.peers(n, self.emu.peer_port)})
            launch = lambda n, argv, **kw: self.emu.run_in(n, argv, **kw)  # noqa: E731
        self.cluster = LocalCluster(self.dir, bench=True, log_level="WARNING", launch=launch,
                                    tied=True, insecure=self.insecure,
                                    parties=parties, peer_timeout=self.peer_timeout_s,
                                    job_timeout=self.job_timeout_s,
                                    peer_transport=self.peer_transport,
                                    limits={"running_jobs": 2}, security=self.security)
        try:
            self.cluster.start()          # START_WAIT_S: a cold kernel cache compiles first
        except RuntimeError as exc:
            logs = "\n".join((self.dir / f"party-{n}.log").read_text()[-2000:]
                             for n in range(3) if (self.dir / f"party-{n}.log").exists())
            raise RuntimeError(f"{exc}\n{logs}") from None
        self.cfg = self.cluster.cfg
        self.procs = self.cluster.procs

    def _start_emulation(self) -> None:
        from net.peer.emulate import Emulation, verify_link
        self.emu = Emulation(self.net).__enter__()
        prof = self.emu.profile
        self._log(f"[net] {prof.name}: {prof.rate_mbit} Mbit/s, {prof.rtt_ms} ms RTT, "
                  f"emulation {self.emu.emulation}")
        links = [verify_link(self.emu, i, j, seconds=self.verify_seconds, pings=20,
                             quiet=self.quiet) for i, j in ((0, 1), (1, 2), (2, 0))]
        self.network = {"net": prof.name, "emulation": self.emu.emulation, "transport": "grpc",
                        "peer_transport": self.peer_transport, "tls": not self.insecure,
                        "profile": {"rate_mbit": prof.rate_mbit, "rtt_ms": prof.rtt_ms},
                        "links": links}
        base = (os.getpid() % 80) * 3
        for n in range(3):            # unshaped client path: root ns <-> party n's ns
            host_dev = f"m3c{os.getpid() % 100000}x{n}"
            _sh("ip", "link", "add", host_dev, "type", "veth", "peer", "name", "mgmt",
                "netns", self.emu.ns(n))
            self._mgmt.append(host_dev)
            _sh("ip", "addr", "add", f"{MGMT_NET}.{base + n}.1/30", "dev", host_dev)
            _sh("ip", "link", "set", host_dev, "up")
            _sh("ip", "-n", self.emu.ns(n), "addr", "add", f"{MGMT_NET}.{base + n}.2/30",
                "dev", "mgmt")
            _sh("ip", "-n", self.emu.ns(n), "link", "set", "mgmt", "up")

    def _mgmt_ip(self, n: int) -> str:
        return f"{MGMT_NET}.{(os.getpid() % 80) * 3 + n}.2"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.cluster is not None:
            self.cluster.stop()
        for dev in self._mgmt:
            subprocess.run(["ip", "link", "del", dev], capture_output=True)
        if self.emu is not None:
            self.emu.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    @property
    def alive(self) -> bool:
        """All three party processes still run (False after Ctrl-C / SIGTERM tore them down)."""
        return not self._closed and all(p.poll() is None for p in self.procs)

    def creds(self, stem: str) -> tuple[Path, Path]:
        """(cert, key) of a client: ``owner`` (model-owner) or ``user`` (query-user)."""
        return self.dir / "certs" / f"{stem}.pem", self.dir / "certs" / f"{stem}.key"

    # ------------------------------------------------------------------- running ----
    def _run_job(self, kind: str, model: dict, extra_frac: dict, inputs: dict, params: dict,
                 encoded_model: bool = False) -> tuple[list[dict], np.ndarray]:
        from net.client.outputs import reconstruct
        pairs = self.run_job(kind, model, extra_frac, inputs, params, encoded_model)
        stats = reconstruct([{"s": p["stats"]} for p in pairs])["s"]
        return [{"Y": p["Y"]} for p in pairs], stats.astype(np.int64)

    def run_job(self, kind: str, model: dict, extra_frac: dict, inputs: dict, params: dict,
                encoded_model: bool = False) -> list[dict]:
        """Upload ``model`` (plaintext tensors, shared here) as a bench model, run one
        diagnostic job on it, delete it: the three parties' output pairs."""
        from net.client.owner import ModelOwner
        from net.client.user import QueryUser
        self._counter += 1
        model_id = f"bench-{os.getpid()}-{self._counter}"
        with ModelOwner(self.cfg, rpc_timeout=600) as owner:
            owner.upload(model_id, model, public_meta={"bench": kind}, encoded=encoded_model,
                         extra_frac=extra_frac)
        try:
            with QueryUser(self.cfg, rpc_timeout=600) as user:
                job = user.submit(model_id, kind, inputs, params)
                user.wait(job, timeout=self.job_timeout_s + 60)
                pairs = user.fetch_pairs(job)
        finally:
            with ModelOwner(self.cfg, rpc_timeout=600) as owner:
                owner.delete(model_id)
        return pairs

    def _metrics(self, stats: np.ndarray) -> dict:
        """(3, 4, R) [party][wall_ns, bytes, messages, rounds][run] -> DESIGN.md metrics."""
        walls = stats[:, 0, :].max(axis=0) / 1e9          # slowest party per run
        per_party = stats[:, 1, 0].tolist()
        return {**self.network,
                "wall_s": {"min": float(walls.min()), "median": float(statistics.median(walls)),
                           "runs": walls.tolist()},
                "bytes_total": int(sum(per_party)), "bytes_per_party": per_party,
                "messages": int(stats[:, 2, 0].sum()), "rounds": int(stats[:, 3, 0].max())}

    def _warmup(self, key: str, run) -> None:
        """The first run of a workload in a fresh party process pays one-off costs (loading
        numba's cache, lazy imports, allocator growth: 0.1 s -> 3 s for LayerNorm); run it
        once at a tiny size, untimed, before the measured job."""
        if key not in self._warm:
            self._warm.add(key)
            run()

    def bench_layer(self, name: str, cfg, batch: int = 1, repeat: int = 1, fold: bool = True,
                    block: int | None = None, exp: str = "poly", seed: int = 0,
                    warmup: bool = True) -> dict:
        """One ``mpc3 bench layer`` workload on the cluster (random weights, seed ``seed``)."""
        if warmup:
            tiny = layer_config(seq=4, d_model=8, heads=2, features=4, d_ff=8, layers=1)
            self._warmup(f"layer/{name}", lambda: self.bench_layer(
                name, tiny, fold=fold, block=None, exp=exp, warmup=False))
        from mpc3 import ring
        from protocols import model as M
        from protocols.layers.secure_model import plain_tensors
        w = M.random_weights(cfg, seed=seed)
        inputs, ref = workloads.layer_case(name, cfg, w, batch, np.random.default_rng(seed + 1),
                                            fold=fold, exp=exp)
        pre = workloads.model_prefixes(name)
        layout = {k: v for k, v in plain_tensors(cfg, w, fold_omega=fold).items()
                  if k.startswith(pre)} if pre else {"unused": (np.zeros(1), 0)}
        params = {"workload": name, "config": cfg.to_dict(), "repeat": repeat, "block": block,
                  "exp": exp}
        outs, stats = self._run_job(
            "bench_layer", {k: t for k, (t, _) in layout.items()},
            {k: e for k, (_, e) in layout.items() if e},
            dict(zip(workloads.layer_inputs(name), inputs)), params)
        from net.client.outputs import reconstruct
        got = ring.decode(reconstruct(outs)["Y"], self.cfg.frac)
        err = float(np.max(np.abs(got - ref)))
        return {"workload": f"layer/{name}",
                "params": {"seq": cfg.max_len, "d_model": cfg.d_model, "heads": cfg.n_heads,
                           "features": cfg.n_features, "d_ff": cfg.d_ff,
                           "layers": cfg.n_enc_layers, "batch": batch, "repeat": repeat,
                           "fold": fold, "block": block, "exp": exp, "attn_c": cfg.attn_c,
                           "attn_norm": cfg.attn_norm, "frac": self.cfg.frac, "seed": seed},
                **self._metrics(stats), "max_abs_err": err,
                "max_rel_err": err / max(float(np.max(np.abs(ref))), 1e-300)}

    def bench_op(self, name: str, n: int = 131072, shape=(64, 512, 2048), repeat: int = 1,
                 trunc: str = "exact", seed: int = 0, warmup: bool = True) -> dict:
        """One ``mpc3 bench op`` kernel on the cluster (operands uploaded as model shares)."""
        if warmup:
            self._warmup(f"op/{name}/{trunc}", lambda: self.bench_op(
                name, 64, (4, 8, 4), trunc=trunc, warmup=False))
        from mpc3.kernels import catalog
        from mpc3.party import RingConfig
        from mpc3.shares import AShare
        from mpc3.sharing import reveal
        from mpc3.shares import BShare
        from protocols.jobs.diagnostic import OPS
        if name not in OPS:
            raise ValueError(f"op {name!r} is not available over the network "
                             f"(choose from {', '.join(OPS)})")
        rng = np.random.default_rng(seed)
        operands, ref = catalog.workload(name, n, shape, rng, RingConfig(trunc=trunc))
        model = {f"in{i}": reveal(s) for i, s in enumerate(operands)}
        params = {"op": name, "repeat": repeat, "trunc": trunc}
        outs, stats = self._run_job("bench_op", model, {}, {"X": np.zeros(1)}, params,
                                    encoded_model=True)
        bits = catalog.KERNELS[name].output == "bit"
        out = [BShare(o["Y"].a, o["Y"].b, int(ref.size)) if bits else
               AShare(o["Y"].a, o["Y"].b) for o in outs]
        cfg = RingConfig(trunc=trunc)
        errs = catalog.errors(name, operands, out, ref, cfg)
        return {"workload": f"op/{name}",
                "params": {"n": int(ref.size), "shape": list(shape) if name == "matmul" else None,
                           "frac": cfg.frac, "trunc": trunc, "repeat": repeat, "seed": seed},
                **self._metrics(stats), "bytes_per_element": int(stats[:, 1, 0].sum()) / ref.size,
                **errs}


def run_layer(name: str, net: str = "none", **kw) -> dict:
    """Helper for ``mpc3 bench layer --net/--transport grpc``: ``kw`` are layer_config's
    arguments plus bench_layer's (batch, repeat, fold, block, exp, seed)."""
    import inspect
    cfg_keys = set(inspect.signature(layer_config).parameters)
    cfg = layer_config(**{k: v for k, v in kw.items() if k in cfg_keys})
    with RemoteCluster(net) as rc:
        return rc.bench_layer(name, cfg, **{k: v for k, v in kw.items() if k not in cfg_keys})


def main(argv=None) -> int:
    """``python -m app.bench.remote layer|op NAME --net ...`` (prints the JSON result)."""
    import argparse
    from ..localcluster import INSECURE_FLAG
    ap = argparse.ArgumentParser(prog="python -m app.bench.remote")
    ap.add_argument("kind", choices=("layer", "op"))
    ap.add_argument("name")
    ap.add_argument("--net", default="none")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(INSECURE_FLAG, dest="insecure", action="store_true",
                    help="parties and clients without TLS (development only: shows what TLS "
                         "costs)")
    a = ap.parse_args(argv)
    with RemoteCluster(a.net, insecure=a.insecure) as rc:
        if a.kind == "layer":
            r = rc.bench_layer(a.name, layer_config(seq=a.seq, d_model=a.d_model,
                                                    layers=a.layers), a.batch, a.repeat)
        else:
            r = rc.bench_op(a.name, a.n, repeat=a.repeat)
    print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
