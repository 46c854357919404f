"""Benchmark job kinds: run one workload on the parties' stored shares and time it there.

Job kinds (:data:`JOB_KINDS`, registered in party processes by :mod:`net.remote_bench`):

* ``bench_layer`` - one Privformer layer / stack (the workloads of ``mpc3 bench layer``) on
  uploaded model shares and the submitted input ``X`` (and ``E``, the encoder output, for the
  decoder workloads). Params: ``workload``, ``config`` (a ModelConfig dict), ``repeat``,
  ``block``, ``exp``.
* ``bench_op`` - one kernel (the workloads of ``mpc3 bench op``) on operands uploaded as the
  "model" tensors ``in0``, ``in1``, ... Params: ``op``, ``repeat``, ``trunc``, ``shift``.

Measurement. After a one-element barrier exchange (so the three parties start together and the
streams are warm), each of ``repeat`` runs is timed on this party with ``perf_counter`` and
its communicator counters are differenced: protocol only, shares already in place. The three
parties then swap their figures in one extra round (after the last snapshot, so it is not
counted) and return them as the output ``stats``: a *public* sharing (slot 0 = value, slots
1, 2 = 0) of a (3, 4, repeat) uint64 array [party][wall_ns, bytes, messages, rounds][run], so
the unchanged client API reconstructs it with its replica check. The workload's output of the
last run is returned as ``Y`` (boolean outputs as their two bit-plane slots).

Workload functions live here (protocols/ may not import net/); :func:`layer_case` also builds
the plaintext inputs and the float64 reference that the client compares against.
"""
from __future__ import annotations

import time

import numpy as np

from mpc3.party import Party, RingConfig
from mpc3.shares import AShare, BShare

from . import model as M

LAYER_WORKLOADS = ("mha", "mmha-qk", "mmha-vk", "ffn", "ln", "encoder", "decoder",
                   "softmax-attn", "masked-softmax-attn", "decoder-step")
OPS = ("mult", "matmul", "trunc", "drelu", "relu", "sqrt-inv", "reciprocal", "exp")
STATS_FIELDS = ("wall_ns", "bytes", "messages", "rounds")


# ------------------------------------------------------------------ workloads ----
def model_prefixes(name: str) -> tuple[str, ...]:
    """Model tensors a layer workload reads (only these are uploaded)."""
    return {"mha": ("enc.0.attn.",), "mmha-qk": ("dec.0.self.",), "mmha-vk": ("dec.0.self.",),
            "ffn": ("enc.0.ffn.",), "ln": ("enc.0.ln1.",), "encoder": ("enc.",),
            "decoder": ("dec.",), "decoder-step": ("dec.",),
            "softmax-attn": (), "masked-softmax-attn": ()}[name]


def layer_fn(name: str, cfg: M.ModelConfig, block: int | None = None, exp: str = "poly"):
    """Per-party ``fn(party, shares, *input_shares) -> AShare`` of a layer workload."""
    from . import attention as A
    from . import decoder as D, encoder as E, ffn as F, layernorm as LN, mha as MH
    from .secure_model import sub
    if name in ("mha", "mmha-qk", "mmha-vk"):
        causal = name != "mha"
        pre = "dec.0.self" if causal else "enc.0.attn"
        form = "qk" if name == "mmha-qk" else "vk"
        return lambda p, sh, x: MH.mha(p, cfg, sub(sh, pre), x, causal=causal,
                                       masked_form=form, block=block)
    if name == "ffn":
        return lambda p, sh, x: F.ffn(p, sub(sh, "enc.0.ffn"), x)
    if name == "ln":
        return lambda p, sh, x: LN.layernorm(p, x, sh["enc.0.ln1.gamma"], sh["enc.0.ln1.beta"],
                                             cfg.ln_eps)
    if name == "encoder":
        return lambda p, sh, x: E.encoder(p, cfg, sh, x)
    if name == "decoder":
        return lambda p, sh, y, e: D.decoder(p, cfg, sh, y, e)
    if name == "decoder-step":
        def step(p, sh, ys, es):     # the whole prefix, one token at a time (O(1) per token)
            st = D.DecodeState.start(p, cfg, sh, es)
            outs = [D.decoder_step(p, cfg, sh, st, ys[:, t]) for t in range(ys.shape[1])]
            return AShare(np.stack([o.a for o in outs], 1), np.stack([o.b for o in outs], 1))
        return step
    if name in ("softmax-attn", "masked-softmax-attn"):
        masked = name.startswith("masked")
        return lambda p, sh, q, k, v: A.softmax_attention(p, q, k, v, masked=masked, exp=exp)
    raise ValueError(f"unknown layer workload {name!r}; choose from {LAYER_WORKLOADS}")


def layer_case(name: str, cfg: M.ModelConfig, weights: M.Weights, batch: int, rng,
               fold: bool = True, exp: str = "poly") -> tuple[list[np.ndarray], np.ndarray]:
    """(plaintext inputs, float64 reference) as in ``mpc3 bench layer``: x uniform in
    [-10, 10]; decoder encoder-output uniform in [-2, 2]; softmax q, k, v uniform in [-1, 1]."""
    from . import attention as A
    B, S, d, h, dh = batch, cfg.max_len, cfg.d_model, cfg.n_heads, cfg.d_head
    folded = M.fold_omega(weights, cfg) if fold else None
    x = rng.uniform(-10, 10, (B, S, d))
    if name in ("mha", "mmha-qk", "mmha-vk"):
        causal = name != "mha"
        pre = "dec.0.self" if causal else "enc.0.attn"
        return [x], M.ref_mha(cfg, M.attn_params(weights, pre, folded), x, x, causal=causal)
    if name == "ffn":
        return [x], M.ref_ffn(x, *(weights[f"enc.0.ffn.{k}"] for k in ("w1", "b1", "w2", "b2")))
    if name == "ln":
        return [x], M.ref_layernorm(x, weights["enc.0.ln1.gamma"], weights["enc.0.ln1.beta"],
                                    cfg.ln_eps)
    if name == "encoder":
        return [x], M.ref_encoder(cfg, weights, x, folded=folded)
    if name in ("decoder", "decoder-step"):
        e = rng.uniform(-2, 2, (B, S, d))
        return [x, e], M.ref_decoder(cfg, weights, x, e, folded=folded)
    if name in ("softmax-attn", "masked-softmax-attn"):
        q, k, v = (rng.uniform(-1, 1, (B, h, S, dh)) for _ in range(3))
        return [q, k, v], A.ref_softmax_attention(q, k, v, masked=name.startswith("masked"),
                                                  exp=exp)
    raise ValueError(f"unknown layer workload {name!r}; choose from {LAYER_WORKLOADS}")


def op_fn(name: str, shift: int = 10):
    """Per-party ``fn(party, *operand_shares)`` of a kernel workload (as ``mpc3 bench op``)."""
    from mpc3.kernels import arith, convert, fxp
    return {"mult": lambda p, x, y: arith.mul_aa(p, x, y),
            "matmul": lambda p, x, y: arith.matmul_aa(p, x, y),
            "trunc": lambda p, x: arith.trunc_a(p, x, shift),
            "drelu": lambda p, x: convert.drelu_a(p, x),
            "relu": lambda p, x: convert.relu_a(p, x),
            "sqrt-inv": lambda p, x: fxp.sqrt_inv_a(p, x),
            "reciprocal": lambda p, x: fxp.reciprocal_a(p, x),
            "exp": lambda p, x: fxp.exp_a(p, x, "limit")}[name]


# --------------------------------------------------------------- measurement ----
def timed_runs(party: Party, run, repeat: int) -> tuple[object, np.ndarray]:
    """Barrier, then ``repeat`` timed calls of ``run()``; returns (last output, this
    party's (4, repeat) [wall_ns, bytes, messages, rounds])."""
    one = np.zeros(1, np.uint64)
    party.comm.exchange([one], [one], from_next=True, from_prev=True)      # barrier, 16 B
    mine = np.zeros((len(STATS_FIELDS), repeat), np.uint64)
    out = None
    for k in range(repeat):
        s0 = party.stats.snapshot()
        t0 = time.perf_counter_ns()
        out = run()
        t1 = time.perf_counter_ns()
        d = party.stats.snapshot() - s0
        mine[:, k] = (t1 - t0, d.bytes_sent, d.messages, d.rounds)
    return out, mine


def public_stats(party: Party, mine: np.ndarray) -> AShare:
    """Swap the parties' figures (one uncounted round) -> public sharing of (3, 4, R)."""
    nxt, prv = party.comm.exchange([mine], [mine], from_next=True, from_prev=True)
    allp = np.zeros((3,) + mine.shape, np.uint64)
    allp[party.rank] = mine
    allp[(party.rank + 1) % 3] = nxt[0].reshape(mine.shape)
    allp[(party.rank - 1) % 3] = prv[0].reshape(mine.shape)
    zero = np.zeros_like(allp)
    # slot 0 holds the value: party 0 has (slot0, slot1), party 2 has (slot2, slot0)
    return AShare(allp if party.rank == 0 else zero, allp if party.rank == 2 else zero)


def _as_output(y) -> AShare:
    if isinstance(y, BShare):      # bit-plane slots travel in an AShare container
        return AShare(y.a, y.b)
    return y


def _repeat(params: dict) -> int:
    r = params.get("repeat", 1)
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 1000:
        raise ValueError("repeat must be an integer in 1..1000")
    return r


def _layer_inputs(name: str) -> tuple[str, ...]:
    if name in ("decoder", "decoder-step"):
        return ("X", "E")
    if name in ("softmax-attn", "masked-softmax-attn"):
        return ("Q", "K", "V")
    return ("X",)


# ------------------------------------------------------------------ job kinds ----
def bench_layer(party: Party, model: dict, inputs: dict, params: dict) -> dict:
    name = params["workload"]
    cfg = M.ModelConfig.from_dict(params["config"])
    fn = layer_fn(name, cfg, params.get("block"), params.get("exp", "poly"))
    args = [inputs[k] for k in _layer_inputs(name)]
    out, mine = timed_runs(party, lambda: fn(party, model, *args), _repeat(params))
    return {"Y": _as_output(out), "stats": public_stats(party, mine)}


def validate_bench_layer(model: dict, inputs: dict, params: dict) -> None:
    name = params.get("workload")
    if name not in LAYER_WORKLOADS:
        raise ValueError(f"workload must be one of {LAYER_WORKLOADS}, got {name!r}")
    M.ModelConfig.from_dict(params.get("config") or {})
    _repeat(params)
    want = set(_layer_inputs(name))
    if set(inputs) != want:
        raise ValueError(f"{name} takes inputs {sorted(want)}, got {sorted(inputs)}")


def bench_op(party: Party, model: dict, inputs: dict, params: dict) -> dict:
    trunc = params.get("trunc", party.cfg.trunc)
    if trunc != party.cfg.trunc:
        party.cfg = RingConfig(frac=party.cfg.frac, trunc=trunc,
                               relu_bound_bits=party.cfg.relu_bound_bits,
                               relu_drop_bits=party.cfg.relu_drop_bits)
    fn = op_fn(params["op"], int(params.get("shift", 10)))
    operands = [model[f"in{i}"] for i in range(sum(1 for k in model if k.startswith("in")))]
    out, mine = timed_runs(party, lambda: fn(party, *operands), _repeat(params))
    return {"Y": _as_output(out), "stats": public_stats(party, mine)}


def validate_bench_op(model: dict, inputs: dict, params: dict) -> None:
    if params.get("op") not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {params.get('op')!r}")
    if params.get("trunc", "exact") not in ("exact", "prob"):
        raise ValueError("trunc must be 'exact' or 'prob'")
    if "in0" not in model:
        raise ValueError("bench_op needs operands in0, in1, ... as model tensors")
    _repeat(params)


#: name -> (job function, validator); registered with the party server by
#: :mod:`net.remote_bench` (``job_modules = ["net.remote_bench"]``), since protocols/ does
#: not import net/.
JOB_KINDS = {"bench_layer": (bench_layer, validate_bench_layer),
             "bench_op": (bench_op, validate_bench_op)}
