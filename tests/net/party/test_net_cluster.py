"""Three real party processes on loopback with mTLS: jobs, roles, bad input, failures.

The cluster here is a benchmark/test cluster (app.bench_party): it runs the diagnostic job
kind ``linear`` on bare tensors, which production parties refuse
(tests/system/test_net_trust.py)."""
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from mpc3 import ring
from net.client.failures import ClusterError, InconsistentModel, TamperingDetected
from net.client.outputs import reconstruct
from net.client.owner import ModelOwner
from net.client.user import QueryUser
from app.localcluster import LocalCluster
from net import keys
from net.proto import mpc3_pb2 as pb
from net.proto import mpc3_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[3]
PEER_TIMEOUT = 5.0
ULP = 2.0 ** -ring.DEFAULT_FRAC


class Cluster(LocalCluster):
    def __init__(self, d: Path, bench: bool = True, limits: dict | None = None,
                 **config) -> None:
        super().__init__(d, bench=bench, peer_timeout=PEER_TIMEOUT, limits=limits, **config)
        self.start()

    def stub(self, n, stem):
        cert, key = self.creds(stem)
        creds = keys.channel_credentials(cert, key, self.cfg.ca)
        ch = grpc.secure_channel(self.cfg.parties[n].address, creds,
                                 options=[("grpc.ssl_target_name_override", f"party-{n}")])
        return ch, pb_grpc.ClientServiceStub(ch)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    rng = np.random.default_rng(7)
    c.W = rng.standard_normal((48, 24)) * 0.2
    c.Wsq = rng.standard_normal((32, 32)) / np.sqrt(32)
    with c.owner() as o:
        o.upload("lin", {"W": c.W}, {"purpose": "test"})
        o.upload("sq", {"W": c.Wsq})
    yield c
    c.stop()


def test_linear_job_equals_numpy(cluster):
    x = np.random.default_rng(1).standard_normal((10, 48))
    with cluster.user() as u:
        y = u.run("lin", "linear", {"X": x})["Y"]
    assert y.shape == (10, 24)
    assert np.abs(y - x @ cluster.W).max() < 40 * ULP


def test_peer_links_over_grpc_streams_when_configured(tmp_path):
    """``peer_transport = "grpc"`` (one open port per party) runs the same job; party 0 then
    has no peer listener of its own."""
    c = Cluster(tmp_path, peer_transport="grpc")
    try:
        W = np.random.default_rng(3).standard_normal((16, 8)) * 0.3
        x = np.random.default_rng(4).standard_normal((5, 16))
        with c.owner() as o:
            o.upload("lin", {"W": W})
        with c.user() as u:
            y = u.run("lin", "linear", {"X": x})["Y"]
        assert np.abs(y - x @ W).max() < 40 * ULP
        host, _, port = c.cfg.parties[0].peer_address.rpartition(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
    finally:
        c.stop()


def test_concurrent_jobs_from_two_users(cluster):
    results, errors = {}, []

    def one(k, stem):
        try:
            x = np.random.default_rng(100 + k).standard_normal((4 + k, 48))
            with cluster.user(stem) as u:
                results[k] = (u.run("lin", "linear", {"X": x})["Y"], x)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k, ("user", "user2")[k % 2]))
               for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for y, x in results.values():
        assert np.abs(y - x @ cluster.W).max() < 40 * ULP


def test_roles_and_ownership(cluster):
    x = np.ones((2, 48))
    with cluster.user() as u, cluster.user("user2") as u2:
        job = u.submit("lin", "linear", {"X": x})
        u.wait(job)
        for call in (lambda: u2.fetch(job), lambda: u2.job_status(job)):
            with pytest.raises(ClusterError) as err:
                call()
            assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert set(u.fetch(job)) == {"Y"}
        with pytest.raises(ClusterError) as err:     # a query user may not upload
            ModelOwner(cluster.cfg, *cluster.creds("user")).upload("evil", {"W": x})
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    with cluster.owner() as o:                          # an owner may not submit jobs
        with pytest.raises(ClusterError) as err:
            QueryUser(cluster.cfg, *cluster.creds("owner")).submit("lin", "linear",
                                                                     {"X": x})
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert len(o.list_models()[0]) == 2
    ch, stub = cluster.stub(0, "user")                  # a client cert may not open peer links
    with pytest.raises(grpc.RpcError) as err:
        next(pb_grpc.PeerServiceStub(ch).Link(iter([pb.PeerFrame()]), timeout=5))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    ch.close()


def test_client_without_valid_certificate_is_refused(cluster, tmp_path):
    addr = cluster.cfg.parties[0].address
    opts = [("grpc.ssl_target_name_override", "party-0")]
    no_cert = grpc.ssl_channel_credentials(cluster.cfg.ca.read_bytes())
    keys.generate(tmp_path)                              # a different CA
    foreign = keys.channel_credentials(tmp_path / "user.pem", tmp_path / "user.key",
                                       cluster.cfg.ca)
    for creds in (no_cert, foreign):
        ch = grpc.secure_channel(addr, creds, options=opts)
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ClientServiceStub(ch).ListModels(pb.ListModelsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        ch.close()
    ch = grpc.insecure_channel(addr)                     # plaintext is not spoken at all
    with pytest.raises(grpc.RpcError):
        pb_grpc.ClientServiceStub(ch).ListModels(pb.ListModelsRequest(), timeout=5)
    ch.close()


def _chunk(name="W", shape=(4, 4), data=None, **kw):
    n = int(np.prod(shape))
    payload = data if data is not None else os.urandom(16 * n)
    fields = dict(name=name, dtype="uint64", shape=shape, ring_bits=64, frac=18, offset=0,
                  total_bytes=16 * n, data=payload, sha256=hashlib.sha256(payload).digest())
    fields.update(kw)
    return pb.TensorChunk(**fields)


def _upload(stub, model_id, chunks, n_tensors=1):
    msgs = [pb.UploadChunk(model_id=model_id, upload_id="u1", tensor=c) for c in chunks]
    msgs[0].n_tensors = n_tensors
    with pytest.raises(grpc.RpcError) as err:
        stub.UploadModelShares(iter(msgs), timeout=10)
    return err.value


def test_bad_uploads_are_rejected_and_change_nothing(cluster):
    ch, stub = cluster.stub(1, "owner")
    before = stub.ListModels(pb.ListModelsRequest()).models
    C = grpc.StatusCode
    big = os.urandom((1 << 20) + 16)
    cases = {
        "wrong dtype": ([_chunk(dtype="float64")], C.INVALID_ARGUMENT),
        "wrong ring": ([_chunk(ring_bits=32)], C.INVALID_ARGUMENT),
        "wrong frac": ([_chunk(frac=16)], C.INVALID_ARGUMENT),
        "shape/size mismatch": ([_chunk(shape=(4, 5), data=os.urandom(256),
                                        total_bytes=256)], C.INVALID_ARGUMENT),
        "oversized chunk": ([_chunk(shape=(len(big) // 16,), data=big)], C.INVALID_ARGUMENT),
        "too large tensor": ([_chunk(shape=(1 << 28,), data=b"", total_bytes=16 << 28)],
                             C.RESOURCE_EXHAUSTED),
        "bad checksum": ([_chunk(sha256=b"\0" * 32)], C.DATA_LOSS),
        "truncated tensor": ([_chunk(data=os.urandom(100), sha256=b"")], C.INVALID_ARGUMENT),
        "missing tensor": ([_chunk()], C.INVALID_ARGUMENT, 2),
        "bad model id": ([_chunk()], C.INVALID_ARGUMENT, 1, "../etc"),
        "existing model": ([_chunk()], C.ALREADY_EXISTS, 1, "lin"),
    }
    for what, (chunks, code, *rest) in cases.items():
        n_tensors = rest[0] if rest else 1
        model_id = rest[1] if len(rest) > 1 else "bad"
        err = _upload(stub, model_id, chunks, n_tensors)
        assert err.code() == code, (what, err.details())
    after = stub.ListModels(pb.ListModelsRequest()).models
    assert after == before
    ch.close()
    models = Path(cluster.cfg.parties[1].data_dir) / "models"
    assert sorted(p.name for p in models.iterdir()) == ["lin", "sq"]   # no staging left
    test_linear_job_equals_numpy(cluster)                               # model intact


def test_bad_job_submissions(cluster):
    C = grpc.StatusCode
    ch, stub = cluster.stub(2, "user")
    uid = [m for m in stub.ListModels(pb.ListModelsRequest()).models
           if m.model_id == "lin"][0].upload_id
    x = _chunk("X", (3, 48))

    def submit(**kw):
        first = dict(job_id=kw.pop("job_id", "bad-" + os.urandom(4).hex()), model_id="lin",
                     upload_id=uid, kind="linear", n_tensors=1, tensor=x)
        first.update(kw)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(iter([pb.SubmitChunk(**first)]), timeout=10)
        return err.value.code()

    assert submit(model_id="nope") == C.NOT_FOUND
    assert submit(kind="nope") == C.NOT_FOUND
    assert submit(upload_id="other") == C.FAILED_PRECONDITION
    assert submit(tensor=_chunk("X", (3, 47))) == C.INVALID_ARGUMENT
    assert submit(params_json="[1]") == C.INVALID_ARGUMENT
    assert submit(job_id="no/slash") == C.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        stub.FetchOutput(pb.JobRef(job_id="nope"), timeout=5).next()
    assert err.value.code() == C.NOT_FOUND
    ch.close()

    # a job submitted while the model is still being uploaded is refused
    och, ostub = cluster.stub(2, "owner")
    release = threading.Event()

    def slow_upload():
        yield pb.UploadChunk(model_id="slow", upload_id="u2", n_tensors=1,
                             tensor=_chunk(shape=(4, 4), data=os.urandom(128), sha256=b"",
                                           total_bytes=256))
        release.wait(10)

    fut = ostub.UploadModelShares.future(slow_upload(), timeout=20)
    ch, stub = cluster.stub(2, "user")
    deadline = time.monotonic() + 5
    while not any(m.model_id == "slow" for m in stub.ListModels(pb.ListModelsRequest()).models):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert submit(model_id="slow") == C.FAILED_PRECONDITION
    release.set()
    with pytest.raises(grpc.RpcError) as err:
        fut.result()
    assert err.value.code() == C.INVALID_ARGUMENT              # truncated: stream ended early
    assert not any(m.model_id == "slow" for m in stub.ListModels(pb.ListModelsRequest()).models)
    ch.close()
    och.close()


def test_inconsistent_model_across_parties_is_detected(cluster):
    for n in range(3):
        ch, stub = cluster.stub(n, "owner")
        msg = pb.UploadChunk(model_id="mixed", upload_id="a" if n < 2 else "b", n_tensors=1,
                             tensor=_chunk())
        stub.UploadModelShares(iter([msg]), timeout=10)
        ch.close()
    with cluster.user() as u, pytest.raises(InconsistentModel):
        u.submit("mixed", "linear", {"X": np.ones((1, 4))})
    with cluster.owner() as o:
        o.delete("mixed")


def test_tampered_output_share_is_detected(cluster):
    x = np.random.default_rng(3).standard_normal((5, 48))
    with cluster.user() as u:
        job = u.submit("lin", "linear", {"X": x})
        u.wait(job)
        pairs = u.fetch_pairs(job)
    assert np.abs(ring.decode(reconstruct(pairs)["Y"]) - x @ cluster.W).max() < 40 * ULP
    for n, half in ((0, "a"), (1, "b"), (2, "a")):
        bad = [{k: v.copy() for k, v in p.items()} for p in pairs]
        getattr(bad[n]["Y"], half)[2, 3] += np.uint64(1)
        with pytest.raises(TamperingDetected):
            reconstruct(bad)


def test_cli_share_model_infer_status(cluster, tmp_path):
    from protocols.model import ModelConfig, random_weights, random_user, save_model
    cfg = ModelConfig(d_model=8, n_heads=2, d_head=4, n_features=4, d_ff=16, n_enc_layers=1,
                      n_dec_layers=1, attn_c=0.5, attn_norm="mean", ln_eps=1e-5,
                      norm_first=False, src_vocab=5, tgt_vocab=6, max_len=8).validate()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda *a: subprocess.run([sys.executable, "-m", "app.cli", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    conf = str(cluster.path)
    if True:
        model = tmp_path / "m.npz"
        save_model(model, cfg, random_weights(cfg), random_user(cfg))
        r = run("share-model", str(model), "--config", conf, "--model-id", "enc")
        assert r.returncode == 2 and "--to-diagnostic-parties" in r.stderr   # benchmark parties
        r = run("share-model", str(model), "--config", conf, "--model-id", "enc",
                "--to-diagnostic-parties")                                    # random weights
        assert r.returncode == 0, r.stderr
        with cluster.user() as u:
            names = {t.name for t in u.model("enc").tensors}
        assert names and not names & {"embed.src", "embed.tgt", "out.w", "out.b"}
    x = np.random.default_rng(4).standard_normal((3, 48))
    np.save(tmp_path / "x.npy", x)
    r = run("infer", "--config", conf, "--model-id", "lin", "--kind", "linear",
            "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"))
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(tmp_path / "y.npy") - x @ cluster.W).max() < 40 * ULP
    r = run("infer", "--config", conf, "--model-id", "nope", "--input", str(tmp_path / "x.npy"),
            "--output", str(tmp_path / "z.npy"))
    assert r.returncode != 0 and "unknown model 'nope'" in r.stderr
    r = run("status", "--config", conf)
    assert r.returncode == 0 and r.stdout.count("OK links") == 3, r.stdout + r.stderr
    r = run("models", "--config", conf, "--delete", "enc")
    assert r.returncode == 0, r.stderr
    r = run("models", "--config", conf)
    assert r.returncode == 0 and "lin: OK" in r.stdout and "enc" not in r.stdout, r.stdout


def test_standard_health_service(cluster):
    health = pytest.importorskip("grpc_health.v1.health_pb2")
    health_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    for n in range(3):
        ch, _ = cluster.stub(n, "user")
        reply = health_grpc.HealthStub(ch).Check(health.HealthCheckRequest(service=""),
                                                 timeout=5)
        assert reply.status == health.HealthCheckResponse.SERVING
        ch.close()


def test_partial_upload_is_rolled_back(cluster):
    """If one party refuses an upload, the owner removes it from the two that accepted."""
    ch, stub = cluster.stub(1, "owner")
    stub.UploadModelShares(iter([pb.UploadChunk(model_id="half", upload_id="x", n_tensors=1,
                                                tensor=_chunk())]), timeout=10)
    ch.close()
    with cluster.owner() as o:
        with pytest.raises(ClusterError) as err:
            o.upload("half", {"W": np.ones((2, 2))})
        assert err.value.party == 1 and err.value.code == grpc.StatusCode.ALREADY_EXISTS
        ids = [{m.model_id: m.upload_id for m in ms} for ms in o.list_models()]
        assert "half" not in ids[0] and "half" not in ids[2] and ids[1]["half"] == "x"
        ch, stub = cluster.stub(1, "owner")
        stub.DeleteModel(pb.ModelRef(model_id="half"), timeout=10)
        ch.close()


def test_killed_party_aborts_job_and_cluster_recovers(cluster):
    """Runs last: kills party 2 mid-job, checks the survivors, restarts it."""
    x = np.random.default_rng(9).standard_normal((64, 32))
    with cluster.user() as u:
        job = u.submit("sq", "linear", {"X": x}, params={"repeat": 1000})
        t0 = time.monotonic()           # waited for, not slept on: a busy machine starts late
        while not all(s.state == pb.JobStatusReply.RUNNING for s in u.job_status(job)):
            assert time.monotonic() - t0 < 30, u.job_status(job)
            time.sleep(0.02)
        cluster.procs[2].send_signal(signal.SIGKILL)
        cluster.procs[2].wait()
        t0 = time.monotonic()
        while True:
            st = [u._call(n, "JobStatus", pb.JobRef(job_id=job)) for n in (0, 1)]
            if all(s.state == pb.JobStatusReply.FAILED for s in st):
                break
            assert time.monotonic() - t0 < PEER_TIMEOUT, st
            time.sleep(0.05)
        assert all("party 2" in s.error for s in st), [s.error for s in st]
        # the survivors keep serving; party 2 comes back with its stored shares
        assert len(u._call(0, "ListModels", pb.ListModelsRequest()).models) >= 2
        cluster.start_party(2)
        assert cluster.wait_healthy() == []
        y = u.run("sq", "linear", {"X": x}, params={"repeat": 2})["Y"]
    assert np.abs(y - x @ cluster.Wsq @ cluster.Wsq).max() < 1e-3


def test_tied_parties_exit_when_their_launcher_is_killed(tmp_path):
    """A benchmark/demo cluster (tied=True) leaves no orphans when its launcher dies hard
    (SIGKILL, as the OOM killer does): each party notices and shuts down."""
    script = (
        "import sys, time\n"
        "from app.localcluster import LocalCluster\n"
        f"c = LocalCluster({str(tmp_path)!r}, tied=True, peer_timeout=5.0).start()\n"
        "print(' '.join(str(p.pid) for p in c.procs), flush=True)\n"
        "time.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True, cwd=str(Path(__file__).resolve().parents[3]))
    try:
        pids = [int(x) for x in launcher.stdout.readline().split()]
        assert len(pids) == 3
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 30
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = [p for p in pids if _alive(p)]
        assert not alive, f"parties {alive} outlived their launcher"
    finally:
        launcher.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                    # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_share_model_refuses_diagnostic_parties(cluster):
    """Issue 33, item 7: share-model uploaded a real model to benchmark parties (which run
    the diagnostic job kinds: any user reads every weight) without a word. It is refused,
    naming the parties and the flag for test weights; nothing is stored."""
    from app.owner import share_transformer
    from protocols import model as M
    from app import textdata as TD
    mcfg, w, user = M.load_model(TD.SHIPPED_CLASSIFIER)
    with pytest.raises(ValueError, match="parties 0, 1, 2 run the diagnostic .* "
                                         "--to-diagnostic-parties"):
        share_transformer(cluster.cfg, "real", mcfg, w, None, *cluster.creds("owner"),
                          user=user)
    from net.proto import mpc3_pb2 as pb
    with cluster.user() as u:
        listed = u._each(lambda n: u._call(n, "ListModels", pb.ListModelsRequest()))
    assert all("real" not in [m.model_id for m in r.models] for r in listed)
