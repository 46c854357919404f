"""Production job kinds of an encoder-decoder transformer (protocols.secure_model layout).

Computation ``translate`` (the model's own inference; permitted by default):

* ``decode_open`` (session): input ``X`` (B, S, d), the embedded source. Runs the encoder once
  and keeps the secret decode state (cross-attention K'^T V of every decoder layer, empty
  self-attention prefix sums, :class:`protocols.decoder.DecodeState`) in the session. No
  output: the encoder output never leaves the parties.
* ``decode_step`` (session): input ``Y`` (B, d), the newest embedded target token -> output
  ``H`` (B, d), the decoder output row of that token. O(1) in the prefix length.
* ``decode_close`` (session, no inputs): forgets the state.

Computation ``encoder`` (only if the owner permits it: its output is an intermediate value of a
translation model): ``encoder``: ``X`` (B, S, d) -> ``Y`` (B, S, d).

Every job - each step included - runs under its own job id, so its PRG keys are fresh.
Per-layer public costs are marked into the job's :class:`~protocols.jobs.contract.CostRecorder`.
The per-layer split (:func:`encoder_by_layer`, :func:`decoder_step_by_layer`) performs exactly
the kernel calls of :func:`protocols.encoder.encoder` / :func:`protocols.decoder.decoder_step`
in the same order.
"""
from __future__ import annotations

from types import SimpleNamespace

from mpc3.party import Party
from mpc3.shares import AShare

from .. import model as M
from ..decoder import DecodeState, decoder_step
from ..encoder import _ln, encoder_layer
from ..secure_model import PROJ_EXTRA, check_shares
from .contract import (ENCODER_DECODER, CostRecorder, JobContext, JobSpec, ModelView,
                       TensorSpec)

MAX_BATCH = 256
MAX_SRC_LEN = 4096


def check_model(model: ModelView) -> M.ModelConfig:
    """The model's config, after checking its shares have the secure_model layout."""
    cfg = model.config
    check_shares(cfg, {k: SimpleNamespace(shape=tuple(s)) for k, s in model.shapes().items()})
    if model.fracs:
        base = min(model.fracs.values())
        for k, f in model.fracs.items():
            want = base + PROJ_EXTRA if k.endswith(("_proj", ".wv_c")) else base
            if f != want:
                raise ValueError(f"model tensor {k!r} is encoded with {f} fractional bits, "
                                 f"expected {want} (protocols.secure_model layout)")
    return cfg


def _check_rows(shape: tuple, cfg: M.ModelConfig, name: str) -> None:
    if shape[-1] != cfg.d_model:
        raise ValueError(f"input {name} must have width d = {cfg.d_model}, got {shape}")
    if not 1 <= shape[0] <= MAX_BATCH:
        raise ValueError(f"batch size {shape[0]} outside 1..{MAX_BATCH}")
    if len(shape) == 3:
        limit = min(cfg.max_len, MAX_SRC_LEN)
        if not 1 <= shape[1] <= limit:
            raise ValueError(f"input of {shape[1]} positions is too long: the model takes "
                             f"1..{limit} (max_len)")


def _validate_source(model: ModelView, inputs: dict, params) -> None:
    _check_rows(tuple(inputs["X"]), check_model(model), "X")


def _validate_step(model: ModelView, inputs: dict, params) -> None:
    _check_rows(tuple(inputs["Y"]), model.config, "Y")


# ------------------------------------------------------------------ per-layer stacks ----
def encoder_by_layer(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare,
                     costs: CostRecorder | None = None) -> AShare:
    """== protocols.encoder.encoder, marking the traffic of every layer into ``costs``."""
    if len(x.shape) != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"encoder input must be (B, S, {cfg.d_model}), got {x.shape}")
    mark = costs.mark if costs is not None else (lambda name: None)
    for i in range(cfg.n_enc_layers):
        x = encoder_layer(p, cfg, shares, i, x)
        mark(f"enc.{i}")
    if cfg.norm_first:
        x = _ln(p, cfg, shares, "enc.final_ln", x)
        mark("enc.final_ln")
    return x


class _LayerView:
    """Decoder layer ``i`` seen as a one-layer model (post-LN only: no final LayerNorm)."""

    def __init__(self, cfg: M.ModelConfig, shares: dict, i: int) -> None:
        d = cfg.to_dict()
        d["n_dec_layers"] = 1
        self.cfg = M.ModelConfig.from_dict(d)
        pre = f"dec.{i}."
        self.shares = {("dec.0." + k[len(pre):] if k.startswith(pre) else k): v
                       for k, v in shares.items() if not k.startswith("dec.") or
                       k.startswith(pre)}


def decoder_step_by_layer(p: Party, cfg: M.ModelConfig, shares: dict, state: DecodeState,
                          y_t: AShare, costs: CostRecorder | None = None,
                          views: list | None = None) -> AShare:
    """== protocols.decoder.decoder_step, marking the traffic of every decoder layer.

    Post-LN stacks run layer by layer (each layer through ``decoder_step`` on a one-layer
    view sharing this state's prefix sums); pre-LN stacks run in one call (one cost entry).
    """
    mark = costs.mark if costs is not None else (lambda name: None)
    if cfg.norm_first or cfg.n_dec_layers <= 1:
        out = decoder_step(p, cfg, shares, state, y_t)
        mark("dec")
        return out
    views = views if views is not None else [_LayerView(cfg, shares, i)
                                             for i in range(cfg.n_dec_layers)]
    x = y_t
    for i, v in enumerate(views):
        sub_state = DecodeState([state.prefix[i]], [state.cross_kv[i]], state.n_enc, state.t)
        x = decoder_step(p, v.cfg, v.shares, sub_state, x)
        mark(f"dec.{i}")
    state.t += 1
    return x


# ------------------------------------------------------------------------ job kinds ----
def run_encoder(ctx: JobContext, inputs: dict) -> dict:
    cfg = ctx.model.config
    return {"Y": encoder_by_layer(ctx.party, cfg, ctx.model.shares, inputs["X"], ctx.costs)}


class DecodeSession:
    """What a party keeps between the jobs of one decode session (shares + public counters)."""

    def __init__(self, cfg: M.ModelConfig, shares: dict, state: DecodeState) -> None:
        self.cfg = cfg
        self.state = state
        self.views = (None if cfg.norm_first or cfg.n_dec_layers <= 1 else
                      [_LayerView(cfg, shares, i) for i in range(cfg.n_dec_layers)])
        self.batch = state.prefix[0].G.shape[0] if state.prefix else None


def run_decode_open(ctx: JobContext, inputs: dict) -> dict:
    cfg, shares = ctx.model.config, ctx.model.shares
    enc = encoder_by_layer(ctx.party, cfg, shares, inputs["X"], ctx.costs)
    state = DecodeState.start(ctx.party, cfg, shares, enc)
    ctx.costs.mark("dec.cross_kv")
    ctx.session.state = DecodeSession(cfg, shares, state)
    return {}


def run_decode_step(ctx: JobContext, inputs: dict) -> dict:
    sess: DecodeSession | None = ctx.session.state
    if sess is None:
        raise ValueError("the decode session was not opened")
    y = inputs["Y"]
    if sess.batch is not None and y.shape[0] != sess.batch:
        raise ValueError(f"step batch {y.shape[0]} differs from the session's {sess.batch}")
    if sess.state.t >= sess.cfg.max_len:
        raise ValueError(f"the session reached the model's length limit of "
                         f"{sess.cfg.max_len} tokens")
    return {"H": decoder_step_by_layer(ctx.party, sess.cfg, ctx.model.shares, sess.state, y,
                                       ctx.costs, sess.views)}


def run_decode_close(ctx: JobContext, inputs: dict) -> dict:
    ctx.session.state = None
    return {}


_ED = (ENCODER_DECODER,)
X_SRC = TensorSpec("X", ("B", "S", "d"))

SPECS = (
    JobSpec("encoder", run_encoder, (X_SRC,), (TensorSpec("Y", ("B", "S", "d")),), _ED,
            computation="encoder", validate=_validate_source,
            doc="the encoder output of an embedded source (an intermediate value of a "
                "translation model: only when the owner permits 'encoder')"),
    JobSpec("decode_open", run_decode_open, (X_SRC,), (), _ED, computation="translate",
            validate=_validate_source, session="open", params=("session",),
            doc="run the encoder once and keep the secret decode state in a session"),
    JobSpec("decode_step", run_decode_step, (TensorSpec("Y", ("B", "d")),),
            (TensorSpec("H", ("B", "d")),), _ED, computation="translate",
            validate=_validate_step, session="step", params=("session",),
            doc="one generated token: the decoder output row of the newest embedded token"),
    JobSpec("decode_close", run_decode_close, (), (), _ED, computation="translate",
            session="close", params=("session",), doc="forget a decode session"),
)
