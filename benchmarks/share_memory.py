"""The model owner's peak memory while sharing a model (issue 33, item 5).

    python benchmarks/share_memory.py --json benchmarks/results/share_memory.json
    python benchmarks/share_memory.py --upload 4 64      # one upload case, one JSON line

Three party processes on this machine (a tied local cluster). Each measured owner is a fresh
process whose peak RSS (``VmHWM``) it reports itself:

* ``upload``: :meth:`net.client.ModelOwner.upload` of N float64 tensors of M MiB each from
  a lazy mapping (a tensor is generated when the upload reads it, as a model file read on
  demand would give it), against ``baseline`` - the same process's RSS just before;
* ``share_model``: ``mpc3 share-model`` of the GPT-2-small-shaped decoder-only LM of
  ``benchmarks/lm_gpt2small.py`` (d = 768, 12 heads, 12 layers, d_ff = 3072, softmax,
  GELU, vocabulary 64: 85 M shared parameters) saved as an .npz, from loading and
  calibrating the model to the verified upload.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from runinfo import peak_rss, rss  # noqa: E402  (benchmarks/ on the path first)
MIB = 1 << 20




class Generated(dict):
    """name -> shape; a tensor's values are drawn when it is read (not kept)."""

    def __getitem__(self, name):
        import numpy as np
        seed = sum(map(ord, name))
        return np.random.default_rng(seed).standard_normal(dict.__getitem__(self, name))


def party_memory(c) -> list[dict]:
    """RSS and peak RSS (VmHWM) of the cluster's three party processes, from /proc."""
    out = []
    for p in c.procs:
        got = {}
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS", "VmHWM")):
                    got[line.split(":")[0]] = int(line.split()[1]) * 1024
        out.append({"rss": got["VmRSS"], "peak_rss": got["VmHWM"]})
    return out


def upload_case(config: str, n: int, mib: int) -> dict:
    """In this (fresh) process: the owner's peak while uploading n tensors of ``mib`` MiB."""
    import numpy as np  # noqa: F401 - imported before the baseline

    from net.client import ModelOwner
    from net.config import load
    cfg = load(config)
    shape = (mib * MIB // 8 // 1024, 1024)
    model = Generated({f"t{k}": shape for k in range(n)})
    with ModelOwner(cfg) as owner:
        owner.list_models()                       # channels up before the baseline
        base = rss()
        owner.upload(f"synthetic-{os.getpid()}", model)
        peak = peak_rss()
        owner.delete(f"synthetic-{os.getpid()}")
    largest = mib * MIB
    return {"tensors": n, "tensor_bytes": largest, "baseline_rss": base, "peak_rss": peak,
            "increase": peak - base, "increase_over_largest": (peak - base) / largest}


def share_model_case(config: str, path: str) -> dict:
    """``mpc3 share-model`` in a child that reports its own peak."""
    code = ("import runpy, sys\n"
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
            "import runinfo\n"
            f"sys.argv = ['mpc3', 'share-model', {path!r}, '--config', {config!r}, "
            "'--model-id', 'gpt2small']\n"
            "try:\n    runpy.run_module('app.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PEAK', runinfo.peak_rss())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    peak = int(out.stdout.split("PEAK")[-1].strip())
    return {"model_file_bytes": os.path.getsize(path), "peak_rss": peak,
            "output": out.stdout.split("PEAK")[0].strip()}


def gpt2_small_file(d: Path) -> tuple[str, int, int]:
    """The GPT-2-small-shaped LM as an .npz: (path, parameters, largest tensor's bytes)."""
    from app.bench.lm import lm_config
    from protocols import model as M
    cfg = lm_config("decoder-only", "softmax", 768, 12, 12, 3072, 128, 1, "gelu")
    w, user = M.random_weights(cfg, 0), M.random_user(cfg, 0)
    path = str(d / "gpt2small.npz")
    M.save_model(path, cfg, w, user)
    return path, w.n_params(), max(v.nbytes for v in w.tensors.values())


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upload", nargs=2, type=int, metavar=("N", "MIB"))
    ap.add_argument("--config", help="with --upload: a running cluster's TOML")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.upload:
        print(json.dumps(upload_case(a.config, *a.upload)))
        return 0
    import runinfo
    from app.localcluster import LocalCluster
    result = runinfo.start("share_memory")
    with tempfile.TemporaryDirectory(prefix="mpc3-share-mem-") as tmp:
        with LocalCluster(Path(tmp) / "cluster", bench=True, tied=True).start(wait=300) as c:
            cfg = str(c.path)
            result["parties_idle"] = party_memory(c)
            result["upload"] = _child(["--upload", "4", "64", "--config", cfg])
            path, n_params, largest = gpt2_small_file(Path(tmp))
            sm = share_model_case(cfg, path)
            sm.update(parameters=n_params, largest_tensor_bytes=largest,
                      model_float64_bytes=8 * n_params)
            result["share_model"] = sm
            result["parties_after_share_model"] = party_memory(c)
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
