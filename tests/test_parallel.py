"""Parallel composition (mpc3.parallel): same values as running the branches one after the
other, rounds = the largest branch's, bytes = the sum, distinct randomness per branch, and
failures that abort every branch and reach the caller."""
import numpy as np
import pytest

from mpc3 import ring
from mpc3.comm import ProtocolError
from mpc3.kernels import arith, convert, truncation
from mpc3.kernels.base import Cost
from mpc3.parallel import parallel
from mpc3.party import RingConfig
from mpc3.sharing import deal, reveal
from mpc3.sim import run_parties

CFG = RingConfig()


def _shares(x):
    return deal(ring.encode(x, CFG.frac), np.random.default_rng(1))


def _traffic(fn, args):
    def body(p, *a):
        before = p.stats.snapshot()
        out = fn(p, *a)
        return out, p.stats - before
    got = run_parties(body, args)
    return [g[0] for g in got], [g[1] for g in got]


def test_parallel_values_rounds_and_bytes():
    rng = np.random.default_rng(0)
    x, y, z = (rng.normal(size=40) for _ in range(3))
    xs, ys, zs = _shares(x), _shares(y), _shares(z)
    win = convert.window_for(CFG)

    def both(p, a, b, c):
        return parallel(p, lambda q: arith.mul_aa(q, a, b),
                        lambda q: convert.drelu_a(q, c, win=win),
                        lambda q: truncation.trunc_a(q, a, 4))

    outs, stats = _traffic(both, list(zip(xs, ys, zs)))
    prod = ring.decode(reveal([o[0] for o in outs]), CFG.frac)
    np.testing.assert_allclose(prod, x * y, atol=2e-5)
    sign = convert_bits([o[1] for o in outs], 40)
    np.testing.assert_array_equal(sign, (z >= 0).astype(np.uint8))
    tr = ring.decode(reveal([o[2] for o in outs]), CFG.frac)
    np.testing.assert_allclose(tr, x / 16, atol=2 ** -CFG.frac * 1.01)
    declared = Cost.parallel(arith.cost_mul(40, True, CFG.frac, CFG.trunc),
                             convert.cost_drelu(40, *win),
                             truncation.cost_trunc(40, 4, CFG.trunc))
    for r, s in enumerate(stats):
        assert s.rounds == declared.rounds
        assert s.bytes_sent == declared.bytes_per_party[r]
    assert declared.rounds < (arith.cost_mul(40, True, CFG.frac, CFG.trunc).rounds
                              + convert.cost_drelu(40, *win).rounds)


def convert_bits(outs, n):
    from mpc3.shares import planes_to_bits
    return (planes_to_bits(outs[0].a, n) ^ planes_to_bits(outs[1].a, n)
            ^ planes_to_bits(outs[2].a, n))[0]


def test_nested_parallel_and_uneven_branches():
    rng = np.random.default_rng(2)
    x = rng.normal(size=8)
    xs = _shares(x)

    def chain(q, a, k):
        for _ in range(k):
            a = arith.mul_aa(q, a, a) if k < 0 else truncation.trunc_a(q, a, 1)
        return a

    def body(p, a):
        inner = lambda q: parallel(q, lambda r: chain(r, a, 1), lambda r: chain(r, a, 3))
        return parallel(p, inner, lambda q: chain(q, a, 2))

    outs, stats = _traffic(body, [(s,) for s in xs])
    for path, k in (((0, 0), 1), ((0, 1), 3), ((1,), 2)):
        parts = []
        for o in outs:
            v = o
            for idx in path:
                v = v[idx]
            parts.append(v)
        np.testing.assert_allclose(ring.decode(reveal(parts), CFG.frac), x / 2 ** k,
                                   atol=k * 2 ** -CFG.frac * 1.01)
    assert all(s.rounds == 3 * truncation.cost_trunc(8, 1, CFG.trunc).rounds for s in stats)


def test_branches_draw_distinct_randomness():
    """Two branches running the same protocol on the same input must use different masks:
    their parties' messages differ (a reused PRG draw would make them equal)."""
    x = _shares(np.ones(16))

    def body(p, a):
        return parallel(p, lambda q: arith.mul_aa(q, a, a), lambda q: arith.mul_aa(q, a, a))

    outs = run_parties(body, [(s,) for s in x])
    for o in outs:
        assert not np.array_equal(o[0].a, o[1].a)
    for k in (0, 1):
        np.testing.assert_allclose(ring.decode(reveal([o[k] for o in outs]), CFG.frac), 1.0,
                                   atol=1e-5)


def test_branch_failure_reaches_caller_and_aborts_peers():
    x = _shares(np.ones(4))

    def body(p, a):
        def bad(q):
            arith.mul_aa(q, a, a)
            if q.rank == 1:
                raise ValueError("branch failed on purpose")
            return arith.mul_aa(q, a, a)
        return parallel(p, bad, lambda q: truncation.trunc_a(q, a, 1))

    with pytest.raises(ValueError, match="on purpose"):
        run_parties(body, [(s,) for s in x], timeout=5.0)


def test_separator_dtype_is_reserved():
    x = _shares(np.ones(4))

    def body(p, a):
        def sends_int16(q):
            q.comm.exchange(to_next=[np.zeros(2, dtype=np.int16)], from_prev=True)
        return parallel(p, sends_int16)

    with pytest.raises(ProtocolError, match="reserved"):
        run_parties(body, [(s,) for s in x], timeout=5.0)
