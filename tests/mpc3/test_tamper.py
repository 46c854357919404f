"""The tamper harness (mpc3.tamper, issue 35): it changes exactly one entry or bit of exactly
one message (as the receiver takes it), leaves untampered runs bit-identical, names messages
by op or by (kernel, k), and its random draws are reproducible and reach every catalog kernel.
"""
import numpy as np
import pytest

from mpc3 import tamper
from mpc3.comm import NEXT, PREV, ProtocolError
from mpc3.kernels import catalog
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties

SMALL = (7, (3, 5, 4))            # the exact-cost test's small size: elements, MxKxN


def _case(name):
    return tamper.catalog_case(name, *SMALL)


def _planes(out):
    """Every array of a kernel's three outputs (AShare/BShare slots or opened arrays)."""
    arrays = []
    for o in out:
        arrays += [o] if isinstance(o, np.ndarray) else [o.a, o.b]
    return arrays


def _receiver(target):
    """(rank, direction it takes from) of the party receiving ``target``'s message."""
    return (target.party + target.direction) % 3, -target.direction


@pytest.mark.parametrize("name", ["mult", "relu", "and", "open", "sqrt-inv"])
def test_untampered_runs_are_bit_identical_with_and_without_the_wrapper(name):
    case = _case(name)
    parties = make_parties(case.cfg, seed=case.seed)
    bare = run_parties(case.kernel.run, case.args, parties=parties)
    wrapped = case.run(keep=True)
    assert wrapped.error is None and not wrapped.records
    assert all((x == y).all() for x, y in zip(_planes(bare), _planes(wrapped.results)))
    assert [p.stats for p in parties] == wrapped.stats
    again = case.run(keep=True)
    for c, d in zip(wrapped.comms, again.comms):
        assert c.sent == d.sent and c.payloads.keys() == d.payloads.keys()
        assert all((x == y).all() for key in c.payloads
                   for x, y in zip(c.payloads[key], d.payloads[key]))


@pytest.mark.parametrize("kind", ["add", "flip"])
@pytest.mark.parametrize("name", ["relu", "reciprocal"])
def test_one_entry_or_bit_of_one_message_changes_at_the_receiver(name, kind):
    """Every message any party takes is the honest one except the targeted one, in which
    exactly one entry differs, by the error (add) or by one bit (flip)."""
    case = _case(name)
    honest = case.run(keep=True)
    rng = np.random.default_rng(7)
    for trial in range(6):
        target = tamper.draw(honest.sent, rng, kind)
        dev = tamper.Deviation(kind, error=int(rng.integers(1, 2 ** 63)), seed=trial)
        bad = case.run(target, dev, keep=True)
        rec, = bad.records
        sent = next(s for s in honest.sent if target.matches(s))
        assert (rec.party, rec.direction, rec.op, rec.kernel, rec.k) == (
            sent.party, sent.direction, sent.op, name, sent.k)
        rank, src = _receiver(target)
        for r, (h, t) in enumerate(zip(honest.comms, bad.comms)):
            for key in t.received:
                if (r, key) == (rank, (src, target.op)):
                    continue
                if key[1] <= target.op:               # later messages carry the effect
                    assert all((x == y).all() for x, y in zip(h.received[key], t.received[key]))
        got = bad.comms[rank].received[(src, target.op)]
        arrays = honest.comms[rank].received[(src, target.op)]
        changed = [(i, j) for i, (x, y) in enumerate(zip(arrays, got))
                   for j in np.flatnonzero(x.reshape(-1) != y.reshape(-1))]
        offset = rec.element - sum(a.size for a in arrays[:rec.array])
        assert changed == [(rec.array, offset)]
        width = arrays[rec.array].dtype.itemsize
        entry = arrays[rec.array].reshape(-1)[offset]
        assert int(entry) == rec.before
        if kind == "add":
            assert (rec.before + rec.error) % (1 << 8 * width) == rec.after
        else:
            assert rec.before ^ rec.after == 1 << rec.bit


def test_a_target_by_kernel_and_k_hits_that_message():
    """The k-th message a party sends in a direction inside a labelled kernel; other
    kernels' messages do not count."""
    cfg = RingConfig()
    mult, relu = _case("mult"), _case("relu")

    def both(p, x, y, r):
        tamper.labelled(mult.kernel)(p, x, y)
        return tamper.labelled(relu.kernel)(p, r)

    args = [mult.args[i] + relu.args[i] for i in range(3)]
    honest = tamper.run(both, args, make_parties(cfg, seed=b"both"))
    mine = [s for s in honest.sent if (s.party, s.direction, s.kernel) == (2, PREV, "relu")]
    assert [s.k for s in mine] == list(range(len(mine))) and len(mine) >= 3
    target = tamper.Target(2, PREV, kernel="relu", k=2)
    bad = tamper.run(both, args, make_parties(cfg, seed=b"both"), target,
                     tamper.Deviation("flip", bit=0, element=0))
    rec, = bad.records
    assert (rec.op, rec.kernel, rec.k) == (mine[2].op, "relu", 2)


def test_replace_duplicate_and_replay():
    case = _case("relu")
    honest = case.run(keep=True)
    target = tamper.draw(honest.sent, np.random.default_rng(3), "replay")
    rank, src = _receiver(target)

    bad = case.run(target, tamper.Deviation("replace", seed=1), keep=True)
    got = bad.comms[rank].received[(src, target.op)]
    want = honest.comms[rank].received[(src, target.op)]
    assert [a.shape for a in got] == [a.shape for a in want]
    assert any((x != y).any() for x, y in zip(got, want))

    bad = case.run(target, tamper.Deviation("replay"), keep=True)
    rec, = bad.records
    assert rec.replayed_op < target.op
    replayed = honest.comms[target.party].payloads[(target.direction, rec.replayed_op)]
    got = bad.comms[rank].received[(src, target.op)]
    assert all((x == y).all() for x, y in zip(got, replayed))

    last = max(s.op for s in honest.sent if (s.party, s.direction) ==
               (target.party, target.direction))
    early = min(s.op for s in honest.sent if (s.party, s.direction) ==
                (target.party, target.direction))
    bad = case.run(tamper.Target(target.party, target.direction, op=early),
                   tamper.Deviation("duplicate"))
    assert early < last and isinstance(bad.error, ProtocolError), bad.error

    first = tamper.Target(target.party, target.direction, op=early)
    assert isinstance(case.run(first, tamper.Deviation("replay")).error,
                      tamper.NotApplicable)


def test_random_draws_are_reproducible_and_reach_every_catalog_kernel():
    """One job running every catalog kernel in turn; uniform draws over its messages."""
    cases = [_case(name) for name in catalog.KERNELS]

    def every(p, *flat):
        i = 0
        for case in cases:
            k = len(case.kernel.operands)
            tamper.labelled(case.kernel)(p, *flat[i:i + k])
            i += k

    args = [sum((c.args[r] for c in cases), ()) for r in range(3)]
    honest = tamper.run(every, args, make_parties(RingConfig(), seed=b"every"))
    assert honest.error is None
    rng, again = np.random.default_rng(11), np.random.default_rng(11)
    draws = [tamper.draw(honest.sent, rng, "flip") for _ in range(3000)]
    assert draws == [tamper.draw(honest.sent, again, "flip") for _ in range(3000)]
    other = np.random.default_rng(12)
    assert draws[:50] != [tamper.draw(honest.sent, other, "flip") for _ in range(50)]
    kernel_of = {(s.party, s.direction, s.op): s.kernel for s in honest.sent}
    hit = {kernel_of[(t.party, t.direction, t.op)] for t in draws}
    assert hit == set(catalog.KERNELS)
    for name in ("open", "tanh"):                 # a draw inside one kernel stays there
        t = tamper.draw(honest.sent, rng, "add", kernel=name)
        assert kernel_of[(t.party, t.direction, t.op)] == name
    assert {t.party for t in draws} == {0, 1, 2} and {t.direction for t in draws} == {NEXT,
                                                                                        PREV}


def test_the_harness_refuses_half_a_plan():
    p = make_parties()[0]
    with pytest.raises(ValueError):
        tamper.attach(p, tamper.Target(0, NEXT, op=1))
    with pytest.raises(ValueError):
        tamper.Target(0, NEXT)
    with pytest.raises(ValueError):
        tamper.Deviation("swap")
