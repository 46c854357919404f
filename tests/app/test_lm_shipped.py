"""The shipped decoder-only LMs (app/assets/lm*.npz, benchmarks/train_lm.py), one per
attention, same shape and text: small, accurate in plaintext on held-out numbers, accepted by
share-model's calibration, and their secure generation agrees token for token with the
plaintext reference; `mpc3 demo --model lm [--attention A]` runs one on a local cluster."""
import os
import subprocess
import sys

import numpy as np
import pytest

from app import generate as G
from app import translate as T
from app.owner import calibration_samples
from protocols.calibration import calibrate as C
from protocols import model as M
from app import textdata as TD

#: Of 12 held-out 4-digit prompts, how many each LM must get exactly right in plaintext (its
#: test exact match on 300 numbers, benchmarks/results/lm*_accuracy.json, allows this).
MIN_RIGHT = {"relu-performer": 11, "softmax": 11, "power-softmax": 11, "sigma-relu": 11}


@pytest.fixture(scope="module", params=list(TD.SHIPPED_LMS))
def lm(request):
    return (request.param, TD.SHIPPED_LMS[request.param],
            *M.load_model(TD.SHIPPED_LMS[request.param]))


def prompts(n, length):
    nums = [int(x) for x in TD.sample_numbers(400, 11, "test") if len(str(int(x))) == length]
    return nums[:n]


def test_shipped_lm_is_small_and_accurate_in_plaintext(lm):
    attention, path, cfg, w, user = lm
    assert cfg.arch == "decoder-only" and cfg.tgt_vocab == 257
    assert cfg.attention == attention
    assert path.stat().st_size <= 5 << 20
    nums = prompts(12, 4)
    got = M.greedy_generate(cfg, w, user, [list(f"{n} = ".encode()) for n in nums], 46,
                            eos=G.eos_of(cfg))
    right = sum(bytes(g).decode() == TD.number_to_words(n) for g, n in zip(got, nums))
    assert right >= MIN_RIGHT[attention], right


def test_shipped_lms_have_one_shape():
    shapes = {a: M.load_model(p)[0] for a, p in TD.SHIPPED_LMS.items()}
    base = shapes["relu-performer"].to_dict()
    for a, cfg in shapes.items():
        assert {**cfg.to_dict(), "attention": "relu-performer"} == \
            {**base, "attention": "relu-performer"}, a


def test_share_model_calibration_accepts_it(lm):
    """share-model's calibration (random byte sequences) accepts the model: a softmax LM
    whose scores leave exp's range would be refused (and computed wrongly if forced)."""
    _, _, cfg, w, user = lm
    C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)


def test_secure_generation_agrees_with_plaintext(lm):
    _, _, cfg, w, user = lm
    nums = prompts(2, 4)
    ids = np.array([list(f"{n} = ".encode()) for n in nums])
    res = G.generate(T.InprocBackend(cfg, w), cfg, user, ids, 46, eos=G.eos_of(cfg))
    ref = M.greedy_generate(cfg, w, user, ids, 46, eos=G.eos_of(cfg))
    assert res.tokens == ref
    assert [bytes(t).decode() for t in res.tokens] == [TD.number_to_words(n) for n in nums]


@pytest.mark.parametrize("attention", ["relu-performer", "softmax"])
def test_demo_lm_on_a_local_cluster(attention):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--model", "lm", "--attention",
                        attention, "4096", "--inputs", "1"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4096 = four thousand ninety six" in r.stdout, r.stdout
    assert "token agreement with the plaintext model: " in r.stdout
    assert f"{attention} attention" in r.stdout, r.stdout


def test_training_module_equals_the_reference():
    """benchmarks/train_lm.py's torch module computes protocols.model.ref_lm (needs the
    [train] extra; skipped without torch)."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(TD.ASSETS.parents[1]))
    from benchmarks.train_lm import TorchLM, default_config, encode, numbers
    cfg = default_config()
    model = TorchLM(cfg, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids, _ = encode(numbers("valid")[:3], cfg.max_len)
    got = model(torch.tensor(ids)).detach().double().numpy()
    w, user = model.export()
    ref = M.output_logits(user, M.ref_lm(cfg, w, M.embed(cfg, user["embed.tgt"], ids)))
    assert np.max(np.abs(got - ref)) < 1e-4


def test_range_penalty_is_zero_inside_the_secure_range_only():
    """benchmarks/train_lm.py --range-penalty: zero while each row's largest score and its
    denominator stay where share-model's calibration wants them, positive outside."""
    torch = pytest.importorskip("torch")
    from dataclasses import replace
    sys.path.insert(0, str(TD.ASSETS.parents[1]))
    from benchmarks.train_lm import SCORE_TOP, default_config, range_penalty
    mask = torch.tril(torch.ones(4, 4))
    for attention in ("softmax", "power-softmax", "sigma-relu", "relu-performer"):
        cfg = replace(default_config(), attention=attention)
        assert float(range_penalty(cfg, torch.zeros(1, 1, 4, 4), mask)) == 0
    soft, power = (replace(default_config(), attention=a) for a in ("softmax", "power-softmax"))
    for s in (SCORE_TOP + 1.0, -12.0):            # a score too large; every score too small
        assert float(range_penalty(soft, torch.full((1, 1, 4, 4), s), mask)) > 0
    assert float(range_penalty(power, torch.full((1, 1, 4, 4), 10.0), mask)) > 0
