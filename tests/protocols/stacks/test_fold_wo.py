"""The cross attention's W^O folded into K'^T V at decode_open (issue 12): a session with
``fuse`` "wo" forms M_h = (K'^T V)_h W^O_h once and each step's o W^O = Q' M in one product,
one round fewer per decoder layer; only where the model's calibration keeps |M| below
``arith.product_limit(frac)`` with its margin (``protocols.stacks.schedule.folded_wo``, site
``kvwo``). The same function: checked against the plaintext steps with the stack's bound
(tests/protocols/stacks/test_protocols_stack.py, 2e-3), measured traffic == declared."""
import numpy as np
import pytest

from mpc3.kernels import arith
from mpc3.party import RingConfig
from protocols.calibration import calibrate as C
from protocols.stacks import decoder as D
from protocols import model as M
from protocols.stacks import schedule as S
from protocols.stacks.encoder import encoder

from conftest import share, value
from conftest import make_cfg
from helpers.cases import TOL, calibrated_case, per_party

CROSS = frozenset({"dec.0.cross", "dec.1.cross"})


@pytest.mark.parametrize("norm_first,norm,c", [(False, "mean", 0.5), (True, "const", 0.05)])
def test_folded_steps_equal_reference_one_round_fewer_per_layer(run, rng, norm_first, norm, c):
    cfg, w, sh, x, y, cal = calibrated_case(rng, norm_first, norm, c, steps=4)
    fold = S.folded_wo(cfg, cal, RingConfig())
    sched = S.Schedule(fold_wo=fold)
    assert fold == CROSS
    fuses = (("cross", "ffn"), ("cross", "ffn", "wo"))
    assert D.DEFAULT_FUSE == fuses[1]

    def fn(p, s, xs, ys):
        enc = encoder(p, cfg, s, xs)
        out = []
        for fuse in fuses:
            c0 = p.stats.snapshot()
            st = D.DecodeState.start(p, cfg, s, enc, block=2, fuse=fuse, schedule=sched)
            opened, steps = p.stats.snapshot() - c0, []
            for t in range(4):
                c0 = p.stats.snapshot()
                steps.append((D.decoder_step(p, cfg, s, st, ys[:, t]), p.stats.snapshot() - c0))
            out.append((opened, steps))
        return out

    res = run(fn, *per_party(sh, share(x), share(y)))
    enc_ref = M.ref_encoder(cfg, w, x)
    rc = RingConfig()
    for k, fuse in enumerate(fuses):
        opened = D.cost_decode_start(rc, cfg, 2, 7, fuse=fuse, schedule=sched)
        assert tuple(r[k][0].bytes_sent for r in res) == opened.bytes_per_party
        assert max(r[k][0].rounds for r in res) == opened.rounds
        for t in range(4):
            want = M.ref_decoder(cfg, w, y[:, :t + 1], enc_ref)[:, t]
            assert np.max(np.abs(value([r[k][1][t][0] for r in res]) - want)) < TOL, (fuse, t)
            declared = D.cost_decoder_step(rc, cfg, 2, t, block=2, fuse=fuse, schedule=sched)
            assert tuple(r[k][1][t][1].bytes_sent for r in res) == declared.bytes_per_party
            assert max(r[k][1][t][1].rounds for r in res) == declared.rounds
    # one round fewer per layer than o W^O from an untruncated o (deferred_wo), two than
    # from a truncated one
    folded = D.cost_decoder_step(rc, cfg, 2, 1, block=2, fuse=fuses[1], schedule=sched)
    for raw, fewer in ((CROSS, 1), (frozenset(), 2)):
        plain = D.cost_decoder_step(rc, cfg, 2, 1, block=2, fuse=fuses[0],
                                    schedule=S.Schedule(raw_wo=raw, fold_wo=fold))
        assert plain.rounds - folded.rounds == fewer * cfg.n_dec_layers
    # the open pays for it: h r d products per row and layer
    extra = D.cost_decode_start(rc, cfg, 2, 7, fuse=fuses[1], schedule=sched).bytes_total \
        - D.cost_decode_start(rc, cfg, 2, 7, fuse=fuses[0], schedule=sched).bytes_total
    assert extra == D.cost_fold_wo(rc, cfg, 2, 2).bytes_total > 0


def _calibration(values: dict, frac: int = 18, margin: float = 4.0) -> dict:
    return {"version": C.VERSION, "frac": frac, "margin": margin,
            "layers": {f"dec.{i}.cross": ({"kvwo": v} if v is not None else {})
                       for i, v in values.items()}}


def test_folding_follows_the_calibration():
    cfg = make_cfg()
    limit = arith.product_limit(18)
    below, above = limit / 4 * 0.99, limit / 4 * 1.01      # margin 4
    assert S.folded_wo(cfg, _calibration({0: below, 1: above}), RingConfig()) == {"dec.0.cross"}
    assert S.folded_wo(cfg, _calibration({0: below, 1: None}), RingConfig()) == {"dec.0.cross"}
    assert S.folded_wo(cfg, _calibration({0: below, 1: 1.0}, frac=16), RingConfig()) == set()
    assert S.folded_wo(cfg, None, RingConfig()) == frozenset()
    assert S.folded_wo(make_cfg(attention="softmax"), _calibration({0: 1.0, 1: 1.0}),
                       RingConfig()) == frozenset()
    for bad in ([], {"layers": [1]}, _calibration({0: "1", 1: -1.0}),
                {**_calibration({0: 1.0}), "margin": float("nan")}):
        assert S.folded_wo(cfg, bad, RingConfig()) == frozenset()
    # a session without "wo" folds nothing; a schedule without the layer neither
    assert D.folded_layers(cfg, ("cross", "ffn"), CROSS) == []
    assert D.folded_layers(cfg, ("wo",), {"dec.1.cross"}) == [1]
    # the schedule offers it to encoder-decoders only
    both = _calibration({0: 1.0, 1: 1.0})
    assert S.session_schedule(cfg, both, RingConfig()).fold_wo == CROSS
    lm = make_cfg(arch=M.DECODER_ONLY, n_enc_layers=0, src_vocab=0)
    assert S.folded_wo(lm, both, RingConfig()) == CROSS
    assert S.session_schedule(lm, both, RingConfig()).fold_wo == frozenset()


def test_calibration_records_kvwo(rng):
    cfg = make_cfg(attn_c=0.5)
    w = M.random_weights(cfg, 14)
    samples = C.Samples([rng.uniform(-1, 1, (1, 7, 24))], [rng.uniform(-1, 1, (1, 16, 24))])
    cal = C.calibrate(cfg, w, samples)
    for i in range(2):
        row = cal.layers[f"dec.{i}.cross"]
        assert 0 < row["kvwo"] < arith.product_limit(18)
    # W^O twice as large: M twice as large (a refusing site, o W^O, bounds it in practice; a model
    # whose M alone passed the limit would keep the unfolded steps: the test above)
    big = M.Weights({k: (v * 2 if k.endswith("cross.wo") else v) for k, v in w.tensors.items()})
    cal_big = C.calibrate(cfg, big, samples)
    for i in range(2):
        assert cal_big.layers[f"dec.{i}.cross"]["kvwo"] == \
            pytest.approx(2 * cal.layers[f"dec.{i}.cross"]["kvwo"], rel=1e-4)   # fixed point
