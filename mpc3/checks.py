"""Malicious-mode bookkeeping on one party: what verified kernels register, checked at a flush.

A party in malicious mode carries a :class:`Checks` (``party.checks``; None in semi-honest
mode, where no kernel does anything extra). A kernel whose messages can be verified
registers them as it runs - the message's op counter and what its verification needs:
* a replicated product's reshare (``mul_aa`` without truncation): the claim of
  :func:`mpc3.dzkp.mul_claims`, proven at the flush;
* a matrix product's reshare (``matmul_aa`` without truncation): the claims of
  :func:`mpc3.freivalds.matmul_claims`, reduced by random vectors and joined to the proof;
* an opening (``open_a``): the slot a party receives from its next neighbour is also held
  by its previous one, which sends a digest of every such slot at the flush.

:meth:`Checks.flush` runs before anything leaves the parties: it refuses (at every party,
before any check) if any message since the last flush was sent by a kernel that registered
nothing - a kernel without verification is refused in malicious mode, never run unchecked -
then exchanges the opening digests and proves every product claim in one
:func:`mpc3.dzkp.verify_claims`, whose verdicts carry the digest comparison, so every party
aborts together. Inputs a party received from outside (``shared_input``: the query user's,
the model owner's) are compared the same way: each slot has two holders, so a digest of one
holder's copy goes to the other. Cost: one round and 64 bytes per party for the digests, plus
:func:`mpc3.dzkp.cost_verify` of the claims (or one verdict round when there are none).
"""
from __future__ import annotations

import hashlib

import numpy as np

from . import dzkp
from .freivalds import matmul_claims
from .comm import ProtocolError


class Unverified(ProtocolError):
    """Malicious mode met a message no verification covers."""


class Checks:
    """The pending verification of one party since its last flush."""

    def __init__(self, p, params: dzkp.Params = dzkp.Params()) -> None:
        self.params = params
        self._reset(p)

    def _reset(self, p) -> None:
        self.start = p.comm.op
        self.covered: dict[int, str] = {}
        self.claims: list[tuple[dzkp.Claim, dzkp.Claim, dzkp.Claim]] = []
        self.mats: list[tuple[list, list, list]] = []
        self.received = hashlib.blake2b(digest_size=32, person=b"mpc3-open-recv")
        self.for_next = hashlib.blake2b(digest_size=32, person=b"mpc3-open-recv")
        #: both digests are of the same values when everyone is honest (one personalisation)
        self.input_mine = hashlib.blake2b(digest_size=32, person=b"mpc3-input")
        self.input_next = hashlib.blake2b(digest_size=32, person=b"mpc3-input")

    # --------------------------------------------------------- what kernels register --
    def product(self, p, x, y, out, trunc, kop: int) -> None:
        """``mul_aa``'s message, if it was a plain reshare (``trunc`` False) of
        ``x.a (y.a + y.b) + x.b y.a`` under the zero sharing ``(kop, "reshare")``."""
        if trunc is not False:
            return                                  # truncating products: not yet covered
        self.claims.append(dzkp.mul_claims(p, x, y, out.a, out.b, "reshare", kop))
        self.covered[p.comm.op] = "mul_aa"

    def matmul(self, p, x, y, out, trunc, kop: int) -> None:
        """``matmul_aa``'s message, if it was a plain reshare (``trunc`` False) of operands
        :func:`mpc3.freivalds.matmul_claims` covers."""
        if trunc is not False:
            return
        views = matmul_claims(p, x, y, out, kop)
        if views is not None:
            self.mats.append(views)
            self.covered[p.comm.op] = "matmul_aa"

    def shared_input(self, x) -> None:
        """A sharing this party received from outside (the query user's input, the model
        owner's weights): its slot b is the next party's slot a, compared at the flush."""
        self.input_mine.update(np.ascontiguousarray(x.a).tobytes())
        self.input_next.update(np.ascontiguousarray(x.b).tobytes())

    def opened(self, p, x, got: np.ndarray | None, to: int | None) -> None:
        """``open_a``'s message: ``got`` is the slot this party received (None if it
        received nothing); its next neighbour received this party's ``x.a`` copy's twin."""
        if got is not None:
            self.received.update(np.ascontiguousarray(got).tobytes())
        if to is None or to == (p.rank + 1) % 3:
            self.for_next.update(np.ascontiguousarray(x.a).tobytes())
        self.covered[p.comm.op] = "open_a"

    # ---------------------------------------------------------------------- flush -------
    def flush(self, p) -> None:
        """Verify everything registered since the last flush (see the module docstring)."""
        missing = [op for op in range(self.start + 1, p.comm.op + 1) if op not in self.covered]
        if missing:
            raise Unverified(f"malicious mode: {len(missing)} message(s) (first: op "
                             f"{missing[0]}) were sent by kernels that have no verification "
                             f"yet; the job is refused (docs/MALICIOUS.md lists what is "
                             f"covered)")
        digests = np.frombuffer(self.for_next.digest() + self.input_next.digest(), np.uint8)
        _, got = p.comm.exchange(to_next=[digests], from_prev=True)
        theirs = got[0].tobytes()
        opened_ok = theirs[:32] == self.received.digest()
        inputs_ok = theirs[32:] == self.input_mine.digest()
        mine, left, right = (_concat([c[j] for c in self.claims]) for j in range(3))
        mats = tuple([c for views in self.mats for c in views[j]] for j in range(3))
        dzkp.verify_claims(p, mine, left, right, self.params,
                           digests=(opened_ok, inputs_ok), mats=mats if self.mats else None)
        self._reset(p)


def _concat(claims: list[dzkp.Claim]) -> dzkp.Claim:
    if not claims:
        empty = np.zeros((2, 0), dtype=np.uint64)
        return dzkp.Claim(empty, empty.copy(), np.zeros(0, dtype=np.uint64))
    return dzkp.Claim(np.concatenate([c.u for c in claims], axis=1),
                      np.concatenate([c.v for c in claims], axis=1),
                      np.concatenate([c.z for c in claims]))
