"""Kernels as lockstep steps (mpc3.kernels.base.lockstep / run_steps): independent kernels
share their rounds without threads, a later kernel may read what an earlier one published
after a round, and every kernel keeps its own kernel counter (no PRG draw repeats)."""
import numpy as np
from conftest import Run, share, value

from mpc3.comm import NEXT, PREV
from mpc3.kernels import truncation
from mpc3.kernels.base import Cost, Round, lockstep, run_steps
from mpc3.kernels.truncation import trunc_steps
from mpc3.party import RingConfig


def _draw_then_swap(p, tag: str, box: dict | None = None):
    """One round: send a PRG draw to the next party; return (draw, what came from prev).
    With ``box``, publish the received array for a later kernel."""
    p.new_op()
    mine = p.rand("next", (4,), tag)
    r = Round(p)
    r.send(NEXT, mine)
    r.recv(PREV, 0, 1)
    got = (yield r)[(PREV, 0)][0]
    if box is not None:
        box["got"] = got
    return mine, got


def _read_box(p, box: dict):
    """Two rounds; in the second it sends what the kernel before it published."""
    p.new_op()
    yield Round(p)
    r = Round(p)
    r.send(NEXT, box["got"] + np.uint64(1))
    r.recv(PREV, 0, 1)
    return (yield r)[(PREV, 0)][0]


def test_lockstep_shares_rounds_keeps_counters_apart_and_nests():
    run = Run()

    def fn(p):
        box = {}
        inner = lockstep(p, _draw_then_swap(p, "t"), _draw_then_swap(p, "t", box))
        (a, b), c = run_steps(p, inner, _read_box(p, box))
        after = p.new_op()
        return a, b, c, p.stats.rounds, after
    out = run(fn)
    for rank, (a, b, c, rounds, _) in enumerate(out):
        assert rounds == 2                          # 1 + 2 rounds in lockstep: the larger
        assert not np.array_equal(a[0], b[0])       # same tag, own kernel counters
        prev = out[(rank - 1) % 3]
        np.testing.assert_array_equal(a[1], prev[0][0])      # each kernel's own message
        np.testing.assert_array_equal(b[1], prev[1][0])
        np.testing.assert_array_equal(c, prev[1][1] + np.uint64(1))   # read after round 1
    assert len({o[4] for o in out}) == 1                  # counters agree across parties


def test_truncations_in_lockstep_equal_their_separate_runs(rng):
    x, y = rng.normal(size=40), rng.normal(size=25) * 30
    run = Run()

    def fn(p, xs, ys):
        zx = truncation.trunc_a(p, xs.scale(np.uint64(3 << 10)), bits=10)
        zy = truncation.trunc_a(p, ys.scale(np.uint64(5 << 12)), bits=12)
        before = p.stats.snapshot()
        a, b = run_steps(p, trunc_steps(p, xs.scale(np.uint64(3 << 10)), 10, from_rss=True),
                         trunc_steps(p, ys.scale(np.uint64(5 << 12)), 12, from_rss=True))
        return zx, zy, a, b, p.stats.snapshot() - before
    out = run(fn, share(x), share(y))
    for k, ref in ((0, 3 * x), (1, 5 * y), (2, 3 * x), (3, 5 * y)):
        np.testing.assert_allclose(value([o[k] for o in out]), ref, atol=8 * 2.0 ** -18)
    exact = RingConfig(trunc="exact")
    both = Cost.parallel(truncation.cost_trunc(40, exact, 10), truncation.cost_trunc(25, exact, 12))
    assert tuple(o[4].bytes_sent for o in out) == both.bytes_per_party
    assert max(o[4].rounds for o in out) == both.rounds == 2

