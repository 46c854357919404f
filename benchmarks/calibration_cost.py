"""What calibration costs: the model owner's ``calibrate_model`` (what ``mpc3 share-model``
and ``mpc3 import`` run before sharing) on the shipped models and on the GPT-2-small shape,
each read from its file as share-model reads it (one tensor at a time), and a party's check
that a stored calibration covers the sites of a config of MAX_LAYERS layers
(``protocols.calibration.check.sites_reached``, run when a model is shared and before its first
job). Each case runs in a fresh process: its seconds and its peak RSS (VmHWM).

    python benchmarks/calibration_cost.py --json benchmarks/results/calibration_cost.json
    python benchmarks/calibration_cost.py --code /path/to/other/checkout --json OUT
        (the same cases on another checkout's code: compare two commits in one sitting)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import runinfo

ROOT = runinfo.ROOT

_CALIBRATE = """
import sys, time
from mpc3.procinfo import peak_rss
from app.owner import calibrate_model
from protocols import model as M
cfg, w, user = M.load_model(sys.argv[1], lazy=True)
t = time.perf_counter()
calibrate_model(cfg, w, user)
print(time.perf_counter() - t, peak_rss())
"""

_SITES = """
import sys, time
from mpc3.procinfo import peak_rss
from app.bench.lm import lm_config
try:                                 # --code of a checkout before the rooms (fd44a92)
    from protocols.calibration.check import MAX_LAYERS, sites_reached
except ImportError:
    from protocols.calibration_check import MAX_LAYERS, sites_reached
cfg = lm_config("decoder-only", sys.argv[1], 64, 4, MAX_LAYERS, 128, 64, 1, "gelu")
t = time.perf_counter()
sites_reached(cfg)
print(time.perf_counter() - t, peak_rss(), MAX_LAYERS)
"""

_GPT2 = """
import sys
from app.bench.lm import lm_config
from protocols import model as M
cfg = lm_config("decoder-only", "softmax", 768, 12, 12, 3072, 128, 1, "gelu")
M.save_model(sys.argv[1], cfg, M.random_weights(cfg, 0, lazy=True), M.random_user(cfg, 0))
"""


def child(code: Path, script: str, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                         text=True, cwd=code, env={**os.environ, "PYTHONPATH": str(code),
                                                   "OPENBLAS_NUM_THREADS": "1"})
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return out.stdout.split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose code runs")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    code = a.code.resolve()
    result = runinfo.start("calibration_cost")
    result["code"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code,
                                    capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, str(code))
    from app import textdata as TD
    models = {"classifier": TD.SHIPPED_CLASSIFIER, "translator": TD.SHIPPED_MODEL,
              **{f"lm-{k}": v for k, v in TD.SHIPPED_LMS.items()}}
    cases = {}
    with tempfile.TemporaryDirectory(prefix="mpc3-cal-cost-") as tmp:
        gpt2 = Path(tmp) / "gpt2small.npz"
        child(code, _GPT2, str(gpt2))
        models["gpt2small-shape"] = gpt2
        for name, path in models.items():
            s, peak = child(code, _CALIBRATE, str(path))
            cases[name] = {"seconds": round(float(s), 2), "peak_rss_mb": int(peak) / 1e6}
            print(name, cases[name], flush=True)
    for attention in ("softmax", "relu-performer"):
        s, peak, layers = child(code, _SITES, attention)
        cases[f"sites_reached-{attention}-{layers}-layers"] = {
            "seconds": round(float(s), 2), "peak_rss_mb": int(peak) / 1e6}
        print(attention, cases[f"sites_reached-{attention}-{layers}-layers"], flush=True)
    result["cases"] = cases
    runinfo.finish(result, Path(a.json) if a.json else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
