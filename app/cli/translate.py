"""``mpc3 translate`` (secure translation on a running cluster) and ``mpc3 demo`` (everything
on a throw-away local cluster: the first command to run after installing).

    mpc3 translate --config C --model-id ID "4096" ["123" ...]
    mpc3 demo [--inputs N] [--keep-dir] [--model lm [--attention A] | --model classifier]

The query user's part of the model (embedding tables, output projection) and the vocabulary
come from the shipped translator (``app/assets``) unless ``--model`` names another
model file that holds them; they never leave this process.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from ..localcluster import temporary_cluster
from ..options import add_fuse
from .common import (MODEL_ID_HELP, STARTING, add_client_creds, check_same_model,
                     load)

DEMO_INPUTS = 5
DEMO_SEED = 2024


# ---------------------------------------------------------------------------- helpers ----
class Progress:
    """One line per generated token (batch rows side by side), on stderr."""

    def __init__(self, vocab, stream=None, quiet: bool = False) -> None:
        self.vocab, self.stream, self.quiet = vocab, stream, quiet
        self.t0 = time.perf_counter()

    def __call__(self, t: int, tokens: np.ndarray, probs: np.ndarray, sources) -> None:
        if self.quiet:
            return
        words = "  ".join(f"{src}: {self.vocab.tgt[int(k)]} ({p:.2f})"
                          for src, k, p in zip(sources, tokens, probs))
        print(f"  [{time.perf_counter() - self.t0:6.2f} s] token {t + 1:2d}  {words}",
              file=self.stream or sys.stderr, flush=True)


def cost_line(cost, n_tokens: int) -> str:
    return (f"cost: {cost.wall_s:.2f} s, {cost.bytes_total / 1e6:.2f} MB sent by the three "
            f"parties, {cost.messages} messages, {cost.rounds} rounds, {cost.jobs} jobs, "
            f"{n_tokens} tokens")


def layer_table(layers, cost) -> str:
    rows = [("layer", "calls", "MB (all parties)/call", "rounds/call", "messages/call")]
    for name, (b, m, r, calls) in layers.rows.items():
        per = max(1, calls)
        rows.append((name + (" (per step)" if name.startswith("dec.") and
                             name != "dec.cross_kv" else ""), str(per),
                     f"{b / 1e6 / per:.3f}", f"{r / per:.0f}", f"{m / per:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"all {cost.jobs} jobs together: {cost.bytes_total / 1e6:.3f} MB (all "
                 f"parties), {cost.rounds} rounds, {cost.messages} messages")
    return "\n".join(lines)


# -------------------------------------------------------------------------- translate ----
def _cmd_translate(args) -> int:
    from net.client.user import QueryUser
    from ..api import translator_side
    from ..translate import ClusterBackend, translate_texts
    cfg = load(args)
    mcfg, user, vocab = translator_side(args.model)
    with QueryUser(cfg, args.cert, args.key, rpc_timeout=args.rpc_timeout) as qu:
        backend = ClusterBackend(qu, args.model_id, step_timeout=args.step_timeout,
                                 fuse=args.fuse)
        remote = backend.model_config()
        check_same_model(remote, mcfg, args.model_id, args.model)
        res, cost, pairs = translate_texts(backend, mcfg, user, args.text, vocab,
                                           on_token=Progress(vocab, quiet=args.quiet))
    for r in res:
        print(f"{r.source}\t{r.secure}")
    print(cost_line(cost, sum(len(s) for s, _ in pairs)), file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------- demo ----
def demo_inputs(n: int = DEMO_INPUTS, lengths: tuple[int, ...] = (4, 6)) -> list[str]:
    """``n`` held-out (test split) numbers, deterministic, alternating between ``lengths``
    digits: inputs of one length share a decode session (one batch), so the demo runs
    ``len(lengths)`` sessions instead of ``n``."""
    from app import textdata as TD
    pools = {k: [] for k in lengths}
    for x in TD.sample_numbers(400, seed=DEMO_SEED, split="test"):
        s = str(int(x))
        if len(s) in pools and s not in pools[len(s)]:
            pools[len(s)].append(s)
    return [pools[lengths[i % len(lengths)]][i // len(lengths)] for i in range(n)]


def check_demo_args(args) -> None:
    """Refuse what the chosen demo cannot run before any party starts: every demo reads
    numbers N (the translator's digits; N < 10000 for the LM and the classifier, which were
    trained on those), and --attention picks one of the shipped LMs."""
    from app import textdata as TD
    if args.attention is not None and args.model != "lm":
        raise ValueError("--attention picks one of the shipped LMs: use it with --model lm")
    for text in args.text:
        n = TD.parse_src(text)
        if args.model != "translator" and n >= 10000:
            raise ValueError(f"the shipped {args.model} reads numbers below 10000, got {text}")


def _cmd_demo(args) -> int:
    check_demo_args(args)
    if args.model == "lm":
        from .generate import demo_lm
        return demo_lm(args)
    if args.model == "classifier":
        from .models import demo_classifier
        return demo_classifier(args)
    from app import textdata as TD
    from net.client.user import QueryUser
    from ..owner import share_transformer
    from ..translate import ClusterBackend, token_agreement, translate_texts
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    if not TD.SHIPPED_MODEL.exists():
        raise FileNotFoundError(f"shipped model {TD.SHIPPED_MODEL} is missing (reinstall)")
    mcfg, w, user, vocab = TD.load_shipped()
    texts = args.text or demo_inputs(args.inputs)
    t_start = time.perf_counter()
    say("mpc3 demo: secure translation of digits to English words by three MPC parties")
    say(STARTING)
    with temporary_cluster("mpc3-demo-", args.keep_dir, peer_timeout=15.0) as cluster:
        say(f"three parties up on {', '.join(p.address for p in cluster.cfg.parties)} "
            f"(mTLS, certificates in {cluster.dir / 'certs'}) in "
            f"{time.perf_counter() - t_start:.1f} s")
        t0 = time.perf_counter()
        upload = share_transformer(cluster.cfg, "translator", mcfg, w, None,
                                   *cluster.creds("owner"), source=TD.SHIPPED_MODEL.name,
                                   user=user)
        say(f"model owner: shared the shipped translator ({w.n_params()} parameters, "
            f"d_model {mcfg.d_model}, {mcfg.n_enc_layers}+{mcfg.n_dec_layers} layers) as "
            f"upload {upload} in {time.perf_counter() - t0:.1f} s")
        say(f"query user: translating {len(texts)} held-out inputs (only embeddings leave "
            "this process, secret-shared; one job per generated token)")
        with QueryUser(cluster.cfg, *cluster.creds("user"), rpc_timeout=30) as qu:
            backend = ClusterBackend(qu, "translator", step_timeout=120)
            res, cost, pairs = translate_texts(backend, mcfg, user, texts, vocab,
                                               on_token=Progress(vocab, sys.stdout,
                                                                 args.quiet),
                                               plaintext_weights=w,
                                               parallel=len(texts))
        same, total = token_agreement(pairs)
        width = max(len(r.source) for r in res)
        print()
        print(f"{'input':<{width}}  agree  secure output / plaintext output")
        for r in res:
            print(f"{r.source:<{width}}  {'yes' if r.agrees else 'NO ':<5}  {r.secure}")
            if not r.agrees:
                print(f"{'':<{width}}         plaintext: {r.plaintext}")
        print(f"token agreement with the plaintext model: {same}/{total}; exact "
              f"translations: {sum(TD.reference_translation(r.source) == r.secure for r in res)}"
              f"/{len(res)}")
        print()
        print(layer_table(cost.layers, cost))
        print(cost_line(cost, sum(len(s) for s, _ in pairs))
              + f" (jobs' own time; {len({len(t.strip()) for t in texts})} sessions ran "
              "concurrently)")
        print(f"demo finished in {time.perf_counter() - t_start:.1f} s")
        return 0 if same == total else 1


def register(sub) -> None:
    from protocols.stacks.decoder import FUSIONS
    from app.textdata import SHIPPED_LMS
    p = sub.add_parser("translate", help="translate text securely on a running cluster")
    p.add_argument("text", nargs="+", help="input(s), e.g. 4096")
    p.add_argument("--model-id", required=True, help=MODEL_ID_HELP)
    p.add_argument("--model", help="model file with the query-user tensors (default: the "
                   "shipped translator)")
    p.add_argument("--step-timeout", type=float, default=120.0,
                   help="seconds one job (encoder or step) may take")
    p.add_argument("--rpc-timeout", type=float, default=None,
                   help="seconds a call waits for a party (default: the cluster's "
                   "peer_timeout_s)")
    p.add_argument("--quiet", action="store_true", help="no per-token progress")
    add_fuse(p, FUSIONS)
    add_client_creds(p)
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser("demo", help="start a local three-party cluster, share the shipped "
                       "translator, translate held-out inputs securely, shut down")
    p.add_argument("text", nargs="*", help="inputs (default: held-out numbers)")
    p.add_argument("--inputs", type=int, default=DEMO_INPUTS, help="how many held-out inputs")
    p.add_argument("--keep-dir", action="store_true", help="keep certificates and logs")
    p.add_argument("--quiet", action="store_true", help="only the results")
    p.add_argument("--model", choices=("translator", "lm", "classifier"),
                   default="translator",
                   help="translator (default); lm: the shipped decoder-only LM continues "
                   "'N = ' with N's English words, streamed token by token; classifier: the "
                   "shipped encoder classifier tells N's leading digit from N's words")
    p.add_argument("--attention", choices=tuple(SHIPPED_LMS), default=None,
                   help="with --model lm: the shipped LM of this attention (default "
                   "relu-performer)")
    p.set_defaults(func=_cmd_demo)
