"""A stored calibration is honoured where the job runs (three `mpc3 party` processes on
loopback, mTLS): a transformer uploaded without a valid calibration is refused by every party
and nothing is stored; a model whose stored metadata was edited on disk is refused at job
time - by the party holding the edit, or already by the query user's client before it shares
inputs - while the party keeps serving its other models; properly shared models of each
architecture run. The edits and their messages:
tests/protocols/calibration/test_calibration_check.py."""
import json
import subprocess
import sys

import grpc
import numpy as np
import pytest

from app import generate as G
from app import translate as T
from app.localcluster import LocalCluster
from app.owner import calibrate_model, share_transformer, transformer_meta
from mpc3 import ring
from net.client.failures import ClusterError
from protocols import model as M
from protocols.layers.secure_model import plain_tensors
from helpers.calibration_edits import EDITS, LM

C = grpc.StatusCode


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("caltrust"), peer_timeout=5.0)
    c.start()
    c.w, c.user_t = M.random_weights(LM, 2), M.random_user(LM, 2)
    try:
        share_transformer(c.cfg, "lm", LM, c.w, None, *c.creds("owner"), user=c.user_t)
    except BaseException:
        c.stop()
        raise
    c.meta = transformer_meta(LM, calibrate_model(LM, c.w, c.user_t))
    yield c
    c.stop()


def _upload(c, model_id, meta):
    """What share_transformer uploads, with the given public metadata."""
    layout = plain_tensors(LM, c.w)
    with c.owner() as o:
        return o.upload(model_id, {k: v for k, (v, _) in layout.items()}, public_meta=meta,
                        extra_frac={k: e for k, (_, e) in layout.items() if e})


def _held(c, model_id):
    with c.user() as u:
        return [n for n, models in enumerate(u.list_models())
                if model_id in {m.model_id for m in models}]


def _generates(c, model_id, n=4):
    """Greedy tokens over the cluster equal the plaintext model's."""
    prompt = np.array([[5, 1, 7]])
    want = M.greedy_generate(LM, c.w, c.user_t, prompt, n)
    with c.user() as u:
        got = G.generate(T.ClusterBackend(u, model_id, step_timeout=60), LM, c.user_t,
                         prompt, n).tokens
    assert got == want


@pytest.mark.parametrize("edit", ["missing", "old version", "margin below 1", "site removed",
                                  "layer removed", "over a limit", "NaN value",
                                  "input range missing", "input range inf",
                                  "input range NaN"])
def test_upload_without_a_valid_calibration_is_refused_and_nothing_stored(cl, edit):
    change, why = EDITS[edit]
    meta = json.loads(json.dumps(cl.meta))
    change(meta)
    with pytest.raises(ClusterError) as err:
        _upload(cl, "bad", meta)
    msg = str(err.value)
    assert err.value.code == C.INVALID_ARGUMENT and "\n" not in msg
    assert "model 'bad' cannot run: " in msg and why in msg, msg
    assert "share it again with 'mpc3 share-model'" in msg
    assert _held(cl, "bad") == []                                # on no party
    for n in range(3):
        assert not (cl.cfg.parties[n].data_dir / "models" / "bad").exists()


def _edit_public_meta(c, n, model_id, change):
    """Change model_id's public metadata in party n's meta.json on disk and restart the
    party (which loads its models from disk)."""
    c.procs[n].terminate()
    c.procs[n].wait(10)
    f = c.cfg.parties[n].data_dir / "models" / model_id / "meta.json"
    stored = json.loads(f.read_text())
    public = json.loads(stored["public_meta"])
    change(public)
    stored["public_meta"] = json.dumps(public)
    f.write_text(json.dumps(stored))
    c.start_party(n)
    assert c.wait_healthy() == []


def test_model_edited_on_disk_is_refused_at_job_time_others_still_serve(cl):
    """ed1's metadata loses its calibration on party 1, ed0's input range is widened to
    infinity on party 0: party 1 refuses ed1's jobs (the client, reading party 0's intact
    metadata, shared the inputs); the client refuses ed0 before sharing anything, and party
    0 refuses it too when a client skips that check; both parties keep serving lm, and
    `mpc3 models` shows the two as not runnable."""
    for mid in ("ed0", "ed1"):
        share_transformer(cl.cfg, mid, LM, cl.w, None, *cl.creds("owner"), user=cl.user_t)
    _edit_public_meta(cl, 1, "ed1", EDITS["missing"][0])
    _edit_public_meta(cl, 0, "ed0", EDITS["input range inf"][0])
    x = M.embed(LM, cl.user_t["embed.tgt"], np.array([[5, 1, 7]]))
    with cl.user(retry_s=0) as u:
        with pytest.raises(ClusterError) as err:
            u.run("ed1", "lm_prefill", {"X": x}, {"session": "e1"})
        msg = str(err.value)
        assert err.value.party == 1 and err.value.code == C.FAILED_PRECONDITION, msg
        assert msg.startswith("party 1: model 'ed1' cannot run: it has no calibration; its "
                              "owner must share it again with 'mpc3 share-model'"), msg
        with pytest.raises(ClusterError) as err:              # the client's own check
            u.run("ed0", "lm_prefill", {"X": x}, {"session": "e2"})
        assert err.value.party is None and "input range for X is inf" in str(err.value)
        assert [s.jobs_running + s.jobs_queued for s in u.status()] == [0, 0, 0]
        info = u.model("ed0")                                     # a client without it
        with pytest.raises(ClusterError) as err:
            u.submit("ed0", "lm_prefill", {"X": ring.encode(x)}, {"session": "e3"},
                     encoded=True, upload_id=info.upload_id)
        assert err.value.party == 0 and "model 'ed0' cannot run: its calibrated input " \
            "range for X is inf" in str(err.value)
    _generates(cl, "lm")                                          # the others still serve
    r = subprocess.run([sys.executable, "-m", "app.cli", "models", "--config", str(cl.path)],
                       text=True, capture_output=True, timeout=120)
    lines = {ln.split(":", 1)[0]: ln for ln in r.stdout.splitlines()}
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert lines["lm"].startswith("lm: OK ")
    assert lines["ed1"].startswith("ed1: NOT RUNNABLE ") and \
        "; party 1: model 'ed1' cannot run: it has no calibration" in lines["ed1"]
    assert lines["ed0"].startswith("ed0: NOT RUNNABLE ") and "; party 0: " in lines["ed0"]


def test_properly_shared_models_of_each_architecture_run(cl):
    """With the checks in place: the LM (relu-performer, generate), a classifier (softmax,
    BERT's pooler, classify) and a translator shared unfolded (Omega apart: the 'omega'
    sites; translate) calibrated by share_transformer, each against its plaintext model."""
    _generates(cl, "lm")
    common = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                  attn_norm="mean", max_len=16)
    clf = M.ModelConfig(**common, norm_first=False, arch="encoder-classifier",
                        n_enc_layers=2, src_vocab=11, n_classes=3, attention="softmax",
                        pool="cls-tanh", ffn_act="gelu").validate()
    w, user = M.random_weights(clf, 3), M.random_user(clf, 3)
    share_transformer(cl.cfg, "clf", clf, w, None, *cl.creds("owner"), user=user)
    x = M.embed(clf, user["embed.src"], np.array([[1, 4, 2, 9]]))
    with cl.user() as u:
        got = u.run("clf", "classify", {"X": x})["logits"]
    assert np.abs(got - M.ref_classify(clf, w, x)).max() < 1e-2
    tr = M.ModelConfig(**common, norm_first=True, n_enc_layers=1, n_dec_layers=1,
                       src_vocab=7, tgt_vocab=9).validate()
    w, user = M.random_weights(tr, 4), M.random_user(tr, 4)
    share_transformer(cl.cfg, "tr", tr, w, None, *cl.creds("owner"), user=user,
                      fold_omega=False)
    src = M.embed(tr, user["embed.src"], np.array([[1, 2, 3]]))
    ref = M.RefDecodeState(tr, w, M.ref_encoder(tr, w, src))
    with cl.user() as u:
        be = T.ClusterBackend(u, "tr")
        with T.Session(be) as s:
            s.open(src)
            for t, tok in enumerate((0, 5, 2)):
                y = M.embed(tr, user["embed.tgt"], np.array([[tok]]), offset=t)[:, 0]
                got = ring.decode(s.step(y))
                assert np.abs(got - M.ref_decoder_step(tr, w, ref, y)).max() < 5e-2
