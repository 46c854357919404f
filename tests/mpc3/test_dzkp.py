"""Distributed zero-knowledge verification of replicated products (mpc3.dzkp): honest
batches pass at their declared cost, every deviation of one party - in its product message
or in its proof - aborts the job naming the prover, and what the verifiers open depends on
the prover's private pads (zero knowledge)."""
import numpy as np
import pytest

from mpc3 import dzkp, tamper
from mpc3.claims import mul_claims
from mpc3.comm import PREV, MalformedMessage, ProtocolError
from mpc3.galois import galois_ring
from mpc3.kernels.arith import _local_mul
from mpc3.shares import AShare
from mpc3.sharing import deal, reveal
from mpc3.sim import make_parties, run_parties
from helpers.parties import deviating, parties_with_private
from net.party.malicious import EARLY_FLUSHES, LATE_PARAMS, MAX_FLUSHES, job_soundness_bits

M64 = 1 << 64


def _product_then_verify(p, x, y, params=dzkp.Params()):
    """z = x y by one reshare (the message tested), then the proof of every party's message."""
    kop = p.new_op()
    sent = p.add_zero_share(_local_mul(x, y), "mul")
    got, _ = p.comm.exchange(to_prev=[sent], from_next=True)
    before = p.stats.snapshot()
    dzkp.verify_claims(p, *mul_claims(p, x, y, sent, got[0], "mul", kop), params)
    return AShare(sent, got[0]), p.stats - before


def _operands(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, M64, size=n, dtype=np.uint64)
    y = rng.integers(0, M64, size=n, dtype=np.uint64)
    return x, y, deal(x, rng), deal(y, rng)


@pytest.mark.parametrize("n", [1, 9, 1000, 5000])
def test_honest_products_pass_at_declared_cost(n):
    x, y, xs, ys = _operands(n)
    out = run_parties(_product_then_verify, [(xs[i], ys[i]) for i in range(3)])
    assert np.array_equal(reveal([o[0] for o in out]), x * y)
    rounds, sent = dzkp.cost_verify(n, 2)
    for _, spent in out:
        assert (spent.rounds, spent.bytes_sent) == (rounds, sent)


def test_the_late_flushes_proof_passes_at_declared_cost_and_catches_a_wrong_message():
    """GR(2^64, 64) with one repetition (a long job's flushes after its first ones:
    net.party.malicious.LATE_PARAMS): honest products pass at its declared cost, and an
    error of 2^63 or 1 in any party's message is caught, naming it."""
    params = LATE_PARAMS
    x, y, xs, ys = _operands(3000)
    args = [(xs[i], ys[i], params) for i in range(3)]
    out = run_parties(_product_then_verify, args)
    assert np.array_equal(reveal([o[0] for o in out]), x * y)
    rounds, sent = dzkp.cost_verify(3000, 2, params)
    assert all((spent.rounds, spent.bytes_sent) == (rounds, sent) for _, spent in out)
    for cheater, error in ((0, 1 << 63), (1, 1), (2, 12345)):
        got = tamper.run(_product_then_verify, args, make_parties(),
                         tamper.Target(cheater, PREV, op=1), tamper.Deviation("add", error))
        assert isinstance(got.error, dzkp.CheatingDetected) and got.error.prover == cheater


@pytest.mark.parametrize("cheater", [0, 1, 2])
@pytest.mark.parametrize("kind,error", [("add", 1), ("add", 1 << 63), ("add", None),
                                        ("flip", None)])
def test_a_wrong_product_message_is_caught_naming_its_sender(cheater, kind, error):
    n = 700
    x, y, xs, ys = _operands(n, seed=cheater)
    rng = np.random.default_rng(cheater * 7 + len(kind))
    for trial in range(3):
        err = int(rng.integers(1, M64, dtype=np.uint64)) if error is None else error
        dev = tamper.Deviation(kind, error=err, seed=trial)
        got = tamper.run(_product_then_verify, [(xs[i], ys[i]) for i in range(3)],
                         make_parties(), tamper.Target(cheater, PREV, op=1), dev)
        assert len(got.records) == 1
        assert isinstance(got.error, dzkp.CheatingDetected), got.error
        assert got.error.prover == cheater


def test_any_deviation_in_the_proof_itself_aborts():
    """Random messages of the verification (seeds, shares of h, pads, openings, verdicts),
    each party cheating in turn: never accepted."""
    x, y, xs, ys = _operands(300)
    args = [(xs[i], ys[i]) for i in range(3)]
    clean = tamper.run(_product_then_verify, args, make_parties())
    assert clean.error is None
    proof = [s for s in clean.sent if s.op > 1]
    rng = np.random.default_rng(5)
    for trial in range(24):
        kind = ("add", "flip", "replace")[trial % 3]
        target = tamper.draw(proof, rng, kind)
        got = tamper.run(_product_then_verify, args, make_parties(), target,
                         tamper.Deviation(kind, error=int(rng.integers(1, 1 << 62)),
                                          seed=trial))
        assert len(got.records) == 1
        assert isinstance(got.error, ProtocolError), (target, got.error)


def test_claims_of_other_sizes_are_refused_before_any_message():
    with pytest.raises(ValueError, match="claim shapes"):
        dzkp.Claim(np.zeros((2, 3), np.uint64), np.zeros((2, 4), np.uint64),
                   np.zeros(3, np.uint64))


def test_opened_values_are_masked_by_the_provers_pads(monkeypatch):
    """Zero knowledge: the verifiers open p(r), q(r) only after the prover's random padding.
    Same data, same challenges, other pads: every opened p(r), q(r) differs; same pads:
    identical (so the difference is the pads', not noise)."""
    opened = []
    real = dzkp._accept

    def spy(g, mine, got):                  # got: the other verifier's message
        opened.append((mine + got[0])[:, -3:-1].copy())
        return real(g, mine, got)
    monkeypatch.setattr(dzkp, "_accept", spy)
    x, y, xs, ys = _operands(200)
    args = [(xs[i], ys[i]) for i in range(3)]
    runs = []
    for private in (b"a", b"b", b"a"):
        opened.clear()
        run_parties(_product_then_verify, args, parties=parties_with_private(b"s" * 8, private))
        runs.append(np.stack(sorted(opened, key=lambda a: a.tobytes())))
    assert np.array_equal(runs[0], runs[2])
    assert (runs[0] != runs[1]).any(axis=-1).all()


def test_soundness_of_the_default_parameters():
    """Per proof, the declared bound is below 2^-47.9 from one gate to 10^10 gates (2^-47.7
    to 10^11 gate terms), and below 2^-55.8 with a long job's later parameters; a job of
    net.party.malicious.MAX_FLUSHES flushes (the first EARLY_FLUSHES with the defaults, three
    proofs each) stays below 2^-40; one repetition of the defaults alone would not do."""
    for L in (1, 10**3, 10**6, 10**8, 10**10):
        assert dzkp.soundness_bits(L, 2) >= 47.9
        assert dzkp.soundness_bits(L, 2, LATE_PARAMS) >= 55.8
    assert dzkp.soundness_bits(10**11, 1, ring_len=10**9) >= 47.7
    assert dzkp.soundness_bits(10**11, 1, LATE_PARAMS, ring_len=10**9) >= 55.8
    assert 3 * EARLY_FLUSHES * 2 ** -47.7 + 3 * (MAX_FLUSHES - EARLY_FLUSHES) * 2 ** -55.8 \
        <= 2 ** -40
    assert job_soundness_bits() >= 40 and job_soundness_bits(4 * MAX_FLUSHES) < 40
    assert dzkp.soundness_bits(10**6, 2, dzkp.Params(reps=1)) < 26


def _dot_claims(p, x, y, sent, got, tag, kop):
    """Claims of a row-dot-product reshare (each gate c columns, 2c terms): mul_claims'
    views with the columns stacked as terms."""
    views = mul_claims(p, x, y, sent, got, tag, kop)       # with rows summed below
    cols = x.shape[1]
    out = []
    for v in views:
        u = v.u.reshape(2, -1, cols).transpose(0, 2, 1).reshape(2 * cols, -1)
        w = v.v.reshape(2, -1, cols).transpose(0, 2, 1).reshape(2 * cols, -1)
        out.append(dzkp.Claim(u, w, v.z.reshape(-1, cols).sum(axis=1)))
    return out


def _two_widths_then_verify(p, x, y, a, b):
    """A product batch (2 terms a gate) and a row-dot-product batch (2 c terms) in one proof."""
    kop = p.new_op()
    sent = p.add_zero_share(_local_mul(x, y), "mul")
    got, _ = p.comm.exchange(to_prev=[sent], from_next=True)
    products = mul_claims(p, x, y, sent, got[0], "mul", kop)
    kop2 = p.new_op()
    full = _local_mul(a, b)                     # (rows, cols): each row's sum is one gate
    masks = [p.prg.ring(s, kop2, "dot", full.shape) for s in ("next", "prev")]
    sent2 = (full + masks[0] - masks[1]).sum(axis=1)
    got2, _ = p.comm.exchange(to_prev=[sent2], from_next=True)
    # the dot claims need per-element messages: spread each row's sum onto its first column
    spread = lambda v: np.concatenate([v[:, None], np.zeros((v.size, a.shape[1] - 1),
                                                          np.uint64)], axis=1)
    dots = _dot_claims(p, a, b, spread(sent2), spread(got2[0]), "dot", kop2)
    before = p.stats.snapshot()
    dzkp.verify_claims(p, *([pc, dc] for pc, dc in zip(products, dots)))
    return p.stats - before


def test_batches_of_different_widths_join_one_proof():
    """Gates of 2 and of 10 terms, chunked apart under one gate weight: honest at the
    declared cost of both batches, and a wrong message in either is caught."""
    x, y, xs, ys = _operands(300, seed=11)
    rng = np.random.default_rng(12)
    a, b = (rng.integers(0, M64, size=(80, 5), dtype=np.uint64) for _ in range(2))
    da, db = deal(a, rng), deal(b, rng)
    args = [(xs[i], ys[i], da[i], db[i]) for i in range(3)]
    out = run_parties(_two_widths_then_verify, args)
    rounds, sent = dzkp.cost_verify([300, 80], [2, 10])
    assert all((s.rounds, s.bytes_sent) == (rounds, sent) for s in out)
    assert dzkp.cost_verify([300, 0], [2, 10]) == dzkp.cost_verify(300, 2)
    for cheater, op in ((0, 1), (1, 2), (2, 2)):
        got = tamper.run(_two_widths_then_verify, args, make_parties(),
                         tamper.Target(cheater, PREV, op=op), tamper.Deviation("add", error=1))
        assert isinstance(got.error, dzkp.CheatingDetected), (cheater, op, got.error)
        assert got.error.prover == cheater


@pytest.mark.parametrize("k,weighted", [(64, True), (32, False), (8, True)])
def test_the_first_fold_of_bit_rows_is_the_lagrange_combination(k, weighted):
    """dzkp_kernels.fold_int on rows of bits (by tables of 8 chunks) equals the fold of the
    same rows as words, and both equal sigma_t sum_i lr_i u_(a, i n + t) computed in the
    Galois ring (a zero row's fold zero, positions past the end zero), into an output that
    held other values (every position is written: fold_batches does not zero it)."""
    from mpc3 import dzkp_kernels as dk
    from mpc3.galois import galois_ring
    g = galois_ring(32)
    rng = np.random.default_rng(k)
    m, L, reps = 5, 37 * k + 5, 2
    n = -(-L // k)
    bits = rng.integers(0, 2, size=(m, L), dtype=np.uint8)
    bits[2] = 0                                          # a zero row
    scale = rng.integers(0, M64, size=m, dtype=np.uint64)
    lr = rng.integers(0, M64, size=(reps, k, g.D), dtype=np.uint64)
    sig = rng.integers(0, 2, size=(reps, n, g.D), dtype=np.uint64) if weighted else None
    got = dk.fold_int(bits, k, lr, sig, g._taps, scale=scale)
    words = bits.astype(np.uint64) * scale[:, None]
    assert np.array_equal(got, dk.fold_int(words, k, lr, sig, g._taps))
    for x, sc in ((bits, scale), (words, None)):         # every position is written
        dirty = np.full((reps, m * n, g.D), 7, dtype=np.uint64)
        assert np.array_equal(dk.fold_int(x, k, lr, sig, g._taps, out=dirty, scale=sc), got)
    pad = np.zeros((m, k * n), dtype=np.uint64)
    pad[:, :L] = words
    chunks = pad.reshape(m, k, n)                        # chunk i, position t
    for r in range(reps):
        want = np.einsum("ain,id->and", chunks, lr[r]).reshape(m * n, g.D)   # mod 2^64
        if weighted:
            want = np.stack([g.mul(want[a * n + t], sig[r, t])
                             for a in range(m) for t in range(n)])
        assert np.array_equal(got[r], want)


def test_a_missing_opening_is_a_rejection_not_a_crash():
    """The other verifier's final openings absent from its message (or of another shape):
    the verdict on the prover is false, so every party aborts with CheatingDetected."""
    g = galois_ring(32)
    mine = np.zeros((2, 4, 32), dtype=np.uint64)
    assert dzkp._accept(g, mine, []) is False
    assert dzkp._accept(g, mine, [np.zeros((2, 3, 32), dtype=np.uint64)]) is False


def test_a_verifier_cannot_make_the_prover_answer_other_challenges():
    """Zero knowledge against a malicious V_R: both verifiers send the prover each seed and
    it refuses two different ones before it answers (had it answered, V_L's opened checks
    would give V_R a linear function of the prover's secret values); V_R never receives
    V_L's openings."""
    x, y, xs, ys = _operands(50)
    received = {r: [] for r in range(3)}
    fake = [np.frombuffer(b"another seed 16b", np.uint8)]
    out = run_parties(deviating, [(_product_then_verify, (xs[i], ys[i]), 2, 2, "to_prev",
                                   lambda a: fake, received) for i in range(3)])
    assert isinstance(out[1], dzkp.SeedMismatch) and not out[1].everywhere
    assert all(a.ndim < 2 for a in received[2])   # openings are (reps, S + 3, D): none


@pytest.mark.parametrize("call, direction, receiver", [(2, "to_prev", 0), (3, "to_next", 2)])
@pytest.mark.parametrize("change", [lambda a: [], lambda a: [a[0][:-1]],
                                    lambda a: [a[0].view(np.int64)], lambda a: [a[0], a[0]]])
def test_malformed_proof_messages_are_refused_by_their_receiver(call, direction, receiver,
                                                                change):
    """A seed (to the prover) or a share of h (to V_R) that is not one array of the expected
    dtype and size: MalformedMessage naming the sender, never an IndexError."""
    x, y, xs, ys = _operands(300)
    received = {r: [] for r in range(3)}
    out = run_parties(deviating, [(_product_then_verify, (xs[i], ys[i]), 1, call, direction,
                                   change, received) for i in range(3)])
    assert isinstance(out[receiver], MalformedMessage) and out[receiver].prover == 1, out


def test_the_ring_fold_skips_zero_chunks_and_pads_the_last():
    """dzkp_ring_kernels.fold_ring = sum_i X_i mats_i (row vector times the multiplication
    matrix, mod 2^64) with a chunk of zeros, a chunk zero but for its last word, and a
    short last chunk."""
    from mpc3 import dzkp_ring_kernels as rk
    rng = np.random.default_rng(5)
    reps, k, D, N = 2, 8, 4, 8 * 9 - 4
    n = -(-N // k)
    X = rng.integers(0, M64, size=(reps, N, D), dtype=np.uint64)
    X[0, 2 * n:3 * n] = 0
    X[1, 4 * n:5 * n] = 0
    X[1, 5 * n - 1, D - 1] = 7
    mats = rng.integers(0, M64, size=(reps, k, D, D), dtype=np.uint64)
    pad = np.zeros((reps, k * n, D), dtype=np.uint64)
    pad[:, :N] = X
    with np.errstate(over="ignore"):
        want = np.einsum("rind,ride->rne", pad.reshape(reps, k, n, D), mats)
    assert np.array_equal(rk.fold_ring(X, k, mats), want)


def test_compact_holds_bit_sides_as_bytes_and_leaves_words_alone():
    """dzkp.compact (dzkp_kernels.bit_rows): a side whose rows each hold zeros and one value
    - a zero row included, contiguous or a transposed view - becomes uint8 bits and the rows'
    values, and reads back as the same side; a side with a second value in any row (its first
    or a later one) stays words."""
    rng = np.random.default_rng(5)
    L = 37
    bits = rng.integers(0, 2, size=(4, L), dtype=np.uint64)
    bits[2] = 0
    vals = np.array([1, 3 << 40, 7, M64 - 5], dtype=np.uint64)
    side = bits * vals[:, None]
    words = side.copy()
    words[3, 5], words[3, 6] = 1, 2                          # a later row holds two values
    z = np.zeros(L, dtype=np.uint64)
    for u in (side, np.ascontiguousarray(side.T).T):
        c = dzkp.compact(dzkp.Claim(u, words, z))
        assert c.u.dtype == np.uint8 and c.v is words and c.vs is None
        assert np.array_equal(c.u.astype(np.uint64) * c.us[:, None], side)
        assert np.array_equal(c.us[[0, 1, 3]], vals[[0, 1, 3]]) and c.us[2] == 0
    first = side.copy()
    first[0, :2] = (1, 2)                                    # its first row holds two values
    assert dzkp.compact(dzkp.Claim(None, first, z)).vs is None
