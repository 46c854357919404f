"""Calibration ("right or refused"): protocols.calibration.calibrate, protocols.calibration.shadow.

Small shapes (d_model 12-16, 1-2 layers, max_len 6-8) except the shipped translator
(d_model 64, 2 + 2 layers). Secure runs use three in-process parties; their outputs are
compared with the float64 reference at 2e-3 (as in test_protocols_stack).
"""
import json

import functools

import conftest
import numpy as np
import pytest
from conftest import share, value
from helpers.kernel_probe import Probe, compare, reached
from helpers import shadow_run as SR
from helpers.cases import fit_batchnorm

from mpc3.kernels import activations, arith, convert, fxp, silu
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties
from protocols.calibration import calibrate as C
from protocols.stacks import decoder as D
from protocols.stacks import schedule as S
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.calibration import shadow as SH
from app import textdata as TD
from protocols.stacks.encoder import encoder
from protocols.calibration.site_catalog import SITES, site_range

TOL = 2e-3
#: probe vs calibration: the secure run's fixed-point error is ~1e-4 relative at every site
#: (measured <= 4e-4 after LayerNorms); 1% leaves room and still catches a wrong scale.
PROBE_RTOL = 1e-2


make_cfg = functools.partial(conftest.make_cfg, d_model=12, n_heads=2, d_head=6, n_features=6,
                             d_ff=24, src_vocab=9, tgt_vocab=9, max_len=6)


def secure_run(cfg, w, x, y=None, block=None, fold=True, fuse=D.DEFAULT_FUSE,
               raw_wo=frozenset(), fold_wo=frozenset()):
    """Secure encoder on x (B, S, d), then one decode step per row of y (B, T, d)."""
    sh = SM.share_model(cfg, w, fold_omega=fold)

    def fn(p, s, xs, ys):
        enc = encoder(p, cfg, s, xs)
        if ys is None:
            return enc, []
        st = D.DecodeState.start(p, cfg, s, enc, block=block, fuse=fuse,
                                 schedule=S.Schedule(raw_wo=raw_wo, fold_wo=fold_wo))
        return enc, [D.decoder_step(p, cfg, s, st, ys[:, t]) for t in range(ys.shape[1])]

    xs = share(x)
    ys = share(y) if y is not None else [None] * 3
    res = run_parties(fn, [(sh[i], xs[i], ys[i]) for i in range(3)], parties=make_parties())
    enc = value([r[0] for r in res])
    steps = [value([r[1][t] for r in res]) for t in range(len(res[0][1]))]
    return enc, (np.stack(steps, 1) if steps else None)


# ------------------------------------------------------------------ the trace ----
@pytest.mark.parametrize("norm_first,fold", [(False, True), (True, False)])
@pytest.mark.parametrize("fuse", [D.DEFAULT_FUSE, D.FUSIONS])
def test_the_calibration_runs_the_reference(norm_first, fold, fuse, monkeypatch):
    """The calibration's backend (the stacks on a shadow party) computes the float64
    reference within fixed point, and records the sites the session's fusions decide."""
    cfg = make_cfg(norm_first=norm_first)
    w, rng = M.random_weights(cfg, 1), np.random.default_rng(2)
    x, y = rng.normal(size=(2, 5, 12)), rng.normal(size=(2, 6, 12))
    enc, steps = SR.translator(cfg, w, x, y, fuse, fold, block=2)
    SR.close(enc, M.ref_encoder(cfg, w, x))
    SR.close(steps, M.ref_decoder(cfg, w, y, enc))
    monkeypatch.setattr(D, "DEFAULT_FUSE", fuse)       # the session the calibration runs
    rec = SH.trace_translator(cfg, w, [x], [y], fold_omega=fold, block=2)
    # a decode step may form a LayerNorm's next projection inside it (decoder.ln_fusions):
    # then the projection's layer records no product of its own
    own_self = "self" not in fuse or not norm_first
    # (the self attention's 1/n rides in W^O's truncation: no "rowscale" site of its own;
    # "wo_raw": the normalised product, for schedule.deferred_wo)
    assert set(rec.values["dec.0.self"]) == {"features", "kv", "scores", "out",
                                                "wo", "wo_raw"} | (set() if fold else {"omega"}) \
        | ({"proj"} if own_self else set())
    ln_ffn = "dec.0.ln3" if norm_first else "dec.0.ln2"
    assert ("w1" in rec.values["dec.0.ffn"]) == ("ffn" not in fuse)
    assert ("w1" not in rec.values["dec.0.ffn"]) == ("lnw1" in rec.values[ln_ffn])
    # LN1 forms the cross attention's features (post-LN) or Q, K, V (pre-LN)
    assert ("lnproj" in rec.values["dec.0.ln1"]) == ("self" in fuse if norm_first
                                                        else "cross" in fuse)


# ------------------------------------------------------------- (a) fine model ----
def test_fine_model_passes_and_secure_output_is_right():
    cfg = make_cfg(max_len=8)
    w, user = M.random_weights(cfg, 3), M.random_user(cfg, 3)
    rng = np.random.default_rng(4)
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, rng), user=user)
    assert cal.fills()[0][0] <= 1.0
    x = M.embed(cfg, user["embed.src"], rng.integers(0, 9, (2, 7)))
    y = M.embed(cfg, user["embed.tgt"], rng.integers(0, 9, (2, 8)))
    C.check_input(cal, "X", x)
    C.check_input(cal.to_dict(), "Y", y[:, 0])
    enc, steps = secure_run(cfg, w, x, y, block=cal.decode_block)
    enc_ref = M.ref_encoder(cfg, w, x)
    assert np.max(np.abs(enc - enc_ref)) < TOL
    assert np.max(np.abs(steps - M.ref_decoder(cfg, w, y, enc_ref))) < TOL


# ------------------------------------------------------ (b) the measured failures ----
shipped = pytest.mark.skipif(not TD.SHIPPED_MODEL.exists(), reason="no shipped model")


@shipped
def test_inputs_five_times_too_large_are_refused():
    """Measured: the shipped translator's encoder on 5x its embeddings (max |x| ~ 15-17)
    returns garbage (error ~1e8) - LayerNorm's variance leaves sqrt_inv's range."""
    cfg, w, user, vocab = TD.load_shipped()
    cal = C.calibrate(cfg, w, TD.calibration_samples(cfg, w, user, n=32), user=user)
    x = M.embed(cfg, user["embed.src"], np.array([TD.encode_src("0"), TD.encode_src("1")]))
    C.check_input(cal, "X", x)
    with pytest.raises(C.RangeError, match=r"input X: max \|x\| = 15\.\d+ is outside the "
                                           r"model's calibrated input range \[-3\.51"):
        C.check_input(cal, "X", 5 * x)
    y = M.embed(cfg, user["embed.tgt"], np.full((2, cfg.max_len), vocab.bos))
    with pytest.raises(C.RangeError, match=r"^enc\.0\.ln1: LayerNorm .* reaches .* above "):
        C.calibrate(cfg, w, C.Samples([5 * x], [y]), margin=1.0)
    enc5, _ = secure_run(cfg, w, 5 * x)                      # not a false alarm:
    assert np.max(np.abs(enc5 - M.ref_encoder(cfg, w, 5 * x))) > 1e3
    enc1, _ = secure_run(cfg, w, x)                          # genuine inputs are right
    assert np.max(np.abs(enc1 - M.ref_encoder(cfg, w, x))) < TOL


def test_large_attn_c_is_refused():
    """Scaled-down Privformer failure: attn_c passes validation but makes the attention output,
    and so LayerNorm's variance, leave sqrt_inv's range; the secure output is garbage."""
    cfg = make_cfg(d_model=16, d_head=8, n_features=8, d_ff=32, n_enc_layers=1, n_dec_layers=0,
                   attn_c=4.0, attn_norm="const", src_vocab=11, tgt_vocab=11, max_len=8)
    w, user = M.random_weights(cfg, 3), M.random_user(cfg, 3)
    samples = C.default_samples(cfg, user, np.random.default_rng(0))
    with pytest.raises(C.RangeError) as err:
        C.calibrate(cfg, w, samples, user=user)
    msg = str(err.value)
    lo, hi = fxp.SQRT_INV_RANGE
    assert msg.startswith("enc.0.ln1: LayerNorm variance+eps reaches 9.41e+05, above sqrt_inv's "
                          f"range [{lo:.2g}, {hi:.6g}]"), msg
    assert "lower attn_c" in msg
    x = samples.X[0][:1]
    enc, _ = secure_run(cfg, w, x)
    assert np.max(np.abs(enc - M.ref_encoder(cfg, w, x))) > 1e3
    C.calibrate(cfg.__class__(**{**cfg.to_dict(), "attn_c": 1 / 64}), w, samples, user=user)


def test_margin_refuses_values_near_a_limit():
    """FFN hidden values of ~3e3 are inside relu's range 2^14 but not within 2^14 / 4."""
    cfg = make_cfg(n_dec_layers=0)
    w = M.random_weights(cfg, 0)
    w["enc.0.ffn.b1"] = np.full(24, 5000.0)
    w["enc.0.ffn.w2"] = w["enc.0.ffn.w2"] * 1e-4          # keep the rest of the layer in range
    s = C.Samples([np.random.default_rng(0).normal(size=(2, 6, 12))])
    assert C.calibrate(cfg, w, s, margin=1.0).layers["enc.0.ffn"]["hidden"] < 2 ** 14
    with pytest.raises(C.RangeError, match=r"enc\.0\.ffn: FFN hidden x W1 \+ b1 reaches "
                                           r"5(\.\d+)?e\+03, above the limit 16384 of ReLU with "
                                           r"safety margin 4 \(max 4\.1e\+03\); rescale W1"):
        C.calibrate(cfg, w, s)


def test_small_variance_with_tiny_eps_is_refused():
    """ln_eps = 1e-5 (below sqrt_inv's 2^-10) and rows of constant value: var + eps = 1e-5
    (1.1e-5 as the parties compute it: E[x^2] - mu^2 of truncated products, 1/12 encoded)."""
    cfg = make_cfg(n_dec_layers=0, ln_eps=1e-5, norm_first=True)
    w = M.random_weights(cfg, 0)
    s = C.Samples([np.ones((1, 6, 12))])
    with pytest.raises(C.RangeError, match=r"^enc\.0\.ln1: LayerNorm variance\+eps falls to "
                                           r"1(\.\d+)?e-05, below sqrt_inv's range .* raise "
                                           r"ln_eps"):
        C.calibrate(cfg, w, s)
    C.calibrate(cfg.__class__(**{**cfg.to_dict(), "ln_eps": M.DEFAULT_LN_EPS}), w, s)


# -------------------------------------------------------- (c) completeness probe ----
PRE_LN = dict(d_model=16, d_head=8, n_features=8, d_ff=32, n_enc_layers=1, n_dec_layers=1,
              attn_norm="const", norm_first=True)


@pytest.mark.parametrize("kw,fold,block,unprobed,fuse", [
    (dict(), True, 2, "scores", D.DEFAULT_FUSE),   # d=12 (1/d separate), mean, post-LN, kv
    (dict(), True, 2, "scores", D.FUSIONS),        # every LayerNorm forms its next projection
    (PRE_LN, False, 3, "kv", D.DEFAULT_FUSE),      # pre-LN, unfolded, qk order
    (PRE_LN, False, 3, "kv", D.FUSIONS),
    # seed 002's BatchNorm (site bn) and AERO's linear FFN, shared fused (site w1 = x W1 W2)
    (dict(norm="batchnorm", ffn_bn=True), True, 2, "scores", D.FUSIONS),
    (dict(ffn_bn=True), True, 2, "scores", D.FUSIONS),       # folded BN-FFN inside the LN
    ({**PRE_LN, "norm": "batchnorm", "ffn_act": "none"}, True, 3, "kv", D.DEFAULT_FUSE),
    # no normalization: a Performer stack is cubic in its input, so small attn_c
    ({**PRE_LN, "norm": "none", "attn_norm": "mean", "attn_c": 0.05}, False, 3, "kv",
     D.DEFAULT_FUSE),
    ({**PRE_LN, "ffn_act": "none"}, True, 3, "kv", D.FUSIONS),   # fused W1 W2 inside the LN
])
def test_probe_secure_run_matches_calibration(monkeypatch, kw, fold, block, unprobed, fuse):
    """Every value a SECURE encoder + decode-step run hands to a range-limited kernel is a
    calibrated site, and the calibration recorded the same largest value (PROBE_RTOL)."""
    monkeypatch.setattr(D, "DEFAULT_FUSE", fuse)        # what the calibration traces
    cfg = make_cfg(**kw)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    rng = np.random.default_rng(1)
    x = M.embed(cfg, user["embed.src"], rng.integers(0, 9, (2, 6)))
    y = M.embed(cfg, user["embed.tgt"], rng.integers(0, 9, (2, cfg.max_len)))
    if cfg.norm == "batchnorm":
        fit_batchnorm(cfg, w, x, y)
    cal = C.calibrate(cfg, w, C.Samples([x], [y]), margin=1.0, fold_omega=fold,
                      decode_block=block)
    every = frozenset(f"dec.{i}.cross" for i in range(cfg.n_dec_layers))
    folds = bool(D.folded_layers(cfg, fuse, every))        # FUSIONS: W^O folded at open
    probe = Probe(monkeypatch)
    secure_run(cfg, w, x, y, block=block, fold=fold, fuse=fuse, fold_wo=every)
    monkeypatch.undo()
    got = probe.values()
    compare(got, cal.layers, PROBE_RTOL)
    extra = {(layer, s) for layer, row in cal.layers.items() for s in row} - \
        reached(got, cfg.n_dec_layers)
    # wo_raw: what a step that defers o W^O's truncation would form (not this run); kvwo:
    # the cross attention's folded W^O, formed when the session folds it - whose steps then
    # form o W^O without o (site out)
    assert extra == {(f"enc.{i}.attn", unprobed) for i in range(cfg.n_enc_layers)} | \
        {(f"dec.{i}.{k}", "wo_raw") for i in range(cfg.n_dec_layers) for k in ("self", "cross")} \
        | {(f"dec.{i}.cross", "out" if folds else "kvwo") for i in range(cfg.n_dec_layers)}


def test_probe_deferred_wo_matches_calibration(monkeypatch):
    """A decode step with every o W^O deferred (schedule.deferred_wo) forms exactly the
    calibrated ``wo_raw`` values, and its other products stay within their calibration."""
    cfg = make_cfg()
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    rng = np.random.default_rng(1)
    x = M.embed(cfg, user["embed.src"], rng.integers(0, 9, (2, 6)))
    y = M.embed(cfg, user["embed.tgt"], rng.integers(0, 9, (2, cfg.max_len)))
    cal = C.calibrate(cfg, w, C.Samples([x], [y]), margin=1.0, decode_block=2)
    every = S.deferred_wo(cfg, cal.to_dict(), RingConfig())
    assert len(every) == 2 * cfg.n_dec_layers
    probe = Probe(monkeypatch)
    secure_run(cfg, w, x, y, block=2, raw_wo=every)
    monkeypatch.undo()
    got = probe.values()
    compare(got, cal.layers, PROBE_RTOL)
    assert {k for k in reached(got, cfg.n_dec_layers) if k[1] == "wo_raw"} == \
        {(lay, "wo_raw") for lay in every}


def test_site_limits_are_the_kernels_own():
    """Sites read their ranges from the kernels' named limits at run time."""
    assert {s.kernel for s in SITES.values()} == {"product", "relu", "gelu", "silu", "sqrt_inv",
                                                  "exp", "reciprocal", "tanh"}
    assert site_range("tanh", RingConfig()) == (0.0, activations.TANH_LIMIT)
    assert site_range("den", RingConfig()) == fxp.RECIPROCAL_RANGE
    assert site_range("exp", RingConfig()) == fxp.EXP_RANGE
    ring = RingConfig()
    assert site_range("proj", ring)[1] == arith.product_limit(ring.frac, SM.PROJ_EXTRA) == 2 ** 18
    assert site_range("features", ring)[1] == convert.relu_limit(ring)
    assert site_range("var_eps", ring) == fxp.SQRT_INV_RANGE
    assert site_range("hidden_gelu", ring)[1] == activations.gelu_limit(ring) == 2 ** 13
    assert site_range("hidden_silu", ring)[1] == silu.silu_limit(ring) == 2 ** 13
    # a decode step's o W^O from an untruncated o: frac more bits, 2^8; schedule only
    assert site_range("wo_raw", ring)[1] == arith.product_limit(ring.frac, ring.frac) == 2 ** 8
    # the cross attention's W^O folded at decode_open: a plain product's 2^26; schedule only
    assert site_range("kvwo", ring)[1] == arith.product_limit(ring.frac) == 2 ** 26
    assert [k for k, s in SITES.items() if s.schedule] == ["wo_raw", "kvwo"]


# ------------------------------------------------------- (d) the shipped model ----
@shipped
def test_shipped_translator_calibrates_and_range_covers_every_sequence():
    cfg, w, user, vocab = TD.load_shipped()
    assert cfg.ln_eps == 1e-5                 # stored with the model, unchanged
    cal = C.calibrate(cfg, w, TD.calibration_samples(cfg, w, user), user=user)
    worst, layer, site = cal.fills()[0]
    assert worst < 0.5 and (layer, site) == ("dec.0.ln1", "var_eps")
    assert min(v[0] for row in cal.layers.values() for k, v in row.items()
               if k == "var_eps") > 100 * fxp.SQRT_INV_RANGE[0]      # large row variance
    pe = M.positional_encoding(cfg.max_len, cfg.d_model)
    for name, table in (("X", user["embed.src"]), ("Y", user["embed.tgt"])):
        every = table[:, None, :] * np.sqrt(cfg.d_model) + pe[None]  # every (token, position)
        C.check_input(cal, name, every)
        assert np.abs(every).max() == pytest.approx(cal.input_range[name], rel=1e-12)
    for text in ("0", "7", "999999999", "100000000"):
        C.check_input(cal, "X", M.embed(cfg, user["embed.src"], np.array([TD.encode_src(text)])))


# ------------------------------------------------------------------ the API ----
def test_calibration_dict_roundtrip_is_small_json():
    cfg = make_cfg()
    w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
    cal = C.calibrate(cfg, w, C.default_samples(cfg, user, np.random.default_rng(0)),
                      user=user)
    d = json.loads(json.dumps(cal.to_dict()))
    assert set(d) == {"version", "margin", "frac", "relu_bound_bits", "fold_omega",
                      "decode_block", "ln_eps", "input_range", "layers"}
    assert len(json.dumps(d)) < 5000 and set(d["input_range"]) == {"X", "Y"}
    assert C.Calibration.from_dict(d) == cal
    with pytest.raises(ValueError, match="version"):
        C.Calibration.from_dict({**d, "version": 99})
    # version 1 predates the LM step's fused LayerNorm sites, version 2 the unnormalised
    # o W^O products, version 3 W^Q / sqrt(d_head) and the max-subtracted softmax:
    # refused, naming the remedy
    for old in (1, 2, 3):
        with pytest.raises(ValueError, match=f"version {old} is not {C.VERSION}.*re-shares"):
            C.Calibration.from_dict({**d, "version": old})
    with pytest.raises(ValueError, match="unknown sites"):
        C.Calibration.from_dict({**d, "layers": {"enc.0.ffn": {"w9": 1.0}}})


def test_check_input_messages():
    cal = C.Calibration({}, {"X": 2.0})
    C.check_input(cal, "X", np.full((1, 3, 4), 2.0))
    with pytest.raises(C.RangeError, match="no range for it"):
        C.check_input(cal, "Y", np.zeros(3))
    with pytest.raises(C.RangeError, match="non-finite"):
        C.check_input(cal, "X", np.array([np.nan]))
    with pytest.raises(C.RangeError, match=r"^input X: max \|x\| = 2\.5 is outside .* "
                                           r"\[-2, 2\]; embed tokens"):
        C.check_input(cal, "X", np.array([0.0, -2.5]))


def test_samples_loading_and_validation(tmp_path):
    cfg = make_cfg()
    x, y = np.zeros((2, 6, 12)), np.zeros((2, 6, 12))
    np.savez(tmp_path / "s.npz", **{"X.0": x, "X.1": x[:, :3], "Y.0": y, "Y.1": y})
    s = C.load_samples(tmp_path / "s.npz")
    assert [a.shape for a in s.X] == [(2, 6, 12), (2, 3, 12)] and len(s.Y) == 2
    s.validate(cfg)
    np.save(tmp_path / "x.npy", x)
    assert len(C.load_samples(tmp_path / "x.npy").Y) == 0
    with pytest.raises(ValueError, match="one decoder sample Y per X"):
        C.Samples([x]).validate(cfg)
    with pytest.raises(ValueError, match=r"must be \(B, 1..6, 12\)"):
        C.Samples([np.zeros((2, 7, 12))], [y]).validate(cfg)
    with pytest.raises(ValueError, match="no embedding tables"):
        C.default_samples(cfg, {}, np.random.default_rng(0))
    with pytest.raises(ValueError, match="margin"):
        C.calibrate(cfg, M.random_weights(cfg, 0), C.Samples([x], [y]), margin=0.5)
