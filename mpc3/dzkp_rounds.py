"""The messages both proofs of a flush share (:mod:`mpc3.dzkp` over the Galois ring,
:mod:`mpc3.dzkp_bits` over GF(2^64)): the verifiers' challenge seeds to their prover, and
the verdicts every party sends both neighbours at the end.
"""
from __future__ import annotations

import numpy as np

from .comm import CheatingDetected, SeedMismatch, one_array
from .party import Party

#: the verdict on a proof whose checks opened to zero but whose mod-2 linear relations'
#: digests differ (:func:`mpc3.dzkp.verify_claims`, ``linear``)
LINEAR_FAILED = 2


def challenge_seeds(p: Party, seed_of: dict, step) -> dict:
    """Each role's seed of ``step``: both verifiers send their prover the seed of the key
    they share (V_R's as V_R of prev, V_L's as V_L of next); the prover refuses to answer
    two different ones (:class:`mpc3.comm.SeedMismatch`)."""
    got_r, got_l = p.comm.exchange(to_prev=[np.frombuffer(seed_of["R"](step), np.uint8)],
                                   to_next=[np.frombuffer(seed_of["L"](step), np.uint8)],
                                   from_next=True, from_prev=True)
    sent = [one_array(got, p.comm.peer(d), p.rank, np.uint8, 16, "seed").tobytes()
            for got, d in ((got_r, 1), (got_l, -1))]
    if sent[0] != sent[1]:
        raise SeedMismatch(p.rank)
    return {"P": sent[0], "L": seed_of["L"](step), "R": seed_of["R"](step)}


def send_verdicts(p: Party, verdict: np.ndarray) -> None:
    """Every party tells both neighbours its four verdicts (the proof of next, of prev, its
    openings' and its inputs' digests); any failure anywhere raises at every party."""
    from_next, from_prev = p.comm.exchange(to_prev=[verdict], to_next=[verdict],
                                           from_next=True, from_prev=True)
    reports = {p.rank: verdict, p.comm.peer(1): from_next[0], p.comm.peer(-1): from_prev[0]}
    oks = {r: (v == 1).tolist() if v.shape == (4,) else [0, 0, 0, 0] for r, v in reports.items()}
    why = {r: "its mod-2 linear relations' digests differ" if v.shape == (4,) and
           v[0] == LINEAR_FAILED else "checks did not open to zero" for r, v in reports.items()}
    rejected = frozenset(((r + 1) % 3 if j == 0 else (r - 1) % 3)
                         for r, ok in oks.items() for j in (0, 1) if not ok[j])
    for reporter, ok in sorted(oks.items()):
        if not ok[0]:
            raise CheatingDetected((reporter + 1) % 3, reporter, why[reporter],
                                   rejected=rejected)
        if not ok[1]:
            raise CheatingDetected((reporter - 1) % 3, reporter, "checks did not open to zero",
                                   rejected=rejected)
        if not ok[2]:
            raise CheatingDetected(
                (reporter + 1) % 3, reporter, "opening", message=(
                    f"party {reporter} received an opened value that differs from its other "
                    f"holder's digest: party {(reporter + 1) % 3} sent a wrong value, party "
                    f"{(reporter - 1) % 3} a wrong digest, or party {reporter} reports "
                    f"falsely; the job is aborted"))
        if not ok[3]:
            raise CheatingDetected(
                (reporter - 1) % 3, reporter, "inputs", message=(
                    f"party {reporter}'s copy of an input slot differs from party "
                    f"{(reporter - 1) % 3}'s: whoever shared the input (query user or model "
                    f"owner) dealt inconsistent shares, or one of the two parties altered "
                    f"its copy, or party {reporter} reports falsely; the job is aborted"))
