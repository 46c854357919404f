"""mpc3.scratch: the buffers a party keeps from one flush to the next. A name's buffer is
reused (grown when too small, fresh and not kept past the cap, zeroed on request), and a
second flush that writes its first fold into the first flush's buffers - filled with
garbage in between - accepts an honest job and catches a changed message."""
import numpy as np

from mpc3 import dzkp, tamper
from mpc3.checks import Checks
from mpc3.kernels import arith
from mpc3.party import RingConfig
from mpc3.scratch import Scratch
from mpc3.sharing import deal
from mpc3.sim import make_parties

F = RingConfig().frac


def test_a_name_reuses_its_buffer_grows_it_and_the_cap_holds():
    s = Scratch(cap=1 << 20)
    a = s.take("a", (4, 100))
    a[:] = 7
    b = s.take("a", (2, 100))                        # smaller: the same memory
    assert np.shares_memory(a, b) and b.shape == (2, 100) and b.dtype == np.uint64
    assert (s.take("a", (3, 10), zero=True) == 0).all()
    c = s.take("a", (8, 100))                        # larger: grown by an eighth more, kept
    assert not np.shares_memory(a, c) and s.kept == c.nbytes * 9 // 8
    assert np.shares_memory(s.take("a", (9, 100)), c)               # within the eighth
    big = s.take("b", (1 << 17,), zero=True)         # 1 MiB more: past the cap, not kept
    assert (big == 0).all() and s.kept == c.nbytes * 9 // 8
    assert np.shares_memory(s.take("a", (8, 100)), c)
    near = Scratch(cap=1000)
    assert near.take("a", (120,)).nbytes == 960 and near.kept == 1000       # up to the cap
    s.clear()
    assert s.kept == 0


def _two_flushes(seen: dict):
    """Products and a matrix product, flushed; the scratch filled with garbage; again."""
    def job(p, x, y, w):
        p.checks = Checks(p)
        outs = []
        for rnd in range(2):
            first = p.comm.op
            z = arith.mul_aa(p, x, y)
            m = arith.matmul_aa(p, x, w)
            seen.setdefault(p.rank, []).append((first, p.comm.op))
            outs += [arith.open_a(p, z).astype(np.int64), arith.open_a(p, m).astype(np.int64)]
            p.checks.flush(p)
            bufs = p.checks.scratch._bufs
            seen[p.rank, rnd] = {k: v.ctypes.data for k, v in bufs.items()}
            for v in bufs.values():
                v.fill(0xA5)
        return outs
    return job


def test_a_second_flush_in_kept_buffers_accepts_and_catches():
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=(6, 9)) * 2.0 ** F).astype(np.int64)
    y = np.round(rng.normal(size=(6, 9)) * 2.0 ** F).astype(np.int64)
    w = np.round(rng.normal(size=(9, 4)) * 2.0 ** F).astype(np.int64)
    dealt = [deal(a.astype(np.uint64), rng) for a in (x, y, w)]
    args = [tuple(d[i] for d in dealt) for i in range(3)]
    seen: dict = {}
    clean = tamper.run(_two_flushes(seen), args, make_parties())
    assert clean.error is None, clean.error
    for got in (clean.results[0][:2], clean.results[0][2:]):
        assert np.abs(got[0] - x * y / 2.0 ** F).max() < 1
        assert np.abs(got[1] - x @ w / 2.0 ** F).max() < 1
    for rank in range(3):                            # six vectors, the same memory twice
        assert len(seen[rank, 0]) == 6 and seen[rank, 0] == seen[rank, 1], rank
    lo, hi = seen[0][1]                              # the second round's messages
    msgs = [s for s in clean.sent if s.party == 0 and lo < s.op <= hi and s.entries]
    assert msgs
    for trial, target in enumerate(msgs[:3]):
        got = tamper.run(_two_flushes({}), args, make_parties(),
                         tamper.Target(0, target.direction, op=target.op),
                         tamper.Deviation("add", error=1 + trial))
        assert isinstance(got.error, dzkp.CheatingDetected), (target, got.error)


def test_a_job_gives_its_scratch_back_for_the_next(monkeypatch):
    """A party process keeps one scratch between jobs (a decoding session's steps are one
    job each): the next job's checks lease the one the last job's gave back; a second one
    given back while one waits lets its buffers go."""
    from mpc3 import scratch
    from net.party import malicious
    monkeypatch.setattr(scratch, "_idle", [])
    parties = make_parties()
    first = Checks(parties[0])
    first.scratch.take("x", (1000,))
    kept = first.scratch
    parties[0].checks = first
    malicious.end(parties[0])                        # the runner's end of a job
    assert first.scratch is None and scratch._idle == [kept]
    second = Checks(parties[1])
    assert second.scratch is kept and kept.kept >= 8000 and scratch._idle == []
    other = Checks(parties[2]).scratch                # leased while none waits: new
    assert other is not kept
    other.take("x", (10,))
    second.release()
    scratch.give_back(other)
    assert scratch._idle == [kept] and other.kept == 0
