"""Where the CPU of a round goes: three benchmark party processes (:mod:`app.bench.remote`,
loopback or an emulated network) run one kernel ``--repeat`` times (``bench_op``), and the CPU
time of every thread of every party (by its OS name, :func:`app.bench_party.name_os_threads`)
and of the emulation's relay processes is read from /proc before and after.

    python benchmarks/thread_cpu.py mult --n 1 --repeat 1000
    python benchmarks/thread_cpu.py mult --n 1 --repeat 1000 --net lan

Prints, per party, CPU milliseconds per round for each thread name, the relays' total and
the wall time; ``--json`` writes the same. (A layer benchmark is not offered: each
``bench_layer`` call uploads the model's shares, whose CPU would be counted too.)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bench.remote import RemoteCluster  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: str, tid: str | None) -> tuple[str, int]:
    """(name, CPU ticks) of a thread, or of the whole process (tid None: its live and
    ended threads)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read_text()
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    f = stat.rsplit(")", 1)[1].split()
    return comm, int(f[11]) + int(f[12])


def snapshot() -> dict[str, dict]:
    """{pid: {"kind": "party N" | "relay", tid: (thread name, cpu ticks), ...}} of the
    benchmark party and relay processes."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if " _relay " in cmd:
                kind = "relay"
            elif "app.bench_party" in cmd:
                kind = "party " + cmd.split("--id ")[1].split()[0]
            else:
                continue
            out[pid] = {"kind": kind, "process": _cpu(pid, None)[1]} | {
                t: _cpu(pid, t) for t in os.listdir(f"/proc/{pid}/task")}
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return out


def delta(a: dict, b: dict) -> dict[str, dict[str, float]]:
    """CPU seconds per process kind and thread name between two snapshots; threads that
    ended in between (a job's own thread) count as "(ended threads)": the process's total
    less its live threads'."""
    out: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.Counter())
    for pid, threads in b.items():
        kind, live = threads["kind"], 0.0
        for tid, val in threads.items():
            if tid in ("kind", "process"):
                continue
            name, ticks = val
            before = a.get(pid, {}).get(tid, (name, 0))[1]
            live += (ticks - before) / TICK
            out[kind]["relays" if kind == "relay" else name] += (ticks - before) / TICK
        total = (threads["process"] - a.get(pid, {}).get("process", threads["process"])) / TICK
        if kind != "relay" and total > live:
            out[kind]["(ended threads)"] += total - live
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a bench_op kernel (mpc3 bench op --help)")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1000)
    ap.add_argument("--net", default="none")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    with RemoteCluster(a.net, quiet=True) as rc:
        rc.bench_op(a.name, a.n, repeat=10)     # warm-up: kernels compiled, links up
        s0 = snapshot()
        r = rc.bench_op(a.name, a.n, repeat=a.repeat)
        d = delta(s0, snapshot())
    units, unit = r["rounds"] * a.repeat, "round"
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    res = {"commit": commit, "load_avg_1m_at_end": os.getloadavg()[0],
           "workload": f"op {a.name} n={a.n}", "net": a.net, "repeat": a.repeat, "unit": unit,
           "rounds_per_run": r["rounds"], "wall_s": r["wall_s"],
           "cpu_ms_per_unit": {k: {t: round(1e3 * v / units, 4) for t, v in
                                   sorted(c.items(), key=lambda kv: -kv[1]) if v}
                               for k, c in sorted(d.items())}}
    for kind, threads in res["cpu_ms_per_unit"].items():
        total = sum(threads.values())
        print(f"{kind:8s} {total:8.3f} ms CPU per {unit}: " +
              ", ".join(f"{t} {v:.3f}" for t, v in threads.items()))
    print(f"wall per run (min / median): {r['wall_s']['min']:.4f} / {r['wall_s']['median']:.4f} s,"
          f" {r['rounds']} rounds per run")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
