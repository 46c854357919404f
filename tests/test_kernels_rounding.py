"""Truncation rounds stochastically and without bias on every path (mpc3.kernels.arith).

Each test compares the revealed integers with the exact integer before the shift: the
output must be floor(z / 2^s) or floor(z / 2^s) + 1 (|error| < 1 ulp, exact when 2^s | z)
and, measured over >= 1e5 products, the mean error must be 0 within 0.05 ulp. Costs are
checked too, so the rounding change cannot move a byte or a round.
"""
import numpy as np
import pytest

from conftest import Run
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sharing import deal, reveal
from mpc3.kernels import arith

F = ring.DEFAULT_FRAC
N = 100_000
MODES = ["exact", "prob"]


def _ints(rng, scale, shape):
    """Random fixed-point integers (value * 2^F) as int64, about N(0, scale^2) in value."""
    return np.rint(rng.normal(size=shape) * scale * 2.0 ** F).astype(np.int64)


def _errors(got: np.ndarray, z: np.ndarray, shifts) -> np.ndarray:
    """Error in output ulps of ``got`` (ring) against the exact quotient z / 2^shift."""
    shifts = np.broadcast_to(np.asarray(shifts, dtype=np.int64), z.shape)
    g = ring.to_signed(got).astype(np.int64)
    assert (np.abs(z) < 2.0 ** 62).all() and (np.abs(g) < 2.0 ** (62 - shifts.max())).all()
    return (g * (1 << shifts) - z) / 2.0 ** shifts


def _check(err: np.ndarray, z: np.ndarray, shifts) -> None:
    shifts = np.broadcast_to(np.asarray(shifts, dtype=np.int64), z.shape)
    assert err.size >= N
    assert (np.abs(err) < 1).all(), (err.min(), err.max())          # floor or floor + 1
    exact = z % (1 << shifts) == 0
    assert exact.any() and (err[exact] == 0).all()                   # multiples stay exact
    assert abs(err.mean()) < 0.05, err.mean()                        # unbiased
    assert err.min() < -0.5 and err.max() > 0.5                      # really stochastic


@pytest.mark.parametrize("mode", MODES)
def test_mul_unbiased(mode, rng):
    X, Y = _ints(rng, 4.0, N), _ints(rng, 1.0, N)
    X[:50] = (X[:50] >> F) << F                                      # some exact products
    run = Run(RingConfig(trunc=mode))
    out = run(lambda p, a, b: arith.mul_aa(p, a, b),
              deal(ring.from_signed(X)), deal(ring.from_signed(Y)))
    z = X * Y
    _check(_errors(reveal(out), z, F), z, F)
    run.assert_cost(arith.cost_mul(N, True, F, mode))


@pytest.mark.parametrize("mode", MODES)
def test_matmul_unbiased(mode, rng):
    X, Y = _ints(rng, 2.0, (1000, 4)), _ints(rng, 1.0, (4, 100))
    X[:, 1:] = 0
    X[:5, 0] = (X[:5, 0] >> F) << F                                  # a few exact outputs
    run = Run(RingConfig(trunc=mode))
    out = run(lambda p, a, b: arith.matmul_aa(p, a, b),
              deal(ring.from_signed(X)), deal(ring.from_signed(Y)))
    z = X @ Y
    _check(_errors(reveal(out), z, F), z, F)
    run.assert_cost(arith.cost_mul(z.size, True, F, mode))


@pytest.mark.parametrize("mode", MODES)
def test_mul_many_unbiased(mode, rng):
    X, Y = _ints(rng, 3.0, N), _ints(rng, 1.0, N)
    X[:50] = (X[:50] >> F) << F
    half = N // 2
    run = Run(RingConfig(trunc=mode))
    out = run(lambda p, a, b: arith.mul_many_aa(p, [(a[:half], b[:half], "mul", True),
                                                    (a[half:], b[half:], "mul", F + 6),
                                                    (a[:10], b[:10], "mul", False)]),
              deal(ring.from_signed(X)), deal(ring.from_signed(Y)))
    z = X * Y
    shifts = np.where(np.arange(N) < half, F, F + 6)
    got = np.concatenate([reveal([o[k] for o in out]) for k in range(2)])
    _check(_errors(got, z, shifts), z, shifts)
    assert (reveal([o[2] for o in out]) == ring.from_signed(z[:10])).all()
    run.assert_cost(arith.cost_mul_many(shifts, 10, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_element", [False, True])
def test_trunc_a_unbiased(mode, per_element, rng):
    X = _ints(rng, 50.0, N)
    X[:50] = (X[:50] >> 20) << 20
    shifts = rng.choice([7, 18, 20], size=N) if per_element else 18
    run = Run(RingConfig(trunc=mode))
    out = run(lambda p, a: arith.trunc_a(p, a, shifts), deal(ring.from_signed(X)))
    _check(_errors(reveal(out), X, shifts), X, shifts)
    run.assert_cost(arith.cost_trunc(N, shifts, mode))


@pytest.mark.parametrize("mode", MODES)
def test_nonnegative_stays_nonnegative(mode, rng):
    """Tiny non-negative products (below one ulp) come out as 0 or 1 ulp, never -1."""
    X = rng.integers(0, 1 << F, size=20_000, dtype=np.int64)
    Y = rng.integers(0, 1 << 8, size=20_000, dtype=np.int64)       # products < 2^26 = 2^F * 2^8
    out = Run(RingConfig(trunc=mode))(lambda p, a, b: arith.mul_aa(p, a, b, trunc=F + 8),
                                      deal(ring.from_signed(X)), deal(ring.from_signed(Y)))
    got = ring.to_signed(reveal(out))
    assert set(np.unique(got)) <= {0, 1} and (got == 1).any()


@pytest.mark.parametrize("mode", MODES)
def test_chained_products_do_not_drift(mode, rng):
    """200 chained multiplications by c = 0.999: the per-step errors (mean 0, < 1 ulp)
    average out; with a -0.5 ulp bias the mean drift would be -0.5 * sum c^j ~ -91 ulp."""
    n, steps = 2000, 200
    V = np.rint(rng.uniform(1, 2, n) * 2.0 ** F).astype(np.int64)
    C = np.full(n, int(round(0.999 * 2 ** F)), dtype=np.int64)

    def chain(p, a, c):
        for _ in range(steps):
            a = arith.mul_aa(p, a, c)
        return a

    out = Run(RingConfig(trunc=mode))(chain, deal(ring.from_signed(V)), deal(ring.from_signed(C)))
    ideal = V * (C[0] / 2.0 ** F) ** steps
    drift = ring.to_signed(reveal(out)) - ideal
    bound = sum((C[0] / 2.0 ** F) ** j for j in range(steps))        # < 1 ulp per step
    assert (np.abs(drift) < bound).all()
    # each element's drift has std < 0.5 * sqrt(sum c^2j) ~ 6.4 ulp: the mean's std is ~0.15
    assert abs(drift.mean()) < 1.0, drift.mean()
