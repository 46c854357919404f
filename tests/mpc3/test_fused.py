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
        w, bt = pair_split(z, oth, offset, sh, low)
        np.testing.assert_array_equal(w, want_w)
        np.testing.assert_array_equal(bt, Bp >> np.uint64(63))
        assert bt.dtype == np.uint8                              # one bit per element
        slot = np.zeros(n + 2, np.uint64)            # W straight into an output slot's slice
        w2, _ = pair_split(z, oth, offset, sh, low, w_out=slot[1:n + 1])
        assert (np.shares_memory(w2, slot) or not n) and np.array_equal(slot[1:n + 1], want_w)
        assert not slot[0] and not slot[-1]
    r, nu1, nu2 = _r(n), _r(n), _r(n)
    w0 = w.copy()
    x, xs = pair_round2(w, bt, r, nu1, nu2, low, up)
    np.testing.assert_array_equal(w, w0 - ((nu1 + nu2) << up))
    want_x = (bt * r + nu1) & low
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(xs, want_x << up)


@pytest.mark.parametrize("n", [0, 1, 5, 1000, NOGIL_MIN_WORK + 1])
@pytest.mark.parametrize("per_element", [False, True])
def test_single_kernels_equal_numpy(n, per_element):
    from mpc3.kernels.fused import single_final, single_split
    if per_element:
        f = RNG.integers(1, 62, n).astype(np.int64)
        sh, up = f, np.uint64(64) - f.astype(np.uint64)
        low = (np.uint64(1) << f.astype(np.uint64)) - np.uint64(1)
    else:
        sh, up, low = np.int64(18), np.uint64(46), np.uint64((1 << 18) - 1)
    a, b, kappa, rho = _r(n), _r(n), _r(n), _r(n)
    for bb in (None, b):
        A = a if bb is None else a + bb
        want_uk = (A.view(np.int64) >> sh).view(np.uint64) - kappa
        uk, t = single_split(a, bb, kappa, rho, sh, low)
        np.testing.assert_array_equal(uk, want_uk)
        np.testing.assert_array_equal(t, ((A >> np.uint64(63)) - rho) & low)
        uk2, t2 = single_split(a, bb, kappa, None, sh, low)
        assert t2 is None and np.array_equal(uk2, want_uk)
    x1, x2 = _r(n), _r(n)
    out = np.zeros((2, n + 3), np.uint64)
    single_final(uk, kappa, x1, x2, up, out[0, 1:n + 1], out[1, 1:n + 1])
    np.testing.assert_array_equal(out[0, 1:n + 1], uk + (x2 << up))
    np.testing.assert_array_equal(out[1, 1:n + 1], kappa + (x1 << up))
    assert not out[:, 0].any() and not out[:, n + 1:].any()


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (5, 3), (NOGIL_MIN_WORK + 1,)])
def test_inject_kernels_equal_numpy(shape):
    from mpc3.kernels.fused import inject_pair, inject_single
    rows = shape[0]
    col = (slice(None),) + (None,) * (len(shape) - 1)
    r = lambda: _r(int(np.prod(shape))).reshape(shape)  # noqa: E731
    xa, xb, kappa, rho1, rho2 = r(), r(), r(), r(), r()
    u = RNG.integers(0, 2, rows).astype(np.uint64)
    A = xa + xb
    uA = u[col] * A
    m1, m2, s0 = inject_single(xa, xb, u, kappa, rho1, rho2)
    np.testing.assert_array_equal(m1, A - uA - uA - rho1)
    np.testing.assert_array_equal(m2, np.broadcast_to(u[col], shape) - rho2)
    np.testing.assert_array_equal(s0, uA - kappa)
    B, p1, p2, t1, t2, add = r(), r(), r(), r(), r(), r()
    beta = RNG.integers(0, 2, rows).astype(np.uint64)
    bb = beta[col]
    sB = B - bb * B - bb * B
    y, s, s2 = inject_pair(B, beta, p1, p2, t1, t2, add, True)
    np.testing.assert_array_equal(y, bb * p1 + p2 * sB + bb * B - t1)
    np.testing.assert_array_equal(s, add + y)
    np.testing.assert_array_equal(s2, t1 + t2)
    y, s, s2 = inject_pair(B, beta, p1, p2, t2, t1, add, False)
    np.testing.assert_array_equal(y, bb * p1 + p2 * sB - t2)
    np.testing.assert_array_equal(s, add + y)
    np.testing.assert_array_equal(s2, t1 + t2)
    # into given output slots (inject_steps: the result's own arrays), else the same
    slots = np.zeros((2,) + shape, np.uint64)
    y2, s_, s2_ = inject_pair(B, beta, p1, p2, t2, t1, add, False, (slots[0], slots[1]))
    assert not slots.size or np.shares_memory(s_, slots[0]) and np.shares_memory(s2_, slots[1])
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(slots[0], s)
    np.testing.assert_array_equal(slots[1], s2)


def test_kernel_outputs_refuse_what_would_be_a_copy():
    """An output slot the kernel cannot write through (strided, other dtype, other shape) is
    refused, not silently copied: the result would never reach the caller's array."""
    from mpc3.kernels.fused import inject_pair
    B = _r(8)
    args = (B, np.zeros(8, np.uint64), B, B, B, B, B, True)
    wide = np.zeros(16, np.uint64)
    frozen = np.zeros(8, np.uint64)
    frozen.flags.writeable = False
    for bad in (wide[::2], np.zeros(8, np.int64), np.zeros(7, np.uint64), frozen):
        with pytest.raises(ValueError, match="writable contiguous uint64"):
            inject_pair(*args, out=(bad, np.zeros(8, np.uint64)))
    with pytest.raises(ValueError, match="writable contiguous uint64"):
        pair_split(B, None, np.uint64(0), np.int64(3), np.uint64(7), w_out=wide[::2])
