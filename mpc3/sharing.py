"""Plaintext <-> replicated shares at the edges of a computation (clients, tests).

:func:`deal` splits a ring array into the three parties' pairs with fresh uniform slots;
:func:`reveal` reconstructs from the three pairs and checks that every replicated slot
agrees (copies are never averaged or trusted one-sided).
"""
from __future__ import annotations

import os

import numpy as np

from . import aes, ring
from .prg import fresh_ring
from .shares import AShare


def deal(x, rng=None, shared_replicas: bool = False) -> list:
    """Replicated shares of a plaintext uint64 array for the three parties (tests, clients).

    Slots are uniform (AES-CTR under fresh ``os.urandom`` keys, :func:`mpc3.prg.fresh_ring`,
    unless a numpy Generator is passed for tests). With ``shared_replicas`` the two copies of
    each slot are one array (party i's ``b`` is party i+1's ``a``): half the memory for three
    parties living in one process (benchmarks), valid because kernels never write into share arrays.
    """
    x = ring.check_ring(np.asarray(x), "x")
    if rng is None:
        r0, r1 = fresh_ring(x.shape), fresh_ring(x.shape)
    else:
        r0, r1 = (rng.integers(0, 2**64, size=x.shape, dtype=np.uint64) for _ in range(2))
    slots = [r0, r1, x - r0 - r1]
    if shared_replicas:
        return [AShare(slots[i], slots[(i + 1) % 3]) for i in range(3)]
    return [AShare(slots[i].copy(), slots[(i + 1) % 3].copy()) for i in range(3)]


def reveal(shares) -> np.ndarray:
    """Reconstruct from the three parties' pairs, checking the replicas agree."""
    for i in range(3):
        if not (shares[i].b == shares[(i + 1) % 3].a).all():
            raise ValueError(f"replicated shares disagree between party {i} and {(i + 1) % 3}")
    return shares[0].a + shares[1].a + shares[2].a


class BlockDeal:
    """Replicated shares of one ring array made block by block, for streaming it to the
    parties without holding its shares (the model owner's upload, :mod:`net.client.owner`).

    Slots 0 and 1 are AES-CTR keystreams under fresh ``os.urandom`` keys and counters, as in
    :func:`deal`; CTR mode reaches any element directly (counter + byte offset / 16), so
    :meth:`slot` draws only the elements asked for, and slot 2 = x - slot 0 - slot 1 on the
    same elements. Party i's pair is slots (i, i+1); every caller asking for a block of one
    slot gets the same values. ``start`` must be even (a whole AES block)."""


    def __init__(self, x: np.ndarray, frac: int | None = None) -> None:
        """``x``: a ring array, or reals encoded block by block at ``frac`` fractional bits
        (:func:`mpc3.ring.encode`) when ``frac`` is given - the float array is then all
        that is held."""
        self.frac = frac
        self.x = (np.asarray(x) if frac is not None else
                  ring.check_ring(np.asarray(x), "x")).reshape(-1)
        seed = os.urandom(64)
        self._keys = [(seed[:16], seed[16:32]), (seed[32:48], seed[48:])]

    @property
    def size(self) -> int:
        return self.x.size

    def _stream(self, j: int, start: int, stop: int) -> np.ndarray:
        key, nonce = self._keys[j]
        counter = (int.from_bytes(nonce, "big") + start // 2) % (1 << 128)
        n = stop - start
        buf = np.empty(n + 2, dtype=np.uint64)          # + slack, as fresh_ring
        aes.ctr_into(key, counter.to_bytes(16, "big"), buf.view(np.uint8), 8 * n)
        return buf[:n]

    def slot(self, j: int, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of slot ``j`` (0, 1, 2) of the flattened array."""
        if start % 2 or not 0 <= start <= stop <= self.size:
            raise ValueError(f"slot block {start}:{stop} of {self.size} elements "
                             "(start must be even)")
        if j < 2:
            return self._stream(j, start, stop)
        x = self.x[start:stop]
        out = (x if self.frac is None else ring.encode(x, self.frac)) - self._stream(0, start, stop)
        out -= self._stream(1, start, stop)
        return out
