"""net.party.store.ModelStore on disk: a model whose files are damaged in any way - meta.json of any
JSON type or with fields of the wrong type, tensor files outside the model, missing,
symlinked, special or of the wrong size - is loaded as ``corrupt`` with its reason, and the
party still loads and serves every healthy model beside it (issue 33, item 3: a meta.json
holding ``[]`` made the party exit at start)."""
import hashlib
import json
import os

import numpy as np
import pytest

from mpc3.shares import AShare
from net.codec import share_payload
from net.party.store import CORRUPT, UNVERIFIED, ModelStore


def _store_model(store: ModelStore, model_id: str) -> dict:
    """Commit a one-tensor model as an upload does; its meta."""
    stage = store.begin(model_id)
    share = AShare(np.arange(6, dtype=np.uint64).reshape(2, 3),
                   np.arange(6, 12, dtype=np.uint64).reshape(2, 3))
    payload = share_payload(share)
    name = store.write_tensor(stage, 0, payload)
    meta = {"model_id": model_id, "upload_id": "u1", "owner": "alice", "total_bytes":
            len(payload), "public_meta": "{}", "frac": 18, "created": 0.0,
            "tensors": [{"name": "w", "shape": [2, 3], "frac": 18, "file": name,
                         "sha256": hashlib.sha256(payload).hexdigest()}]}
    store.commit(model_id, stage, meta, {"w": share})
    return meta


def _edit_meta(root, model_id, meta):
    (root / "models" / model_id / "meta.json").write_text(json.dumps(meta))


DAMAGE = {
    "a list": [],
    "null": None,
    "a string": "model",
    "tensors of ints": {"model_id": "bad", "tensors": [1, 2]},
    "tensors not a list": {"model_id": "bad", "tensors": {"w": 1}},
    "no tensors": {"model_id": "bad"},
    "owner not a string": {"model_id": "bad", "owner": ["x"], "tensors": []},
    "total_bytes a string": {"model_id": "bad", "total_bytes": "9", "tensors": []},
    "public_meta an object": {"model_id": "bad", "public_meta": {}, "tensors": []},
}


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_any_meta_json_leaves_the_others_served(tmp_path, what):
    store = ModelStore(tmp_path)
    _store_model(store, "good")
    _store_model(store, "bad")
    _edit_meta(tmp_path, "bad", DAMAGE[what])
    again = ModelStore(tmp_path)                                   # a party restart
    assert again.info("good").state == UNVERIFIED and again.info("good").shares
    bad = again.info("bad")
    assert bad.state == CORRUPT and "metadata is unreadable" in bad.problem
    assert bad.meta["model_id"] == "bad" and bad.meta["tensors"] == []


def _tensor_edit(tmp_path, edit):
    store = ModelStore(tmp_path)
    _store_model(store, "good")
    meta = _store_model(store, "bad")
    edit(tmp_path / "models" / "bad", meta)
    again = ModelStore(tmp_path)
    assert again.info("good").state == UNVERIFIED
    return again.info("bad")


@pytest.mark.parametrize("file,why", [("../good/meta.json", "outside its model"),
                                      ("/etc/passwd", "outside its model"),
                                      ("..", "outside its model")])
def test_tensor_files_outside_the_model_are_refused(tmp_path, file, why):
    def edit(d, meta):
        meta["tensors"][0]["file"] = file
        (d / "meta.json").write_text(json.dumps(meta))
    bad = _tensor_edit(tmp_path, edit)
    assert bad.state == CORRUPT and why in bad.problem


@pytest.mark.parametrize("shape", [[2, -3], "2x3", [2.0, 3], [True, 3], [2 ** 50]])
def test_invalid_shapes_are_refused(tmp_path, shape):
    def edit(d, meta):
        meta["tensors"][0]["shape"] = shape
        (d / "meta.json").write_text(json.dumps(meta))
    bad = _tensor_edit(tmp_path, edit)
    assert bad.state == CORRUPT and "no valid shape" in bad.problem


def test_symlinked_special_missing_and_resized_tensor_files(tmp_path):
    """A tensor file replaced by a symlink (to /dev/zero: read, it would never end), removed,
    or of another size than its shape is refused before it is read."""
    def link(d, meta):
        f = d / meta["tensors"][0]["file"]
        f.unlink()
        os.symlink("/dev/zero", f)
    assert "is missing" in _tensor_edit(tmp_path / "a", link).problem

    def remove(d, meta):
        (d / meta["tensors"][0]["file"]).unlink()
    assert "is missing" in _tensor_edit(tmp_path / "b", remove).problem

    def grow(d, meta):
        with open(d / meta["tensors"][0]["file"], "ab") as fh:
            fh.write(b"\0" * 8)
    bad = _tensor_edit(tmp_path / "c", grow)
    assert bad.state == CORRUPT and "has 104 bytes on disk, its shape (2, 3) takes 96" \
        in bad.problem
