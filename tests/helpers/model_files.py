"""Small model files of every format ``mpc3 import`` reads, valid and hostile, built without
torch or the hub (mpc3's own writers; Hugging Face names written by hand), and a runner that
measures a command's peak memory in a child process (tests/protocols/model/test_model_hostile.py,
tests/protocols/model/test_model_fuzz.py)."""
import json
import os
import resource
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from protocols import model as M
from protocols.model import safetensors as ST

ROOT = Path(__file__).resolve().parents[2]
D, H, F, V, P, C = 8, 2, 16, 11, 6, 3          # the tiny HF checkpoints' sizes


def tiny_cfg(**kw) -> M.ModelConfig:
    args = dict(d_model=8, n_heads=2, d_head=4, n_features=4, d_ff=16, n_enc_layers=1,
                n_dec_layers=1, attn_c=0.5, attn_norm="mean", norm_first=False, src_vocab=5,
                tgt_vocab=6, max_len=8)
    return M.ModelConfig(**{**args, **kw}).validate()


def mpc3_safetensors(path: Path, cfg: M.ModelConfig | None = None) -> Path:
    cfg = cfg or tiny_cfg()
    ST.save_safetensors_model(path, cfg, M.random_weights(cfg, 1), M.random_user(cfg, 2))
    return path


def mpc3_npz(path: Path, cfg: M.ModelConfig | None = None) -> Path:
    cfg = cfg or tiny_cfg()
    M.save_model(path, cfg, M.random_weights(cfg, 1), M.random_user(cfg, 2),
                 labels=None)
    return path


def raw_safetensors(path: Path, header, data: bytes = b"") -> Path:
    """A safetensors file of exactly this header (a dict, or bytes as they are) and data."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def _bert_tensors(rng, layers=2) -> dict[str, np.ndarray]:
    def t(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    out = {"bert.embeddings.word_embeddings.weight": t(V, D),
           "bert.embeddings.position_embeddings.weight": t(P, D),
           "bert.embeddings.token_type_embeddings.weight": t(2, D),
           "bert.embeddings.LayerNorm.weight": 1 + t(D), "bert.embeddings.LayerNorm.bias": t(D),
           "bert.pooler.dense.weight": t(D, D), "bert.pooler.dense.bias": t(D),
           "classifier.weight": t(C, D), "classifier.bias": t(C)}
    for i in range(layers):
        p = f"bert.encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            out[p + n + ".weight"], out[p + n + ".bias"] = t(D, D), t(D)
        out[p + "intermediate.dense.weight"], out[p + "intermediate.dense.bias"] = t(F, D), t(F)
        out[p + "output.dense.weight"], out[p + "output.dense.bias"] = t(D, F), t(D)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[p + n + ".weight"], out[p + n + ".bias"] = 1 + t(D), t(D)
    return out


def bert_config(layers=2) -> dict:
    return {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
            "hidden_size": D, "num_attention_heads": H, "num_hidden_layers": layers,
            "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P,
            "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
            "id2label": {str(i): f"c{i}" for i in range(C)}}


def hf_bert(d: Path, shards: int = 1) -> Path:
    """A save_pretrained-like BertForSequenceClassification directory (float32), in one file
    or ``shards`` files listed by model.safetensors.index.json."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(bert_config()))
    tensors = _bert_tensors(np.random.default_rng(3))
    if shards == 1:
        ST.write_safetensors(d / "model.safetensors", tensors, {"format": "pt"})
        return d
    names, weight_map = sorted(tensors), {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        ST.write_safetensors(d / file, {n: tensors[n] for n in part}, {"format": "pt"})
        weight_map.update({n: file for n in part})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return d


def hf_gpt2(d: Path) -> Path:
    """A save_pretrained-like GPT2LMHeadModel directory (float32, tied LM head)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)

    def t(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    conf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": D,
            "n_head": H, "n_layer": 2, "vocab_size": V, "n_positions": P,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    (d / "config.json").write_text(json.dumps(conf))
    out = {"transformer.wte.weight": t(V, D), "transformer.wpe.weight": t(P, D),
           "transformer.ln_f.weight": 1 + t(D), "transformer.ln_f.bias": t(D)}
    for i in range(2):
        p = f"transformer.h.{i}."
        for n, (a, b) in {"attn.c_attn": (D, 3 * D), "attn.c_proj": (D, D),
                          "mlp.c_fc": (D, 4 * D), "mlp.c_proj": (4 * D, D)}.items():
            out[p + n + ".weight"], out[p + n + ".bias"] = t(a, b), t(b)
        for n in ("ln_1", "ln_2"):
            out[p + n + ".weight"], out[p + n + ".bias"] = 1 + t(D), t(D)
    ST.write_safetensors(d / "model.safetensors", out, {"format": "pt"})
    return d


# ------------------------------------------------------------------------ hostile ----
def overlapping_spans(path: Path, n: int = 2500, span: int = 1 << 20) -> Path:
    """``n`` tensors on one ``span``-byte range: the old reader copied each before checking
    the spans (a 1.2 MB file reached 2.5 GB)."""
    header = {f"t{i}": {"dtype": "F64", "shape": [span // 8], "data_offsets": [0, span]}
              for i in range(n)}
    return raw_safetensors(path, header, b"\0" * span)


def zip_bomb(path: Path, nbytes: int = 1 << 30) -> Path:
    """An .npz whose one member inflates to ``nbytes`` of zeros (a valid .npy header; ~1 MB
    on disk per GB)."""
    header = {"descr": "<f8", "fortran_order": False, "shape": (nbytes // 8,)}
    buf = _npy_header(header)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("enc.0.attn.wq.npy", "w", force_zip64=True) as fh:
            fh.write(buf)
            chunk = bytes(1 << 20)
            for _ in range(nbytes >> 20):
                fh.write(chunk)
    return path


def _npy_header(header: dict) -> bytes:
    text = repr(header).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


def npz_with_npy_header(path: Path, header: dict, data: bytes, name="enc.0.attn.wq") -> Path:
    """A one-member .npz whose .npy header says ``header`` (shape, dtype) over ``data``."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name + ".npy", _npy_header(header) + data)
    return path


def with_config(path: Path, **changes) -> Path:
    """The tiny mpc3 safetensors model with config keys overwritten in its metadata (the
    tensors stay those of tiny_cfg)."""
    cfg = tiny_cfg()
    tensors = {**M.random_weights(cfg, 1).tensors, **M.random_user(cfg, 2)}
    conf = {**cfg.to_dict(), **changes}
    ST.write_safetensors(path, tensors, {ST.CONFIG_KEY: json.dumps(conf)})
    return path


# ------------------------------------------------------------------------- runner ----
def _limit_memory(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


#: Runs ``-m MODULE ARGS`` or ``SCRIPT ARGS`` and writes the process's VmHWM (peak RSS of
#: its own memory since exec, in kB) to the file named by its first argument when it ends -
#: wait4's ru_maxrss would include the forked copy of the (large) pytest process.
_PEAK = """
import runpy, sys
out = sys.argv.pop(1)
try:
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    from mpc3.procinfo import peak_rss
    with open(out, "w") as fh:
        fh.write(str(peak_rss() // 1024))
"""


def run_measured(args, timeout: float = 120, address_space: int = 3 << 30,
                 python: tuple = ("-m", "app.cli")) -> dict:
    """``python -m app.cli ARGS`` (or ``python PYTHON ARGS``) in a child process limited to
    ``address_space`` bytes of address space: its exit code, stdout, stderr, peak RSS in MB
    (its own VmHWM) and wall seconds; killed after ``timeout`` seconds (rc None)."""
    import tempfile
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        cmd = [sys.executable, "-c", _PEAK, str(peak_file), *python, *map(str, args)]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT,
                                  timeout=timeout, preexec_fn=_limit_memory(address_space))
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = None, exc.stdout or "", f"{exc.stderr or ''}[killed after {timeout} s]"
        took = time.monotonic() - t0
        peak = int(peak_file.read_text()) / 1024 if peak_file.exists() else float("inf")
    return {"rc": rc, "out": out if isinstance(out, str) else out.decode(),
            "err": err if isinstance(err, str) else err.decode(), "peak_mb": peak,
            "seconds": took}
