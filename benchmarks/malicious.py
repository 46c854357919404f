"""Malicious mode against semi-honest on a whole encoder stack, and a tamper campaign
(issue 35's table; docs/MALICIOUS.md, "Whole workloads"):

    python benchmarks/malicious.py --json benchmarks/results/malicious_encoder.json
    python benchmarks/malicious.py --quick --json benchmarks/results/malicious_encoder_quick.json
    python benchmarks/malicious.py --tiny --campaign 200 --honest 20 \\
        --json benchmarks/results/malicious_campaign_tiny.json

Three in-process parties run the encoder workload (``mpc3 bench layer encoder``'s secure
code, random weights of the given shape, uniform inputs) in both modes from the same shares:

* semi-honest: the stack as it is;
* malicious: each party carries :class:`mpc3.checks.Checks`; the input's and every weight's
  sharing go through ``shared_input`` (as the job runner does); the stack flushes at each
  layer's end (``on_layer``), inside a layer between kernels once ``--split`` checks are
  pending (a job's :data:`net.party.malicious.SPLIT_AT` by default), and once more before
  the output is opened.

Reported per mode: bytes each party sent, rounds, wall time (one run each, same process,
same load), the output's error against the float64 reference, the gates and gate terms party 0
proves at each flush (matrix products' reduced claims not counted; its mod-2 gates' terms over
GF(2^64) apart, ``mod2_gate_terms_party0``, padding bits included), the bytes party 0 sent
at its flushes by part (``flush_bytes_party0``: digests, each witness by the claims that
read it, the proof; :attr:`mpc3.checks.Checks.flush_bytes`) - the rest of the bytes
malicious mode adds are sent inside the kernels (``extra_bytes_party0``) - and the process's peak
RSS after the mode's run (VmHWM: the three parties together; semi-honest runs first);
``--kernels``: also the seconds malicious mode spends in each of the proof's compute kernels,
by kind (:func:`timed_kernels`). ``--campaign N``: N runs in
malicious mode with one deviation each (``add`` of a uniform nonzero error to one entry, or
``flip`` of one bit, alternately), at a message drawn uniformly (seeded) among every message
of the honest malicious run - the kernels' and the flushes' - the cheater being its sender;
each trial's outcome is ``aborted`` (CheatingDetected or another protocol error at some
party, before the output is opened; ``aborts_by_error`` counts them by the error's type), ``unchanged`` (no abort and the opened output equals,
bit for bit, that of an honest run with the trial's keys - each trial draws its parties'
keys from the campaign's seed, as stochastic rounding makes outputs differ by an ulp from
keys to keys: the deviation touched bits nothing reads; a packed message's padding is
refused since bc1193c, so none is known)
or ``undetected`` (no abort, a different output). ``--honest M`` runs M honest
malicious-mode jobs (fresh keys each) and counts aborts. ``--minutes T``: the campaign
stops starting trials when the honest runs would no longer fit in T minutes (``trials``
in the JSON counts those that ran, ``trials_asked`` the N asked for).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from mpc3 import dzkp, dzkp_bits, procinfo, ring, tamper  # noqa: E402
from mpc3 import dzkp_kernels as dk  # noqa: E402
from mpc3 import dzkp_ring_kernels as rk  # noqa: E402
from mpc3.checks import Checks  # noqa: E402
from mpc3.comm import ProtocolError  # noqa: E402
from mpc3.sharing import reveal  # noqa: E402
from mpc3.sim import make_parties, run_parties  # noqa: E402
from net.party.malicious import SPLIT_AT  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.jobs import workloads  # noqa: E402
from protocols.layers.secure_model import deal_tensors, plain_tensors, share_input  # noqa: E402
from protocols.stacks.encoder import encoder  # noqa: E402

TABLE2 = dict(seq=64, d_model=512, heads=8, features=266, d_ff=2048, layers=6)
QUICK = dict(seq=16, d_model=64, heads=4, features=44, d_ff=128, layers=1)
TINY = dict(seq=4, d_model=16, heads=2, features=8, d_ff=32, layers=1)


def config(shape: dict, enc_layers: int, dec_layers: int) -> M.ModelConfig:
    """The model of a benchmark ``shape`` (Privformer's attention: ReLU features, c/(r n))."""
    return M.ModelConfig(d_model=shape["d_model"], n_heads=shape["heads"],
                         d_head=shape["d_model"] // shape["heads"],
                         n_features=shape["features"], d_ff=shape["d_ff"],
                         n_enc_layers=enc_layers, n_dec_layers=dec_layers,
                         attn_c=1.0 / (shape["features"] * shape["seq"]), attn_norm="const",
                         norm_first=False, src_vocab=2, tgt_vocab=2,
                         max_len=shape["seq"]).validate()


def _case(shape: dict, seed: int = 0):
    cfg = config(shape, shape["layers"], 0)
    w = M.random_weights(cfg, seed=seed)
    wl = workloads.get("encoder")
    opts = workloads.Options(fold=True, block=None, decode_block=None, exp="poly",
                             input_range=None)
    inputs, ref = wl.case(cfg, w, 1, np.random.default_rng(seed + 1), opts)
    shares = deal_tensors(plain_tensors(cfg, w, fold_omega=True), prefixes=wl.prefixes,
                          shared_replicas=True)
    x = share_input(inputs[0])
    return cfg, [(shares[i], x[i]) for i in range(3)], ref


def _job(cfg, malicious: bool, split: int | None = SPLIT_AT):
    """The encoder on three parties; in malicious mode its checks flush at every layer's end
    and, inside a layer, between kernels from ``split`` pending on (None: never)."""
    def job(p, sh, x):
        if malicious:
            p.checks = Checks(p, split_at=split)
            p.checks.shared_input(x)
            for name in sorted(sh):
                p.checks.shared_input(sh[name])
        y = encoder(p, cfg, sh, x, on_layer=(lambda _: p.checks.flush(p)) if malicious
                    else None)
        if malicious:
            p.checks.flush(p)
        return y, p.stats.snapshot(), dict(p.checks.flush_bytes) if malicious else {}
    return job


#: the proof's compute kernels ``--kernels`` times: (module, name)
KERNELS = ((dk, "gram_int"), (dk, "fold_int"), (rk, "gram_ring"), (rk, "fold_ring"))


def _kind(name: str, x) -> str:
    """A kernel call's class: the Z_2^64 ones by their rows' form (bits or words) and
    count (a gate's terms: 1, 2 or wider), the Galois-ring ones by size (the first ring
    step, over 2^16 elements, or later ones)."""
    if name.endswith("_int"):
        rows = x.shape[0]
        return (f"{name} {'bits' if x.dtype == np.uint8 else 'words'} "
                f"{rows if rows < 3 else 'wide'}")
    return f"{name} {'first' if x.shape[1] > 1 << 16 else 'later'}"


@contextlib.contextmanager
def timed_kernels(into: Counter):
    """While active, each proof kernel call's wall seconds, by :func:`_kind`, are added to
    ``into`` (summed over the parties' threads: three parties share this machine's cores,
    so the sum exceeds the wall time)."""
    lock, saved = threading.Lock(), {(m, n): getattr(m, n) for m, n in KERNELS}

    def wrap(name, f):
        def timed(x, *rest, **kw):
            t0 = time.perf_counter()
            try:
                return f(x, *rest, **kw)
            finally:
                with lock:
                    into[_kind(name, x)] += time.perf_counter() - t0
        return timed
    for (module, name), f in saved.items():
        setattr(module, name, wrap(name, f))
    try:
        yield
    finally:
        for (module, name), f in saved.items():
            setattr(module, name, f)


def measure(cfg, args, ref, malicious: bool, kernels: bool = False,
            split: int | None = SPLIT_AT) -> dict:
    parties = make_parties()
    terms, gates = [], []               # gate terms and gates party 0 proves, per flush
    bit_terms = []                      # its mod-2 gate terms (padding bits included)
    verify, verify_bits = dzkp.verify_claims, dzkp_bits.verify_bits
    spent = Counter()

    def counted(p, mine, *rest, **kw):
        if p.rank == 0:
            terms.append(sum(c.terms for c in mine))
            gates.append(sum(c.z.size for c in mine))
        return verify(p, mine, *rest, **kw)

    def counted_bits(p, mine, *rest):
        if p.rank == 0:
            bit_terms.append(sum(c.terms for c in mine))
        return verify_bits(p, mine, *rest)
    dzkp.verify_claims, dzkp_bits.verify_bits = counted, counted_bits
    try:
        with timed_kernels(spent) if kernels else contextlib.nullcontext():
            t0 = time.perf_counter()
            out = run_parties(_job(cfg, malicious, split), args, parties=parties)
            wall = time.perf_counter() - t0
    finally:
        dzkp.verify_claims, dzkp_bits.verify_bits = verify, verify_bits
    y = ring.decode(reveal([o[0] for o in out]))
    stats = [o[1] for o in out]
    return {"bytes_per_party": [s.bytes_sent for s in stats],
            "rounds": max(s.rounds for s in stats), "wall_s": wall,
            "proof_gate_terms_party0": terms, "proof_gates_party0": gates,
            "mod2_gate_terms_party0": bit_terms,
            **({"flush_bytes_party0": dict(sorted(out[0][2].items()))} if malicious else {}),
            "peak_rss_bytes": procinfo.peak_rss(),
            "max_abs_err": float(np.max(np.abs(y - ref))), "output": y,
            **({"proof_kernel_s_summed_over_parties": {
                k: round(v, 3) for k, v in spent.most_common()}} if kernels else {})}


def campaign(job, args, trials: int, honest: int, seed: int, opened=None,
             span=None, minutes: float | None = None) -> dict:
    """``trials`` runs of ``job`` (malicious mode) with one deviation each at a message drawn
    uniformly (seeded) among the honest run's - those whose op lies in ``span(results)``
    (lo, hi], if given - and ``honest`` honest runs; ``opened(results)``: the revealed
    output compared with the honest one (default: each party's result's first item).
    ``minutes``: a budget - no trial starts once the honest runs, at the first honest run's
    time each, would end past it (``trials`` then counts those that ran)."""
    opened = opened or (lambda results: reveal([r[0] for r in results]))
    t0 = time.perf_counter()
    clean = tamper.run(job, args, make_parties())
    reserve = honest * (time.perf_counter() - t0)
    if clean.error is not None:
        raise RuntimeError(f"the honest run failed: {clean.error}")
    lo, hi = span(clean.results) if span else (0, float("inf"))
    pool = [s for s in clean.sent if s.entries and lo < s.op <= hi]
    rng = np.random.default_rng(seed)
    outcomes, where, errors = Counter(), Counter(), Counter()
    kinds = ("add", "flip")
    ran = 0
    for t in range(trials):
        if minutes is not None and time.perf_counter() - t0 + reserve > 60 * minutes:
            break
        ran += 1
        kind = kinds[t % 2]
        s = pool[int(rng.integers(len(pool)))]
        dev = tamper.Deviation(kind, error=int(rng.integers(1, 1 << 63)), seed=int(t))
        keys = rng.bytes(16)            # the trial's keys; its honest twin's, if needed
        got = tamper.run(job, args, make_parties(seed=keys),
                         tamper.Target(s.party, s.direction, op=s.op), dev)
        if got.error is not None:
            outcome = "aborted"
            errors[type(got.error).__name__] += 1
        else:                           # the same keys, no deviation: bit for bit?
            twin = run_parties(job, args, parties=make_parties(seed=keys))
            same = np.array_equal(opened(got.results), opened(twin))
            outcome = "unchanged" if same else "undetected"
        outcomes[outcome] += 1
        where[(kind, outcome)] += 1
        print(f"trial {t}: {kind} at op {s.op} of party {s.party}: {outcome}",
              file=sys.stderr, flush=True)
        del got
        gc.collect()       # an aborted run's tracebacks hold its arrays in reference cycles
    honest_aborts = 0
    for _ in range(honest):
        try:
            run_parties(job, args, parties=make_parties())
        except ProtocolError:
            honest_aborts += 1
    return {"trials": ran, "trials_asked": trials, "minutes": minutes,
            "messages_in_pool": len(pool), "outcomes": dict(outcomes),
            "by_kind": {f"{k}/{o}": n for (k, o), n in sorted(where.items())},
            "aborts_by_error": dict(errors),
            "honest_runs": honest, "honest_aborts": honest_aborts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"the shape {QUICK} (else Table 2)")
    ap.add_argument("--tiny", action="store_true", help=f"the shape {TINY} (campaigns)")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    ap.add_argument("--seq", type=int, help="override the shape's sequence length")
    ap.add_argument("--campaign", type=int, default=0, help="tampered runs")
    ap.add_argument("--honest", type=int, default=0, help="honest malicious-mode runs")
    ap.add_argument("--minutes", type=float,
                    help="the campaign's budget: fewer trials if they would overrun it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", action="store_true",
                    help="time the proof's kernels in malicious mode, by kind")
    ap.add_argument("--split", type=int, default=SPLIT_AT,
                    help="flush inside a layer, between kernels, from this many pending "
                         "checks on (0: only at layers' ends); default: a job's "
                         "(net.party.malicious.SPLIT_AT)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    shape = dict(TINY if a.tiny else QUICK if a.quick else TABLE2)
    for key in ("layers", "seq"):
        if getattr(a, key):
            shape[key] = getattr(a, key)
    result = runinfo.start("malicious")
    result["shape"] = shape
    cfg, args, ref = _case(shape, a.seed)
    split = a.split or None
    result["split_at"] = split
    semi = measure(cfg, args, ref, False)
    mal = measure(cfg, args, ref, True, a.kernels, split)
    result["semi_honest"] = {k: v for k, v in semi.items() if k != "output"}
    result["malicious"] = {k: v for k, v in mal.items() if k != "output"}
    extra = mal["bytes_per_party"][0] - semi["bytes_per_party"][0]
    flushed = sum(mal["flush_bytes_party0"].values())
    result["extra_bytes_party0"] = {"flushes": flushed, "inside_kernels": extra - flushed}
    result["ratio"] = {"bytes": max(mal["bytes_per_party"]) / max(semi["bytes_per_party"]),
                       "rounds": mal["rounds"] / semi["rounds"],
                       "wall": mal["wall_s"] / semi["wall_s"]}
    if a.campaign or a.honest:
        result["campaign"] = campaign(_job(cfg, True, split), args, a.campaign, a.honest,
                                      a.seed, minutes=a.minutes)
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
