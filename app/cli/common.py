"""Arguments and helpers shared by the subcommands."""
from __future__ import annotations

import argparse
import sys

from net import config as cconf

INSECURE_FLAG = "--insecure-plaintext-for-local-dev"


def add_insecure(p: argparse.ArgumentParser) -> None:
    p.add_argument(INSECURE_FLAG, dest="insecure", action="store_true",
                   help="DANGER: no TLS and no authentication; local development only")


def add_client_creds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="cluster TOML")
    p.add_argument("--cert", help="client certificate (default: from [clients.ROLE])")
    p.add_argument("--key", help="client private key")
    add_insecure(p)


def add_fuse(p: argparse.ArgumentParser, kinds: tuple[str, ...]) -> None:
    """``--fuse``: the session's fusions (decode_open / lm_prefill's ``fuse``)."""
    p.add_argument("--fuse", default=None, help="fusions of the session (LayerNorm with the "
                   "next projection; wo: the cross attention's W^O at open): default, "
                   "all (fewest rounds per token, for high-latency links; more bytes), none, "
                   f"or a comma list of {', '.join(kinds)}")


def load(args) -> cconf.ClusterConfig:
    cfg = cconf.load(args.config, insecure_flag=getattr(args, "insecure", False))
    if not cfg.tls:
        print("WARNING: INSECURE PLAINTEXT MODE - no TLS, no authentication; local "
              "development only", file=sys.stderr)
    return cfg


def any_client(args, cfg, **kw):
    """A client for read-only calls: the query user's credentials if configured, else the
    model owner's."""
    from net.client import ModelOwner, QueryUser
    cls = QueryUser if (args.cert or "query-user" in cfg.clients or not cfg.tls) else ModelOwner
    return cls(cfg, args.cert, args.key, **kw)


def load_model_file(path: str, config_path: str | None = None, fmt: str = "auto",
                    notes: list | None = None):
    """(config, weights, user tensors) of a model - mpc3 ``.npz``, ``.safetensors`` in mpc3's
    naming with its config from ``config_path`` or the file's metadata, or a directory laid
    out like Hugging Face BERT / GPT-2 (``fmt`` auto, hf-bert, hf-gpt2:
    protocols.model.hf_import; its notes are appended to ``notes``) - or one clear
    ValueError."""
    import zipfile
    from pathlib import Path

    from protocols.model import hf_import, load_model
    from protocols.model.safetensors import load_safetensors_model
    if fmt not in ("auto", *hf_import.FORMATS):
        raise ValueError(f"--format {fmt!r}: choose auto, {', '.join(hf_import.FORMATS)}")
    if fmt.startswith("hf-") or (fmt == "auto" and Path(path).is_dir()):
        if config_path is not None:
            raise ValueError("--model-config applies to mpc3 .safetensors files only (a "
                             "Hugging Face directory carries its config.json)")
        try:
            cfg, w, user, told = hf_import.load_hf(path, fmt)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"model {exc.filename or path} not found") from None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            what = f"missing config key {exc}" if isinstance(exc, KeyError) else exc
            raise ValueError(f"{path}: cannot import: {what}") from None
        if notes is not None:
            notes.extend(told)
        return cfg, w, user
    if Path(path).is_dir():
        raise ValueError(f"{path} is a directory: --format {fmt} reads a model file")
    try:
        if str(path).endswith(".safetensors"):
            return load_safetensors_model(path, config_path)
        if config_path is not None:
            raise ValueError("--model-config applies to .safetensors files only (an .npz "
                             "model carries its own config)")
        return load_model(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"model file {exc.filename or path} not found") from None
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        if str(path).endswith(".safetensors"):
            raise ValueError(f"{path}: not a usable mpc3 model: {exc}") from None
        raise ValueError(f"{path} is not a readable mpc3 model file (.npz with config.json "
                         f"and weights): {exc}") from None
