"""Large work buffers a party keeps from one malicious-mode flush to the next.

A flush's first fold (:func:`mpc3.dzkp_kernels.fold_batches`) writes six vectors of
(reps, positions, D) words - 88 MB each on a Table 2 decoding step - and frees them
before the next flush. Freed, they go back to the kernel (numpy maps arrays this large
on their own), and faulting fresh pages in again can cost more than the fold's arithmetic:
on this project's VM (free-page reporting) most of a decoding step's first-fold time was
system time (docs/MALICIOUS.md, "Whole workloads"). Kept here, by name, the pages stay
mapped and the next flush writes into them.

A buffer is kept only while the kept total stays within ``cap`` bytes (default
:data:`CAP`); a request past it is served fresh and not kept (and the name's smaller
buffer let go), so a job's resident memory between flushes grows by at most ``cap``.
Buffers come back uninitialised: callers write every position they read (or zero what they
do not write).

A job leases its scratch (:func:`lease`) and gives it back when it ends (:func:`give_back`):
a party process keeps :data:`IDLE` of them between jobs, so consecutive jobs - a decoding
session's steps, one job each - write into the pages the previous one faulted in.
"""
from __future__ import annotations

import threading

import numpy as np

#: bytes a party keeps between flushes, at most (a Table 2 decoding step's first folds:
#: 6 x 88 MB)
CAP = 768 << 20
#: scratches a process keeps while no job holds them
IDLE = 1

_idle: list["Scratch"] = []
_idle_lock = threading.Lock()


class Scratch:
    """Named uint8 arenas, grown on demand, handed out as typed views."""

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self._bufs: dict[str, np.ndarray] = {}

    @property
    def kept(self) -> int:
        """Bytes held between flushes."""
        return sum(b.nbytes for b in self._bufs.values())

    def take(self, name: str, shape: tuple, zero: bool = False,
             dtype=np.uint64) -> np.ndarray:
        """An array of ``shape``, uninitialised unless ``zero``: a view of the buffer kept
        under ``name`` (grown, or first made, if it is smaller - with an eighth more, as a
        decoding step's vectors grow a little with its cache), or a fresh one if keeping
        it would pass the cap (zero: untouched zero pages). A name serves one array at a
        time: the caller's previous array under it is overwritten."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = self._bufs.get(name)
        if buf is None or buf.nbytes < size:
            held = self.kept - (0 if buf is None else buf.nbytes)
            if held + size > self.cap:
                self._bufs.pop(name, None)
                return (np.zeros if zero else np.empty)(shape, dtype=dtype)
            self._bufs.pop(name, None)
            grown = min(size + size // 8, self.cap - held)      # room for the next flush's
            buf = self._bufs[name] = np.empty(grown, dtype=np.uint8)   # few more
        out = buf[:size].view(dtype).reshape(shape)
        if zero:
            out.fill(0)
        return out

    def clear(self) -> None:
        """Let every kept buffer go."""
        self._bufs.clear()


def lease() -> Scratch:
    """A scratch for a job: one a previous job gave back, else a new (empty) one."""
    with _idle_lock:
        return _idle.pop() if _idle else Scratch()


def give_back(s: Scratch) -> None:
    """A job's scratch at its end: kept for the next job (up to :data:`IDLE`), else let go."""
    with _idle_lock:
        if len(_idle) < IDLE and s not in _idle:
            _idle.append(s)
            return
    s.clear()
