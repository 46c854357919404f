"""The model owner's upload, one tensor at a time: what :meth:`net.client.owner.ModelOwner.upload`
sends each party, with the owner holding one tensor and no shares.

Each party's stream is its own gRPC call on its own thread. A :class:`TensorFeed` gives them
the tensors in lockstep: tensor k is loaded from the caller's mapping (which may read it from
disk only now), checked for its fixed-point encoding and wrapped in a
:class:`mpc3.sharing.BlockDeal` when the first stream asks for it, after all three streams finished
tensor k - 1 (which is then dropped); every chunk's elements of a slot are drawn, encoded or
computed when its stream sends it (:func:`net.codec.pair_chunks`). So the owner holds the float
tensor and a chunk per stream - not the model, its encoding or six share slots of it
(measured: docs/PERFORMANCE.md, memory). A stream that fails aborts the feed, so the others
end instead of waiting for it.
"""
from __future__ import annotations

import threading
from typing import Callable, Mapping

import numpy as np

from mpc3 import ring
from mpc3.sharing import BlockDeal

from net.codec import pair_chunks
from net.proto import mpc3_pb2 as pb

#: Elements checked at a time (bounds the temporaries of checking a tensor's encoding).
ENCODE_BLOCK = 1 << 20


class FeedAborted(RuntimeError):
    """Another party's stream failed; this one stops (the caller reports the other's error)."""


def check_encodable(value, frac: int) -> np.ndarray:
    """``value`` as an array, after :func:`mpc3.ring.encode` accepted every block of it (no
    NaN, nothing out of the fixed-point range) - checked before its first chunk is sent,
    with temporaries of one block; the encoding itself is made per chunk
    (:class:`mpc3.sharing.BlockDeal`)."""
    x = np.asarray(value)
    flat = x.reshape(-1)
    for s in range(0, flat.size, ENCODE_BLOCK):
        ring.encode(flat[s:s + ENCODE_BLOCK], frac)
    return x


class TensorFeed:
    """The tensors of ``names`` for three streams in lockstep (see the module docstring).
    ``load(name)`` returns (the tensor, its fractional bits or None if it is a ring array)."""

    def __init__(self, names: list[str], load: Callable[[str], np.ndarray],
                 streams: int = 3) -> None:
        self.names, self.load, self.streams = names, load, streams
        self._cond = threading.Condition()
        self._k, self._left, self._item = -1, 0, None
        self._shape: tuple = ()
        self.failed: BaseException | None = None

    @classmethod
    def of(cls, weights: Mapping, fracs: Mapping[str, int], encoded: bool) -> "TensorFeed":
        """The feed of a mapping of float tensors (ring arrays if ``encoded``), read from it
        one at a time when first needed (a lazy mapping may load them only then)."""
        def load(name: str) -> tuple[np.ndarray, int | None]:
            value = weights[name]
            return (ring.check_ring(np.asarray(value), name), None) if encoded else \
                (check_encodable(value, fracs[name]), fracs[name])
        return cls(list(weights), load)

    def take(self, k: int) -> tuple[tuple, BlockDeal]:
        with self._cond:
            while self._k != k:
                if self.failed is not None:
                    raise FeedAborted("upload aborted") from None
                if self._k == k - 1 and self._left == 0:
                    try:
                        x, frac = self.load(self.names[k])
                    except BaseException as exc:
                        self.abort(exc)
                        raise
                    self._shape, self._item = tuple(x.shape), BlockDeal(x, frac)
                    self._k, self._left = k, self.streams
                    self._cond.notify_all()
                    break
                self._cond.wait()
            if self.failed is not None:
                raise FeedAborted("upload aborted")
            return self._shape, self._item

    def done(self, k: int) -> None:
        with self._cond:
            if self._k == k:
                self._left -= 1
                if self._left == 0:
                    self._item = None              # the tensor goes when all sent it
                    self._cond.notify_all()

    def abort(self, exc: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = exc
            self._cond.notify_all()

    def chunks(self, n: int, fracs: Mapping[str, int]):
        """Party ``n``'s TensorChunks: its pair (slots n, n+1) of every tensor in order."""
        for k, name in enumerate(self.names):
            shape, d = self.take(k)
            yield from pair_chunks(name, shape, fracs[name],
                                   lambda s, e, d=d: d.slot(n, s, e),
                                   lambda s, e, d=d: d.slot((n + 1) % 3, s, e))
            del d                           # this frame must not keep tensor k alive
            self.done(k)

    def messages(self, n: int, fracs: Mapping[str, int], model_id: str, upload_id: str,
                 meta: str):
        """Party ``n``'s UploadChunk stream (the first carries the metadata)."""
        first = True
        for c in self.chunks(n, fracs):
            msg = pb.UploadChunk(model_id=model_id, upload_id=upload_id, tensor=c)
            if first:
                msg.public_meta, msg.n_tensors, first = meta, len(self.names), False
            yield msg

    def raise_first(self, errors: list) -> None:
        """After the three streams: raise the cause of a failed upload - a tensor the owner
        could not load, else the first party error that is not another's abort (with
        ``party_errors``, for the caller's cleanup)."""
        if self.failed is not None and not any(e is self.failed for e in errors):
            raise self.failed
        real = [e for e in errors if e is not None and not aborted(e)]
        first = (real or [e for e in errors if e is not None] or [None])[0]
        if first is not None:
            first.party_errors = errors
            raise first


def aborted(exc: BaseException) -> bool:
    """A stream that ended because another party's failed (:meth:`TensorFeed.abort`): gRPC
    reports the request iterator's exception as 'Exception iterating requests!'."""
    return isinstance(exc, FeedAborted) or "iterating requests" in str(exc)
