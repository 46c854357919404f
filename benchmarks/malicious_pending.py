"""Where a malicious-mode prompt's pending checks accrue, kernel by kernel (issue 35: what
a flush must hold, docs/MALICIOUS.md "Flushes inside a layer"):

    python benchmarks/malicious_pending.py --prompt 16 \\
        --json benchmarks/results/malicious_pending_gpt2small_p16.json

Three in-process parties run a GPT-2-small-shaped causal LM's prompt (``mpc3 bench lm``'s
model: d 768, 12 heads, d_ff 3072, GELU, pre-LN, the max-subtracted softmax, random weights;
``--layers`` of them, default 2: the last layer computes its last row only) in malicious
mode, flushing at its end only (``--split``: also between kernels, as a job does). At every
point between kernels where a job may flush (:meth:`mpc3.checks.Checks.checkpoint`) it
records ``Checks.pending`` (the unit :data:`net.party.malicious.SPLIT_AT` counts) and the
kernel that returned there. Reported: each point's pending, its increase and whether it
flushed there, the flushes, the process's peak RSS (without ``--split`` the one flush at
the end holds everything), rounds and bytes. The largest increase is what a flush between
kernels cannot split: one kernel's claims. And where the proof's work comes from: party 0's
gate terms by the function that built their claims (a kernel's registration in
:class:`mpc3.checks.Checks` - ``product``, ``and_product``, ... - or the claims it builds at
the flush - ``compare_claims``, ``masked_injection_claims``, ``fused_claims``, ...; the
matrix products' Freivalds-reduced claims are not gate terms and are not counted).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from app.bench.lm import lm_config, make_case  # noqa: E402
from mpc3 import procinfo  # noqa: E402
from mpc3.checks import Checks  # noqa: E402
from mpc3.sim import make_parties, run_parties  # noqa: E402
from net.party.malicious import SPLIT_AT  # noqa: E402
from protocols.layers.secure_model import share_input, share_model  # noqa: E402
from protocols.stacks import causal_lm as LM  # noqa: E402


class Recording(Checks):
    """Checks that log (pending, the kernel just returned) at every point between kernels,
    and the proof's gate terms by the function that built their claims."""

    def __init__(self, p, log: list, split: int | None, terms: Counter) -> None:
        super().__init__(p, split_at=split)
        self.log, self.terms = log, terms

    def _add(self, triples) -> None:
        triples = list(triples)
        self.terms_of(sys._getframe(1), [trio[0] for trio in triples])
        super()._add(triples)

    def _wait(self, rec, make, claims, n: int) -> None:
        rec["_entry"] = self.entry               # the kernel that registered it
        super()._wait(rec, make, claims, n)

    def terms_of(self, caller, own: list) -> None:
        """Count this party's own batches (gates, terms) under the claims' builder - the
        registering method of Checks, or at the flush the claims function it calls - and
        under the kernel (the outermost profiled entry point) that registered them."""
        name, entry = caller.f_code.co_name, self.entry
        if name == "_flush":
            fn = caller.f_locals.get("claims")
            fn = getattr(fn, "func", fn)
            name = getattr(fn, "__name__", repr(fn))
            entry = caller.f_locals.get("rec", {}).get("_entry", "?")
        for c in own:
            if c is not None:
                self.terms[(name, "terms")] += c.terms
                self.terms[(name, "gates")] += c.z.size
                self.terms[("kernel", entry.rpartition(".")[2] or "?")] += c.terms

    def checkpoint(self, p, where: str = "") -> bool:
        before = self.pending
        flushed = super().checkpoint(p, where)
        if not self.depth:
            self.log.append((before, where, flushed))
        return flushed


def measure(a) -> dict:
    steps = int(a.step)
    cfg = lm_config("decoder-only", "softmax", a.d_model, a.heads, a.layers, a.d_ff, a.prompt,
                    steps, "gelu")
    w, x, y = make_case(cfg, a.prompt, steps, a.seed)
    shares, xs = share_model(cfg, w, shared_replicas=True), share_input(x)
    ys = share_input(y[0]) if steps else [None] * 3
    logs = [[], [], []]
    terms = [Counter(), Counter(), Counter()]

    def job(p, s, xx, yy):
        p.checks = Recording(p, logs[p.rank], a.split or None, terms[p.rank])
        _, state = LM.lm_prefill(p, cfg, s, xx)
        p.checks.flush(p)
        if yy is not None:              # the step alone: what its flush proves
            before = p.stats.snapshot()
            logs[p.rank].clear()
            terms[p.rank].clear()
            LM.lm_step(p, cfg, s, state, yy)
            p.checks.flush(p)
            return 1, p.stats - before
        return p.checks.flushes, p.stats.snapshot()

    t0 = time.perf_counter()
    out = run_parties(job, [(shares[r], xs[r], ys[r]) for r in range(3)],
                      parties=make_parties())
    wall = time.perf_counter() - t0
    if not logs[0] == logs[1] == logs[2]:
        raise RuntimeError("the parties' pending checks differ")
    points, prev = [], 0
    for pending, kernel, flushed in logs[0]:
        points.append({"kernel": kernel, "pending": pending, "added": pending - prev,
                       "flushed": flushed})
        prev = 0 if flushed else pending
    total = sum(v for (_, kind), v in terms[0].items() if kind == "terms")
    by_claims = {name: {"gates": terms[0][(name, "gates")], "terms": v,
                        "share": round(v / max(total, 1), 4)}
                 for (name, kind), v in terms[0].most_common() if kind == "terms"}
    by_kernel = {name: {"terms": v, "share": round(v / max(total, 1), 4)}
                 for (kind, name), v in terms[0].most_common() if kind == "kernel"}
    return {"points": points, "largest_added": max(p["added"] for p in points),
            "gate_terms_party0": total, "gate_terms_by_claims": by_claims,
            "gate_terms_by_kernel": by_kernel,
            "pending_at_end": prev, "flushes": out[0][0], "wall_s": wall,
            "rounds": max(o[1].rounds for o in out),
            "bytes_per_party": [o[1].bytes_sent for o in out],
            "peak_rss_bytes": procinfo.peak_rss()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d-ff", type=int, default=3072)
    ap.add_argument("--split", type=int, default=0,
                    help="flush between kernels from this many pending on, as a job does "
                         f"(net.party.malicious.SPLIT_AT = {SPLIT_AT}); 0 (default): only "
                         "at the end, so every point's pending is the prompt's so far")
    ap.add_argument("--step", action="store_true",
                    help="report one generated token's step after the prompt instead (its "
                         "pending checks, terms, rounds and bytes; the wall is the whole run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    result = runinfo.start("malicious_pending")
    result["shape"] = {"d_model": a.d_model, "heads": a.heads, "d_ff": a.d_ff,
                       "layers": a.layers, "prompt": a.prompt}
    result["phase"] = "step" if a.step else "prompt"
    result["split_at"] = a.split or None
    result.update(measure(a))
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
