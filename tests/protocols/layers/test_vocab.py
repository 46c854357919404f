"""The vocabulary ends on shares (protocols/layers/vocab.py): the one-hot embedding lookup
and the secret LM head's token against numpy, the secure arg-max against numpy's (ties,
error region, range), measured traffic against every declared cost, and the parties'
views during lm_head_token independent of the logits."""
import math
import os

import numpy as np
import pytest

from conftest import share, value
from mpc3 import ring
from mpc3.kernels import convert
from mpc3.party import RingConfig
from mpc3.prg import PRG
from mpc3.shadow import ShadowParty
from mpc3.shares import AShare
from mpc3.sharing import deal, reveal
from mpc3.sim import make_parties, run_parties
from protocols.layers import vocab as VO

#: DReLU's error region in real units: a compared difference in [-REGION, 0) may go either way
REGION = 2.0 ** (RingConfig().relu_drop_bits - RingConfig().frac)


def grid_logits(rng, shape, scale=3.0):
    """Normal logits on a 2^-8 grid: distinct values differ by 2^-8, 16 times the error
    region, and equal ones (ties) occur."""
    return np.round(rng.normal(size=shape) * scale * 256) / 256


@pytest.mark.parametrize("C_", [1, 2, 3, 5, 8, 13, 257])
def test_argmax_matches_numpy_and_declared_cost(run, rng, C_):
    logits = grid_logits(rng, (6, C_))
    logits[0] = 1.5                            # all tied: the lowest index, as numpy
    if C_ > 2:
        logits[1, [0, C_ - 1]] = 9.0           # tie of two maxima far apart
        logits[2, [C_ - 2, C_ - 1]] = 9.0      # tie of neighbours at the end
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    np.testing.assert_array_equal(value(res), logits.argmax(1).astype(float))
    run.assert_cost(VO.cost_argmax(RingConfig(), 6, C_))


def test_argmax_at_the_range_edge(run):
    """A spread just below convert.relu_limit (2^14): every compared difference in range."""
    lim = convert.relu_limit(RingConfig())
    logits = np.array([[-lim / 2 + 1, lim / 2 - 1, 0.0, -lim / 2 + 1, 3.0],
                       [lim / 2 - 1, -lim / 2 + 1, lim / 2 - 1, 1.0, -2.0]])
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    np.testing.assert_array_equal(value(res), [1.0, 0.0])


def test_argmax_inside_the_error_region_stays_near_the_maximum(run, rng):
    """Logits closer than 2^-12 to the maximum may win; the winner is never further below
    the maximum than one error region per level."""
    C_ = 37
    logits = grid_logits(rng, (8, C_))
    for r in range(8):                         # near-ties of the maximum at random places
        top = logits[r].max()
        near = rng.choice(C_, 4, replace=False)
        logits[r, near] = top - rng.uniform(0, REGION, 4)
    res = run(lambda p, xs: VO.argmax_a(p, xs), share(logits))
    got = value(res).astype(int)
    assert ((got >= 0) & (got < C_)).all()
    chosen = logits[np.arange(8), got]
    assert (chosen >= logits.max(1) - math.ceil(math.log2(C_)) * REGION).all()


def test_argmax_refuses_bad_shapes(run):
    with pytest.raises(ValueError, match="argmax_a needs"):
        run(lambda p, xs: VO.argmax_a(p, xs), share(np.zeros(4)))


def test_shadow_argmax_is_numpy_and_records_the_spread():
    got = []
    p = ShadowParty(RingConfig(), lambda layer, site, kind, v: got.append((site, kind, v)))
    logits = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, 0.5, 0.0]])
    out = VO.argmax_a(p, ShadowParty.share(
        np.round(logits * 2 ** 18).astype(np.int64).view(np.uint64)), site="argmax")
    assert list(ShadowParty.value(out) / 2 ** 18) == [1.0, 0.0]
    assert got == [("argmax", "relu", 5.0 * 2 ** 18)]


# -------------------------------------------------------------------- embedding ----
def test_onehot_rows_are_ring_integers():
    oh = VO.onehot(np.array([[2, 0], [4, 4]]), 5)
    assert oh.dtype == np.uint64 and oh.shape == (2, 2, 5)
    np.testing.assert_array_equal(oh.argmax(-1), [[2, 0], [4, 4]])
    assert (oh.sum(-1) == 1).all()
    for bad in ([5], [-1], [0.5]):
        with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 5\)"):
            VO.onehot(np.array(bad), 5)


@pytest.mark.parametrize("B,T,V", [(1, 1, 11), (2, 3, 11), (1, 4, 1)])
def test_onehot_embed_picks_the_rows_exactly(run, rng, B, T, V):
    d = 5
    table = rng.normal(size=(V, d)) * 2
    ids = rng.integers(0, V, size=(B, T))
    res = run(lambda p, oh, tb: VO.onehot_embed(p, oh, tb), deal(VO.onehot(ids, V)),
              share(table))
    np.testing.assert_array_equal(reveal(res), ring.encode(table)[ids])     # bit-exact
    run.assert_cost(VO.cost_onehot_embed(RingConfig(), B, T, d))


def test_onehot_embed_refuses_bad_shapes(run):
    with pytest.raises(ValueError, match="onehot_embed needs"):
        run(lambda p, oh, tb: VO.onehot_embed(p, oh, tb), deal(VO.onehot([[1]], 4)),
            share(np.zeros((3, 2))))


# ---------------------------------------------------------------------- LM head ----
def head_inputs(rng, B, d, V, grid=16):
    """Rows and head on a 1/16 grid: every logit is a multiple of 2^-8, computed exactly
    (2^frac divides the product), so distinct logits differ by 16 error regions and equal
    ones tie exactly."""
    h = np.round(rng.normal(size=(B, d)) * grid) / grid
    w = np.round(rng.normal(size=(d, V)) * 0.5 * grid) / grid
    b = np.round(rng.normal(size=V) * grid) / grid
    return h, w, b


@pytest.mark.parametrize("B,V,bias", [(1, 37, True), (3, 50, False), (4, 129, True),
                                      (2, 1, True)])
def test_lm_head_token_is_numpys_argmax_and_declared_cost(run, rng, B, V, bias):
    h, w, b = head_inputs(rng, B, 16, V)
    logits = h @ w + (b if bias else 0)
    if bias:
        res = run(lambda p, hs, ws, bs: VO.lm_head_token(p, hs, ws, bs), share(h), share(w),
                  share(b))
    else:
        res = run(lambda p, hs, ws: VO.lm_head_token(p, hs, ws), share(h), share(w))
    assert res[0].shape == (B,)                          # the token, nothing of the logits
    np.testing.assert_array_equal(value(res), logits.argmax(1).astype(float))
    run.assert_cost(VO.cost_lm_head_token(RingConfig(), B, V))


def test_lm_head_token_ties_go_to_the_lower_index(run, rng):
    h, w, b = head_inputs(rng, 3, 8, 21)
    w[:, 4] = w[:, 17] = w[:, 9]                         # three equal columns ...
    b[[4, 9, 17]] = 40.0                                 # ... with the largest logits
    res = run(lambda p, hs, ws, bs: VO.lm_head_token(p, hs, ws, bs), share(h), share(w),
              share(b))
    np.testing.assert_array_equal(value(res), [4.0] * 3)


def test_lm_head_token_refuses_bad_shapes(run):
    with pytest.raises(ValueError, match="lm_head_token needs"):
        run(lambda p, hs, ws: VO.lm_head_token(p, hs, ws), share(np.zeros((2, 3))),
            share(np.zeros((4, 5))))
    with pytest.raises(ValueError, match="a bias of shape"):
        run(lambda p, hs, ws, bs: VO.lm_head_token(p, hs, ws, bs), share(np.zeros((2, 3))),
            share(np.zeros((3, 5))), share(np.zeros(4)))


# -------------------------------------------------------------------- its views ----
def _party_view(r, fn, slots, key):
    """One run in which party ``r``'s whole state is fixed - its two slots of every input
    (``slots``: per input its three slots; slot r + 2, the one r lacks, is what differs
    between secrets) and its PRG keys (``key``) - while everything r does not hold is fresh:
    the key its neighbours share and their private keys. Returns what r received (what its
    neighbours posted to it), in order - its ring words (uint64 messages, then r's result
    slots a, b and their sum, which r computes from them) and the bits of its packed-bit
    messages (uint8) - and the result's shares."""
    parties = make_parties(seed=key)
    pair = [key + b"pair%d" % i for i in range(3)]
    pair[(r + 1) % 3] = os.urandom(32)                 # held by r + 1 and r + 2 only
    for q in ((r + 1) % 3, (r + 2) % 3):
        parties[q].prg = PRG.for_job(pair[(q - 1) % 3], pair[q], os.urandom(32), "job")
    got = {np.dtype(np.uint64): [], np.dtype(np.uint8): []}
    for p in parties:
        orig = p.comm._post

        def post(direction, op, arrays, _orig=orig, _to=p.comm.peer):
            if _to(direction) == r:
                for a in arrays:
                    got[a.dtype].append(a.reshape(-1).copy())
            _orig(direction, op, arrays)
        p.comm._post = post
    args = [tuple(AShare(s[i].copy(), s[(i + 1) % 3].copy()) for s in slots) for i in range(3)]
    out = run_parties(fn, args, parties=parties)
    mine = out[r]
    got[np.dtype(np.uint64)] += [mine.a.reshape(-1), mine.b.reshape(-1),
                                 (mine.a + mine.b).reshape(-1)]
    words, packed = (np.concatenate(got[np.dtype(t)] or [np.zeros(0, t)])
                     for t in (np.uint64, np.uint8))
    return words, np.unpackbits(packed), out


def _slots(x, r, fixed):
    """The three slots of ``x`` (reals) with the two ring arrays ``fixed`` in places r and
    r + 1: the third, x minus them, is the only one that depends on x."""
    out = [None] * 3
    out[r], out[(r + 1) % 3] = fixed
    out[(r + 2) % 3] = ring.encode(x) - fixed[0] - fixed[1]
    return out


def _no_fixed_relation(words, bits):
    """Over runs (rows) with the receiver's state fixed: no word of its view, nor the sum or
    difference of two, is constant (a share received beside the receiver's own slots of the
    same sharing: an opened secret); no two varying received bits are equal or
    complementary in every run."""
    runs = words.shape[0]
    sums = words[:, :, None] + words[:, None, :]
    diffs = words[:, :, None] - words[:, None, :]
    off = ~np.eye(words.shape[1], dtype=bool)
    assert (words != words[0]).any(axis=0).all()
    assert (sums != sums[0]).any(axis=0).all() and (diffs != diffs[0]).any(axis=0)[off].all()
    cols = bits[:, bits.any(axis=0) & ~bits.all(axis=0)].T     # varying positions
    keys = {np.packbits(c).tobytes() for c in cols} | {np.packbits(1 - c).tobytes()
                                                       for c in cols}
    assert len(keys) == 2 * len(cols), f"{runs} runs: two received bits always agree"


def test_each_partys_view_of_lm_head_token_is_independent_of_the_logits(rng):
    """Two hidden rows whose logits order opposite ways (every comparison of the tournament
    flips between them). For each party, its own state held fixed (its share slots of h and
    W, its PRG keys) and everything else fresh: the bits it receives have the same
    per-position frequencies for both rows (a comparison bit or any bit of a secret sent
    unmasked would be 0 for one row and 1 for the other), the same layout, and are fair
    coins, and no two values of its view are tied by a fixed relation (an opened sharing:
    also a token opened to every party, which the frequencies alone would miss); the opened
    result is the token alone."""
    V, d, runs = 8, 4, 60
    w = np.zeros((d, V))
    w[0] = np.arange(V) * 0.75                         # logits h0 * 0.75 * index
    hs = {"up": np.array([[1.0, 0, 0, 0]]), "down": np.array([[-1.0, 0, 0, 0]])}
    fn = lambda p, h, ws: VO.lm_head_token(p, h, ws)    # noqa: E731
    rand = lambda shape: rng.integers(0, 2 ** 64, size=shape, dtype=np.uint64)  # noqa: E731
    for r in range(3):
        h_fixed, w_fixed = (rand((1, d)), rand((1, d))), (rand((d, V)), rand((d, V)))
        key = bytes(rng.integers(0, 256, 32, dtype=np.uint8))
        freq = {}
        for name, h in hs.items():
            views = [_party_view(r, fn, [_slots(h, r, h_fixed), _slots(w, r, w_fixed)], key)
                     for _ in range(runs)]
            for _, _, out in views:
                assert out[0].shape == (1,) and value(out) == [float((h @ w).argmax())]
            words, bits = (np.stack([v[k] for v in views]) for k in (0, 1))
            _no_fixed_relation(words, bits)
            freq[name] = np.concatenate([np.unpackbits(words.view(np.uint8), axis=1), bits],
                                        axis=1).mean(axis=0)
        up, down = freq["up"], freq["down"]
        assert up.size > 0
        # 60 runs: a per-position difference has sd 0.091; 0.6 is 6.6 sd, a leak is 1.0
        assert np.abs(up - down).max() < 0.6, r
        live = (up > 0) | (down > 0)                   # not the padding of packed bits
        assert abs(up[live].mean() - 0.5) < 0.03 and abs(down[live].mean() - 0.5) < 0.03, r
