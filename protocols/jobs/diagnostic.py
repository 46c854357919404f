"""Diagnostic job kinds: computations on arbitrary uploaded tensors, for benchmark and test
processes only (never in :data:`protocols.jobs.PRODUCTION`: ``linear`` with ``X = I`` returns
any weight it is pointed at).

* ``linear`` - ``Y = X @ W`` for the model tensor named by ``weight`` (default ``W``),
  ``repeat`` times (square W); tests of the network layer.
* ``bench_layer`` - one layer workload of ``mpc3 bench layer`` on uploaded shares and inputs
  ``X`` (and ``E``, the encoder output, for decoder workloads; ``Q, K, V`` for the softmax
  baselines). Params: ``workload``, ``config`` (a ModelConfig dict), ``repeat``, ``block``,
  ``exp``.
* ``bench_op`` - one kernel of ``mpc3 bench op`` on operands uploaded as the tensors ``in0``,
  ``in1``, ... (:mod:`mpc3.kernels.catalog`). Params: ``op``, ``repeat``, ``trunc``.

Measurement. After a one-element barrier exchange (so the three parties start together and the
streams are warm), each of ``repeat`` runs is timed on this party with ``perf_counter`` and
its communicator counters are differenced: protocol only, shares already in place. The three
parties then swap their figures in one extra round (after the last snapshot, so it is not
counted) and return them as the output ``stats``: a *public* sharing (slot 0 = value, slots
1, 2 = 0) of a (3, 4, repeat) uint64 array [party][wall_ns, bytes, messages, rounds][run], so
the client reconstructs it with its replica check. The workload's output of the last run is
returned as ``Y`` (boolean outputs as their two bit-plane slots).
"""
from __future__ import annotations

import time

import numpy as np

from mpc3.comm import MalformedMessage
from mpc3.kernels import catalog
from mpc3.kernels.arith import matmul_aa
from mpc3.party import Party, RingConfig
from mpc3.shares import AShare, BShare

from .. import model as M
from .contract import ENCODER_DECODER, TENSORS, JobContext, JobSpec, TensorSpec
from .workloads import LAYER_WORKLOADS, layer_fn, layer_inputs

STATS_FIELDS = ("wall_ns", "bytes", "messages", "rounds")
MAX_REPEAT = 1000
#: Kernels ``bench_op`` runs: those whose operands are all fixed-point AShares (uploaded as
#: the model tensors in0, in1, ...) and whose output travels as a share.
OPS = tuple(k.name for k in catalog.KERNELS.values()
            if set(k.operands) == {"fxp"} and k.output in ("fxp", "int", "bit"))


# --------------------------------------------------------------- measurement ----
def timed_runs(party: Party, run, repeat: int) -> tuple[object, np.ndarray]:
    """Barrier, then ``repeat`` timed calls of ``run()``; returns (last output, this
    party's (4, repeat) [wall_ns, bytes, messages, rounds])."""
    barrier(party)
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


def barrier(party: Party) -> None:
    """One round of a zero word to each neighbour (16 bytes a party): the three parties
    start what follows together. In malicious mode each receiver checks the zeros itself
    (a sender of anything else is named: MalformedMessage)."""
    one = np.zeros(1, np.uint64)
    nxt, prv = party.comm.exchange([one], [one], from_next=True, from_prev=True)
    if party.checks is None:
        return
    for got, sender in ((nxt[0], (party.rank + 1) % 3), (prv[0], (party.rank - 1) % 3)):
        if got.shape != one.shape or got.any():
            raise MalformedMessage(sender, party.rank, "a barrier's word is not one zero")
    party.checks.public(party, 2 * one.nbytes)


def public_stats(party: Party, mine: np.ndarray) -> AShare:
    """Swap the parties' figures (one uncounted round) -> public sharing of (3, 4, R). In
    malicious mode the figures are each party's report of its own costs: nothing proves
    them (:meth:`mpc3.checks.Checks.public`)."""
    nxt, prv = party.comm.exchange([mine], [mine], from_next=True, from_prev=True)
    if party.checks is not None:
        party.checks.public(party, 2 * mine.nbytes)
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


def _repeat(params) -> int:
    r = params.get("repeat", 1)
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPEAT:
        raise ValueError(f"repeat must be an integer in 1..{MAX_REPEAT}")
    return r


# ------------------------------------------------------------------ job kinds ----
def run_linear(ctx: JobContext, inputs: dict) -> dict:
    w = ctx.model.shares[ctx.params.get("weight", "W")]
    y = inputs["X"]
    for _ in range(_repeat(ctx.params)):
        y = matmul_aa(ctx.party, y, w)
    return {"Y": y}


def validate_linear(model, inputs: dict, params) -> None:
    wname = params.get("weight", "W")
    shapes = model.shapes()
    if wname not in shapes:
        raise ValueError(f"model has no tensor {wname!r}")
    w, x = shapes[wname], inputs["X"]
    if len(w) != 2 or x[-1] != w[0]:
        raise ValueError(f"shapes do not compose: X {tuple(x)} @ {wname} {tuple(w)}")
    if _repeat(params) > 1 and w[0] != w[1]:
        raise ValueError("repeat > 1 needs a square weight")


def run_bench_layer(ctx: JobContext, inputs: dict) -> dict:
    params, party = ctx.params, ctx.party
    name = params["workload"]
    cfg = M.ModelConfig.from_dict(params["config"])
    fn = layer_fn(name, cfg, params.get("block"), params.get("exp", "poly"))
    args = [inputs[k] for k in layer_inputs(name)]
    out, mine = timed_runs(party, lambda: fn(party, ctx.model.shares, *args), _repeat(params))
    return {"Y": _as_output(out), "stats": public_stats(party, mine)}


def validate_bench_layer(model, inputs: dict, params) -> None:
    name = params.get("workload")
    if name not in LAYER_WORKLOADS:
        raise ValueError(f"workload must be one of {LAYER_WORKLOADS}, got {name!r}")
    M.ModelConfig.from_dict(params.get("config") or {})
    _repeat(params)
    want = set(layer_inputs(name))
    if set(inputs) != want:
        raise ValueError(f"{name} takes inputs {sorted(want)}, got {sorted(inputs)}")


def run_bench_op(ctx: JobContext, inputs: dict) -> dict:
    party, params = ctx.party, ctx.params
    trunc = params.get("trunc", party.cfg.trunc)
    if trunc != party.cfg.trunc:
        party.cfg = RingConfig(frac=party.cfg.frac, trunc=trunc,
                               relu_bound_bits=party.cfg.relu_bound_bits,
                               relu_drop_bits=party.cfg.relu_drop_bits)
    fn = catalog.KERNELS[params["op"]].run
    shares = ctx.model.shares
    operands = [shares[f"in{i}"] for i in range(sum(1 for k in shares if k.startswith("in")))]
    out, mine = timed_runs(party, lambda: fn(party, *operands), _repeat(params))
    return {"Y": _as_output(out), "stats": public_stats(party, mine)}


def validate_bench_op(model, inputs: dict, params) -> None:
    if params.get("op") not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {params.get('op')!r}")
    if params.get("trunc", "exact") not in ("exact", "prob"):
        raise ValueError("trunc must be 'exact' or 'prob'")
    if "in0" not in model.shapes():
        raise ValueError("bench_op needs operands in0, in1, ... as model tensors")
    _repeat(params)


_ANY = (TENSORS, ENCODER_DECODER)
_Y = TensorSpec("Y", ("...",))
_STATS = TensorSpec("stats", ("3", "4", "repeat"))


SPECS = (
    JobSpec("linear", run_linear, (TensorSpec("X", ("N", "K")),), (TensorSpec("Y", ("N", "M")),),
            _ANY, computation="diagnostic", validate=validate_linear,
            params=("weight", "repeat"), diagnostic=True,
            doc="Y = X @ model[weight]: network tests (returns any weight for X = I)"),
    JobSpec("bench_layer", run_bench_layer, None, (_Y, _STATS), _ANY, computation="diagnostic",
            validate=validate_bench_layer, params=("workload", "config", "repeat", "block",
                                                   "exp"),
            diagnostic=True, doc="time one layer workload on uploaded shares"),
    JobSpec("bench_op", run_bench_op, (TensorSpec("X", ("1",)),), (_Y, _STATS), _ANY,
            computation="diagnostic", validate=validate_bench_op,
            params=("op", "repeat", "trunc"), diagnostic=True,
            doc="time one kernel on operands uploaded as in0, in1, ..."),
)
