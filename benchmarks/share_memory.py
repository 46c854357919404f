"""The model owner's peak memory while sharing a model (issue 33, item 5).

    python benchmarks/share_memory.py --json benchmarks/results/share_memory.json
    python benchmarks/share_memory.py --upload 4 64 --config C    # one upload case, one JSON line
    python benchmarks/share_memory.py --share-model gpt2small-6 --config C   # one share-model case

Three party processes on this machine (a tied local cluster). Each measured owner is a fresh
process whose peak RSS (``VmHWM``) it reports itself:

* ``upload``: :meth:`net.client.owner.ModelOwner.upload` of N float64 tensors of M MiB each from
  a lazy mapping (a tensor is generated when the upload reads it, as a model file read on
  demand would give it), against ``baseline`` - the same process's RSS just before
  (``upload``: 64 MiB tensors; ``upload_18mib``: 18 MiB, the GPT-2-small shape's largest);
* ``share_model``: ``mpc3 share-model`` of the GPT-2-small-shaped decoder-only LM of
  ``benchmarks/lm_gpt2small.py`` (d = 768, 12 heads, 12 layers, d_ff = 3072, softmax,
  GELU, vocabulary 64: 85 M shared parameters) saved as an .npz, from loading and
  calibrating the model to the verified upload; ``increase``: its peak beyond the peak of
  the same command on a tiny model of that kind (d = 16, one layer), against
  ``largest_tensor_bytes``; ``share_model_6_layers``: the same with 6 layers (half the
  model, the same tensors): what of the peak grows with the model.
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
from mpc3.procinfo import peak_rss, rss  # noqa: E402  (the repository on the path first)
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

    from net.client.owner import ModelOwner
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


def share_model_case(config: str, path: str, model_id: str) -> dict:
    """``mpc3 share-model`` in a child that reports its own peak."""
    code = ("import runpy, sys\n"
            "from mpc3 import procinfo\n"
            f"sys.argv = ['mpc3', 'share-model', {path!r}, '--config', {config!r}, "
            f"'--model-id', {model_id!r}, '--to-diagnostic-parties']\n"
            "try:\n    runpy.run_module('app.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PEAK', procinfo.peak_rss())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(f"mpc3 share-model {path} failed: {out.stderr[-2000:]}")
    peak = int(out.stdout.split("PEAK")[-1].strip())
    return {"model_file_bytes": os.path.getsize(path), "peak_rss": peak,
            "output": out.stdout.split("PEAK")[0].strip()}


#: The GPT-2-small shape (``benchmarks/lm_gpt2small.py``), and a tiny model of the same kind
#: whose share-model peak is the constant part (interpreter, libraries, gRPC, calibration code).
SHAPES = {"gpt2small": (768, 12, 12, 3072, 128), "gpt2small-6": (768, 12, 6, 3072, 128),
          "tiny": (16, 2, 1, 32, 8)}


def model_file(d: Path, name: str) -> tuple[str, int, int]:
    """A decoder-only softmax LM of ``SHAPES[name]`` as an .npz: (path, parameters, largest
    tensor's bytes)."""
    from app.bench.lm import lm_config
    from protocols import model as M
    d_model, heads, layers, d_ff, prompt = SHAPES[name]
    cfg = lm_config("decoder-only", "softmax", d_model, heads, layers, d_ff, prompt, 1, "gelu")
    w, user = M.random_weights(cfg, 0), M.random_user(cfg, 0)
    path = str(d / f"{name}.npz")
    M.save_model(path, cfg, w, user)
    return path, w.n_params(), max(v.nbytes for v in w.tensors.values())


def share_models(config: str, d: Path, name: str) -> dict:
    """``mpc3 share-model`` of the tiny model and of ``SHAPES[name]``: the latter's peak,
    and its increase over the tiny one's against its largest tensor."""
    tiny = share_model_case(config, model_file(d, "tiny")[0], f"tiny-{name}-{os.getpid()}")
    path, n_params, largest = model_file(d, name)
    sm = share_model_case(config, path, f"{name}-{os.getpid()}")
    sm.update(shape=dict(zip(("d_model", "heads", "layers", "d_ff", "max_len"), SHAPES[name])),
              parameters=n_params, largest_tensor_bytes=largest,
              model_float64_bytes=8 * n_params, tiny_model_peak_rss=tiny["peak_rss"],
              increase=sm["peak_rss"] - tiny["peak_rss"],
              increase_over_largest=(sm["peak_rss"] - tiny["peak_rss"]) / largest)
    return sm


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upload", nargs=2, type=int, metavar=("N", "MIB"))
    ap.add_argument("--share-model", choices=sorted(SHAPES), metavar="SHAPE",
                    help="one share-model case (and the tiny one), one JSON line")
    ap.add_argument("--config", help="with --upload / --share-model: a running cluster's TOML")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.upload:
        print(json.dumps(upload_case(a.config, *a.upload)))
        return 0
    if a.share_model:
        with tempfile.TemporaryDirectory(prefix="mpc3-share-mem-") as tmp:
            print(json.dumps(share_models(a.config, Path(tmp), a.share_model)))
        return 0
    import runinfo
    from app.localcluster import LocalCluster
    result = runinfo.start("share_memory")
    with tempfile.TemporaryDirectory(prefix="mpc3-share-mem-") as tmp:
        with LocalCluster(Path(tmp) / "cluster", bench=True, tied=True).start(wait=300) as c:
            cfg = str(c.path)
            result["parties_idle"] = party_memory(c)
            result["upload"] = _child(["--upload", "4", "64", "--config", cfg])
            # tensors of the GPT-2-small shape's largest size: what streaming alone costs
            result["upload_18mib"] = _child(["--upload", "4", "18", "--config", cfg])
            result["share_model"] = share_models(cfg, Path(tmp), "gpt2small")
            result["share_model_6_layers"] = share_models(cfg, Path(tmp), "gpt2small-6")
            result["parties_after_share_model"] = party_memory(c)
    runinfo.finish(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
