"""``mpc3 bench layer NAME``: one Privformer layer (Table 2 workloads) on three parties.

The workloads (secure function, inputs, float64 reference, declared cost) come from the one
catalog :mod:`protocols.jobs.workloads`. Random weights (:func:`protocols.model.random_weights`,
Xavier) and, as in Privformer Sec. 9.1, single layers get inputs drawn uniformly from
[-10, 10] (encoded with 18 fractional bits instead of the paper's 13); the encoder/decoder
stacks get unit-variance inputs and the softmax baselines per-head Q, K, V in [-1, 1] (why:
see the catalog), stated in the JSON under ``params.inputs``. attn_norm defaults to "const"
with c = 1 / (r * seq) (the paper's public constant; "mean" is selectable).

Transports: ``inproc`` (three threads over in-memory queues) or ``grpc`` (three party routers
of :mod:`net.peer.router` in this process, talking real gRPC over loopback with mTLS; certificates
are generated in a temporary directory).

Metrics (DESIGN.md names): wall_s {min, median} over ``--repeat`` runs with shares already in
place; bytes_total / bytes_per_party / messages / rounds as counted by the communicators;
max_abs_err against the float64 reference; max_rel_err = max_abs_err / max |reference|;
``plain_wall_s`` the float64 reference of the same workload timed in the same run (input
generation included, negligible; min of ``PLAIN_RUNS``) and ``peak_rss_bytes`` the process's
peak memory. Only the tensors the workload reads are shared, each slot held once for the three
parties.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import tempfile
import time

import numpy as np

from mpc3.procinfo import peak_rss
from protocols.jobs.workloads import LAYER_WORKLOADS as WORKLOADS


def _options(a):
    from protocols.jobs.workloads import Options
    return Options(fold=a.fold, block=a.block, decode_block=a.decode_block, exp=a.exp,
                   input_range=a.input_range)


def input_range(a) -> float:
    """Half-width of the uniform inputs: the paper's 10 for single layers, sqrt(3) for stacks."""
    from protocols.jobs import workloads
    return workloads.get(a.name).x_range(_options(a))


def _config(a, stacks: tuple[str, ...] = ("enc", "dec")):
    """The model config of the workload; ``stacks`` it reads (the other gets the fewest
    layers a config allows, so the benchmark holds only what it runs)."""
    from protocols import model as M
    if a.d_model % a.heads:
        raise ValueError(f"--d-model {a.d_model} is not divisible by --heads {a.heads}")
    c = a.attn_c if a.attn_c is not None else 1.0 / (a.features * a.seq)
    return M.ModelConfig(d_model=a.d_model, n_heads=a.heads, d_head=a.d_model // a.heads,
                         n_features=a.features, d_ff=a.d_ff,
                         n_enc_layers=a.layers if "enc" in stacks else 1,
                         n_dec_layers=a.layers if "dec" in stacks else 0, attn_c=c,
                         attn_norm=a.attn_norm, norm_first=False, src_vocab=2, tgt_vocab=2,
                         max_len=a.seq).validate()


def _stacks(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(s for s in ("enc", "dec") if any(p.startswith(s + ".") for p in prefixes)) \
        or ("enc",)


@contextlib.contextmanager
def _transport(kind: str):
    """Yields a factory of three fresh parties: in-process queues, or a real gRPC mesh of
    three routers on loopback with mTLS (certificates generated in a temporary directory)."""
    from mpc3 import sim
    if kind == "inproc":
        yield lambda: sim.make_parties(timeout=600.0)
        return
    from net import keys
    from net.peer import mesh
    with tempfile.TemporaryDirectory() as d:
        keys.generate(d)
        routers, stop = mesh.local_mesh(d)
        ids = itertools.count()

        def parties():
            jid = f"bench-layer-{next(ids)}"
            return [r.open_job(jid, timeout=600.0) for r in routers]
        try:
            yield parties
        finally:
            stop()


#: The float64 reference is timed this many times (min): one BLAS call of a few ms on a shared
#: 2-core machine varied by +-30 % between two runs, and it is the denominator of a ratio.
PLAIN_RUNS = 5


def run_layer(a) -> dict:
    from mpc3 import ring, sim
    from mpc3.sharing import reveal
    from protocols import model as M
    from protocols.jobs import workloads
    from protocols.layers.secure_model import deal_tensors, plain_tensors, share_input
    from net.party import malloc
    arenas_capped = a.transport == "inproc" and malloc.one_arena()
    kept = malloc.keep_freed_memory()             # once per process: `mpc3 bench` did it
    wl, opts = workloads.get(a.name), _options(a)
    cfg = _config(a, _stacks(wl.prefixes))
    w = M.random_weights(cfg, seed=a.seed)
    fn = wl.secure(cfg, opts)
    plain_walls = []
    for _ in range(PLAIN_RUNS):  # the float64 reference of the same workload, same inputs
        t0 = time.perf_counter()
        inputs, ref = wl.case(cfg, w, a.batch, np.random.default_rng(a.seed + 1), opts)
        plain_walls.append(time.perf_counter() - t0)
    plain_wall = min(plain_walls)
    tensors = plain_tensors(cfg, w, fold_omega=a.fold)
    del w                   # the benchmark holds shares only: floats go as they are dealt
    model_shares = deal_tensors(tensors, prefixes=wl.prefixes, shared_replicas=True)
    in_shares = [share_input(t) for t in inputs]
    args = [(model_shares[i],) + tuple(s[i] for s in in_shares) for i in range(3)]
    walls, first = [], None
    with _transport(a.transport) as new_parties:
        for _ in range(a.repeat):
            parties = new_parties()
            t0 = time.perf_counter()
            res = sim.run_parties(fn, args, parties=parties)
            walls.append(time.perf_counter() - t0)
            if first is None:
                first = (res, [p.stats.snapshot() for p in parties])
    res, stats = first
    out = ring.decode(reveal(res))
    err = float(np.max(np.abs(out - ref)))
    params = {k: getattr(a, k) for k in ("seq", "d_model", "heads", "features", "d_ff",
                                         "layers", "batch", "attn_norm", "fold", "exp", "block",
                                         "decode_block")}
    params.update(attn_c=cfg.attn_c, frac=ring.DEFAULT_FRAC, inputs=wl.describe_inputs(opts))
    params["load_avg_1m_at_end"] = __import__("os").getloadavg()[0]   # other jobs inflate times
    params["malloc_arenas"] = 1 if arenas_capped else "glibc default"
    params["malloc_keep_freed"] = kept            # net.party.malloc.keep_freed_memory
    return {"workload": a.name, "params": params, "transport": a.transport, "net": "none",
            "emulation": "none",
            "wall_s": {"min": min(walls), "median": statistics.median(walls)},
            "plain_wall_s": plain_wall, "peak_rss_bytes": peak_rss(),
            "bytes_total": sum(s.bytes_sent for s in stats),
            "bytes_per_party": [s.bytes_sent for s in stats],
            "messages": sum(s.messages for s in stats),
            "rounds": max(s.rounds for s in stats),
            "max_abs_err": err,
            "max_rel_err": err / max(float(np.max(np.abs(ref))), 1e-300)}


def _cmd(a) -> int:
    if a.net != "none":     # three party processes, each in an emulated network namespace
        from . import remote as remote_bench
        result = remote_bench.run_layer(
            a.name, net=a.net, seq=a.seq, d_model=a.d_model, heads=a.heads,
            features=a.features, d_ff=a.d_ff, layers=a.layers, attn_norm=a.attn_norm,
            attn_c=a.attn_c, batch=a.batch, repeat=a.repeat, fold=a.fold, block=a.block,
            exp=a.exp, seed=a.seed)
    else:
        result = run_layer(a)
    text = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


def register(bsub) -> None:
    """Add ``layer`` to the ``mpc3 bench`` subcommands."""
    p = bsub.add_parser("layer", help="one transformer layer / stack on three in-process parties")
    p.add_argument("name", choices=WORKLOADS)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--features", type=int, default=266)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--transport", choices=("inproc", "grpc"), default="inproc")
    p.add_argument("--net", default="none",
                   help="none | lan | wan | custom:RATE_MBIT:RTT_MS: run over gRPC party "
                        "processes in emulated network namespaces (needs root)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--attn-norm", choices=("const", "mean"), default="const")
    p.add_argument("--attn-c", type=float, default=None, help="default 1/(features*seq)")
    p.add_argument("--no-fold", dest="fold", action="store_false",
                   help="keep Omega separate instead of folding it into W^Q, W^K")
    p.add_argument("--block", type=int, default=None, help="row block of masked VK")
    p.add_argument("--decode-block", type=int, default=None,
                   help="decoder-step: tokens cached before folding into G (1 = Privformer)")
    p.add_argument("--exp", choices=("poly", "limit"), default="poly")
    p.add_argument("--input-range", type=float, default=None,
                   help="inputs uniform in [-A, A]; default 10 (paper) for single layers, "
                        "sqrt(3) (unit variance) for encoder/decoder stacks")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd)
