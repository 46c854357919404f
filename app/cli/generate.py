"""``mpc3 generate``: secure text generation with a decoder-only LM on a running cluster,
streaming each token as it is produced.

    mpc3 generate --config C --model-id ID --model LM.npz "prompt" [--tokens N]
    mpc3 generate --config C --model-id ID --model LM.npz --ids 5,17,3 [--tokens N]

``--model`` is the model file holding the query user's part of the LM (``embed.tgt``,
``out.w``, ``out.b``); those tensors never leave this process. A model its owner shared with
``--secret-embeddings`` is found so from its public metadata: the prompt and each generated
token then go as secret one-hot rows and only the tokens come back
(:func:`app.generate.generate_tokens`; the file gives the config and tokenizer). A text prompt goes through
the model file's tokenizer when it carries one (an imported checkpoint, :mod:`app.text`: the
generated ids are decoded back to text as they come, special tokens left out, and the run
takes all ``--tokens``); otherwise it is UTF-8 bytes (a model with tgt_vocab >= 256; id 256
ends the text when the vocabulary has it). ``--ids`` gives token ids directly. The
generated text goes to stdout as it is produced; the token ids and the cost to stderr.
"""
from __future__ import annotations

import sys

import numpy as np

from ..options import add_fuse
from .common import (MODEL_ID_HELP, STARTING, add_client_creds, check_same_model,
                     load)


def _cmd_generate(args) -> int:
    from net.client.user import QueryUser
    from ..generate import ByteStream, generate, generate_tokens
    from ..translate import ClusterBackend
    from ..text import lm_prompt
    cfg = load(args)
    mcfg, user, ids, stream, eos = lm_prompt(args.model, args.prompt, args.ids)
    text = stream is not None
    stream = stream or ByteStream()

    def show(k: int, tok: np.ndarray) -> None:
        t = int(tok[0])
        if eos is not None and t == eos:
            return
        sys.stdout.write(stream.feed(t) if text else f"{t} ")
        sys.stdout.flush()

    with QueryUser(cfg, args.cert, args.key, rpc_timeout=args.rpc_timeout) as qu:
        backend = ClusterBackend(qu, args.model_id, step_timeout=args.step_timeout,
                                   fuse=args.fuse)
        remote = backend.model_config()
        check_same_model(remote, mcfg, args.model_id, args.model)
        if backend.secret_embeddings():    # the owner keeps the tables: tokens in and out
            res = generate_tokens(backend, mcfg, np.array([ids]), args.tokens, eos=eos,
                                  on_token=None if args.quiet else show)
        else:
            res = generate(backend, mcfg, user, np.array([ids]), args.tokens, eos=eos,
                           on_token=None if args.quiet else show)
    if args.quiet:
        out = res.tokens[0]
        print("".join(stream.feed(t) for t in out) + stream.flush() if text
              else " ".join(map(str, out)))
    else:
        sys.stdout.write(stream.flush() + "\n")
    if eos is not None and not res.tokens[0]:
        print(f"the model ended the text right after the prompt (its first token was the "
              f"end-of-text id {eos}): nothing generated. The shipped byte LMs continue "
              f"prompts like \"4096 = \"", file=sys.stderr)
    cost = res.step_cost
    per = cost.bytes_total / max(1, cost.jobs)
    print(f"tokens: {res.tokens[0]}", file=sys.stderr)
    print(f"cost: prefill of {len(ids)} tokens {res.prefill_cost.bytes_total / 1e6:.3f} MB, "
          f"{res.prefill_cost.rounds} rounds; {cost.jobs} steps {per / 1e6:.3f} MB and "
          f"{cost.rounds // max(1, cost.jobs)} rounds per token (all parties)", file=sys.stderr)
    return 0


def register(sub) -> None:
    from protocols.stacks.causal_lm import LM_FUSIONS
    p = sub.add_parser("generate", help="generate text securely with a decoder-only LM on a "
                       "running cluster (streams tokens)")
    p.add_argument("prompt", nargs="?", help="text prompt (UTF-8 bytes as tokens)")
    p.add_argument("--ids", help="prompt as comma-separated token ids instead of text")
    p.add_argument("--model-id", required=True, help=MODEL_ID_HELP)
    p.add_argument("--model", required=True, help="model file with the query-user tensors "
                   "(embed.tgt, out.w, out.b)")
    p.add_argument("--tokens", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--step-timeout", type=float, default=120.0,
                   help="seconds one job (prefill or step) may take")
    p.add_argument("--rpc-timeout", type=float, default=None,
                   help="seconds a call waits for a party (default: the cluster's "
                   "peer_timeout_s)")
    p.add_argument("--quiet", action="store_true", help="print the text at the end only")
    add_fuse(p, LM_FUSIONS)
    add_client_creds(p)
    p.set_defaults(func=_cmd_generate)


# --------------------------------------------------------------------------- demo ----
def demo_lm(args) -> int:
    """``mpc3 demo --model lm [--attention A]``: a local cluster, the shipped LM of attention
    A shared by the owner, and held-out prompts "N = " continued securely, streamed, against
    the plaintext reference."""
    import time

    from net.client.user import QueryUser
    from protocols import model as M
    from app import textdata as TD

    from ..generate import ByteStream, eos_of, generate
    from ..translate import ClusterBackend
    from ..localcluster import temporary_cluster
    from ..owner import share_transformer
    from ..translate import token_agreement
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    attention = args.attention or "relu-performer"
    path = TD.SHIPPED_LMS[attention]
    if not path.exists():
        raise FileNotFoundError(f"shipped LM {path} is missing (reinstall)")
    mcfg, w, user = M.load_model(path)
    eos = eos_of(mcfg)
    nums = args.text or [str(int(n)) for n in TD.sample_numbers(64, 7, "test") if n < 10000]
    nums = nums[:args.inputs]
    t_start, pairs, exact = time.perf_counter(), [], 0
    say(f"mpc3 demo --model lm --attention {attention}: secure generation with a "
        "decoder-only LM by three parties")
    say(STARTING)
    with temporary_cluster("mpc3-demo-lm-", args.keep_dir, peer_timeout=15.0) as cluster:
        upload = share_transformer(cluster.cfg, "lm", mcfg, w, None, *cluster.creds("owner"),
                                   source=path.name, user=user)
        say(f"model owner: shared the shipped LM {path.name} ({w.n_params()} parameters, "
            f"d_model {mcfg.d_model}, {mcfg.n_dec_layers} layers, {mcfg.attention} attention, "
            f"byte tokens) as upload {upload}")
        with QueryUser(cluster.cfg, *cluster.creds("user"), rpc_timeout=30) as qu:
            backend = ClusterBackend(qu, "lm", step_timeout=120)
            for n in nums:
                prompt = list(f"{n} = ".encode())
                budget = mcfg.max_len - len(prompt) + 1
                stream = ByteStream()
                sys.stdout.write(f"{n} = ")

                def show(k, tok, stream=stream):
                    if int(tok[0]) != eos:
                        sys.stdout.write(stream.feed(int(tok[0])))
                        sys.stdout.flush()

                res = generate(backend, mcfg, user, np.array([prompt]), budget, eos=eos,
                               on_token=show)
                ref = M.greedy_generate(mcfg, w, user, [prompt], budget, eos=eos)[0]
                got = res.tokens[0]
                pairs.append((got, ref))
                text = bytes(got).decode("utf-8", "replace")
                exact += text == TD.number_to_words(int(n))
                sys.stdout.write(stream.flush() + ("" if got == ref else
                                                   f"   (plaintext: {bytes(ref).decode()})")
                                 + "\n")
    agree, total = token_agreement(pairs)
    print(f"token agreement with the plaintext model: {agree}/{total}; correct words: "
          f"{exact}/{len(nums)}; demo finished in {time.perf_counter() - t_start:.1f} s")
    return 0 if agree == total else 1
