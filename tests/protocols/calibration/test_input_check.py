"""The parties' own check of a query user's secret input against the model's calibrated
range (issue 33, item 8: a client that skips the range check got silent garbage)."""
import numpy as np
import pytest
from conftest import share

from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sharing import deal
from protocols.calibration.input_check import cost_input_check, in_range, ring_limit

LIM = 4.0


def _check(run, x, lim=LIM):
    res = run(lambda p, s: in_range(p, s, lim), share(x))
    assert len(set(res)) == 1                           # every party learns the same bit
    return res[0]


def test_accepts_the_range_and_its_edges_and_costs_what_it_declares(run):
    x = np.array([[0.0, LIM, -LIM, 1.5], [-3.9, 2.0, 0.25, -LIM * (1 + 1e-10)]])
    assert _check(run, x) is True
    run.assert_cost(cost_input_check(x.size, RingConfig()))


@pytest.mark.parametrize("bad", [LIM + 2.0 ** -10, -LIM - 2.0 ** -10, 1e4, -1e6, 2.0 ** 40])
def test_refuses_one_element_outside(run, bad):
    x = np.zeros((3, 5))
    x[2, 4] = bad
    assert _check(run, x) is False


@pytest.mark.parametrize("raw", [2 ** 63, 2 ** 63 + 5, 2 ** 64 - ring_limit(LIM, 18) - 1,
                                 ring_limit(LIM, 18) + 1, 2 ** 62, 2 ** 64 - 2 ** 62])
def test_ring_values_a_modified_client_could_send_are_refused(run, raw):
    """No magnitude bound: the comparisons read all 64 bits, so no ring value outside
    [-L, L] (in ring units) wraps into the range."""
    enc = ring.encode(np.zeros(7), ring.DEFAULT_FRAC)
    enc[3] = np.uint64(raw)
    res = run(lambda p, s: in_range(p, s, LIM), deal(enc))
    assert set(res) == {False}


def test_traffic_does_not_depend_on_the_values(run):
    """What crosses the links besides the opened bit is masked: two inputs, one in range
    and one far outside, cost the same bytes and rounds (the protocol's shape does not
    depend on the values)."""
    x = np.zeros(64)
    _check(run, x)
    first = (run.bytes_per_party, run.rounds)
    x[10] = 1e5
    _check(run, x)
    assert (run.bytes_per_party, run.rounds) == first


# ------------------------------------------------------------------ in a model's jobs ----
@pytest.fixture(scope="module")
def checked_classifier():
    """The shipped classifier shared with the owner's --check-inputs choice."""
    from app.owner import calibrate_model
    from net.party.inproc import InprocParties
    from protocols import model as M
    from app import textdata as TD
    cfg, w, user = M.load_model(TD.SHIPPED_CLASSIFIER)
    cal = calibrate_model(cfg, w, user)
    x = M.embed_tokens(cfg, user, TD.classifier_input([4096, 14]))
    plain = InprocParties.for_model(cfg, w, permitted=["classify"], calibration=cal.to_dict())
    checked = InprocParties.for_model(cfg, w, permitted=["classify"], calibration=cal.to_dict(),
                                      meta={"check_inputs": True})
    return cal, x, plain, checked


def test_a_modified_clients_garbage_input_is_refused_not_computed(checked_classifier):
    """Issue 33, item 8: one-hot x 1e4 and random x 1e6 (what a client that skips its own
    check can send) ran to garbage with exit code 0; with the owner's check every party
    refuses the job, naming the input, and an honest input still runs."""
    from conftest import run_job
    cal, x, plain, checked = checked_classifier
    ref, _ = run_job(plain, "classify", x)
    got, jobs = run_job(checked, "classify", x)
    np.testing.assert_array_equal(got["logits"].argmax(-1), ref["logits"].argmax(-1))
    declared = cost_input_check(x.size, RingConfig())
    for rank, job in enumerate(jobs):
        first = job.costs[0]
        assert first["layer"] == "input_check"
        assert (first["bytes"], first["rounds"]) == (declared.bytes_per_party[rank],
                                                     declared.rounds)
    garbage = [x * 1e4, np.random.default_rng(1).standard_normal(x.shape) * 1e6,
               np.where(np.arange(x.size).reshape(x.shape) == 17, cal.input_range["X"] * 1.01, x)]
    for bad in garbage:
        with pytest.raises(RuntimeError, match="input X lies outside the model's calibrated"):
            run_job(checked, "classify", bad)
        run_job(plain, "classify", bad)                # without the check: computed anyway
