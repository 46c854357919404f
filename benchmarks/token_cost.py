"""Cost of each generated token against its position: Performer (relu-performer) attention
against softmax attention with its secret KV cache, the README's picture.

A Performer decoder carries a fixed-size state, so every token costs the same; a softmax
decoder attends over a cache that grows by one row per token, so its bytes grow linearly and
its rounds by one comparison level (4 rounds per layer) each time the cache doubles (the
row maximum's tree). Bytes and rounds are the parties' own counters (exact, the same on any
machine); wall time is this machine's, in-process (three parties as threads):

    python benchmarks/token_cost.py --json benchmarks/results/token_cost.json \
        --plot docs/token_cost.png

Shape: the shipped LMs' (d_model 64, 4 heads, 2 pre-LN layers, d_ff 192), an 8-token prompt,
``--tokens`` generated tokens, random weights.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runinfo  # noqa: E402  (after the sys.path line)

ATTENTIONS = ("relu-performer", "softmax")
SHAPE = ["--d-model", "64", "--heads", "4", "--layers", "2", "--d-ff", "192", "--prompt", "8"]


def measure(tokens: int) -> dict:
    result = runinfo.start("token_cost")
    result["shape"] = " ".join(SHAPE)
    for attention in ATTENTIONS:
        r = runinfo.bench(["lm", "--attention", attention, *SHAPE, "--tokens", str(tokens)])
        if not all(r["checks"].values()):
            raise RuntimeError(f"{attention}: declared and measured costs differ: {r['checks']}")
        result[attention] = {
            "bytes": [s["bytes_total"] for s in r["steps"]],
            "rounds": [s["rounds"] for s in r["steps"]],
            "wall_s": [round(s["wall_s"], 4) for s in r["steps"]],
            "max_abs_err": r["max_abs_err"],
        }
    return result


def plot(result: dict, path: str) -> None:
    from app.bench.lm_plot import require_matplotlib
    plt = require_matplotlib()
    panels = (("bytes", 1e-3, "kB per token, all parties"), ("rounds", 1, "rounds per token"),
              ("wall_s", 1e3, "ms per token (in-process, 2 cores)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.2))
    for ax, (key, scale, label) in zip(axes, panels):
        for attention, color in zip(ATTENTIONS, ("#4c72b0", "#dd8452")):
            ys = [v * scale for v in result[attention][key]]
            ax.plot(range(1, len(ys) + 1), ys, color=color, label=attention)
        ax.set_xlabel("generated token (position after an 8-token prompt)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Cost per generated token: Performer attention is constant, the softmax "
                 "KV cache grows (d 64, 4 heads, 2 layers)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", help="draw the figure into this PNG (needs matplotlib)")
    args = ap.parse_args()
    result = measure(args.tokens)
    if args.plot:
        plot(result, args.plot)
    runinfo.finish(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
