"""Tensors on the client wire, used by the party service and the clients alike.

A tensor share sent to one party is its pair ``(x_i, x_{i+1})`` of uint64 arrays, serialised
as the little-endian bytes of ``x_i`` followed by those of ``x_{i+1}`` and streamed as
:class:`TensorChunk` messages of at most :data:`CHUNK_BYTES`, the last one carrying the SHA-256
of the whole payload. :class:`TensorAssembler` checks every field of every chunk and grows its
buffer only as bytes arrive (a declared size is never allocated up front); a ``budget``
callback is charged for every chunk so a party can bound the bytes one user holds.
"""
from __future__ import annotations

import hashlib
import math
import re
from typing import Callable

import numpy as np

from mpc3.shares import AShare

from .errors import BadRequest, Code
from .grpcopts import CHUNK_BYTES
from .proto import mpc3_pb2 as pb

TENSOR_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$")
MAX_DIMS = 8
#: A tensor may carry up to this many fractional bits more than the cluster's ``frac``
#: (e.g. projection weights encoded with frac + PROJ_EXTRA, see protocols.layers.secure_model).
MAX_EXTRA_FRAC = 16


def share_payload(s: AShare) -> bytes:
    return np.ascontiguousarray(s.a, "<u8").tobytes() + np.ascontiguousarray(s.b, "<u8").tobytes()


def share_from_payload(data, shape) -> AShare:
    """The pair from its payload; a writable bytearray is used in place (no copy)."""
    flat = np.frombuffer(data, dtype="<u8")
    if not flat.flags.writeable:
        flat = flat.copy()
    flat = flat.view(np.uint64)
    n = flat.size // 2
    return AShare(flat[:n].reshape(shape), flat[n:].reshape(shape))


def tensor_chunks(name: str, share: AShare, frac: int):
    """The TensorChunk messages carrying one share pair."""
    a = np.ascontiguousarray(share.a, "<u8").reshape(-1)
    b = np.ascontiguousarray(share.b, "<u8").reshape(-1)
    yield from pair_chunks(name, share.shape, frac, lambda s, e: a[s:e], lambda s, e: b[s:e])


def pair_chunks(name: str, shape, frac: int, slot_a, slot_b):
    """The TensorChunk messages of a pair given by its two slots' blocks: ``slot_a(start,
    stop)`` gives elements ``start:stop`` of x_i (flattened), ``slot_b`` those of x_{i+1}.
    Only one chunk's elements are held at a time; the SHA-256 of the payload (x_i's bytes,
    then x_{i+1}'s) is computed as the chunks go. Blocks start at multiples of
    CHUNK_BYTES / 8 elements, so a chunk never spans the two slots."""
    n = math.prod(shape)
    total, step = 16 * n, CHUNK_BYTES // 8
    digest = hashlib.sha256()
    off = 0
    if not n:
        yield pb.TensorChunk(name=name, dtype="uint64", shape=shape, ring_bits=64, frac=frac,
                             offset=0, total_bytes=0, data=b"", sha256=digest.digest())
        return
    for slot in (slot_a, slot_b):
        for start in range(0, n, step):
            data = np.ascontiguousarray(slot(start, min(start + step, n)), "<u8").tobytes()
            digest.update(data)
            end = off + len(data)
            yield pb.TensorChunk(name=name, dtype="uint64", shape=shape, ring_bits=64,
                                 frac=frac, offset=off, total_bytes=total, data=data,
                                 sha256=digest.digest() if end == total else b"")
            off = end


class TensorAssembler:
    """Validates a stream of TensorChunks and rebuilds the tensors, one at a time.

    ``budget(nbytes)`` is called before every chunk is kept; it raises to refuse it.
    """

    def __init__(self, frac: int, max_tensor_bytes: int,
                 budget: Callable[[int], None] | None = None,
                 fracs: tuple[int, ...] | None = None) -> None:
        """``fracs``: the fractional bits a tensor may carry (default: frac to frac +
        MAX_EXTRA_FRAC; a job's outputs: frac or 2 frac, ``TensorSpec.wide``)."""
        self.frac = frac
        self.fracs = fracs or tuple(range(frac, frac + MAX_EXTRA_FRAC + 1))
        self.max_bytes = max_tensor_bytes
        self.budget = budget
        self.cur: pb.TensorChunk | None = None
        self.buf: bytearray | None = None
        self.hash = None
        self.names: set[str] = set()

    @property
    def filled(self) -> int:
        return len(self.buf) if self.buf is not None else 0

    def _start(self, c: pb.TensorChunk) -> None:
        bad = lambda msg: BadRequest(Code.INVALID_ARGUMENT, f"tensor {c.name!r}: {msg}")  # noqa: E731
        if not TENSOR_RE.match(c.name):
            raise BadRequest(Code.INVALID_ARGUMENT, f"invalid tensor name {c.name!r}")
        if c.name in self.names:
            raise bad("sent twice")
        if c.dtype != "uint64":
            raise bad(f"dtype {c.dtype!r} is not uint64 (shares are ring elements)")
        if c.ring_bits != 64:
            raise bad(f"ring Z_2^{c.ring_bits} is not the cluster's Z_2^64")
        if c.frac not in self.fracs:
            raise bad(f"fixed-point frac {c.frac} is not one the cluster's frac {self.frac} "
                      f"allows here ({min(self.fracs)}..{max(self.fracs)})")
        if any(d < 0 for d in c.shape) or len(c.shape) > MAX_DIMS:
            raise bad(f"invalid shape {tuple(c.shape)}")
        n = int(np.prod(c.shape, dtype=np.int64)) if c.shape else 1
        if n > self.max_bytes // 16 or c.total_bytes != 16 * n:
            if n > self.max_bytes // 16:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"tensor {c.name!r} of shape "
                                 f"{tuple(c.shape)} exceeds the limit of {self.max_bytes} "
                                 "bytes per tensor")
            raise bad(f"total_bytes {c.total_bytes} does not match shape {tuple(c.shape)} "
                      f"(expected {16 * n}: two uint64 shares per element)")
        if c.offset != 0:
            raise bad("first chunk must have offset 0")
        self.cur, self.buf, self.hash = c, bytearray(), hashlib.sha256()

    def feed(self, c: pb.TensorChunk) -> tuple[str, tuple, bytearray, str, int] | None:
        """Returns (name, shape, payload, sha256 hex, frac) when a tensor completes."""
        bad = lambda msg: BadRequest(Code.INVALID_ARGUMENT, f"tensor {c.name!r}: {msg}")  # noqa: E731
        if len(c.data) > CHUNK_BYTES:
            raise bad(f"chunk of {len(c.data)} bytes exceeds the {CHUNK_BYTES}-byte limit")
        if self.cur is None:
            self._start(c)
        elif (c.name != self.cur.name or tuple(c.shape) != tuple(self.cur.shape)
              or c.total_bytes != self.cur.total_bytes):
            raise BadRequest(Code.INVALID_ARGUMENT, f"tensor {self.cur.name!r} truncated: "
                             f"{self.filled} of {self.cur.total_bytes} bytes before "
                             f"tensor {c.name!r} started")
        if c.offset != self.filled:
            raise bad(f"chunk offset {c.offset}, expected {self.filled} (missing or "
                      "reordered chunk)")
        end = self.filled + len(c.data)
        if end > self.cur.total_bytes:
            raise bad(f"chunk overruns the tensor ({end} > {self.cur.total_bytes} bytes)")
        if self.budget is not None:
            self.budget(len(c.data))
        self.buf += c.data
        self.hash.update(c.data)
        if end < self.cur.total_bytes:
            if c.sha256:
                raise bad("checksum sent before the last chunk")
            return None
        digest = self.hash.hexdigest()
        if not c.sha256:
            raise bad("last chunk lacks the sha256 checksum")
        if c.sha256.hex() != digest:
            raise BadRequest(Code.DATA_LOSS, f"tensor {c.name!r}: checksum mismatch")
        out = (self.cur.name, tuple(self.cur.shape), self.buf, digest, self.cur.frac)
        self.names.add(self.cur.name)
        self.cur, self.buf, self.hash = None, None, None
        return out

    def finish(self) -> None:
        if self.cur is not None:
            raise BadRequest(Code.INVALID_ARGUMENT, f"tensor {self.cur.name!r} truncated: "
                             f"{self.filled} of {self.cur.total_bytes} bytes")
