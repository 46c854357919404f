"""The report and plots of benchmarks/paper.py, from its measured points alone: the numbers
beside Privformer's (:data:`PAPER_TABLE2`, :data:`PAPER_TRANSLATE`), the time model beside
each emulated time, the targets, the emulation check (:func:`render_report`), and Fig. 3/4
as PNG (:func:`plots`; matplotlib, the ``plot`` extra). ``paper.py --report-only`` runs just
this stage; tests render a report from JSON points without a cluster.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

# Privformer (seed paper 004) Table 2 (S=64, d_m=512, h=8, r=266, d_ff=2048, 6 layers), and
# its authors' code rebuilt and run on the project's 2-core machine (the last column)
PAPER_TABLE2 = {   # workload: (LAN s, WAN s, comm MB, messages, same code on 2-core loopback s)
    "mha": (0.611, 10.944, 48.361, 160, 1.18),
    "mmha-qk": (0.613, 12.424, 47.231, 192, 0.99),
    "ffn": (1.671, 6.669, 19.136, 38, 1.00),
    "ln": (0.077, 10.753, 1.64, 278, 0.73),
    "encoder": (14.141, 253.164, 424.668, 4524, 10.42),
    "decoder": (17.768, 402.85, 717.894, 7344, 13.05),
}
LABELS = {"mha": "multi-head attention", "mmha-qk": "masked MHA (QK form)",
          "mmha-vk": "masked MHA (VK form)", "ffn": "feed-forward network",
          "ln": "layer normalization", "encoder": "encoder (6 layers)",
          "decoder": "decoder (6 layers)", "softmax-attn": "softmax attention",
          "masked-softmax-attn": "masked softmax attention", "decoder-step": "decoder steps"}
PAPER_TRANSLATE = {"lan": 19 * 60.0, "wan": 7.3 * 3600.0}
TARGET_TRANSLATE = {"lan": 60.0, "wan": 3600.0}


def load_points(out: Path) -> list[dict]:
    from app.bench.remote import time_model
    pts = [json.loads(f.read_text()) for f in sorted((out / "points").glob("*.json"))]
    ok = [p for p in pts if "error" not in p]
    base = {_key(p): p["wall_s"]["min"] for p in ok if p["net"] == "none"}
    for p in ok:                         # the time model, with compute from the net-none point
        if p["net"] != "none":
            p["time_model"] = time_model(base.get(_key(p)), p["rounds"], p["bytes_per_party"], p)
    return pts


def _key(p: dict) -> tuple:
    q = p["params"]
    return (p["experiment"], p["workload"], q["seq"], q["d_model"], q["layers"], q["batch"])


# ---------------------------------------------------------------------- report ----
def _s(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def _mb(b) -> str:
    return f"{b / 1e6:.2f}"


def _find(pts, exp, name, net, **params):
    for p in pts:
        if (p.get("experiment") == exp and p.get("workload") == f"layer/{name}"
                and p.get("net") == net and "error" not in p
                and all(p["params"].get(k) == v for k, v in params.items())):
            return p
    return None


def _model_cell(p) -> str:
    m = p.get("time_model") or {}
    if not m:
        return "-"
    c = m.get("compute_s")
    return (f"{_s(m.get('total_s'))} = {_s(c)} + {_s(m['latency_s'])} + {_s(m['bandwidth_s'])}"
            if c is not None else f"? + {_s(m['latency_s'])} + {_s(m['bandwidth_s'])}")


def _nets(pts) -> list[str]:
    order = {"none": 0, "lan": 1, "wan": 2}
    return sorted({p["net"] for p in pts}, key=lambda n: (order.get(n, 3), n))


def _table2(pts, quick) -> list[str]:
    L = ["## Table 2: every layer (batch 1)", ""]
    if quick:
        L += ["(--quick sizes: the paper's columns are for S=64, d_m=512 and do not compare.)", ""]
    L += ["| layer | paper LAN | mpc3 LAN | model LAN (compute + latency + bw) | paper WAN | "
          "mpc3 WAN | model WAN | mpc3 loopback (grpc) | paper comm MB | mpc3 comm MB | "
          "paper msgs | mpc3 msgs | mpc3 rounds | max abs err |", "|" + "---|" * 14]
    for w in ("mha", "mmha-qk", "mmha-vk", "ffn", "ln", "encoder", "decoder"):
        ref = PAPER_TABLE2.get(w, (None,) * 5)
        byn = {n: _find(pts, "table2", w, n) for n in ("none", "lan", "wan")}
        any_p = next((p for p in byn.values() if p), None)
        if any_p is None:
            continue
        t = {n: (p["wall_s"]["min"] if p else None) for n, p in byn.items()}
        label = LABELS[w].replace("6 layers", f"{any_p['params']['layers']} layers")
        L.append(f"| {label} | {_s(ref[0])} | {_s(t['lan'])} | "
                 f"{_model_cell(byn['lan']) if byn['lan'] else '-'} | {_s(ref[1])} | "
                 f"{_s(t['wan'])} | {_model_cell(byn['wan']) if byn['wan'] else '-'} | "
                 f"{_s(t['none'])} | {_s(ref[2])} | {_mb(any_p['bytes_total'])} | "
                 f"{ref[3] or '-'} | {any_p['messages']} | {any_p['rounds']} | "
                 f"{any_p['max_abs_err']:.2g} |")
    return L + ["", "Times in seconds (min over runs, slowest party, measured on the parties). "
                "Model = compute (same point over loopback gRPC) + rounds x one-way latency "
                "+ max party bytes / 2 links / rate.", ""]


def _sweep(pts, exp, names) -> tuple[list[str], dict]:
    L = ["| net | S | " + " | ".join(f"{LABELS[n]} s / MB / rounds" for n in names) + " |",
         "|" + "---|" * (2 + len(names))]
    series = {}
    for net in _nets([p for p in pts if p.get("experiment") == exp]):
        seqs = sorted({p["params"]["seq"] for p in pts if p.get("experiment") == exp
                       and p.get("net") == net and "error" not in p})
        for s in seqs:
            cells = []
            for n in names:
                p = _find(pts, exp, n, net, seq=s)
                if p:
                    series.setdefault((net, n), []).append(
                        (s, p["wall_s"]["min"], p["bytes_total"], p["rounds"]))
                    cells.append(f"{_s(p['wall_s']['min'])} / {_mb(p['bytes_total'])} / "
                                 f"{p['rounds']}")
                else:
                    cells.append("-")
            L.append(f"| {net} | {s} | " + " | ".join(cells) + " |")
    return L, series


def _slope(rows, idx) -> float | None:
    """Log-log slope of column ``idx`` against S over the upper half of the sweep."""
    rows = sorted(rows)
    rows = rows[len(rows) // 2:] if len(rows) >= 4 else rows
    if len(rows) < 2 or rows[0][idx] <= 0:
        return None
    return math.log(rows[-1][idx] / rows[0][idx]) / math.log(rows[-1][0] / rows[0][0])


def _fig(pts, exp, names, title) -> tuple[list[str], dict]:
    L, series = _sweep(pts, exp, names)
    L = [f"## {title}", ""] + L + [""]
    for (net, n), rows in sorted(series.items()):
        st, sb = _slope(rows, 1), _slope(rows, 2)
        if st is not None:
            L.append(f"- {net}, {LABELS[n]}: time grows as S^{st:.2f}, bytes as S^{sb:.2f} "
                     "(log-log slope over the upper half of the sweep).")
    return L + [""], series


def _sweep_dims(pts, exp) -> str:
    q = next((p["params"] for p in pts if p.get("experiment") == exp and "error" not in p), {})
    return (f"d_m = {q.get('d_model')}, {q.get('heads')} head(s), r = {q.get('features')}, "
            "batch 1")


def _crossover(series) -> list[str]:
    out = []
    for net in sorted({k[0] for k in series}):
        qk = dict((r[0], r[1]) for r in series.get((net, "mmha-qk"), []))
        vk = dict((r[0], r[1]) for r in series.get((net, "mmha-vk"), []))
        common = sorted(set(qk) & set(vk))
        if not common:
            continue
        faster = [s for s in common if vk[s] < qk[s]]
        where = (f"VK is faster from S = {faster[0]} on" if faster and
                 all(s in faster for s in common if s >= faster[0]) else
                 f"VK faster at S = {faster}" if faster else
                 f"QK is faster on the whole sweep (S <= {common[-1]})")
        out.append(f"- QK/VK crossover on {net}: {where} "
                   f"(QK/VK time ratio at S={common[-1]}: {qk[common[-1]] / vk[common[-1]]:.2f}).")
    return out


def _table3(pts) -> list[str]:
    L = ["## Table 3: batching (per-sample time)", "",
         "| net | batch | encoder s | encoder s/sample | decoder s | decoder s/sample | "
         "per-sample vs batch 1 (enc / dec) |", "|" + "---|" * 7]
    for net in _nets([p for p in pts if p.get("experiment") == "table3"]):
        b1 = {}
        for b in (1, 2, 4, 8):
            e = _find(pts, "table3", "encoder", net, batch=b)
            d = _find(pts, "table3", "decoder", net, batch=b)
            if not e and not d:
                continue
            te = e["wall_s"]["min"] if e else None
            td = d["wall_s"]["min"] if d else None
            if b == 1:
                b1 = {"e": te, "d": td}
            ratio = " / ".join(f"{(t / b) / b1[k]:.2f}" if t and b1.get(k) else "-"
                               for k, t in (("e", te), ("d", td)))
            L.append(f"| {net} | {b} | {_s(te)} | {_s(te / b if te else None)} | {_s(td)} | "
                     f"{_s(td / b if td else None)} | {ratio} |")
    return L + ["", "Paper: per-sample time does not improve with batch size in their code. "
                "Target: batch 8 per-sample <= 1/3 of batch 1.", ""]


def translation(pts) -> dict:
    """net -> (total s, parts) for encoder once + decoder steps (+ client round trips)."""
    out = {}
    for net in _nets([p for p in pts if p.get("experiment") == "translate"]):
        e = _find(pts, "translate", "encoder", net)
        d = _find(pts, "translate", "decoder-step", net)
        if not (e and d):
            continue
        tokens = d["params"]["seq"]
        rtt = (e.get("profile") or {}).get("rtt_ms", 0.0) / 1e3
        total = e["wall_s"]["min"] + d["wall_s"]["min"] + tokens * rtt
        out[net] = {"total_s": total, "encoder_s": e["wall_s"]["min"],
                    "decoder_steps_s": d["wall_s"]["min"], "tokens": tokens,
                    "client_round_trips_s": tokens * rtt,
                    "bytes_total": e["bytes_total"] + d["bytes_total"],
                    "rounds": e["rounds"] + d["rounds"]}
    return out


def translation_model(pts) -> dict:
    """net -> time model of the translation from the loopback points, for lan and wan."""
    from net.peer.emulate import PROFILES
    from app.bench.remote import time_model
    e = _find(pts, "translate", "encoder", "none")
    d = _find(pts, "translate", "decoder-step", "none")
    if not (e and d):
        return {}
    out = {}
    for net, prof in PROFILES.items():
        info = {"profile": {"rate_mbit": prof.rate_mbit, "rtt_ms": prof.rtt_ms}}
        parts = [time_model(p["wall_s"]["min"], p["rounds"], p["bytes_per_party"], info)
                 for p in (e, d)]
        tokens = d["params"]["seq"]
        out[net] = {"tokens": tokens, "total_s": sum(m["total_s"] for m in parts)
                    + tokens * prof.rtt_ms / 1e3, "parts": parts}
    return out


def _translate_md(pts) -> list[str]:
    tr = translation(pts)
    L = ["## 64-token translation (Privformer workload, random weights)", "",
         "Encoder once on the 64-token source, then the decoder one token at a time with the "
         "secret decode state (O(1) per token), measured on the parties; plus one client round "
         "trip per output token (the user reconstructs, picks the token and shares the next "
         "embedding) added as tokens x RTT (bench_layer jobs `encoder` and `decoder-step`). "
         "Model = the loopback point's compute + rounds x one-way latency + bytes / bandwidth "
         "+ tokens x RTT, for the paper's profiles.", "",
         "| net | tokens | encoder s | decoder steps s | client RTTs s | total | model | paper | "
         "target |", "|" + "---|" * 9]
    est = translation_model(pts)
    for net in sorted(set(tr) | set(est), key=lambda n: {"none": 0, "lan": 1, "wan": 2}.get(n, 3)):
        t = tr.get(net, {})
        L.append(f"| {net} | {t.get('tokens', est.get(net, {}).get('tokens'))} | "
                 f"{_s(t.get('encoder_s'))} | {_s(t.get('decoder_steps_s'))} | "
                 f"{_s(t.get('client_round_trips_s'))} | "
                 f"{_s(t['total_s']) + ' s' if t else 'not measured'} | "
                 f"{_s(est[net]['total_s']) + ' s' if net in est else '-'} | "
                 f"{_s(PAPER_TRANSLATE[net]) + ' s' if net in PAPER_TRANSLATE else '-'} | "
                 f"{'<= ' + _s(TARGET_TRANSLATE[net]) + ' s' if net in TARGET_TRANSLATE else '-'} |")
    e2e = [p for p in pts if p.get("experiment", "").startswith("translate-e2e")
           and "error" not in p]
    if e2e:
        L += ["", "End to end as the query user runs it (`app/translate.py`: the encoder + "
              "cross-attention job, then one job per token with the user's local embedding, "
              "projection and greedy choice; random weights, attn_norm mean), timed by the "
              "client. Client RPCs travel on an unshaped link, so tokens x RTT is added for "
              "a client that sits on the emulated network too. fuse: the decode sessions' "
              "LayerNorm fusions (`--fuse`; all: fewer rounds, more bytes).", "",
              "| net | fuse | tokens | client wall s | on parties s (open + steps) | "
              "+ tokens x RTT | comm MB | rounds | jobs | max abs err |", "|" + "---|" * 10]
        order = _nets(e2e)
        for p in sorted(e2e, key=lambda p: (order.index(p["net"]), p["experiment"])):
            L.append(f"| {p['net']} | {p['params'].get('fuse', 'default')} | "
                     f"{p['params']['tokens']} | {_s(p['wall_s']['min'])} | "
                     f"{_s(p['parties_wall_s'])} ({_s(p['open_wall_s'])} + "
                     f"{_s(p['steps_wall_s'])}) | {_s(p['total_with_client_rtt_s'])} | "
                     f"{_mb(p['bytes_total'])} | {p['rounds']} | {p['jobs']} | "
                     f"{p['max_abs_err']:.2g} |")
        L.append("")
    return L + [""]


def _targets(pts, quick) -> list[str]:
    L = ["## Targets (issue 6)", ""]
    if quick:
        return L + ["(--quick sizes: targets apply to the full run only.)", ""]
    for net, col in (("lan", 0), ("wan", 1)):
        for w in ("mha", "mmha-qk", "ffn", "ln", "encoder", "decoder"):
            p = _find(pts, "table2", w, net)
            if p:
                t, ref = p["wall_s"]["min"], PAPER_TABLE2[w][col]
                L.append(f"- Table 2 {net.upper()} {LABELS[w]}: {_s(t)} s vs paper {_s(ref)} s "
                         f"-> {'MET' if t < ref else 'MISSED'}")
            else:
                L.append(f"- Table 2 {net.upper()} {LABELS[w]}: not measured")
    tr = translation(pts)
    for net in ("lan", "wan"):
        if net in tr:
            t = tr[net]["total_s"]
            L.append(f"- 64-token translation {net.upper()}: {_s(t)} s (target <= "
                     f"{_s(TARGET_TRANSLATE[net])} s, paper {_s(PAPER_TRANSLATE[net])} s) -> "
                     f"{'MET' if t <= TARGET_TRANSLATE[net] else 'MISSED'}")
        else:
            m = translation_model(pts).get(net)
            L.append(f"- 64-token translation {net.upper()}: not measured with bench_layer jobs"
                     + (f"; model from the loopback points {_s(m['total_s'])} s" if m else ""))
        e = next((p for p in pts if p.get("experiment") == "translate-e2e"
                  and p.get("net") == net and "error" not in p), None)
        if e:
            t = e["total_with_client_rtt_s"]
            L.append(f"- 64-token translation {net.upper()}, end to end (app/translate.py): "
                     f"{_s(t)} s incl. tokens x RTT -> "
                     f"{'MET' if t <= TARGET_TRANSLATE[net] else 'MISSED'}")
    return L + [""]


def delay_check(pts) -> list[str]:
    """Emulated points that took less than rounds x one-way delay (should be none)."""
    bad = []
    for p in pts:
        prof = p.get("profile")
        if "error" in p or not prof:
            continue
        floor = p["rounds"] * prof["rtt_ms"] / 2e3
        if p["wall_s"]["min"] < floor:
            bad.append(f"{p['experiment']} {p['workload']} {p['net']}: "
                       f"{p['wall_s']['min']:.4f} s < {p['rounds']} x {prof['rtt_ms'] / 2} ms")
    return bad


def render_report(pts: list[dict], quick: bool, links: dict | None = None) -> str:
    L = [f"# Privformer experiments with mpc3 ({'--quick sizes' if quick else 'full sizes'})", "",
         f"Generated by `python benchmarks/paper.py{' --quick' if quick else ''}` on "
         f"{platform.node()} ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d')}. Three party "
         "processes (gRPC, mTLS), each in its own network namespace under emulation; metrics "
         "as in docs/DESIGN.md, counted on the parties.", ""]
    for net, info in (links or {}).items():
        ls = "; ".join(f"{x['link']} rtt {x['rtt_ms']} ms, {x['throughput_mbit']} Mbit/s"
                       + (f" (ceiling: {x.get('ceiling')})" if x.get("rate_ceiling") else "")
                       for x in info.get("links", []))
        L.append(f"- **{net}**: emulation `{info['emulation']}`, profile "
                 f"{info['profile']['rate_mbit']} Mbit/s / {info['profile']['rtt_ms']} ms RTT; "
                 f"measured {ls}")
    errs = [p for p in pts if "error" in p]
    if errs:
        L += ["", "Failed points: " + "; ".join(f"{p.get('experiment')} {p['workload']} "
                                                 f"{p['net']}: {p['error'][:200]}" for p in errs)]
    L.append("")
    exps = {p.get("experiment") for p in pts}
    if "table2" in exps:
        L += _table2(pts, quick)
    if "fig3" in exps:
        L += _fig(pts, "fig3", ("softmax-attn", "mha"),
                  f"Fig. 3: unmasked softmax vs ReLU attention ({_sweep_dims(pts, 'fig3')})")[0]
        L += ["ReLU attention is the full MHA layer (projections included); softmax attention "
              "gets Q, K, V directly, as in `mpc3 bench layer`.", ""]
    if "fig4" in exps:
        lines, series = _fig(pts, "fig4", ("masked-softmax-attn", "mmha-qk", "mmha-vk"),
                             "Fig. 4: masked softmax vs masked ReLU attention, QK vs VK "
                             f"({_sweep_dims(pts, 'fig4')})")
        L += lines + _crossover(series) + [""]
    if "table3" in exps:
        L += _table3(pts)
    if exps & {"translate", "translate-e2e"}:
        L += _translate_md(pts)
    L += _targets(pts, quick)
    bad = delay_check(pts)
    L += ["## Emulation check", "",
          "Every emulated point took at least rounds x one-way delay." if not bad else
          "Points faster than rounds x one-way delay (emulation not delaying?): " + "; ".join(bad),
          ""]
    return "\n".join(L)


def plots(pts: list[dict], out: Path) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no PNG plots", file=sys.stderr)
        return []
    made = []
    for exp, names in (("fig3", ("softmax-attn", "mha")),
                       ("fig4", ("masked-softmax-attn", "mmha-qk", "mmha-vk"))):
        _, series = _sweep(pts, exp, names)
        if not series:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        colour = {n: f"C{i}" for i, n in enumerate(names)}
        for (net, n), rows in sorted(series.items()):
            rows = sorted(rows)
            s = [r[0] for r in rows]
            style = {"none": ":", "lan": "-", "wan": "--"}.get(net, "-.")
            for ax, idx in zip(axes, (1, 2, 3)):
                y = [r[idx] / (1e6 if idx == 2 else 1) for r in rows]
                if idx == 2 and net != "none":
                    continue          # bytes do not depend on the network
                ax.plot(s, y, style, marker="o", color=colour[n],
                        label=f"{LABELS[n]} ({net})" if idx != 2 else LABELS[n])
        for ax, yl in zip(axes, ("time (s)", "communication (MB, all parties)", "rounds")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log" if yl != "rounds" else "linear")
            ax.set_xlabel("sequence length S")
            ax.set_ylabel(yl)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7)
        axes[1].legend(fontsize=7)
        d = next(p["params"]["d_model"] for p in pts if p.get("experiment") == exp
                 and "error" not in p)
        fig.suptitle({"fig3": "Fig. 3: softmax vs ReLU attention",
                      "fig4": "Fig. 4: masked softmax vs masked ReLU attention, QK / VK"}[exp]
                     + f" (d_m = {d}, one head; dotted: loopback, solid: LAN, dashed: WAN)")
        fig.tight_layout()
        path = out / f"paper_{exp}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made
