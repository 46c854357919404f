"""Tests for mpc3.ring: exact Z_2^64 matmul, fixed point, packing."""
from __future__ import annotations

import numpy as np
import pytest

from mpc3 import ringmm
from mpc3.ring import (
    DEFAULT_FRAC,
    DTYPE,
    check_ring,
    decode,
    encode,
    from_signed,
    matmul,
    pack_bits,
    pack_uint,
    to_signed,
    unpack_bits,
    unpack_uint,
)

MOD = 2**64
RNG = np.random.default_rng(1234)


def rand_ring(*shape: int) -> np.ndarray:
    return RNG.integers(0, 2**64 - 1, size=shape, dtype=np.uint64, endpoint=True)


def ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python big-int reference: (sum a*b) % 2**64."""
    out = np.matmul(a.astype(object), b.astype(object)) % MOD
    return np.asarray(out, dtype=object).astype(np.uint64)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((1, 1), (1, 1)),
        ((3, 5), (5, 7)),
        ((7, 13), (13, 1)),
        ((17, 33), (33, 9)),
        ((2, 2051), (2051, 3)),  # K > 2048
        ((5, 4099), (4099, 2)),  # K > 4096
        ((64, 64), (64, 64)),
    ],
)
def test_matmul_2d_matches_bigint(sa, sb):
    a, b = rand_ring(*sa), rand_ring(*sb)
    np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((4, 3, 5), (4, 5, 6)),  # batched
        ((2, 3, 4, 5), (5, 2)),  # shared right operand
        ((3, 5), (2, 5, 4)),  # broadcast left operand
        ((2, 1, 3, 5), (1, 4, 5, 3)),  # broadcast both
        ((9,), (9, 4)),  # vector @ matrix
        ((4, 9), (9,)),  # matrix @ vector
        ((9,), (9,)),  # dot product
        ((9,), (3, 9, 2)),  # vector @ batch
        ((3, 2, 9), (9,)),  # batch @ vector
    ],
)
def test_matmul_shapes_like_numpy(sa, sb):
    a, b = rand_ring(*sa), rand_ring(*sb)
    got = matmul(a, b)
    want = ref_matmul(a, b)
    assert got.shape == np.matmul(a, b).shape
    assert got.dtype == DTYPE
    np.testing.assert_array_equal(got, want)


def test_matmul_large_uses_parallel_kernel(monkeypatch):
    monkeypatch.setattr(ringmm, "PARALLEL_MIN_MACS", 1)
    a, b = rand_ring(2, 11, 37), rand_ring(2, 37, 6)
    np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))
    a, b = rand_ring(33, 2100), rand_ring(2100, 5)
    np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))


def test_column_tiles_policy():
    """Tiles for the encoder's feature projection and FFN W1 (K = 512) and GPT-2's W2 (K =
    3072, 19 MB), not for an 8 MB B with K = 2048 nor for one row (mpc3/ringmm.py)."""
    assert ringmm._tiled(64, 512, 4256) and ringmm._tiled(64, 512, 2048)
    assert ringmm._tiled(128, 3072, 768) and not ringmm._tiled(64, 2048, 512)
    assert not ringmm._tiled(1, 512, 4256)


@pytest.mark.parametrize("parallel", [False, True])
def test_matmul_column_tiles_match_bigint(monkeypatch, parallel):
    """The column-tiled kernels (wide B, several rows): odd row counts, K not a multiple of
    4, a partial last tile, a batched B, a B shared by a batch of A."""
    monkeypatch.setattr(ringmm, "TILE_MIN_BYTES", 0)
    monkeypatch.setattr(ringmm, "TILE_COLS", 16)
    monkeypatch.setattr(ringmm, "PARALLEL_MIN_MACS", 1 if parallel else 1 << 60)
    assert ringmm._tiled(9, 37, 70) and not ringmm._tiled(7, 37, 70)
    for a, b in ((rand_ring(9, 37), rand_ring(37, 70)),
                 (rand_ring(2, 9, 37), rand_ring(2, 37, 64)),
                 (rand_ring(3, 4, 37), rand_ring(37, 71))):
        np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))


def test_matmul_edge_values():
    edges = np.array([0, 1, 2**63, 2**64 - 1, 2**63 - 1, 2, 2**32, 2**32 - 1], dtype=np.uint64)
    a = np.array(np.meshgrid(edges, edges)).reshape(2, -1).T.copy()  # (64, 2)
    a = np.concatenate([a, a[::-1]], axis=1)  # (64, 4)
    b = np.resize(edges, (4, 12))
    np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))
    full = np.full((3, 2500), 2**64 - 1, dtype=np.uint64)
    np.testing.assert_array_equal(matmul(full, full.T.copy()), ref_matmul(full, full.T))


def test_matmul_empty_and_noncontiguous():
    a = rand_ring(3, 0)
    b = rand_ring(0, 4)
    np.testing.assert_array_equal(matmul(a, b), np.zeros((3, 4), np.uint64))
    a = rand_ring(8, 10)[::2, ::2]  # strided view, shape (4, 5)
    b = rand_ring(7, 10)[::2, 1::2].T  # transposed strided view, shape (5, 4)
    np.testing.assert_array_equal(matmul(a, b), ref_matmul(a, b))


def test_matmul_rejects_bad_inputs():
    with pytest.raises(TypeError):
        matmul(np.ones((2, 2)), rand_ring(2, 2))
    with pytest.raises(TypeError):
        matmul(rand_ring(2, 2), np.ones((2, 2), np.int64))
    with pytest.raises(ValueError):
        matmul(rand_ring(2, 3), rand_ring(2, 3))


def test_check_ring():
    x = rand_ring(3)
    assert check_ring(x) is x
    for bad in (np.ones(3), np.ones(3, np.int64), [1, 2, 3], 5, np.ones(3, np.uint32)):
        with pytest.raises(TypeError, match="myname: expected uint64 ring array"):
            check_ring(bad, "myname")


def test_signed_views():
    s = np.array([-1, 0, 1, -(2**63), 2**63 - 1], dtype=np.int64)
    u = from_signed(s)
    assert u.dtype == DTYPE
    assert u[0] == 2**64 - 1 and u[3] == 2**63
    np.testing.assert_array_equal(to_signed(u), s)
    np.testing.assert_array_equal(from_signed(np.array([-2, 3], np.int32)), np.array([2**64 - 2, 3], np.uint64))
    with pytest.raises(TypeError):
        to_signed(s)
    with pytest.raises(TypeError):
        from_signed(np.array([1.5]))


def test_encode_decode_roundtrip():
    x = RNG.uniform(-1000, 1000, size=1000)
    x[:4] = [0.0, -0.0, 1.0, -1.0]
    enc = encode(x)
    assert enc.dtype == DTYPE
    np.testing.assert_allclose(decode(enc), x, atol=2.0 ** -(DEFAULT_FRAC + 1))
    assert encode(np.array([-1.0]))[0] == 2**64 - 2**DEFAULT_FRAC
    assert encode(np.array([1.0]), frac=4)[0] == 16
    assert decode(np.array([2**64 - 8], np.uint64), frac=3)[0] == -1.0
    # fixed-point product has 2f fractional bits
    a, b = encode(np.array([-3.5])), encode(np.array([2.25]))
    assert decode(a * b, frac=2 * DEFAULT_FRAC)[0] == -7.875


def test_encode_rejects_nan_inf_and_overflow():
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError):
            encode(np.array([1.0, bad]))
    with pytest.raises(ValueError, match="value out of fixed-point range"):
        encode(np.array([2.0 ** (62 - DEFAULT_FRAC)]))
    with pytest.raises(ValueError, match="value out of fixed-point range"):
        encode(np.array([-(2.0**50)]), frac=12)
    encode(np.array([2.0 ** (61 - DEFAULT_FRAC)]))  # just inside


def test_decode_rejects_float():
    with pytest.raises(TypeError):
        decode(np.ones(3))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001])
def test_pack_bits_roundtrip(n):
    bits = RNG.integers(0, 2, size=n, dtype=np.uint8)
    buf = pack_bits(bits)
    assert buf.dtype == np.uint8 and len(buf) == (n + 7) // 8
    np.testing.assert_array_equal(unpack_bits(buf, n), bits)
    np.testing.assert_array_equal(unpack_bits(buf.tobytes(), n), bits)


def test_pack_bits_little_order():
    assert pack_bits(np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 1], np.uint8)).tolist() == [1, 2]


@pytest.mark.parametrize("width", [1, 7, 8, 18, 33, 63, 64])
@pytest.mark.parametrize("n", [1, 13, 1001])
def test_pack_uint_roundtrip(width, n):
    vals = rand_ring(n)
    buf = pack_uint(vals, width)
    assert buf.dtype == np.uint8 and len(buf) == (n * width + 7) // 8
    mask = np.uint64(2**width - 1)
    np.testing.assert_array_equal(unpack_uint(buf, width, n), vals & mask)


def _pack_uint_numpy(values, width):
    """The bit-expanding numpy reference of pack_uint (np.unpackbits per value)."""
    vals = values.reshape(-1).astype("<u8")
    bits = np.unpackbits(vals.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    return np.packbits(bits[:, :width].reshape(-1), bitorder="little")


def _unpack_uint_numpy(buf, width, n):
    bits = np.zeros((n, 64), dtype=np.uint8)
    bits[:, :width] = np.unpackbits(buf, count=n * width, bitorder="little").reshape(n, width)
    return np.packbits(bits, axis=1, bitorder="little").reshape(-1).view("<u8")


@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 9, 17, 18, 31, 33, 57, 62, 63])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 63, 65, 1001, 40000])
def test_pack_uint_kernel_equals_numpy(width, n):
    """The numba pack/unpack kernels give the bytes of the numpy bit-expansion path."""
    vals = rand_ring(n)
    buf = pack_uint(vals, width)
    np.testing.assert_array_equal(buf, _pack_uint_numpy(vals, width))
    np.testing.assert_array_equal(unpack_uint(buf, width, n), _unpack_uint_numpy(buf, width, n))
    _refuses_noncanonical(lambda b: unpack_uint(b, width, n), buf, [n * width])
    np.testing.assert_array_equal(unpack_uint(buf.tobytes(), width, n), vals & np.uint64(2**width - 1))
    for v in (np.zeros(n, np.uint64), np.full(n, 2**64 - 1, np.uint64)):   # all-0 / all-1 bits
        np.testing.assert_array_equal(pack_uint(v, width), _pack_uint_numpy(v, width))
        np.testing.assert_array_equal(unpack_uint(pack_uint(v, width), width, n),
                                      v & np.uint64(2**width - 1))


def _refuses_noncanonical(unpack, buf, runs):
    """``unpack`` refuses ``buf`` with a trailing byte, one byte short, and with a padding bit
    set in any run (``runs``: the packed bits of each byte-aligned run) that has one."""
    from mpc3.ring import NonCanonical
    for bad in (np.append(buf, np.uint8(0)), buf[:-1] if len(buf) else None):
        if bad is not None:
            with pytest.raises(NonCanonical):
                unpack(bad)
    end = 0
    for bits in runs:
        end += (bits + 7) // 8
        if bits % 8:
            bad = buf.copy()
            bad[end - 1] ^= np.uint8(0x80)                       # the run's top padding bit
            with pytest.raises(NonCanonical, match="padding"):
                unpack(bad)


def test_pack_uint_layout_and_errors():
    # two 4-bit values 0x3, 0xA -> one byte 0xA3 (little bit order)
    assert pack_uint(np.array([3, 10], np.uint64), 4).tolist() == [0xA3]
    assert pack_uint(np.array([0x0102], np.uint64), 16).tolist() == [2, 1]
    with pytest.raises(ValueError):
        pack_uint(rand_ring(3), 0)
    with pytest.raises(ValueError):
        pack_uint(rand_ring(3), 65)
    with pytest.raises(TypeError):
        pack_uint(np.arange(3), 8)


def test_pack_uint_large_fast():
    import time

    vals = rand_ring(131072)
    t = time.perf_counter()
    for w in (18, 64):
        np.testing.assert_array_equal(unpack_uint(pack_uint(vals, w), w, vals.size), vals & np.uint64(2**w - 1))
    assert time.perf_counter() - t < 2.0


def test_matmul_concurrent_threads(monkeypatch):
    """Three parties call matmul at once (serial and parallel kernels)."""
    import threading

    a, b = rand_ring(2, 40, 70), rand_ring(2, 70, 30)
    want = ref_matmul(a, b)
    for threshold in (1, 1 << 60):
        monkeypatch.setattr(ringmm, "PARALLEL_MIN_MACS", threshold)
        results: list[np.ndarray] = []

        def run() -> None:
            for _ in range(5):
                results.append(matmul(a, b))

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 15
        for r in results:
            np.testing.assert_array_equal(r, want)


@pytest.mark.parametrize("n", [0, 1, 2, 9, 450, 1001])
def test_pack_var_equals_pack_per_width(n):
    """pack_var/unpack_var give the bytes of one pack_uint per distinct width (increasing,
    elements in order within a width) and invert each other."""
    from mpc3.ring import WidthPlan, pack_var, unpack_var, width_plan
    widths = RNG.integers(1, 64, size=n)
    if n > 5:
        widths[:3] = 18                                      # repeated widths
    vals = rand_ring(n)
    plan = width_plan(widths)
    assert width_plan(widths.copy()) is plan                 # cached by content
    want = np.concatenate([pack_uint(vals[widths == w], int(w)) for w in np.unique(widths)]
                          or [np.zeros(0, np.uint8)])
    buf = pack_var(vals, plan)
    assert plan.nbytes == len(want)
    np.testing.assert_array_equal(buf, want)
    masks = (np.uint64(1) << widths.astype(np.uint64)) - np.uint64(1)
    np.testing.assert_array_equal(unpack_var(buf, plan), vals & masks)
    runs = [int((widths == w).sum() * w) for w in np.unique(widths)]
    _refuses_noncanonical(lambda b: unpack_var(b, plan), buf, runs)
    np.testing.assert_array_equal(unpack_var(buf.tobytes(), plan), vals & masks)
    with pytest.raises(ValueError):
        WidthPlan(np.array([0, 3]))
    with pytest.raises(ValueError):
        unpack_var(buf[:-1], plan) if plan.nbytes else pack_var(rand_ring(n + 1), plan)


@pytest.mark.parametrize("width", [5, 18, 63])
def test_pack_kernels_gil_releasing_variant(width):
    """Above NOGIL_MIN_WORK elements the GIL-releasing compilation runs: same bytes."""
    from mpc3.ring import NOGIL_MIN_WORK, pack_var, unpack_var, width_plan
    n = NOGIL_MIN_WORK + 3
    vals = rand_ring(n)
    buf = pack_uint(vals, width)
    np.testing.assert_array_equal(buf, _pack_uint_numpy(vals, width))
    np.testing.assert_array_equal(unpack_uint(buf, width, n), _unpack_uint_numpy(buf, width, n))
    widths = np.where(np.arange(n) % 3 == 0, width, 7)
    plan = width_plan(widths)
    masks = (np.uint64(1) << widths.astype(np.uint64)) - np.uint64(1)
    np.testing.assert_array_equal(unpack_var(pack_var(vals, plan), plan), vals & masks)


def test_matmul_adds_into_out(rng):
    """``out`` receives the product added to what it held (the five-product form's
    accumulator), tiled and untiled, batched; a wrong ``out`` is refused."""
    for (a_shape, b_shape) in [((70, 512), (512, 1024)), ((2, 9, 33), (33, 5)),
                               ((3, 4, 6), (3, 6, 7)), ((5,), (5, 3))]:
        a = rng.integers(0, 2**64, size=a_shape, dtype=np.uint64)
        b = rng.integers(0, 2**64, size=b_shape, dtype=np.uint64)
        prod = matmul(a, b)
        base = rng.integers(0, 2**64, size=prod.shape, dtype=np.uint64)
        out = base.copy()
        assert matmul(a, b, out) is out
        assert (out == base + prod).all()
    with pytest.raises(ValueError, match="out must be"):
        matmul(a, b, np.zeros(4, dtype=np.uint64))
    with pytest.raises(ValueError, match="out must be"):
        matmul(a, b, np.zeros((3, 4), dtype=np.uint64)[:, :3])
    a = rng.integers(0, 2**64, size=(4, 6), dtype=np.uint64)
    b = rng.integers(0, 2**64, size=(6, 3), dtype=np.uint64)
    with pytest.raises(ValueError, match="out must be"):      # the right size, wrong shape
        matmul(a, b, np.zeros((3, 4), dtype=np.uint64))
