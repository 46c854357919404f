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

The layer workloads (secure functions, inputs, float64 references) come from the one catalog
:mod:`protocols.workloads`; ``layer_case`` and ``model_prefixes`` are re-exported for the
client side (:mod:`net.remote_bench`).
"""
from __future__ import annotations

import time

import numpy as np

from mpc3.party import Party, RingConfig
from mpc3.shares import AShare, BShare

from . import model as M
from .workloads import LAYER_WORKLOADS, layer_fn
from .workloads import layer_case, model_prefixes  # noqa: F401 (re-exported for net.remote_bench)
from .workloads import layer_inputs as _layer_inputs

OPS = ("mult", "matmul", "trunc", "drelu", "relu", "sqrt-inv", "reciprocal", "exp")
STATS_FIELDS = ("wall_ns", "bytes", "messages", "rounds")


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
