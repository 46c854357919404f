"""The compiled truncation loops (mpc3.kernels.fused) equal the numpy expressions they replace."""
import numpy as np
import pytest

from mpc3.kernels.fused import pair_round2, pair_split
from mpc3.ring import NOGIL_MIN_WORK

RNG = np.random.default_rng(11)


def _r(n):
    return RNG.integers(0, 2**64, n, dtype=np.uint64)


@pytest.mark.parametrize("n", [0, 1, 5, 64, 1000, NOGIL_MIN_WORK + 1])
@pytest.mark.parametrize("per_element", [False, True])
def test_pair_kernels_equal_numpy(n, per_element):
    if per_element:
        f = RNG.integers(1, 62, n).astype(np.int64)
        sh, up = f, np.uint64(64) - f.astype(np.uint64)
        low = (np.uint64(1) << f.astype(np.uint64)) - np.uint64(1)
    else:
        f = 18
        sh, up, low = np.int64(f), np.uint64(64 - f), np.uint64((1 << f) - 1)
    offset = np.uint64(1 << 62)
    off_sh = offset >> (sh.astype(np.uint64) if per_element else np.uint64(f))
    z, other = _r(n), _r(n)
    for oth in (None, other):
        B = z if oth is None else z + oth
        Bp = B + offset + low
        want_w = (Bp.view(np.int64) >> sh).view(np.uint64) - off_sh
        w, bt = pair_split(z, oth, offset + low, sh, off_sh)
        np.testing.assert_array_equal(w, want_w)
        np.testing.assert_array_equal(bt, Bp >> np.uint64(63))
    r, nu1, nu2 = _r(n), _r(n), _r(n)
    w0 = w.copy()
    x, xs = pair_round2(w, bt, r, nu1, nu2, low, up)
    np.testing.assert_array_equal(w, w0 - ((nu1 + nu2) << up))
    want_x = (bt * r + nu1) & low
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(xs, want_x << up)
