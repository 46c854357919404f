"""The shipped encoder classifier (app/assets/classifier.npz,
benchmarks/train_classifier.py): the English words of N (bytes) -> N's leading digit. Small,
accurate in plaintext on held-out numbers, accepted by share-model's calibration, and its
secure logits and secure arg-max agree with the plaintext arg-max; `mpc3 demo --model
classifier` runs it on a local cluster."""
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_job

from app.owner import calibration_samples
from net.party.inproc import InprocParties
from protocols.calibration import calibrate as C
from protocols import model as M
from app import textdata as TD

#: Of 60 held-out numbers, how many the classifier must get right in plaintext (all: it gets
#: every one of the 990 test numbers right, benchmarks/results/classifier_accuracy.json).
MIN_RIGHT = 60


@pytest.fixture(scope="module")
def clf():
    return M.load_model(TD.SHIPPED_CLASSIFIER)


def held_out(n):
    """``n`` numbers below 10000 of the test split (deterministic)."""
    return [int(x) for x in TD.sample_numbers(40 * n, 5, "test") if x < 10000][:n]


def test_shipped_classifier_is_small_and_accurate_in_plaintext(clf):
    cfg, w, user = clf
    assert cfg.arch == "encoder-classifier" and cfg.n_classes == 10
    assert (cfg.src_vocab, cfg.max_len) == (257, TD.CLASSIFIER_LEN)
    assert TD.SHIPPED_CLASSIFIER.stat().st_size <= 5 << 20
    nums = held_out(60)
    assert len(nums) == 60 and len({TD.leading_digit(n) for n in nums}) == 9
    pred = M.ref_classify(cfg, w, M.embed_tokens(cfg, user, TD.classifier_input(nums)))
    right = int(np.sum(pred.argmax(-1) == [TD.leading_digit(n) for n in nums]))
    assert right >= MIN_RIGHT, right


def test_share_model_calibration_accepts_it(clf):
    cfg, w, user = clf
    C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)


def test_secure_classification_agrees_with_plaintext(clf):
    cfg, w, user = clf
    nums = held_out(4)
    x = M.embed_tokens(cfg, user, TD.classifier_input(nums))
    ref = M.ref_classify(cfg, w, x)
    parties = InprocParties.for_model(cfg, w, permitted=["classify", "classify-argmax"])
    logits, _ = run_job(parties, "classify", x)
    cls, _ = run_job(parties, "classify_argmax", x)
    assert np.max(np.abs(logits["logits"] - ref)) < 2e-2
    np.testing.assert_array_equal(logits["logits"].argmax(-1), ref.argmax(-1))
    np.testing.assert_array_equal(cls["class"], ref.argmax(-1).astype(float))


def test_classifier_input_pads_the_words():
    ids = TD.classifier_input([4096, 3373])
    assert bytes(ids[0, :24].tolist()) == b"four thousand ninety six"
    assert (ids[0, 24:] == TD.CLASSIFIER_PAD).all() and (ids[1] != TD.CLASSIFIER_PAD).all()
    assert [TD.leading_digit(n) for n in (0, 7, 14, 4096)] == [0, 7, 1, 4]


def test_demo_classifier_on_a_local_cluster():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--model", "classifier",
                        "4096", "14"], capture_output=True, text=True, timeout=600, env=env,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "'four thousand ninety six': class 4" in r.stdout, r.stdout
    assert "agreement with the plaintext model: 2/2" in r.stdout, r.stdout
