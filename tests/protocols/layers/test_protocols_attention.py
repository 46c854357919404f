"""Attention cores (Alg. 1-3, incremental state, softmax baselines): values and declared costs.

Shapes are small and odd (B=2, h=3, S=7, r=10, dh=8). Features Q', K' are nonnegative like
ReLU outputs. Error bound: fixed point with 18 fractional bits and exact truncation, two
chained products -> |err| <= 2e-4 * (1 + max|ref|) (measured ~1e-5 relative).
"""
import numpy as np
import pytest

from mpc3 import ring
from protocols.layers import attention as A

from conftest import share, value

B, H, S, R, DH = 2, 3, 7, 10, 8


def feats(rng, *shape):
    return np.maximum(rng.normal(0, 1, shape), 0)


def close(got, ref, tol=2e-4):
    assert np.max(np.abs(got - ref)) <= tol * (1 + np.max(np.abs(ref))), \
        np.max(np.abs(got - ref))


@pytest.fixture
def qkv(rng):
    return feats(rng, B, H, S, R), feats(rng, B, H, S, R), rng.uniform(-1, 1, (B, H, S, DH))


@pytest.mark.parametrize("order", ["kv", "qk", "auto"])
def test_relu_attention_orders(run, qkv, order):
    q, k, v = qkv
    out = run(lambda p, a, b, c: A.relu_attention(p, a, b, c, order=order),
              share(q), share(k), share(v))
    close(value(out), q @ (np.swapaxes(k, -1, -2) @ v))
    run.assert_cost(A.cost_relu_attention(run.cfg, B, H, S, S, R, DH, order))


def test_auto_order_picks_cheaper():
    assert A.choose_order(1, 8, 64, 64, 266, 64) == "qk"      # 64*64 < 266*64
    assert A.choose_order(1, 8, 512, 512, 266, 64) == "kv"
    kv = A.cost_relu_attention(_Cfg(), 1, 8, 512, 512, 266, 64, "kv")
    qk = A.cost_relu_attention(_Cfg(), 1, 8, 512, 512, 266, 64, "qk")
    assert kv.bytes_total < qk.bytes_total


class _Cfg:
    frac, trunc = ring.DEFAULT_FRAC, "exact"


def ref_masked(q, k, v):
    return np.tril(q @ np.swapaxes(k, -1, -2)) @ v


def test_masked_qk(run, qkv):
    q, k, v = qkv
    out = run(A.masked_attention_qk, share(q), share(k), share(v))
    close(value(out), ref_masked(q, k, v))
    run.assert_cost(A.cost_masked_qk(run.cfg, B, H, S, R, DH))


@pytest.mark.parametrize("block", [1, 2, 3, 7, None])
def test_masked_vk_blocks_agree_with_qk(run, qkv, block):
    q, k, v = qkv
    out = run(lambda p, a, b, c: A.masked_attention_vk(p, a, b, c, block=block),
              share(q), share(k), share(v))
    got = value(out)
    close(got, ref_masked(q, k, v))
    qk = value(run(A.masked_attention_qk, share(q), share(k), share(v)))
    close(got, qk)
    vk_cost = A.cost_masked_vk(run.cfg, B, H, S, R, DH, block)
    assert vk_cost.rounds == A.cost_masked_qk(run.cfg, B, H, S, R, DH).rounds  # rounds flat in S
    run(lambda p, a, b, c: A.masked_attention_vk(p, a, b, c, block=block),
        share(q), share(k), share(v))
    run.assert_cost(vk_cost)


def test_best_block_minimises_declared_bytes():
    for S_, r, dh in ((7, 10, 8), (64, 266, 64), (512, 266, 64), (200, 16, 4)):
        best = A.best_block(S_, r, dh)
        costs = {L: A.cost_masked_vk(_Cfg(), 1, 1, S_, r, dh, L).bytes_total
                 for L in range(1, S_ + 1)}
        assert costs[best] == min(costs.values())


@pytest.mark.parametrize("block", [1, 3, None])
def test_incremental_state_equals_masked(run, qkv, block):
    q, k, v = qkv

    def fn(p, a, b, c):
        st = A.PrefixState.empty(B, H, R, DH, block)
        outs = [A.attention_step(p, st, a[:, :, t:t + 1], b[:, :, t:t + 1], c[:, :, t:t + 1])
                for t in range(S)]
        assert st.t == S and st.cached < st.block
        return A.AShare.concat(outs, axis=2)

    close(value(run(fn, share(q), share(k), share(v))), ref_masked(q, k, v))


@pytest.mark.parametrize("block", [1, 3])
def test_incremental_step_costs(qkv, block):
    """Every step's traffic equals its declaration; it depends only on t mod block."""
    from mpc3.sim import make_parties, run_parties
    q, k, v = qkv
    parties = make_parties()
    declared, measured = [], []

    def fn(p, a, b, c):
        st = A.PrefixState.empty(B, H, R, DH, block)
        for t in range(S):
            before = p.stats.snapshot()
            if p.rank == 0:
                declared.append(A.cost_attention_step(p.cfg, B, H, R, DH, st.cached,
                                                      st.folded > 0, block))
            A.attention_step(p, st, a[:, :, t:t + 1], b[:, :, t:t + 1], c[:, :, t:t + 1])
            d = p.stats - before
            measured.append((t, p.rank, d.bytes_sent, d.rounds))

    run_parties(fn, [tuple(x[i] for x in (share(q), share(k), share(v))) for i in range(3)],
                parties=parties)
    for t, rank, nbytes, rounds in measured:
        assert (nbytes, rounds) == (declared[t].bytes_per_party[rank], declared[t].rounds)
    per_t = [declared[t].bytes_total for t in range(S)]
    assert all(per_t[t] == per_t[t + block] for t in range(block, S - block))


def test_mul_many_cost_is_one_product(run, rng):
    x, y = rng.uniform(-2, 2, (5, 4)), rng.uniform(-2, 2, (4, 3))
    z = rng.uniform(-2, 2, (5, 4))
    got = run(lambda p, a, b, c: A.mul_many(p, [(a, b, "matmul"), (a, c, "mul")]),
              share(x), share(y), share(z))
    close(value([g[0] for g in got]), x @ y)
    close(value([g[1] for g in got]), x * z)
    run.assert_cost(A.cost_mul_many(15 + 20, True, run.cfg))


def test_bad_arguments(run, qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="order"):
        run(lambda p, a, b, c: A.relu_attention(p, a, b, c, order="vq"),
            share(q), share(k), share(v))
    with pytest.raises(ValueError, match="block"):
        run(lambda p, a, b, c: A.masked_attention_vk(p, a, b, c, block=S + 1),
            share(q), share(k), share(v))
    with pytest.raises(ValueError, match="Sq == Sk"):
        run(A.masked_attention_qk, share(q[:, :, :3]), share(k), share(v))
    with pytest.raises(ValueError, match="masked form"):
        run(lambda p, a, b, c: A.masked_attention(p, a, b, c, form="kq"),
            share(q), share(k), share(v))
