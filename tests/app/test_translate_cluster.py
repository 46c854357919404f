"""Secure translation over gRPC: three party processes (mTLS) on loopback, decode sessions."""
import time

import grpc
import numpy as np
import pytest

from mpc3 import ring
from app.localcluster import LocalCluster
from net.client.failures import ClusterError
from net.proto import mpc3_pb2 as pb
from app import translate as T
from protocols import model as M
from app import textdata as TD

pytestmark = pytest.mark.skipif(not TD.SHIPPED_MODEL.exists(), reason="no shipped model")


class Cluster(LocalCluster):
    def __init__(self, d):
        super().__init__(d, peer_timeout=5.0)
        self.start()

    def user(self, stem="user"):
        return super().user(stem, rpc_timeout=20)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from app.owner import share_transformer
    c = Cluster(tmp_path_factory.mktemp("translate"))
    c.mcfg, c.w, c.user_t, c.vocab = TD.load_shipped()
    try:
        share_transformer(c.cfg, "tr", c.mcfg, c.w, permit=["translate", "encoder"], user=c.user_t,
                          cert=c.dir / "certs" / "owner.pem",
                          key=c.dir / "certs" / "owner.key")
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def test_grpc_translation_equals_plaintext(cluster):
    texts = ["4096", "7010"]
    with cluster.user() as u:
        be = T.ClusterBackend(u, "tr")
        res, cost, pairs = T.translate_texts(be, cluster.mcfg, cluster.user_t, texts,
                                             plaintext_weights=cluster.w)
    assert [r.secure for r in res] == [TD.reference_translation(t) for t in texts]
    assert [r.secure for r in res] == [r.plaintext for r in res]
    same, total = T.token_agreement(pairs)
    assert same == total
    assert cost.rounds > 0 and all(b > 0 for b in cost.bytes_per_party)


def test_grpc_encoder_job_matches_float_reference(cluster):
    """The "encoder" job kind (what `mpc3 infer` runs) against protocols.model.ref_encoder."""
    cfg, w, ut = cluster.mcfg, cluster.w, cluster.user_t
    x = M.embed(cfg, ut["embed.src"], np.array([TD.encode_src("31415")]))
    with cluster.user() as u:
        out = u.run("tr", "encoder", {"X": x})
    (got,) = out.values()                      # run() decodes the checked, reconstructed output
    np.testing.assert_allclose(got, M.ref_encoder(cfg, w, x), atol=0.02)


def test_grpc_incremental_decoding_equals_plaintext_steps(cluster):
    cfg, w, ut = cluster.mcfg, cluster.w, cluster.user_t
    src = np.array([TD.encode_src("52003")])
    tgt = [cluster.vocab.bos] + TD.encode_tgt("fifty two thousand three")[:-1]
    x = M.embed(cfg, ut["embed.src"], src)
    ref = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x))
    with cluster.user() as u:
        be = T.ClusterBackend(u, "tr")
        session = T.Session(be, sid="inc-1")
        session.open(x)
        for t, tok in enumerate(tgt):
            y = M.embed(cfg, ut["embed.tgt"], np.array([[tok]]), offset=t)[:, 0]
            got = ring.decode(session.step(y))
            want = M.ref_decoder_step(cfg, w, ref, y)
            np.testing.assert_allclose(got, want, atol=0.05)
            assert M.output_logits(ut, got).argmax() == M.output_logits(ut, want).argmax()
        with pytest.raises(ClusterError) as err:      # only the owner may use it; to
            with cluster.user("user2") as other:         # others its id is simply unknown
                T.Session(T.ClusterBackend(other, "tr"), sid="inc-1").step(y)
        assert err.value.code == grpc.StatusCode.NOT_FOUND and "is unknown" in str(err.value)
        session.close()
        with pytest.raises(ClusterError, match="closed by its owner"):
            session.step(y)
    assert session.steps.layers.rows["dec.0"][3] == len(tgt)      # one entry per step


def test_grpc_clear_errors(cluster):
    cfg = cluster.mcfg
    with cluster.user() as u:
        with pytest.raises(ClusterError) as err:
            T.ClusterBackend(u, "no-such-model")
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        be = T.ClusterBackend(u, "tr")
        with pytest.raises(ClusterError, match="too long") as err:
            T.Session(be, sid="long-1").open(np.zeros((1, cfg.max_len + 4, cfg.d_model)))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(ClusterError, match="unknown on party"):
            T.Session(be, sid="never-opened").step(np.zeros((1, cfg.d_model)))
        with pytest.raises(ValueError, match="too long"):
            T.translate_texts(be, cfg, cluster.user_t, ["12345678901"])
        with pytest.raises(ClusterError, match="unknown parameters"):
            u.submit("tr", "encoder", {"X": np.zeros((1, 3, cfg.d_model))},
                     {"_session": 1})


def test_cli_translate(cluster, capsys):
    from app import cli
    c = cluster.dir / "certs"
    rc = cli.main(["translate", "--config", str(cluster.path), "--model-id", "tr",
                   "--cert", str(c / "user.pem"), "--key", str(c / "user.key"), "42"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip() == "42\tforty two"
    assert "token  3" in err and "rounds" in err and "MB sent" in err
    rc = cli.main(["translate", "--config", str(cluster.path), "--model-id", "nope",
                   "--cert", str(c / "user.pem"), "--key", str(c / "user.key"), "42"])
    assert rc == 2 and "unknown model 'nope'" in capsys.readouterr().err


def test_party_dying_mid_decoding_fails_cleanly(cluster):
    """Last test of the module: kills party 2 while a session is open."""
    cfg, ut = cluster.mcfg, cluster.user_t
    x = M.embed(cfg, ut["embed.src"], np.array([TD.encode_src("123")]))
    y = M.embed(cfg, ut["embed.tgt"], np.array([[cluster.vocab.bos]]))[:, 0]
    with cluster.user() as u:
        be = T.ClusterBackend(u, "tr", step_timeout=30)
        session = T.Session(be, sid="dies-1")
        session.open(x)
        session.step(y)
        cluster.procs[2].kill()
        cluster.procs[2].wait(10)
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as err:
            session.step(y)
        assert time.monotonic() - t0 < 20
        assert err.value.code in (grpc.StatusCode.UNAVAILABLE, None) or \
            "party 2" in str(err.value)
        for n in (0, 1):     # the survivors still answer: closing is local, no peer needed
            try:
                st = u._call(n, "SubmitJob", iter([pb.SubmitChunk(
                    job_id=f"after-{n}", model_id="tr", upload_id=be.info.upload_id,
                    kind="decode_close", params_json='{"session": "dies-1"}')]))
                assert st.state == pb.JobStatusReply.DONE
            except ClusterError as exc:       # or it was dropped with the failed step
                assert "dropped after a failed job" in str(exc)
    for p in cluster.procs[:2]:
        assert p.poll() is None                    # the survivors keep serving

