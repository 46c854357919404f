"""The vocabulary end on shares (protocols/layers/vocab.py): the secure arg-max against
numpy's, measured traffic against the declared cost."""
import numpy as np
import pytest

from conftest import share, value
from mpc3.party import RingConfig
from protocols.layers import vocab as VO


@pytest.mark.parametrize("C_", [1, 2, 5, 8, 13])
def test_argmax_matches_numpy_and_declared_cost(run, rng, C_):
    logits = rng.normal(size=(6, C_)) * 3
    logits[0] = 1.5                            # all tied: the lowest index, as numpy
    if C_ > 2:
        logits[1, [0, C_ - 1]] = 9.0           # tie of two maxima far apart
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    got = value(res)
    np.testing.assert_array_equal(got, logits.argmax(1).astype(float))
    run.assert_cost(VO.cost_argmax(RingConfig(), 6, C_))
