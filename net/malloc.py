"""glibc malloc settings for processes that run parties (party servers, in-process benchmarks).

A party allocates and frees many short-lived numpy buffers of a few hundred KB to tens of MB
per round (products, PRG draws, packed messages). With glibc's defaults, buffers above the
dynamic mmap threshold are mmap'd and unmapped on free, and a freed heap top above 128 KB is
returned to the kernel, so the next buffer of the same size is page-faulted in again: the
Table 2 encoder in-process spent 2.5 s of system time per 3 runs in page faults (time(1);
`_ctr_into`, the first writer of every fresh PRG buffer, looked like the AES in profiles).
Keeping freed memory in the heap for reuse (:func:`keep_freed_memory`) cut that to 0.8 s
and the encoder's wall time by ~15 % with the same peak RSS (README, Measured).

``mallopt`` changes the running process, so these are called before the parties start; they
are no-ops where glibc's ``mallopt`` is unavailable (they return False).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
#: Allocations below this come from the heap and are reused after free (32 MiB is glibc's
#: upper limit on 64-bit hosts; larger requests are still mmap'd).
MMAP_THRESHOLD = 32 << 20
#: A freed heap top is returned to the kernel only beyond this.
TRIM_THRESHOLD = 1 << 30
#: Extra heap requested from the kernel at a time (fewer brk calls).
TOP_PAD = 64 << 20


@functools.cache
def _mallopt():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def _set(param: int, value: int) -> bool:
    fn = _mallopt()
    return bool(fn and fn(param, value))


def keep_freed_memory() -> bool:
    """Serve buffers below :data:`MMAP_THRESHOLD` from the heap and keep freed heap memory
    (up to :data:`TRIM_THRESHOLD`) for the next allocation instead of returning it."""
    return all([_set(M_MMAP_THRESHOLD, MMAP_THRESHOLD), _set(M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                _set(M_TOP_PAD, TOP_PAD)])


def one_arena() -> bool:
    """One malloc arena for all threads: three parties as threads of one process otherwise
    keep freed buffers in three arenas (peak RSS of `mpc3 bench layer encoder` 1.06 vs
    0.98 GB, time unchanged). Call before the threads start."""
    return _set(M_ARENA_MAX, 1)
