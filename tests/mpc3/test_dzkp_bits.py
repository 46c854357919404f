"""Proofs of mod-2 gates over GF(2^64) (mpc3.dzkp_bits, mpc3.gf2k): the field and the bit
kernels against their definitions, honest batches pass at their declared cost, a false gate
fails its prover's proof and no other, any deviation in the proof's messages aborts, and
what the verifiers open is masked by the prover's pads."""
import functools

import numpy as np
import pytest

from mpc3 import dzkp, dzkp_bits as B, gf2k, tamper
from mpc3.comm import MalformedMessage, ProtocolError, SeedMismatch
from mpc3.sim import make_parties, run_parties
from helpers.parties import deviating, parties_with_private


def _slow_mul(a: int, b: int) -> int:
    """Schoolbook: the 127-bit carry-less product, reduced bit by bit from the top."""
    r = 0
    for i in range(64):
        if b >> i & 1:
            r ^= a << i
    for i in range(126, 63, -1):
        if r >> i & 1:
            r ^= (1 << i) | (gf2k.LOW << (i - 64))
    return r


def _words(rng, *shape) -> np.ndarray:
    return rng.integers(0, 1 << 64, size=shape, dtype=np.uint64)


def test_field_arithmetic_matches_its_definition():
    rng = np.random.default_rng(1)
    a, b = _words(rng, 300), _words(rng, 300)
    prod = gf2k.mul(a, b)
    for x, y, z in zip(a, b, prod):
        assert gf2k.mul_int(int(x), int(y)) == _slow_mul(int(x), int(y)) == int(z)
    for x in a[:20]:
        assert gf2k.mul_int(int(x), gf2k.inv_int(int(x))) == 1
    with pytest.raises(ZeroDivisionError):
        gf2k.inv_int(0)
    # a polynomial of degree 4 through its values at 5 (and at 9) nodes, anywhere
    coef = [int(c) for c in _words(rng, 5)]

    def poly(x):
        out, power = 0, 1
        for c in coef:
            out ^= gf2k.mul_int(c, power)
            power = gf2k.mul_int(power, x)
        return out
    for count in (5, 9):
        values = np.array([poly(e) for e in range(count)], dtype=np.uint64)
        for x in (3, int(_words(rng, 1)[0]), 1 << 63):
            assert gf2k.at(values, x) == poly(x)
    # fold and the symmetric Gram sums, chunks of 5 with the last one short
    X, Y, c = _words(rng, 37), _words(rng, 37), _words(rng, 8)
    Xp, Yp = np.zeros(40, np.uint64), np.zeros(40, np.uint64)
    Xp[:37], Yp[:37] = X, Y
    folded = gf2k.fold(X, c, 8)
    T = gf2k.gram(X, Y, 8)

    def G(i, j):
        return functools.reduce(lambda s, t: s ^ gf2k.mul_int(int(Xp[5 * i + t]),
                                                             int(Yp[5 * j + t])), range(5), 0)
    for t in range(5):
        assert int(folded[t]) == functools.reduce(
            lambda s, i: s ^ gf2k.mul_int(int(c[i]), int(Xp[5 * i + t])), range(8), 0)
    for p, (i, j) in enumerate(gf2k._pairs(8)):
        assert int(T[p]) == (G(i, i) if i == j else G(i, j) ^ G(j, i))


def test_both_carry_less_products_match_the_schoolbook():
    """The 64-step loop (any CPU) and, where this host has it, PCLMULQDQ: (lo, hi) of the
    127-bit carry-less product, on edge and random words."""
    import numba

    rng = np.random.default_rng(3)
    a = np.concatenate([np.array([0, 1, 1 << 63, (1 << 64) - 1], np.uint64), _words(rng, 200)])
    b = np.concatenate([np.array([(1 << 64) - 1, 1 << 63, 1, 0], np.uint64), _words(rng, 200)])
    forms = [numba.njit(gf2k._clmul)] + ([gf2k._pclmul()] if gf2k.hardware_clmul() else [])
    for form in forms:
        @numba.njit
        def each(x, y, lo, hi):
            for i in range(x.size):
                lo[i], hi[i] = form(x[i], y[i])
        lo, hi = np.empty_like(a), np.empty_like(a)
        each(a, b, lo, hi)
        for x, y, low, high in zip(a, b, lo, hi):
            r = 0
            for i in range(64):
                if int(y) >> i & 1:
                    r ^= int(x) << i
            assert (int(low), int(high)) == (r & ((1 << 64) - 1), r >> 64)


def _bit(X, r, i, t, nw):
    w, b = divmod(t, 64)
    idx = i * nw + w
    return int(X[r, idx]) >> b & 1 if idx < X.shape[1] else 0


def test_bit_kernels_match_their_definitions():
    rng = np.random.default_rng(2)
    a = _words(rng, 64)
    t = a.copy()
    B._kernels()["transpose"](t)
    assert all((int(t[j]) >> i & 1) == (int(a[i]) >> j & 1)
               for i in range(64) for j in range(64))
    m, W, k = 3, 21, 8
    nw = -(-W // k)
    U, V, z = _words(rng, m, W), _words(rng, m, W), _words(rng, W)
    sig, coefs = _words(rng, 64 * nw), _words(rng, k)
    T = B.gram_bits(B.BitClaim(U, V, z), sig, k, nw)
    S = B.weighted_sums(z, sig, k, nw)
    F = B.fold_bits(U, m, coefs, k, nw).reshape(m, 64 * nw)
    for p, (i, j) in enumerate(gf2k._pairs(k)):
        want = 0
        for pos in range(64 * nw):
            c = 0
            for r in range(m):
                c ^= _bit(U, r, i, pos, nw) & _bit(V, r, j, pos, nw)
                if i != j:
                    c ^= _bit(U, r, j, pos, nw) & _bit(V, r, i, pos, nw)
            want ^= int(sig[pos]) if c else 0
        assert int(T[p]) == want
    for i in range(k):
        want = 0
        for pos in range(64 * nw):
            want ^= int(sig[pos]) if _bit(z[None], 0, i, pos, nw) else 0
        assert int(S[i]) == want
    for r in range(m):
        for pos in range(64 * nw):
            want = 0
            for i in range(k):
                want ^= int(coefs[i]) if _bit(U, r, i, pos, nw) else 0
            assert int(F[r, pos]) == want


def _batches(shapes, seed=0, wrong=None):
    """Each prover's gates ``XOR_a u_a v_a = z`` per batch (words, terms), z split into
    V_L's and V_R's shares; ``wrong`` (prover, batch, word, bit, side): that prover's
    claim is false there - its z share ("z") or its own u differs from V_L's ("u")."""
    rng = np.random.default_rng(seed)
    out = []
    for prover in range(3):
        mine = []
        for b, (W, m) in enumerate(shapes):
            u, v = _words(rng, m, W), _words(rng, m, W)
            z = np.bitwise_xor.reduce(u & v, axis=0)
            zl = _words(rng, W)
            seen_u = u.copy()
            if wrong is not None and wrong[:2] == (prover, b):
                flip = np.uint64(1 << wrong[3])
                if wrong[4] == "z":
                    z[wrong[2]] ^= flip
                else:
                    seen_u[0, wrong[2]] ^= flip      # V_L's u: the prover proves its own
            mine.append((u, v, zl, z ^ zl, seen_u))
        out.append(mine)
    return out


def _prove(p, data, verdicts=False):
    i, nxt, prv = p.rank, (p.rank + 1) % 3, (p.rank - 1) % 3
    mine = [B.BitClaim(u, v, zl ^ zr) for u, v, zl, zr, _ in data[i]]
    left = [B.BitClaim(seen, None, zl) for _, _, zl, _, seen in data[nxt]]
    right = [B.BitClaim(None, v, zr) for _, v, _, zr, _ in data[prv]]
    before = p.stats.snapshot()
    ok = B.verify_bits(p, mine, left, right)
    spent = p.stats - before
    if verdicts:                             # the ring proof's verdict round carries them
        dzkp.verify_claims(p, [], [], [], digests=(True, True), bits=ok)
    return ok, spent


@pytest.mark.parametrize("shapes", [[(1, 2)], [(3, 2)], [(700, 2)], [(77, 9)],
                                    [(130, 2), (5, 15), (0, 4), (64, 1)]])
def test_honest_batches_pass_at_declared_cost(shapes):
    out = run_parties(_prove, [(_batches(shapes),)] * 3)
    rounds, sent = B.cost_verify_bits(shapes)
    for ok, spent in out:
        assert ok == (True, True)
        assert (spent.rounds, spent.bytes_sent) == (rounds, sent)


@pytest.mark.parametrize("prover", [0, 1, 2])
@pytest.mark.parametrize("where", [(0, 0, 0, "z"), (0, 129, 63, "z"), (1, 4, 17, "u")])
def test_a_false_gate_fails_its_provers_proof_and_no_other(prover, where):
    shapes = [(130, 2), (5, 15)]
    batch, word, bit, side = where
    data = _batches(shapes, seed=prover, wrong=(prover, batch, word, bit, side))
    out = run_parties(_prove, [(data,)] * 3)
    for rank, (ok, _) in enumerate(out):     # ok: (next's proof, prev's proof)
        assert ok == ((rank + 1) % 3 != prover, (rank - 1) % 3 != prover)
    got = tamper.run(functools.partial(_prove, verdicts=True), [(data,)] * 3, make_parties())
    assert isinstance(got.error, dzkp.CheatingDetected) and got.error.prover == prover


def test_any_deviation_in_the_proof_itself_aborts():
    """Random messages of the proof (seeds, shares of h, pads, openings) and the verdicts,
    each party cheating in turn: never accepted."""
    data = _batches([(200, 2), (9, 7)], seed=4)
    job = functools.partial(_prove, verdicts=True)
    clean = tamper.run(job, [(data,)] * 3, make_parties())
    assert clean.error is None
    rng = np.random.default_rng(5)
    for trial in range(24):
        kind = ("add", "flip", "replace")[trial % 3]
        target = tamper.draw(clean.sent, rng, kind)
        got = tamper.run(job, [(data,)] * 3, make_parties(), target,
                         tamper.Deviation(kind, error=int(rng.integers(1, 1 << 62)),
                                          seed=trial))
        assert len(got.records) == 1
        assert isinstance(got.error, ProtocolError), (target, got.error)


def test_opened_values_are_masked_by_the_provers_pads(monkeypatch):
    """Zero knowledge: same data and challenges, other pads - every opened p(r), q(r)
    differs; same pads - identical."""
    opened = []
    real = B._accept

    def spy(mine, got):
        opened.append((mine ^ got[0])[-3:-1].copy())
        return real(mine, got)
    monkeypatch.setattr(B, "_accept", spy)
    data = _batches([(100, 2)], seed=6)
    runs = []
    for private in (b"a", b"b", b"a"):
        opened.clear()
        run_parties(_prove, [(data,)] * 3, parties=parties_with_private(b"s" * 8, private))
        runs.append(np.stack(sorted(opened, key=lambda a: a.tobytes())))
    assert np.array_equal(runs[0], runs[2])
    assert (runs[0] != runs[1]).all()


def test_soundness_bits():
    assert B.soundness_bits([(10 ** 11 // 64, 1)]) >= 55.5
    assert B.soundness_bits([(1, 2)]) >= 56
    assert B.soundness_bits([(0, 2)]) == float("inf") and B.cost_verify_bits([(0, 2)]) == (0, 0)


def test_malformed_views_are_refused():
    with pytest.raises(ValueError, match="bit claim"):
        B.BitClaim(np.zeros((2, 3), np.uint64), None, np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="bit claim"):
        B.BitClaim(np.zeros((2, 3), np.uint8), None, np.zeros(3, np.uint64))


def test_a_verifier_cannot_make_the_prover_answer_other_challenges():
    """Zero knowledge against a malicious V_R: had the prover answered a seed other than
    the one V_L checks against, V_L's opened check (h's weighted sum against its claim
    share) would give V_R a linear function of the prover's secret gates - 64 of them
    recovered whole from one batch word. The prover takes the seed from both verifiers and
    aborts on a mismatch before it answers, so V_R never sees V_L's openings."""
    data = _batches([(1, 1)], seed=8)
    received = {r: [] for r in range(3)}
    out = run_parties(deviating, [(_prove, (data,), 2, 1, "to_prev",
                                   lambda a: [np.frombuffer(b"another seed 16b", np.uint8)],
                                   received)] * 3)
    assert isinstance(out[1], SeedMismatch) and not out[1].everywhere
    assert received[2] == []                 # V_L's (party 0's) openings never reached V_R


@pytest.mark.parametrize("call, direction, receiver", [(1, "to_prev", 0), (2, "to_next", 2)])
@pytest.mark.parametrize("change", [lambda a: [], lambda a: [a[0][:-1]],
                                    lambda a: [a[0].view(np.int64)], lambda a: [a[0], a[0]]])
def test_malformed_proof_messages_are_refused_by_their_receiver(call, direction, receiver,
                                                                change):
    """A seed (round 1, to the prover) or a share of h (round 2, to V_R) that is not one
    array of the expected dtype and size: MalformedMessage naming the sender, never an
    IndexError or ValueError."""
    data = _batches([(200, 2)], seed=9)
    received = {r: [] for r in range(3)}
    out = run_parties(deviating, [(_prove, (data,), 1, call, direction, change, received)] * 3)
    assert isinstance(out[receiver], MalformedMessage) and out[receiver].prover == 1, out
