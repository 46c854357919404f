"""Flushes inside a layer (mpc3.checks.Checks.checkpoint, ``split_at``): malicious mode may
prove what is pending between two kernels instead of at a layer's end only, which bounds a
flush's memory (a GPT-2-small layer's claims do not fit this machine at once).

With ``split_at=1`` a flush runs at every point between kernels where it may: the smallest
encoder and a causal LM's prefill and step give the float64 reference's output (same bounds
as their semi-honest tests), every message of every kernel stays covered (no Unverified), a
deviation at a random message - a kernel's or a flush's - still aborts, and no flush runs
while a comparison's masked bits wait for the injection that reads its record."""
import numpy as np

from conftest import share, value
from helpers.bench_scripts import script
from mpc3 import ring
from mpc3.checks import Checks
from mpc3.kernels import arith, convert
from mpc3.sharing import reveal
from mpc3.sim import make_parties, run_parties
from net.party.malicious import LATE_PARAMS
from protocols import model as M
from protocols.layers import secure_model as SM
from protocols.stacks import causal_lm as LM
from protocols.stacks.encoder import encoder

B = script("malicious")


def _encoder_job(cfg, split):
    def job(p, sh, x):
        p.checks = Checks(p, split_at=split)
        y = encoder(p, cfg, sh, x, on_layer=lambda _: p.checks.flush(p))
        p.checks.flush(p)
        return y, p.checks.flushes
    return job


def test_the_encoder_split_between_kernels_gives_the_reference_output():
    cfg, args, ref = B._case(B.TINY)
    whole = run_parties(_encoder_job(cfg, None), args, parties=make_parties())
    split = run_parties(_encoder_job(cfg, 1), args, parties=make_parties())
    assert [r[1] for r in whole] == [2] * 3              # the layer's end, the job's end
    assert len({r[1] for r in split}) == 1 and split[0][1] >= 8
    for out in (whole, split):
        assert np.max(np.abs(ring.decode(reveal([r[0] for r in out])) - ref)) < 1e-2


def test_a_causal_lm_split_between_kernels_gives_the_reference_output(run, rng):
    """Pre-LN (GPT-2's order)."""
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32,
                        attn_c=0.125, attn_norm="mean", norm_first=True, max_len=16,
                        arch="decoder-only", n_dec_layers=2, tgt_vocab=13).validate()
    w = M.random_weights(cfg, 2)
    x = rng.uniform(-1, 1, (2, 6, 16))

    def fn(p, s, xs):
        p.checks = Checks(p, split_at=1)
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :5], block=3)
        prefill = p.checks.flushes
        h2 = LM.lm_step(p, cfg, s, st, xs[:, 5])
        p.checks.flush(p)
        return h, h2, prefill

    res = run(fn, SM.share_model(cfg, w), share(x))
    full = M.ref_lm(cfg, w, x)
    assert len({r[2] for r in res}) == 1 and res[0][2] >= 2 * cfg.n_dec_layers
    for k in range(2):
        got = value([r[k] for r in res])
        assert np.max(np.abs(got - full[:, 4 + k])) < 2e-3


def test_a_deviation_aborts_with_flushes_between_kernels():
    cfg, args, _ = B._case(B.TINY)
    c = B.campaign(B._job(cfg, True, 1), args, trials=6, honest=1, seed=3)
    assert c["outcomes"] == {"aborted": 6} and c["honest_aborts"] == 0


def test_no_flush_while_a_comparisons_masked_bits_wait_for_their_injection(run, rng):
    """mul_split_aa on few elements runs the ReLU's whole comparison and leaves its bits
    masked; relu_a injects them. Between the two calls nothing may be proven: the
    injection's claims read the comparison's record."""
    x, y = rng.uniform(-2, 2, (2, 8)), rng.uniform(-2, 2, (8, 3))

    def fn(p, xs, ys):
        p.checks = Checks(p, split_at=1)
        z = arith.mul_split_aa(p, [(xs, ys, "matmul")])
        between = p.checks.flushes
        out = convert.relu_a(p, z)
        after = p.checks.flushes
        p.checks.flush(p)
        return out, between, after

    res = run(fn, share(x), share(y))
    assert [r[1:] for r in res] == [(0, 1)] * 3
    assert np.max(np.abs(value([r[0] for r in res]) - np.maximum(x @ y, 0).reshape(-1))) < 1e-4


def test_gpt2_style_kernels_in_row_blocks_give_the_reference_output(run, rng, monkeypatch):
    """The GELU, LayerNorm and the softmax's exponential over blocks of 16 elements, a
    flush possible between blocks: GPT-2's layer (pre-LN, max-subtracted softmax, GELU)
    gives the reference's output, with more flushes than without blocks."""
    from app.bench.lm import lm_config
    from mpc3 import checks
    cfg = lm_config("decoder-only", "softmax", 16, 2, 2, 32, 6, 0, "gelu")
    w = M.random_weights(cfg, 4)
    x = rng.uniform(-1, 1, (1, 6, 16))

    def fn(p, s, xs):
        p.checks = Checks(p, split_at=1)
        h, _ = LM.lm_prefill(p, cfg, s, xs)
        p.checks.flush(p)
        return h, p.checks.flushes

    whole = run(fn, SM.share_model(cfg, w), share(x))
    monkeypatch.setattr(checks, "BLOCK_ELEMENTS", 16)
    blocks = run(fn, SM.share_model(cfg, w), share(x))
    ref = M.ref_lm(cfg, w, x)[:, -1]
    assert blocks[0][1] > whole[0][1]
    for res in (whole, blocks):
        assert np.max(np.abs(value([r[0] for r in res]) - ref)) < 2e-3


def test_a_long_jobs_later_flushes_prove_with_the_wider_ring():
    """From flush ``later[0]`` on, Checks proves with ``later[1]`` (a long job's
    net.party.malicious.LATE_PARAMS: GR(2^64, 64), one repetition): the encoder split at
    every point gives the reference output, and a deviation at a message after the first
    flush - proven with the later parameters - aborts."""
    cfg, args, ref = B._case(B.TINY)

    class Recording(Checks):
        first_op = None

        def flush(self, p):
            super().flush(p)
            if self.flushes == 1:
                self.first_op = p.kop

    def job(p, sh, x):
        p.checks = Recording(p, split_at=1, later=(1, LATE_PARAMS))
        y = encoder(p, cfg, sh, x, on_layer=lambda _: p.checks.flush(p))
        p.checks.flush(p)
        assert p.checks.params_at(p.checks.flushes - 1) is LATE_PARAMS
        return y, p.checks.first_op

    out = run_parties(job, args, parties=make_parties())
    assert np.max(np.abs(ring.decode(reveal([r[0] for r in out])) - ref)) < 1e-2
    c = B.campaign(job, args, trials=4, honest=0, seed=5,
                   span=lambda results: (results[0][1], float("inf")))
    assert c["outcomes"] == {"aborted": 4}

