"""Checks both piecewise activations share (gelu_a, silu_a: mpc3.kernels.piecewise), each
kernel described once by an :class:`Activation`: the tests of tests/mpc3/test_kernels_gelu.py and
tests/mpc3/test_kernels_silu.py call these with their kernel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from conftest import Run, failure_allowance, share, value
from mpc3 import ring
from mpc3.party import RingConfig

F = ring.DEFAULT_FRAC
CFG = RingConfig()
METHODS = ("segments", "cheb")


def quantized(x) -> np.ndarray:
    """x as the fixed point the parties hold."""
    return ring.decode(ring.encode(np.asarray(x, dtype=float)))


@dataclass(frozen=True)
class Activation:
    kernel: Callable               # kernel(p, x, method)
    cost: Callable                 # cost(n, cfg, method)
    ref: Callable                  # float64 reference
    error: dict                    # mode -> claimed absolute error
    prob_failure: dict             # method -> failure probability per element on a piece
    outer: Callable[[str], float]  # method -> outermost threshold (0 or x beyond it)

    def secure(self, x, mode: str = "exact", method: str = "auto") -> np.ndarray:
        return value(Run(RingConfig(trunc=mode))(lambda p, a: self.kernel(p, a, method),
                                                 share(x)))

    def allowed(self, mode: str, method: str, x) -> int:
        """prob: as many elements as the failure probability per input on the polynomial
        pieces makes likely (conftest.failure_allowance, tail 1e-9); exact: none."""
        if mode != "prob":
            return 0
        return failure_allowance(int((np.abs(x) < self.outer(method)).sum()),
                                 self.prob_failure[method])


def check_outside_the_range(act: Activation, method: str, lim: float, t: float) -> None:
    """From ``lim`` up to 2^15 - t the comparisons stay in DReLU's window (one bit of
    margin): still right. From 2^15 + t to 2^16 - t every comparison is wrong: positive x
    give 0, negative x give x."""
    rng = np.random.default_rng(7)
    sign = rng.choice([-1.0, 1.0], 400)
    x = quantized(sign * rng.uniform(lim, 2 ** 15 - t - 2.0 ** -7, 400))
    np.testing.assert_allclose(act.secure(x, method=method), np.maximum(x, 0),
                               atol=act.error["exact"])
    x = quantized(sign * rng.uniform(2 ** 15 + t, 2 ** 16 - t, 400))
    got = act.secure(x, method=method)
    assert (got[x > 0] == 0).all()
    np.testing.assert_allclose(got[x < 0], x[x < 0], atol=2 * 2.0 ** -F)


def check_rounds_and_cost(act: Activation, method: str, mode: str, rounds: int, span: float,
                          rng) -> None:
    """On (3, 7) inputs of [-span, span]: within the claim (prob: its allowance of
    failures), the declared cost measured, ``rounds`` rounds."""
    cfg = RingConfig(trunc=mode)
    x = quantized(rng.uniform(-span, span, (3, 7)))
    run = Run(cfg)
    got = value(run(lambda p, a: act.kernel(p, a, method), share(x)))
    assert got.shape == (3, 7)
    assert (np.abs(got - act.ref(x)) > act.error[mode]).sum() <= act.allowed(mode, method, x)
    run.assert_cost(act.cost(x.size, cfg, method))
    assert run.rounds == rounds


def quartic_segments(table, breaks, e: int, K: int):
    """Each segment's quartic of a quantised table (mpc3.kernels.piecewise.quartic_table)
    on its segment widened by the 2^-10 fitting margin, after checking the quantisation the
    secure form relies on (centres on the 2^-(e+1) grid, a4 a3 a1 K-bit): (j, x, u, P(x))."""
    centres, a = table
    for j, (lo, hi) in enumerate(zip(breaks[:-1], breaks[1:])):
        assert centres[j] * 2 ** (e + 1) == round(centres[j] * 2 ** (e + 1))
        for k in (4, 3, 1):
            assert a[j, k] * 2 ** K == round(a[j, k] * 2 ** K)
        x = np.linspace(lo - 2.0 ** -10, hi + 2.0 ** -10, 5001)
        u = x - centres[j]
        yield j, x, u, sum(a[j, k] * u ** k for k in range(5))
