"""glibc malloc settings for processes that run parties (party servers, in-process benchmarks).

A party allocates and frees many short-lived numpy buffers of a few hundred KB to tens of MB
per round (products, PRG draws, packed messages). With glibc's defaults, buffers above the
dynamic mmap threshold are mmap'd and unmapped on free, and a freed heap top above 128 KB is
returned to the kernel, so the next buffer of the same size is page-faulted in again: the
Table 2 encoder in-process spent 2.5 s of system time per 3 runs in page faults (time(1);
the AES-CTR call, the first writer of every fresh PRG buffer, looked like the cipher in
profiles). Keeping freed memory in the heap for reuse (:func:`keep_freed_memory`) cut that to
0.8 s and the encoder's wall time by ~15 % with the same peak RSS (docs/PERFORMANCE.md). The
price: a process keeps up to TRIM_THRESHOLD of freed heap resident instead of returning it,
and buffers below 32 MiB share (and may fragment) the heap.

``mallopt`` changes the running process, so these are called once, before the parties start;
they leave alone an operator's own settings (``MALLOC_*_`` or ``glibc.malloc`` tunables in
the environment) and are no-ops where glibc's ``mallopt`` is unavailable (False).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

from mpc3 import procinfo

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
#: Allocations below this come from the heap and are reused after free (32 MiB is glibc's
#: upper limit on 64-bit hosts; larger requests are still mmap'd).
MMAP_THRESHOLD = 32 << 20
#: A freed heap top is returned to the kernel only beyond this.
TRIM_THRESHOLD = 1 << 30
#: Extra heap requested from the kernel at a time (fewer brk calls).
TOP_PAD = 64 << 20


@functools.cache
def _libc(name: str):
    """glibc's function ``name``, or None where it is unavailable."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def _set(param: int, value: int) -> bool:
    fn = _libc("mallopt")
    return bool(fn and fn(param, value))


def operator_chose(env=os.environ) -> bool:
    """True if the environment carries glibc malloc settings of the operator's."""
    return any(k.startswith("MALLOC_") and k.endswith("_") for k in env) or \
        "glibc.malloc" in env.get("GLIBC_TUNABLES", "")


@functools.cache
def keep_freed_memory() -> bool:
    """Serve buffers below :data:`MMAP_THRESHOLD` from the heap and keep freed heap memory
    (up to :data:`TRIM_THRESHOLD`) for the next allocation instead of returning it; once per
    process, and not where the operator set malloc options (:func:`operator_chose`)."""
    if operator_chose():
        return False
    return all([_set(M_MMAP_THRESHOLD, MMAP_THRESHOLD), _set(M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                _set(M_TOP_PAD, TOP_PAD)])


def one_arena() -> bool:
    """One malloc arena for all threads: three parties as threads of one process otherwise
    keep freed buffers in three arenas (peak RSS of `mpc3 bench layer encoder` 1.06 vs
    0.98 GB, time unchanged), and so did the model owner's three upload streams and gRPC's
    threads (`mpc3 share-model` of the GPT-2-small shape: upload peak 252 -> 152 MB, upload
    time 36 -> 35 s). Call before the threads start; not where the operator set malloc
    options (:func:`operator_chose`)."""
    return not operator_chose() and _set(M_ARENA_MAX, 1)


def trim() -> bool:
    """Return the freed heap memory of every arena to the kernel (glibc ``malloc_trim(0)``:
    the free top and, since glibc 2.8, the free pages inside the heap); False where it is
    unavailable. :func:`keep_freed_memory` keeps up to TRIM_THRESHOLD of freed memory for
    the next round's buffers, so without this a party's RSS stayed at its largest job's peak
    (issue 33, item 5: 2.0 -> 3.2 GB idle); the runner calls it when a large job ends and
    no other job runs (net.party.runner, measured in docs/PERFORMANCE.md)."""
    return procinfo.release_freed()
