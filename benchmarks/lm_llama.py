"""LLaMA-shaped workloads of issue 36 with ``mpc3 bench lm --preset llama``: RMSNorm, rotary
positions, the SiLU-gated FFN and grouped-query attention, random weights, a 128-token prompt
+ 1 generated token, batch 1.

    python benchmarks/lm_llama.py run --shape tinyllama --layers 1 --net lan   # JSON + PNG
    python benchmarks/lm_llama.py run --shape tinyllama --layers 2 --net lan
    python benchmarks/lm_llama.py table                                       # markdown

Shapes (:data:`SHAPES`): ``tinyllama`` is TinyLlama-1.1B's (d 2048, 32 heads of 64, 4 KV
heads, d_ff 5632, 22 layers); ``gqa16`` the issue's example (d 2048, 16 heads of 128, 4 KV
heads, d_ff 5632). ``run`` writes ``benchmarks/results/lm_llama_{shape}_L{layers}_{where}
.json`` (and ``.png``, the breakdown by operation type: matmul, attention, ffn_act (the
SiLU), norm (RMSNorm), rotary), each run a fresh ``python -m app.cli bench lm`` process.
``table`` prints every such JSON and, from two measured layer counts, the full depth
extrapolated linearly (bytes and rounds are exactly linear in the layers; labelled as an
extrapolation wherever it is printed, never as a measurement).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from lm_gpt2small import extrapolate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: name -> (d_model, heads, kv heads, d_ff, full depth)
SHAPES = {"tinyllama": (2048, 32, 4, 5632, 22), "gqa16": (2048, 16, 4, 5632, 22)}


def _stem(shape: str, layers: int, where: str) -> Path:
    return RESULTS / f"lm_llama_{shape}_L{layers}_{where}"


def run(a) -> int:
    d, h, kv, ff, _ = SHAPES[a.shape]
    where = a.net if a.net != "none" else ("loopback" if a.transport == "grpc" else "inproc")
    stem = _stem(a.shape, a.layers, where)
    argv = [sys.executable, "-m", "app.cli", "bench", "lm", "--preset", "llama",
            "--d-model", str(d), "--heads", str(h), "--kv-heads", str(kv), "--d-ff", str(ff),
            "--layers", str(a.layers), "--prompt", str(a.prompt), "--tokens", "1",
            "--transport", a.transport, "--net", a.net, "--json", f"{stem}.json",
            "--plot", f"{stem}.png"]
    print(" ".join(argv[1:]), flush=True)
    return subprocess.run(argv, cwd=ROOT).returncode


def _row(r: dict, name: str) -> str:
    p, pre, tok = r["params"], r["prefill"], r["per_token"]
    share = " / ".join(f"{100 * r['breakdown'][c]['bytes_total'] / r['bytes_total']:.1f}"
                       for c in ("matmul", "attention", "ffn_act", "norm", "rotary"))
    rss = r["peak_rss_bytes"]["parties"] or [r["peak_rss_bytes"]["this_process"]]
    where = r["net"] if r["net"] != "none" else r["transport"]
    return (f"| {p['d_model']} / {p['heads']} / {p['kv_heads']} / {p['d_ff']} | {p['layers']} "
            f"| {where} | {pre['bytes_total'] / 1e9:.3f} GB / {pre['rounds']} / "
            f"{pre['wall_s']:.1f} s | {tok['bytes_total'] / 1e6:.1f} MB / {tok['rounds']:.0f} "
            f"/ {tok['wall_s']:.2f} s | {share} | {max(rss) / 1e9:.2f} GB | "
            f"{p['load_avg_1m_at_end']:.1f} | {name} |")


def table(a) -> int:
    rows, groups = [], {}
    for path in sorted(RESULTS.glob("lm_llama_*.json")):
        r = json.loads(path.read_text())
        rows.append(_row(r, path.name))
        shape = path.name.split("_")[2]
        groups.setdefault((shape, r["net"], r["transport"]), {})[r["params"]["layers"]] = r
    print("Measured (d / heads / KV heads / d_ff):\n")
    print("| shape | layers | where | prompt: bytes / rounds / wall | token: bytes / rounds / "
          "wall | bytes % matmul / attn / SiLU / RMSNorm / rotary | peak RSS | load | JSON |")
    print("|" + "---|" * 9)
    print("\n".join(rows))
    for (shape, net, transport), runs in sorted(groups.items()):
        depth = SHAPES[shape][4]
        e = extrapolate(runs, depth)
        if e is None:
            continue
        print(f"\n{shape} extrapolated to {depth} layers (NOT measured; linear from layers "
              f"{e['from_layers']}, {net if net != 'none' else transport}): "
              f"{e['bytes_total'] / 1e9:.2f} GB, {e['rounds']:.0f} rounds, wall "
              f"{e['wall_s']:.1f} s (prompt {e['prefill_wall_s']:.1f} s + token "
              f"{e['per_token_wall_s']:.2f} s)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--shape", choices=tuple(SHAPES), default="tinyllama")
    r.add_argument("--layers", type=int, default=2)
    r.add_argument("--prompt", type=int, default=128)
    r.add_argument("--transport", choices=("inproc", "grpc"), default="grpc")
    r.add_argument("--net", default="none")
    r.set_defaults(func=run)
    sub.add_parser("table").set_defaults(func=table)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
