"""Bring your own weights: models in the ``safetensors`` format, mpc3's tensor names.

A ``.safetensors`` file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``)
and the tensors' bytes, little-endian, row-major, offsets relative to the end of the header
(https://github.com/huggingface/safetensors, format of its 0.x releases). It cannot run
code when read, unlike pickled checkpoints, which is why mpc3 takes it.

The reader here is plain numpy (no extra dependency at run time); the tests check it against
the reference implementation. It reads untrusted files with bounded memory (:mod:`.files`):
the whole header is checked before any tensor is read, and it refuses, naming the problem,
a header that is too long or not JSON, offsets outside the file or overlapping, a shape
that does not match its byte count, a dtype it does not know, bytes the header does not
account for, and sizes beyond the ceilings of :class:`.files.FileLimits`.

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

from .config import ModelConfig, check_layers, expected_shapes, expected_user_shapes
from .files import (Budget, FileLimits, ModelFileError, check_tensor_bytes, element_count,
                    limits, open_regular, parse_json, pread_exact, read_json)
from .weights import OnDemandTensors, Weights, validate_user

CONFIG_KEY = "mpc3_config"

#: safetensors dtype names -> numpy dtypes (little-endian); BF16 is widened by hand.
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}
_SIZES = {**{k: np.dtype(v).itemsize for k, v in DTYPES.items()}, "BF16": 2}


def _bf16(raw, count: int) -> np.ndarray:
    hi = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16
    return hi.view(np.float32)


class SafetensorsFile:
    """One safetensors file, its whole header checked when opened - before any tensor is
    read - and each tensor read on demand (:meth:`read`, exactly its own bytes).

    Checked from the header alone (:mod:`.files`): a regular file; the header at most
    ``max_json_bytes`` and inside the file; every entry a known dtype, a shape of
    non-negative ints whose byte count (a Python int) is its span's length and at most
    ``max_tensor_bytes``; the spans, sorted, contiguous from 0 to the file's end (no
    overlap, no gap, nothing outside); at most ``max_tensors`` tensors and
    ``max_model_bytes`` (with ``budget``: over all the files of one model)."""

    def __init__(self, path, lim: FileLimits | None = None, budget: Budget | None = None):
        self.path, self.lim = path, limits(lim)
        self._fd, size = open_regular(path)
        try:
            self._entries, self.metadata = self._check(size)
            (budget or Budget(path, self.lim)).add(len(self._entries), size - self._base)
        except BaseException:
            self.close()
            raise

    def _check(self, size: int):
        path = self.path
        if size < 8:
            raise ModelFileError(f"{path}: {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", pread_exact(self._fd, 0, 8, path))
        if 8 + n > size or n > self.lim.max_json_bytes:
            raise ModelFileError(f"{path}: header length {n} exceeds the file ({size} bytes) "
                                 f"or {self.lim.max_json_bytes} bytes (not a safetensors "
                                 f"file? {self.lim.hint('max_json_bytes')})")
        header = parse_json(pread_exact(self._fd, 8, n, path), path, "safetensors header",
                            self.lim)
        self._base = 8 + n
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ModelFileError(f"{path}: __metadata__ must map strings to strings")
        if len(header) > self.lim.max_tensors:
            raise ModelFileError(f"{path}: {len(header)} tensors "
                                 f"({self.lim.hint('max_tensors')})")
        entries, spans = {}, []
        for name, info in header.items():
            where = f"{path}: tensor {name[:80]!r}"
            if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
                raise ModelFileError(f"{where} lacks dtype, shape or data_offsets")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or dtype not in _SIZES:
                raise ModelFileError(f"{where} has dtype {str(dtype)[:20]!r}; supported: "
                                     f"{', '.join(sorted(_SIZES))}")
            nbytes = element_count(shape, where) * _SIZES[dtype]
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                    isinstance(k, int) and not isinstance(k, bool) for k in offsets)):
                raise ModelFileError(f"{where}: data_offsets {str(offsets)[:80]} is not "
                                     f"[begin, end]")
            begin, end = offsets
            if not 0 <= begin <= end <= size - self._base:
                raise ModelFileError(f"{where}: bad shape {shape} or offsets [{begin}, {end}] "
                                     f"(data section has {size - self._base} bytes)")
            if nbytes != end - begin:
                raise ModelFileError(f"{where}: shape {shape} of {dtype} needs {nbytes} "
                                     f"bytes, offsets give {end - begin}")
            check_tensor_bytes(nbytes, where, self.lim)
            entries[name] = (dtype, tuple(shape), begin, end)
            spans.append((begin, end, name))
        pos = 0
        for begin, end, name in sorted(spans):
            if begin != pos:
                what = "overlaps the previous tensor" if begin < pos else "leaves a gap before it"
                raise ModelFileError(f"{path}: tensor {name[:80]!r} {what} (offset {begin}, "
                                     f"expected {pos})")
            pos = end
        if pos != size - self._base:
            raise ModelFileError(f"{path}: {size - self._base - pos} trailing bytes no tensor "
                                 f"accounts for")
        return entries, dict(meta)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` (its own array; BF16 widened to float32)."""
        dtype, shape, begin, end = self._entries[name]
        raw = pread_exact(self._fd, self._base + begin, end - begin, self.path)
        count = (end - begin) // _SIZES[dtype]
        arr = _bf16(raw, count) if dtype == "BF16" else np.frombuffer(raw, DTYPES[dtype], count)
        return arr.reshape(shape)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_safetensors(path, lim: FileLimits | None = None, budget: Budget | None = None
                     ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file (:class:`SafetensorsFile`);
    ModelFileError naming what is wrong."""
    with SafetensorsFile(path, lim, budget) as fh:
        return {name: fh.read(name) for name in fh.names}, fh.metadata


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


def load_safetensors_model(path, config_path=None, lim: FileLimits | None = None,
                           lazy: bool = False
                           ) -> tuple[ModelConfig, Weights, dict[str, np.ndarray]]:
    """``(cfg, weights, user)`` from a safetensors file in mpc3's naming; the config from
    ``config_path`` (JSON of :meth:`ModelConfig.to_dict`) or the file's metadata. The
    config is checked against the file's tensors (:func:`check_layers`) before any tensor
    is read. ``lazy``: the weights are read when used (:class:`.weights.OnDemandTensors`)."""
    fh = SafetensorsFile(path, lim)
    try:
        meta = fh.metadata
        if config_path is not None:
            raw_cfg = read_json(config_path, "model config", fh.lim)
        elif CONFIG_KEY in meta:
            raw_cfg = parse_json(meta[CONFIG_KEY].encode("utf-8"), path,
                                 f"__metadata__['{CONFIG_KEY}']", fh.lim)
        else:
            raise ValueError(f"{path}: no model config: pass a JSON config file (mpc3 naming, "
                             f"see docs/MODELS.md) or store it in __metadata__['{CONFIG_KEY}']")
        cfg = check_layers(ModelConfig.from_dict(raw_cfg), fh.names, str(path))
        user_names = set(expected_user_shapes(cfg))
        unknown = sorted(set(fh.names) - set(expected_shapes(cfg)) - user_names)
        if unknown:
            raise ValueError(f"{path}: tensor(s) {unknown[:8]}{' ...' if len(unknown) > 8 else ''}"
                             f" are not part of this model config (mpc3 naming: "
                             f"protocols.model.expected_shapes); a checkpoint in another "
                             f"framework's naming needs converting first")
        user = {k: fh.read(k).astype(np.float64) for k in sorted(user_names & set(fh.names))}
        mpc = [k for k in fh.names if k not in user]
        if lazy:
            weights = Weights(OnDemandTensors({k: fh.shape(k) for k in mpc},
                                          lambda k: fh.read(k).astype(np.float64), str(path),
                                          fh.close))
        else:
            weights = Weights({k: fh.read(k).astype(np.float64) for k in mpc})
    except BaseException:
        fh.close()
        raise
    if not lazy:
        fh.close()
    if user:
        validate_user(cfg, user)
    weights.validate(cfg)
    return cfg, weights, user
