"""A communicator message on a peer link: the PeerFrames carrying it and its arrays back.

A message - the arrays one round sends to one peer - travels as ONE :class:`PeerFrame` when
its bytes fit in :data:`~net.grpcopts.CHUNK_BYTES`, else as consecutive chunks of the same
``(job_id, op)``. The first frame carries ``n_arrays`` and ``layout``: ASCII, one
``<dtype.str>:<d0>,<d1>,...`` per array joined by ``;`` (``b"<u8:3;<i2:0,2;|u1:"`` is three
arrays, the last of 0 dimensions); ``data`` carries the arrays' bytes back to back. There is
no per-array protobuf object.

Layouts repeat round after round (the same ops on the same shapes), so both ends memoise
them in bounded caches: the sender the header of a tuple of (dtype, shape), the receiver the
validated (dtype, shape, offset, bytes) of a header, so the hot path neither formats nor
parses nor validates a layout it has seen before.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from mpc3.comm import Payload, ProtocolError
from net.grpcopts import CHUNK_BYTES
from net.proto import mpc3_pb2 as pb

MAX_MESSAGE_BYTES = 1 << 34     # a peer announcing more is broken
MAX_DIMS = 32
MAX_HEADER_BYTES = 1 << 16      # ~3000 arrays in one message
_CACHE = 4096                   # distinct layouts remembered per direction
_CACHED_HEADER_BYTES = 512      # longer headers are parsed every time (bounds the cache)

#: (dtype, shape, byte offset, byte count) of each array of a message
Layout = tuple[tuple[np.dtype, tuple[int, ...], int, int], ...]


@functools.lru_cache(maxsize=_CACHE)
def _header(kinds: tuple[tuple[np.dtype, tuple[int, ...]], ...]) -> bytes:
    return ";".join(f"{dt.str}:{','.join(map(str, shape))}" for dt, shape in kinds).encode()


def parse_layout(header: bytes, n_arrays: int) -> tuple[Layout, int]:
    """The validated layout a first frame announces, and the message's byte count."""
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"message header of {len(header)} bytes")
    if len(header) <= _CACHED_HEADER_BYTES:
        return _parse_cached(header, n_arrays)
    return _parse(header, n_arrays)


def _parse(header: bytes, n_arrays: int) -> tuple[Layout, int]:
    try:
        items = header.decode("ascii").split(";")
    except UnicodeDecodeError:
        raise ProtocolError("malformed message header") from None
    if len(items) != n_arrays:
        raise ProtocolError(f"message header lists {len(items)} arrays, announces {n_arrays}")
    out, off = [], 0
    for item in items:
        dt, _, dims = item.partition(":")
        try:
            dtype = np.dtype(dt)
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        except (TypeError, ValueError):
            raise ProtocolError(f"malformed array header {item[:40]!r}") from None
        if dtype.kind not in "ui" or dtype.itemsize > 8:
            raise ProtocolError(f"unexpected dtype {dt[:20]!r}")
        if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
            raise ProtocolError(f"invalid shape {shape[:MAX_DIMS + 1]}")
        nb = math.prod(shape) * dtype.itemsize
        out.append((dtype, shape, off, nb))
        off += nb
        if off > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message longer than {MAX_MESSAGE_BYTES} bytes")
    return tuple(out), off


_parse_cached = functools.lru_cache(maxsize=_CACHE)(_parse)


def contiguous(arrays: Payload) -> tuple[list[np.ndarray], bytes]:
    """The arrays C-contiguous, and their layout header."""
    arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
    return arrays, _header(tuple((a.dtype, a.shape) for a in arrays))


def frames_of(job_id: str, op: int, arrays: Payload):
    """One frame for the whole message when it fits in CHUNK_BYTES, else its chunks."""
    if not arrays:
        yield pb.PeerFrame(job_id=job_id, op=op, n_arrays=0)
        return
    arrays, header = contiguous(arrays)
    data = arrays[0].tobytes() if len(arrays) == 1 else b"".join(arrays)
    yield pb.PeerFrame(job_id=job_id, op=op, n_arrays=len(arrays), layout=header,
                       data=data[:CHUNK_BYTES] if len(data) > CHUNK_BYTES else data,
                       more=len(data) > CHUNK_BYTES)
    for off in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
        yield pb.PeerFrame(job_id=job_id, op=op, data=data[off:off + CHUNK_BYTES],
                           more=off + CHUNK_BYTES < len(data))


def split(buf: bytearray, layout: Layout, size: int) -> list[np.ndarray]:
    """The arrays of a complete message (views into ``buf``, writable)."""
    if size != len(buf):
        raise ProtocolError(f"message of {len(buf)} bytes, its header announces {size}")
    return [np.frombuffer(buf, dtype=dt, count=nb // dt.itemsize, offset=off).reshape(shape)
            for dt, shape, off, nb in layout]


@dataclass
class Partial:
    """A message whose chunks are still arriving."""
    op: int
    layout: Layout
    size: int
    buf: bytearray
