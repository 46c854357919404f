"""``mpc3 bench op|layer|translate|lm``: benchmarks with DESIGN.md's metric names (JSON)."""
from __future__ import annotations

import functools

from net.party import malloc

from ..bench import layer, lm, op, translate


def _as_a_party_process(func):
    """Every benchmark process keeps freed buffers for reuse, as a party process does
    (:func:`net.party.server.serve`), so in-process and party-process figures compare
    like with like."""
    @functools.wraps(func)
    def run(args):
        malloc.keep_freed_memory()
        return func(args)
    return run


def register(sub) -> None:
    bench = sub.add_parser("bench", help="run benchmarks (kernels, layers, translation, "
                           "whole models)")
    bsub = bench.add_subparsers(dest="bench_kind", required=True)
    for group in (op, layer, translate, lm):
        group.register(bsub)
    for parser in bsub.choices.values():
        func = parser.get_default("func")
        if func is not None:
            parser.set_defaults(func=_as_a_party_process(func))
