"""The vocabulary end on shares (protocols/layers/vocab.py): the secure arg-max against
numpy's, measured traffic against the declared cost, its error region and range."""
import math

import numpy as np
import pytest

from conftest import share, value
from mpc3.kernels import convert
from mpc3.party import RingConfig
from mpc3.shadow import ShadowParty
from protocols.layers import vocab as VO

#: DReLU's error region in real units: a compared difference in [-REGION, 0) may go either way
REGION = 2.0 ** (RingConfig().relu_drop_bits - RingConfig().frac)


def grid_logits(rng, shape, scale=3.0):
    """Normal logits on a 2^-8 grid: distinct values differ by 2^-8, 16 times the error
    region, and equal ones (ties) occur."""
    return np.round(rng.normal(size=shape) * scale * 256) / 256


@pytest.mark.parametrize("C_", [1, 2, 3, 5, 8, 13, 257])
def test_argmax_matches_numpy_and_declared_cost(run, rng, C_):
    logits = grid_logits(rng, (6, C_))
    logits[0] = 1.5                            # all tied: the lowest index, as numpy
    if C_ > 2:
        logits[1, [0, C_ - 1]] = 9.0           # tie of two maxima far apart
        logits[2, [C_ - 2, C_ - 1]] = 9.0      # tie of neighbours at the end
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    np.testing.assert_array_equal(value(res), logits.argmax(1).astype(float))
    run.assert_cost(VO.cost_argmax(RingConfig(), 6, C_))


def test_argmax_at_the_range_edge(run):
    """A spread just below convert.relu_limit (2^14): every compared difference in range."""
    lim = convert.relu_limit(RingConfig())
    logits = np.array([[-lim / 2 + 1, lim / 2 - 1, 0.0, -lim / 2 + 1, 3.0],
                       [lim / 2 - 1, -lim / 2 + 1, lim / 2 - 1, 1.0, -2.0]])
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    np.testing.assert_array_equal(value(res), [1.0, 0.0])


def test_argmax_inside_the_error_region_stays_near_the_maximum(run, rng):
    """Logits closer than 2^-12 to the maximum may win; the winner is never further below
    the maximum than one error region per level."""
    C_ = 37
    logits = grid_logits(rng, (8, C_))
    for r in range(8):                         # near-ties of the maximum at random places
        top = logits[r].max()
        near = rng.choice(C_, 4, replace=False)
        logits[r, near] = top - rng.uniform(0, REGION, 4)
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    got = value(res).astype(int)
    assert ((got >= 0) & (got < C_)).all()
    chosen = logits[np.arange(8), got]
    assert (chosen >= logits.max(1) - math.ceil(math.log2(C_)) * REGION).all()


def test_argmax_refuses_bad_shapes(run):
    with pytest.raises(ValueError, match="argmax_a needs"):
        run(lambda p, xs: VO.argmax_a(p, xs), share(np.zeros(4)))


def test_shadow_argmax_is_numpy_and_records_the_spread():
    got = []
    p = ShadowParty(RingConfig(), lambda layer, site, kind, v: got.append((site, kind, v)))
    logits = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, 0.5, 0.0]])
    out = VO.argmax_a(p, ShadowParty.share(
        np.round(logits * 2 ** 18).astype(np.int64).view(np.uint64)), site="argmax")
    assert list(ShadowParty.value(out) / 2 ** 18) == [1.0, 0.0]
    assert got == [("argmax", "relu", 5.0 * 2 ** 18)]
