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


def load_model_file(path: str, config_path: str | None = None):
    """(config, weights, user tensors) of a model file - mpc3 ``.npz``, or ``.safetensors``
    in mpc3's naming with its config from ``config_path`` or the file's metadata - or one
    clear ValueError."""
    import zipfile

    from protocols.model import load_model
    from protocols.model.safetensors import load_safetensors_model
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
