"""Production job kinds of a decoder-only causal LM (``arch = "decoder-only"``), in the
session style of the translator's decode_open / decode_step / decode_close.

Computation ``generate`` (the model's own inference; permitted by default):

* ``lm_prefill`` (session open): input ``X`` (B, T, d), the embedded prompt -> output ``H``
  (B, d), the final hidden row of its last position; keeps the secret decode state of every
  layer (:class:`protocols.stacks.causal_lm.LMState`: Performer prefix sums, or the secret KV
  cache of a softmax-style attention) in the session.
* ``lm_step`` (session step): input ``Y`` (B, d), the newest embedded token -> ``H`` (B, d).
  O(1) in the prefix length (relu-performer; a KV cache: O(t) bytes, constant rounds);
  refused once the session holds ``max_len`` tokens.
* ``lm_close`` (session, no inputs): forgets the state.

The query user applies the LM head (``out.w``, ``out.b``, its own tensors) to ``H`` and picks
the next token; only final hidden rows leave the parties, as for the translator. Besides the
session id, ``lm_prefill`` takes ``fuse`` (:func:`protocols.layers.ln_proj.fusion_choice` over
``self``, ``ffn``; default ``ffn``): the LayerNorms whose next projection the session's steps
form in their rounds - a schedule, not a different function, as is the one the model's
calibration allows the steps (:mod:`protocols.stacks.schedule`: deferred o W^O truncations,
narrowed LayerNorm tables). Per-layer costs are marked (``dec.i``, ``dec.final_ln``).

Computation ``generate-token`` (a model shared with ``--secret-embeddings``: its owner keeps
the embedding table and LM head secret, :mod:`protocols.stacks.secret_lm`):
``lm_prefill_token`` / ``lm_step_token`` / ``lm_close_token`` take the tokens as one-hot rows
``ONEHOT`` (B, T, V) / (B, V) - ring integers 0/1, dealt unencoded - and return ``TOK`` (B,),
the next token of each row as a fixed-point index; nothing else leaves the parties.
"""
from __future__ import annotations

from protocols.layers.ln_proj import fusion_choice
from protocols.stacks.causal_lm import (
    DEFAULT_LM_FUSE,
    LM_FUSIONS,
    LMState,
    lm_prefill,
    lm_step,
)
from protocols.stacks.schedule import session_schedule
from protocols.stacks.secret_lm import lm_prefill_token, lm_step_token

from .contract import DECODER_ONLY, JobContext, JobSpec, ModelView, TensorSpec
from .transformer import MAX_BATCH, MAX_SRC_LEN, check_rows, secret_model, validate_source


def session_fuse(params) -> tuple:
    """The LayerNorm fusions a session-opening job's ``fuse`` parameter picks (ValueError,
    naming the allowed values, otherwise)."""
    return fusion_choice(params.get("fuse"), LM_FUSIONS, DEFAULT_LM_FUSE, "lm_prefill")


def _validate_prompt(model: ModelView, inputs: dict, params) -> None:
    validate_source(model, inputs, params)
    session_fuse(params)


def _validate_step(model: ModelView, inputs: dict, params) -> None:
    check_rows(tuple(inputs["Y"]), model.config, "Y")


def run_lm_prefill(ctx: JobContext, inputs: dict) -> dict:
    cfg = ctx.model.config
    h, state = lm_prefill(ctx.party, cfg, ctx.model.shares, inputs["X"],
                          on_layer=ctx.costs.mark, fuse=session_fuse(ctx.params),
                          schedule=session_schedule(cfg, ctx.model.meta.get("calibration"),
                                                    ctx.party.cfg))
    ctx.session.state = state
    return {"H": h}


def _session_state(ctx: JobContext, y) -> LMState:
    """The open session's state, checked to take one more row of ``y``'s batch."""
    state: LMState | None = ctx.session.state
    if state is None:
        raise ValueError("the LM session was not opened")
    if y.shape[0] != state.batch:
        raise ValueError(f"step batch {y.shape[0]} differs from the session's {state.batch}")
    if state.t >= ctx.model.config.max_len:
        raise ValueError(f"the session reached the model's length limit of "
                         f"{ctx.model.config.max_len} tokens")
    return state


def run_lm_step(ctx: JobContext, inputs: dict) -> dict:
    y = inputs["Y"]
    return {"H": lm_step(ctx.party, ctx.model.config, ctx.model.shares,
                         _session_state(ctx, y), y, on_layer=ctx.costs.mark)}


def run_lm_close(ctx: JobContext, inputs: dict) -> dict:
    ctx.session.state = None
    return {}


# ----------------------------------------------- secret embeddings and LM head ----
def _secret_model(model: ModelView):
    """The config of a model whose owner keeps its vocabulary ends secret (ValueError
    otherwise, or if its calibration lacks the head's sites)."""
    return secret_model(model, {"out": ("lm_head", "argmax")}, "generate: lm_prefill, lm_step")


def _check_onehot(shape: tuple, cfg, rows: bool) -> None:
    """One-hot rows (B, T, V) (``rows``) or (B, V): the model's vocabulary, a bounded batch
    and at most max_len positions."""
    if shape[-1] != cfg.tgt_vocab:
        raise ValueError(f"one-hot rows must have the vocabulary's {cfg.tgt_vocab} entries, "
                         f"got {shape}")
    if not 1 <= shape[0] <= MAX_BATCH:
        raise ValueError(f"batch size {shape[0]} outside 1..{MAX_BATCH}")
    if rows and not 1 <= shape[1] <= min(cfg.max_len, MAX_SRC_LEN):
        raise ValueError(f"a prompt of {shape[1]} tokens: the model takes 1..{cfg.max_len} "
                         f"(max_len)")


def _validate_prompt_token(model: ModelView, inputs: dict, params) -> None:
    _check_onehot(tuple(inputs["ONEHOT"]), _secret_model(model), True)
    session_fuse(params)


def _validate_step_token(model: ModelView, inputs: dict, params) -> None:
    _check_onehot(tuple(inputs["ONEHOT"]), _secret_model(model), False)


def run_lm_prefill_token(ctx: JobContext, inputs: dict) -> dict:
    cfg = ctx.model.config
    tok, state = lm_prefill_token(ctx.party, cfg, ctx.model.shares, inputs["ONEHOT"],
                                  fuse=session_fuse(ctx.params),
                                  schedule=session_schedule(
                                      cfg, ctx.model.meta.get("calibration"), ctx.party.cfg),
                                  on_layer=ctx.costs.mark)
    ctx.session.state = state
    return {"TOK": tok}


def run_lm_step_token(ctx: JobContext, inputs: dict) -> dict:
    y = inputs["ONEHOT"]
    return {"TOK": lm_step_token(ctx.party, ctx.model.config, ctx.model.shares,
                                 _session_state(ctx, y), y, on_layer=ctx.costs.mark)}


_DO = (DECODER_ONLY,)
H_OUT = (TensorSpec("H", ("B", "d")),)
TOK_OUT = (TensorSpec("TOK", ("B",)),)

SPECS = (
    JobSpec("lm_prefill", run_lm_prefill, (TensorSpec("X", ("B", "T", "d")),), H_OUT, _DO,
            computation="generate", validate=_validate_prompt, session="open",
            params=("session", "fuse"),
            doc="run the LM on an embedded prompt once; the last position's hidden row, "
                "and the secret decode state kept in a session"),
    JobSpec("lm_step", run_lm_step, (TensorSpec("Y", ("B", "d")),), H_OUT, _DO,
            computation="generate", validate=_validate_step, session="step",
            params=("session",), doc="one generated token: the hidden row of the newest "
                                     "embedded token"),
    JobSpec("lm_close", run_lm_close, (), (), _DO, computation="generate", session="close",
            params=("session",), doc="forget an LM session"),
    # an owner keeping the embedding table and LM head secret (share-model
    # --secret-embeddings): tokens in as one-hot rows (ring integers 0/1), the token out
    JobSpec("lm_prefill_token", run_lm_prefill_token, (TensorSpec("ONEHOT", ("B", "T", "V"), integers=True),),
            TOK_OUT, _DO, computation="generate-token", validate=_validate_prompt_token,
            session="open", params=("session", "fuse"),
            doc="run the LM on a prompt of secret one-hot tokens; the next token of each row "
                "(its index: no logit leaves), and the decode state kept in a session"),
    JobSpec("lm_step_token", run_lm_step_token, (TensorSpec("ONEHOT", ("B", "V"), integers=True),), TOK_OUT,
            _DO, computation="generate-token", validate=_validate_step_token, session="step",
            params=("session",), doc="one generated token from the newest token's one-hot row"),
    JobSpec("lm_close_token", run_lm_close, (), (), _DO, computation="generate-token",
            session="close", params=("session",), doc="forget a secret-head LM session"),
)
