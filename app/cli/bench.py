"""``mpc3 bench op|layer|translate|lm``: benchmarks with DESIGN.md's metric names (JSON)."""
from __future__ import annotations

from ..bench import layer, lm, op, translate


def register(sub) -> None:
    bench = sub.add_parser("bench", help="run benchmarks (kernels, layers, translation, "
                           "whole models)")
    bsub = bench.add_subparsers(dest="bench_kind", required=True)
    for group in (op, layer, translate, lm):
        group.register(bsub)
