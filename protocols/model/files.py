"""Untrusted model files, read with bounded memory (docs/MODELS.md, "Untrusted model files").

A model file comes from whoever trained or published it; reading it must not be able to
exhaust the owner's machine. Everything here checks sizes, shapes and counts against the
file's own length and the ceilings of :class:`FileLimits` *before* anything is allocated:

* a model file is a regular file opened without following a symbolic link (a link, a
  device such as /dev/zero, a FIFO or a directory is refused), and it is never read past
  the length ``fstat`` gave when it was opened;
* a JSON file (config.json, index.json, tokenizer.json, a safetensors header) is at most
  ``max_json_bytes`` and holds at most ``max_tensors`` + 16 objects; deep nesting, bad
  UTF-8 and bad JSON are one error;
* a tensor's element count is the product of its shape in Python integers; a tensor holds
  at most ``max_tensor_bytes``, a model at most ``max_model_bytes`` in ``max_tensors``
  tensors;
* an ``.npz`` (a zip of ``.npy`` members) is read by :class:`NpzReader`: each member's
  declared size is bounded; only stored and deflated members are read (the zip library
  inflates bzip2 and LZMA without bounding a read's output); the members' total may exceed
  the archive's length at most :data:`NPZ_EXPANSION` times (plus :data:`NPZ_SLACK`); an
  ``.npy`` header must describe exactly the member's bytes; object arrays (pickles) are
  refused; a member is read in steps that stop at its declared size (the zip library
  checks its CRC).

Every refusal is a :class:`ModelFileError` (a ValueError) in one line naming the file, what
is wrong and how to go on; the ceilings come from environment variables (:data:`ENV`;
``max_len`` is applied by :func:`.config.check_ceilings`).
"""
from __future__ import annotations

import io
import json
import os
import stat
import zipfile
import zlib
from dataclasses import dataclass, fields

import numpy as np

#: Environment variables that raise (or lower) the ceilings, and their defaults.
ENV = {"max_tensor_bytes": ("MPC3_MAX_TENSOR_BYTES", 4 << 30),
       "max_model_bytes": ("MPC3_MAX_MODEL_BYTES", 16 << 30),
       "max_tensors": ("MPC3_MAX_TENSORS", 1 << 16),
       "max_json_bytes": ("MPC3_MAX_JSON_BYTES", 64 << 20),
       "max_len": ("MPC3_MAX_LEN", 2048)}
#: An .npz's members may inflate to NPZ_EXPANSION times the archive's length plus NPZ_SLACK
#: (mpc3 writes them stored, ratio 1; float weights deflate by less than 4).
NPZ_EXPANSION, NPZ_SLACK = 16, 64 << 20
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class ModelFileError(ValueError):
    """A model file that cannot be read safely or is malformed (one line, naming the file)."""


@dataclass(frozen=True)
class FileLimits:
    max_tensor_bytes: int = ENV["max_tensor_bytes"][1]
    max_model_bytes: int = ENV["max_model_bytes"][1]
    max_tensors: int = ENV["max_tensors"][1]
    max_json_bytes: int = ENV["max_json_bytes"][1]
    max_len: int = ENV["max_len"][1]      # config.check_ceilings: a model's positions

    @classmethod
    def from_env(cls, environ=None) -> "FileLimits":
        """The defaults, each overridden by its environment variable (an integer with an
        optional K, M, G or T suffix: ``MPC3_MAX_MODEL_BYTES=64G``)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            var, default = ENV[f.name]
            text = environ.get(var, "").strip().lower().removesuffix("b")
            if not text:
                values[f.name] = default
                continue
            unit = text[-1] if text[-1] in _SUFFIX else ""
            try:
                values[f.name] = int(text[:len(text) - len(unit)]) * _SUFFIX[unit]
            except ValueError:
                raise ModelFileError(f"{var}={environ[var]!r} is not a size (an integer "
                                     f"with an optional K, M, G or T suffix)") from None
            if values[f.name] < 1:
                raise ModelFileError(f"{var}={environ[var]!r} must be at least 1")
        return cls(**values)

    def hint(self, name: str) -> str:
        return f"raise {ENV[name][0]} (now {getattr(self, name)}) if the file is genuine"


def limits(given: FileLimits | None = None) -> FileLimits:
    return given if given is not None else FileLimits.from_env()


def open_regular(path, what: str = "model file") -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened read-only; refuses a symbolic link, a device, a
    FIFO, a socket or a directory (O_NOFOLLOW | O_NONBLOCK: neither follows nor blocks)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise                           # the caller says "not found" (a path mistyped)
    except OSError as exc:
        if os.path.islink(path):
            raise ModelFileError(f"{path}: the {what} is a symbolic link; mpc3 reads model "
                                 f"files only as regular files (copy it there, e.g. cp -L; "
                                 f"a Hugging Face cache snapshot: snapshot_download("
                                 f"local_dir=...))") from None
        raise ModelFileError(f"{path}: cannot open the {what} ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ModelFileError(f"{path}: the {what} is not a regular file (a device, FIFO, "
                             f"socket or directory); pass the model's own file")
    return fd, st.st_size


def pread_exact(fd: int, offset: int, n: int, path) -> bytearray:
    """Exactly ``n`` bytes at ``offset`` into a fresh buffer (the file shrank: refused)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k <= 0:
            raise ModelFileError(f"{path}: the file ended at byte {offset + got} while "
                                 f"reading {n} bytes at {offset} (changed while read?)")
        got += k
    return buf


def read_small(path, what: str, lim: FileLimits | None = None) -> bytes:
    """The whole of a regular file of at most ``max_json_bytes``."""
    lim = limits(lim)
    fd, size = open_regular(path, what)
    try:
        if size > lim.max_json_bytes:
            raise ModelFileError(f"{path}: the {what} has {size} bytes, more than "
                                 f"{lim.max_json_bytes} ({lim.hint('max_json_bytes')})")
        return bytes(pread_exact(fd, 0, size, path))
    finally:
        os.close(fd)


def parse_json(raw: bytes, where, what: str, lim: FileLimits | None = None, kind=dict):
    """JSON of ``raw`` (UTF-8) as ``kind`` (dict, list or None: any), holding at most
    ``max_tensors`` + 16 objects; one ModelFileError for any flaw."""
    lim = limits(lim)
    budget = [lim.max_tensors + 16]

    def hook(pairs):
        budget[0] -= 1
        if budget[0] < 0:
            raise ModelFileError(f"{where}: the {what} holds more than {lim.max_tensors + 16}"
                                 f" JSON objects ({lim.hint('max_tensors')})")
        return dict(pairs)

    try:
        value = json.loads(bytes(raw).decode("utf-8"), object_pairs_hook=hook)
    except ModelFileError:
        raise
    except RecursionError:
        raise ModelFileError(f"{where}: the {what} is nested too deeply") from None
    except ValueError as exc:       # JSONDecodeError, UnicodeDecodeError, huge int literals
        raise ModelFileError(f"{where}: the {what} is not JSON "
                             f"({' '.join(str(exc).split())[:200]})") from None
    if kind is not None and not isinstance(value, kind):
        raise ModelFileError(f"{where}: the {what} holds a JSON {type(value).__name__}, not "
                             f"a{'n object' if kind is dict else ' ' + kind.__name__}")
    return value


def read_json(path, what: str, lim: FileLimits | None = None, kind=dict):
    """A bounded JSON file (:func:`read_small`, :func:`parse_json`)."""
    return parse_json(read_small(path, what, lim), path, what, lim, kind)


def element_count(shape, where) -> int:
    """The product of ``shape`` (a list of non-negative ints) in Python integers."""
    if not isinstance(shape, (list, tuple)) or len(shape) > 64 or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in shape):
        raise ModelFileError(f"{where}: shape {str(shape)[:80]} is not a list of at most 64 "
                             f"non-negative integers")
    n = 1
    for k in shape:
        n *= k
    return n


def check_tensor_bytes(nbytes: int, where, lim: FileLimits) -> None:
    if nbytes > lim.max_tensor_bytes:
        raise ModelFileError(f"{where}: {nbytes} bytes, more than one tensor may hold "
                             f"({lim.hint('max_tensor_bytes')})")


class Budget:
    """The bytes and tensors of one model so far (over all its files)."""

    def __init__(self, path, lim: FileLimits | None = None):
        self.path, self.lim = path, limits(lim)
        self.nbytes = self.count = 0

    def add(self, count: int, nbytes: int, where=None) -> None:
        self.count += count
        self.nbytes += nbytes
        if self.count > self.lim.max_tensors:
            raise ModelFileError(f"{where or self.path}: more than {self.lim.max_tensors} "
                                 f"tensors ({self.lim.hint('max_tensors')})")
        if self.nbytes > self.lim.max_model_bytes:
            raise ModelFileError(f"{where or self.path}: its tensors take more than "
                                 f"{self.lim.max_model_bytes} bytes "
                                 f"({self.lim.hint('max_model_bytes')})")


# --------------------------------------------------------------------------- .npz ----
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
               OverflowError, ValueError, KeyError, TypeError, SyntaxError, io.UnsupportedOperation)


def _npy_header(fp, where):
    """(shape, fortran_order, dtype) of an .npy stream (format 1.0 or 2.0)."""
    fmt = np.lib.format
    major, _ = fmt.read_magic(fp)
    read = {1: fmt.read_array_header_1_0, 2: fmt.read_array_header_2_0}.get(major)
    if read is None:
        raise ModelFileError(f"{where}: .npy format version {major} (mpc3 reads 1 and 2)")
    return read(fp, max_header_size=10000)


class NpzReader:
    """The ``.npy`` members of an ``.npz`` archive (``np.savez``), their headers checked
    when opened and each member read on demand (:meth:`read`); object arrays are refused
    (as ``np.load(allow_pickle=False)`` does)."""

    def __init__(self, path, lim: FileLimits | None = None, budget: Budget | None = None):
        self.path, self.lim = path, limits(lim)
        fd, size = open_regular(path)
        self._fh = os.fdopen(fd, "rb")
        try:
            self._zip = zipfile.ZipFile(self._fh)
            self._index = self._check(size, budget or Budget(path, self.lim))
        except ModelFileError:
            self.close()
            raise
        except _ZIP_ERRORS as exc:
            self.close()
            raise ModelFileError(f"{path}: not a readable .npz archive "
                                 f"({' '.join(str(exc).split())[:200]})") from None

    def _check(self, size: int, budget: Budget) -> dict:
        infos, index, total = self._zip.infolist(), {}, 0
        if len(infos) > self.lim.max_tensors + 8:
            raise ModelFileError(f"{self.path}: {len(infos)} members "
                                 f"({self.lim.hint('max_tensors')})")
        for info in infos:
            name = info.filename
            if not name.endswith(".npy") or name[:-4] in index:
                raise ModelFileError(f"{self.path}: member {name[:80]!r} is not a .npy array "
                                     f"or appears twice (not an mpc3 .npz model file)")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                # the zip library inflates bzip2 / LZMA without an output bound per read
                raise ModelFileError(f"{self.path}: member {name[:80]!r} uses compression "
                                     f"method {info.compress_type}; mpc3 reads stored or "
                                     f"deflated members (np.savez, np.savez_compressed)")
            check_tensor_bytes(info.file_size, f"{self.path}: member {name[:80]!r}", self.lim)
            total += info.file_size
            index[name[:-4]] = info
        if total > NPZ_EXPANSION * size + NPZ_SLACK:
            raise ModelFileError(f"{self.path}: its members inflate to {total} bytes from "
                                 f"{size} (more than {NPZ_EXPANSION} times plus "
                                 f"{NPZ_SLACK >> 20} MiB: a zip bomb?)")
        budget.add(len(index), total)
        return index

    @property
    def names(self) -> list[str]:
        return list(self._index)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def _header(self, fp, name: str, where: str):
        """(shape, fortran_order, dtype, data bytes) of member ``name`` open as ``fp``."""
        shape, fortran, dtype = _npy_header(fp, where)
        if dtype.hasobject:
            raise ModelFileError(f"{where}: an object array (a pickle); mpc3 reads "
                                 f"numeric arrays only")
        nbytes = element_count(list(shape), where) * dtype.itemsize
        if fp.tell() + nbytes != self._index[name].file_size:
            raise ModelFileError(f"{where}: its .npy header describes {nbytes} bytes "
                                 f"of {dtype} {shape}, the member holds "
                                 f"{self._index[name].file_size - fp.tell()}")
        return shape, fortran, dtype, nbytes

    def header(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of member ``name``, from its .npy header alone."""
        where = f"{self.path}: member {name[:80]!r}"
        try:
            with self._zip.open(self._index[name]) as fp:
                shape, _, dtype, _ = self._header(fp, name, where)
        except ModelFileError:
            raise
        except _ZIP_ERRORS as exc:
            raise ModelFileError(f"{where}: unreadable "
                                 f"({' '.join(str(exc).split())[:200]})") from None
        return tuple(shape), dtype

    def read(self, name: str) -> np.ndarray:
        info = self._index[name]
        where = f"{self.path}: member {name[:80]!r}"
        try:
            with self._zip.open(info) as fp:
                shape, fortran, dtype, nbytes = self._header(fp, name, where)
                buf, got = bytearray(nbytes), 0
                view = memoryview(buf)
                while got < nbytes:           # at most 1 MiB beyond the buffer at a time
                    chunk = fp.read(min(nbytes - got, 1 << 20))
                    if not chunk:
                        break
                    view[got:got + len(chunk)] = chunk
                    got += len(chunk)
                if got != nbytes or fp.read(1):     # the last read checks the CRC
                    raise ModelFileError(f"{where}: its data is not {nbytes} bytes long")
        except ModelFileError:
            raise
        except _ZIP_ERRORS as exc:
            raise ModelFileError(f"{where}: unreadable "
                                 f"({' '.join(str(exc).split())[:200]})") from None
        a = np.frombuffer(buf, dtype=dtype)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)

    def close(self) -> None:
        if getattr(self, "_zip", None) is not None:
            self._zip.close()
        self._fh.close()

    def __enter__(self) -> "NpzReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
