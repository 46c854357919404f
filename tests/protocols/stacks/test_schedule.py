"""A decode session's schedule from the model's calibration (protocols.stacks.schedule), issue 12:

* o W^O truncated by 2 frac from an untruncated o (one round less per attention sublayer),
  chosen only where the calibration keeps |o W^O| below 2^(62 - 3 frac) with its safety
  margin (``deferred_wo``, calibration site ``wo_raw``);
* each decoder LayerNorm's sqrt_inv table narrowed to its calibrated variance octaves
  (``ln_spans``: fewer bytes, same rounds).

Both compute the same function within the stack's bound. Shapes as
tests/protocols/stacks/test_protocols_stack.py (d=24, h=3, r=10, 2+2 layers, inputs uniform in
[-1, 1]); bound there: 2e-3 absolute on LayerNorm-scale outputs.
"""
import numpy as np
import pytest

from mpc3.kernels import arith, fxp
from mpc3.party import RingConfig
from protocols.calibration import calibrate as C
from protocols.stacks import decoder as D
from protocols.stacks import schedule as S
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks.encoder import encoder

from conftest import share, value
from conftest import make_cfg
from helpers.cases import TOL, calibrated_case, per_party

EVERY = frozenset(f"dec.{i}.{k}" for i in range(2) for k in ("self", "cross"))


@pytest.mark.parametrize("norm_first,norm,c", [(False, "mean", 0.5), (True, "const", 0.05),
                                               (False, "const", 0.05)])
def test_deferred_steps_equal_reference(run, rng, norm_first, norm, c):
    cfg, w, sh, x, y, cal = calibrated_case(rng, norm_first, norm, c, steps=5)
    spans = S.ln_spans(cfg, cal)                       # the calibrated table of each LN
    assert len(spans) == 3 * cfg.n_dec_layers + cfg.norm_first

    def fn(p, s, xs, ys):
        enc = encoder(p, cfg, s, xs)
        out = []
        for raw, sp in ((frozenset(), None), (EVERY, spans)):
            st = D.DecodeState.start(p, cfg, s, enc, block=2,
                                     schedule=S.Schedule(raw, sp or {}))
            before = p.stats.snapshot()
            steps = [D.decoder_step(p, cfg, s, st, ys[:, t]) for t in range(5)]
            out.append((steps, (p.stats.snapshot() - before).rounds))
        return out

    res = run(fn, *per_party(sh, share(x), share(y)))
    enc_ref = M.ref_encoder(cfg, w, x)
    for t in range(5):
        want = M.ref_decoder(cfg, w, y[:, :t + 1], enc_ref)[:, t]
        plain = value([r[0][0][t] for r in res])
        deferred = value([r[1][0][t] for r in res])
        assert np.max(np.abs(deferred - want)) < TOL, t
        assert np.max(np.abs(deferred - plain)) < TOL, t
    # one round less per attention sublayer and step
    assert res[0][0][1] - res[0][1][1] == 5 * len(EVERY)


def test_ln_spans_follow_the_calibration():
    """Whole octaves around [min / margin^2, max * margin^2] of each decoder LayerNorm's
    var + eps (quadratic in the input: margin^2 is the linear sites' headroom), clipped to
    sqrt_inv's range; nothing for other norms or layers."""
    cfg = make_cfg()
    cal = {"margin": 2.0, "layers": {
        "dec.0.ln1": {"var_eps": [1.0, 3.0]},            # [1/4, 12]: octaves -2 .. 4
        "dec.0.ln2": {"var_eps": [2.0 ** -11, 2.0 ** 15]},   # clipped to the whole range
        "dec.1.ln3": {"var_eps": [5.0, 5.0]},            # [1.25, 20]: 0 .. 5
        "enc.0.ln1": {"var_eps": [1.0, 3.0]},            # the encoder keeps its table
        "dec.0.self": {"wo": 3.0}}}
    assert S.ln_spans(cfg, cal) == {"dec.0.ln1": (-2, 4), "dec.0.ln2": fxp.FULL_SPAN,
                                    "dec.1.ln3": (0, 5)}
    assert S.ln_spans(cfg, {**cal, "margin": 1.0})["dec.0.ln1"] == (0, 2)
    assert S.ln_spans(cfg, {**cal, "margin": 4.0})["dec.0.ln1"] == (-4, 6)
    assert S.ln_spans(cfg, None) == {} == S.ln_spans(make_cfg(norm="batchnorm"), cal)
    # malformed metadata entries give the whole table, never an error or a narrow one
    bad = {"margin": 2.0, "layers": {"dec.0.ln1": {"var_eps": ["1", 3.0]},
                                     "dec.0.ln2": {"var_eps": [0.0, 3.0]},
                                     "dec.0.ln3": {"var_eps": [1.0, float("inf")]},
                                     "dec.1.ln1": "junk", "dec.1.ln2": {"var_eps": 4.0}}}
    assert S.ln_spans(cfg, bad) == {}
    for span in S.ln_spans(cfg, cal).values():
        assert fxp.check_span(span) == span


def _calibration(values: dict, frac: int = 18, margin: float = 4.0) -> dict:
    return {"version": C.VERSION, "frac": frac, "margin": margin,
            "layers": {f"dec.{i}.{k}": {"wo": 1e3, **({"wo_raw": v} if v is not None else {})}
                       for (i, k), v in values.items()}}


def test_deferral_follows_the_calibration():
    cfg = make_cfg()
    limit = arith.product_limit(18, 18)                   # 2^8 at frac 18
    assert limit == 256.0
    below, above = limit / 4 * 0.99, limit / 4 * 1.01     # margin 4
    cal = _calibration({(0, "self"): below, (0, "cross"): above, (1, "self"): None,
                        (1, "cross"): 1.0})
    assert S.deferred_wo(cfg, cal, RingConfig()) == {"dec.0.self", "dec.1.cross"}
    # a wider margin takes layer 0's self attention out
    assert S.deferred_wo(cfg, {**cal, "margin": 8.0}, RingConfig()) == {"dec.1.cross"}
    # nothing without a calibration, for another frac, with "prob" truncation (a 2 frac
    # truncation of a product that large would fail often) or a softmax-style attention
    assert S.deferred_wo(cfg, None, RingConfig()) == frozenset()
    junk = {**cal, "layers": {"dec.0.self": "junk", "dec.0.cross": {"wo_raw": "1"},
                              "dec.1.self": {"wo_raw": -1.0}}}
    assert S.deferred_wo(cfg, junk, RingConfig()) == frozenset()
    for bad in ([], {"layers": [1]}, {**cal, "margin": "4"}, {**cal, "layers": "junk"},
                {**cal, "margin": float("nan")}):
        assert S.deferred_wo(cfg, bad, RingConfig()) == frozenset()
        assert S.ln_spans(cfg, bad) == {}
    assert S.deferred_wo(cfg, cal, RingConfig(frac=16)) == frozenset()
    assert S.deferred_wo(cfg, cal, RingConfig(trunc="prob")) == frozenset()
    soft = make_cfg(attention="softmax")
    assert S.deferred_wo(soft, cal, RingConfig()) == frozenset()


def test_calibration_records_wo_raw_and_never_refuses_on_it(rng):
    """Site ``wo_raw``: the normalised o W^O of every decode step (self and cross), which
    only chooses the schedule - a model above its 2^8 limit is still accepted."""
    cfg = make_cfg(attn_c=0.5)
    w = M.random_weights(cfg, 14)
    samples = C.Samples([rng.uniform(-1, 1, (1, 7, 24))], [rng.uniform(-1, 1, (1, 16, 24))])
    cal = C.calibrate(cfg, w, samples)
    for i in range(2):
        for kind in ("self", "cross"):
            row = cal.layers[f"dec.{i}.{kind}"]
            # cross: the same product (K'^T V carries 1/n), here from the untruncated o - equal
            # up to the fixed point the calibration runs in (protocols.calibration.shadow)
            assert 0 < row["wo_raw"] <= row["wo"] * (1 + 1e-4)
    # scale W^O up until o W^O passes the deferral limit but no refusing site
    big = M.Weights({k: (v * 4 if k.endswith(".wo") else v) for k, v in w.tensors.items()})
    cal_big = C.calibrate(cfg, big, samples)
    assert max(cal_big.layers[f"dec.{i}.{k}"]["wo_raw"] for i in range(2)
               for k in ("self", "cross")) * cal_big.margin > 256
    assert S.deferred_wo(cfg, cal_big.to_dict(), RingConfig()) != EVERY
    assert S.deferred_wo(cfg, cal.to_dict(), RingConfig()) == EVERY


def test_decode_jobs_defer_where_the_stored_calibration_allows():
    """The production path: decode_open reads the calibration in the model's public metadata
    (as share-model stores it) and the steps then take one round less per deferred attention
    sublayer, with measured traffic = declared and the plaintext step's values."""
    from app import translate as T
    from app.owner import calibration_samples
    from mpc3 import ring
    cfg = make_cfg(n_enc_layers=1)
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    cal = C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user).to_dict()
    raw, spans = S.deferred_wo(cfg, cal, RingConfig()), S.ln_spans(cfg, cal)
    assert raw                                  # this model defers some o W^O
    assert len(spans) == 3 * cfg.n_dec_layers   # and narrows every decoder LayerNorm's table
    x = M.embed(cfg, user["embed.src"], np.array([[3, 4, 2], [1, 1, 4]]))
    fold = S.folded_wo(cfg, cal, RingConfig())
    assert fold                                 # and folds some cross attention's W^O
    for calibration, want, want_spans, want_fold in ((None, frozenset(), None, frozenset()),
                                                     (cal, raw, spans, fold)):
        be = T.InprocBackend(cfg, w, calibration=calibration)
        session = T.Session(be)
        session.open(x)
        ref = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x))
        for t, tok in enumerate([1, 3]):
            y = M.embed(cfg, user["embed.tgt"], np.full((2, 1), tok), offset=t)[:, 0]
            got = ring.decode(session.step(y))
            traffic = session.last
            np.testing.assert_allclose(got, M.ref_decoder_step(cfg, w, ref, y), atol=TOL)
            declared = D.cost_decoder_step(RingConfig(), cfg, 2, t, wide=True,
                                           schedule=S.Schedule(want, want_spans or {}, want_fold))
            assert (traffic.rounds, tuple(traffic.bytes_per_party)) == \
                (declared.rounds, declared.bytes_per_party)
        session.close()
    # one round fewer per deferred o W^O, two per folded cross attention W^O
    assert declared.rounds == D.cost_decoder_step(RingConfig(), cfg, 2, 1, wide=True).rounds \
        - len(raw - fold) - 2 * len(fold)


@pytest.mark.parametrize("norm_first,fuse", [(False, ("ffn",)), (True, ()), (True, ("self",))])
def test_lm_steps_follow_the_schedule(run, rng, norm_first, fuse):
    """The decoder-only LM's steps take the same schedule (its self attention's o W^O
    deferred, its LayerNorms' tables narrowed): the reference's values, declared = measured,
    one round less per deferred layer."""
    from conftest import lm_session
    from protocols.stacks import causal_lm as LM
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=norm_first, max_len=16,
                        arch="decoder-only", n_dec_layers=2, tgt_vocab=13).validate()
    w = M.random_weights(cfg, 3)
    x = rng.uniform(-1, 1, (2, 8, 16))
    cal = C.calibrate(cfg, w, C.Samples([np.pad(x, ((0, 0), (0, 8), (0, 0)))]),
                      decode_block=3).to_dict()
    raw, spans = S.deferred_wo(cfg, cal, RingConfig()), S.ln_spans(cfg, cal)
    assert raw == {"dec.0.self", "dec.1.self"} and len(spans) == 4 + norm_first
    rows, steps = lm_session(run, cfg, SM.share_model(cfg, w), x, 5, block=3, fuse=fuse,
                             schedule=S.Schedule(raw, spans))
    full = M.ref_lm(cfg, w, x)
    for k, h in enumerate(rows):
        assert np.max(np.abs(h - full[:, 4 + k])) < TOL
    rc = RingConfig()
    for t, got in steps.items():
        declared = LM.cost_lm_step(rc, cfg, 2, t, 3, fuse=fuse, schedule=S.Schedule(raw, spans))
        assert got == (declared.bytes_per_party, declared.rounds)
        general = LM.cost_lm_step(rc, cfg, 2, t, 3, fuse=fuse)
        assert general.rounds - declared.rounds == 2
        assert declared.bytes_total < general.bytes_total
