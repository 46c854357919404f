"""``mpc3 bench op NAME``: one kernel of the catalog (mpc3/kernels/catalog.py) on three
parties, in process or over party processes; the metric names of docs/DESIGN.md."""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from mpc3.kernels import catalog
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties

from .remote import add_peer_transport


#: Every kernel of the catalog, by the name typed after ``mpc3 bench op``.
OPS = tuple(catalog.KERNELS)


def run_op(name: str, n: int, shape, repeat: int, cfg: RingConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    inputs, ref = catalog.workload(name, n, shape, rng, cfg)
    kernel = catalog.KERNELS[name].run
    walls, parties, out = [], None, None
    for _ in range(repeat):
        parties = make_parties(cfg)
        args = [tuple(x[i] for x in inputs) for i in range(3)]
        t0 = time.perf_counter()
        out = run_parties(kernel, args, parties=parties)
        walls.append(time.perf_counter() - t0)
    errs = catalog.errors(name, inputs, out, ref, cfg)
    elems = ref.size
    per = [p.stats.bytes_sent for p in parties]
    return {
        "workload": f"op/{name}",
        "params": {"n": elems, "shape": list(shape) if name == "matmul" else None,
                   "frac": cfg.frac, "trunc": cfg.trunc, "repeat": repeat,
                   "host": platform.node(), "cpus": __import__("os").cpu_count(),
                   "load_avg_1m_at_end": __import__("os").getloadavg()[0]},
        "transport": "inproc", "net": "none", "emulation": "none",
        "wall_s": {"min": min(walls), "median": statistics.median(walls)},
        "bytes_total": sum(per), "bytes_per_party": per,
        "bytes_per_element": sum(per) / elems,
        "messages": sum(p.stats.messages for p in parties),
        "rounds": max(p.stats.rounds for p in parties),
        **errs,
    }


def print_table(result: dict) -> None:
    rows = [("workload", result["workload"]), ("elements", result["params"]["n"]),
            ("transport / net", f"{result['transport']} / {result['net']} "
                                f"(emulation {result['emulation']})"),
            ("wall_s min / median", f"{result['wall_s']['min']:.4f} / {result['wall_s']['median']:.4f}"),
            ("bytes_total", result["bytes_total"]),
            ("bytes per element", f"{result['bytes_total'] / max(result['params']['n'], 1):.2f}"),
            ("bytes_per_party", result["bytes_per_party"]), ("messages", result["messages"]),
            ("rounds", result["rounds"]), ("max_abs_err", f"{result['max_abs_err']:.3g}"),
            ("max_rel_err", f"{result['max_rel_err']:.3g}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def provenance() -> dict:
    """Which code a result comes from: the commit of the checkout this package runs from and
    whether its tracked files (benchmarks/results aside) have uncommitted changes - both
    None outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root,
                               timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "--short", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 ":!benchmarks/results") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def write_json(result: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must look like 64x512x2048, got {text!r}")
    return m, k, n


def _cmd_op(args: argparse.Namespace) -> int:
    if args.net != "none" and args.transport != "grpc":
        raise SystemExit(f"--net {args.net} runs three party processes: add --transport grpc")
    if args.transport == "grpc":       # three party processes, optionally in emulated netns
        from .remote import RemoteCluster
        with RemoteCluster(args.net, peer_transport=args.peer_transport) as rc:
            result = rc.bench_op(args.name, args.n, args.shape, args.repeat, args.trunc)
    else:
        result = run_op(args.name, args.n, args.shape, args.repeat, RingConfig(trunc=args.trunc))
    print_table(result)
    write_json(result, args.json)
    return 0


def register(bsub) -> None:
    """Add ``op`` to the ``mpc3 bench`` subcommands."""
    op = bsub.add_parser("op", help="benchmark one kernel on three in-process parties")
    op.add_argument("name", choices=OPS)
    op.add_argument("--n", type=int, default=131072, help="elements (not matmul)")
    op.add_argument("--shape", type=_parse_shape, default=(64, 512, 2048),
                    help="MxKxN for matmul (default 64x512x2048)")
    op.add_argument("--repeat", type=int, default=3)
    op.add_argument("--transport", choices=("inproc", "grpc"), default="inproc",
                    help="grpc: three party processes (mTLS) - see app/bench/remote.py")
    op.add_argument("--net", default="none",
                    help="none | lan | wan | custom:RATE_MBIT:RTT_MS (emulated; needs root "
                         "and --transport grpc)")
    add_peer_transport(op)
    op.add_argument("--trunc", choices=("exact", "prob"), default="exact")
    op.add_argument("--json", help="write the result object here")
    op.set_defaults(func=_cmd_op)
