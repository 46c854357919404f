"""What one cheating party does to each kernel's output in semi-honest mode, measured (issue
35's baseline; docs/SECURITY.md, "What a cheating party can do in semi-honest mode"):

    python benchmarks/tamper_semihonest.py --json benchmarks/results/tamper_semihonest.json

Every kernel of the catalog (mpc3.kernels.catalog) runs on three in-process parties on the
operands and PRG seeds of tests/mpc3/test_kernel_catalog.py's exact-cost test at its larger
size (64 elements, matmul 8x16x8, exact truncation), once honestly and then ``--trials``
times for each deviation, each time at a message drawn uniformly (seeded) from the honest
run's messages, the cheater being that message's sender (mpc3.tamper):

* ``add-1``: +1 to one entry (one ulp of a ring element; one unit of a packed byte);
* ``add-random``: a uniform nonzero 64-bit error added to one entry (modulo its width);
* ``flip``: one uniformly drawn bit of one entry;

and, on whole messages: ``replace`` (fresh uniform entries), ``replay`` (an earlier message
of the same link re-tagged; none in a kernel of one round) and ``duplicate`` (posted twice).

Each trial's outcome, from the three parties' outputs as the query user would take them:

* ``raised_in_protocol`` - some party raised (a shape or op-counter check; the job aborts);
* ``raised_at_reveal`` - the replicas of an output slot disagree (the client's check,
  :func:`mpc3.sharing.reveal`, or the parties' opened values differ);
* ``unchanged`` - the revealed value equals the honest run's, bit for bit;
* ``changed_within_tolerance`` - it differs, but stays inside the kernel's documented error
  bound against the float64 reference (silently altered, still a "right" answer);
* ``changed_beyond_tolerance`` - it differs beyond the bound: a wrong answer nobody notices.

Trials are also split by where the message lies: in the kernel's last round (the one that
delivers the output shares) or earlier.

Counts are exact for these draws (seeded: the same command gives the same table); they are
frequencies over the messages of one job each, not probabilities over all inputs.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from mpc3 import tamper  # noqa: E402
from mpc3.comm import NEXT  # noqa: E402
from mpc3.kernels import catalog  # noqa: E402

SIZE = (64, (8, 16, 8))              # the exact-cost test's larger size: elements, MxKxN
SINGLE = ("add-1", "add-random", "flip")     # one entry or one bit of one message
WHOLE = ("replace", "replay", "duplicate")    # a whole message (mpc3.tamper's kinds)
DEVIATIONS = SINGLE + WHOLE
OUTCOMES = ("unchanged", "changed_within_tolerance", "changed_beyond_tolerance",
            "raised_at_reveal", "raised_in_protocol")
LABELS = dict(zip(OUTCOMES, ("unchanged", "changed, in tolerance", "changed, beyond tolerance",
                             "raised at reveal", "raised in protocol")))


def deviation(name: str, rng: np.random.Generator, seed: int) -> tamper.Deviation:
    if name == "add-1":
        return tamper.Deviation("add", error=1, seed=seed)
    if name == "add-random":
        return tamper.Deviation("add", error=int(rng.integers(1, 2 ** 64, dtype=np.uint64)),
                                seed=seed)
    return tamper.Deviation(name, seed=seed)


def outcome(case: tamper.Case, bad: tamper.Outcome, honest: np.ndarray) -> tuple[str, dict]:
    """The trial's outcome and its details (the exception, the largest change)."""
    if bad.error is not None:
        return "raised_in_protocol", {"exception": _one_line(bad.error)}
    try:
        value = case.kernel.value(bad.results, case.cfg)
    except ValueError as exc:
        return "raised_at_reveal", {"exception": _one_line(exc)}
    if np.array_equal(value, honest):
        return "unchanged", {}
    change = {"max_abs_change": float(np.max(np.abs(value - honest))),
              "elements_changed": int(np.sum(value != honest))}
    err = np.abs(value - case.kernel.reference(*case.plain))
    if (err <= case.kernel.bound(case.plain, case.cfg)).all():
        return "changed_within_tolerance", change
    return "changed_beyond_tolerance", change


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def kernel_trials(name: str, trials: int, seed: int) -> dict:
    case = tamper.catalog_case(name, *SIZE)
    honest = case.run()
    if honest.error is not None:
        raise honest.error
    value = case.kernel.value(honest.results, case.cfg)
    rng = np.random.default_rng([seed, *name.encode()])
    rows, counts, exceptions = [], {d: Counter() for d in DEVIATIONS}, Counter()
    last = max(s.op for s in honest.sent)          # the round that delivers the output
    for dev_name in DEVIATIONS:
        for t in range(trials):
            dev = deviation(dev_name, rng, int(rng.integers(2 ** 32)))
            try:
                target = tamper.draw(honest.sent, rng, dev.kind)
            except tamper.NotApplicable:             # replay: no earlier message
                break
            bad = case.run(target, dev)
            result, details = outcome(case, bad, value)
            counts[dev_name][result] += 1
            rec, = bad.records
            rows.append(_row(dev_name, rec, rec.op == last, result, details))
            if "exception" in details:
                exceptions[details["exception"]] += 1
    return {"messages": len(honest.sent), "rounds": max(s.rounds for s in honest.stats),
            "counts": {d: {o: counts[d][o] for o in OUTCOMES} for d in DEVIATIONS},
            "exceptions": dict(exceptions.most_common()), "trials": rows}


#: the fields of a trial's row, in order (one line each in the JSON, to keep it small)
ROW = ("deviation", "party", "direction", "op", "k", "array", "element", "bit", "error",
       "replayed_op", "last_round", "outcome", "max_abs_change")


def _row(dev_name: str, rec: tamper.Record, last: bool, result: str, details: dict) -> str:
    """``deviation=add-1 party=2 direction=prev op=1 ... outcome=raised_at_reveal``: the
    fields of :data:`ROW` the trial has (direction as next/prev)."""
    got = {**rec.as_dict(), "deviation": dev_name, "last_round": last, "outcome": result,
           **details}
    got["direction"] = "next" if rec.direction == NEXT else "prev"
    return " ".join(f"{f}={got[f]}" for f in ROW if f in got)


def parse_row(row: str) -> dict:
    """A trial's row as a dict of strings (``last_round`` a bool)."""
    got = dict(f.split("=", 1) for f in row.split(" "))
    got["last_round"] = got["last_round"] == "True"
    return got


def table(result: dict) -> str:
    """The Markdown tables of docs/SECURITY.md: per kernel and per round position, the
    single-entry deviations' outcomes; per deviation, all of them."""
    def block(first: str, rows) -> list[str]:
        return ([f"| {first} | " + " | ".join(LABELS[o] for o in OUTCOMES) + " |",
                 "|---|" + "---|" * len(OUTCOMES)]
                + [f"| {label} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |"
                   for label, c in rows])

    kernels = result["kernels"]
    per_kernel = [(f"{n} ({k['messages']})", sum((Counter(k["counts"][d]) for d in SINGLE),
                                                 Counter())) for n, k in kernels.items()]
    total = sum((c for _, c in per_kernel), Counter())
    per_kernel.append(("**all**", {o: f"**{total[o]}**" for o in OUTCOMES}))
    per_dev = [(d, Counter({o: sum(k["counts"][d][o] for k in kernels.values())
                            for o in OUTCOMES})) for d in DEVIATIONS]
    by_round = Counter((t["last_round"], t["outcome"]) for k in kernels.values()
                       for t in map(parse_row, k["trials"]) if t["deviation"] in SINGLE)
    rounds = [(label, {o: by_round[(last, o)] for o in OUTCOMES})
              for last, label in ((True, "in the kernel's last round"),
                                  (False, "in an earlier round"))]
    return "\n".join(block("kernel (messages, 3 parties)", per_kernel) + [""]
                     + block("deviation", per_dev) + [""] + block("message", rounds))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8, help="per kernel and deviation")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--only", help="comma-separated kernel names (default: the catalog)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--table", action="store_true", help="print the Markdown table only")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(catalog.KERNELS)
    result = runinfo.start("tamper_semihonest")
    result["command"] = "python benchmarks/tamper_semihonest.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    result["params"] = {"elements": SIZE[0], "matmul_shape": list(SIZE[1]), "trunc": "exact",
                        "trials_per_kernel_and_deviation": args.trials, "seed": args.seed,
                        "deviations": list(DEVIATIONS)}
    t0 = time.perf_counter()
    result["kernels"] = {n: kernel_trials(n, args.trials, args.seed) for n in names}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["table_markdown"] = table(result)
    if args.table:
        print(result["table_markdown"])
        return
    runinfo.finish(result, args.json)


if __name__ == "__main__":
    main()
