"""The GPT-2-small-shaped workload of issue 14 (d=768, 12 heads, 12 layers, d_ff=3072, random
weights, GELU FFN, pre-LN, a 128-token prompt + 1 generated token) per attention variant,
with ``mpc3 bench lm``, and the comparison table against AERO (seed 001, Table 4).

    python benchmarks/lm_gpt2small.py run --attention softmax --net lan    # one JSON + PNG
    python benchmarks/lm_gpt2small.py run --attention softmax --softmax max-free   # Privformer's
    python benchmarks/lm_gpt2small.py table                                # markdown table

``run`` writes ``benchmarks/results/lm_gpt2small_{attention}[-{variant}]_{where}.json`` (and
``.png``, the breakdown), where = inproc | loopback (three party processes, gRPC) | lan | wan
(emulated, :mod:`net.peer.emulate`); each run is a fresh ``python -m app.cli bench lm`` process.
``--layers`` below 12 measures fewer layers (the file name says ``_L{n}``), ``--fuse`` another
choice of the session's LayerNorm fusions (``_fuse-{choice}``). ``table`` reads
every such JSON and prints bytes, rounds, wall and the breakdown next to AERO's figures
(2-party SecretFlow, WAN-like 100 Mbit/s, 80 ms: 25.32 GB / 8.21 min for GPT-2 with GELU and
LayerNorm, 9.44 GB / 6.06 min with ReLU, 6.29-6.95 GB / 4.23-5.68 min softmax-only).
Every number in the table is read from a JSON (the parties' own counters and clocks).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SHAPE = ["--d-model", "768", "--heads", "12", "--d-ff", "3072", "--prompt", "128",
         "--tokens", "1"]
AERO = {"SM+LN+G (GPT-2 baseline)": (25.32, 8.21), "SM+LN+R": (9.44, 6.06),
        "SM+ScFuFFN (AERO softmax-only)": (6.43, 4.76), "SM+ScFuFFNi6": (6.29, 4.23)}


def _name(attention: str, variant: str, where: str, layers: int, fuse: str | None = None,
          softmax: str = "max-free") -> str:
    """The JSON's stem; the max-subtracted softmax's runs say ``softmax-max`` (the runs
    before it existed, max-free, keep their names)."""
    tag = attention + ("-max" if attention == "softmax" and softmax == "max" else "") + \
        (f"-{variant}" if variant != "gelu" else "")
    return (f"lm_gpt2small_{tag}_{where}" + ("" if layers == 12 else f"_L{layers}")
            + ("" if fuse in (None, "default") else f"_fuse-{fuse.replace(',', '+')}"))


def run(a) -> int:
    where = a.net if a.net != "none" else ("loopback" if a.transport == "grpc" else "inproc")
    stem = RESULTS / _name(a.attention, a.variant, where, a.layers, a.fuse, a.softmax)
    extra = ["--preset", "aero"] if a.variant == "aero" else ["--ffn", a.variant]
    argv = [sys.executable, "-m", "app.cli", "bench", "lm", "--arch", "decoder-only",
            "--attention", a.attention, "--softmax", a.softmax, *extra, *SHAPE,
            "--layers", str(a.layers),
            "--transport", a.transport, "--net", a.net, "--json", f"{stem}.json",
            "--plot", f"{stem}.png"] + (["--fuse", a.fuse] if a.fuse else [])
    print(" ".join(argv[1:]), flush=True)
    return subprocess.run(argv, cwd=ROOT).returncode


def _gb(b: float) -> str:
    return f"{b / 1e9:.3f}"


def _where(r: dict) -> str:
    if r["net"] != "none":
        return r["net"]
    return "loopback" if r["transport"] == "grpc" else "inproc"


def _row(r: dict, name: str) -> str:
    p, pre, tok = r["params"], r["prefill"], r["per_token"]
    bd = r["breakdown"]
    share = " / ".join(f"{100 * bd[c]['bytes_total'] / r['bytes_total']:.0f}"
                       for c in ("matmul", "attention", "ffn_act", "norm"))
    rss = r["peak_rss_bytes"]["parties"] or [r["peak_rss_bytes"]["this_process"]]
    att = p["attention"] + (f" ({p.get('softmax_form', 'max-free')})"
                            if p["attention"] == "softmax" else "")
    return (f"| {att} | {p['ffn_act']} | {p['layers']} | {_where(r)} | "
            f"{_gb(pre['bytes_total'])} / {pre['rounds']} | "
            f"{tok['bytes_total'] / 1e6:.1f} MB / {tok['rounds']:.0f} | "
            f"{_gb(r['bytes_total'])} | {r['wall_s']['min']:.1f} s "
            f"({pre['wall_s']:.1f} + {tok['wall_s']:.2f}) | {share} | "
            f"{max(rss) / 1e9:.2f} GB | {p['load_avg_1m_at_end']:.1f} | {name} |")


def extrapolate(runs: dict[int, dict], layers: int = 12) -> dict | None:
    """Linear in the number of layers from the two largest measured layer counts below
    ``layers``: a decoder-only LM's prompt phase and token are (L - 1) full layers + the last
    one (+ the final LayerNorm), so bytes and rounds are exactly linear in L and wall time
    nearly so. An estimate, labelled as one wherever it is printed."""
    ls = sorted(n for n in runs if n < layers)
    if len(ls) < 2:
        return None
    a, b = ls[-2], ls[-1]
    k = (layers - b) / (b - a)

    def lin(get):
        return get(runs[b]) + k * (get(runs[b]) - get(runs[a]))
    return {"from_layers": [a, b],
            "wall_s": lin(lambda r: r["wall_s"]["min"]),
            "prefill_wall_s": lin(lambda r: r["prefill"]["wall_s"]),
            "per_token_wall_s": lin(lambda r: r["per_token"]["wall_s"]),
            "bytes_total": lin(lambda r: r["bytes_total"]),
            "rounds": lin(lambda r: r["rounds"])}


def table(a) -> int:
    rows, groups = [], {}
    for path in sorted(RESULTS.glob("lm_gpt2small_*.json")):
        r = json.loads(path.read_text())
        rows.append(_row(r, path.name))
        key = (r["params"]["attention"] + r["params"].get("softmax_form", ""),
               r["params"]["ffn_act"], _where(r))
        groups.setdefault(key, {})[r["params"]["layers"]] = r
    print("Measured:\n")
    print("| attention | FFN | layers | where | prompt: GB / rounds | token: bytes / rounds | "
          "total GB | wall (prompt + token) | bytes % matmul / attn / FFN act / LN | "
          "peak RSS | load | JSON |")
    print("|" + "---|" * 12)
    print("\n".join(rows))
    est = []
    for (att, ffn, where), runs in sorted(groups.items()):
        if 12 in runs:
            continue
        e = extrapolate(runs)
        if e is not None:
            est.append(f"| {att} | {ffn} | {where} | {e['from_layers']} | "
                       f"{_gb(e['bytes_total'])} | {e['rounds']:.0f} | {e['wall_s']:.1f} s "
                       f"({e['prefill_wall_s']:.1f} + {e['per_token_wall_s']:.2f}) |")
    if est:
        print("\nExtrapolated to 12 layers (NOT measured; linear in layers from two measured "
              "layer counts):\n")
        print("| attention | FFN | where | from layers | total GB | rounds | wall (prompt + "
              "token) |")
        print("|" + "---|" * 7)
        print("\n".join(est))
    print()
    print("AERO (seed 001, Table 4; 2 parties, SecretFlow, 100 Mbit/s, 80 ms):")
    for k, (gb, mins) in AERO.items():
        print(f"* {k}: {gb} GB, {mins} min")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--attention", required=True,
                   choices=("relu-performer", "softmax", "power-softmax", "sigma"))
    r.add_argument("--softmax", choices=("max", "max-free"), default="max",
                   help="softmax form (attention softmax): max-subtracted (default) or max-free")
    r.add_argument("--variant", choices=("gelu", "relu", "aero"), default="gelu",
                   help="FFN: GPT-2's GELU (default), ReLU, or --preset aero (softmax only)")
    r.add_argument("--transport", choices=("inproc", "grpc"), default="grpc")
    r.add_argument("--net", default="none")
    r.add_argument("--layers", type=int, default=12)
    r.add_argument("--fuse", default=None, help="the session's LayerNorm fusions (mpc3 bench "
                   "lm --fuse: default, all, none, self, ffn); other than default, the file "
                   "name ends in _fuse-<choice>")
    r.set_defaults(func=run)
    sub.add_parser("table").set_defaults(func=table)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
