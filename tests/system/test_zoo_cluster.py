"""The new architectures over real party processes (`mpc3 party` on loopback, mTLS): an
encoder classifier (logits, or only the arg-max class when that is all its owner permits), a
decoder-only LM (`mpc3 generate`, streamed) and an encoder-decoder with softmax attention
(`mpc3 translate`), shared with `share-model`, used with the CLI, against the float64
reference; the new production kinds reveal no linear function of a
chosen weight."""

import grpc
import numpy as np
import pytest

from app.localcluster import LocalCluster
from mpc3 import ring
from conftest import mpc3_cli
from app.owner import share_transformer
from net.client.failures import ClusterError
from protocols import model as M

C = grpc.StatusCode
COMMON = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
              attn_norm="mean", norm_first=True, max_len=16)
PROMPT = "hi"


def clf_cfg():
    return M.ModelConfig(**COMMON, arch="encoder-classifier", n_enc_layers=2, src_vocab=11,
                         n_classes=5).validate()


def lm_cfg():
    return M.ModelConfig(**COMMON, arch="decoder-only", n_dec_layers=2,
                         tgt_vocab=257).validate()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    c = LocalCluster(d, peer_timeout=5.0)
    c.start()
    c.clf, c.lm = clf_cfg(), lm_cfg()
    c.clf_w, c.clf_u = M.random_weights(c.clf, 1), M.random_user(c.clf, 1)
    c.lm_w, c.lm_u = M.random_weights(c.lm, 2), M.random_user(c.lm, 2)
    c.lm_file = d / "lm.npz"
    M.save_model(c.lm_file, c.lm, c.lm_w, c.lm_u)
    M.save_model(d / "clf.npz", c.clf, c.clf_w, c.clf_u)
    try:
        r = mpc3_cli("share-model", d / "clf.npz", "--config", c.path, "--model-id", "clf")
        assert r.returncode == 0, r.stderr
        share_transformer(c.cfg, "clf-argmax", c.clf, c.clf_w, ["classify-argmax"],
                          *c.creds("owner"), user=c.clf_u)
        r = mpc3_cli("share-model", c.lm_file, "--config", c.path, "--model-id", "lm")
        assert r.returncode == 0, r.stderr
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def _x(c, rows=2, S=6, seed=0):
    ids = np.random.default_rng(seed).integers(0, c.clf.src_vocab, (rows, S))
    return M.embed(c.clf, c.clf_u["embed.src"], ids)


def test_cli_classify_prints_logits_and_argmax_only_when_permitted(zoo, tmp_path):
    x = _x(zoo)
    np.save(tmp_path / "x.npy", x)
    ref = M.ref_classify(zoo.clf, zoo.clf_w, x)
    r = mpc3_cli("infer", "--config", zoo.path, "--model-id", "clf", "--kind", "classify",
              "--input", tmp_path / "x.npy")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    for row, line in enumerate(lines):
        assert line.startswith(f"row {row}: class {int(ref[row].argmax())} logits [")
        got = np.array(line.split("[", 1)[1].rstrip("]").split(), dtype=float)
        assert np.abs(got - ref[row]).max() < 1e-2
    M.save_model(tmp_path / "clf.npz", zoo.clf, zoo.clf_w, zoo.clf_u)
    r = mpc3_cli("infer", "--config", zoo.path, "--model-id", "clf", "--kind", "classify",
              "--model", tmp_path / "clf.npz", "--ids", "1,2,3")    # embedded by the client
    want = M.ref_classify(zoo.clf, zoo.clf_w, M.embed(zoo.clf, zoo.clf_u["embed.src"],
                                                      np.array([[1, 2, 3]])))
    assert r.returncode == 0 and r.stdout.startswith(f"row 0: class {int(want.argmax())} "), \
        r.stderr
    r = mpc3_cli("infer", "--config", zoo.path, "--model-id", "clf", "--kind",
              "classify_argmax", "--input", tmp_path / "x.npy")
    assert r.returncode == 2 and "does not permit 'classify-argmax'" in r.stderr, r.stderr
    r = mpc3_cli("infer", "--config", zoo.path, "--model-id", "clf-argmax", "--kind",
              "classify_argmax", "--input", tmp_path / "x.npy")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [f"row {i}: class {int(ref[i].argmax())}"
                                             for i in range(2)]
    with zoo.user() as u:                     # logits of an argmax-only model: forbidden
        with pytest.raises(ClusterError) as err:
            u.run("clf-argmax", "classify", {"X": x})
        assert err.value.code == C.PERMISSION_DENIED
        with pytest.raises(ClusterError) as err:                     # wrong arch
            u.run("lm", "classify", {"X": x})
        assert err.value.code == C.PERMISSION_DENIED and "decoder-only model" in str(err.value)
        with pytest.raises(ClusterError) as err:                     # no weight picking
            u.run("clf", "classify", {"X": x}, {"weight": "head.w"})
        assert err.value.code == C.INVALID_ARGUMENT


def test_cli_generate_streams_and_agrees_with_plaintext(zoo):
    ref = M.greedy_generate(zoo.lm, zoo.lm_w, zoo.lm_u, np.array([list(PROMPT.encode())]), 6,
                            eos=256)[0]
    r = mpc3_cli("generate", "--config", zoo.path, "--model-id", "lm", "--model", zoo.lm_file,
              "--tokens", 6, PROMPT)
    assert r.returncode == 0, r.stderr
    assert f"tokens: {ref}" in r.stderr                      # token agreement 1.0 over gRPC
    assert "per token" in r.stderr
    assert r.stdout.rstrip("\n") == bytes(ref).decode("utf-8", errors="replace")
    r = mpc3_cli("share-model", zoo.lm_file, "--config", zoo.path, "--model-id", "lm2",
              "--permit", "translate")
    assert r.returncode == 2 and "cannot permit ['translate']: a decoder-only model offers " \
        "generate" in r.stderr, r.stderr


def test_new_kinds_are_no_linear_function_of_their_input(zoo):
    """Probes through classify and lm_prefill/lm_step: no linear read-out explains the
    outputs, and no output block equals a weight."""
    from app import translate as T
    rng = np.random.default_rng(5)
    X = rng.uniform(-1.5, 1.5, (96, 2, 16))         # more probes than features (32 + 1)
    with zoo.user() as u:
        logits = u.run("clf", "classify", {"X": X})["logits"]
        be = T.ClusterBackend(u, "lm")
        P = rng.uniform(-1.5, 1.5, (96, 2, 16))
        with T.Session(be, T.LM) as session:
            h0 = ring.decode(session.open(P)["H"])
            ys = rng.uniform(-1.5, 1.5, (96, 16))
            h1 = ring.decode(session.step(ys))
    for inp, out in ((X.reshape(96, -1), logits), (P.reshape(96, -1), h0), (ys, h1)):
        A = np.hstack([inp, np.ones((inp.shape[0], 1))])
        fit, *_ = np.linalg.lstsq(A, out, rcond=None)
        resid = np.linalg.norm(A @ fit - out) / np.linalg.norm(out - out.mean(0))
        assert resid > 0.1, resid
    for w in [t for t in (*zoo.clf_w.tensors.values(), *zoo.lm_w.tensors.values())
              if t.ndim == 2]:
        for cand in (w, w.T):
            for out in (logits, h0, h1):
                if cand.shape == out.shape:
                    assert np.abs(out - cand).max() > 1e-2


def _kv_lm(zoo, attention):
    """A random softmax-style LM file (seed 3: top-2 logit margin > 1e-2 along the plaintext
    greedy path of PROMPT) and that path's 6 tokens."""
    from helpers.cases import top2_gap
    cfg = M.ModelConfig(**COMMON, arch="decoder-only", n_dec_layers=2, tgt_vocab=257,
                        attention=attention).validate()
    w, user = M.random_weights(cfg, 3), M.random_user(cfg, 3)
    path = zoo.lm_file.parent / f"lm-{attention}.npz"
    M.save_model(path, cfg, w, user)
    prompt = np.array([list(PROMPT.encode())])
    ref = M.greedy_generate(cfg, w, user, prompt, 6, eos=256)
    assert top2_gap(cfg, w, user, prompt, ref) > 1e-2
    return path, ref[0]


def _rounds_per_token(stderr: str) -> int:
    return int(stderr.split(" rounds per token")[0].rsplit(" ", 1)[1])


@pytest.mark.parametrize("attention", ["softmax", "power-softmax", "sigma-relu"])
def test_cli_generate_with_a_kv_cache_lm(zoo, attention):
    """A random softmax-style LM (secret KV cache, protocols.layers.kv_cache) shared with
    share-model (calibrated) and run with `mpc3 generate` over party processes: the tokens
    of the plaintext greedy decoding."""
    path, ref = _kv_lm(zoo, attention)
    r = mpc3_cli("share-model", path, "--config", zoo.path, "--model-id", f"lm-{attention}")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("generate", "--config", zoo.path, "--model-id", f"lm-{attention}", "--model",
                 path, "--tokens", 6, PROMPT)
    assert r.returncode == 0, r.stderr
    assert f"tokens: {ref}" in r.stderr and "per token" in r.stderr


def test_cli_share_model_picks_the_softmax_form(zoo):
    """share-model --softmax max-free shares a softmax LM in Privformer's form (its random
    scores stay inside exp's range, so calibration accepts it): the same tokens as the
    default max-subtracted form, in fewer rounds per token; a model without softmax
    attention refuses the option."""
    path, ref = _kv_lm(zoo, "softmax")
    rounds = {}
    for form in ("max", "max-free"):
        r = mpc3_cli("share-model", path, "--config", zoo.path, "--model-id", f"lm-sm-{form}",
                     "--softmax", form)
        assert r.returncode == 0, r.stderr
        r = mpc3_cli("generate", "--config", zoo.path, "--model-id", f"lm-sm-{form}",
                     "--model", path, "--tokens", 6, PROMPT)
        assert r.returncode == 0 and f"tokens: {ref}" in r.stderr, r.stderr
        rounds[form] = _rounds_per_token(r.stderr)
    assert rounds["max-free"] < rounds["max"]
    r = mpc3_cli("share-model", zoo.lm_file, "--config", zoo.path, "--model-id", "lm-nope",
                 "--softmax", "max-free")
    assert r.returncode != 0 and "--softmax applies to softmax attention" in r.stderr


def test_cli_translate_with_a_softmax_translator(zoo):
    """An encoder-decoder with softmax attention (its decode steps: a secret KV cache of the
    target prefix, the cross attention against the source's K, V kept since decode_open)
    shared with share-model (calibrated) and run with `mpc3 translate` over party processes:
    the plaintext greedy translation (seed 4: top-2 logit margin > 1e-2 along the path)."""
    from app import textdata as TD
    v = TD.VOCAB
    cfg = M.ModelConfig(**COMMON, n_enc_layers=1, n_dec_layers=2, src_vocab=len(v.src),
                        tgt_vocab=len(v.tgt), attention="softmax").validate()
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    path = zoo.lm_file.parent / "ed-softmax.npz"
    M.save_model(path, cfg, w, user)
    src = np.array([TD.encode_src("4096")])
    want = M.greedy_decode(cfg, w, user, src, v.bos, v.eos, v.max_tgt_len)[0]
    st = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, M.embed(cfg, user["embed.src"], src)))
    tok, gaps = v.bos, []
    for t in range(min(len(want) + 1, v.max_tgt_len)):
        y = M.embed(cfg, user["embed.tgt"], np.array([[tok]]), t)[:, 0]
        logits = M.output_logits(user, M.ref_decoder_step(cfg, w, st, y))[0]
        top = np.sort(logits)[-2:]
        gaps.append(top[1] - top[0])
        tok = int(logits.argmax())
    assert min(gaps) > 1e-2 and len(set(want)) >= 3
    r = mpc3_cli("share-model", path, "--config", zoo.path, "--model-id", "ed-softmax")
    assert r.returncode == 0, r.stderr
    r = mpc3_cli("translate", "--config", zoo.path, "--model-id", "ed-softmax", "--model", path,
              "--quiet", "4096")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"4096\t{TD.decode_tgt(want, v)}"
    assert "rounds" in r.stderr
