"""One generated token, this tree against a base commit, interleaved in one run (issue 12).

On a shared machine absolute times drift with other jobs; a ratio of two runs taken side by
side does not. This checks the base commit out into a temporary git worktree and alternates
``mpc3 bench translate --model random --src-len 64 --tokens N --transport T`` between the
two trees ``--pairs`` times, recording each run's per-token wall, rounds and bytes (the
parties' own counters):

    python benchmarks/decode_ab.py --base 93c65ec --json benchmarks/results/decode_ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench(tree: Path, transport: str, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-m", "app.cli", "bench", "translate", "--model",
                        "random", "--src-len", "64", "--tokens", str(tokens), "--transport",
                        transport, "--json", str(out)], check=True, cwd=tree, env=env,
                       stdout=subprocess.DEVNULL)
        r = json.loads(out.read_text())
    return {k: r[k] for k in ("per_token_wall_s", "per_token_rounds", "per_token_bytes",
                              "token_agreement")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--transport", default="inproc", choices=("inproc", "grpc"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    out = {"benchmark": "decode_ab", "head": head, "base": base, "transport": args.transport,
           "tokens": args.tokens, "cpus": os.cpu_count(),
           "load_avg_1m_at_start": os.getloadavg()[0],
           "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(wt), base], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            runs: dict[str, list[dict]] = {"base": [], "head": []}
            for _ in range(args.pairs):
                for name, tree in (("base", wt), ("head", ROOT)):
                    runs[name].append(_bench(tree, args.transport, args.tokens))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                           check=False, capture_output=True)
    for name, rs in runs.items():
        walls = [r["per_token_wall_s"] for r in rs]
        out[name] = {"per_token_wall_s": walls, "min": min(walls),
                     "median": statistics.median(walls), **{k: rs[0][k] for k in (
                         "per_token_rounds", "per_token_bytes", "token_agreement")}}
    out["head_over_base_min"] = out["head"]["min"] / out["base"]["min"]
    out["head_over_base_median"] = out["head"]["median"] / out["base"]["median"]
    out["load_avg_1m_at_end"] = os.getloadavg()[0]
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
