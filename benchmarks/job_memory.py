"""A job's working memory: the estimate a party admits it by (protocols.jobs.memory) against
the peak RSS increase measured, and the RSS left when it ended (issue 33, item 5).

    python benchmarks/job_memory.py --json benchmarks/results/job_memory.json
    python benchmarks/job_memory.py --one softmax 64 52      # one case, one JSON line

Each case is a fresh process holding three in-process parties (net.party.inproc, the party's
runner and its malloc settings, net.party.malloc.keep_freed_memory) of a shipped LM
(app/assets/lm_*.npz): a warm-up ``lm_prefill`` at B = 1, T = 4 (the kernels'
compilation), then RSS (``base``), one ``lm_prefill`` of B x T random rows, then the peak
(``VmHWM``) and RSS ``after`` it (the runner has returned the freed heap to the OS,
:func:`net.party.malloc.trim`; the session's KV caches are still held, ``session_bytes``).
Per party = the increase / 3 (the three parties compute at once).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from mpc3.procinfo import peak_rss, rss  # noqa: E402  (the repository on the path first)
CASES = [("softmax", 64, 52), ("softmax", 256, 52), ("softmax", 128, 24),
         ("relu-performer", 128, 52)]




def one(attention: str, B: int, T: int) -> dict:
    from net.party import malloc
    malloc.keep_freed_memory()

    import numpy as np

    from mpc3 import ring
    from mpc3.sharing import deal
    from net.party.inproc import InprocParties
    from protocols import model as M
    from app import textdata as TD
    from protocols.jobs import PRODUCTION
    from protocols.jobs.memory import job_memory
    cfg, w, _ = M.load_model(TD.SHIPPED_LMS[attention])
    ps = InprocParties.for_model(cfg, w)

    def x(b: int, t: int) -> list[dict]:
        z = np.random.default_rng(0).standard_normal((b, t, cfg.d_model)) * 0.5
        return [{"X": s} for s in deal(ring.encode(z))]
    ps.run("lm_prefill", {"session": "warm"}, x(1, 4))
    est = job_memory(PRODUCTION.get("lm_prefill"), ps.models[0], {"X": (B, T, cfg.d_model)})
    inputs = x(B, T)
    base = rss()
    ps.run("lm_prefill", {"session": "s"}, inputs)
    peak = peak_rss()
    after = rss()
    state = sum(a.nbytes for r in ps.runners for a in
                _arrays(r.sessions.acquire("s", "inproc", "inproc", ps.upload_id).state))
    return {"attention": attention, "B": B, "T": T, "estimate_per_party": est,
            "measured_increase_per_party": (peak - base) / 3,
            "ratio": est / ((peak - base) / 3), "base_rss": base, "peak_rss": peak,
            "after_rss": after, "session_bytes": state}


def _arrays(obj):
    """The numpy arrays a session state holds (for its size)."""
    import gc

    import numpy as np
    seen, stack = set(), [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (str, bytes, int, float, type)):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            yield o
            continue
        stack.extend(gc.get_referents(o))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("ATTENTION", "B", "T"))
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), int(a.one[2]))))
        return 0
    import runinfo
    result = runinfo.start("job_memory")
    result["cases"] = []
    for att, B, T in CASES:
        out = subprocess.run([sys.executable, __file__, "--one", att, str(B), str(T)],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        result["cases"].append(json.loads(out.stdout.strip().splitlines()[-1]))
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
