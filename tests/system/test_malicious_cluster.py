"""Malicious mode over real party processes (`mpc3 party` on loopback, mTLS, a cluster.toml
with ``security = "malicious"``, net/party/malicious.py): `mpc3 status` shows the mode; every
production job kind is refused - its first flush meets kernels that have no verification
yet (docs/MALICIOUS.md) - at all three parties, naming the job, with no output to fetch, and
the parties go on serving (the next job is refused the same way, promptly, and Status stays
OK); a session's steps and close have no session to run in, since its opening is refused.
A party restarted with another mode makes every party refuse submissions in one line
naming both modes, and `mpc3 status` and `mpc3 doctor` report it, instead of running a half-verified job.
"""
import subprocess
import time

import numpy as np
import pytest

from app.localcluster import REPO, LocalCluster, _env, party_argv, wait_healthy
from app.owner import share_transformer
from conftest import mpc3_cli
from net import config as cconf
from net.client.failures import ClusterError, JobFailed
from net.proto import mpc3_pb2 as pb
from protocols import model as M
from protocols.jobs import PRODUCTION

S = pb.JobStatusReply
COMMON = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
              attn_norm="mean", norm_first=True, max_len=16)
ARCHS = {  # model id: (config, secret embeddings, permitted computations)
    "tr": (dict(arch="encoder-decoder", n_enc_layers=1, n_dec_layers=1, src_vocab=11,
                tgt_vocab=13), False, ["encoder", "translate"]),
    "clf": (dict(arch="encoder-classifier", n_enc_layers=1, src_vocab=11, n_classes=3), False,
            ["classify", "classify-argmax"]),
    "clf-s": (dict(arch="encoder-classifier", n_enc_layers=1, src_vocab=11, n_classes=3), True,
              ["classify-secret", "classify-argmax-secret"]),
    "lm": (dict(arch="decoder-only", n_dec_layers=1, tgt_vocab=13), False, ["generate"]),
    "lm-s": (dict(arch="decoder-only", n_dec_layers=1, tgt_vocab=13), True,
             ["generate-token"]),
    "enc": (dict(arch="encoder", n_enc_layers=1, src_vocab=11), False, ["embed"]),
    "enc-s": (dict(arch="encoder", n_enc_layers=1, src_vocab=11), True, ["embed-secret"]),
}
KINDS = {  # job kind: (model id, input name and shape, or None)
    "encoder": ("tr", ("X", (1, 3, 16))), "decode_open": ("tr", ("X", (1, 3, 16))),
    "classify": ("clf", ("X", (1, 3, 16))), "classify_argmax": ("clf", ("X", (1, 3, 16))),
    "classify_secret": ("clf-s", ("ONEHOT", (1, 3, 11))),
    "classify_argmax_secret": ("clf-s", ("ONEHOT", (1, 3, 11))),
    "lm_prefill": ("lm", ("X", (1, 3, 16))),
    "lm_prefill_token": ("lm-s", ("ONEHOT", (1, 3, 13))),
    "embed": ("enc", ("X", (1, 3, 16))), "embed_secret": ("enc-s", ("ONEHOT", (1, 3, 11))),
}
SESSIONS = {  # a session's opening kind: its step (input) and close kinds
    "decode_open": ("decode_step", ("Y", (1, 16)), "decode_close"),
    "lm_prefill": ("lm_step", ("Y", (1, 16)), "lm_close"),
    "lm_prefill_token": ("lm_step_token", ("ONEHOT", (1, 13)), "lm_close_token"),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("malicious"), peer_timeout=5.0,
                     security="malicious")
    c.start()
    try:
        for mid, (cfg, secret, permit) in ARCHS.items():
            mcfg = M.ModelConfig(**COMMON, **cfg).validate()
            share_transformer(c.cfg, mid, mcfg, M.random_weights(mcfg, 1), permit,
                              *c.creds("owner"), user=M.random_user(mcfg, 1),
                              secret_embeddings=secret)
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def _inputs(spec):
    name, shape = spec
    if name == "ONEHOT":
        ids = np.random.default_rng(0).integers(0, shape[-1], shape[:-1])
        return {name: np.eye(shape[-1], dtype=np.uint64)[ids]}, True
    return {name: np.random.default_rng(0).uniform(-1, 1, shape)}, False


def _settle(u, job_id, timeout=120.0) -> list:
    """Each party's final status of ``job_id``, waited for without cancelling anything."""
    out = []
    deadline = time.monotonic() + timeout
    for n in range(3):
        while True:
            st = u._call(n, "JobStatus", pb.JobRef(job_id=job_id))
            if st.state not in (S.QUEUED, S.RUNNING) or time.monotonic() > deadline:
                out.append(st)
                break
            time.sleep(0.1)
    return out


def _refused(u, kind, params=None):
    mid, spec = KINDS[kind]
    inputs, encoded = _inputs(spec)
    job_id = u.submit(mid, kind, inputs, params, encoded=encoded)
    for n, st in enumerate(_settle(u, job_id)):
        assert st.state == S.FAILED, (kind, n, S.State.Name(st.state), st.error)
        assert st.error.startswith(f"party {n}: job {job_id} refused: malicious mode:"), st.error
        assert "no verification yet" in st.error, st.error
    with pytest.raises(ClusterError) as err:            # nothing to fetch
        u.fetch(job_id)
    assert err.value.code.name == "FAILED_PRECONDITION" and "FAILED" in str(err.value)
    return job_id


def test_status_shows_the_mode(cluster):
    r = mpc3_cli("status", "--config", cluster.path)
    assert r.returncode == 0 and r.stdout.count("security=malicious") == 3, r.stdout + r.stderr


def test_every_production_kind_is_refused_and_the_parties_keep_serving(cluster):
    closes = {close for _, _, close in SESSIONS.values()}
    steps = {step for step, _, _ in SESSIONS.values()}
    assert set(KINDS) | steps | closes == set(PRODUCTION.names())   # a new kind: add it here
    with cluster.user() as u:
        for kind in KINDS:
            params = {"session": f"s-{kind}"} if kind in SESSIONS else None
            _refused(u, kind, params)
            if kind in SESSIONS:                         # the refused opening left no session
                step, spec, close = SESSIONS[kind]
                inputs, encoded = _inputs(spec)
                for k, x in ((step, inputs), (close, {})):
                    with pytest.raises(ClusterError) as err:
                        u.submit(KINDS[kind][0], k, x, {"session": f"s-{kind}"},
                                 encoded=encoded, allow_empty=not x)
                    assert err.value.code.name == "NOT_FOUND" and "session" in str(err.value)
        t0 = time.monotonic()
        _refused(u, "classify")                          # still serving, promptly
        assert time.monotonic() - t0 < 30
        with pytest.raises(JobFailed, match="no verification yet"):   # the client's view
            u.run("clf", "classify", {"X": np.zeros((1, 3, 16))})
    r = mpc3_cli("status", "--config", cluster.path)
    assert r.returncode == 0 and r.stdout.count("OK links") == 3, r.stdout + r.stderr


def test_a_party_in_another_mode_makes_every_party_refuse_jobs(cluster):
    """Party 2 restarted from a copy of cluster.toml saying semi-honest (last: it restarts
    party 2 as it was)."""
    other = cluster.dir / "cluster-semi.toml"
    other.write_text(cluster.path.read_text().replace('security = "malicious"\n', ""))
    assert cconf.load(other).security == "semi-honest"
    cluster.procs[2].terminate()
    cluster.procs[2].wait(10)
    with open(cluster.dir / "party-2-semi.log", "ab") as log:
        proc = subprocess.Popen(party_argv(other, 2), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=_env(), cwd=str(REPO),
                                start_new_session=True)
    try:
        assert wait_healthy(cluster.cfg, 120, [None, None, proc]) == []
        r = mpc3_cli("status", "--config", cluster.path)
        assert r.returncode == 1 and "security=semi-honest" in r.stdout, r.stdout
        assert "PROBLEM: the parties disagree on security modes" in r.stdout, r.stdout
        assert 'party 0 runs security = "malicious" but party 2 runs "semi-honest"' in r.stdout
        r = mpc3_cli("doctor", "--config", cluster.path, "--no-job")
        assert r.returncode != 0 and "the parties disagree on security modes" in \
            r.stdout + r.stderr, r.stdout + r.stderr
        with cluster.user() as u:
            with pytest.raises(ClusterError) as err:
                u.submit("clf", "classify", {"X": np.zeros((1, 3, 16))})
        assert err.value.code.name == "FAILED_PRECONDITION", err.value
        assert "every job is refused until all three parties use the same mode" in \
            str(err.value), err.value
    finally:
        proc.terminate()
        proc.wait(10)
        cluster.start_party(2)
        assert cluster.wait_healthy(120) == []
