"""mpc3 against SecretFlow SPU 0.9.5 (ABY3, 64-bit ring, 18 fractional bits, 3 processes) on the
same machine in the same run, interleaved (issues 12 and 13).

    python benchmarks/spu_compare.py [--rounds 2] [--repeat 5] [--only ffn,ln] \\
        [--spu-python PATH] [--json benchmarks/results/spu_compare.json]

Run it with mpc3's Python (``. /work/venv/bin/activate``); the SPU side runs as subprocesses of
SPU's own Python: ``--spu-python``, default ``$MPC3_SPU_PYTHON`` or ``/work/venv-spu/bin/python``
(``python3 -m venv V && V/bin/pip install spu==0.9.5``). spu is no dependency of mpc3.

For every workload (row) and each of ``--rounds`` rounds: one mpc3 invocation, then one SPU
invocation, each timing ``--repeat`` runs after its own warm-up. Per side the runs of all rounds
are pooled (min, median); ratios are mpc3 / SPU (below 1: mpc3 faster), and per round too.

mpc3 side: three party processes on 127.0.0.1 over gRPC with mTLS (``app.bench.remote``):
``mpc3 bench op NAME --transport grpc`` for kernels; for layers ``app.bench.remote.run_layer``
(``mpc3 bench layer --transport grpc`` without ``--net`` runs the three parties as threads of
one process, so it is not used here). ``wall_s`` is measured by the parties: protocol only,
shares in place, slowest party per run, after an untimed tiny warm-up run.
SPU side: ``benchmarks/spu_side.py`` (what its timing includes: see its docstring).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCHEMA = "mpc3-spu-compare/1"
DEFAULT_SPU_PYTHON = "/work/venv-spu/bin/python"
INSTALL_HINT = ("SPU is installed in a separate venv (it pins its own jax/numpy): "
                "python3 -m venv V && V/bin/pip install spu==0.9.5, then pass "
                "--spu-python V/bin/python or set MPC3_SPU_PYTHON")
SHAPES = ["--seq", "64", "--d-model", "512", "--heads", "8", "--features", "266",
          "--d-ff", "2048"]
MPC3_TIMING = ("three `mpc3 party`-style benchmark processes on 127.0.0.1, gRPC + mTLS "
               "(app.bench.remote.RemoteCluster); wall_s measured by the parties: protocol only, "
               "shares in place, slowest party per run; one untimed tiny warm-up run per fresh "
               "cluster; process start, share upload and result fetch excluded")
SPU_TIMING = ("three SPU processes (libspu.link.create_brpc on 127.0.0.1, spu.api.Runtime, "
              "ABY3/FM64/18 fractional bits, SPU defaults otherwise); per run link.barrier() then "
              "the wall time of Runtime.run(executable) with the input shares already set on "
              "the device (Runtime.set_var, untimed) and outputs left secret-shared; includes "
              "SPU's per-call parsing of the compiled executable; excludes jax tracing / SPU "
              "compilation, sharing, link setup and reveal; one untimed full-size warm-up run; "
              "slowest party per run. Bytes: the parties' 'Link details: total send bytes' "
              "from one extra run with enable_pphlo_profile (untimed), summed over parties")


@dataclass(frozen=True)
class Row:
    key: str
    title: str
    mpc3: tuple[str, ...]    # ("op", NAME, flags...) or ("layer", NAME, flags...)
    spu: str                 # spu_side.py workload
    note: str = ""
    extra: bool = False


ROWS = (
    Row("ffn", "FFN 64x512 -> 2048 -> 512, ReLU", ("layer", "ffn"), "ffn"),
    Row("relu", "ReLU, 131072 elements", ("op", "relu", "--n", "131072"), "relu"),
    Row("matmul", "secret matmul 64x512 @ 512x2048",
        ("op", "matmul", "--shape", "64x512x2048"), "matmul"),
    Row("ln", "LayerNorm 64x512", ("layer", "ln"), "ln"),
    Row("performer", "Performer ReLU attention, 8 heads, r=266", ("layer", "mha"), "performer",
        note="mpc3 has no projection-free Performer workload: its side is the whole MHA incl. "
             "projections (X W^{Q Omega}, X W^{K Omega}, X W^V, W^O), SPU's side has no "
             "projections (as in BENCHMARKS.md), so mpc3 does strictly more work here; row "
             "'mha' is the like-for-like comparison"),
    Row("mha", "Performer MHA incl. projections, 8 heads, r=266 (like for like)",
        ("layer", "mha"), "mha",
        note="both sides: Omega (and c) folded into the weights, X and weights secret"),
    Row("softmax", "softmax attention, 8 heads (extra)",
        ("layer", "softmax-attn", "--exp", "limit"), "softmax", extra=True,
        note="both max-free (exp of scores in [-8, 8]); mpc3 --exp limit, SPU's default exp"),
)
ROW_KEYS = tuple(r.key for r in ROWS)


def spu_python_path(arg: str | None) -> str:
    return arg or os.environ.get("MPC3_SPU_PYTHON") or DEFAULT_SPU_PYTHON


def check_spu_python(path: str) -> str:
    """The SPU interpreter's ``spu.__version__``; SystemExit with the install hint otherwise."""
    if not Path(path).exists():
        raise SystemExit(f"SPU python not found at {path!r}. {INSTALL_HINT}")
    r = subprocess.run([path, "-c", "import spu, jax; print(spu.__version__, jax.__version__)"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{path} cannot import spu/jax ({r.stderr.strip()[-300:]}). "
                         f"{INSTALL_HINT}")
    return r.stdout.strip()


def mpc3_cmd(row: Row, repeat: int, out: str) -> list[str]:
    kind, name, *flags = row.mpc3
    if kind == "op":
        mpc3 = str(Path(sys.executable).parent / "mpc3")
        return [mpc3, "bench", "op", name, *flags, "--transport", "grpc",
                "--repeat", str(repeat), "--json", out]
    return [sys.executable, str(HERE / "spu_compare.py"), "mpc3-layer", name, *SHAPES, *flags,
            "--repeat", str(repeat), "--json", out]


def spu_cmd(row: Row, repeat: int, out: str, spu_python: str) -> list[str]:
    return [spu_python, str(HERE / "spu_side.py"), "run", row.spu, "--repeat", str(repeat),
            "--json", out]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "")
                                                        .split(os.pathsep) if p])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_invocation(side: str, cmd: list[str], out: str, timeout: float) -> dict:
    """Run one side's command; its JSON result (``out``) plus how the invocation went."""
    load0, t0, started = os.getloadavg(), time.perf_counter(), time.strftime("%H:%M:%S")
    env = _env() if side == "mpc3" else {k: v for k, v in os.environ.items()
                                         if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                       env=env, check=False)
    info = {"cmd": shlex.join(cmd), "started": started,
            "elapsed_s": round(time.perf_counter() - t0, 2),
            "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    if r.returncode != 0 or not Path(out).exists():
        raise RuntimeError(f"{side} failed (exit {r.returncode}): {info['cmd']}\n"
                           f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return {**json.loads(Path(out).read_text()), "invocation": info}


def _stats(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "n": len(xs)}


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def summarize(row: Row, mpc3: list[dict], spu: list[dict]) -> dict:
    """One row of the report from its invocations (each with ``wall_s.runs``)."""
    m_runs = [x for r in mpc3 for x in r["wall_s"]["runs"]]
    s_runs = [x for r in spu for x in r["wall_s"]["runs"]]
    m, s = _stats(m_runs), _stats(s_runs)
    mb, sb = mpc3[-1].get("bytes_total"), spu[-1].get("bytes_total")
    return {
        "key": row.key, "title": row.title, "extra": row.extra, "note": row.note,
        "mpc3": {"workload": "bench " + " ".join(row.mpc3[:2]), "wall_s": {**m, "runs": m_runs},
                 "bytes_total": mb, "rounds": mpc3[-1].get("rounds"),
                 "messages": mpc3[-1].get("messages"),
                 "max_abs_err": max(r.get("max_abs_err", 0.0) for r in mpc3)},
        "spu": {"workload": row.spu, "computes": spu[-1].get("computes"),
                "wall_s": {**s, "runs": s_runs},
                "warmup_s": [r.get("warmup_s") for r in spu], "bytes_total": sb,
                "send_actions": spu[-1].get("send_actions"),
                "max_abs_err": max(r.get("max_abs_err", 0.0) for r in spu),
                "max_abs_ref": spu[-1].get("max_abs_ref")},
        "ratio_time_median": _ratio(m["median"], s["median"]),
        "ratio_time_min": _ratio(m["min"], s["min"]),
        "ratio_time_median_per_round": [
            _ratio(a["wall_s"]["median"], b["wall_s"]["median"]) for a, b in zip(mpc3, spu)],
        "ratio_bytes": _ratio(mb, sb),
        "mpc3_faster": m["median"] < s["median"],
    }


def host_info() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), None) if Path("/proc/meminfo").exists() else None
    return {"hostname": platform.node(), "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)), "cpu_model": model,
            "mem_total_kib": int(mem) if mem else None, "kernel": platform.release(),
            "python": platform.python_version()}


def versions(spu_version: str) -> dict:
    def git(*a):
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,
                           check=False)
        return r.stdout.strip() if r.returncode == 0 else None
    spu, _, jax = spu_version.partition(" ")
    return {"mpc3_commit": git("rev-parse", "HEAD"),
            "mpc3_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "mpc3_branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "spu": spu or None, "spu_jax": jax or None}


Runner = Callable[[str, list, str, float], dict]


def run(a, runner: Runner = run_invocation, spu_version: str | None = None) -> dict:
    """Interleaved measurement of the selected rows; returns the report (also written)."""
    rows = [r for r in ROWS if r.key in a.only]
    started, load_start = time.strftime("%Y-%m-%dT%H:%M:%S%z"), os.getloadavg()
    report_rows, commands = [], []
    with tempfile.TemporaryDirectory(prefix="spu_compare_") as tmp:
        for row in rows:
            m_res, s_res = [], []
            for rnd in range(a.rounds):
                for side, res in (("mpc3", m_res), ("spu", s_res)):
                    out = str(Path(tmp) / f"{row.key}_{side}_{rnd}.json")
                    cmd = (mpc3_cmd(row, a.repeat, out) if side == "mpc3"
                           else spu_cmd(row, a.repeat, out, a.spu_python))
                    r = runner(side, cmd, out, a.timeout)
                    res.append(r)
                    commands.append({"row": row.key, "side": side, "round": rnd,
                                     **r.get("invocation", {"cmd": shlex.join(cmd)})})
                    w = r["wall_s"]
                    print(f"  {row.key:9s} round {rnd} {side:4s} median {w['median']:.4f} s "
                          f"min {w['min']:.4f} s  bytes {r.get('bytes_total')}", flush=True)
            report_rows.append(summarize(row, m_res, s_res))
    load_end = os.getloadavg()
    cpus = len(os.sched_getaffinity(0))
    overloaded = max(load_start[0], load_end[0]) > cpus
    report = {
        "schema": SCHEMA, "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {**host_info(), "loadavg_start": [round(x, 2) for x in load_start],
                 "loadavg_end": [round(x, 2) for x in load_end],
                 "overloaded": overloaded},
        "versions": versions(spu_version or ""),
        "settings": {"rounds": a.rounds, "repeat": a.repeat,
                     "order": "per row: mpc3, SPU, mpc3, SPU, ... (rounds times)",
                     "spu": {"protocol": "ABY3", "field": "FM64", "fxp_fraction_bits": 18,
                             "parties": 3, "python": a.spu_python},
                     "mpc3": {"transport": "grpc+mTLS, 3 party processes, 127.0.0.1",
                              "frac": 18, "ring": "Z_2^64", "truncation": "exact (default)"}},
        "timing": {"mpc3": MPC3_TIMING, "spu": SPU_TIMING},
        "notes": [(f"1-minute load average above the {cpus} usable CPUs: other jobs shared "
                   "the CPUs, times of both sides are inflated and the ratios are not those "
                   "of a quiet machine (each command's load average is under commands)")
                  ] if overloaded else [],
        "rows": report_rows, "commands": commands,
        "harness": shlex.join([sys.executable, *sys.argv]),
    }
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


def table(report: dict) -> str:
    head = ("| workload | mpc3 median s | SPU median s | time ratio (median / min) | "
            "bytes mpc3 / SPU (MB) | bytes ratio |")
    lines = [head, "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        mb, sb = r["mpc3"]["bytes_total"], r["spu"]["bytes_total"]
        mb_s = f"{mb / 1e6:.2f}" if mb is not None else "-"
        sb_s = f"{sb / 1e6:.2f}" if sb is not None else "-"
        rb = f"{r['ratio_bytes']:.2f}" if r["ratio_bytes"] is not None else "-"
        lines.append(f"| {r['title']} | {r['mpc3']['wall_s']['median']:.3f} | "
                     f"{r['spu']['wall_s']['median']:.3f} | {r['ratio_time_median']:.2f} / "
                     f"{r['ratio_time_min']:.2f} | {mb_s} / {sb_s} | {rb} |")
    h = report["host"]
    lines.append(f"\nload average start {h['loadavg_start']} end {h['loadavg_end']}, "
                 f"{h['cpus_usable']} usable CPUs" + (" - OVERLOADED" if h["overloaded"] else ""))
    return "\n".join(lines)


def _only(text: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in keys if k not in ROW_KEYS]
    if bad or not keys:
        raise argparse.ArgumentTypeError(f"unknown rows {bad}; choose from {','.join(ROW_KEYS)}")
    return keys


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="mpc3/SPU alternations per row")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per invocation")
    ap.add_argument("--only", type=_only, default=ROW_KEYS,
                    help=f"comma-separated rows (default all: {','.join(ROW_KEYS)})")
    ap.add_argument("--spu-python", default=None,
                    help=f"SPU's interpreter (default $MPC3_SPU_PYTHON or {DEFAULT_SPU_PYTHON})")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per invocation")
    ap.add_argument("--json", default=str(HERE / "results" / "spu_compare.json"))
    a = ap.parse_args(argv)
    a.spu_python = spu_python_path(a.spu_python)
    if a.rounds < 1 or a.repeat < 1:
        ap.error("--rounds and --repeat must be >= 1")
    return a


def mpc3_layer(argv) -> int:
    """``spu_compare.py mpc3-layer NAME ...``: one layer on three party processes (loopback)."""
    ap = argparse.ArgumentParser(prog="spu_compare.py mpc3-layer")
    ap.add_argument("name")
    for flag in ("--seq", "--d-model", "--heads", "--features", "--d-ff", "--repeat"):
        ap.add_argument(flag, type=int, required=flag != "--repeat", default=3)
    ap.add_argument("--exp", default="poly")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    from app.bench.remote import run_layer
    r = run_layer(a.name, net="none", seq=a.seq, d_model=a.d_model, heads=a.heads,
                  features=a.features, d_ff=a.d_ff, layers=1, repeat=a.repeat, exp=a.exp)
    r["params"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    Path(a.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["mpc3-layer"]:
        return mpc3_layer(argv[1:])
    a = parse_args(argv)
    spu_version = check_spu_python(a.spu_python)
    print(f"mpc3 vs SPU {spu_version} ({a.spu_python}); rows {','.join(a.only)}; "
          f"{a.rounds} rounds x {a.repeat} runs; load {os.getloadavg()}", flush=True)
    report = run(a, spu_version=spu_version)
    print(table(report))
    if a.json:
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
