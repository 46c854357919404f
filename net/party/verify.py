"""Cross-party check of a stored model: every replicated slot is held by two parties; each
party sends the digest of its slot ``i+1`` to party ``i+1`` (which holds it as its slot) and
of its slot ``i`` to party ``i-1``, in one round over the peer links. A party whose stored
share was edited - even with its checksum recomputed - disagrees with its neighbour, and both
refuse the model until the owner replaces it. Only digests of shares the receiver already
holds cross the link.
"""
from __future__ import annotations

import hashlib

import numpy as np

from mpc3.comm import ProtocolError

from .store import CORRUPT, VERIFIED, StoredModel

DIGEST = 32


def _bound(rec: StoredModel, slot_digest: bytes) -> np.ndarray:
    """Digest bound to the upload, as a uint8 array (a corrupt model sends zeros)."""
    if rec.digests is None:
        return np.zeros(DIGEST, np.uint8)
    h = hashlib.sha256(rec.meta["upload_id"].encode() + slot_digest).digest()
    return np.frombuffer(h, np.uint8).copy()


def compare_slots(party, rec: StoredModel) -> tuple[str, str]:
    """Run the one-round comparison on ``party`` (a job Party); returns (state, problem)."""
    r = party.rank
    nxt, prv = (r + 1) % 3, (r - 1) % 3
    a, b = (None, None) if rec.digests is None else rec.digests
    mine_a = _bound(rec, a) if a is not None else np.zeros(DIGEST, np.uint8)
    mine_b = _bound(rec, b) if b is not None else np.zeros(DIGEST, np.uint8)
    got_next, got_prev = party.comm.exchange(to_next=[mine_b], to_prev=[mine_a],
                                             from_next=True, from_prev=True)
    if got_next[0].shape != (DIGEST,) or got_prev[0].shape != (DIGEST,):
        raise ProtocolError("malformed digest from a peer")
    problems = []
    if rec.digests is None or not np.array_equal(got_prev[0], mine_a):
        problems.append(f"share slot {r} differs between party {prv} and party {r}")
    if rec.digests is None or not np.array_equal(got_next[0], mine_b):
        problems.append(f"share slot {nxt} differs between party {r} and party {nxt}")
    if problems:
        return CORRUPT, "; ".join(problems) + " (a stored share was changed or damaged)"
    return VERIFIED, ""
