"""Malicious-mode bookkeeping on one party: what verified kernels register, checked at a flush.

A party in malicious mode carries a :class:`Checks` (``party.checks``; None in semi-honest
mode, where no kernel does anything extra). A kernel whose messages can be verified
registers them as it runs - the message's op counter and what its verification needs:
* a replicated product's reshare (``mul_aa`` without truncation): the claim of
  :func:`mpc3.claims.mul_claims`, proven at the flush;
* a matrix product's reshare (``matmul_aa`` without truncation): the claims of
  :func:`mpc3.freivalds.matmul_claims`, reduced by random vectors and joined to the proof
  (per-element dot products: :func:`mpc3.claims.dot_claims`, one 2K-term gate each);
* truncating, scaled, mul_many and mul_split products run as these products and trunc_a
  in malicious mode (:mod:`mpc3.kernels.checked`);
* an opening (``open_a``): the slot a party receives from its next neighbour is also held
  by its previous one, which sends a digest of every such slot at the flush;
* an AND layer: its mod-2 claims (:func:`mpc3.claims.and_claims`), proven over GF(2^64) by
  :func:`mpc3.dzkp_bits.verify_bits` at the flush, before the ring proof that carries its
  verdicts.

:meth:`Checks.flush` runs before anything leaves the parties: it refuses (at every party,
before any check) if any message since the last flush was sent by a kernel that registered
nothing - a kernel without verification is refused in malicious mode, never run unchecked -
then exchanges the opening digests and proves every product claim in one
:func:`mpc3.dzkp.verify_claims`, whose verdicts carry the digest comparison, so every party
aborts together. Inputs a party received from outside (``shared_input``: the query user's,
the model owner's) are compared the same way: each slot has two holders, so a digest of one
holder's copy goes to the other. Mod-2 linear relations of a prover's claims (the
comparisons' thermometer sums, :meth:`Checks.linear`) are compared the same way, by its
verifiers' digests of their sides. Cost: one round and 64 bytes per party for the digests,
plus :func:`mpc3.dzkp.cost_verify` of the claims (``linear`` when a comparison's claims are
in the flush; one verdict round when there is nothing to prove) and
:func:`mpc3.dzkp_bits.cost_verify_bits` of the mod-2 ones.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

from . import dzkp, dzkp_bits
from .freivalds import matmul_claims
from . import scratch
from .scratch import Scratch
from .comm import ProtocolError
from .claims import (and_claims, dot_claims, masks, mul_claims, injection_claims,
                     term_views)
from .claims_trunc import fused_claims, fused_witness, trunc_claims, trunc_witness
from .claims_masked import (masked_injection_claims, tree_keep, tree_parts, tree_swaps,
                            tree_witness)
from .claims_compare import (bit_parts, compare_claims, compare_witness, leaves_claims,
                             leaves_witness, swap_claims)
from .kernels.base import group_bounds, packed_bytes, width_bytes
from .kernels.boolean import cost_and_bb
from .kernels.convert import _run_starts
from .kernels.thresholds import carry_plan
from .kernels.truncation import _default_segments

#: the region a flush opens in a party's profiler (protocols.jobs.breakdown.VERIFY)
VERIFY = "mpc3.checks.Checks.flush"


#: in malicious mode with flushes inside a layer (``Checks.split_at``), row-wise kernels
#: (:func:`in_blocks`: the GELU, LayerNorm, the softmax's exponential) run over blocks of at
#: most this many elements, a point between kernels after each: one such kernel on a GPT-2-
#: small prompt of 128 tokens registers millions of pending checks (docs/MALICIOUS.md)
BLOCK_ELEMENTS = 1 << 15


def in_blocks(p, fn, x, *rest, rowwise: bool = True):
    """``fn(p, x, *rest)`` - a kernel on x's rows (``rowwise``: over its last axis; else
    elementwise) - over blocks of x's leading rows of at most :data:`BLOCK_ELEMENTS`
    elements, with a checkpoint between blocks (:meth:`Checks.between_blocks`), when ``p``
    is in malicious mode with flushes inside a layer; else in one call. The same values
    (each block's own rounding), a kernel's rounds per block."""
    checks = p.checks
    if checks is None or checks.split_at is None or x.size <= BLOCK_ELEMENTS:
        return fn(p, x, *rest)
    width = x.shape[-1] if rowwise else 1
    flat = x.reshape(-1, width)
    rows = max(1, BLOCK_ELEMENTS // width)
    outs = []
    for i in range(0, flat.shape[0], rows):
        if outs:
            checks.between_blocks(p)
        part = flat[i:i + rows]
        outs.append(fn(p, part if rowwise else part.reshape(-1), *rest).reshape(part.shape))
    return type(outs[0]).concat(outs, 0).reshape(*x.shape)


class Unverified(ProtocolError):
    """Malicious mode met a message no verification covers (raised at every party, at the
    flush, before any check: the parties' op counters agree)."""

    everywhere = True


class Checks:
    """The pending verification of one party since its last flush."""

    def __init__(self, p, params: dzkp.Params = dzkp.Params(), split_at: int | None = None,
                 limit: int | None = None,
                 later: tuple[int, dzkp.Params] | None = None) -> None:
        #: the proof's parameters: ``params``, or from flush ``later[0]`` on ``later[1]``
        #: (:meth:`params_at`; a long job's later flushes prove with a larger soundness margin)
        self.params, self.later = params, later
        #: :meth:`checkpoint` flushes from this many pending on (None: never), while fewer
        #: than ``limit`` flushes ran; ``flushes`` counts every flush of the job
        self.split_at, self.limit, self.flushes = split_at, limit, 0
        #: bytes this party sent at its flushes so far, by part: "digests", each witness by
        #: the claims that read it ("witness fused_claims", ...), and "proof" (the proof's
        #: messages and the verdicts)
        self.flush_bytes: Counter = Counter()
        #: profiled entry points (:func:`mpc3.party.profiled`) open now: 0 between kernels;
        #: ``entry``: the name of the outermost one opened last
        self.depth, self.entry = 0, ""
        #: the proof's large vectors, kept from one flush to the next and, given back at
        #: the job's end (:meth:`release`), for the next job (:mod:`mpc3.scratch`)
        self.scratch: Scratch | None = scratch.lease()
        self._reset(p)

    def _reset(self, p) -> None:
        p.comm.watch = self._sent
        self.sent: dict[int, int] = {}              # op -> payload bytes this party sent
        self.covered: dict[int, int] = {}           # op -> bytes of them a claim covers
        self.claims: list[tuple[dzkp.Claim, dzkp.Claim, dzkp.Claim]] = []
        #: mod-2 gates' (own, as V_L, as V_R) views, proven over GF(2^64) (:mod:`mpc3.dzkp_bits`)
        self.bit_claims: list[tuple] = []
        self.mats: list[tuple[list, list, list]] = []
        #: (record, its witness or None, its claims): claims built at the flush - kernels
        #: whose single sends A's bits then, and those that read such a kernel's record
        self.witnessed: list[tuple[dict, object, object]] = []
        #: (planes, record): masked 3-out-of-3 bits a verified comparison made, by identity
        self.masked: list[tuple[np.ndarray, dict]] = []
        #: the pending checks' size, the same at every party: the gates of the registered
        #: claims (all three provers'), plus the elements of kernels whose claims wait for
        #: the flush (the job runner flushes at a layer's end from a size on:
        #: :data:`net.party.malicious.FLUSH_AT`)
        self.pending = 0
        self.received = hashlib.blake2b(digest_size=32, person=b"mpc3-open-recv")
        self.for_next = hashlib.blake2b(digest_size=32, person=b"mpc3-open-recv")
        #: both digests are of the same values when everyone is honest (one personalisation)
        self.input_mine = hashlib.blake2b(digest_size=32, person=b"mpc3-input")
        self.input_next = hashlib.blake2b(digest_size=32, person=b"mpc3-input")
        #: this party's XOR shares of its neighbours' mod-2 linear relations (the
        #: comparisons' thermometer sums, :func:`mpc3.claims_compare._therm_side`): as V_L
        #: of next, as V_R of prev - equal digests when everyone is honest
        self.linear_left = hashlib.blake2b(digest_size=32, person=b"mpc3-linear")
        self.linear_right = hashlib.blake2b(digest_size=32, person=b"mpc3-linear")
        self.linear_used = False

    def linear(self, pos: int, shares: np.ndarray) -> None:
        """This party's XOR shares (0/1 uint8 rows) of mod-2 linear relations of a prover's
        claim, at view ``pos`` (2: its V_L, 1: its V_R): a relation holds iff its two
        verifiers' shares are equal, so V_R sends V_L a digest of its shares at the flush,
        with the proof (:func:`mpc3.dzkp.verify_claims`, ``linear``)."""
        (self.linear_left if pos == 2 else self.linear_right).update(
            np.ascontiguousarray(shares, dtype=np.uint8).tobytes())

    def _sent(self, op: int, nbytes: int) -> None:
        self.sent[op] = self.sent.get(op, 0) + nbytes

    def _add(self, triples) -> None:
        """Keep (own, as V_L, as V_R) claim triples: ring claims with each side of bits held
        as bits (:func:`mpc3.dzkp.compact`), mod-2 gates for :mod:`mpc3.dzkp_bits`."""
        for trio in triples:
            if isinstance(trio[0], dzkp_bits.BitClaim):       # mod-2 gates, packed
                self.bit_claims.append(trio)
            else:
                self.claims.append(tuple(dzkp.compact(c) for c in trio))
            self.pending += sum(c.z.size for c in trio)

    def _wait(self, rec, make, claims, n: int) -> None:
        """A kernel whose claims are built at the flush (``make`` its witness or None), on
        ``n`` elements."""
        self.witnessed.append((rec, make, claims))
        self.pending += n

    def _cover(self, p, nbytes: int, back: int = 0) -> None:
        """The message(s) of this party in the last round (``back`` rounds before it)
        include ``nbytes`` a claim covers."""
        op = p.comm.op - back
        self.covered[op] = self.covered.get(op, 0) + nbytes

    # --------------------------------------------------------- what kernels register --
    def product(self, p, x, y, out, trunc, kop: int, tag: str = "reshare") -> None:
        """``mul_aa``'s message, if it was a plain reshare (``trunc`` False) of
        ``x.a (y.a + y.b) + x.b y.a`` under the zero sharing ``(kop, tag)`` (mul_many's
        items in malicious mode: one tag each, :mod:`mpc3.kernels.checked`)."""
        if trunc is not False:
            return                                  # truncating products: not yet covered
        self._add([mul_claims(p, x, y, out.a, out.b, tag, kop)])
        self._cover(p, out.a.nbytes)

    def matmul(self, p, x, y, out, trunc, kop: int, tag: str = "reshare") -> None:
        """``matmul_aa``'s message, if it was a plain reshare (``trunc`` False) of operands
        :func:`mpc3.freivalds.matmul_claims` (any shape), masked under ``(kop, tag)``."""
        if trunc is not False:
            return
        dots = dot_claims(p, x, y, out, tag, kop)       # per-element dot products
        if dots is not None:
            self._add([dots])
            self._cover(p, out.a.nbytes)
            return
        self.mats.append(matmul_claims(p, x, y, out, kop, tag))
        self.pending += out.a.size
        self._cover(p, out.a.nbytes)

    def and_product(self, p, x, y, out, tag: str, kop: int) -> None:
        """An AND layer's message (:func:`mpc3.kernels.boolean.and_steps`): ``out.a`` sent,
        ``out.b`` received, masked with the boolean zero sharing ``(kop, tag)``; proven as
        the replicated product's claim mod 2 (:func:`and_claims`)."""
        self._add([and_claims(p, x, y, out, tag, kop)])
        self._cover(p, cost_and_bb(x.n, planes=x.planes).bytes_per_party[p.rank])

    def injection(self, p, x, bit, st: list[dict], got2, masked: bool, seg: int) -> None:
        """Bit injection's two rounds (:func:`mpc3.kernels.convert.inject_steps`), with run
        sums or not (``seg``): :func:`mpc3.claims.injection_claims` for a bit given as an
        RSS sharing, or as masked 3-out-of-3 planes a verified comparison made (``masked``;
        the claims then wait for the flush, where the comparison's witness splits the
        single's bit, and cover the pair's swap of its halves too)."""
        if not masked:
            self._add(injection_claims(p, x, bit, st, got2, seg=seg))
        else:
            rec = next((r for planes, r in self.masked if planes is bit), None)
            if rec is None:
                return                        # masked bits of an unverified kernel
            rec["used"] = True
            self._wait({"x": x, "st": st, "got2": got2, "origin": rec, "seg": seg}, None,
                       masked_injection_claims, x.shape[0])
        for s, sl in zip(st, group_bounds(x.shape[0])):   # what the kernel sent, by round
            if s["role"] == 0:
                self._cover(p, s["m1"].nbytes + s["m2"].nbytes + s["s0"].nbytes, back=1)
            else:                            # y, or one sum per run
                self._cover(p, 8 * _run_starts(sl.start, sl.stop, seg).size if seg
                            else s["y"].nbytes)
                if masked:
                    self._cover(p, packed_bytes(s["n"], 1), back=1)     # the swap

    def compare(self, p, bits, rec: dict) -> None:
        """The comparison with public thresholds (:func:`mpc3.kernels.thresholds.
        compare_steps`): :func:`mpc3.claims_compare.compare_claims`, whose witness (A's
        bits of the rows) goes out at the flush; its output bits are known by identity to
        the injection that consumes them. The late form (``pair_b``) reads A's bits from
        the product's fused truncation (no witness of its own)."""
        late = rec["late"]
        self._wait(rec, None if late else compare_witness, compare_claims, rec["x"].size)
        self.masked.append((bits.planes, {"rec": rec, "parts": bit_parts,
                                          "swaps": swap_claims}))
        nb = len(rec["blocks"])
        nmask, ndeal = 2 * nb - 2, len(carry_plan(nb)[2])
        therm = sum((1 << w) - 1 for _, w in rec["blocks"])
        for s in rec["state"]:
            one = packed_bytes(s["n"], 1)
            if s["role"] == 0:
                self._cover(p, packed_bytes(s["nrows"], 1) * therm + one * ndeal, back=1)
            else:                           # role 1: round 1 (round 2 if late)
                self._cover(p, one * nmask, back=int(s["role"] == 1 and not late))

    def truncation(self, p, x, per, state: list[dict], got2, plain_form: bool, got=None,
                   terms=None) -> None:
        """A truncation's messages (:func:`mpc3.kernels.truncation.trunc_steps`); covered
        for a replicated input without multipliers (``plain_form``: trunc_a) and, with
        ``terms`` (the products whose masked terms ``x`` is, :mod:`mpc3.kernels.checked`),
        fused into their resharing (``got``: its first round's messages):
        :mod:`mpc3.claims_trunc`, whose witness goes out at the flush. The split and
        scaled forms are not covered."""
        if not plain_form and terms is None:
            return
        rec = {"per": per, "state": state, "got2": got2, "kop": p.kop}
        if terms is None:
            rec.update(x=x, groups=[sl for sl, _, _ in _default_segments(x.size, False)])
            self._wait(rec, trunc_witness, trunc_claims, x.a.size)
        else:                               # groups: the kernel's segments
            rec.update(z=x, got=got, terms=terms, groups=terms["groups"],
                       pair_sum=terms["pair_sum"])
            self._wait(rec, fused_witness, fused_claims, x.size)
        exact = got2 is not None
        for st, (_, _, _, plan) in zip(state, per):
            ng = st["n"]
            wb = width_bytes(plan, ng) if exact else 0
            if st["role"] == 0:
                self._cover(p, 8 * ng + wb, back=int(exact))      # Uk (and t)
            else:
                if terms is not None:
                    self._cover(p, 8 * ng, back=int(exact))       # the pair's terms
                if exact:
                    self._cover(p, wb)                            # x1 / x2

    def reshared(self, p, items, sent, received, kop: int, tag: str, back: int) -> None:
        """Products reshared side by side (``sent`` to prev, ``received`` from next, flat;
        items as :func:`mpc3.claims.term_views`') under the zero sharing ``(kop, tag)``,
        ``back`` rounds before the last."""
        triples, mats = term_views(p.rank, items, sent, received, None,
                                   *masks(p, kop, tag, sent.shape))
        self._add(triples)
        if mats is not None:
            self.mats.append(mats)
            self.pending += sum(c.target.size for c in mats[0])
        self._cover(p, sent.nbytes, back=back)

    def leaves(self, p, rec: dict) -> None:
        """The comparison leaves' messages (:func:`mpc3.kernels.leaves.leaves_steps`):
        :func:`mpc3.claims_compare.leaves_claims`, whose witness goes out at the flush; the
        late form (``pair_b``, a product's split form) reads A's bits from the product's
        fused truncation (no witness of its own)."""
        late = rec["late"]
        self._wait(rec, None if late else leaves_witness, leaves_claims, rec["x"].size)
        nrows = sum((1 << k) - 1 for _, k in rec["blocks"]) + 1
        nconv = 2 * len(rec["blocks"]) - 1
        for s in rec["state"]:
            role, bits = s["role"], packed_bytes(s["n"], 1)      # role 1: round 2 if late
            self._cover(p, bits * (nrows if role == 0 else nconv),
                        back=int(role == 0 or (role == 1 and not late)))

    def fused_and(self, p, planes: np.ndarray, rec: dict) -> None:
        """The carry tree's last AND layer kept as masked 3-out-of-3 ``planes``
        (:func:`mpc3.kernels.convert._carry_steps`): no message of its own; the single's
        share goes out as a witness at the flush and the injection that consumes the
        planes proves all three shares (:mod:`mpc3.claims_masked`)."""
        rec["planes"] = planes
        self._wait(rec, tree_witness, tree_keep, 0)
        self.masked.append((planes, {"rec": rec, "parts": tree_parts, "swaps": tree_swaps}))

    def public(self, p, nbytes: int) -> None:
        """This party's message in the last round carried ``nbytes`` that no proof can or
        need cover: a constant its receivers check themselves (a barrier's zero), or a
        party's report of its own measurements, which no protocol determines (a diagnostic
        job's figures: benchmark registries only)."""
        self._cover(p, nbytes)

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
        if to is None or p.rank == (to + 1) % 3:
            self._cover(p, x.b.nbytes)

    # ---------------------------------------------------------------------- flush -------
    def batches(self) -> tuple[list, list, list]:
        """The registered claims in the three roles, one batch per registered triple (one
        kernel's gates of one width), handed over: the proof releases each batch once
        folded, so the claims are held once and never copied. A kernel whose roles rotate
        over element groups gives the three provers batches that differ by a few gates; the
        proof takes each as long as the longest of the three (a public size)."""
        out = ([], [], [])
        for trio in self.claims:
            for j in range(3):
                out[j].append(trio[j])
        self.claims = []
        return out

    def _product_of(self, pair_b: np.ndarray) -> dict:
        """The fused truncation whose pair sums a late comparison read (by identity)."""
        for rec, _, _ in self.witnessed:
            if rec.get("pair_sum") is pair_b:
                return rec
        raise Unverified("malicious mode: a comparison of a product's split form without "
                         "its product's fused truncation is not covered")

    def checkpoint(self, p, where: str = "") -> bool:
        """Between two kernels (no profiled entry point open: :func:`mpc3.party.profiled`
        calls this, ``where`` naming the entry point that returned), flush if the pending
        checks reached ``split_at`` and everything registered is self-contained: every
        message sent is covered, and every masked bit a comparison left has been injected
        (the injection's claims read the comparison's record). Every party decides alike
        (the same pending size, the same kernels), so the flush's rounds line up. It
        bounds a flush's memory inside a layer (a GPT-2-small layer's claims do not fit
        at once). True if it flushed."""
        if (self.split_at is None or self.depth or self.pending < self.split_at
                or (self.limit is not None and self.flushes >= self.limit)):
            return False
        if any(self.covered.get(op, 0) < n for op, n in self.sent.items()):
            return False
        if not all(rec.get("used") for _, rec in self.masked):
            return False
        self.flush(p)
        return True

    def between_blocks(self, p) -> bool:
        """A point between two blocks of an entry point's rows (:func:`in_blocks`): between
        kernels if that entry point is the only one open."""
        if self.depth != 1:
            return False
        self.depth = 0
        try:
            return self.checkpoint(p, self.entry)
        finally:
            self.depth = 1

    def params_at(self, flush: int) -> dzkp.Params:
        """The proof parameters of the job's flush number ``flush`` (from 0)."""
        if self.later is not None and flush >= self.later[0]:
            return self.later[1]
        return self.params

    def release(self) -> None:
        """The job ended: its scratch goes back for the next job's flushes."""
        if self.scratch is not None:
            scratch.give_back(self.scratch)
            self.scratch = None

    def flush(self, p) -> None:
        """Verify everything registered since the last flush (see the module docstring)."""
        self.depth += 1             # the proof's own kernels are not checkpoints
        prof = getattr(p, "profiler", None)     # a cost breakdown's "verify" region
        opened = prof is not None and prof.enter(VERIFY)
        try:
            self._flush(p)
        finally:
            self.depth -= 1
            if opened:
                prof.exit()
        self.flushes += 1

    def _flush(self, p) -> None:
        missing = [op for op, n in sorted(self.sent.items()) if self.covered.get(op, 0) < n]
        if missing:
            raise Unverified(f"malicious mode: {len(missing)} round(s) (first: op "
                             f"{missing[0]}) carried messages from kernels that have no "
                             f"verification yet; the job is refused (docs/MALICIOUS.md lists "
                             f"what is covered)")
        digests = np.frombuffer(self.for_next.digest() + self.input_next.digest(), np.uint8)
        witness = []
        for rec, make, claims in self.witnessed:
            if make is not None:
                witness.append(make(p, rec))
                self.flush_bytes[f"witness {claims.__name__}"] += witness[-1].nbytes
        self.flush_bytes["digests"] += digests.nbytes
        _, got = p.comm.exchange(to_next=[digests, *witness], from_prev=True)
        theirs, wits = got[0].tobytes(), iter(got[1:])
        for rec, make, _ in self.witnessed:
            rec["witness"] = next(wits) if make is not None else None
        for rec, _, claims in self.witnessed:             # in registration order
            if rec.get("late"):                           # its product's fused truncation
                rec["trunc"] = self._product_of(rec["pair_b"])
            made = claims(p, rec, rec["witness"])
            if isinstance(made, tuple):                   # (triples, matrix products' views)
                made, mats = made
                if mats is not None:
                    self.mats.append(mats)
            self._add(made)
        opened_ok = theirs[:32] == self.received.digest()
        inputs_ok = theirs[32:] == self.input_mine.digest()
        mine, left, right = self.batches()
        mats = tuple([c for views in self.mats for c in views[j]] for j in range(3))
        before = p.comm.stats.bytes_sent
        linear = (self.linear_left.digest(), self.linear_right.digest()) \
            if self.linear_used else None
        bits = dzkp_bits.verify_bits(p, *zip(*self.bit_claims)) if self.bit_claims else None
        dzkp.verify_claims(p, mine, left, right, self.params_at(self.flushes),
                           digests=(opened_ok, inputs_ok), mats=mats if self.mats else None,
                           linear=linear, bits=bits, scratch=self.scratch)
        self.flush_bytes["proof"] += p.comm.stats.bytes_sent - before
        self._reset(p)

