"""The shipped translator (app/assets) works with the numpy reference only."""

import numpy as np
import pytest

from protocols import model as M
from app import textdata as TD

pytestmark = pytest.mark.skipif(not TD.SHIPPED_MODEL.exists(), reason="no shipped model")


def test_shipped_files_small():
    total = TD.SHIPPED_MODEL.stat().st_size + TD.SHIPPED_VOCAB.stat().st_size
    assert total <= 5 * 1024 * 1024


def test_shipped_model_loads_and_validates():
    cfg, w, user, vocab = TD.load_shipped()
    w.validate(cfg)
    M.validate_user(cfg, user)
    assert vocab == TD.VOCAB
    assert cfg.max_len >= vocab.max_tgt_len


def test_shipped_heldout_exact_match():
    cfg, w, user, vocab = TD.load_shipped()
    nums = np.unique(TD.sample_numbers(400, seed=777, split="test"))
    nums = np.random.default_rng(777).permutation(nums)[:200]
    assert len(nums) == 200
    texts = [str(int(n)) for n in nums]
    assert all(TD.split_of(int(n)) == "test" for n in nums)
    preds = TD.translate(texts, cfg, w, user, vocab)
    ok = [p == TD.reference_translation(t) for t, p in zip(texts, preds)]
    acc = float(np.mean(ok))
    bad = [(t, p) for t, p, o in zip(texts, preds, ok) if not o][:5]
    assert acc >= 0.99, f"exact match {acc:.3f}; e.g. {bad}"


def test_shipped_step_decoder_matches_full():
    cfg, w, user, vocab = TD.load_shipped()
    src = np.array([TD.encode_src("4096")])
    tgt = np.array([[vocab.bos] + TD.encode_tgt("four thousand ninety six")[:-1]])
    enc = M.ref_encoder(cfg, w, M.embed(cfg, user["embed.src"], src))
    y = M.embed(cfg, user["embed.tgt"], tgt)
    full = M.ref_decoder(cfg, w, y, enc)
    st = M.RefDecodeState(cfg, w, enc)
    for t in range(y.shape[1]):
        np.testing.assert_allclose(M.ref_decoder_step(cfg, w, st, y[:, t], enc), full[:, t],
                                   atol=1e-10)
    pred = M.output_logits(user, full)[0].argmax(-1)
    assert TD.decode_tgt(pred) == "four thousand ninety six"
