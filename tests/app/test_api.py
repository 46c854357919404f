"""The Python API (app/api.py, docs/API.md) on real party processes: the quickstart example
runs as a user would run it and prints what the plaintext models compute; a model owner
shares and a query user classifies and generates through the facade, with the costs the
parties report, roles enforced and a stream stopped early leaving no session behind."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import app.api as mpc3api
from app.doctor import tiny_model
from app.localcluster import LocalCluster
from conftest import ROOT
from protocols import model as M
from app import textdata as TD


def test_quickstart_example_prints_the_plaintext_models_results(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], env=env,
                       cwd=tmp_path, text=True, capture_output=True, timeout=560)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "parties up: [0, 1, 2]" in out
    assert "model translator: encoder-decoder, permits translate" in out
    assert "model lm: decoder-only, permits generate" in out
    mcfg, w, user, vocab = TD.load_shipped()
    for number in ("4096", "77", "1234"):
        plain = M.greedy_decode(mcfg, w, user, np.array([TD.encode_src(number, vocab)]),
                                vocab.bos, vocab.eos, max_steps=vocab.max_tgt_len)[0]
        assert f"translate {number} -> {TD.decode_tgt(plain, vocab)}" in out
    lcfg, lw, luser = M.load_model(TD.SHIPPED_LM)
    prompt = list(b"12 = ")
    ref = M.greedy_generate(lcfg, lw, luser, [prompt], 24, eos=256)[0]
    assert f"generate '12 = ' -> {bytes(ref).decode()}" in out
    for what, jobs in (("translate", None), ("generate", len(ref) + 1)):
        line = next(ln for ln in out if ln.startswith(f"{what} cost: "))
        m = re.match(rf"{what} cost: (\S+) MB, (\d+) messages, (\d+) rounds, (\d+) jobs", line)
        assert m and float(m.group(1)) > 0 and int(m.group(3)) > 0
        assert jobs is None or int(m.group(4)) == jobs      # prefill + one step per token
    assert not list(tmp_path.glob("mpc3-quickstart-*"))      # its cluster directory is gone


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    c = LocalCluster(d, peer_timeout=5.0)
    c.start(wait=240)
    yield c
    c.stop()


def test_owner_shares_and_user_classifies_through_the_api(cluster, tmp_path):
    mcfg, w, user = tiny_model()
    M.save_model(tmp_path / "clf.npz", mcfg, w, user, labels=["a", "b", "c"])
    with mpc3api.Cluster.connect(cluster.path, role="model-owner") as owner:
        owner.share_model(tmp_path / "clf.npz", "clf",
                          permit=["classify", "classify-argmax"])
        with pytest.raises(ValueError, match="^classify needs role 'query-user'; this "
                           "connection is 'model-owner'"):
            owner.classify("clf", model=tmp_path / "clf.npz", ids=[1, 2])
    ids = [[1, 5, 7, 2], [3, 3, 9, 4]]
    ref = M.ref_classify(mcfg, w, M.embed_tokens(mcfg, user, np.array(ids)))
    with mpc3api.Cluster.connect(cluster.path) as qu:
        assert [p.up and p.kernels_ready for p in qu.status()] == [True] * 3
        report = qu.doctor(job=False)
        assert report.ok() and len(report.lines) == 4, report.problems
        [model] = [m for m in qu.models() if m.model_id == "clf"]
        assert model.kind == "encoder-classifier" and model.parties == [0, 1, 2]
        assert model.permitted == ["classify", "classify-argmax"]
        got = [qu.classify("clf", model=tmp_path / "clf.npz", ids=i)[0] for i in ids]
        cost = qu.last_costs
        for g, want in zip(got, ref):
            assert np.abs(g.logits - want).max() < 2e-3
            assert g.index == int(want.argmax()) and g.label == "abc"[g.index]
        assert cost.jobs == 1 and cost.bytes_total == sum(cost.bytes_per_party) > 0
        [only] = qu.classify("clf", model=tmp_path / "clf.npz", ids=ids[0], argmax=True)
        assert only.logits is None and only.index == int(ref[0].argmax())
        with pytest.raises(ValueError, match="^share_model needs role 'model-owner'"):
            qu.share_model(tmp_path / "clf.npz", "x")


def test_generate_streams_and_an_early_stop_closes_the_session(cluster):
    with mpc3api.Cluster.connect(cluster.path, role="model-owner") as owner:
        owner.share_model(TD.SHIPPED_LM, "lm")
    lcfg, lw, luser = M.load_model(TD.SHIPPED_LM)
    ref = bytes(M.greedy_generate(lcfg, lw, luser, [list(b"305 = ")], 30, eos=256)[0])
    with mpc3api.Cluster.connect(cluster.path) as qu:
        pieces = list(qu.generate("lm", "305 = ", 30, model=TD.SHIPPED_LM, stream=True))
        assert "".join(pieces) == ref.decode() and len(pieces) == len(ref) > 3
        assert qu.last_tokens == [list(ref)] and qu.last_costs.jobs == len(ref) + 1
        for _ in range(10):          # more than user_sessions (8) if early stops leaked them
            stream = qu.generate("lm", "305 = ", 30, model=TD.SHIPPED_LM, stream=True)
            assert next(stream) == ref.decode()[0]
            stream.close()
        assert qu.generate("lm", "305 = ", 3, model=TD.SHIPPED_LM) == ref.decode()[:3]
        with pytest.raises(ValueError, match="^give a text prompt or token ids"):
            qu.generate("lm", None, 3, model=TD.SHIPPED_LM, stream=True)   # refused at once
        with pytest.raises(ValueError, match="^model 'lm' on the cluster is not the model of"):
            qu.generate("lm", "1 = ", 3, model=TD.SHIPPED_LMS["softmax"], stream=True)
