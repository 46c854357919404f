"""The compiled DReLU leaf helpers equal the numpy formulation they replace."""
import numpy as np
import pytest

from mpc3.kernels.bitplanes import select_planes, thermometer_planes
from mpc3.kernels.bitplanes import bits_to_planes_group
from mpc3.kernels.leaves import BLOCK, _blocks
from mpc3.shares import words

RNG = np.random.default_rng(7)


def _thermometer_numpy(a, blocks, top, n):
    rows = [(((a >> np.uint64(off)) & np.uint64((1 << k) - 1))[None, :] >=
             np.arange(1, 1 << k, dtype=np.uint64)[:, None]) for off, k in blocks]
    rows.append(((a >> np.uint64(top)) & np.uint64(1))[None, :].astype(bool))
    return bits_to_planes_group(np.concatenate(rows).astype(np.uint8), n)


def _select_numpy(therm, b, blocks, n, const_one):
    bits = np.unpackbits(np.ascontiguousarray(therm).view(np.uint8), axis=1,
                         bitorder="little")[:, :n]
    G, P, row, cols = [], [], 0, np.arange(n)
    for j, (off, k) in enumerate(blocks):
        size = 1 << k
        ext = np.zeros((size + 1, n), dtype=np.uint8)
        ext[0] = 1 if const_one else 0
        ext[1:size] = bits[row:row + size - 1]
        row += size - 1
        bj = ((b >> np.uint64(off)) & np.uint64(size - 1)).astype(np.int64)
        g = ext[size - bj, cols]
        G.append(g)
        if j > 0:
            P.append(ext[size - 1 - bj, cols] ^ g)
    return bits_to_planes_group(np.array(G + P, dtype=np.uint8), n)


@pytest.mark.parametrize("n", [0, 1, 7, 63, 64, 65, 200, 1000])
@pytest.mark.parametrize("nlow", [1, 2, 3, 4, 8, 27, 63])
def test_leaf_kernels_equal_numpy(n, nlow):
    blocks = _blocks(nlow)
    top = nlow
    mask = np.uint64((1 << (nlow + 1)) - 1)
    a = RNG.integers(0, 2**64, n, dtype=np.uint64) & mask
    b = RNG.integers(0, 2**64, n, dtype=np.uint64) & mask
    if n > 4:
        a[:2], b[:2] = 0, mask                                # extreme block values
    w = words(n)
    therm = thermometer_planes(a, blocks, top, w)
    np.testing.assert_array_equal(therm, _thermometer_numpy(a, blocks, top, n))
    noisy = therm ^ RNG.integers(0, 2**64, therm.shape, dtype=np.uint64)   # a random share
    if n % 64:                                               # padding bits must be ignored
        noisy[:, -1] |= ~np.uint64((1 << (n % 64)) - 1)
    for share in (therm, noisy):
        for const_one in (False, True):
            np.testing.assert_array_equal(select_planes(share, b, blocks, const_one),
                                          _select_numpy(share, b, blocks, n, const_one))
    assert BLOCK == 3
