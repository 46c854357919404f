"""Arguments and helpers shared by the subcommands."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from net import config as cconf

INSECURE_FLAG = "--insecure-plaintext-for-local-dev"


MODEL_ID_HELP = "the id the model is shared under (share-model --model-id)"

#: What a demo says while its parties start (silent otherwise for the first compilation).
STARTING = ("starting three party processes; each compiles its secure kernels before it "
            "listens (~15 s the first time on this machine, ~2 s once numba's cache holds "
            "them)")


def add_insecure(p: argparse.ArgumentParser) -> None:
    p.add_argument(INSECURE_FLAG, dest="insecure", action="store_true",
                   help="DANGER: no TLS and no authentication; local development only")


def add_client_creds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="cluster TOML")
    p.add_argument("--cert", help="client certificate (default: from [clients.ROLE])")
    p.add_argument("--key", help="client private key")
    add_insecure(p)


#: Model config keys that say how the parties compute, not what: a query user's local model
#: file and the model its owner shared may differ in them (share-model --softmax).
PROTOCOL_KEYS = ("softmax_form",)


def check_same_model(remote, local, model_id: str, local_name: str) -> None:
    """ValueError in one line, naming the keys, if the shared model ``model_id`` (config
    ``remote``) is not the model of the local file ``local_name`` (config ``local``) - other
    than in :data:`PROTOCOL_KEYS`."""
    a, b = dataclasses.asdict(remote), dataclasses.asdict(local)
    keys = sorted(k for k in set(a) | set(b) if k not in PROTOCOL_KEYS and a.get(k) != b.get(k))
    if keys:
        shown = ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:4])
        raise ValueError(f"model {model_id!r} on the cluster is not the model of {local_name}: "
                         f"{shown}{' ...' if len(keys) > 4 else ''}")


def load(args) -> cconf.ClusterConfig:
    cfg = cconf.load(args.config, insecure_flag=getattr(args, "insecure", False))
    if not cfg.tls:
        print("WARNING: INSECURE PLAINTEXT MODE - no TLS, no authentication; local "
              "development only", file=sys.stderr)
    return cfg


def any_client(args, cfg, **kw):
    """A client for read-only calls: the query user's credentials if configured, else the
    model owner's."""
    from net.client.owner import ModelOwner
    from net.client.user import QueryUser
    cls = QueryUser if (args.cert or "query-user" in cfg.clients or not cfg.tls) else ModelOwner
    return cls(cfg, args.cert, args.key, **kw)


def add_import_options(p: argparse.ArgumentParser) -> None:
    """``--pool``, ``--normalize``, ``--max-len``: how a Hugging Face / sentence-transformers
    directory is converted (protocols.model.st_import.import_checkpoint)."""
    p.add_argument("--pool", choices=("mean", "cls", "max"),
                   help="a BertModel directory: the sentence embedding's pooling over the "
                   "positions (default mean; a sentence-transformers directory's own "
                   "Pooling module decides there)")
    p.add_argument("--normalize", action="store_const", const=True, default=None,
                   help="a BertModel directory: L2-normalize the sentence embedding")
    p.add_argument("--max-len", type=int, metavar="N",
                   help="a Hugging Face directory: the model takes at most N tokens (its "
                   "position table is cut to N rows; default: all its positions, or a "
                   "sentence-transformers directory's max_seq_length)")


def import_options(args) -> dict:
    """The options of :func:`add_import_options` given on the command line."""
    return {k: getattr(args, k) for k in ("pool", "normalize", "max_len")
            if getattr(args, k, None) is not None}


def load_model_source(path: str, config_path: str | None = None, fmt: str = "auto",
                      options: dict | None = None):
    """A model in any format as :class:`protocols.model.st_import.Imported` (its
    tokenizer and class names with it) - mpc3 ``.npz``, ``.safetensors`` in mpc3's naming
    with its config from ``config_path`` or the file's metadata, or a directory laid out
    like Hugging Face BERT / GPT-2 / LLaMA or sentence-transformers (``fmt`` auto,
    hf-bert, hf-gpt2, hf-llama, sentence-transformers; ``options``:
    :func:`import_options`) - or one clear ValueError. Weights of an mpc3 file stay in it
    and are read when used (:class:`protocols.model.OnDemandTensors`): sharing holds one
    tensor at a time."""
    import zipfile
    from pathlib import Path

    from protocols.model import hf_import, load_model
    from protocols.model.files import ModelFileError
    from protocols.model.safetensors import load_safetensors_model
    from protocols.model.st_import import Imported, import_checkpoint
    from protocols.model.weights import LABELS_KEY, TOKENIZER_KEY, load_labels, text_entry
    options = options or {}
    if fmt not in ("auto", *hf_import.FORMATS):
        raise ValueError(f"--format {fmt!r}: choose auto, {', '.join(hf_import.FORMATS)}")
    if fmt != "mpc3" and (fmt != "auto" or Path(path).is_dir()):
        if config_path is not None:
            raise ValueError("--model-config applies to mpc3 .safetensors files only (a "
                             "Hugging Face directory carries its config.json)")
        try:
            return import_checkpoint(path, fmt, **options)
        except ModelFileError:
            raise                                   # names its file, says what to do
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"model {exc.filename or path} not found") from None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            what = f"missing config key {exc}" if isinstance(exc, KeyError) else exc
            raise ValueError(f"{path}: cannot import: {what}") from None
    if Path(path).is_dir():
        raise ValueError(f"{path} is a directory: --format {fmt} reads a model file")
    if options:
        raise ValueError(f"--{'/--'.join(k.replace('_', '-') for k in options)} apply to "
                         f"Hugging Face / sentence-transformers directories, not to {path}")
    try:
        if str(path).endswith(".safetensors"):
            return Imported(*load_safetensors_model(path, config_path, lazy=True))
        if config_path is not None:
            raise ValueError("--model-config applies to .safetensors files only (an .npz "
                             "model carries its own config)")
        got = Imported(*load_model(path, lazy=True))
        if text_entry(path, LABELS_KEY) is not None:
            got.labels = load_labels(path)
        got.tokenizer = text_entry(path, TOKENIZER_KEY)
        return got
    except ModelFileError:
        raise                                       # names its file, says what to do
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"model file {exc.filename or path} not found") from None
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        if str(exc).startswith(f"{path}: "):
            raise ValueError(str(exc)) from None        # it names the file already
        if str(path).endswith(".safetensors"):
            raise ValueError(f"{path}: not a usable mpc3 model: {exc}") from None
        raise ValueError(f"{path} is not a readable mpc3 model file (.npz with config.json "
                         f"and weights): {exc}") from None


def load_model_file(path: str, config_path: str | None = None, fmt: str = "auto",
                    notes: list | None = None, options: dict | None = None):
    """(config, weights, user tensors) of a model (:func:`load_model_source`; the notes of
    an import are appended to ``notes``) - or one clear ValueError."""
    got = load_model_source(path, config_path, fmt, options)
    if notes is not None:
        notes.extend(got.notes)
    return got.cfg, got.weights, got.user
