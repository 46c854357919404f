"""Plaintext <-> replicated shares at the edges of a computation (clients, tests).

:func:`deal` splits a ring array into the three parties' pairs with fresh uniform slots;
:func:`reveal` reconstructs from the three pairs and checks that every replicated slot
agrees (copies are never averaged or trusted one-sided).
"""
from __future__ import annotations

import numpy as np

from . import ring
from .prg import fresh_ring
from .shares import AShare


def deal(x, rng=None, shared_replicas: bool = False) -> list:
    """Replicated shares of a plaintext uint64 array for the three parties (tests, clients).

    Slots are uniform (AES-CTR under fresh ``os.urandom`` keys, :func:`mpc3.prg.fresh_ring`,
    unless a numpy Generator is passed for tests). With ``shared_replicas`` the two copies of
    each slot are one array (party i's ``b`` is party i+1's ``a``): half the memory for three parties living in one process (benchmarks), valid
    because kernels never write into share arrays.
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
