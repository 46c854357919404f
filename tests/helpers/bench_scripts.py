"""A script of benchmarks/ imported as a module (the scripts are not a package: each puts
benchmarks/ on sys.path for its siblings, e.g. runinfo; here that path is added for the import
and taken off again)."""
import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name: str):
    """``benchmarks/<name>.py`` as a module."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
