"""Malicious mode over the comparisons (mpc3.claims_compare): the DReLU leaves' thermometer
codes are pinned by the single's bit witness (monotonicity gates; the sums and top row as
mod-2 linear relations compared by digest), the pair's halves are
selections; drelu_a and msb_a (leaves, then AND layers) pass honest runs at the declared
cost and abort on any changed message, the flush's witness included."""
import numpy as np
import pytest

from mpc3 import dzkp, tamper
from mpc3.checks import Checks
from mpc3.claims import and_bit_batch
from mpc3.dzkp_bits import cost_verify_bits
from mpc3.claims_compare import leaves_bit_batches
from mpc3.kernels import convert, leaves
from mpc3.kernels.leaves import ands_per_level, leaf_blocks
from mpc3.kernels.thresholds import window_for
from mpc3.party import RingConfig
from mpc3.shares import group_sizes, planes_to_bits
from mpc3.sharing import deal
from mpc3.sim import make_parties


def _drelu_job(p, x, exact):
    p.checks = Checks(p)
    bit = convert.drelu_a(p, x, exact=exact)
    last = p.comm.op
    before = p.stats.snapshot()
    p.checks.flush(p)
    return bit, last, p.stats - before


def _opened(results, n):
    return planes_to_bits(np.bitwise_xor.reduce([r[0].a for r in results]), n)[0]


def _declared_flush(n: int, L: int, m: int) -> list[tuple[int, int]]:
    """(rounds, bytes) of each party's flush: the leaves' mod-2 gates (the single's carry
    and monotonicity gates, the pair's halves; padded to the largest prover) and the carry
    tree's AND layers, no ring gates - the thermometers' sums are linear relations, a
    digest - plus the digests and this party's witness (8 B per element it is the single
    for)."""
    nb = len(leaf_blocks(m - 1, n))
    rounds, sent = dzkp.cost_verify(0, 2, linear=True, verdicts=True)
    brounds, bsent = cost_verify_bits(leaves_bit_batches(n, m) + [
        and_bit_batch(n, count) for count in ands_per_level(nb)])
    return [(rounds + brounds + 1, sent + bsent + 64 + 8 * group_sizes(n)[r]) for r in range(3)]


@pytest.mark.parametrize("n,exact", [(150, False), (67, True)])
def test_drelu_is_verified_through_the_leaves_claims(n, exact):
    cfg = RingConfig()
    L, m = window_for(cfg, exact)
    rng = np.random.default_rng(n)
    lim = 1 << (L + m - 3)
    v = rng.integers(-lim, lim, size=n)
    v[:4] = [0, -1, lim - 1, -lim]
    d = deal(v.astype(np.uint64), rng)
    args = [(d[i], exact) for i in range(3)]
    clean = tamper.run(_drelu_job, args, make_parties(cfg))
    assert clean.error is None, clean.error
    bits = _opened(clean.results, n)
    sure = (v >= 0) | (v < -(1 << L))                  # outside the error region
    assert np.array_equal(bits[sure], (v >= 0)[sure])
    assert [(s.rounds, s.bytes_sent) for _, _, s in clean.results] == \
        _declared_flush(n, L, m)
    last = clean.results[0][1]
    kinds = ("add", "flip")
    rng = np.random.default_rng(7)
    # every kernel message (leaves' two rounds, each tree level) and the witness in the
    # flush's first message (after the 64 digest bytes)
    for i, s in enumerate(s for s in clean.sent if s.op <= last + 1 and s.entries):
        witness = s.op == last + 1
        got = tamper.run(_drelu_job, args, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation(kinds[i % 2], error=int(rng.integers(1, 255)),
                                          element=64 + i % (s.entries - 64) if witness
                                          else None, seed=i))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        assert s.party in got.error.rejected, (s, got.error)


def _value(results):
    return results[0][0].a + results[0][0].b + results[1][0].b


def _relu_job(p, x):
    p.checks = Checks(p)
    y = convert.relu_a(p, x)
    last = p.comm.op
    before = p.stats.snapshot()
    p.checks.flush(p)
    return y, last, p.stats - before


def _honest_relu(n: int, seed: int):
    """An honest malicious-mode relu_a on n values across its range (0, -1 and the top
    included): the config, the parties' arguments and the run, checked against ReLU."""
    cfg = RingConfig()
    L, m = window_for(cfg)
    rng = np.random.default_rng(seed)
    lim = 1 << (L + m - 3)
    v = rng.integers(-lim, lim, size=n)
    v[:3] = [0, -1, lim - 1]
    d = deal(v.astype(np.uint64), rng)
    args = [(d[i],) for i in range(3)]
    clean = tamper.run(_relu_job, args, make_parties(cfg))
    assert clean.error is None, clean.error
    err = np.abs(_value(clean.results).astype(np.int64) - np.maximum(v, 0))
    assert err.max() < 1 << L
    return cfg, args, clean


def test_relu_on_few_elements_is_verified_through_the_dealt_carry_and_masked_injection():
    """relu_a on at most ROUND_LEAN_ELEMENTS: thresholds' two-round comparison (thermometer,
    dealt mask products, the pair's halves) and the injection of its masked bit (the
    single's bit split by the witness, the pair's swapped halves as carry polynomials).
    Honest: the semi-honest ReLU; any message changed, in any of the four rounds or in the
    witness, aborts and names its sender."""
    cfg, args, clean = _honest_relu(90, seed=3)
    last = clean.results[0][1]
    rng = np.random.default_rng(8)
    for i, s in enumerate(s for s in clean.sent if s.op <= last + 1 and s.entries):
        witness = s.op == last + 1
        got = tamper.run(_relu_job, args, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation(("add", "flip")[i % 2],
                                          error=int(rng.integers(1, 1 << 62)),
                                          element=64 + i % (s.entries - 64) if witness
                                          else None, seed=i))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        assert s.party in got.error.rejected, (s, got.error)


def _offset(s, array: int) -> int:
    """Flat entry index where array ``array`` of a sent message starts."""
    return sum(int(np.prod(shape)) for shape in s.shapes[:array])


def test_relu_on_many_elements_is_verified_through_the_tree_and_the_singles_share():
    """Past ROUND_LEAN_ELEMENTS relu_a takes the leaves, the carry tree and its last AND
    layer kept 3-out-of-3 for the injection: the pair's halves are swapped messages, the
    single's is a witness sent at the flush (one bit per element). Honest: the semi-honest
    ReLU; a flipped bit in a pair member's half, in the single's witness or in a tree level
    aborts and names the sender."""
    cfg, args, clean = _honest_relu((1 << 14) + 30, seed=4)
    last = clean.results[0][1]
    sent = [s for s in clean.sent if s.op <= last + 1]
    swap_op = last - 1                        # the injection's first round
    targets = []
    for party in range(3):
        mine = [s for s in sent if s.party == party]
        swap, at = next((s, i) for s in mine if s.op == swap_op
                        for i, shape in enumerate(s.shapes) if len(shape) == 2)
        flush = next(s for s in mine if s.op == last + 1)
        tree = next(s for s in mine if s.op == swap_op - 1)
        targets += [(swap, _offset(swap, at) + 5),                          # its half
                    (flush, _offset(flush, 2) + 3),                         # the witness
                    (tree, 17)]                                             # a tree level
    for s, element in targets:
        got = tamper.run(_relu_job, args, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation("flip", element=element, bit=2))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, element, got.error)
        assert s.party in got.error.rejected, (s, got.error)


def _drelu_case(n: int, seed: int):
    cfg = RingConfig()
    L, m = window_for(cfg)
    rng = np.random.default_rng(seed)
    v = rng.integers(-(1 << (L + m - 3)), 1 << (L + m - 3), size=n)
    d = deal(v.astype(np.uint64), rng)
    return cfg, L, m, d, [(d[i], False) for i in range(3)]


def test_a_monotone_code_of_the_wrong_count_aborts_through_the_linear_relations(monkeypatch):
    """A single that computes one block's thermometer for a count one too high - still
    monotone, and used consistently in all it sends - passes every gate of the proof and
    fails only the mod-2 linear relation of the block's bits and its code's count
    (claims_compare._sum_selectors): the job aborts naming the single alone; with the
    digests' comparison forced to pass, the same deviation goes through."""
    n, e = 120, 3
    cfg, L, m, d, args = _drelu_case(n, seed=5)
    blocks = leaf_blocks(m - 1, n)
    a = int(((d[0].a[e] + d[0].b[e]) >> np.uint64(L)) & np.uint64((1 << m) - 1))
    base = 0
    for off, k in blocks:                  # the first block whose count can grow
        if (a >> off) & ((1 << k) - 1) < (1 << k) - 1:
            row = base + ((a >> off) & ((1 << k) - 1))      # t_(count + 1): 0 -> 1
            break
        base += (1 << k) - 1
    honest = leaves.thermometer_planes

    def miscounted(x, blocks, top, words):
        out = honest(x, blocks, top, words)
        if x.size == group_sizes(n)[0] and int(x[e]) == a:     # party 0's group, as single
            out[row, e // 64] ^= np.uint64(1 << (e % 64))
        return out

    monkeypatch.setattr(leaves, "thermometer_planes", miscounted)
    got = tamper.run(_drelu_job, args, make_parties(cfg))
    assert isinstance(got.error, dzkp.CheatingDetected), got.error
    assert got.error.rejected == {0} and "linear relations' digests differ" in str(got.error)
    monkeypatch.setattr(dzkp, "_linear_ok", lambda linear, got: True)
    assert tamper.run(_drelu_job, args, make_parties(cfg)).error is None


def test_a_changed_linear_digest_aborts():
    """V_R's digest of its shares of the linear relations, sent to V_L with the final
    openings: a bit of it flipped (each party's in turn) fails the proof of the prover it
    was about."""
    cfg, _, _, _, args = _drelu_case(40, seed=6)
    clean = tamper.run(_drelu_job, args, make_parties(cfg))
    digests = [s for s in clean.sent if s.shapes and s.shapes[-1] == (dzkp.LINEAR_BYTES,)
               and s.direction == tamper.NEXT]
    assert len(digests) == 3                      # one a party, as V_R of its previous
    for i, s in enumerate(digests):
        got = tamper.run(_drelu_job, args, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation("flip", element=s.entries - 1 - i, seed=i))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, got.error)
        assert got.error.rejected == {(s.party - 1) % 3}    # the prover whose check it was


def test_a_side_of_linear_relations_only_leaves_no_gates():
    """A verifier's side whose relations are all linear (a late leaf set of one-bit blocks:
    no monotonicity pair) hands its shares over and makes no gate."""
    from mpc3.claims_compare import LINEAR, _sided
    got = []
    shares = np.ones((2, 5), dtype=np.uint8)
    assert _sided(2, lambda: {LINEAR: shares}, lambda: {}, lambda pos, s: got.append(pos)) == {}
    assert got == [2]
