"""The shipped decoder-only LM (protocols/assets/lm.npz, benchmarks/train_lm.py): small,
accurate in plaintext on held-out numbers, and its secure generation agrees token for token
with the plaintext reference; `mpc3 demo --model lm` runs it on a local cluster."""
import os
import subprocess
import sys

import numpy as np
import pytest

from app import generate as G
from protocols import model as M
from protocols import textdata as TD


@pytest.fixture(scope="module")
def lm():
    return M.load_model(TD.SHIPPED_LM)


def prompts(n, length):
    nums = [int(x) for x in TD.sample_numbers(400, 11, "test") if len(str(int(x))) == length]
    return nums[:n]


def test_shipped_lm_is_small_and_accurate_in_plaintext(lm):
    cfg, w, user = lm
    assert cfg.arch == "decoder-only" and cfg.tgt_vocab == 257
    assert TD.SHIPPED_LM.stat().st_size <= 5 << 20
    nums = prompts(12, 4)
    got = M.greedy_generate(cfg, w, user, [list(f"{n} = ".encode()) for n in nums], 46,
                            eos=G.eos_of(cfg))
    right = sum(bytes(g).decode() == TD.number_to_words(n) for g, n in zip(got, nums))
    assert right >= 11, right            # 99.7 % on 300 test numbers (lm_accuracy.json)


def test_secure_generation_agrees_with_plaintext(lm):
    cfg, w, user = lm
    nums = prompts(2, 4)
    ids = np.array([list(f"{n} = ".encode()) for n in nums])
    res = G.generate(G.LMInprocBackend(cfg, w), cfg, user, ids, 46, eos=G.eos_of(cfg))
    ref = M.greedy_generate(cfg, w, user, ids, 46, eos=G.eos_of(cfg))
    assert res.tokens == ref
    assert [bytes(t).decode() for t in res.tokens] == [TD.number_to_words(n) for n in nums]


def test_demo_lm_on_a_local_cluster():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--model", "lm", "4096",
                        "--inputs", "1"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4096 = four thousand ninety six" in r.stdout, r.stdout
    assert "token agreement with the plaintext model: " in r.stdout


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
