"""What a query user or a noisy neighbour can and cannot do to a production cluster
(three `mpc3 party` processes on loopback, mTLS): the model's weights stay secret, limits
hold per user, a hung party is named, stored shares are checked across parties."""
import hashlib
import json
import os
import signal
import threading
import time

import grpc
import numpy as np
import pytest

from app.localcluster import LocalCluster
from app.owner import share_transformer
from net.client.failures import ClusterError, InconsistentModel, JobFailed
from net.codec import tensor_chunks
from net.proto import mpc3_pb2 as pb
from net.proto import mpc3_pb2_grpc as pb_grpc
from mpc3 import ring
from mpc3.sharing import deal
from protocols import model as M
from protocols.jobs import PRODUCTION

C = grpc.StatusCode
LIMITS = {"running_jobs": 2, "user_jobs": 6, "user_streams": 2, "stream_idle_s": 2.0,
          "user_sessions": 2, "user_input_bytes": 8 << 20, "queue_timeout_s": 120.0}


def small_cfg():
    return M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32,
                         n_enc_layers=1, n_dec_layers=1, attn_c=0.125, attn_norm="mean",
                         ln_eps=1e-3, norm_first=False, src_vocab=7, tgt_vocab=9,
                         max_len=16).validate()


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("prod"), peer_timeout=5.0, limits=LIMITS)
    c.start()
    c.mcfg = small_cfg()
    c.w = M.random_weights(c.mcfg, 1)
    c.user_t = M.random_user(c.mcfg, 1)
    try:
        share_transformer(c.cfg, "tr1", c.mcfg, c.w, None, *c.creds("owner"), user=c.user_t)
        share_transformer(c.cfg, "tr2", c.mcfg, c.w, ["translate", "encoder"],
                          *c.creds("owner"), user=c.user_t)
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def stub(c, n, stem="user"):
    from net import keys
    cert, key = c.creds(stem)
    ch = grpc.secure_channel(c.cfg.parties[n].address,
                             keys.channel_credentials(cert, key, c.cfg.ca),
                             options=[("grpc.ssl_target_name_override", f"party-{n}")])
    return ch, pb_grpc.ClientServiceStub(ch)


def submit_chunks(job_id, model_id, upload_id, kind, params, share):
    head = pb.SubmitChunk(job_id=job_id, model_id=model_id, upload_id=upload_id, kind=kind,
                          params_json=json.dumps(params), n_tensors=1)
    first = True
    for c in tensor_chunks("X", share, 18):
        if first:
            head.tensor.CopyFrom(c)
            yield head
            first = False
        else:
            yield pb.SubmitChunk(job_id=job_id, tensor=c)


# ------------------------------------------------------------------ weights stay secret ----
def test_production_party_runs_model_inference_only(prod):
    with prod.user() as u:
        for st in u.status():
            assert not st.diagnostic
            assert list(st.job_kinds) == PRODUCTION.names()
    assert not PRODUCTION.diagnostic
    # No parameter a user sends can pick weights or a layer: a session id, and on opening a
    # session the LayerNorm fusions - a schedule from a fixed set, the same function computed
    # (tests/app/test_translate_inproc.py::test_session_fusions_change_rounds_not_the_function).
    for spec in PRODUCTION:
        allowed = {"session", "fuse"} if spec.session == "open" else {"session"}
        assert set(spec.params) <= allowed, spec.name


def test_weight_extraction_through_a_diagnostic_kind_is_refused(prod):
    """Regression: `infer --kind linear_relu --params '{"weight": "enc.0.ffn.w1"}'` with
    X = I returned the weight exactly."""
    eye = np.eye(16)
    with prod.user() as u:
        for kind in ("linear_relu", "linear", "bench_layer", "bench_op", "bench_lm"):
            with pytest.raises(ClusterError) as err:
                u.run("tr1", kind, {"X": eye}, {"weight": "enc.0.ffn.w1"})
            assert err.value.code == C.NOT_FOUND and "unknown job kind" in str(err.value)
        with pytest.raises(ClusterError) as err:       # an intermediate value: forbidden
            u.run("tr1", "encoder", {"X": eye[None]})
        assert err.value.code == C.PERMISSION_DENIED and "permitted: translate" in str(err.value)
        with pytest.raises(ClusterError) as err:       # no parameter selects weights
            u.run("tr2", "encoder", {"X": eye[None]}, {"weight": "enc.0.ffn.w1"})
        assert err.value.code == C.INVALID_ARGUMENT and "unknown parameters" in str(err.value)


def test_no_permitted_kind_is_a_linear_function_of_its_input(prod):
    """Every job kind a production party runs, fed probes, returns nothing a linear read-out
    (Y = X A + b) explains: with X = I no weight comes back."""
    from app import translate as T
    rng = np.random.default_rng(2)
    X = rng.uniform(-1.5, 1.5, (4, 16, 16))              # 64 probe rows of width 16
    ys = rng.uniform(-1.5, 1.5, (48, 16))
    with prod.user() as u:
        enc = u.run("tr2", "encoder", {"X": X})["Y"]
        be = T.ClusterBackend(u, "tr2")
        with T.Session(be) as s:
            s.open(rng.uniform(-1.5, 1.5, (48, 3, 16)))
            hs = ring.decode(s.step(ys))
    for inp, out in ((X.reshape(-1, 16), enc.reshape(-1, 16)), (ys, hs)):
        A = np.hstack([inp, np.ones((inp.shape[0], 1))])
        fit, *_ = np.linalg.lstsq(A, out, rcond=None)
        resid = np.linalg.norm(A @ fit - out) / np.linalg.norm(out - out.mean(0))
        assert resid > 0.1, resid
    enc = enc[0]
    weights = [w for k, w in prod.w.items() if w.ndim == 2]
    for w in weights:          # and no output block equals a weight (or its transpose)
        for cand in (w, w.T):
            if cand.shape == enc.shape:
                assert np.abs(enc - cand).max() > 1e-2


# ----------------------------------------------------------------- one user vs the others ----
def test_burst_of_jobs_from_two_users_all_complete(prod):
    """14 jobs at once (2 running slots, per-user limit 6): they queue, retry and finish."""
    x = np.random.default_rng(3).uniform(-1, 1, (1, 4, 16))
    ref = M.ref_encoder(prod.mcfg, prod.w, x)
    errors, done = [], []

    def one(stem):
        try:
            with prod.user(stem) as u:
                y = u.run("tr2", "encoder", {"X": x})["Y"]
            done.append(float(np.abs(y - ref).max()))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(("user", "user2")[k % 2],))
               for k in range(14)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(done) == 14 and max(done) < 1e-2


def test_per_user_job_limit_names_the_limit(prod):
    """Jobs submitted to party 1 only wait there for party 0's start, so they stay queued
    (deterministic: no race with jobs finishing); the 7th is refused naming user_jobs."""
    x = np.zeros((1, 2, 16))
    share = deal(ring.encode(x))[1]
    with prod.user("user2", retry_s=0) as u:
        info = u.model("tr2")
        ids, refused = [f"lim-{os.urandom(4).hex()}-{i}" for i in range(8)], None
        try:
            for i, job_id in enumerate(ids):
                try:
                    u._call(1, "SubmitJob", submit_chunks(job_id, "tr2", info.upload_id,
                                                          "encoder", {}, share))
                except ClusterError as exc:
                    refused = (i, exc)
                    break
        finally:
            for job_id in ids:
                try:
                    u._call(1, "CancelJob", pb.JobRef(job_id=job_id), timeout=10)
                except ClusterError:
                    pass
    assert refused is not None and refused[0] == 6, refused
    exc = refused[1]
    assert exc.code == C.RESOURCE_EXHAUSTED
    assert "user_jobs = 6" in str(exc) and "[limits]" in str(exc)
    with prod.user("user2") as u:                       # cancelled jobs free the slots
        u.run("tr2", "encoder", {"X": x})


def test_sessions_per_user_are_limited(prod):
    from app import translate as T
    x = np.zeros((1, 2, 16))
    with prod.user(retry_s=0) as u:
        be = T.ClusterBackend(u, "tr1")
        s1, s2, s3 = (T.Session(be, sid=f"lim-{k}") for k in (1, 2, 3))
        s1.open(x)
        s2.open(x)
        with pytest.raises(ClusterError) as err:
            s3.open(x)
        assert err.value.code == C.RESOURCE_EXHAUSTED and "user_sessions" in str(err.value)
        s1.close()
        s3.open(x)                                    # a closed session frees its slot
        s2.close()
        s3.close()


def test_stalled_streams_are_limited_and_reaped(prod):
    """A user's stalled submissions hold at most user_streams server threads, only for
    stream_idle_s; other users are served meanwhile."""
    ch, s = stub(prod, 0)
    release = threading.Event()

    def stalled():                 # opens the stream and sends nothing
        release.wait(30)
        yield pb.SubmitChunk(job_id="stall-" + os.urandom(4).hex(), model_id="tr1")

    futs = [s.SubmitJob.future(stalled(), timeout=30) for _ in range(2)]
    time.sleep(0.5)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        s.SubmitJob(stalled(), timeout=10)
    assert err.value.code() == C.RESOURCE_EXHAUSTED and "user_streams" in err.value.details()
    assert time.monotonic() - t0 < 5
    with prod.user("user2") as u2:                     # another user is not affected
        assert len(u2.list_models()) == 3
    for f in futs:                                     # reaped after stream_idle_s
        with pytest.raises(grpc.RpcError):
            f.result(timeout=15)
    release.set()
    ch.close()
    with prod.user() as u:                             # and the user can submit again
        u.run("tr2", "encoder", {"X": np.zeros((1, 2, 16))})


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_declared_sizes_are_not_allocated_and_input_bytes_are_limited(prod):
    ch, s = stub(prod, 1)
    pid = prod.procs[1].pid
    before = _rss_kb(pid)
    n = 32 << 20                                        # declares 512 MiB of shares
    release = threading.Event()

    def big():
        yield pb.SubmitChunk(job_id="big-" + os.urandom(4).hex(), model_id="tr1",
                             upload_id="x", kind="decode_open", n_tensors=1,
                             tensor=pb.TensorChunk(name="X", dtype="uint64", shape=[n],
                                                   ring_bits=64, frac=18, offset=0,
                                                   total_bytes=16 * n, data=b"\0" * 1024))
        release.wait(30)

    fut = s.SubmitJob.future(big(), timeout=30)
    time.sleep(1.0)
    assert _rss_kb(pid) - before < 64 * 1024            # far below the declared 512 MiB
    release.set()
    with pytest.raises(grpc.RpcError):
        fut.result()
    # input bytes beyond user_input_bytes (8 MiB) are refused as they arrive
    share = deal(ring.encode(np.zeros((1, 16, 40000))))[1]
    info = [m for m in s.ListModels(pb.ListModelsRequest()).models if m.model_id == "tr1"][0]
    with pytest.raises(grpc.RpcError) as err:
        s.SubmitJob(submit_chunks("toobig", "tr1", info.upload_id, "decode_open",
                                  {"session": "sb"}, share), timeout=30)
    assert err.value.code() == C.RESOURCE_EXHAUSTED and "user_input_bytes" in err.value.details()
    ch.close()


def test_hung_party_is_named_and_the_job_aborted(prod):
    """SIGSTOP party 2 after it accepted a job: the client fails within the deadline,
    names party 2 and says the job can be resubmitted."""
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 16))
    with prod.user() as u:
        info = u.model("tr2")
        shares = deal(ring.encode(x))
        job_id = "hang-" + os.urandom(4).hex()
        u._call(2, "SubmitJob", submit_chunks(job_id, "tr2", info.upload_id, "encoder", {},
                                              shares[2]))
        os.kill(prod.procs[2].pid, signal.SIGSTOP)
        try:
            for n in (0, 1):
                u._call(n, "SubmitJob", submit_chunks(job_id, "tr2", info.upload_id,
                                                      "encoder", {}, shares[n]))
            t0 = time.monotonic()
            with pytest.raises(JobFailed) as err:
                u.wait(job_id, timeout=60)
            assert time.monotonic() - t0 < 40
        finally:
            os.kill(prod.procs[2].pid, signal.SIGCONT)
    msg = str(err.value)
    assert "party 2" in msg and "aborted" in msg and "resubmit" in msg, msg
    with prod.user() as u:                              # the cluster serves again
        u.run("tr2", "encoder", {"X": x})


# ------------------------------------------------------------------------ stored shares ----
def _model_dir(c, n, model_id):
    return c.cfg.parties[n].data_dir / "models" / model_id


def test_share_files_are_private(prod):
    for n in range(3):
        root = prod.cfg.parties[n].data_dir / "models"
        assert root.stat().st_mode & 0o777 == 0o700
        d = _model_dir(prod, n, "tr1")
        assert d.stat().st_mode & 0o777 == 0o700
        for f in d.iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f


def _restart(c, n):
    c.procs[n].terminate()
    c.procs[n].wait(10)
    c.start_party(n)
    assert c.wait_healthy() == []


def test_edited_share_with_recomputed_checksum_is_detected(prod):
    """A party's stored share changed on disk (checksum recomputed): after its restart the
    parties' slot digests disagree and the model is refused until it is replaced."""
    share_transformer(prod.cfg, "tam", prod.mcfg, prod.w, None, *prod.creds("owner"), user=prod.user_t)
    d = _model_dir(prod, 1, "tam")
    meta = json.loads((d / "meta.json").read_text())
    t = meta["tensors"][0]
    data = bytearray((d / t["file"]).read_bytes())
    data[0] ^= 1                                        # slot 1 (party 1's first half)
    (d / t["file"]).write_bytes(bytes(data))
    t["sha256"] = hashlib.sha256(data).hexdigest()
    (d / "meta.json").write_text(json.dumps(meta))
    _restart(prod, 1)
    with prod.user() as u:
        with pytest.raises(InconsistentModel) as err:
            u.model("tam")
    msg = str(err.value)
    assert "slot 1 differs between party 0 and party 1" in msg and "delete" in msg, msg
    with prod.user() as u:                               # refused for jobs on every party
        with pytest.raises(ClusterError):
            u.run("tam", "decode_open", {"X": np.zeros((1, 2, 16))}, {"session": "t1"})
    with prod.owner() as o:                              # the owner replaces it
        o.delete("tam")
    share_transformer(prod.cfg, "tam", prod.mcfg, prod.w, None, *prod.creds("owner"), user=prod.user_t)
    with prod.user() as u:
        assert u.model("tam").upload_id


def test_corrupt_files_on_one_party_can_be_deleted_and_reshared(prod):
    share_transformer(prod.cfg, "cor", prod.mcfg, prod.w, None, *prod.creds("owner"), user=prod.user_t)
    d = _model_dir(prod, 0, "cor")
    f = sorted(d.glob("t*.bin"))[0]
    f.write_bytes(f.read_bytes()[:40])                   # truncated on party 0
    _restart(prod, 0)
    with prod.user() as u:
        with pytest.raises(InconsistentModel) as err:
            u.model("cor")
        assert "party 0" in str(err.value) and "corrupt" in str(err.value)
        assert str(prod.dir) not in str(err.value)       # no server paths
    with prod.owner() as o:
        lines = o.delete("cor")
    assert lines == ["party 0: deleted", "party 1: deleted", "party 2: deleted"]
    share_transformer(prod.cfg, "cor", prod.mcfg, prod.w, None, *prod.creds("owner"), user=prod.user_t)
    with prod.user() as u:
        assert u.model("cor").state == "verified"


# ------------------------------------------------------------------------------ the CLI ----
def _mpc3(*args):
    from conftest import mpc3_cli
    return mpc3_cli(*args, timeout=120)


def test_cli_names_a_down_party_and_a_rejected_certificate(prod, tmp_path):
    from net import keys
    prod.procs[2].terminate()
    prod.procs[2].wait(10)
    try:
        r = _mpc3("models", "--config", prod.path)
        assert r.returncode == 1 and "party 2: DOWN" in r.stdout, r.stdout + r.stderr
        # a party that is merely down makes no model inconsistent (issue 32, item 6)
        assert "tr1: OK on parties [0, 1], party 2 not reached" in r.stdout, r.stdout
        assert "INCONSISTENT" not in r.stdout and "Traceback" not in r.stderr
        r = _mpc3("status", "--config", prod.path)
        assert r.returncode == 1 and "PROBLEM: party 2 is down" in r.stdout
    finally:
        prod.start_party(2)
        assert prod.wait_healthy() == []
    r = _mpc3("status", "--config", prod.path)
    assert r.returncode == 0 and r.stdout.count(": OK links") == 3, r.stdout
    keys.generate(tmp_path / "other")                  # a certificate from another CA
    r = _mpc3("models", "--config", prod.path, "--cert", tmp_path / "other" / "user.pem",
              "--key", tmp_path / "other" / "user.key")
    assert r.returncode == 1 and r.stdout.count("rejected this client's certificate") == 3, \
        r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_cli_infer_refuses_out_of_permission_and_share_model_permits(prod, tmp_path):
    x = np.random.default_rng(8).uniform(-1, 1, (1, 3, 16))
    np.save(tmp_path / "x.npy", x)
    r = _mpc3("infer", "--config", prod.path, "--model-id", "tr1", "--input",
              tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 2 and "does not permit 'encoder'" in r.stderr, r.stderr
    r = _mpc3("infer", "--config", prod.path, "--model-id", "tr2", "--input",
              tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    ref = M.ref_encoder(prod.mcfg, prod.w, x)
    assert np.abs(np.load(tmp_path / "y.npy") - ref).max() < 1e-2
    r = _mpc3("models", "--config", prod.path, "--verify", "tr2")
    assert r.returncode == 0 and "verified on parties [0, 1, 2]" in r.stdout
    r = _mpc3("share-model", tmp_path / "x.npy", "--config", prod.path, "--model-id", "bad")
    assert r.returncode == 2 and "not a readable .npz archive" in r.stderr, r.stderr


# --------------------------------------------------------------------- right or refused ----
def test_out_of_range_input_is_refused_before_sharing(prod, tmp_path):
    from protocols.calibration.calibrate import RangeError
    x = M.embed(prod.mcfg, prod.user_t["embed.src"], np.array([[1, 2, 3, 4]]))
    with prod.user() as u:
        y = u.run("tr2", "encoder", {"X": x})["Y"]                   # genuine input: right
        assert np.abs(y - M.ref_encoder(prod.mcfg, prod.w, x)).max() < 1e-2
        before = [s.jobs_running + s.jobs_queued for s in u.status()]
        with pytest.raises(RangeError, match="calibrated input range"):
            u.run("tr2", "encoder", {"X": 5 * x})                    # 5x: refused
    np.save(tmp_path / "x5.npy", 5 * x)
    r = _mpc3("infer", "--config", prod.path, "--model-id", "tr2", "--input",
              tmp_path / "x5.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 2 and "calibrated input range" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "y.npy").exists()
    assert before == [0, 0, 0]


def test_share_model_refuses_a_model_outside_the_kernels_ranges(prod, tmp_path):
    from protocols.calibration.calibrate import RangeError
    d = small_cfg().to_dict()
    d["attn_c"] = 64.0                                               # passes validation
    cfg = M.ModelConfig.from_dict(d)
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    with pytest.raises(RangeError) as err:
        share_transformer(prod.cfg, "hot", cfg, w, None, *prod.creds("owner"), user=user)
    msg = str(err.value)
    assert msg.startswith("enc.0.ln1: ") and "reaches" in msg and "above the limit" in msg, msg
    with prod.user() as u:                                           # nothing was uploaded
        assert all("hot" not in {m.model_id for m in ms} for ms in u.list_models())
    M.save_model(tmp_path / "hot.npz", cfg, w, user)
    r = _mpc3("share-model", tmp_path / "hot.npz", "--config", prod.path, "--model-id", "hot")
    assert r.returncode == 2 and "enc.0." in r.stderr and "Traceback" not in r.stderr
