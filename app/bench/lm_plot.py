"""The ``mpc3 bench lm --plot`` figure: the measured breakdown by operation type of the prompt
phase and of one generated token (mean over the steps), communication and wall time side by
side, as stacked bars (AERO's Figure 1 style). matplotlib is the optional ``plot`` extra
(``pip install -e ".[plot]"``), imported only here."""
from __future__ import annotations

COLORS = {"matmul": "#4c72b0", "attention": "#dd8452", "ffn_act": "#55a868",
          "norm": "#c44e52", "other": "#8c8c8c"}


def require_matplotlib():
    """The pyplot module, or one clear error naming the extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib, the plot extra: pip install -e \".[plot]\" "
                         "(or leave --plot out)") from None
    return plt


def plot_breakdown(r: dict, path: str) -> None:
    """Two panels (MB, seconds), one stacked bar per phase, one colour per category."""
    plt = require_matplotlib()
    phases = [(r["phase0"], r[r["phase0"]]["breakdown"])]
    if r.get("per_token"):
        phases.append(("per token", r["per_token"]["breakdown"]))
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, key, scale, unit in ((axes[0], "bytes_total", 1e-6, "MB, all parties"),
                                 (axes[1], "wall_s", 1.0, "s, slowest party")):
        for x, (_, bd) in enumerate(phases):
            bottom = 0.0
            for cat, v in bd.items():
                h = v[key] * scale
                ax.bar(x, h, bottom=bottom, color=COLORS.get(cat, "#333333"),
                       label=cat if x == 0 else None)
                bottom += h
        ax.set_xticks(range(len(phases)), [n for n, _ in phases])
        ax.set_ylabel(unit)
    axes[0].legend(fontsize=8)
    p = r["params"]
    fig.suptitle(f"{r['workload']}: d={p['d_model']}, h={p['heads']}, {p['layers']} layers, "
                 f"d_ff={p['d_ff']}, prompt {p['prompt']}, {p['tokens']} token(s); "
                 f"{r['transport']}, net {r['net']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
