"""Malicious-mode bookkeeping (mpc3.checks): verified kernels register their messages, a
flush proves them; any deviation of one party in a product or an opening aborts every party,
and a kernel without verification is refused instead of run unchecked."""
from itertools import combinations

import numpy as np
import pytest

from mpc3 import dzkp, ring, tamper
from mpc3.checks import Checks, Unverified
from mpc3.claims import and_bit_batch
from mpc3.dzkp_bits import cost_verify_bits
from mpc3.comm import ProtocolError
from mpc3.kernels import arith, boolean, convert
from mpc3.kernels.base import run_steps
from mpc3.kernels.truncation import trunc_a
from mpc3.party import RingConfig
from mpc3.shares import BShare, bits_to_planes, group_sizes, planes_to_bits
from mpc3.sharing import deal
from mpc3.sim import make_parties, run_parties

M64 = 1 << 64


def _job(p, x, y):
    p.checks = Checks(p)
    z = arith.mul_aa(p, x, y, trunc=False)
    w = arith.mul_aa(p, z, x, trunc=False)
    everyone = arith.open_a(p, z)
    to_zero = arith.open_a(p, w, to=0)
    before = p.stats.snapshot()
    p.checks.flush(p)
    return everyone, to_zero, p.stats - before


def _operands(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, M64, size=n, dtype=np.uint64)
    y = rng.integers(0, M64, size=n, dtype=np.uint64)
    xs, ys = deal(x, rng), deal(y, rng)
    return x, y, [(xs[i], ys[i]) for i in range(3)]


def test_honest_job_passes_and_outputs_are_the_semi_honest_ones():
    x, y, args = _operands()
    out = run_parties(_job, args)
    for r in range(3):
        assert np.array_equal(out[r][0], x * y)
    assert np.array_equal(out[0][1], x * y * x) and out[1][1] is None and out[2][1] is None
    rounds, sent = dzkp.cost_verify(2 * 200, 2)
    for r in range(3):
        assert out[r][2].rounds == rounds + 1                 # + the digests' round
        assert out[r][2].bytes_sent == sent + 64


def test_every_deviation_before_or_during_the_flush_aborts():
    x, y, args = _operands(seed=1)
    clean = tamper.run(_job, args, make_parties())
    assert clean.error is None
    rng = np.random.default_rng(35)
    kinds = ("add", "flip", "replace")
    for trial in range(30):
        kind = kinds[trial % 3]
        # the four job messages first (two products, two openings), then the flush's
        pool = [s for s in clean.sent if s.op <= 4] if trial < 15 else clean.sent
        target = tamper.draw(pool, rng, kind)
        got = tamper.run(_job, args, make_parties(), target,
                         tamper.Deviation(kind, error=int(rng.integers(1, 1 << 62)), seed=trial))
        assert len(got.records) == 1
        assert isinstance(got.error, ProtocolError), (trial, target, got.error)


@pytest.mark.parametrize("cheater", [0, 1, 2])
def test_a_wrong_opening_names_the_sender_or_the_digest(cheater):
    x, y, args = _operands(seed=2)
    # op 3 is the opening to everyone: each party sends its b slot to prev
    got = tamper.run(_job, args, make_parties(), tamper.Target(cheater, -1, op=3),
                     tamper.Deviation("add", error=1 << 63))
    assert isinstance(got.error, dzkp.CheatingDetected)
    assert "opened value" in str(got.error)
    assert f"party {cheater} sent a wrong value" in str(got.error)


def test_a_kernel_without_verification_is_refused():
    x, y, args = _operands(seed=3)

    def job(p, x, y):
        p.checks = Checks(p)
        arith.reshare(p, x.a.copy())            # a 3-out-of-3 input: nothing to check it by
        p.checks.flush(p)
    with pytest.raises(Unverified, match="no verification yet"):
        run_parties(job, args)


def _matmul_job(p, x, y):
    p.checks = Checks(p)
    z = arith.matmul_aa(p, x, y, trunc=False)
    opened = arith.open_a(p, z)
    before = p.stats.snapshot()
    p.checks.flush(p)
    return opened, p.stats - before


@pytest.mark.parametrize("xs,ys", [((8, 16), (16, 8)),            # two-product form
                                   ((128, 96), (96, 128)),        # five-product form
                                   ((2, 5, 16), (16, 4)),         # batch rows x weights
                                   ((3, 4, 16), (3, 16, 5))])     # batched (heads)
def test_matrix_products_are_verified_at_their_declared_cost(xs, ys):
    rng = np.random.default_rng(sum(xs))
    x = rng.integers(0, M64, size=xs, dtype=np.uint64)
    y = rng.integers(0, M64, size=ys, dtype=np.uint64)
    dx, dy = deal(x, rng), deal(y, rng)
    args = [(dx[i], dy[i]) for i in range(3)]
    out = run_parties(_matmul_job, args)
    assert np.array_equal(out[0][0], ring.matmul(x, y))
    items = xs[0] if len(ys) == 3 else 1
    rounds, sent = dzkp.cost_verify(0, 2, ring_len=2 * xs[-1] * items)
    for _, spent in out:
        assert (spent.rounds, spent.bytes_sent) == (rounds + 1, sent + 64)
    for cheater in range(3):
        for kind, error in (("add", 1), ("add", 1 << 63), ("flip", 1)):
            got = tamper.run(_matmul_job, args, make_parties(), tamper.Target(cheater, -1, op=1),
                             tamper.Deviation(kind, error=error, seed=cheater))
            assert isinstance(got.error, dzkp.CheatingDetected), (cheater, kind, got.error)
            assert got.error.prover == cheater


def test_products_and_matrix_products_join_one_proof():
    """Elementwise products (the weighted first compression) and a matrix product (joined
    after it by a random weight) in one flush: honest at the declared cost, and random
    single-message deviations in either abort."""
    rng = np.random.default_rng(6)
    a = rng.integers(0, M64, size=(12, 40), dtype=np.uint64)
    w = rng.integers(0, M64, size=(40, 10), dtype=np.uint64)
    da, dw = deal(a, rng), deal(w, rng)

    def job(p, a, w):
        p.checks = Checks(p)
        sq = arith.mul_aa(p, a, a, trunc=False)
        z = arith.matmul_aa(p, sq, w, trunc=False)
        opened = arith.open_a(p, z)
        before = p.stats.snapshot()
        p.checks.flush(p)
        return opened, p.stats - before
    args = [(da[i], dw[i]) for i in range(3)]
    clean = tamper.run(job, args, make_parties())
    assert np.array_equal(clean.results[0][0], ring.matmul(a * a, w))
    rounds, sent = dzkp.cost_verify(12 * 40, 2, ring_len=2 * 40)
    assert all((s.rounds, s.bytes_sent) == (rounds + 1, sent + 64) for _, s in clean.results)
    for trial in range(12):
        kind = ("add", "flip", "replace")[trial % 3]
        target = tamper.draw([s for s in clean.sent if s.op <= 3] if trial < 6 else clean.sent,
                             rng, kind)
        got = tamper.run(job, args, make_parties(), target,
                         tamper.Deviation(kind, error=int(rng.integers(1, 1 << 62)), seed=trial))
        assert isinstance(got.error, ProtocolError), (trial, target, got.error)


@pytest.mark.parametrize("holder", [0, 1, 2])
def test_an_inconsistent_input_sharing_is_caught(holder):
    """A sharer that hands two parties different copies of one slot (or a party that alters
    its copy) is found at the flush, which names the two holders."""
    x, y, args = _operands(seed=7)

    def job(p, x, y):
        p.checks = Checks(p)
        p.checks.shared_input(x)
        p.checks.shared_input(y)
        p.checks.flush(p)                  # (a product of x would fail its proof as well)
    run_parties(job, args)                                    # consistent: accepted
    bad = [list(a) for a in args]
    x_bad = bad[holder][0]
    bad[holder][0] = type(x_bad)(x_bad.a.copy(), x_bad.b.copy())
    bad[holder][0].a[5] += np.uint64(1)                       # slot `holder` of x, one copy
    with pytest.raises(dzkp.CheatingDetected, match="copy of an input slot") as err:
        run_parties(job, [tuple(a) for a in bad])
    assert {err.value.reporter, err.value.prover} == {holder, (holder - 1) % 3}


def _bit_operands(n, planes, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, size=(2, planes, n)).astype(np.uint8)
    shares = []
    for v in bits:
        p = bits_to_planes(v)
        r1, r2 = (rng.integers(0, M64, size=p.shape, dtype=np.uint64) for _ in range(2))
        slots = [r1, r2, p ^ r1 ^ r2]
        shares.append([BShare(slots[i], slots[(i + 1) % 3], n) for i in range(3)])
    return bits, [(shares[0][i], shares[1][i]) for i in range(3)]


def _and_job(p, x, y):
    p.checks = Checks(p)
    z = boolean.and_bb(p, x, y)
    before = p.stats.snapshot()
    p.checks.flush(p)
    return z, p.stats - before


@pytest.mark.parametrize("n,planes", [(70, 1), (131, 5)])
def test_and_layers_are_verified_mod_2_at_their_declared_cost(n, planes):
    """The GF(2) gate proven over GF(2^64) (mpc3.dzkp_bits), its verdicts sent with the
    ring proof's: honest layers pass at the declared cost (the proof of bits, the digests'
    round and the verdicts' round), one flipped bit (or any change) in any party's message
    fails and names it."""
    bits, args = _bit_operands(n, planes, seed=n)
    out = run_parties(_and_job, args)
    z = out[0][0].a ^ out[1][0].a ^ out[2][0].a
    assert np.array_equal(planes_to_bits(z, n), bits[0] & bits[1])
    rounds, sent = cost_verify_bits([and_bit_batch(n, planes)])
    assert all((s.rounds, s.bytes_sent) == (rounds + 2, sent + 64 + 8) for _, s in out)
    for cheater in range(3):
        for kind in ("flip", "add", "replace"):
            got = tamper.run(_and_job, args, make_parties(), tamper.Target(cheater, -1, op=1),
                             tamper.Deviation(kind, error=1, seed=cheater))
            assert isinstance(got.error, dzkp.CheatingDetected), (cheater, kind, got.error)
            assert got.error.prover == cheater


def test_a_round_shared_with_an_unverified_kernel_is_refused():
    """Coverage is counted in bytes per round: a verified AND layer in lockstep with an
    unverified message (here a bare reshare) does not cover the round."""
    bits, args = _bit_operands(64, 1, seed=9)

    def job(p, x, y):
        p.checks = Checks(p)

        def bare():
            got = yield from boolean.reshare_bits_steps(p, x.a.copy(), x.n)
            return got
        run_steps(p, boolean.and_steps(p, x, y, "and"), bare())
        p.checks.flush(p)
    with pytest.raises(Unverified, match="no verification yet"):
        run_parties(job, args)


def _inject_job(p, bit, x, y):
    p.checks = Checks(p)
    sel = convert.select_ab(p, bit, x, y)
    as_int = convert.b2a(p, bit)
    opened = arith.open_a(p, sel), arith.open_a(p, as_int)
    before = p.stats.snapshot()
    p.checks.flush(p)
    return opened, p.stats - before


@pytest.mark.parametrize("n,cols,kind", [(100, 1, "add"), (31, 3, "flip")])
def test_bit_injection_select_and_b2a_are_verified(n, cols, kind):
    """select_ab (a row's bit over ``cols`` values) and b2a: every term of the single's
    three messages is a product of values its two neighbours hold, the pair's replies two
    such products each. Honest: the semi-honest outputs at the declared cost; any change of
    any of the five messages of either injection is caught and names its sender among the
    suspects."""
    bits, args = _bit_operands(n, 1, seed=n)
    rng = np.random.default_rng(n + 1)
    shape = (n, cols) if cols > 1 else (n,)
    x, y = (rng.integers(0, M64, size=shape, dtype=np.uint64) for _ in range(2))
    dx, dy = deal(x, rng), deal(y, rng)
    args = [(args[i][0], dx[i], dy[i]) for i in range(3)]
    clean = tamper.run(_inject_job, args, make_parties())
    (sel, as_int), spent = clean.results[0]
    b = bits[0][0].astype(np.uint64)
    assert np.array_equal(sel, np.where((b[:, None] if cols > 1 else b) == 1, y, x))
    assert np.array_equal(as_int, b)
    # a party's batches per injection of N elements: its single's group (widths 1 and 4:
    # m2; s0 and m1) and the two groups it pairs in (width 2), each as long as the longest
    # party's
    big = max(group_sizes(n))
    pair = max(a + b for a, b in combinations(group_sizes(n), 2))
    rounds, sent = dzkp.cost_verify([x for N in (cols, 1) for x in (N * big, 2 * N * big,
                                                                    N * pair)], [1, 4, 2] * 2)
    assert all((s.rounds, s.bytes_sent) == (rounds + 1, sent + 64) for _, s in clean.results)
    injection_ops = {s.op for s in clean.sent if s.op <= 4}
    assert injection_ops == {1, 2, 3, 4}                 # two rounds per injection
    for s in [s for s in clean.sent if s.op <= 4]:
        got = tamper.run(_inject_job, args, make_parties(),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation(kind, error=1 << 40, seed=s.op))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        # the single's messages to role 1 also enter role 1's own claim, so a wrong one
        # fails two proofs: the sender's is among those named
        assert s.party in got.error.rejected, (s, got.error)


def _trunc_job(p, x, bits):
    p.checks = Checks(p)
    y = trunc_a(p, x, bits)
    opened = arith.open_a(p, y)
    before = p.stats.snapshot()
    p.checks.flush(p)
    return opened, p.stats - before


@pytest.mark.parametrize("mode,bits", [("exact", 16), ("prob", 16), ("exact", "mixed")])
def test_truncation_is_verified_through_the_singles_bit_witness(mode, bits):
    """trunc_a: the single's Uk and t are pinned by the carries of its A (XOR-shared with
    its neighbours at the flush, 8 bytes an element; 64 mod-2 gates of two terms, then a
    ring gate of three terms), the pair's replies are products.
    Honest: the semi-honest output at the declared cost; every message changed is caught
    and the sender's proof is among the rejected ones."""
    n = 100
    rng = np.random.default_rng(len(mode) + n)
    v = rng.integers(-(1 << 40), 1 << 40, size=n)
    shifts = 16 if bits == 16 else rng.integers(8, 24, size=n)
    d = deal(v.astype(np.uint64), rng)
    cfg = RingConfig(trunc=mode)
    args = [(d[i], shifts) for i in range(3)]
    clean = tamper.run(_trunc_job, args, make_parties(cfg))
    assert clean.error is None, clean.error
    got = clean.results[0][0].astype(np.int64)
    assert np.abs(got - (v >> shifts)).max() <= 1                  # stochastic rounding
    big, exact = max(group_sizes(n)), mode == "exact"
    gates = {3: big, 1: 3 * big} if exact else {3: big}     # Uk's, then t's and the pair's
    rounds, sent = dzkp.cost_verify(list(gates.values()), list(gates))
    brounds, bsent = cost_verify_bits([(big, 2)])             # the carries, a word an element
    for r, (_, spent) in enumerate(clean.results):
        witness = 8 * group_sizes(n)[r]
        assert (spent.rounds, spent.bytes_sent) == \
            (rounds + brounds + 1, sent + bsent + 64 + witness)
    for s in [s for s in clean.sent if s.op <= (2 if exact else 1)]:
        got = tamper.run(_trunc_job, args, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation("add", error=1, seed=s.op))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        assert s.party in got.error.rejected, (s, got.error)


@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_fixed_point_products_are_verified_with_the_truncation_fused(mode):
    """In malicious mode a truncating mul_aa / matmul_aa runs as in semi-honest mode, the
    truncation fused into the resharing (mpc3.claims_trunc's fused form): the same
    fixed-point results, semi-honest mode's rounds and bytes (the single's witness goes at
    the flush), and a wrong message anywhere aborts, naming its sender."""
    rng = np.random.default_rng(21)
    f = RingConfig().frac
    a = rng.normal(size=(6, 8))
    w = rng.normal(size=(8, 5))
    enc = lambda v: np.round(v * 2.0 ** f).astype(np.int64).astype(np.uint64)  # noqa: E731
    da, dw = deal(enc(a), rng), deal(enc(w), rng)

    def job(p, a, w):
        p.checks = Checks(p)
        before = p.stats.snapshot()
        h = arith.matmul_aa(p, a, w)
        sq = arith.mul_aa(p, h, h)
        spent = p.stats - before
        out = arith.open_a(p, sq)
        p.checks.flush(p)
        return out, spent
    args = [(da[i], dw[i]) for i in range(3)]
    cfg = RingConfig(trunc=mode)
    clean = tamper.run(job, args, make_parties(cfg))
    assert clean.error is None, clean.error
    got = clean.results[0][0].astype(np.int64) / 2.0 ** f
    assert np.abs(got - (a @ w) ** 2).max() < 1e-3
    declared = arith.cost_mul(30, cfg) + arith.cost_mul(30, cfg)       # semi-honest mode's
    for r, (_, spent) in enumerate(clean.results):
        assert (spent.rounds, spent.bytes_sent) == (declared.rounds, declared.bytes_per_party[r])
    kernel = [s for s in clean.sent if s.op <= declared.rounds]
    assert {s.op for s in kernel} == set(range(1, declared.rounds + 1))
    witness = [s for s in clean.sent if s.op == declared.rounds + 2]     # after the opening
    assert witness and all(s.entries > 64 for s in witness)             # digests + witness
    for s in witness:               # the single's witness: A's bits (first), M' (last word)
        for element in (64, s.entries - 1):
            got = tamper.run(job, args, make_parties(cfg),
                             tamper.Target(s.party, s.direction, op=s.op),
                             tamper.Deviation("add", error=1, element=element))
            assert isinstance(got.error, dzkp.CheatingDetected), (s, element, got.error)
    for trial, s in enumerate(kernel):
        got = tamper.run(job, args, make_parties(cfg), tamper.Target(s.party, s.direction,
                                                                     op=s.op),
                         tamper.Deviation("flip", seed=trial))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        assert s.party in got.error.rejected, (s, got.error)
