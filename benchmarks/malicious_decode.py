"""Malicious mode against semi-honest on translation decoding steps (issue 35's "bytes and
rounds per generated token"; docs/MALICIOUS.md, "Whole workloads"):

    python benchmarks/malicious_decode.py --json benchmarks/results/malicious_decode.json

Three in-process parties run the Table 2 decoder's incremental decoding (``decoder-step``'s
secure code: :meth:`protocols.stacks.decoder.DecodeState.start` on the encoder output, then
:func:`protocols.stacks.decoder.decoder_step` per token; random weights of the shape,
uniform inputs) in both modes from the same shares. Malicious mode passes the inputs and
weights through ``shared_input``; the start computes the cross attentions layer by layer
and flushes after each once the pending checks are large, and once at its end, and each
token flushes once, as a job does (``net.party.malicious.FLUSH_AT``; a decoding step's
layers are small): each generated token pays one proof. Reported per mode: the start's and
each token's bytes per party, rounds and wall (one run each, same process), the output's
error against the float64 reference, and the gates party 0 proves at each flush.
``--campaign N`` (and ``--honest M``): malicious.py's tamper campaign on the last token -
each trial one deviation at a message drawn uniformly among that token's (its kernels'
and its flush's), every generated token compared with the honest run's:

    python benchmarks/malicious_decode.py --tiny --tokens 1 --campaign 200 --honest 20 \\
        --json benchmarks/results/malicious_decode_campaign_tiny.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from malicious import TABLE2, TINY, campaign, config  # noqa: E402
from mpc3 import dzkp, procinfo, ring  # noqa: E402
from mpc3.checks import Checks  # noqa: E402
from mpc3.sharing import reveal  # noqa: E402
from mpc3.sim import make_parties, run_parties  # noqa: E402
from net.party.malicious import FLUSH_AT  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.jobs import workloads  # noqa: E402
from protocols.layers.secure_model import deal_tensors, plain_tensors, share_input  # noqa: E402
from protocols.stacks import decoder as D  # noqa: E402

def _case(shape: dict, seed: int = 0):
    cfg = config(shape, 1, shape["layers"])          # the encoder's weights go unused
    w = M.random_weights(cfg, seed=seed)
    wl = workloads.get("decoder-step")
    opts = workloads.Options(fold=True, block=None, decode_block=None, exp="poly",
                             input_range=None)
    (ys, es), ref = wl.case(cfg, w, 1, np.random.default_rng(seed + 1), opts)
    shares = deal_tensors(plain_tensors(cfg, w, fold_omega=True), prefixes=wl.prefixes,
                          shared_replicas=True)
    y, e = share_input(ys), share_input(es)
    return cfg, [(shares[i], y[i], e[i]) for i in range(3)], ref


def _job(cfg, tokens: int, malicious: bool):
    def job(p, sh, ys, es):
        phases, outs = [], []

        def phase(run):
            before, t0 = p.stats.snapshot(), time.perf_counter()
            out = run()
            if p.checks is not None:
                p.checks.flush(p)
            spent = p.stats - before
            phases.append((spent.bytes_sent, spent.rounds, time.perf_counter() - t0))
            return out
        if malicious:
            p.checks = Checks(p)
            for s in (ys, es, *(sh[name] for name in sorted(sh))):
                p.checks.shared_input(s)

        def mark(_):                                 # the job runner's policy at a layer end
            if p.checks is not None and p.checks.pending >= FLUSH_AT:
                p.checks.flush(p)
        st = phase(lambda: D.DecodeState.start(p, cfg, sh, es, on_layer=mark))
        for t in range(tokens):
            first = p.comm.op
            outs.append(phase(lambda: D.decoder_step(p, cfg, sh, st, ys[:, t])))
        return outs, phases, (first, p.comm.op)        # the last token's messages' ops
    return job


def measure(cfg, args, ref, tokens: int, malicious: bool) -> dict:
    gates = []
    verify = dzkp.verify_claims

    def counted(p, mine, *rest, **kw):
        if p.rank == 0:
            gates.append(sum(c.z.size for c in mine))
        return verify(p, mine, *rest, **kw)
    dzkp.verify_claims = counted
    try:
        out = run_parties(_job(cfg, tokens, malicious), args, parties=make_parties())
    finally:
        dzkp.verify_claims = verify
    ys = [ring.decode(reveal([o[0][t] for o in out])) for t in range(tokens)]
    err = max(float(np.max(np.abs(y - ref[:, t]))) for t, y in enumerate(ys))
    phases = [o[1] for o in out]                     # per party: [start, token 0, ...]

    def row(i):
        return {"bytes_per_party": [ph[i][0] for ph in phases],
                "rounds": max(ph[i][1] for ph in phases),
                "wall_s": max(ph[i][2] for ph in phases)}
    return {"start": row(0), "tokens": [row(1 + t) for t in range(tokens)],
            "proof_gates_party0": gates, "peak_rss_bytes": procinfo.peak_rss(),
            "max_abs_err": err}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help=f"the shape {TINY} (else Table 2)")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    ap.add_argument("--tokens", type=int, default=2, help="decoding steps measured")
    ap.add_argument("--campaign", type=int, default=0, help="tampered runs (the last token)")
    ap.add_argument("--honest", type=int, default=0, help="honest malicious-mode runs")
    ap.add_argument("--minutes", type=float,
                    help="the campaign's budget: fewer trials if they would overrun it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    shape = dict(TINY if a.tiny else TABLE2)
    if a.layers:
        shape["layers"] = a.layers
    if not 1 <= a.tokens <= shape["seq"]:
        ap.error(f"--tokens must be in 1..{shape['seq']}")
    result = runinfo.start("malicious_decode")
    result["shape"], result["tokens"] = shape, a.tokens
    cfg, args, ref = _case(shape)
    semi = measure(cfg, args, ref, a.tokens, False)
    mal = measure(cfg, args, ref, a.tokens, True)
    result["semi_honest"], result["malicious"] = semi, mal
    last = (semi["tokens"][-1], mal["tokens"][-1])
    result["last_token_ratio"] = {
        "bytes": round(sum(last[1]["bytes_per_party"]) / sum(last[0]["bytes_per_party"]), 4),
        "rounds": round(last[1]["rounds"] / last[0]["rounds"], 4),
        "wall": round(last[1]["wall_s"] / last[0]["wall_s"], 2)}
    if a.campaign or a.honest:
        result["campaign"] = campaign(
            _job(cfg, a.tokens, True), args, a.campaign, a.honest, a.seed,
            opened=lambda res: np.stack([reveal([r[0][t] for r in res])
                                         for t in range(a.tokens)]),
            span=lambda res: res[0][2], minutes=a.minutes)
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
