"""Wide outputs (issue 12): a model output whose last product is reshared untruncated, at
2 frac fractional bits, one round fewer; the query user rounds it after reconstructing it.

Checked: the three normalizations' wide form against the reference and the narrow form
(measured traffic == declared, one round fewer where there is a product), the query user's
rounding, the chunks' scale check, and a decode step's wide row through the job runner."""
import numpy as np
import pytest

from conftest import share, value
from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sim import run_parties
from net.client.failures import TamperingDetected
from net.client.outputs import reconstruct, same_scales
from net.codec import TensorAssembler, tensor_chunks
from net.errors import BadRequest
from protocols import model as M
from protocols.layers import norms as N
from protocols.layers import secure_model as SM
from protocols.jobs import PRODUCTION, output_fracs

F = ring.DEFAULT_FRAC


def _cfg(norm: str) -> M.ModelConfig:
    return M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                         attn_norm="mean", max_len=8, n_enc_layers=1, n_dec_layers=1,
                         src_vocab=7, tgt_vocab=7, norm=norm, norm_first=False).validate()


@pytest.mark.parametrize("norm", ["layernorm", "batchnorm", "none"])
def test_wide_norm_equals_the_narrow_one_a_round_earlier(rng, norm):
    cfg = _cfg(norm)
    w = M.random_weights(cfg, 2)
    if norm == "batchnorm":
        w["dec.0.ln3.var"] = np.abs(w["dec.0.ln3.var"]) + 0.5
    sh = SM.share_model(cfg, w)
    x = rng.uniform(-3, 3, (3, 16))
    xs = share(x)

    def fn(p, s, xi):
        out = []
        for wide in (False, True):
            c0 = p.stats.snapshot()
            y = N.norm(p, cfg, s, "dec.0.ln3", xi, wide=wide)
            out.append((y, p.stats.snapshot() - c0))
        return out

    res = run_parties(fn, [(sh[i], xs[i]) for i in range(3)])
    want = M.reference.ref_norm(cfg, w, "dec.0.ln3", x)
    narrow = value([r[0][0] for r in res])
    wide = value([r[1][0] for r in res], 2 * F)
    assert np.max(np.abs(wide - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
    # the same computation but for the last truncation, up to the ulp errors of the earlier
    # truncations (their masks differ between the two runs), amplified by 1/sqrt(var + eps)
    assert np.max(np.abs(wide - narrow)) <= 16 * 2.0 ** -F
    for k, wd in enumerate((False, True)):
        declared = N.cost_norm(RingConfig(), cfg, 3, wide=wd)
        assert tuple(r[k][1].bytes_sent for r in res) == declared.bytes_per_party
        assert max(r[k][1].rounds for r in res) == declared.rounds
    saved = 0 if norm == "none" else 1
    assert N.cost_norm(RingConfig(), cfg, 3, wide=True).rounds == \
        N.cost_norm(RingConfig(), cfg, 3).rounds - saved


def test_the_query_user_rounds_a_wide_output_to_nearest():
    rng = np.random.default_rng(7)
    v = rng.integers(-2 ** 50, 2 ** 50, 10000, dtype=np.int64)
    v[:4] = [-3, -2, 3, 5]                                  # ties: up (-1.5 -> -1, 2.5 -> 3)
    got = ring.to_signed(ring.narrow(ring.from_signed(v), 1))
    assert list(got[:4]) == [-1, -1, 2, 3]
    got = ring.to_signed(ring.narrow(ring.from_signed(v), F))
    assert np.array_equal(got, np.floor(v / 2.0 ** F + 0.5).astype(np.int64))
    pairs = [{"H": s} for s in share(np.array([[0.25, -1.75]]), 2 * F)]
    out = reconstruct(pairs, {"H": F})["H"]
    assert np.array_equal(ring.decode(out), [[0.25, -1.75]])


def test_output_scales_are_declared_and_checked_on_the_wire():
    spec = PRODUCTION.get("decode_step")
    assert output_fracs(spec, F) == {"H": 2 * F}
    assert output_fracs(PRODUCTION.get("encoder"), F) == {"Y": F}
    h = share(np.ones((1, 4)), 2 * F)[0]
    for frac, ok in ((F, True), (2 * F, True), (2 * F + 1, False), (F + 3, False)):
        asm = TensorAssembler(F, 1 << 20, fracs=(F, 2 * F))
        chunks = list(tensor_chunks("H", h, frac))
        if ok:
            got = [asm.feed(c) for c in chunks][-1]
            assert got[4] == frac
        else:
            with pytest.raises(BadRequest, match="frac"):
                asm.feed(chunks[0])


def test_parties_must_agree_on_an_outputs_scale():
    assert same_scales([{"H": 2 * F, "Y": F}] * 3, F) == {"H": F}
    with pytest.raises(TamperingDetected, match="scales"):
        same_scales([{"H": 2 * F}, {"H": 2 * F}, {"H": F}], F)


def test_a_decode_step_job_returns_its_row_wide(rng):
    """In-process parties: the decode_step job's shares carry 2 frac bits; reconstructed and
    rounded they match the reference step."""
    from app import translate as T
    cfg = _cfg("layernorm")
    w, user = M.random_weights(cfg, 4), M.random_user(cfg, 4)
    be = T.InprocBackend(cfg, w)
    x = M.embed(cfg, user["embed.src"], np.array([[1, 2, 3]]))
    session = T.Session(be, sid="s")
    session.open(x)
    y = M.embed(cfg, user["embed.tgt"], np.array([[2]]), offset=0)[:, 0]
    jobs = be.parties.run("decode_step", {"session": "s"},
                          [{"Y": d} for d in share(y)])
    raw = ring.decode(reconstruct([j.outputs for j in jobs])["H"], 2 * F)
    ref = M.ref_decoder_step(cfg, w, M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x)), y)
    assert np.max(np.abs(raw - ref)) < 2e-2
    session.close()
