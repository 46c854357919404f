"""Encoder (Alg. 8), decoder (Alg. 9 with residuals and real cross attention), incremental
decoding, against protocols.model (post-LN and pre-LN).

Shapes: B=2, S=7 source, T=5 target, d_model=24, h=3, r=10, d_ff=40, 2 layers each.
Inputs uniform in [-1, 1]. Bound: 2e-3 absolute on LayerNorm-scale outputs (sqrt_inv_a is
accurate to 1e-3 relative; measured ~2e-4).
"""
import conftest
import numpy as np
import pytest

from mpc3.shares import AShare
from protocols.stacks import decoder as D
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks.encoder import encoder

from conftest import share, value
from helpers.cases import TOL, per_party

make_cfg = conftest.make_cfg


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("norm,c", [("mean", 0.5), ("const", 0.05)])
def test_encoder_decoder_and_incremental(run, rng, norm_first, norm, c):
    cfg = make_cfg(norm_first=norm_first, attn_norm=norm, attn_c=c)
    w = M.random_weights(cfg, 11)
    sh = SM.share_model(cfg, w)
    x, y = rng.uniform(-1, 1, (2, 7, 24)), rng.uniform(-1, 1, (2, 5, 24))

    def fn(p, s, xs, ys):
        enc = encoder(p, cfg, s, xs)
        full_vk = D.decoder(p, cfg, s, ys, enc, masked_form="vk", block=2)
        full_qk = D.decoder(p, cfg, s, ys, enc, masked_form="qk", cross_order="qk")
        st = D.DecodeState.start(p, cfg, s, enc, block=2)
        steps = [D.decoder_step(p, cfg, s, st, ys[:, t]) for t in range(5)]
        return enc, full_vk, full_qk, steps

    res = run(fn, *per_party(sh, share(x), share(y)))
    pick = lambda k: value([r[k] for r in res])  # noqa: E731
    enc_ref = M.ref_encoder(cfg, w, x)
    assert np.max(np.abs(pick(0) - enc_ref)) < TOL
    dec_ref = M.ref_decoder(cfg, w, y, enc_ref)
    assert np.max(np.abs(pick(1) - dec_ref)) < TOL
    assert np.max(np.abs(pick(2) - dec_ref)) < TOL
    # incremental decoding equals the full decoder on every prefix
    for t in range(5):
        step = value([r[3][t] for r in res])
        prefix_ref = M.ref_decoder(cfg, w, y[:, :t + 1], enc_ref)[:, t]
        assert np.max(np.abs(step - prefix_ref)) < TOL
        assert np.max(np.abs(step - pick(1)[:, t])) < TOL


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fuse", [(), D.FUSIONS])
def test_decoder_step_fusions_equal_reference(run, rng, norm_first, fuse):
    """Every choice of LayerNorms fused with their next projection (decoder.ln_fusions)
    computes the same decode steps (the default is covered above)."""
    cfg = make_cfg(norm_first=norm_first)
    w = M.random_weights(cfg, 12)
    sh = SM.share_model(cfg, w)
    x, y = rng.uniform(-1, 1, (2, 7, 24)), rng.uniform(-1, 1, (2, 4, 24))

    def fn(p, s, xs, ys):
        st = D.DecodeState.start(p, cfg, s, encoder(p, cfg, s, xs), block=2, fuse=fuse)
        return [D.decoder_step(p, cfg, s, st, ys[:, t]) for t in range(4)]

    res = run(fn, *per_party(sh, share(x), share(y)))
    enc_ref = M.ref_encoder(cfg, w, x)
    for t in range(4):
        want = M.ref_decoder(cfg, w, y[:, :t + 1], enc_ref)[:, t]
        assert np.max(np.abs(value([r[t] for r in res]) - want)) < TOL


@pytest.mark.parametrize("block", [1, 2])
def test_decoder_step_cost_bounded_in_prefix(rng, block):
    """A step's traffic depends only on the position inside the decode block (O(1) state)."""
    from mpc3.sim import make_parties, run_parties
    cfg = make_cfg(n_enc_layers=1, n_dec_layers=1)
    w = M.random_weights(cfg, 2)
    sh = SM.share_model(cfg, w)
    enc, y = share(rng.uniform(-1, 1, (1, 7, 24))), share(rng.uniform(-1, 1, (1, 6, 24)))
    parties = make_parties()
    per_step = []

    def fn(p, s, es, ys):
        st = D.DecodeState.start(p, cfg, s, es, block=block)
        for t in range(6):
            before = p.stats.snapshot()
            D.decoder_step(p, cfg, s, st, ys[:, t])
            if p.rank == 0:
                per_step.append(p.stats - before)
        return st.t

    assert run_parties(fn, list(zip(*per_party(sh, enc, y))), parties=parties) == [6] * 3
    key = [(d.bytes_sent, d.rounds, d.messages) for d in per_step]
    assert all(key[t] == key[t + block] for t in range(block, 6 - block))
    assert len({k[1] for k in key}) == 1      # rounds never change


def test_stack_errors(run, rng):
    cfg = make_cfg()
    sh = SM.share_model(cfg, M.random_weights(cfg, 0))
    x = share(rng.uniform(-1, 1, (2, 7, 24)))
    with pytest.raises(ValueError, match="encoder input"):
        run(lambda p, s, xs: encoder(p, cfg, s, xs[0]), *per_party(sh, x))
    with pytest.raises(ValueError, match="batch sizes"):
        run(lambda p, s, xs: D.decoder(p, cfg, s, xs, xs[:1]), *per_party(sh, x))
    with pytest.raises(ValueError, match="cross order"):
        run(lambda p, s, xs: D.decoder(p, cfg, s, xs, xs, cross_order="vk"), *per_party(sh, x))
    with pytest.raises(ValueError, match="decoder step input"):
        def fn(p, s, xs):
            st = D.DecodeState.start(p, cfg, s, xs)
            return D.decoder_step(p, cfg, s, st, xs)
        run(fn, *per_party(sh, x))
    assert isinstance(x[0], AShare)
