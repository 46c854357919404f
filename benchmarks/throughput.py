"""The throughput, memory and bytes figures of issue 13, measured in one run (ratios are read
from the same run; Table 2 shape: S=64, d=512, h=8, r=266, d_ff=2048, 6 layers):

1. the encoder in-process (``mpc3 bench layer encoder``): wall, the float64 reference of the
   same workload timed in the same process (``plain_wall_s``) and peak RSS; beside it, the
   same encoder over three party processes on loopback (``python -m app.bench.remote layer
   encoder``), interleaved ``--pairs`` times, and over party processes without TLS
   (``--insecure-plaintext-for-local-dev``: not a deployment, the measure of what the links'
   TLS costs); each figure is the min over its runs;
2. batch 8 against batch 1 per sample (``--batch 8``), and MHA at S=1024 against S=64;
3. the bytes of every Table 2 layer (deterministic; ``mpc3 bench layer NAME --repeat 1``)
   against the Privformer code's (``PAPER_TABLE2`` of benchmarks/paper_report.py).

    python benchmarks/throughput.py --json benchmarks/results/throughput.json

Every number is read from the JSON the benchmark commands write (the parties' own counters);
the load average at start and end is recorded because other jobs on a shared machine inflate
the times.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import runinfo

ROOT = runinfo.ROOT

#: Communication of the Privformer code (MB, all parties; Table 2, as PAPER_TABLE2 of paper_report.py)
PAPER_MB = {"mha": 48.361, "mmha-qk": 47.231, "ffn": 19.136, "ln": 1.64, "encoder": 424.668,
            "decoder": 717.894}
#: issue 13's targets
TARGETS = {"encoder_over_plain": 15.0, "processes_over_inproc": 1.2, "mha_s1024_over_s64": 16.0,
           "batch8_per_sample_over_batch1": 0.5, "peak_rss_gb": 1.0, "bytes_over_paper": 0.5}


def _layer(*args: str) -> dict:
    return runinfo.bench(["layer", *args])


def _remote(name: str, repeat: int, plaintext: bool = False) -> dict:
    r = subprocess.run([sys.executable, "-m", "app.bench.remote", "layer", name, "--repeat",
                        str(repeat)] + (["--insecure-plaintext-for-local-dev"] if plaintext
                                        else []),
                       check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(r.stdout)


def encoder_pairs(pairs: int, repeat: int) -> dict:
    """In-process and party-process encoder runs, interleaved; and the party processes once
    more without TLS (development plaintext), which says what the links' TLS costs."""
    inproc, procs, plain_procs = [], [], []
    for k in range(pairs):
        inproc.append(_layer("encoder", "--repeat", str(repeat)))
        for plaintext in (False, True) if k % 2 == 0 else (True, False):    # no order bias
            (plain_procs if plaintext else procs).append(
                _remote("encoder", repeat, plaintext=plaintext))
    best = min(inproc, key=lambda r: r["wall_s"]["min"])
    wall = best["wall_s"]["min"]
    plain = min(r["plain_wall_s"] for r in inproc)
    proc = min(r["wall_s"]["min"] for r in procs)
    plain_proc = min(r["wall_s"]["min"] for r in plain_procs)
    return {"inproc_wall_s": wall, "inproc_runs_s": [r["wall_s"]["min"] for r in inproc],
            "plain_wall_s": plain, "plain_runs_s": [r["plain_wall_s"] for r in inproc],
            "encoder_over_plain": wall / plain,
            "processes_wall_s": proc, "processes_runs_s": [r["wall_s"]["min"] for r in procs],
            "processes_over_inproc": proc / wall,
            "processes_plaintext_wall_s": plain_proc,
            "processes_plaintext_runs_s": [r["wall_s"]["min"] for r in plain_procs],
            "processes_plaintext_over_inproc": plain_proc / wall,
            "peak_rss_gb": max(r["peak_rss_bytes"] for r in inproc) / 1e9,
            "bytes_total": best["bytes_total"], "rounds": best["rounds"],
            "max_abs_err": max(r["max_abs_err"] for r in inproc)}


def scaling(repeat: int) -> dict:
    """Batch 8 against batch 1 (encoder) and MHA S=1024 against S=64, each pair run back to
    back."""
    b1 = _layer("encoder", "--repeat", str(repeat))
    b8 = _layer("encoder", "--batch", "8", "--repeat", str(max(1, repeat - 1)))
    s64 = _layer("mha", "--repeat", str(repeat))
    s1024 = _layer("mha", "--seq", "1024", "--repeat", str(max(1, repeat - 1)))
    w1, w8 = b1["wall_s"]["min"], b8["wall_s"]["min"]
    return {"batch1_wall_s": w1, "batch8_wall_s": w8,
            "batch8_per_sample_over_batch1": w8 / 8 / w1,
            "batch8_bytes_over_batch1": b8["bytes_total"] / b1["bytes_total"],
            "batch8_peak_rss_gb": b8["peak_rss_bytes"] / 1e9,
            "mha_s64_wall_s": s64["wall_s"]["min"], "mha_s1024_wall_s": s1024["wall_s"]["min"],
            "mha_s1024_over_s64": s1024["wall_s"]["min"] / s64["wall_s"]["min"],
            "mha_s1024_bytes_over_s64": s1024["bytes_total"] / s64["bytes_total"]}


def layer_bytes() -> dict:
    out = {}
    for name, paper in PAPER_MB.items():
        r = _layer(name, "--repeat", "1")
        out[name] = {"mb": r["bytes_total"] / 1e6, "paper_mb": paper,
                     "over_paper": r["bytes_total"] / 1e6 / paper, "rounds": r["rounds"],
                     "max_abs_err": r["max_abs_err"]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="interleaved in-process / party-"
                    "process encoder runs")
    ap.add_argument("--repeat", type=int, default=3, help="repeats inside each run (min)")
    ap.add_argument("--skip-bytes", action="store_true", help="no per-layer bytes runs")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    result = runinfo.start("throughput") | {"targets": TARGETS}
    result["encoder"] = encoder_pairs(a.pairs, a.repeat)
    result["scaling"] = scaling(a.repeat)
    if not a.skip_bytes:
        result["bytes"] = layer_bytes()
    runinfo.finish(result, a.json)


if __name__ == "__main__":
    main()
