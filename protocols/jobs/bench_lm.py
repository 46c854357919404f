"""Diagnostic job kind ``bench_lm`` (``mpc3 bench lm``): a whole model's inference on uploaded
shares, phase by phase, with the measured breakdown by operation type
(:mod:`protocols.jobs.breakdown`). Benchmark and test processes only, like every diagnostic kind.

Params: ``config`` (a ModelConfig dict; the uploaded tensors are its
:mod:`protocols.layers.secure_model` layout, Omega folded), ``tokens`` T, optionally ``fuse`` (the
session's LayerNorm fusions, as ``lm_prefill`` / ``decode_open`` take it:
:func:`protocols.layers.ln_proj.fusion_choice`). Inputs: ``X`` (B, S, d),
the embedded prompt / source / classifier input, and for T > 0 ``Y`` (T, B, d), the embedded
tokens fed to the T steps (a generation feeds back its own greedy tokens through the query
user; the cost does not depend on which tokens they are). Phases, by architecture:

* ``decoder-only``: phase 0 :func:`protocols.stacks.causal_lm.lm_prefill` of X, phase 1 + t
  :func:`protocols.stacks.causal_lm.lm_step` of Y[t]; output ``Y`` (1 + T, B, d), the final hidden
  rows;
* ``encoder-decoder``: phase 0 the encoder and :meth:`protocols.stacks.decoder.DecodeState.start`
  (what ``decode_open`` runs), phase 1 + t :func:`protocols.stacks.decoder.decoder_step` (T >= 1);
  output (T, B, d);
* ``encoder-classifier``: phase 0 :func:`protocols.stacks.classifier.classify` (T = 0); output
  (1, B, n_classes), the logits;
* ``encoder``: phase 0 :func:`protocols.stacks.sentence.embed_sentence` (T = 0); output (1, B, d),
  the sentence embeddings.

Measurement as :mod:`protocols.jobs.diagnostic` (a barrier round first, protocol only, shares
in place): output ``stats``, the public (3, 1 + T, len(CATEGORIES) + 1, 4) array
[party][phase][category..., total][wall_ns, bytes, messages, rounds], the last category row
being the communicator's and the clock's own totals of the phase; ``mem``, the public (3, 1)
peak resident set size in bytes of each party process at the end of the job.

In malicious mode (``[cluster] security``, :mod:`net.party.malicious`) every phase ends with
a flush, as the production job that runs it alone (``lm_prefill``, ``decode_step``, ...)
would end with its last one, so each phase's stats include its whole verification (the
breakdown's ``verify`` category); the job's own last flush then has nothing to prove.
"""
from __future__ import annotations

import numpy as np

from mpc3.procinfo import peak_rss
from mpc3.shares import AShare

from .. import model as M
from .breakdown import recording
from .contract import TENSORS, JobContext, JobSpec, TensorSpec
from .diagnostic import barrier, public_stats

MAX_TOKENS = 4096


def _stack(rows: list[AShare]) -> AShare:
    return AShare(np.stack([r.a for r in rows]), np.stack([r.b for r in rows]))


def session_fuse(cfg: M.ModelConfig, params) -> tuple:
    """The fusions the ``fuse`` parameter picks for ``cfg``'s sessions, as the architecture's
    session-opening job kind reads it (ValueError if unknown; a classifier or a headless
    encoder has none)."""
    from protocols.layers.ln_proj import fusion_choice

    from .causal_lm import session_fuse as lm_fuse
    from .transformer import session_fuse as encdec_fuse
    if cfg.arch in (M.ENCODER_CLASSIFIER, M.ENCODER):
        return fusion_choice(params.get("fuse"), (), (), f"an {cfg.arch} model's")
    return (lm_fuse if cfg.arch == M.DECODER_ONLY else encdec_fuse)(params)


def _phases(ctx: JobContext, cfg: M.ModelConfig, x: AShare, ys: AShare | None, T: int):
    """Yields each phase's output (None when the phase has none) as it finishes."""
    p, shares = ctx.party, ctx.model.shares
    fuse = session_fuse(cfg, ctx.params)
    if cfg.arch == M.DECODER_ONLY:
        from protocols.stacks.causal_lm import lm_prefill, lm_step
        h, state = lm_prefill(p, cfg, shares, x, fuse=fuse)
        yield h
        for t in range(T):
            yield lm_step(p, cfg, shares, state, ys[t])
    elif cfg.arch == M.ENCODER_CLASSIFIER:
        from protocols.stacks.classifier import classify
        yield classify(p, cfg, shares, x)
    elif cfg.arch == M.ENCODER:
        from protocols.stacks.sentence import embed_sentence
        yield embed_sentence(p, cfg, shares, x)
    else:
        from protocols.stacks.decoder import DecodeState, decoder_step
        from protocols.stacks.encoder import encoder
        state = DecodeState.start(p, cfg, shares, encoder(p, cfg, shares, x), fuse=fuse)
        yield None
        for t in range(T):
            yield decoder_step(p, cfg, shares, state, ys[t])


def run_bench_lm(ctx: JobContext, inputs: dict) -> dict:
    party, params = ctx.party, ctx.params
    cfg = M.ModelConfig.from_dict(params["config"])
    T = int(params.get("tokens", 0))
    barrier(party)
    rows, outs = [], []
    with recording(party) as rec:
        for out in _phases(ctx, cfg, inputs["X"], inputs.get("Y"), T):
            if party.checks is not None:     # malicious mode: each phase verified in its own
                party.checks.flush(party)    # stats, as its production job would be
            rows.append(rec.take())
            if out is not None:
                outs.append(out)
    mine = np.stack(rows).astype(np.uint64)
    rss = np.array([[peak_rss()]], np.uint64)
    return {"Y": _stack(outs), "stats": public_stats(party, mine),
            "mem": public_stats(party, rss)}


def validate_bench_lm(model, inputs: dict, params) -> None:
    cfg = M.ModelConfig.from_dict(params.get("config") or {})
    T = params.get("tokens", 0)
    if isinstance(T, bool) or not isinstance(T, int) or not 0 <= T <= MAX_TOKENS:
        raise ValueError(f"tokens must be an integer in 0..{MAX_TOKENS}")
    if cfg.arch in (M.ENCODER_CLASSIFIER, M.ENCODER) and T:
        raise ValueError("a classifier or headless encoder generates no tokens "
                         "(tokens = 0)")
    if cfg.arch == M.ENCODER_DECODER and not T:
        raise ValueError("an encoder-decoder run needs tokens >= 1 (its output is per token)")
    session_fuse(cfg, params)
    want = {"X", "Y"} if T else {"X"}
    if set(inputs) != want:
        raise ValueError(f"bench_lm takes inputs {sorted(want)}, got {sorted(inputs)}")
    x = tuple(inputs["X"])
    if len(x) != 3 or x[-1] != cfg.d_model:
        raise ValueError(f"X must be (B, S, {cfg.d_model}), got {x}")
    if x[1] + T > cfg.max_len and cfg.arch == M.DECODER_ONLY:
        raise ValueError(f"{x[1]} prompt + {T} tokens exceed max_len {cfg.max_len}")
    if T and tuple(inputs["Y"]) != (T, x[0], cfg.d_model):
        raise ValueError(f"Y must be ({T}, {x[0]}, {cfg.d_model}), got {tuple(inputs['Y'])}")


SPECS = (
    JobSpec("bench_lm", run_bench_lm, None,
            (TensorSpec("Y", ("...",)), TensorSpec("stats", ("3", "phases", "cats", "4")),
             TensorSpec("mem", ("3", "1"))),
            (TENSORS,), computation="diagnostic", validate=validate_bench_lm,
            params=("config", "tokens", "fuse"), diagnostic=True,
            doc="a model's prefill and generated tokens with the breakdown by operation type"),
)
