"""``mpc3 bench op|layer|translate``: benchmarks with DESIGN.md's metric names (JSON)."""
from __future__ import annotations


def register(sub) -> None:
    from net import cli_bench, cli_layer
    from ..bench import translate as cli_translate_bench
    bsub = cli_bench.register(sub)
    cli_layer.register(sub)
    cli_translate_bench.register(bsub)
