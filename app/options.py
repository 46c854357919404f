"""Command-line options that the ``mpc3`` commands (app/cli) and the benchmark harness
(app/bench) share; app/bench must not import app/cli (tests/system/test_layering.py)."""
from __future__ import annotations

import argparse


def add_fuse(p: argparse.ArgumentParser, kinds: tuple[str, ...]) -> None:
    """``--fuse``: the session's fusions (decode_open / lm_prefill's ``fuse``)."""
    p.add_argument("--fuse", default=None, help="fusions of the session (LayerNorm with the "
                   "next projection; wo: the cross attention's W^O at open): default, "
                   "all (fewest rounds per token, for high-latency links; more bytes), none, "
                   f"or a comma list of {', '.join(kinds)}")
