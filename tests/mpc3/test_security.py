"""Randomness is a feature with tests: masks, wire uniformity, per-job independence."""
import numpy as np
import pytest

from conftest import share
from mpc3.party import RingConfig
from mpc3.prg import PRG
from mpc3.sim import make_parties, run_parties
from mpc3.kernels import arith, catalog, convert, thresholds


def _record(parties):
    """Capture every payload a party posts (what its neighbours receive)."""
    wire = {p.rank: [] for p in parties}
    for p in parties:
        orig = p.comm._post
        def post(direction, op, arrays, _orig=orig, _log=wire[p.rank]):
            _log.extend(a.copy() for a in arrays)
            _orig(direction, op, arrays)
        p.comm._post = post
    return wire


#: open_a sends its share itself (reconstruction is its purpose), so it repeats by design.
WIRE_KERNELS = [name for name in catalog.KERNELS if name != "open"]


@pytest.mark.parametrize("name", WIRE_KERNELS)
@pytest.mark.parametrize("mode", ["exact", "prob"])
def test_wire_bytes_fresh_and_nonzero(name, mode):
    """Every catalog kernel, same input shares, two runs: every message differs and no
    mask is all zeros."""
    kernel, cfg = catalog.KERNELS[name], RingConfig(trunc=mode)
    args = kernel.deal(kernel.plaintext(np.random.default_rng(0), 64, (4, 16, 4), cfg), cfg)
    runs = []
    for _ in range(2):
        parties = make_parties(cfg)
        wire = _record(parties)
        run_parties(kernel.run, args, parties=parties)
        runs.append(wire)
    for rank in range(3):
        assert runs[0][rank], f"party {rank} sent nothing in {name}"
        for m1, m2 in zip(runs[0][rank], runs[1][rank]):
            assert m1.shape == m2.shape
            assert m1.size, f"party {rank} sent an empty array in {name}"
            assert m1.any(), f"party {rank} sent an all-zero message in {name}"
            if m1.nbytes >= 16:
                assert not np.array_equal(m1, m2), f"party {rank} repeated a message in {name}"


def test_received_messages_look_uniform():
    """Bit balance of everything party 0 sends while multiplying a constant input."""
    x = share(np.full(4096, 1.5))
    parties = make_parties()
    wire = _record(parties)
    run_parties(lambda p, a: convert.relu_a(p, arith.mul_aa(p, a, a)),
                [(x[i],) for i in range(3)], parties=parties)
    blob = np.concatenate([m.view(np.uint8).reshape(-1) for m in wire[0]])
    ones = np.unpackbits(blob).mean()
    # ~10^6 bits: a fair coin stays within 0.5 +- 0.003 with overwhelming probability
    assert abs(ones - 0.5) < 0.003


def test_job_streams_independent():
    seeds = [b"s" * 32, b"t" * 32, b"u" * 32]
    a = PRG.for_job(*seeds, job_id="job-a")
    b = PRG.for_job(*seeds, job_id="job-b")
    for stream in ("prev", "next", "private"):
        va, vb = a.ring(stream, 1, "x", 1000), b.ring(stream, 1, "x", 1000)
        assert not np.array_equal(va, vb)
        assert abs(np.unpackbits((va ^ vb).view(np.uint8)).mean() - 0.5) < 0.01
    assert not np.array_equal(a.ring("next", 1, "x", 8), a.ring("next", 2, "x", 8))


def test_pairwise_streams_agree_and_zero_shares_cancel():
    parties = make_parties()
    for p in parties:
        p.kop = 7
    nxt = [p.rand("next", 16, "t") for p in parties]
    prv = [p.rand("prev", 16, "t") for p in parties]
    for r in range(3):
        assert np.array_equal(nxt[r], prv[(r + 1) % 3])
    total = sum(p.zero_share(16, "z") for p in parties)
    assert not total.any()
    # in place (a product's mask): the same sharing of zero, added with one draw at a time
    z = [np.arange(16, dtype=np.uint64) * np.uint64(r + 3) for r in range(3)]
    want = [zr + p.zero_share(16, "m") for zr, p in zip(z, parties)]
    got = [p.add_zero_share(zr.copy(), "m") for zr, p in zip(z, parties)]
    for w, g in zip(want, got):
        assert np.array_equal(w, g)
    assert np.array_equal(sum(got), sum(z))


@pytest.mark.parametrize("nbytes", [0, 1, 8, 15, 16, 17, 100, 128, 129, 4096, 16384, 16385, 65536,
                                    (1 << 20) + 3, (2 << 20) + 40])
def test_prg_fast_paths_equal_aes_ctr(nbytes):
    """Short draws (AES-ECB over the counter blocks, cached context) and long draws (CTR
    into the buffer, chunked) give exactly the AES-CTR keystream of the same (key, nonce)."""
    from mpc3.prg import ECB_MAX_BYTES, _nonce, aes_ctr_bytes, ctr_blocks
    assert 256 < ECB_MAX_BYTES < 65536
    prg = PRG.for_job(b"s" * 32, b"t" * 32, b"u" * 32, job_id="fast")
    for stream in ("prev", "next", "private"):
        for op, tag in ((1, "x"), (2, "x"), (1, "y")):       # the context is reused
            want = aes_ctr_bytes(getattr(prg, stream), _nonce(op, tag), nbytes)
            got = prg.bytes(stream, op, tag, nbytes)
            assert got.dtype == np.uint8 and got.flags.writeable
            assert got.tobytes() == want
            if nbytes % 8 == 0:
                assert prg.ring(stream, op, tag, nbytes // 8).tobytes() == want
    # the 128-bit counter carries and wraps like CTR mode's
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    ecb = Cipher(algorithms.AES(b"k" * 16), modes.ECB()).encryptor()
    for nonce in (b"\x00" * 8 + b"\xff" * 8, b"\xff" * 16, b"\x05" * 8 + b"\xff" * 7 + b"\xf0"):
        for nblocks in (3, 9, 100, ECB_MAX_BYTES // 16):
            start = int.from_bytes(nonce, "big")
            want = b"".join(((start + i) % 2**128).to_bytes(16, "big") for i in range(nblocks))
            assert bytes(ctr_blocks(nonce, nblocks)) == want
            assert ecb.update(want) == aes_ctr_bytes(b"k" * 16, nonce, 16 * nblocks)


def test_prg_rejects_bad_keys():
    with pytest.raises(ValueError):
        PRG(b"short", b"x" * 16, b"y" * 16)
    with pytest.raises(ValueError):
        PRG(b"k" * 16, b"k" * 16, b"y" * 16)


def test_deal_slots_fresh_and_uniform():
    """Dealt slots come from AES-CTR under a fresh OS key per draw: never repeated, balanced."""
    from mpc3.prg import fresh_ring
    from mpc3.sharing import deal, reveal
    a, b = fresh_ring((3, 5)), fresh_ring((3, 5))
    assert a.shape == (3, 5) and a.dtype == np.uint64 and a.flags.writeable
    assert not np.array_equal(a, b)
    assert fresh_ring(0).shape == (0,)
    big = fresh_ring(1 << 17)
    assert abs(np.unpackbits(big.view(np.uint8)).mean() - 0.5) < 0.003
    x = np.arange(12, dtype=np.uint64).reshape(3, 4)
    s1, s2 = deal(x), deal(x)
    assert (reveal(s1) == x).all() and not np.array_equal(s1[0].a, s2[0].a)


def test_prg_many_draws_equal_single_draws():
    """ring_many/bytes_many (one cipher call for several tags) return exactly the arrays of
    separate ring/bytes calls, also past the ECB threshold (then drawn one by one)."""
    from mpc3.prg import ECB_MAX_BYTES
    prg = PRG.for_job(b"s" * 32, b"t" * 32, b"u" * 32, job_id="many")
    for shapes in ([1, 2, 3], [(2, 5), 7, (0,)], [ECB_MAX_BYTES // 8, 3], [4, 4, 4, 4]):
        items = [(f"t{i}", s) for i, s in enumerate(shapes)]
        got = prg.ring_many("next", 9, items)
        for (tag, shape), g in zip(items, got):
            want = prg.ring("next", 9, tag, shape)
            assert g.shape == want.shape and g.dtype == np.uint64
            assert np.array_equal(g, want)
        sizes = [(f"b{i}", 8 * np.prod(s, dtype=int) + 3) for i, s in enumerate(shapes)]
        for (tag, nb), g in zip(sizes, prg.bytes_many("prev", 4, sizes)):
            assert g.tobytes() == prg.bytes("prev", 4, tag, nb).tobytes()


@pytest.mark.parametrize("n", [300, thresholds.ROUND_LEAN_ELEMENTS + 7])
def test_relu_of_products_sends_fresh_nonzero_messages(n):
    """A product whose ReLU comparison (few elements) or DReLU leaves (more) ride its own
    truncation rounds (arith.mul_split_aa): same input shares, two runs, every message
    differs and none is all zeros - the late pair part changes when, not how, they are
    masked."""
    rng = np.random.default_rng(3)
    x, w, b = share(rng.normal(size=(1, 8))), share(rng.normal(size=(8, n))), \
        share(rng.normal(size=n))
    runs = []
    for _ in range(2):
        parties = make_parties()
        wire = _record(parties)
        run_parties(lambda p, X, W, B: convert.relu_a(
            p, arith.mul_split_aa(p, [(X, W, "matmul")], biases=[B])),
            [(x[i], w[i], b[i]) for i in range(3)], parties=parties)
        runs.append(wire)
    for rank in range(3):
        assert runs[0][rank]
        for m1, m2 in zip(runs[0][rank], runs[1][rank]):
            assert m1.shape == m2.shape and m1.any()
            if m1.nbytes >= 16:
                assert not np.array_equal(m1, m2)
