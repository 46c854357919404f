"""Issue 33, item 5: memory. The model owner streams a model tensor by tensor (its shares are
made chunk by chunk: mpc3.sharing.BlockDeal, net.codec.pair_chunks, net.upload), jobs are
admitted against their estimated working memory ([limits] job_memory_bytes and the per-user
and per-party totals), and a party returns a large job's memory to the OS when it ends."""
import threading

import numpy as np
import pytest

from mpc3 import ring
from mpc3.sharing import BlockDeal
from net.codec import TensorAssembler, pair_chunks, share_from_payload
from net.frames import CHUNK_BYTES
from net.upload import TensorFeed


def test_block_deal_is_a_replicated_sharing_drawn_in_any_order():
    x = np.arange(300_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    d = BlockDeal(x)
    whole = [d.slot(j, 0, x.size) for j in range(3)]
    assert ((whole[0] + whole[1] + whole[2]) == x).all()
    for j in range(3):                                   # blocks, backwards: the same values
        parts = [d.slot(j, s, min(s + 4096, x.size)) for s in range(0, x.size, 4096)][::-1]
        assert (np.concatenate(parts[::-1]) == whole[j]).all()
    assert (whole[0] != whole[1]).any() and (whole[0] != BlockDeal(x).slot(0, 0, x.size)).any()
    with pytest.raises(ValueError):
        d.slot(0, 1, 5)


def test_pair_chunks_reassemble_and_feed_keeps_one_tensor():
    """Three streams of a feed give the parties a valid sharing of every tensor, in chunks
    the party's assembler accepts; the feed loads each tensor once and only after all
    three streams finished the one before."""
    rng = np.random.default_rng(1)
    w = {"a": rng.standard_normal((700, 400)), "b": rng.standard_normal(3), "c": np.zeros(0)}
    loads = []

    class Lazy(dict):
        def __getitem__(self, k):
            loads.append(k)
            return dict.__getitem__(self, k)
    fracs = {k: 18 for k in w}
    feed = TensorFeed.of(Lazy(w), fracs, encoded=False)
    got = [{}, {}, {}]

    def stream(n):
        asm = TensorAssembler(18, 1 << 30)
        for c in feed.chunks(n, fracs):
            assert len(c.data) <= CHUNK_BYTES
            done = asm.feed(c)
            if done is not None:
                got[n][done[0]] = share_from_payload(done[2], done[1])
    threads = [threading.Thread(target=stream, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert loads == ["a", "b", "c"]
    for k, v in w.items():
        s = [got[n][k] for n in range(3)]
        assert all((s[n].b == s[(n + 1) % 3].a).all() for n in range(3))
        assert (s[0].a + s[1].a + s[2].a == ring.encode(v, 18)).all()
