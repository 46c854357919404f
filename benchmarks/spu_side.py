"""SecretFlow SPU side of ``benchmarks/spu_compare.py``: one workload on three SPU processes.

Runs with SPU's own Python (``$MPC3_SPU_PYTHON``, e.g. ``/work/venv-spu/bin/python`` with
``pip install spu==0.9.5``), never with mpc3's: it imports nothing from mpc3.

    python spu_side.py run WORKLOAD --repeat N [--json OUT]

The driver builds the workload's plaintext inputs (seeded) and its float64 reference, compiles
the jax function to an SPU executable and splits every input into ABY3 shares (all inputs
secret, ``Visibility.VIS_SECRET``), then starts three party processes (``party`` below, this
same file), each holding one brpc link end on 127.0.0.1 (``libspu.link.create_brpc``; SPU 0.9.5
wheels ship no ``spu.utils.distributed``) and one ``spu.api.Runtime`` (ABY3, FM64, 18
fractional bits, everything else SPU's defaults). A party sets its input shares with
``Runtime.set_var`` (untimed), runs the executable once untimed (warm-up), then ``repeat`` times
``link.barrier(); t0; Runtime.run(executable); t1``: the timed span is SPU's whole call with
the inputs already on the device - it includes SPU's per-call parsing of the executable and
leaves the outputs secret-shared in the runtime (no reveal). Per run the slowest party counts.

Communication: SPU 0.9.5 exposes no link counters to Python; with ``enable_pphlo_profile`` its
Runtime logs ``Link details: total send bytes B, ... send actions A`` after a run. Each party
therefore does one extra profiled run in a second Runtime on the same link (not timed) and the
driver sums the parties' send bytes / actions from their logs. Finally the outputs are revealed
and compared with the float64 reference (``max_abs_err``), a check that SPU computed the
workload and not something cheaper.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FRAC, S, D, H, R, D_FF, N_RELU = 18, 64, 512, 8, 266, 2048, 131072
DH = D // H
LN_EPS = 2.0 ** -10                       # mpc3's default LayerNorm epsilon
ATTN_C = 1.0 / (R * S)                    # mpc3's default Performer constant c = 1/(r*S)
WORKLOADS = ("ffn", "relu", "matmul", "ln", "performer", "mha", "softmax")


def case(name: str, rng: np.random.Generator):
    """(jax function, [inputs], float64 reference of its output, description)."""
    import jax
    import jax.numpy as jnp

    def u(a, *shape):
        return rng.uniform(-a, a, shape)

    def w(fan_in, fan_out):
        return rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / (fan_in + fan_out))

    relu = lambda t: jnp.maximum(t, 0)
    relu_np = lambda t: np.maximum(t, 0)
    if name == "ffn":
        args = [u(10, S, D), w(D, D_FF), 0.1 * rng.standard_normal(D_FF), w(D_FF, D),
                0.1 * rng.standard_normal(D)]
        f = lambda x, w1, b1, w2, b2: relu(x @ w1 + b1) @ w2 + b2
        x, w1, b1, w2, b2 = args
        return f, args, relu_np(x @ w1 + b1) @ w2 + b2, "relu(x W1 + b1) W2 + b2, all secret"
    if name == "relu":
        args = [u(10, N_RELU)]
        return relu, args, relu_np(args[0]), "jnp.maximum(x, 0)"
    if name == "matmul":
        args = [u(1, S, D), u(1, D, D_FF)]
        return (lambda a, b: a @ b), args, args[0] @ args[1], "a @ b, both secret"
    if name == "ln":
        args = [u(10, S, D), 1 + 0.1 * rng.standard_normal(D), 0.1 * rng.standard_normal(D)]

        def f(x, g, b):
            mu = jnp.mean(x, -1, keepdims=True)
            var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
            return (x - mu) * jax.lax.rsqrt(var + LN_EPS) * g + b
        x, g, b = args
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (f, args, (x - mu) / np.sqrt(var + LN_EPS) * g + b,
                "(x-mu) * rsqrt(var + 2^-10) * gamma + beta over the last dim")
    if name == "performer":
        # c = 1/(r S) is folded into Omega in plaintext (relu is positively homogeneous), as
        # mpc3 folds it into its weights: free, and exact where SPU's 18-bit encoding of the
        # public constant c alone (15/2^18) would be 2.6 % off.
        om = rng.standard_normal((H, DH, R))
        args = [u(1, H, S, DH), u(1, H, S, DH), u(1, H, S, DH), om * np.sqrt(ATTN_C)]

        def f(q, k, v, om_c):
            qf, kf = relu(q @ om_c), relu(k @ om_c)
            return qf @ (jnp.swapaxes(kf, -1, -2) @ v)
        q, k, v, _ = args
        qf, kf = relu_np(q @ om), relu_np(k @ om)
        return (f, args, qf @ (np.swapaxes(kf, -1, -2) @ v) * ATTN_C,
                ("per head Q'=relu(Q Omega), K'=relu(K Omega), c Q'(K'^T V) (c folded into "
                 "Omega); Q, K, V, Omega secret"))
    if name == "mha":
        om = rng.standard_normal((H, DH, R))
        wq, wk = w(D, D), w(D, D)
        fold = lambda wm: np.concatenate([wm[:, j * DH:(j + 1) * DH] @ om[j]
                                          for j in range(H)], axis=1)
        c3 = ATTN_C ** (1 / 3)          # c folded into W^{Q Omega}, W^{K Omega}, W^V like mpc3
        args = [u(10, S, D), fold(wq) * c3, fold(wk) * c3, w(D, D) * c3, w(D, D)]

        def heads(t, k):
            return jnp.swapaxes(t.reshape(S, H, k), 0, 1)

        def f(x, wqo, wko, wv, wo):
            qf, kf, v = heads(relu(x @ wqo), R), heads(relu(x @ wko), R), heads(x @ wv, DH)
            o = qf @ (jnp.swapaxes(kf, -1, -2) @ v)
            return jnp.swapaxes(o, 0, 1).reshape(S, D) @ wo
        x, wqo, wko, wv, wo = args
        hn = lambda t, k: np.swapaxes(t.reshape(S, H, k), 0, 1)
        qf, kf, v = hn(relu_np(x @ wqo), R), hn(relu_np(x @ wko), R), hn(x @ wv, DH)
        o = qf @ (np.swapaxes(kf, -1, -2) @ v)
        return (f, args, np.swapaxes(o, 0, 1).reshape(S, D) @ wo,
                ("X W^{Q Omega}, X W^{K Omega} (Omega and c^(1/3) folded, as mpc3), X W^V "
                 "(c^(1/3) folded), ReLU features, Q'(K'^T V), heads merged, W^O; all secret"))
    if name == "softmax":
        args = [u(1, H, S, DH), u(1, H, S, DH), u(1, H, S, DH)]

        def f(q, k, v):
            e = jnp.exp(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(DH))
            return e / jnp.sum(e, -1, keepdims=True) @ v
        q, k, v = args
        e = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(DH))
        return (f, args, e / e.sum(-1, keepdims=True) @ v,
                "exp(QK^T/sqrt(dh)) / rowsum @ V per head, max-free (as mpc3), SPU's default exp")
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")


def runtime_config(profile: bool = False):
    from spu import libspu
    cfg = libspu.RuntimeConfig(protocol=libspu.ProtocolKind.ABY3,
                               field=libspu.FieldType.FM64, fxp_fraction_bits=FRAC)
    cfg.enable_pphlo_profile = profile
    return cfg


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def party(job_path: str, rank: int, out_path: str) -> None:
    import spu.api as A
    from spu import libspu
    job = pickle.loads(Path(job_path).read_bytes())
    desc = libspu.link.Desc()
    for i, port in enumerate(job["ports"]):
        desc.add_party(f"p{i}", f"127.0.0.1:{port}")
    desc.recv_timeout_ms = 600_000
    desc.connect_retry_times, desc.connect_retry_interval_ms = 600, 100
    t = time.perf_counter()
    link = libspu.link.create_brpc(desc, rank)
    exe = libspu.Executable()
    exe.ParseFromString(job["exe"])

    def runtime(profile):
        rt = A.Runtime(link, runtime_config(profile))
        for name, (meta, chunks) in zip(job["in_names"], job["shares"][rank]):
            sh = libspu.Share()
            sh.meta, sh.share_chunks = meta, chunks
            rt.set_var(name, sh)
        return rt

    rt = runtime(False)
    setup = time.perf_counter() - t

    def timed(r):
        link.barrier()
        t0 = time.perf_counter()
        r.run(exe)
        return time.perf_counter() - t0

    warm = timed(rt)
    runs = [timed(rt) for _ in range(job["repeat"])]
    prof = runtime(True)        # the only Runtime that logs "Link details"
    timed(prof)
    outs = [prof.get_var(n) for n in job["out_names"]]
    Path(out_path).write_bytes(pickle.dumps({
        "setup_s": setup, "warmup_s": warm, "runs": runs,
        "outs": [(o.meta, list(o.share_chunks)) for o in outs]}))
    link.barrier()
    link.stop_link()


_LINK = re.compile(r"Link details: total send bytes (\d+), recv bytes (\d+), "
                   r"send actions (\d+), recv actions (\d+)")


def drive(name: str, repeat: int, seed: int, timeout: float, keep_logs: str | None = None
          ) -> dict:
    import jax
    import spu
    import spu.api as A
    import spu.utils.frontend as fe
    from spu import libspu
    fn, args, ref, what = case(name, np.random.default_rng(seed))
    t = time.perf_counter()
    names = [f"in{i}" for i in range(len(args))]
    exe, _ = fe.compile(fe.Kind.JAX, fn, tuple(args), {}, names,
                        [libspu.Visibility.VIS_SECRET] * len(args),
                        lambda out: [f"out{i}" for i in range(len(out))])
    compile_s = time.perf_counter() - t
    io = A.Io(3, runtime_config())
    shares = [io.make_shares(np.asarray(a), libspu.Visibility.VIS_SECRET) for a in args]
    job = {"exe": exe.SerializeToString(), "in_names": list(exe.input_names),
           "out_names": list(exe.output_names), "repeat": repeat, "ports": free_ports(3),
           "shares": [[(s[r].meta, list(s[r].share_chunks)) for s in shares] for r in range(3)]}
    with tempfile.TemporaryDirectory(prefix="spu_side_") as tmp:
        tmp = Path(tmp)
        (tmp / "job.pkl").write_bytes(pickle.dumps(job))
        procs = []
        try:
            for r in range(3):
                with open(tmp / f"party{r}.log", "w") as log:     # the child keeps its own fd
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "party", str(tmp / "job.pkl"), str(r),
                         str(tmp / f"out{r}.pkl")], stdout=log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        texts = [(tmp / f"party{r}.log").read_text() for r in range(3)]
        if keep_logs:                   # SPU's own per-op profile of the extra profiled run
            Path(keep_logs).mkdir(parents=True, exist_ok=True)
            for r, text in enumerate(texts):
                (Path(keep_logs) / f"{name}_party{r}.log").write_text(text)
        if any(p.returncode for p in procs):
            raise RuntimeError("SPU party failed:\n" + "\n".join(t[-3000:] for t in texts))
        res = [pickle.loads((tmp / f"out{r}.pkl").read_bytes()) for r in range(3)]
    stats = []
    for text in texts:
        m = _LINK.findall(text)
        stats.append([int(g) for g in m[-1]] if m else None)
    out_shares = []
    for r in range(3):
        meta, chunks = res[r]["outs"][0]
        sh = libspu.Share()
        sh.meta, sh.share_chunks = meta, chunks
        out_shares.append(sh)
    got = np.asarray(io.reconstruct(out_shares), dtype=np.float64)
    runs = [max(res[r]["runs"][i] for r in range(3)) for i in range(repeat)]
    ok = all(s is not None for s in stats)
    return {
        "workload": name, "computes": what,
        "spu_version": spu.__version__, "jax_version": jax.__version__,
        "config": {"protocol": "ABY3", "field": "FM64", "fxp_fraction_bits": FRAC,
                   "parties": 3, "link": "brpc on 127.0.0.1, one process per party"},
        "wall_s": {"min": min(runs), "median": statistics.median(runs), "runs": runs},
        "warmup_s": max(r["warmup_s"] for r in res),
        "setup_s": max(r["setup_s"] for r in res), "compile_s": compile_s,
        "bytes_total": sum(s[0] for s in stats) if ok else None,
        "bytes_per_party": [s[0] for s in stats] if ok else None,
        "send_actions": sum(s[2] for s in stats) if ok else None,
        "max_abs_err": float(np.max(np.abs(got - ref))),
        "max_abs_ref": float(np.max(np.abs(ref))),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("workload", choices=WORKLOADS)
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--timeout", type=float, default=900.0)
    r.add_argument("--json")
    r.add_argument("--keep-logs", metavar="DIR", help="copy the parties' logs (SPU profile) here")
    p = sub.add_parser("party")
    p.add_argument("job")
    p.add_argument("rank", type=int)
    p.add_argument("out")
    a = ap.parse_args(argv)
    if a.cmd == "party":
        party(a.job, a.rank, a.out)
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = drive(a.workload, a.repeat, a.seed, a.timeout, a.keep_logs)
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
