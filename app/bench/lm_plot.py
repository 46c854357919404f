"""The ``mpc3 bench lm --plot`` figure: the measured breakdown by operation type of the prompt
phase and of one generated token (mean over the steps), communication and wall time side by
side, as stacked bars with each category's share (AERO's Figure 1 style). matplotlib is the optional ``plot`` extra
(``pip install -e ".[plot]"``), imported only here."""
from __future__ import annotations

COLORS = {"matmul": "#4c72b0", "attention": "#dd8452", "ffn_act": "#55a868",
          "norm": "#c44e52", "rotary": "#8172b3", "verify": "#937860",
          "other": "#8c8c8c"}


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
    """One panel per (phase, metric): a stacked horizontal bar per category, absolute units
    on the axis and each category's share written on it (the token's bytes are ~1 % of the
    prompt's, so every phase gets its own scale)."""
    plt = require_matplotlib()
    phases = [(r["phase0"], r[r["phase0"]]["breakdown"])]
    if r.get("per_token"):
        phases.append(("one token (mean)", r["per_token"]["breakdown"]))
    metrics = (("bytes_total", 1e-6, "MB, all parties"), ("wall_s", 1.0, "s, slowest party"))
    fig, axes = plt.subplots(len(phases), 2, figsize=(10, 1.6 + 1.4 * len(phases)),
                             squeeze=False)
    for i, (phase, bd) in enumerate(phases):
        for j, (key, scale, unit) in enumerate(metrics):
            ax, left = axes[i][j], 0.0
            total = sum(v[key] for v in bd.values()) * scale or 1.0
            for cat, v in bd.items():
                w = v[key] * scale
                ax.barh(0, w, left=left, color=COLORS.get(cat, "#333333"),
                        label=cat if i == 0 and j == 0 else None)
                if w / total > 0.06:
                    ax.text(left + w / 2, 0, f"{100 * w / total:.0f}%", ha="center",
                            va="center", fontsize=8, color="white")
                left += w
            ax.set_yticks([0], [phase])
            ax.set_xlabel(unit)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.93), fontsize=8, ncol=len(COLORS))
    p = r["params"]
    fig.suptitle(f"{r['workload']}: d={p['d_model']}, h={p['heads']}, {p['layers']} layers, "
                 f"d_ff={p['d_ff']}, prompt {p['prompt']}, {p['tokens']} token(s); "
                 f"{r['transport']}, net {r['net']}", fontsize=9, y=0.99)
    fig.tight_layout(rect=(0, 0, 1, 0.84))
    fig.savefig(path, dpi=120)
    plt.close(fig)
