"""Bring your own weights: models in the ``safetensors`` format, mpc3's tensor names.

A ``.safetensors`` file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``)
and the tensors' bytes, little-endian, row-major, offsets relative to the end of the header
(https://github.com/huggingface/safetensors, format of its 0.x releases). It cannot run
code when read, unlike pickled checkpoints, which is why mpc3 takes it.

The reader here is plain numpy (no extra dependency at run time); the tests check it against
the reference implementation. It refuses, naming the problem, a header that is too long or
not JSON, offsets outside the file or overlapping, a shape that does not match its byte
count, a dtype it does not know, and bytes the header does not account for.

A model is the file's tensors under mpc3's names (:func:`protocols.model.expected_shapes`
for the MPC weights, :func:`expected_user_shapes` for the query user's embedding and output
tensors) plus its :class:`ModelConfig`, taken from a JSON file or, when none is given, from
the file's ``__metadata__["mpc3_config"]`` (which :func:`save_safetensors_model` writes).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import numpy as np

from .config import ModelConfig, expected_shapes, expected_user_shapes
from .weights import Weights, validate_user

MAX_HEADER_BYTES = 100 << 20
CONFIG_KEY = "mpc3_config"

#: safetensors dtype names -> numpy dtypes (little-endian); BF16 is widened by hand.
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}


def _bf16(raw: bytes, count: int) -> np.ndarray:
    hi = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16
    return hi.view(np.float32)


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file; ValueError naming what is wrong."""
    with open(path, "rb") as fh:
        blob = fh.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} exceeds the file or {MAX_HEADER_BYTES} "
                         f"bytes (not a safetensors file?)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header must be a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings")
    data = memoryview(blob)[8 + n:]
    spans, tensors = [], {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name!r} lacks dtype, shape or data_offsets") \
                from None
        if dtype != "BF16" and dtype not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype!r}; supported: "
                             f"{', '.join(sorted([*DTYPES, 'BF16']))}")
        if not all(isinstance(d, int) and d >= 0 for d in shape) or \
                not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(data)):
            raise ValueError(f"{path}: tensor {name!r}: bad shape {shape} or offsets "
                             f"[{begin}, {end}] (data section has {len(data)} bytes)")
        count = int(np.prod(shape, dtype=np.int64))
        itemsize = 2 if dtype == "BF16" else np.dtype(DTYPES[dtype]).itemsize
        if count * itemsize != end - begin:
            raise ValueError(f"{path}: tensor {name!r}: shape {shape} of {dtype} needs "
                             f"{count * itemsize} bytes, offsets give {end - begin}")
        raw = data[begin:end]
        arr = _bf16(raw, count) if dtype == "BF16" else np.frombuffer(raw, DTYPES[dtype], count)
        tensors[name] = arr.reshape(shape).copy()
        spans.append((begin, end, name))
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else "leaves a gap before it"
            raise ValueError(f"{path}: tensor {name!r} {what} (offset {begin}, expected {pos})")
        pos = end
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes no tensor accounts for")
    return tensors, dict(meta)


def write_safetensors(path, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (float64 stays F64, other dtypes as their safetensors name)."""
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, chunks, pos = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        if a.dtype not in names:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        raw = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for raw in chunks:
            fh.write(raw)
    os.replace(tmp, path)


def save_safetensors_model(path, cfg: ModelConfig, weights: Weights,
                           user: Mapping | None = None) -> None:
    """A model as one safetensors file, its config in ``__metadata__["mpc3_config"]``."""
    cfg.validate()
    weights.validate(cfg)
    tensors = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    if user:
        validate_user(cfg, user)
        tensors.update({k: np.asarray(v, dtype=np.float64) for k, v in user.items()})
    write_safetensors(path, tensors, {CONFIG_KEY: json.dumps(cfg.to_dict(), sort_keys=True)})


def load_safetensors_model(path, config_path=None
                           ) -> tuple[ModelConfig, Weights, dict[str, np.ndarray]]:
    """``(cfg, weights, user)`` from a safetensors file in mpc3's naming; the config from
    ``config_path`` (JSON of :meth:`ModelConfig.to_dict`) or the file's metadata."""
    tensors, meta = read_safetensors(path)
    if config_path is not None:
        with open(config_path, encoding="utf-8") as fh:
            raw_cfg = json.load(fh)
    elif CONFIG_KEY in meta:
        raw_cfg = json.loads(meta[CONFIG_KEY])
    else:
        raise ValueError(f"{path}: no model config: pass a JSON config file (mpc3 naming, "
                         f"see docs/MODELS.md) or store it in __metadata__['{CONFIG_KEY}']")
    cfg = ModelConfig.from_dict(raw_cfg)
    user_names = set(expected_user_shapes(cfg))
    unknown = sorted(set(tensors) - set(expected_shapes(cfg)) - user_names)
    if unknown:
        raise ValueError(f"{path}: tensor(s) {unknown[:8]}{' ...' if len(unknown) > 8 else ''} "
                         f"are not part of this model config (mpc3 naming: "
                         f"protocols.model.expected_shapes); a checkpoint in another "
                         f"framework's naming needs converting first")
    user = {k: tensors.pop(k).astype(np.float64) for k in sorted(user_names & set(tensors))}
    if user:
        validate_user(cfg, user)
    weights = Weights({k: v.astype(np.float64) for k, v in tensors.items()})
    weights.validate(cfg)
    return cfg, weights, user
