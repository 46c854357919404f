"""Correlated randomness from AES-128-CTR (``cryptography``; long draws through
:mod:`mpc3.aes`), with no communication.

Each party holds three 16-byte keys per job: ``prev`` (shared with party i-1), ``next``
(shared with party i+1) and ``private``. Keys of a job are derived with HKDF-SHA256 from the
long-lived pairwise seeds agreed when the links came up and the job id, so two concurrent
jobs never share a stream.

Streams are *stateless*: the AES-CTR nonce of a draw is derived from the caller's operation
counter and a short tag, so the two owners of a key obtain identical values whenever they ask
with the same ``(op, tag)`` - whatever else they drew before. A given ``(op, tag)`` must be
used once per key; protocols use distinct tags within an operation.

From these streams (CrypTen's split, ABY3's zero sharing):
* zero sharing (3-out-of-3): ``alpha_i = F(next) - F(prev)`` sums to zero over the parties;
* random replicated sharing: slot ``i`` from ``prev``, slot ``i+1`` from ``next``.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import aes

STREAMS = ("prev", "next", "private")


def derive_key(seed: bytes, context: bytes) -> bytes:
    """16-byte AES key from a pairwise/private seed and a context (job id, purpose)."""
    return HKDF(algorithm=hashes.SHA256(), length=16, salt=b"mpc3-prg-v1",
                info=context).derive(seed)


def _nonce(op: int, tag: str) -> bytes:
    return hashlib.blake2b(f"{op}/{tag}".encode(), digest_size=16).digest()


def aes_ctr_bytes(key: bytes, nonce: bytes, nbytes: int) -> bytes:
    """AES-128-CTR keystream (the reference the fast paths of :class:`PRG` must equal)."""
    enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    return enc.update(bytes(nbytes)) + enc.finalize()


#: Draws up to this many bytes encrypt their CTR counter blocks with a cached AES-ECB context
#: (setting up a CTR context costs ~25 us, more than building and encrypting the blocks);
#: longer draws run CTR straight into the output buffer with the GIL released
#: (:func:`mpc3.aes.ctr_into`; a short call that releases it waits for the GIL to come back
#: from the other party threads, see ``ring.NOGIL_MIN_WORK``). Both give the same bytes for
#: the same key and nonce (tests/mpc3/test_security.py), so no counter is ever used twice.
ECB_MAX_BYTES = 1 << 14


def _ctr_fill(nonces: np.ndarray, starts: np.ndarray, out: np.ndarray,
              swap: bool) -> None:  # pragma: no cover
    """Blocks starts[j] .. starts[j+1] - 1 of ``out`` (uint64, two words a block) = the
    big-endian 128-bit counters nonces[j] + i (mod 2^128); ``swap``: the host is
    little-endian, so each word is byte-swapped (one 64-bit store per word, not 16 byte
    stores per block)."""
    m8, m16 = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF)
    s8, s16, s32 = np.uint64(8), np.uint64(16), np.uint64(32)
    for j in range(nonces.shape[0]):
        hi = np.uint64(0)
        lo = np.uint64(0)
        for k in range(8):
            hi = (hi << s8) | np.uint64(nonces[j, k])
            lo = (lo << s8) | np.uint64(nonces[j, 8 + k])
        for i in range(starts[j + 1] - starts[j]):
            c = lo + np.uint64(i)
            h = hi + np.uint64(1) if c < lo else hi        # carry (wraps mod 2^128)
            if swap:
                h = ((h & m8) << s8) | ((h >> s8) & m8)
                h = ((h & m16) << s16) | ((h >> s16) & m16)
                h = (h << s32) | (h >> s32)
                c = ((c & m8) << s8) | ((c >> s8) & m8)
                c = ((c & m16) << s16) | ((c >> s16) & m16)
                c = (c << s32) | (c >> s32)
            base = 2 * (starts[j] + i)
            out[base] = h
            out[base + 1] = c


_SWAP = sys.byteorder == "little"


@functools.cache
def _ctr_fill_jit():
    import numba
    return numba.njit(cache=True)(_ctr_fill)      # short: keeps the GIL (ring.NOGIL_MIN_WORK)


def ctr_blocks(nonce: bytes, nblocks: int) -> np.ndarray:
    """The counter blocks CTR mode encrypts: nonce + i (128-bit big-endian, mod 2^128)."""
    out = np.empty(2 * nblocks, dtype=np.uint64)
    _ctr_fill_jit()(np.frombuffer(nonce, dtype=np.uint8).reshape(1, 16),
                    np.array([0, nblocks], dtype=np.int64), out, _SWAP)
    return out.view(np.uint8)


def fresh_ring(shape) -> np.ndarray:
    """A uniform uint64 array from AES-CTR under a fresh ``os.urandom`` key and nonce (one
    32-byte draw from the OS instead of 8 bytes per element through getrandom, which the
    kernel computes as system time: dealing a model's weights spent most of its time there)."""
    shape = shape if isinstance(shape, tuple) else tuple(np.atleast_1d(shape).tolist())
    n = math.prod(shape)
    buf = np.empty(n + 2, dtype=np.uint64)             # + slack for cryptography's update_into
    seed = os.urandom(32)
    aes.ctr_into(seed[:16], seed[16:], buf.view(np.uint8), 8 * n)
    return buf[:n].reshape(shape)


@dataclass(frozen=True)
class PRG:
    """The three AES-CTR keys of one party for one job."""

    prev: bytes
    next: bytes
    private: bytes
    _ecb: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                  compare=False)

    def __post_init__(self) -> None:
        for name in STREAMS:
            key = getattr(self, name)
            if not isinstance(key, bytes) or len(key) != 16:
                raise ValueError(f"PRG key '{name}' must be 16 bytes")
        if self.prev == self.next:
            raise ValueError("PRG keys for prev and next must differ")

    @classmethod
    def for_job(cls, seed_prev: bytes, seed_next: bytes, seed_private: bytes,
                job_id: str) -> "PRG":
        ctx = f"job:{job_id}".encode()
        return cls(derive_key(seed_prev, ctx), derive_key(seed_next, ctx),
                   derive_key(seed_private, ctx))

    def _keystream(self, stream: str, nonce: bytes, nbytes: int) -> np.ndarray:
        """``nbytes`` of the AES-CTR keystream of ``stream`` at ``nonce`` as a fresh uint8
        array (8-byte aligned, owned by the caller)."""
        nblocks = -(-nbytes // 16)
        buf = np.empty(2 * nblocks + 2, dtype=np.uint64).view(np.uint8)  # + update_into slack
        key = getattr(self, stream)
        if nbytes <= ECB_MAX_BYTES:
            blocks = ctr_blocks(nonce, nblocks)
            with self._lock:                       # one context per key, not thread-safe
                ecb = self._ecb.get(stream)
                if ecb is None:
                    ecb = self._ecb[stream] = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
                ecb.update_into(blocks, buf)
        else:
            aes.ctr_into(key, nonce, buf, nbytes)
        return buf[:nbytes]

    def _keystreams(self, stream: str, nonces: list[bytes], sizes: list[int]) -> list:
        """Several keystreams of one stream in one pass through the cipher: each equal to
        ``_keystream(stream, nonce, nbytes)`` (its own counters, the tail of its last block
        dropped), as views of one fresh buffer."""
        nblocks = [-(-nb // 16) for nb in sizes]
        total = sum(nblocks)
        if 16 * total > ECB_MAX_BYTES:
            return [self._keystream(stream, nc, nb) for nc, nb in zip(nonces, sizes)]
        starts = [0]
        for nb in nblocks:
            starts.append(starts[-1] + nb)
        blocks = np.empty(2 * total, dtype=np.uint64)
        _ctr_fill_jit()(np.frombuffer(b"".join(nonces), dtype=np.uint8).reshape(-1, 16),
                        np.array(starts, dtype=np.int64), blocks, _SWAP)
        blocks = blocks.view(np.uint8)
        buf = np.empty(2 * total + 2, dtype=np.uint64).view(np.uint8)
        with self._lock:
            ecb = self._ecb.get(stream)
            if ecb is None:
                key = getattr(self, stream)
                ecb = self._ecb[stream] = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
            ecb.update_into(blocks, buf)
        return [buf[16 * st:16 * st + nb] for st, nb in zip(starts, sizes)]

    def ring_many(self, stream: str, op: int, items) -> list[np.ndarray]:
        """``[ring(stream, op, tag, shape) for tag, shape in items]``, one cipher call."""
        shapes = [(s,) if isinstance(s, (int, np.integer)) else tuple(s) for _, s in items]
        got = self._keystreams(stream, [_nonce(op, tag) for tag, _ in items],
                               [8 * math.prod(s) for s in shapes])
        return [g.view(np.uint64).reshape(s) for g, s in zip(got, shapes)]

    def bytes_many(self, stream: str, op: int, items) -> list[np.ndarray]:
        """``[bytes(stream, op, tag, nbytes) for tag, nbytes in items]``, one cipher call."""
        return self._keystreams(stream, [_nonce(op, tag) for tag, _ in items],
                                [int(nb) for _, nb in items])

    def ring(self, stream: str, op: int, tag: str, shape) -> np.ndarray:
        """Uniform uint64 array from ``stream`` for ``(op, tag)``."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        elif not isinstance(shape, tuple):
            shape = tuple(np.atleast_1d(shape).tolist())
        n = math.prod(shape)
        return self._keystream(stream, _nonce(op, tag), 8 * n).view(np.uint64).reshape(shape)

    def bytes(self, stream: str, op: int, tag: str, nbytes: int) -> np.ndarray:
        """Uniform uint8 array (for bit masks)."""
        return self._keystream(stream, _nonce(op, tag), nbytes)
