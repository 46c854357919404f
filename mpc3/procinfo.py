"""This process's memory, from ``/proc/self/status`` (Linux).

Peaks are ``VmHWM``, not ``getrusage().ru_maxrss``: Linux carries ``ru_maxrss`` across
exec, so a process started from a large one (pytest with torch loaded, 1.5 GB; a benchmark
holding a model) reports its parent's size as its own peak.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def rss() -> int:
    """This process's resident set size in bytes (VmRSS)."""
    return _status("VmRSS")


def peak_rss() -> int:
    """This process's peak resident set size in bytes so far (VmHWM)."""
    return _status("VmHWM")


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed() -> bool:
    """Return the freed heap memory of every malloc arena to the kernel (glibc
    ``malloc_trim(0)``: the free top and the free pages inside the heap), so that memory
    freed in small buffers serves the next large (mmap'd) one; False where unavailable."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
