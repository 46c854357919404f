"""Bring-your-own weights in safetensors (mpc3 naming): our reader/writer against the
reference implementation (the ``safetensors`` package), round trips through ``mpc3 import``,
and every malformed file refused with a message naming the problem."""
import json
import struct

import numpy as np
import pytest

from app.cli import main as cli
from protocols import model as M
from protocols.model import safetensors as ST

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def tiny_cfg():
    return M.ModelConfig(d_model=8, n_heads=2, d_head=4, n_features=4, d_ff=16, n_enc_layers=1,
                         n_dec_layers=1, attn_c=0.5, attn_norm="mean", norm_first=False,
                         src_vocab=5, tgt_vocab=6, max_len=8).validate()


def same(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


def test_reader_and_writer_agree_with_the_reference_implementation(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)), "b.c": rng.standard_normal(5).astype(np.float32),
               "h": rng.standard_normal((2, 2)).astype(np.float16),
               "i": np.arange(6, dtype=np.int64).reshape(2, 3), "empty": np.zeros((0, 3))}
    theirs = tmp_path / "theirs.safetensors"
    safetensors_numpy.save_file(tensors, str(theirs), metadata={"k": "v"})
    got, meta = ST.read_safetensors(theirs)
    same(got, tensors)
    assert meta == {"k": "v"}
    ours = tmp_path / "ours.safetensors"
    ST.write_safetensors(ours, tensors, {"k": "v"})
    same(safetensors_numpy.load_file(str(ours)), tensors)


def test_bf16_is_widened_exactly(tmp_path):
    vals = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bf16 = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    head = json.dumps({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "bf.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + bf16)
    assert np.array_equal(ST.read_safetensors(path)[0]["x"], vals)


@pytest.mark.parametrize("with_user", [True, False])
def test_model_round_trip_and_import_command(tmp_path, with_user, capsys):
    cfg = tiny_cfg()
    w, user = M.random_weights(cfg, 1), (M.random_user(cfg, 2) if with_user else None)
    st = tmp_path / "m.safetensors"
    ST.save_safetensors_model(st, cfg, w, user)
    cfg2, w2, user2 = ST.load_safetensors_model(st)
    assert cfg2 == cfg
    same(dict(w2.items()), dict(w.items()))
    same(user2, user or {})
    # the reference library reads what we wrote, config included
    from safetensors import safe_open
    with safe_open(str(st), "np") as fh:
        assert json.loads(fh.metadata()[ST.CONFIG_KEY]) == cfg.to_dict()
    same(safetensors_numpy.load_file(str(st)), ST.read_safetensors(st)[0])
    npz = tmp_path / "m.npz"
    assert cli(["import", str(st), "--out", str(npz)]) == 0
    assert "MPC parameters" in capsys.readouterr().out
    cfg3, w3, user3 = M.load_model(npz)
    assert cfg3 == cfg
    same(dict(w3.items()), dict(w.items()))
    same(user3, user or {})
    back = tmp_path / "back.safetensors"
    assert cli(["import", str(npz), "--out", str(back)]) == 0
    same(ST.read_safetensors(back)[0], ST.read_safetensors(st)[0])


def test_config_from_a_json_file_and_a_foreign_writer(tmp_path):
    """A file written by another tool (no mpc3 metadata, float32) plus a JSON config."""
    cfg = tiny_cfg()
    w = M.random_weights(cfg, 3)
    path = tmp_path / "f32.safetensors"
    safetensors_numpy.save_file({k: v.astype(np.float32) for k, v in w.items()}, str(path))
    with pytest.raises(ValueError, match="no model config"):
        ST.load_safetensors_model(path)
    cj = tmp_path / "cfg.json"
    cj.write_text(json.dumps(cfg.to_dict()))
    cfg2, w2, user = ST.load_safetensors_model(path, cj)
    assert cfg2 == cfg and user == {}
    for k, v in w.items():
        assert np.array_equal(w2[k], v.astype(np.float32).astype(np.float64))
    # a model whose plaintext reference is the same function (up to float32 rounding)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, cfg.d_model))
    assert np.max(np.abs(M.ref_encoder(cfg, w2, x) - M.ref_encoder(cfg, w, x))) < 1e-4


def _raw(tmp_path, header, data=b"", name="bad.safetensors"):
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


@pytest.mark.parametrize("header,data,message", [
    ({"x": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8, "bad shape"),
    ({"x": {"dtype": "F64", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16, "needs 24"),
    ({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8, "dtype 'C64'"),
    ({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 9, "trailing"),
    ({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]},
      "y": {"dtype": "F64", "shape": [1], "data_offsets": [4, 12]}}, b"\0" * 12, "overlaps"),
    ({"x": {"dtype": "F64", "shape": [1]}}, b"\0" * 8, "lacks"),
    (b"{not json", b"", "not JSON"),
])
def test_malformed_files_are_refused(tmp_path, header, data, message):
    with pytest.raises(ValueError, match=message):
        ST.read_safetensors(_raw(tmp_path, header, data))


def test_truncated_and_oversized_headers(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\1\2")
    with pytest.raises(ValueError, match="too short"):
        ST.read_safetensors(p)
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        ST.read_safetensors(p)


def test_wrong_names_and_shapes_are_refused_with_the_name(tmp_path):
    cfg = tiny_cfg()
    w = dict(M.random_weights(cfg, 4).items())
    meta = {ST.CONFIG_KEY: json.dumps(cfg.to_dict())}
    extra = tmp_path / "extra.safetensors"
    ST.write_safetensors(extra, {**w, "transformer.h.0.attn.c_attn.weight": np.zeros(3)}, meta)
    with pytest.raises(ValueError, match="c_attn.weight"):
        ST.load_safetensors_model(extra)
    missing = tmp_path / "missing.safetensors"
    ST.write_safetensors(missing, {k: v for k, v in w.items() if k != "enc.0.ffn.w1"}, meta)
    with pytest.raises(ValueError, match="enc.0.ffn.w1"):
        ST.load_safetensors_model(missing)
    shape = tmp_path / "shape.safetensors"
    ST.write_safetensors(shape, {**w, "enc.0.ffn.w1": np.zeros((3, 3))}, meta)
    with pytest.raises(ValueError, match="shape"):
        ST.load_safetensors_model(shape)
    from app.cli.common import load_model_file
    M.save_model(tmp_path / "m.npz", cfg, M.Weights(w))
    with pytest.raises(ValueError, match="--model-config"):
        load_model_file(str(tmp_path / "m.npz"), str(tmp_path / "cfg.json"))
    assert cli(["import", str(shape), "--out", str(tmp_path / "o.npz")]) == 2
    assert not (tmp_path / "o.npz").exists()


def test_tensors_are_read_on_demand_after_the_whole_header_is_checked(tmp_path):
    """SafetensorsFile checks the header when opened and reads a tensor only when asked
    (share-model can stream a model tensor by tensor): opening a 64 MB file allocates a few
    KB; each read allocates that tensor alone."""
    import tracemalloc
    big = np.zeros((1024, 8192))                                     # 64 MiB
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "big.safetensors"
    ST.write_safetensors(path, {"big": big, "small": small}, {"k": "v"})
    tracemalloc.start()
    try:
        with ST.SafetensorsFile(path) as fh:
            opened = tracemalloc.get_traced_memory()[1]
            assert sorted(fh.names) == ["big", "small"] and fh.shape("big") == (1024, 8192)
            assert fh.metadata == {"k": "v"}
            tracemalloc.reset_peak()
            np.testing.assert_array_equal(fh.read("small"), small)
            read_small = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert opened < 1 << 20 and read_small < 1 << 20, (opened, read_small)
