"""The ``mpc3`` console command: one module per group of subcommands, each exposing
``register(subparsers)``; this file lists them. A new command goes into one of them (or a new
module added to :data:`GROUPS`).

Every error prints one line (``mpc3 CMD: error: ...``) and exits non-zero; no tracebacks.
"""
from __future__ import annotations

import argparse
import sys

from . import bench, cluster, doctor, generate, models, text, translate

DESCRIPTION = """Private transformer inference by three MPC parties: a model owner shares its
weights, a query user its input, and only the user sees the result. Start with `mpc3 demo`;
three hosts: deploy/README.md; every command: `mpc3 COMMAND --help`."""

GROUPS = (cluster, doctor, models, translate, generate, text, bench)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from net.party.service import VERSION
    try:
        v = dist_version("mpc3")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    return f"mpc3 {v} (wire protocol {VERSION})"


class _Version(argparse.Action):
    """``--version``, formed only when asked for (the wire protocol's version lives with the
    gRPC service, which commands that run no party - in-process benchmarks - never load)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kw) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpc3", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"mpc3 {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
