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

from .contract import DECODER_ONLY, JobContext, JobSpec, ModelView, TensorSpec
from .transformer import check_rows, validate_source


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


def run_lm_step(ctx: JobContext, inputs: dict) -> dict:
    state: LMState | None = ctx.session.state
    if state is None:
        raise ValueError("the LM session was not opened")
    cfg, y = ctx.model.config, inputs["Y"]
    if y.shape[0] != state.batch:
        raise ValueError(f"step batch {y.shape[0]} differs from the session's {state.batch}")
    if state.t >= cfg.max_len:
        raise ValueError(f"the session reached the model's length limit of {cfg.max_len} "
                         "tokens")
    return {"H": lm_step(ctx.party, cfg, ctx.model.shares, state, y, on_layer=ctx.costs.mark)}


def run_lm_close(ctx: JobContext, inputs: dict) -> dict:
    ctx.session.state = None
    return {}


_DO = (DECODER_ONLY,)
H_OUT = (TensorSpec("H", ("B", "d")),)

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
)
