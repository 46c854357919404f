"""The ``mpc3`` console command.

Subcommands live in small modules that each expose ``register(subparsers)``; this file only
assembles them, so features can be added without touching each other's code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = ("net.cli_bench", "net.cli_layer", "net.cli_cluster", "net.cli_translate")


def register_modules(names, subparsers) -> None:
    """Call ``register(subparsers)`` of each module that exists (optional features)."""
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpc3", description=__doc__.splitlines()[0])
    register_modules(SUBCOMMAND_MODULES, parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, PermissionError, RuntimeError) as exc:
        print(f"mpc3 {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
