"""The latency figures of issue 12, measured in one run (ratios are read from the same run):

1. software cost per round: ``mpc3 bench op mult --n 1`` in-process and over three party
   processes on loopback - peer links over TLS sockets (the default) and over gRPC streams
   (``--peer-transport grpc``) - interleaved ``--pairs`` times; wall / rounds of each;
2. one generated token of the Privformer translation workload (d=512, h=8, r=266,
   d_ff=2048, 6+6 layers, 64-token source): ``mpc3 bench translate --model random`` in the
   same three setups, ``--tokens`` decoding steps each; per-token wall, rounds and bytes.

    python benchmarks/latency.py --json benchmarks/results/latency.json
    python benchmarks/latency.py --skip-rounds --fuse all --json \
        benchmarks/results/latency_fuse_all.json     # decode: default beside fuse all

Every number is read from the JSON the ``mpc3 bench`` commands write (the parties' own
counters); the load average at start and end is recorded because other jobs on a shared
machine inflate the times.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import runinfo


# the configurations compared: in-process parties, and three party processes on loopback
# whose peer links are TLS sockets (the default) or gRPC streams
SETUPS = {"inproc": ["--transport", "inproc"],
          "tls": ["--transport", "grpc", "--peer-transport", "tls"],
          "grpc": ["--transport", "grpc", "--peer-transport", "grpc"]}


def per_round(pairs: int, repeat: int) -> dict:
    runs: dict[str, list[float]] = {k: [] for k in SETUPS}
    rounds = {}
    for _ in range(pairs):
        for setup, flags in SETUPS.items():
            r = runinfo.bench(["op", "mult", "--n", "1", "--repeat", str(repeat), *flags])
            rounds[setup] = r["rounds"]
            runs[setup].append(r["wall_s"]["min"] / r["rounds"])
    out = {t: {"ms_per_round_min": 1e3 * min(v), "ms_per_round_median": 1e3 * statistics.median(v),
               "rounds": rounds[t], "runs_ms": [round(1e3 * x, 4) for x in v]}
           for t, v in runs.items()}
    for t in ("tls", "grpc"):
        out[f"{t}_over_inproc_min"] = out[t]["ms_per_round_min"] / out["inproc"]["ms_per_round_min"]
    return out


def decode(tokens: int, fuse: str | None = None) -> dict:
    """Per setup, one translate run; with ``fuse`` a second one with the sessions' fusions
    ``fuse`` right after it (key ``<setup>/fuse-<fuse>``), so the pair shares its load."""
    out = {}
    for setup, flags in SETUPS.items():
        for choice in (None, fuse) if fuse else (None,):
            r = runinfo.bench(["translate", "--model", "random", "--src-len", "64", "--tokens",
                        str(tokens), *flags, *(["--fuse", choice] if choice else [])])
            key = setup if choice is None else f"{setup}/fuse-{choice}"
            out[key] = {k: r[k] for k in ("per_token_wall_s", "per_token_rounds",
                                          "per_token_bytes", "token_agreement", "max_abs_err")}
            out[key]["ms_per_round"] = 1e3 * r["per_token_wall_s"] / r["per_token_rounds"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="interleaved op runs of each setup")
    ap.add_argument("--repeat", type=int, default=20, help="repeats inside each op run")
    ap.add_argument("--tokens", type=int, default=8, help="decoding steps per translate run")
    ap.add_argument("--fuse", default=None, help="also decode with these session fusions "
                    "(decode_open's fuse, e.g. all), each run beside the default one")
    ap.add_argument("--skip-rounds", action="store_true", help="decode only (no per-round "
                    "op runs)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    result = runinfo.start("latency")
    if not a.skip_rounds:
        result["per_round"] = per_round(a.pairs, a.repeat)
    result["decode_step"] = decode(a.tokens, a.fuse)
    runinfo.finish(result, a.json)


if __name__ == "__main__":
    main()
