"""Two-round comparisons of secret rows with public thresholds (mpc3.kernels.thresholds) and
the summed injection of a table lookup (convert.mul_masked ``sum_runs``): values against
numpy, declared = measured traffic, the carry plan, and what each party sees."""
import itertools

import numpy as np
import pytest

from conftest import share, value
from mpc3 import ring
from mpc3.kernels import convert, thresholds as T
from mpc3.kernels.arith import public_share
from mpc3.party import RingConfig

F = RingConfig().frac


def _compare(run, x, t, win):
    """[x_i >= t_j] (rows, k) computed by the kernel (injected into 0/1 values)."""
    rows, k = x.size, t.size
    tt = ring.encode(t, F)

    def fn(p, xs):
        bits = T.compare_public_masked(p, xs, tt, win)
        return convert.mul_masked(p, bits, public_share(p, np.full(rows * k, 1 << F,
                                                                   dtype=np.uint64)))
    out = value(run(fn, share(x)))
    assert set(np.unique(out)) <= {0.0, 1.0}
    return out.reshape(rows, k) == 1.0


def _want(x, t):
    d = ring.encode(x, F)[:, None].astype(np.int64) - ring.encode(t, F)[None, :].astype(np.int64)
    return d


@pytest.mark.parametrize("rows,k", [(1, 448), (3, 29), (64, 113), (1, 1), (2, 1), (1, 2)])
def test_exact_window(run, rng, rows, k):
    """Window (0, f + 18) as sqrt_inv's table: exact for |x - t| < 2^16, ties give 1."""
    x = rng.uniform(-2.0 ** 15, 2.0 ** 15, rows) * rng.choice([1e-6, 1e-3, 1, 1], rows)
    t = rng.uniform(-2.0 ** 15, 2.0 ** 15, k)
    t[: min(k, rows)] = x[: min(k, rows)]                        # equal to a threshold
    if k > 2:
        t[1] = x[0] - 2.0 ** -F                                  # one ulp either side
        t[2] = x[0] + 2.0 ** -F
    win = (0, F + 18)
    got = _compare(run, x, t, win)
    assert (got == (_want(x, t) >= 0)).all()
    assert run.rounds == 4                                       # 2 compare + 2 injection


def test_window_error_region_and_full_ring(run, rng):
    """A dropped-bits window (L = 6) is right outside [-2^L, 0) ulp; m = 64 is exact on the
    whole ring."""
    x = rng.uniform(-2.0 ** 10, 2.0 ** 10, 40)
    t = np.concatenate([rng.uniform(-2.0 ** 10, 2.0 ** 10, 5), [x[0], x[1] + 2.0 ** -13]])
    got = _compare(run, x, t, (6, F + 14 - 6 + 2))
    d = _want(x, t)
    clear = (d >= 0) | (d < -(1 << 6))
    assert (got[clear] == (d[clear] >= 0)).all()
    big = np.array([1e12, -1e12, 3.0, -3.0])
    got = _compare(run, big, np.array([0.0, 2.5, -1e11]), (0, 64))
    assert (got == (_want(big, np.array([0.0, 2.5, -1e11])) >= 0)).all()


@pytest.mark.parametrize("rows,k", [(1, 448), (5, 7), (64, 113), (1, 2), (2, 1)])
def test_declared_cost_and_summed_injection(run, rng, rows, k):
    win = (0, F + 18)
    x, t = rng.uniform(-2.0 ** 16, 2.0 ** 16, rows), rng.uniform(-2.0 ** 16, 2.0 ** 16, k)
    vals = rng.uniform(-3, 3, (rows, k))
    tt = ring.encode(t, F)
    costs = []

    def fn(p, xs, vs):
        s0 = p.stats.snapshot()
        bits = T.compare_public_masked(p, xs, tt, win)
        s1 = p.stats.snapshot()
        out = convert.mul_masked(p, bits, vs, sum_runs=k)
        costs.append((p.rank, s1 - s0, p.stats.snapshot() - s1))
        return out
    out = value(run(fn, share(x), share(vals.reshape(-1))))
    want = ((_want(x, t) >= 0) * ring.decode(ring.encode(vals, F), F)).sum(axis=1)
    assert out.shape == (rows,)
    assert np.abs(out - want).max() < 1e-9 * k + 1e-12
    by_rank = sorted(costs, key=lambda c: c[0])
    for got, declared in ((tuple(c[1].bytes_sent for c in by_rank),
                           T.cost_compare_public(rows, k, *win)),
                          (tuple(c[2].bytes_sent for c in by_rank),
                           convert.cost_inject(rows * k, fused=True, seg=k))):
        assert got == declared.bytes_per_party
    assert max(c[1].rounds for c in costs) == 2 and max(c[2].rounds for c in costs) == 2
    # the lookup's resharing carries one element per run and group, not one per product
    summed, plain = (convert.cost_inject(rows * k, fused=True, seg=s).bytes_total for s in (k, 0))
    assert summed < plain if k >= 4 else summed <= plain


def test_carry_plan_matches_the_prefix_carry():
    """Evaluating the plan's terms on plain leaves gives the block carry for every input."""
    for nb in range(2, 6):
        masked, terms, dealt = T.carry_plan(nb)
        assert len(masked) == 2 * nb - 2
        assert all(len(u) >= 2 and any(set(u) <= set(s) for s in terms) for u in dealt)
        for bits in itertools.product((0, 1), repeat=nb):      # block sums: 0 1 or 2 (G)
            for prop in itertools.product((0, 1), repeat=nb):
                G = [b & (1 - q) for b, q in zip(bits, prop)]
                P = [q for q in prop]
                leaves = G + P[1:]
                carry = leaves[nb - 1]
                for s in terms:
                    carry ^= int(all(leaves[v] for v in s))
                want = 0
                for j in range(nb):                               # ripple over blocks
                    want = G[j] | (P[j] & want)
                assert carry == want


def test_blocks_cover_the_window_and_stay_narrow():
    for nlow in (26, 27, 35, 63):
        for rows, k in ((1, 448), (64, 113), (4096, 57), (1, 1)):
            blocks = T.blocks_for(nlow, rows, k)
            assert sum(w for _, w in blocks) == nlow
            assert all(off == sum(w for _, w in blocks[:i]) for i, (off, _) in enumerate(blocks))
            assert 2 <= len(blocks) <= T.MAX_BLOCKS and max(w for _, w in blocks) <= 16
    # a single input against many thresholds shares one code: wider blocks than per element
    assert len(T.blocks_for(35, 1, 448)) < len(T.blocks_for(35, 4096, 2))


def test_messages_are_fresh(rng):
    """The same input twice puts different bytes on every party's wire (PRG masks; the
    catalog security tests check sqrt_inv and reciprocal, which run this kernel, further)."""
    from mpc3.sim import make_parties, run_parties
    x = np.array([0.5, 3.0, -2.0])
    tt = ring.encode(np.array([0.0, 1.0]), F)
    sent = []
    for _ in range(2):
        parties = make_parties(RingConfig())
        logs = {p.rank: [] for p in parties}
        for p in parties:
            orig = p.comm.exchange

            def spy(*a, _orig=orig, _r=p.rank, **kw):
                logs[_r].append(kw)
                return _orig(*a, **kw)
            p.comm.exchange = spy
        run_parties(lambda p, xs: T.compare_public_masked(p, xs, tt, (0, F + 18)),
                    [(s,) for s in share(x)], parties=parties)
        sent.append(logs)
    flat = [np.concatenate([np.asarray(a).reshape(-1).view(np.uint8)
                            for kw in sent[i][r] for key in ("to_next", "to_prev")
                            for a in (kw.get(key) or [])]) for i in range(2) for r in range(3)]
    for r in range(3):
        assert flat[r].size and (flat[r] != flat[3 + r]).any()


def test_select_rows_equals_select_on_expanded_rows(rng):
    """The row-indexed leaf selection equals select_planes on every row copied to each of its
    elements (the layout the protocol used before)."""
    from mpc3.kernels.bitplanes import (bits_to_planes_group, select_planes, select_rows,
                                        thermometer_planes)
    from mpc3.shares import words

    def expand(planes, nrows, idx, n):            # every row copied to each of its elements
        bits = np.unpackbits(planes.view(np.uint8), axis=1, bitorder="little")[:, :nrows]
        return bits_to_planes_group(bits[:, idx], n)
    for rows, k, nlow in ((5, 7, 35), (3, 113, 27), (1, 448, 35)):
        blocks = T.blocks_for(nlow, rows, k)
        a = rng.integers(0, 1 << nlow, rows, dtype=np.uint64)
        therm = thermometer_planes(a, blocks, nlow, words(rows))[:-1]
        idx = np.repeat(np.arange(rows), k)
        b = rng.integers(0, 1 << nlow, rows * k, dtype=np.uint64)
        for one in (False, True):
            want = select_planes(expand(therm, rows, idx, rows * k), b, blocks, one)
            assert (select_rows(therm, idx, b, blocks, one) == want).all()
