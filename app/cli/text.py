"""Sentence embeddings and classes of text, on a running cluster (models that carry their
tokenizer: ``mpc3 import`` of a Hugging Face / sentence-transformers checkpoint).

    mpc3 embed --config C --model-id ID --model M.npz "text" ["text" ...] [--output E.npy]
    mpc3 embed --config C --model-id ID --model M.npz --ids 101,2023,102
    mpc3 classify --config C --model-id ID --model M.npz "text" ["text" ...]
    mpc3 classify --config C --model-id ID --model M.npz --ids 2,7,3 [--kind classify_argmax]

``--model`` is the model file holding the query user's part (the embedding tables and the
tokenizer); they never leave this process: the text is tokenized and embedded here
(:mod:`app.text`) and only the embedding is shared, one job per group of texts of one token
length. A text over the model's max_len is refused before anything is sent. ``embed``
prints each embedding's norm and first values (``--output``: all of them, (N, d), in the
order given); ``classify`` prints the class (its name when the model file has the
checkpoint's id2label) and the logits - or, with ``--kind classify_argmax``, the class
alone, which is all an owner permitting only classify-argmax lets its users learn.

A model its owner shared with ``--secret-embeddings`` is found so from its public metadata:
the tokens then go as secret one-hot rows (token types 0) to ``embed_secret`` /
``classify_secret`` / ``classify_argmax_secret`` (:data:`app.text.SECRET_KINDS`; the file
gives the config and tokenizer), and the output is what the owner permits: by default the
class alone for a classifier (``--kind classify_argmax``), the embedding for an encoder.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .common import MODEL_ID_HELP, add_client_creds, load


def _inputs(args, arch: str):
    """(cfg, user tensors, token id sequences, their labels for printing) of the command's
    texts or --ids, checked against the model file."""
    from ..text import model_inputs
    mcfg, user, seqs = model_inputs(args.model, arch, args.texts, args.ids, args.command)
    names = [f"ids {args.ids}"] if args.ids is not None else [repr(t) for t in args.texts]
    return mcfg, user, seqs, names


def _run(args, kind: str, out_name: str, mcfg, user, seqs):
    """One job per token length on the cluster; (rows in input order, jobs, seconds)."""
    from ..api import Cluster
    t0 = time.monotonic()
    with Cluster(load(args), "query-user", args.cert, args.key,
                 rpc_timeout=args.rpc_timeout) as cluster:
        rows = cluster.run_rows(args.model_id, kind, out_name, mcfg, user, seqs, args.model)
    return rows, cluster.last_costs.jobs, time.monotonic() - t0


def _cmd_embed(args) -> int:
    mcfg, user, seqs, names = _inputs(args, "encoder")
    rows, jobs, took = _run(args, "embed", "E", mcfg, user, seqs)
    for i, (row, name) in enumerate(zip(rows, names)):
        head = np.array2string(row[:6], precision=4, separator=", ")[:-1]
        print(f"{i}: {len(seqs[i])} tokens, norm {np.linalg.norm(row):.4f}, "
              f"{head}, ...]  {name}")
    if args.output is not None:
        np.save(args.output, rows)
        print(f"{args.output}: embeddings {rows.shape}")
    print(f"embed: {len(seqs)} inputs in {jobs} job(s), {took:.2f} s", file=sys.stderr)
    return 0


def _cmd_classify(args) -> int:
    from protocols.model import load_labels
    mcfg, user, seqs, names = _inputs(args, "encoder-classifier")
    labels = load_labels(args.model)
    argmax = args.kind == "classify_argmax"
    rows, jobs, took = _run(args, args.kind, "class" if argmax else "logits", mcfg, user,
                            seqs)
    for i, (row, name) in enumerate(zip(rows, names)):
        k = int(round(float(row))) if argmax else int(np.argmax(row))
        label = f"{labels[k]} (class {k})" if labels and 0 <= k < len(labels) else f"class {k}"
        logits = "" if argmax else \
            f" logits {np.array2string(row, precision=4, max_line_width=10**6)}"
        print(f"{i}: {label}{logits}  {name}")
    print(f"{args.kind}: {len(seqs)} inputs in {jobs} job(s), {took:.2f} s", file=sys.stderr)
    return 0


def register(sub) -> None:
    for name, fn, helptext in (
            ("embed", _cmd_embed, "sentence embeddings of texts with a headless encoder "
             "(BertModel, sentence-transformers) on a running cluster"),
            ("classify", _cmd_classify, "classes of texts with an encoder classifier on a "
             "running cluster")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("texts", nargs="*", help="texts, tokenized with the model file's "
                       "tokenizer")
        p.add_argument("--ids", help="one input as comma-separated token ids instead")
        p.add_argument("--model-id", required=True, help=MODEL_ID_HELP)
        p.add_argument("--model", required=True, help="model file with the query-user "
                       "tensors and the tokenizer (mpc3 import's .npz)")
        if name == "embed":
            p.add_argument("--output", help=".npy to write the embeddings (N, d) to")
        else:
            p.add_argument("--kind", default="classify",
                           choices=("classify", "classify_argmax"),
                           help="classify: logits (default); classify_argmax: the class "
                           "alone, computed on shares")
        p.add_argument("--rpc-timeout", type=float, default=None,
                       help="seconds a call waits for a party (default: the cluster's "
                       "peer_timeout_s)")
        add_client_creds(p)
        p.set_defaults(func=fn)
