"""Malicious mode over real party processes (`mpc3 party` on loopback, mTLS, a cluster.toml
with ``security = "malicious"``, net/party/malicious.py): `mpc3 status` shows the mode; every
production job kind - each session's opening, step and close included - runs with every
message verified and returns what a semi-honest cluster holding the same model returns
(within the fixed-point noise of two independent runs), and the parties stay healthy.
A party restarted with another mode makes every party refuse submissions in one line
naming both modes, and `mpc3 status` and `mpc3 doctor` report it, instead of running a half-verified job.
"""
import subprocess

import numpy as np
import pytest

from app.localcluster import REPO, LocalCluster, _env, party_argv, wait_healthy
from app.owner import share_transformer
from conftest import mpc3_cli
from net import config as cconf
from mpc3 import ring
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


def _start(directory, **config):
    c = LocalCluster(directory, peer_timeout=5.0, **config)
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
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("malicious"), security="malicious")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def semi(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("semi"))
    yield c
    c.stop()


def _inputs(spec):
    name, shape = spec
    if name == "ONEHOT":
        ids = np.random.default_rng(0).integers(0, shape[-1], shape[:-1])
        return {name: np.eye(shape[-1], dtype=np.uint64)[ids]}, True
    return {name: np.random.default_rng(0).uniform(-1, 1, shape)}, False


def _outputs(u, kind, inputs, params, encoded, allow_empty=False):
    mid = KINDS[kind][0] if kind in KINDS else next(
        KINDS[k][0] for k, (step, _, close) in SESSIONS.items() if kind in (step, close))
    job_id = u.submit(mid, kind, inputs, params, encoded=encoded, allow_empty=allow_empty)
    u.wait(job_id, timeout=600)
    return {k: ring.decode(v, u.frac) for k, v in u.fetch(job_id).items()}


def _same(kind, got, want):
    assert got.keys() == want.keys(), kind
    for name in want:
        assert got[name].shape == want[name].shape, (kind, name)
        err = np.abs(got[name] - want[name]).max(initial=0)
        assert err < 2e-2, (kind, name, err)       # two runs' fixed-point noise


def test_status_shows_the_mode(cluster):
    r = mpc3_cli("status", "--config", cluster.path)
    assert r.returncode == 0 and r.stdout.count("security=malicious") == 3, r.stdout + r.stderr


def test_every_production_kind_runs_verified_with_the_semi_honest_result(cluster, semi):
    closes = {close for _, _, close in SESSIONS.values()}
    steps = {step for step, _, _ in SESSIONS.values()}
    assert set(KINDS) | steps | closes == set(PRODUCTION.names())   # a new kind: add it here
    failed = []

    def both(kind, inputs, params, encoded, allow_empty=False):
        try:
            _same(kind, _outputs(u, kind, inputs, params, encoded, allow_empty),
                  _outputs(v, kind, inputs, params, encoded, allow_empty))
        except (JobFailed, AssertionError) as e:
            failed.append(f"{kind}: {e}")
    with cluster.user() as u, semi.user() as v:
        for kind in KINDS:
            params = {"session": f"s-{kind}"} if kind in SESSIONS else None
            inputs, encoded = _inputs(KINDS[kind][1])
            both(kind, inputs, params, encoded)
            if kind in SESSIONS and not (failed and failed[-1].startswith(kind + ":")):
                step, spec, close = SESSIONS[kind]
                inputs, encoded = _inputs(spec)
                for k, x in ((step, inputs), (close, {})):
                    both(k, x, params, encoded, allow_empty=not x)
    assert not failed, "\n".join(failed)
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
