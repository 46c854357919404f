"""Headless encoder (arch encoder: BertModel, sentence-transformers): secure sentence
embeddings against the float64 reference for every pool x normalize, measured traffic against
the declared cost, the pooling and normalization kernels alone (odd lengths, norms across
sqrt_inv's range), the production job kind ``embed`` and calibration.

Shapes: B=3, S=7, d=16, h=2, r=8, d_ff=32, 2 layers. Bounds: 2e-3 absolute on the
embeddings (unnormalized: the encoder's LayerNorm-scale rows, error ~1e-4 measured; the
pooling adds <= 1 ulp (mean) or 2^-12 per tournament level (max)); normalized rows
additionally cosine >= 1 - 1e-6 with the reference (normalization errs by a common factor of
the row, |delta| <= 2.5e-4 + 2^-17 (1 / n2 + sqrt(n2)): measured < 1e-4 for n2 in
[2^-10, 2^11], 4.9e-4 at 2^14)."""
import numpy as np
import pytest

from conftest import run_job, share, share_inputs, value
from mpc3.party import RingConfig
from net.party.inproc import InprocParties
from protocols.calibration import calibrate as C
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks import sentence as SE
from helpers import shadow_run as SR
TOL = 2e-3
POOLS = [(pool, norm) for pool in ("mean", "cls", "max") for norm in (False, True)]


def enc_cfg(**kw):
    base = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                attn_norm="mean", norm_first=False, max_len=12, arch="encoder",
                n_enc_layers=2, src_vocab=11, attention="softmax", attn_bias=True,
                ffn_act="gelu")
    return M.ModelConfig(**{**base, **kw}).validate()


def cosine(a, b):
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("pool,normalize", POOLS)
def test_embed_matches_reference_and_declared_cost(run, rng, pool, normalize):
    cfg = enc_cfg(pool=pool, normalize=normalize)
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (3, 7, 16))
    res = run(lambda p, s, xs: SE.embed_sentence(p, cfg, s, xs), SM.share_model(cfg, w),
              share(x))
    got, ref = value(res), M.ref_embed(cfg, w, x)
    assert got.shape == (3, 16)
    assert np.max(np.abs(got - ref)) < TOL
    if normalize:
        assert np.min(cosine(got, ref)) > 1 - 1e-6
        assert np.allclose(np.linalg.norm(ref, axis=-1), 1)
    run.assert_cost(SE.cost_embed_sentence(RingConfig(), cfg, 3, 7))


@pytest.mark.parametrize("norm_first,attention", [(True, "relu-performer"),
                                                  (False, "power-softmax")])
def test_embed_other_stacks(run, rng, norm_first, attention):
    cfg = enc_cfg(norm_first=norm_first, attention=attention, attn_bias=False,
                  ffn_act="relu", pool="max", normalize=True)
    w = M.random_weights(cfg, 3)
    x = rng.uniform(-1, 1, (2, 5, 16))
    res = run(lambda p, s, xs: SE.embed_sentence(p, cfg, s, xs), SM.share_model(cfg, w),
              share(x))
    assert np.max(np.abs(value(res) - M.ref_embed(cfg, w, x))) < TOL
    run.assert_cost(SE.cost_embed_sentence(RingConfig(), cfg, 2, 5))


@pytest.mark.parametrize("S", [1, 2, 5, 8])
def test_max_pool_tournament(run, rng, S):
    h = rng.uniform(-50, 50, (2, S, 6))
    h[0, :, 0] = 3.0                                  # ties
    res = run(lambda p, hs: SE.max_pool_a(p, hs), share(h))
    assert np.max(np.abs(value(res) - h.max(axis=1))) < 2e-4 * max(1, np.ceil(np.log2(S)))
    run.assert_cost(SE.cost_max_pool(RingConfig(), 2, S, 6))


@pytest.mark.parametrize("pool,S", [("mean", 1), ("mean", 9), ("mean", 64), ("cls", 9)])
def test_pool_without_normalize(run, rng, pool, S):
    cfg = enc_cfg(pool=pool)
    h = rng.uniform(-4, 4, (3, S, 16))
    res = run(lambda p, hs: SE.pool_a(p, cfg, hs), share(h))
    want = h.mean(axis=1) if pool == "mean" else h[:, 0]
    assert np.max(np.abs(value(res) - want)) < 3 * 2.0 ** -18
    run.assert_cost(SE.cost_pool(RingConfig(), cfg, 3, S))


@pytest.mark.parametrize("K", [0, 3, 9])
def test_normalize_across_norms(run, rng, K):
    """Rows whose n2 = ||e||^2 / 4^K spans sqrt_inv's range with the calibration's margin
    (2^-10 .. 2^14, while ||e||^2 stays below the product limit 2^26 / 4): the direction is
    kept (cosine), the norm is 1 within 2.5e-4 + 2^-17 (1 / n2 + sqrt(n2)) - sqrt_inv's
    relative error, n2's truncation, sqrt_inv's 2 ulp - (+ 1 ulp per coordinate)."""
    d = 16
    n2 = np.array([v for v in 2.0 ** np.arange(-10, 15, 3) if v * 4.0 ** K < 2.0 ** 24])
    u = rng.normal(size=(n2.size, d))
    u[0] = 0.0
    u[0, 3] = -1.0                                    # one coordinate only
    e = u / np.linalg.norm(u, axis=-1, keepdims=True) * np.sqrt(n2 * 4.0 ** K)[:, None]
    res = run(lambda p, es: SE.normalize_a(p, es, K), share(e))
    got = value(res)
    want = e / np.linalg.norm(e, axis=-1, keepdims=True)
    delta = np.abs(np.linalg.norm(got, axis=-1) - 1)
    rel = 2.5e-4 + 2.0 ** -17 * (1 / n2 + np.sqrt(n2))
    assert np.all(delta <= rel + 2.0 ** -18 * np.sqrt(d)), (delta, n2)
    assert np.min(cosine(got, want)) > 1 - 1e-7
    assert np.all(np.max(np.abs(got - want), -1) <= rel + 2.0 ** -17)
    run.assert_cost(SE.cost_normalize(RingConfig(), n2.size, d, K))


def test_norm_scale_keeps_layernorm_rows_in_the_middle_of_sqrt_inv():
    for d in (16, 384, 768, 1024):
        for S in (1, 7, 128, 512):
            for pool in ("mean", "cls", "max"):
                K = SE.norm_scale(d, S, pool)
                ms = d * (S if pool == "mean" else 1) ** 2 / 4.0 ** K   # rows of mean square 1
                assert 0.5 <= ms <= 2, (d, S, pool, K)


# ------------------------------------------------------------------------ job kind ----
def test_embed_job_permissions_and_refusals(rng):
    cfg = enc_cfg(normalize=True)
    w = M.random_weights(cfg, 4)
    x = rng.uniform(-1, 1, (2, 5, 16))
    parties = InprocParties.for_model(cfg, w)                     # permits embed by default
    out, jobs = run_job(parties, "embed", x)
    assert set(out) == {"E"} and out["E"].shape == (2, 16)
    assert np.max(np.abs(out["E"] - M.ref_embed(cfg, w, x))) < TOL
    assert [e["layer"] for e in jobs[0].costs] == ["enc.0", "enc.1", "pool", "normalize"]
    measured = sum(e["bytes"] for e in jobs[0].costs)
    assert measured == SE.cost_embed_sentence(RingConfig(), cfg, 2, 5).bytes_per_party[0]
    for kind in ("classify", "encoder", "decode_open", "lm_prefill"):   # other archs' kinds
        with pytest.raises(ValueError, match=f"job kind '{kind}' does not apply to model "
                           "'inproc' \\(a encoder model\\)"):
            run_job(parties, kind, x)
    with pytest.raises(ValueError, match="width d = 16"):
        run_job(parties, "embed", rng.uniform(-1, 1, (2, 5, 12)))
    with pytest.raises(ValueError, match="too long"):
        run_job(parties, "embed", rng.uniform(-1, 1, (1, 13, 16)))
    with pytest.raises(ValueError, match="unknown parameters"):
        parties.run("embed", {"weight": "enc.0.attn.wq"}, share_inputs(x))
    none = InprocParties.for_model(cfg, w, permitted=[])
    with pytest.raises(ValueError, match="does not permit 'embed'.*permitted: nothing"):
        run_job(none, "embed", x)
    clf = enc_cfg(arch="encoder-classifier", n_classes=3)
    with pytest.raises(ValueError, match="'embed' does not apply.*encoder-classifier model"):
        run_job(InprocParties.for_model(clf, M.random_weights(clf)), "embed", x)


def test_owner_permits_embed():
    from app.owner import check_permit
    assert check_permit(None, "encoder") == ("embed",)
    with pytest.raises(ValueError, match=r"cannot permit \['classify'\]: an encoder model "
                       "offers embed"):
        check_permit(["classify"], "encoder")


# ---------------------------------------------------------------------- calibration ----
@pytest.mark.parametrize("pool,normalize", POOLS)
def test_its_calibration_runs_the_reference_and_calibrates(rng, pool, normalize):
    cfg = enc_cfg(pool=pool, normalize=normalize, norm_first=True)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    x = rng.normal(size=(2, 6, 16))
    SR.close(SR.embedding(cfg, w, x), M.ref_embed(cfg, w, x))
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    want = ({"pool_max"} if pool == "max" else set()) | \
        ({"norm_sumsq", "norm_sq", "norm_scale"} if normalize else set())
    assert set(cal.layers.get("pool", {})) == want
    assert set(cal.input_range) == {"X"}
    assert cal.input_range["X"] == C.embedding_range(cfg, user["embed.src"], user)


def test_calibration_refuses_out_of_range_embeddings(rng):
    cfg = enc_cfg(pool="max", normalize=True, norm_first=True)
    w, user = M.random_weights(cfg, 6), M.random_user(cfg, 6)
    samples = C.default_samples(cfg, user, rng)

    def scaled(f):
        hot = M.Weights(dict(w.tensors))
        for n in ("gamma", "beta"):
            hot[f"enc.final_ln.{n}"] = w[f"enc.final_ln.{n}"] * f
        return hot
    with pytest.raises(C.RangeError, match=r"^pool: normalize: squared norm of the pooled "
                       r"embedding / 4\^K .* falls to .*, below sqrt_inv's range .* rescale "
                       "the last LayerNorm's gamma and beta by one factor"):
        C.calibrate(cfg, scaled(1e-4), samples, user=user)
    with pytest.raises(C.RangeError, match="^pool: max pooling: spread max - min of a "
                       "coordinate .* above the limit 16384 of ReLU .* rescale the last "
                       "LayerNorm's gamma and beta"):
        C.calibrate(cfg, scaled(3e3), samples, user=user)
    C.calibrate(cfg, scaled(4.0), samples, user=user)   # normalized: any scale in range
