"""Reproduce Privformer's experiments (Table 2, Fig. 3, Fig. 4, Table 3, 64-token translation)
over three party processes on loopback and on emulated LAN / WAN.

    python benchmarks/paper.py [--quick] [--only table2,fig3,fig4,table3,translate]
                               [--nets none,lan,wan] [--out DIR] [--force] [--report-only]

Every point runs as a ``bench_layer`` job on a :class:`app.bench.remote.RemoteCluster` (one
cluster per network, links verified first) and is written as one JSON file under
``DIR/points/`` (existing points are reused unless ``--force``, so a long run can be resumed).
Then ``DIR/report.md`` sets the numbers beside the paper's (:data:`paper_report.PAPER_TABLE2`),
with the time model ``compute (same point, net none) + rounds x one-way latency + bytes /
bandwidth`` beside each emulated time, and ``DIR/*.png`` plots Fig. 3/4 (matplotlib: the
``plot`` extra): :mod:`paper_report`, from the points alone.

``--quick`` uses small sizes (a few minutes) into ``benchmarks/results/paper_quick`` and checks
that the emulation delays traffic: every emulated point must take at least rounds x one-way
delay (exit status 1 otherwise). The full run writes ``benchmarks/results/paper_full``.

Emulated networks need root (net/peer/emulate.py); ``--nets none`` runs without.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from paper_report import delay_check, load_points, plots, render_report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
EXPERIMENTS = ("table2", "fig3", "fig4", "table3", "translate", "translate-e2e")



# ------------------------------------------------------------------------ points ----
def _cfg(quick: bool, **over) -> dict:
    base = (dict(seq=16, d_model=64, heads=4, features=44, d_ff=128, layers=1) if quick else
            dict(seq=64, d_model=512, heads=8, features=266, d_ff=2048, layers=6))
    base.update(over)
    return base


def plan(quick: bool, only: set[str]) -> list[dict]:
    """Every point: experiment, workload, layer_config kwargs, batch."""
    pts = []
    if "table2" in only:
        for w in ("mha", "mmha-qk", "mmha-vk", "ffn", "ln", "encoder", "decoder"):
            pts.append(dict(exp="table2", name=w, cfg=_cfg(quick), batch=1))
    # Fig. 3/4: d_m = 64 in one head, so d = 64 and r = d ln d = 266 (8-dim and 17 in --quick)
    seqs = (8, 16) if quick else (32, 64, 128, 256, 512, 1024)
    sweep = dict(d_model=8, heads=1, features=17, d_ff=16, layers=1) if quick else \
        dict(d_model=64, heads=1, features=266, d_ff=256, layers=1)
    for exp, names in (("fig3", ("softmax-attn", "mha")),
                       ("fig4", ("masked-softmax-attn", "mmha-qk", "mmha-vk"))):
        if exp in only:
            for s in seqs:
                for w in names:
                    pts.append(dict(exp=exp, name=w, cfg=_cfg(quick, seq=s, **sweep), batch=1))
    if "table3" in only:
        for b in ((1, 2) if quick else (1, 2, 4, 8)):
            for w in ("encoder", "decoder"):
                pts.append(dict(exp="table3", name=w, cfg=_cfg(quick), batch=b))
    if "translate" in only:   # encoder once + one decoder step per output token
        tokens = 4 if quick else 64
        for w in ("encoder", "decoder-step"):
            pts.append(dict(exp="translate", name=w, cfg=_cfg(quick, seq=tokens), batch=1))
    return pts


def slug(p: dict, net: str) -> str:
    c = p["cfg"]
    return (f"{p['exp']}_{p['name']}_S{c['seq']}_d{c['d_model']}_h{c['heads']}_r{c['features']}"
            f"_L{c['layers']}_b{p['batch']}_{net.replace(':', '-')}")


# --------------------------------------------------------------------- running ----
class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def show(self, label: str) -> None:
        width, frac = 30, self.done / max(self.total, 1)
        el = time.monotonic() - self.t0
        eta = f" eta {el / self.done * (self.total - self.done) / 60:.1f} min" if self.done else ""
        bar = "#" * int(width * frac) + "." * (width - int(width * frac))
        print(f"\r[{bar}] {self.done}/{self.total} {el / 60:.1f} min{eta} | {label:<60.60}",
              end="", file=sys.stderr, flush=True)

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)
        if self.done == self.total:
            print(file=sys.stderr)


def run_points(pts: list[dict], nets: list[str], out: Path, force: bool, repeat: int) -> None:
    from app.bench.remote import RemoteCluster, layer_config
    pdir = out / "points"
    pdir.mkdir(parents=True, exist_ok=True)
    todo = [(net, p) for net in nets for p in pts if force or not (pdir / f"{slug(p, net)}.json").exists()]
    bar = Progress(len(todo))
    for net in nets:
        mine = [p for n, p in todo if n == net]
        if not mine:
            continue
        bar.show(f"starting cluster, net {net}")
        with RemoteCluster(net, quiet=True) as rc:
            if rc.network.get("links"):
                (out / f"paper_links_{net.replace(':', '-')}.json").write_text(
                    json.dumps(rc.network, indent=2) + "\n")
            for p in mine:
                label = f"{net} {p['exp']} {p['name']} S={p['cfg']['seq']} b={p['batch']}"
                bar.show(label)
                try:
                    r = rc.bench_layer(p["name"], layer_config(**p["cfg"]), batch=p["batch"],
                                       repeat=repeat)
                except Exception as exc:  # noqa: BLE001 - record the failure, go on
                    if not rc.alive:          # interrupted: do not record a failed point
                        raise
                    r = {"workload": f"layer/{p['name']}", "net": net, "error": repr(exc)[:500]}
                r.update(experiment=p["exp"], **_provenance())
                (pdir / f"{slug(p, net)}.json").write_text(json.dumps(r, indent=2) + "\n")
                bar.step(label)


def translate_e2e(rc, tokens: int, d: dict, seed: int = 0, fuse: str | None = None) -> dict:
    """The real secure translation as the query user runs it (app/translate.py: encoder +
    cross-attention job, then one job per token, user-side embedding/projection), random
    weights of the given shape, ``tokens`` source tokens and exactly ``tokens`` steps;
    ``fuse``: the decode sessions' LayerNorm fusions (None: the parties' default)."""
    from app import translate as T
    from app.owner import share_transformer
    from net.client.user import QueryUser
    from protocols import model as M
    cfg = M.ModelConfig(d_model=d["d_model"], n_heads=d["heads"],
                        d_head=d["d_model"] // d["heads"], n_features=d["features"],
                        d_ff=d["d_ff"], n_enc_layers=d["layers"], n_dec_layers=d["layers"],
                        attn_c=1.0 / d["features"], attn_norm="mean",
                        norm_first=False, src_vocab=256, tgt_vocab=256,
                        max_len=tokens + 1).validate()
    w, user = M.random_weights(cfg, seed), M.random_user(cfg, seed)
    src = np.random.default_rng(seed + 1).integers(3, 256, size=(1, tokens))
    model_id = f"e2e-{tokens}-{d['d_model']}-{d['layers']}"
    share_transformer(rc.cfg, model_id, cfg, w, None, *rc.creds("owner"), user=user)
    with QueryUser(rc.cfg, *rc.creds("user"), rpc_timeout=600) as qu:
        backend = T.ClusterBackend(qu, model_id, step_timeout=3600, fuse=fuse)
        t0 = time.perf_counter()
        res = T.decode_batch(backend, cfg, user, src, 1, None, tokens)
        wall = time.perf_counter() - t0
    ref = T.reference_rows(cfg, w, user, src, res.fed)
    err = max(float(np.abs(g - r).max()) for g, r in zip(res.hidden, ref))
    total = T.Traffic()
    total += res.open_cost
    total += res.step_cost
    rtt = (rc.network.get("profile") or {}).get("rtt_ms", 0.0) / 1e3
    return {"workload": "translate-e2e", **rc.network,
            "params": {"seq": tokens, "d_model": d["d_model"], "heads": d["heads"],
                       "features": d["features"], "d_ff": d["d_ff"], "layers": d["layers"],
                       "batch": 1, "tokens": tokens, "attn_norm": "mean",
                       "fuse": fuse or "default"},
            "wall_s": {"min": wall, "median": wall}, "parties_wall_s": total.wall_s,
            "open_wall_s": res.open_cost.wall_s, "steps_wall_s": res.step_cost.wall_s,
            "client_round_trips_s": tokens * rtt, "total_with_client_rtt_s": wall + tokens * rtt,
            "bytes_total": total.bytes_total, "bytes_per_party": list(total.bytes_per_party),
            "messages": total.messages, "rounds": total.rounds, "jobs": total.jobs,
            "max_abs_err": err}


def run_e2e(nets: list[str], out: Path, quick: bool, force: bool,
            fuse: str | None = None) -> None:
    """The end-to-end translation per net; with ``fuse`` (not the default fusions) its points
    are experiment ``translate-e2e-fuse-<fuse>`` beside the default ones (the report reads
    the default ones)."""
    from app.bench.remote import RemoteCluster
    pdir = out / "points"
    pdir.mkdir(parents=True, exist_ok=True)
    tokens, d = (4, _cfg(True)) if quick else (64, _cfg(False))
    exp = "translate-e2e" if fuse in (None, "default") else \
        f"translate-e2e-fuse-{fuse.replace(',', '+')}"
    todo = [n for n in nets if force or not (pdir / f"{exp}_{n}.json").exists()]
    bar = Progress(len(todo))
    for net in todo:
        bar.show(f"starting cluster, net {net}")
        with RemoteCluster(net, quiet=True) as rc:
            bar.show(f"{net} translate-e2e warm-up")
            translate_e2e(rc, 2, dict(d_model=8, heads=2, features=4, d_ff=8, layers=1))
            bar.show(f"{net} {exp} {tokens} tokens")
            try:
                r = translate_e2e(rc, tokens, d, fuse=fuse)
            except Exception as exc:  # noqa: BLE001 - record the failure, go on
                if not rc.alive:
                    raise
                r = {"workload": "translate-e2e", "net": net, "error": repr(exc)[:500]}
            r.update(experiment=exp, **_provenance())
            (pdir / f"{exp}_{net}.json").write_text(json.dumps(r, indent=2) + "\n")
        bar.step(f"{net} {exp}")


def _provenance() -> dict:
    import subprocess
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,  # noqa: E731
                                    text=True).stdout.strip()
    return {"host": platform.node(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", "mpc3", "protocols", "net"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    ap.add_argument("--only", default=",".join(EXPERIMENTS),
                    help=f"comma list of {', '.join(EXPERIMENTS)}")
    ap.add_argument("--nets", default="none,lan,wan", help="comma list: none, lan, wan, custom:R:RTT")
    ap.add_argument("--out", default=None, help="default benchmarks/results/paper_{quick,full}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per point (min is reported)")
    ap.add_argument("--force", action="store_true", help="re-run points that have JSON")
    ap.add_argument("--report-only", action="store_true", help="only rebuild report and plots")
    ap.add_argument("--fuse", default=None, help="translate-e2e: the decode sessions' "
                    "fusions (default, all, none or a comma list of self, cross, "
                    "ffn, wo); other than default, points go to translate-e2e-fuse-<fuse>_<net>")
    a = ap.parse_args(argv)
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    if only - set(EXPERIMENTS):
        ap.error(f"unknown experiments {sorted(only - set(EXPERIMENTS))}")
    nets = [x.strip() for x in a.nets.split(",") if x.strip()]
    out = Path(a.out) if a.out else RESULTS / ("paper_quick" if a.quick else "paper_full")
    out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        run_points(plan(a.quick, only), nets, out, a.force, a.repeat)
        if "translate-e2e" in only:
            run_e2e(nets, out, a.quick, a.force, a.fuse)
    pts = load_points(out)
    links = {}
    for f in sorted(out.glob("paper_links_*.json")):
        info = json.loads(f.read_text())
        links[info["net"]] = info
    (out / "report.md").write_text(render_report(pts, a.quick, links))
    made = plots(pts, out)
    print(f"wrote {out / 'report.md'}" + "".join(f", {p.name}" for p in made))
    bad = delay_check(pts)
    for b in bad:
        print("EMULATION CHECK FAILED:", b, file=sys.stderr)
    failed = [p for p in pts if "error" in p]
    for p in failed:
        print(f"POINT FAILED: {p.get('experiment')} {p['workload']} {p['net']}: {p['error']}",
              file=sys.stderr)
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
