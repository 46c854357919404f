"""``mpc3 bench translate``: end-to-end secure translation (encoder once + incremental decoding).

    mpc3 bench translate --model shipped --sentences 100 --transport inproc --json R.json
    mpc3 bench translate --model random --d-model 512 --heads 8 --features 266 --d-ff 2048 \\
        --layers 6 --src-len 64 --tokens 64 --transport grpc      # Privformer 64-token workload

``--model shipped``: ``--sentences`` held-out (test split) numbers, grouped by length into
batches (one decode session per batch), greedy decoding until ``<eos>`` (at most ``--tokens``
steps, default the vocabulary's limit). ``--src-len`` keeps only numbers of that many source
tokens (digits + eos). ``--model random``: random weights of the given shape (Xavier,
attn_norm "mean", c = 1/r; ``--attention`` any of the model config's: a softmax-style one
decodes with a secret KV cache), ``--sentences`` random sources of ``--src-len`` tokens in one
batch, exactly ``--tokens`` decoding steps (no early stop).

Metrics (DESIGN.md names): ``wall_s`` {min, median} over ``--repeat`` runs of the whole
translation as the query user sees it (shares of the model already in place; sharing the
input, every job's RPCs and the local embedding/projection included); ``bytes_total``,
``bytes_per_party``, ``messages`` summed over all jobs, ``rounds`` the sum over jobs of the
per-job maximum over parties; ``max_abs_err`` of the decoder rows against the float64
reference fed the same tokens, ``max_rel_err`` = max_abs_err / max |reference|; ``tokens``
generated tokens (all sentences, ``<eos>`` included), ``token_agreement`` the fraction of
positions where the secure tokens equal the plaintext model's greedy tokens, and
``per_token_*`` the decoding-step cost divided by the number of steps (one step = one new
token for every sentence of a batch); ``open`` holds the encoder + cross-attention job.
"""
from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .remote import add_peer_transport


def _random_model(a):
    from protocols import model as M
    if a.d_model % a.heads:
        raise ValueError(f"--d-model {a.d_model} is not divisible by --heads {a.heads}")
    cfg = M.ModelConfig(d_model=a.d_model, n_heads=a.heads, d_head=a.d_model // a.heads,
                        n_features=a.features, d_ff=a.d_ff, n_enc_layers=a.layers,
                        n_dec_layers=a.layers, attn_c=1.0 / a.features, attn_norm="mean",
                        norm_first=False, src_vocab=a.vocab, tgt_vocab=a.vocab,
                        max_len=max(a.src_len, a.tokens) + 1,
                        attention=a.attention).validate()
    return cfg, M.random_weights(cfg, a.seed), M.random_user(cfg, a.seed)


def _sources(a, cfg, vocab):
    """List of (B, S) int arrays (one per batch) and the texts (shipped) or None."""
    from app import textdata as TD
    if a.model == "random":
        rng = np.random.default_rng(a.seed + 1)
        return [rng.integers(3, cfg.src_vocab, size=(a.sentences, a.src_len))], None
    pool = [str(int(x)) for x in TD.sample_numbers(max(4 * a.sentences, 400), seed=a.seed,
                                                   split="test")]
    if a.src_len:
        pool = [t for t in pool if len(t) + 1 == a.src_len]
    texts = list(dict.fromkeys(pool))[:a.sentences]
    if len(texts) < a.sentences:
        raise ValueError(f"only {len(texts)} held-out inputs with --src-len {a.src_len}")
    groups: dict[int, list[str]] = {}
    for t in texts:
        groups.setdefault(len(t), []).append(t)
    batches = []
    for _, ts in sorted(groups.items()):
        for k in range(0, len(ts), a.batch):
            batches.append(np.array([TD.encode_src(t, vocab) for t in ts[k:k + a.batch]]))
    return batches, texts


def run_translate(a) -> dict:
    from protocols import model as M
    from app import textdata as TD
    from .. import translate as T
    if a.model == "shipped":
        if a.attention != M.PERFORMER:
            raise ValueError("--attention selects the random model's attention (the shipped "
                             "translator is relu-performer)")
        cfg, w, user, vocab = TD.load_shipped()
        eos, steps = vocab.eos, min(a.tokens or vocab.max_tgt_len, vocab.max_tgt_len)
        bos = vocab.bos
    else:
        cfg, w, user = _random_model(a)
        eos, steps, bos = None, a.tokens, 1
    batches, _ = _sources(a, cfg, TD.VOCAB)
    cluster, tmp, qu = None, None, None
    network = {"net": "none", "emulation": "none"}
    t_setup = time.perf_counter()
    try:
        if a.transport == "grpc" or a.net != "none":
            from net.client.user import QueryUser
            from ..localcluster import LocalCluster
            from ..owner import share_transformer
            tmp = Path(tempfile.mkdtemp(prefix="mpc3-bench-translate-"))
            if a.net != "none":     # party processes in emulated network namespaces
                from .remote import RemoteCluster
                cluster = RemoteCluster(a.net, peer_transport=a.peer_transport).__enter__()
                cluster.stop = lambda c=cluster: c.__exit__(None, None, None)
                network = cluster.network
            else:
                cluster = LocalCluster(tmp, peer_timeout=120.0, tied=True,
                                       peer_transport=a.peer_transport).start()
                network = dict(network, peer_transport=a.peer_transport)
            share_transformer(cluster.cfg, "bench", cfg, w, None, *cluster.creds("owner"),
                              user=user, to_diagnostic_parties=True)     # random weights
            qu = QueryUser(cluster.cfg, *cluster.creds("user"), rpc_timeout=120)
            backend = T.ClusterBackend(qu, "bench", step_timeout=600, fuse=a.fuse)
        else:
            from ..owner import calibrate_model        # as share-model stores it
            backend = T.InprocBackend(cfg, w, timeout=600, fuse=a.fuse,
                                      calibration=calibrate_model(cfg, w, user).to_dict())
        setup_s = time.perf_counter() - t_setup
        walls, runs = [], []
        for rep in range(a.repeat):
            t0 = time.perf_counter()
            results = [T.decode_batch(backend, cfg, user, src, bos, eos, steps)
                       for src in batches]
            walls.append(time.perf_counter() - t0)
            runs.append(results)
            print(f"run {rep + 1}/{a.repeat}: {walls[-1]:.2f} s", file=sys.stderr)
    finally:
        if qu is not None:
            qu.close()
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    results = runs[-1]
    open_c, step_c = T.Traffic(), T.Traffic()
    abs_err, ref_max, pairs = 0.0, 0.0, []
    for src, res in zip(batches, results):
        open_c += res.open_cost
        step_c += res.step_cost
        ref = T.reference_rows(cfg, w, user, src, res.fed)
        for got, want in zip(res.hidden, ref):
            abs_err = max(abs_err, float(np.abs(got - want).max()))
            ref_max = max(ref_max, float(np.abs(want).max()))
        plain = M.greedy_decode(cfg, w, user, src, bos, -1 if eos is None else eos,
                                max_steps=steps)
        for b in range(src.shape[0]):
            sec = res.tokens[b] + ([eos] if eos is not None and len(res.tokens[b]) < steps
                                   else [])
            pl = plain[b] + ([eos] if eos is not None and len(plain[b]) < steps else [])
            pairs.append((sec, pl))
    same, compared = T.token_agreement(pairs)
    total = T.Traffic()
    total += open_c
    total += step_c
    n_steps = max(1, step_c.jobs)
    d = cfg.to_dict()
    return {
        "workload": f"translate/{a.model}" + ("" if cfg.attention == M.PERFORMER
                                               else f"/{cfg.attention}"),
        "params": {"model_config": d, "sentences": a.sentences, "batches": len(batches),
                   "batch_sizes": [int(b.shape[0]) for b in batches],
                   "src_lens": [int(b.shape[1]) for b in batches], "max_steps": steps,
                   "stop_at_eos": eos is not None, "repeat": a.repeat, "seed": a.seed,
                   "fuse": a.fuse or "default",
                   "frac": 18, "trunc": "exact", "host": platform.node(),
                   "cpus": os.cpu_count(), "setup_s": round(setup_s, 3),
                   "load_avg_1m_at_end": os.getloadavg()[0]},
        "transport": "grpc" if a.net != "none" else a.transport,
        "net": network.get("net", "none"), "emulation": network.get("emulation", "none"),
        "peer_transport": network.get("peer_transport"),
        "links": network.get("links"),
        "wall_s": {"min": min(walls), "median": statistics.median(walls)},
        "bytes_total": total.bytes_total, "bytes_per_party": total.bytes_per_party,
        "messages": total.messages, "rounds": total.rounds,
        "max_abs_err": abs_err, "max_rel_err": abs_err / max(ref_max, 1e-12),
        "tokens": sum(len(s) for s, _ in pairs), "steps": step_c.jobs,
        "token_agreement": same / max(1, compared),
        "exact_sequences": sum(s == p for s, p in pairs), "sequences": len(pairs),
        "per_token_wall_s": step_c.wall_s / n_steps,
        "per_token_bytes": step_c.bytes_total / n_steps,
        "per_token_rounds": step_c.rounds / n_steps,
        "open": {"wall_s": open_c.wall_s, "bytes_total": open_c.bytes_total,
                 "rounds": open_c.rounds, "jobs": open_c.jobs},
    }


def _cmd(a) -> int:
    from .op import write_json
    if a.model == "random" and (not a.src_len or not a.tokens):
        raise ValueError("--model random needs --src-len and --tokens")
    r = run_translate(a)
    rows = [("workload", r["workload"]), ("transport", r["transport"]),
            ("wall_s min / median", f"{r['wall_s']['min']:.3f} / {r['wall_s']['median']:.3f}"),
            ("sentences / tokens / steps", f"{r['sequences']} / {r['tokens']} / {r['steps']}"),
            ("token_agreement", f"{r['token_agreement']:.4f}"),
            ("bytes_total", r["bytes_total"]), ("messages", r["messages"]),
            ("rounds", r["rounds"]), ("per_token_wall_s", f"{r['per_token_wall_s']:.4f}"),
            ("per_token_bytes", f"{r['per_token_bytes']:.0f}"),
            ("per_token_rounds", f"{r['per_token_rounds']:.1f}"),
            ("encoder+open wall_s", f"{r['open']['wall_s']:.3f}"),
            ("max_abs_err / max_rel_err", f"{r['max_abs_err']:.3g} / {r['max_rel_err']:.3g}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    write_json(r, a.json)
    return 0


def register(bsub) -> None:
    from protocols.stacks.decoder import FUSIONS
    from ..options import add_fuse
    p = bsub.add_parser("translate", help="secure translation end to end (encoder once + "
                        "incremental decoding)")
    p.add_argument("--model", choices=("shipped", "random"), default="shipped")
    p.add_argument("--src-len", type=int, default=0, help="source tokens (random: required; "
                   "shipped: keep inputs of this length only)")
    p.add_argument("--tokens", type=int, default=0, help="decoding steps (random: exactly; "
                   "shipped: at most)")
    p.add_argument("--sentences", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="shipped: sentences per session")
    p.add_argument("--transport", choices=("inproc", "grpc"), default="inproc")
    add_peer_transport(p)
    p.add_argument("--net", default="none",
                   help="none | lan | wan | custom:RATE_MBIT:RTT_MS: party processes in emulated "
                        "network namespaces (needs root; implies grpc)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--features", type=int, default=266)
    p.add_argument("--attention", default="relu-performer",
                   choices=("relu-performer", "softmax", "power-softmax", "sigma-relu"),
                   help="random: the model's attention")
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=256, help="random: vocabulary size")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    add_fuse(p, FUSIONS)
    p.add_argument("--json", help="write the result object here")
    p.set_defaults(func=_cmd)
