"""Issue 33, item 5: a model shared from its file is read one tensor at a time.

``load_model(..., lazy=True)`` / ``load_safetensors_model(..., lazy=True)`` keep the weights
in the file (:class:`protocols.model.OnDemandTensors`): names, shapes and dtypes are checked
from the headers when loading, values whenever a tensor is read. The share layout
(:func:`protocols.layers.secure_model.layout`) reads each tensor when it uses it and keeps none;
the calibration (:mod:`protocols.calibration.shadow`, the secure stacks on a shadow party) makes
each one's ring form once into a temporary file it maps a slice of at each use. Both give
exactly what the model in memory gives. The memory this saves is measured over a cluster in
tests/net/party/test_memory.py.
"""
import dataclasses

import numpy as np
import pytest

from app.bench.lm import lm_config
from app.owner import calibrate_model
from protocols import model as M
from protocols.model.safetensors import load_safetensors_model, save_safetensors_model
from protocols.layers.secure_model import LazyTensors, layout, plain_tensors


def _lm(attention="softmax"):
    cfg = lm_config("decoder-only", attention, 32, 4, 2, 64, 12, 1, "gelu")
    return cfg, M.random_weights(cfg, 1), M.random_user(cfg, 1)


def _encdec():
    """A Performer encoder-decoder with attention biases (Omega folded per tensor)."""
    cfg, _, _ = _lm()
    cfg = M.ModelConfig.from_dict({**cfg.to_dict(), "arch": M.ENCODER_DECODER,
                                   "attention": M.PERFORMER, "n_enc_layers": 2,
                                   "n_dec_layers": 1, "src_vocab": 11, "tgt_vocab": 13,
                                   "attn_bias": True, "ffn_act": "relu"}).validate()
    return cfg, M.random_weights(cfg, 2), M.random_user(cfg, 2)


class Counting:
    """Wraps an OnDemandTensors' reader: which tensors were read, how often."""

    def __init__(self, w: M.Weights):
        self.reads: list[str] = []
        inner = w.tensors._read

        def read(name):
            self.reads.append(name)
            return inner(name)
        w.tensors._read = read


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_lazy_load_reads_nothing_until_used_and_equals_the_eager_load(tmp_path, fmt):
    cfg, w, user = _lm()
    path = tmp_path / f"m.{fmt}"
    (M.save_model if fmt == "npz" else save_safetensors_model)(path, cfg, w, user)
    load = M.load_model if fmt == "npz" else load_safetensors_model
    cfg2, lazy, user2 = load(path, lazy=True)
    assert isinstance(lazy.tensors, M.OnDemandTensors) and cfg2 == cfg
    count = Counting(lazy)
    assert lazy.n_params() == w.n_params() and sorted(lazy.keys()) == sorted(w.keys())
    lazy.validate(cfg)
    assert count.reads == []                         # shapes from the headers only
    assert all(np.array_equal(user2[k], user[k]) for k in user)
    for k in w.keys():
        a = lazy[k]
        assert a.dtype == np.float64 and np.array_equal(a, w[k])
    assert count.reads == list(w.keys())              # read when asked for, never kept
    lazy[next(iter(w.keys()))]
    assert len(count.reads) == len(w.keys()) + 1
    _, eager, _ = load(path)
    assert isinstance(eager.tensors, dict)


@pytest.mark.parametrize("make", [_lm, _encdec], ids=["softmax-lm", "performer-encdec"])
def test_calibration_and_layout_of_a_lazy_model_equal_the_models_in_memory(tmp_path, make):
    cfg, w, user = make()
    path = tmp_path / "m.npz"
    M.save_model(path, cfg, w, user)
    _, lazy, _ = M.load_model(path, lazy=True)
    count = Counting(lazy)
    assert calibrate_model(cfg, lazy, user).to_dict() == calibrate_model(cfg, w, user).to_dict()
    assert set(count.reads) == set(w.keys())
    plain = plain_tensors(cfg, w)
    streamed = LazyTensors(layout(cfg, lazy))
    assert sorted(streamed) == sorted(plain)
    assert streamed.extra_frac() == {k: e for k, (_, e) in plain.items() if e}
    for k in plain:
        np.testing.assert_allclose(streamed[k], plain[k][0], rtol=1e-15, atol=0)


def test_a_tensor_damaged_in_the_file_is_refused_when_read_naming_it(tmp_path):
    """Values are checked at every read: a NaN stops calibration (before any upload) with
    the tensor's name; a file that changed shape under the reader is refused too."""
    cfg, w, user = _lm()
    bad = M.Weights(dict(w.tensors))
    bad["dec.1.ffn.w2"] = np.where(np.arange(w["dec.1.ffn.w2"].size).reshape(
        w["dec.1.ffn.w2"].shape) == 7, np.nan, w["dec.1.ffn.w2"])
    path = tmp_path / "m.npz"
    _save_unchecked(path, cfg, bad, user)
    _, lazy, _ = M.load_model(path, lazy=True)                   # headers are fine
    with pytest.raises(ValueError, match=r"'dec.1.ffn.w2' contains non-finite values"):
        calibrate_model(cfg, lazy, user)
    lazy.tensors._read = lambda name: np.zeros(3)
    with pytest.raises(ValueError, match=r"now has shape \(3,\)"):
        lazy["dec.0.ffn.w1"]


def _save_unchecked(path, cfg, w, user):
    """An .npz as save_model writes it, without its checks (a damaged file)."""
    import json
    arrays = {"format": np.array([M.FORMAT_VERSION]),
              "config.json": np.frombuffer(json.dumps(cfg.to_dict()).encode(), np.uint8),
              **dict(w.tensors), **user}
    np.savez(path, **arrays)


def test_lazy_random_weights_are_drawn_per_tensor_and_stay_the_same():
    """The benchmarks' owner draws each tensor when it shares it (random_weights lazy):
    the same values at every read, finite, of the eager draw's shapes and scale."""
    cfg, w, _ = _lm()
    lazy = M.random_weights(cfg, 1, lazy=True)
    assert sorted(lazy.keys()) == sorted(w.keys())
    for k in w.keys():
        a = lazy[k]
        assert a.shape == w[k].shape and np.array_equal(a, lazy[k])
        assert np.isfinite(a).all() and 0.3 < (a.std() + 1e-9) / (w[k].std() + 1e-9) < 3 \
            or a.size < 64
    assert not np.array_equal(lazy["dec.0.self.wq"], M.random_weights(cfg, 2, lazy=True)
                              ["dec.0.self.wq"])


def test_fold_omega_one_tensor_equals_the_whole_fold():
    cfg, w, _ = _encdec()
    whole = M.fold_omega(w, cfg)
    assert whole and all(k.endswith("_omega") for k in whole)
    for k, v in whole.items():
        assert np.array_equal(M.fold_omega_one(w, k), v)


def test_save_model_streams_a_lazy_model_to_an_identical_file(tmp_path):
    cfg, w, user = _encdec()
    M.save_model(tmp_path / "a.npz", cfg, w, user)
    _, lazy, user2 = M.load_model(tmp_path / "a.npz", lazy=True)
    M.save_model(tmp_path / "b.npz", cfg, lazy, user2)
    _, back, user3 = M.load_model(tmp_path / "b.npz")
    assert all(np.array_equal(back[k], w[k]) for k in w.keys())
    assert all(np.array_equal(user3[k], user[k]) for k in user)
    assert not list(tmp_path.glob("*.tmp*"))
    with pytest.raises(ValueError):                          # refused: nothing left behind
        M.save_model(tmp_path / "c.npz", dataclasses.replace(cfg, d_ff=cfg.d_ff + 1), w, user)
    assert not list(tmp_path.glob("*.tmp*")) and not (tmp_path / "c.npz").exists()


_OWNER = """
import sys
from mpc3.procinfo import peak_rss
from app.owner import calibrate_model
from protocols import model as M
from protocols.layers.secure_model import LazyTensors, layout
cfg, w, user = M.load_model(sys.argv[1], lazy=sys.argv[2] == "lazy")
calibrate_model(cfg, w, user)
tensors = LazyTensors(layout(cfg, w))
for name in tensors:            # what the upload reads (the upload itself:
    tensors[name]               # tests/net/party/test_memory.py)
print(peak_rss())
"""


def test_the_owners_peak_does_not_grow_with_the_models_depth(tmp_path):
    """share-model's owner side (load, calibrate, the layout the upload reads) in a fresh
    process: a 14-layer model peaks within 2x its largest tensor (+ 8 MiB) of the same
    model with 2 layers, though its weights take 75 MB more; loaded whole (the eager
    load, as before) the difference is the whole 75 MB."""
    import os
    import subprocess
    import sys
    peaks, sizes = {}, {}
    for layers in (2, 14):
        cfg = lm_config("decoder-only", "softmax", 256, 4, layers, 1024, 16, 1, "gelu")
        w = M.random_weights(cfg, 0)
        M.save_model(tmp_path / f"m{layers}.npz", cfg, w, M.random_user(cfg, 0))
        sizes[layers] = (8 * w.n_params(), max(v.nbytes for v in w.tensors.values()))
        for mode in ("lazy", "eager"):
            out = subprocess.run([sys.executable, "-c", _OWNER, str(tmp_path / f"m{layers}.npz"),
                                  mode], capture_output=True, text=True, timeout=300,
                                 env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            assert out.returncode == 0, out.stderr[-2000:]
            peaks[layers, mode] = int(out.stdout.split()[-1])
    grown, largest = sizes[14][0] - sizes[2][0], sizes[14][1]
    assert grown > 70e6
    assert peaks[14, "lazy"] - peaks[2, "lazy"] <= 2 * largest + (8 << 20), (peaks, largest)
    assert peaks[14, "eager"] - peaks[2, "eager"] >= 0.9 * grown, (peaks, grown)
