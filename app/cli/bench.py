"""``mpc3 bench op|layer|translate``: benchmarks with DESIGN.md's metric names (JSON)."""
from __future__ import annotations


def register(sub) -> None:
    from net import cli_bench
    from ..bench import layer, translate
    bsub = cli_bench.register(sub)
    layer.register(bsub)
    translate.register(bsub)
