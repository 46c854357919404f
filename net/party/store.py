"""Persisted model shares of one party, with integrity checks on disk and across parties.

Each model is a directory ``<data_dir>/models/<model_id>/`` (mode 0700) holding one file per
tensor (this party's pair ``(x_i, x_{i+1})`` as raw little-endian uint64, mode 0600) and
``meta.json`` with shapes and SHA-256 checksums. An upload is written into a staging
directory (every file tmp + fsync + rename) and becomes visible by one directory rename, so a
crash or a rejected upload never leaves a half model behind; models survive restarts.

Integrity, in two layers:

* on disk: every file's checksum is verified when the model is loaded; a model that fails is
  kept as ``corrupt`` (listed, refused for jobs, deletable, replaceable) rather than hidden;
* across parties: every replicated slot is stored on two parties (slot ``i`` by parties ``i``
  and ``i-1``). :meth:`ModelStore.slot_digests` hashes each of this party's two slots over all
  tensors; the parties compare them over the peer links (:mod:`net.party.verify`), so a share edited
  on one party - even with its checksum recomputed - is found. A model is ``unverified`` after
  every load or upload until that comparison succeeds, and jobs run only on ``verified``
  models.

Client-facing messages never contain server paths.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from mpc3.shares import AShare
from net.codec import share_from_payload
from net.errors import BadRequest, Code

log = logging.getLogger("mpc3.store")

UNVERIFIED, VERIFIED, CORRUPT = "unverified", "verified", "corrupt"
DIR_MODE, FILE_MODE = 0o700, 0o600


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data) -> None:
    """tmp (0600) + fsync + rename + fsync(dir): the file is either old or new, never partial."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def slot_digest(tensors: dict[str, AShare], half: str) -> bytes:
    """SHA-256 over every tensor's name, shape and one half (``"a"`` or ``"b"``) of its pair."""
    h = hashlib.sha256(b"mpc3-slot-v1")
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, list(t.shape)]).encode())
        h.update(hashlib.sha256(getattr(t, half).astype("<u8").tobytes()).digest())
    return h.digest()


@dataclass
class StoredModel:
    meta: dict
    state: str = UNVERIFIED
    problem: str = ""
    shares: dict[str, AShare] | None = None
    digests: tuple[bytes, bytes] | None = None   # (slot i, slot i+1) of this party
    refusal: str | None = None    # why its jobs are refused ('' if they are not), once checked
    lock: threading.Lock = field(default_factory=threading.Lock)


def _elements(shape) -> int:
    n = 1
    for k in shape:
        n *= k
    return n


def _check_meta(meta, name: str) -> None:
    """ValueError unless ``meta`` (a parsed meta.json) is the metadata of model ``name`` as
    :meth:`ModelStore.commit` writes it: every field the party reads later of its type, each
    tensor file a plain name inside the model's directory."""
    if not isinstance(meta, dict):
        raise ValueError(f"meta.json holds a {type(meta).__name__}, not an object")
    if meta.get("model_id") != name:
        raise ValueError("meta.json names another model")
    for key, kind in (("upload_id", str), ("owner", str), ("public_meta", str),
                      ("total_bytes", int), ("frac", int)):
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            raise ValueError(f"meta.json: {key} is not a {kind.__name__}")
    tensors = meta.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError("meta.json: tensors is not a list")
    for t in tensors:
        if not (isinstance(t, dict) and all(isinstance(t.get(k), str)
                                            for k in ("name", "file", "sha256"))):
            raise ValueError("meta.json: a tensor entry lacks its name, file or sha256")
        if os.path.basename(t["file"]) != t["file"] or t["file"] in ("", ".", ".."):
            raise ValueError(f"meta.json: tensor {t['name']!r} names a file outside its model")
        shape = t.get("shape")
        if not (isinstance(shape, list) and all(isinstance(k, int) and not isinstance(k, bool)
                                                and 0 <= k < 2 ** 40 for k in shape)):
            raise ValueError(f"meta.json: tensor {t['name']!r} has no valid shape")
        if "frac" in t and (not isinstance(t["frac"], int) or isinstance(t["frac"], bool)):
            raise ValueError(f"meta.json: tensor {t['name']!r} has a non-integer frac")


class ModelStore:
    def __init__(self, data_dir: Path, rank: int = 0) -> None:
        self.rank = rank
        self.root = Path(data_dir) / "models"
        self.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        os.chmod(self.root, DIR_MODE)
        self._lock = threading.Lock()
        self._models: dict[str, StoredModel] = {}
        self._uploading: set[str] = set()
        for p in sorted(self.root.iterdir()):
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)      # staging left by a crash
            elif p.is_dir():
                self._models[p.name] = self._load_dir(p)

    # ---------------------------------------------------------------------- loading ----
    def _load_dir(self, d: Path) -> StoredModel:
        """The model stored in ``d``, or - whatever its files hold (any JSON type, missing,
        extra or oversized files) - a ``corrupt`` entry naming why: one damaged model never
        keeps the party from serving the others."""
        try:
            meta = json.loads((d / "meta.json").read_text())
            _check_meta(meta, d.name)
        except (OSError, ValueError, TypeError) as exc:
            log.error("party %d: model %s unreadable (%s)", self.rank, d.name, exc)
            return StoredModel({"model_id": d.name, "upload_id": "", "owner": "",
                                "total_bytes": 0, "tensors": []}, CORRUPT,
                               f"its metadata is unreadable ({exc})"[:300])
        rec = StoredModel(meta)
        try:
            self._read_shares(d, rec)
        except (OSError, ValueError, KeyError) as exc:
            log.error("party %d: model %s is corrupt on disk: %s", self.rank, d.name, exc)
            rec.state, rec.problem = CORRUPT, str(exc)
        return rec

    def _read_shares(self, d: Path, rec: StoredModel) -> None:
        out = {}
        for t in rec.meta["tensors"]:
            f = d / t["file"]
            want = 16 * _elements(t["shape"])          # the pair, 8 bytes per element each
            try:
                if f.is_symlink() or not f.is_file():
                    raise ValueError(f"tensor {t['name']!r} is missing")
                if f.stat().st_size != want:
                    raise ValueError(f"tensor {t['name']!r} has {f.stat().st_size} bytes on "
                                     f"disk, its shape {tuple(t['shape'])} takes {want}")
                data = bytearray(f.read_bytes())
            except OSError:
                raise ValueError(f"tensor {t['name']!r} is missing") from None
            if hashlib.sha256(data).hexdigest() != t["sha256"]:
                raise ValueError(f"tensor {t['name']!r}: checksum mismatch on disk")
            out[t["name"]] = share_from_payload(data, tuple(t["shape"]))
        rec.shares = out
        rec.digests = (slot_digest(out, "a"), slot_digest(out, "b"))

    # ---------------------------------------------------------------------- queries ----
    def info(self, model_id: str) -> StoredModel | None:
        with self._lock:
            return self._models.get(model_id)

    def list(self) -> tuple[list[StoredModel], list[str]]:
        with self._lock:
            return list(self._models.values()), sorted(self._uploading)

    def owner_bytes(self, owner: str) -> int:
        with self._lock:
            return sum(r.meta.get("total_bytes", 0) for r in self._models.values()
                       if r.meta.get("owner") == owner)

    def get(self, model_id: str, need_verified: bool = True) -> StoredModel:
        """A usable model, or BadRequest saying why not and what to do."""
        with self._lock:
            rec = self._models.get(model_id)
            uploading = model_id in self._uploading
        if rec is None:
            if uploading:
                raise BadRequest(Code.FAILED_PRECONDITION, f"model {model_id!r} is still "
                                 "being uploaded")
            raise BadRequest(Code.NOT_FOUND, f"unknown model {model_id!r} on party "
                             f"{self.rank}")
        if rec.state == CORRUPT:
            raise BadRequest(Code.DATA_LOSS, f"model {model_id!r} is corrupt on party "
                             f"{self.rank}: {rec.problem}; its owner must delete it "
                             f"('mpc3 models --delete {model_id}') and share it again")
        if need_verified and rec.state != VERIFIED:
            raise BadRequest(Code.FAILED_PRECONDITION, f"model {model_id!r} on party "
                             f"{self.rank} is not verified against the other parties since "
                             "it was loaded; clients verify it first (VerifyModel, 'mpc3 "
                             "models --verify')")
        return rec

    def set_state(self, model_id: str, upload_id: str, state: str, problem: str = "") -> None:
        with self._lock:
            rec = self._models.get(model_id)
            if rec is not None and rec.meta.get("upload_id") == upload_id and \
                    rec.state != CORRUPT:
                rec.state, rec.problem = state, problem

    # ---------------------------------------------------------------------- uploads ----
    def begin(self, model_id: str) -> Path:
        with self._lock:
            if model_id in self._models:
                raise BadRequest(Code.ALREADY_EXISTS, f"model {model_id!r} exists on party "
                                 f"{self.rank}; delete it first ('mpc3 models --delete "
                                 f"{model_id}') to replace it")
            if model_id in self._uploading:
                raise BadRequest(Code.ABORTED, f"model {model_id!r} is being uploaded by "
                                 "another call")
            self._uploading.add(model_id)
        stage = self.root / f".staging-{model_id}-{os.urandom(6).hex()}"
        try:
            stage.mkdir(mode=DIR_MODE)
        except OSError:                   # e.g. a full disk: the id is not left uploading
            self.abandon(model_id, stage)
            raise
        return stage

    def write_tensor(self, stage: Path, index: int, payload) -> str:
        name = f"t{index:05d}.bin"
        atomic_write(stage / name, payload)
        return name

    def commit(self, model_id: str, stage: Path, meta: dict,
               shares: dict[str, AShare]) -> StoredModel:
        atomic_write(stage / "meta.json", json.dumps(meta, sort_keys=True).encode())
        os.rename(stage, self.root / model_id)
        _fsync_dir(self.root)
        rec = StoredModel(meta, UNVERIFIED, "", shares,
                          (slot_digest(shares, "a"), slot_digest(shares, "b")))
        with self._lock:
            self._models[model_id] = rec
            self._uploading.discard(model_id)
        return rec

    def abandon(self, model_id: str, stage: Path) -> None:
        shutil.rmtree(stage, ignore_errors=True)
        with self._lock:
            self._uploading.discard(model_id)

    def delete(self, model_id: str) -> None:
        with self._lock:
            if model_id not in self._models:
                raise KeyError(model_id)
            del self._models[model_id]
            trash = self.root / f".deleted-{model_id}-{os.urandom(6).hex()}"
            if (self.root / model_id).exists():
                os.rename(self.root / model_id, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)
