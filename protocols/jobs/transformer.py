"""Production job kinds of an encoder-decoder transformer (protocols.layers.secure_model layout).

Computation ``translate`` (the model's own inference; permitted by default):

* ``decode_open`` (session): input ``X`` (B, S, d), the embedded source. Runs the encoder once
  and keeps the secret decode state (cross-attention K'^T V of every decoder layer, empty
  self-attention prefix sums, :class:`protocols.stacks.decoder.DecodeState`; softmax-style
  attention: the encoder output's K, V per layer and empty KV caches) in the session. No
  output: the encoder output never leaves the parties.
  Parameter ``fuse`` (:func:`protocols.layers.ln_proj.fusion_choice`): which LayerNorms of every
  step form the projection after them in their own rounds (default
  :data:`protocols.stacks.decoder.DEFAULT_FUSE`, ``cross,ffn,wo``; ``all`` on high-latency links:
  236 instead of 246 rounds per token of the random Privformer model for 11 % more bytes,
  7.58 instead of 6.85 MB: ``mpc3 bench translate --model random --src-len 64 --tokens 3
  --transport inproc [--fuse all]`` at d0af210). It changes the schedule, never the function
  computed. So does the model's calibration (public metadata, stored by ``share-model``,
  :mod:`protocols.stacks.schedule`): where it keeps a decoder layer's attention output times W^O below
  2^(62 - 3 frac), that layer's steps truncate o W^O by 2 frac from an untruncated o, one round less
  per attention sublayer (``deferred_wo``), and each decoder LayerNorm's sqrt_inv table covers only
  its calibrated variance octaves (``ln_spans``, fewer bytes). Random Privformer model of
  ``mpc3 bench translate --model random``: 246 rounds and 6.85 MB per token (a model
  without those calibration sites: 263 rounds, 7.22 MB, protocols.stacks.decoder).
* ``decode_step`` (session): input ``Y`` (B, d), the newest embedded target token -> output
  ``H`` (B, d), the decoder output row of that token. O(1) in the prefix length
  (relu-performer; softmax-style: O(t + S) bytes, rounds independent of t and S).
* ``decode_close`` (session, no inputs): forgets the state.

Computation ``encoder`` (only if the owner permits it: its output is an intermediate value of a
translation model): ``encoder``: ``X`` (B, S, d) -> ``Y`` (B, S, d).

Every job - each step included - runs under its own job id, so its PRG keys are fresh.
Per-layer public costs are marked into the job's :class:`~protocols.jobs.contract.CostRecorder`
through the stacks' ``on_layer`` hook.
"""
from __future__ import annotations

from types import SimpleNamespace

from protocols.layers.ln_proj import fusion_choice
from protocols.layers.secure_model import PROJ_EXTRA, check_shares
from protocols.stacks.decoder import DEFAULT_FUSE, FUSIONS, DecodeState, decoder_step
from protocols.stacks.encoder import encoder
from protocols.stacks.schedule import session_schedule

from .. import model as M
from .contract import ENCODER_DECODER, JobContext, JobSpec, ModelView, TensorSpec

MAX_BATCH = 256
MAX_SRC_LEN = 4096


def check_model(model: ModelView) -> M.ModelConfig:
    """The model's config, after checking its shares have the secure_model layout and its
    architecture is the model's kind."""
    cfg = model.config
    if cfg.arch != model.kind:
        raise ValueError(f"model {model.model_id!r} is stored as a {model.kind} model but its "
                         f"config says arch {cfg.arch!r}")
    check_shares(cfg, {k: SimpleNamespace(shape=tuple(s)) for k, s in model.shapes().items()},
                 secret=model.meta.get("embeddings") == "secret")
    if model.fracs:
        base = min(model.fracs.values())
        for k, f in model.fracs.items():
            want = base + PROJ_EXTRA if k.endswith(("_proj", ".wv_c")) else base
            if f != want:
                raise ValueError(f"model tensor {k!r} is encoded with {f} fractional bits, "
                                 f"expected {want} (protocols.layers.secure_model layout)")
    return cfg


def secret_model(model: ModelView, sites: dict[str, tuple[str, ...]], plain: str
                 ) -> M.ModelConfig:
    """The config of a model whose owner keeps its embedding tables (and LM head) secret
    (``share-model --secret-embeddings``); ValueError if its owner hands them to its users
    (``plain``: the job kinds to run then) or if its calibration lacks one of ``sites``
    (layer -> the sites the secret ends reach: a calibration made without them)."""
    cfg = check_model(model)
    if model.meta.get("embeddings") != "secret":
        raise ValueError(f"model {model.model_id!r}: its owner hands its embedding tables to "
                         f"its users (run {plain})")
    cal = (model.meta.get("calibration") or {}).get("layers") or {}
    missing = [f"{layer}.{s}" for layer, want in sites.items() for s in want
               if s not in (cal.get(layer) or {})]
    if missing:
        raise ValueError(f"model {model.model_id!r}: its calibration lacks the secret "
                         f"embeddings' sites ({', '.join(missing)}); its owner shares it "
                         f"again")
    return cfg


def check_rows(shape: tuple, cfg: M.ModelConfig, name: str) -> None:
    if shape[-1] != cfg.d_model:
        raise ValueError(f"input {name} must have width d = {cfg.d_model}, got {shape}")
    if not 1 <= shape[0] <= MAX_BATCH:
        raise ValueError(f"batch size {shape[0]} outside 1..{MAX_BATCH}")
    if len(shape) == 3:
        limit = min(cfg.max_len, MAX_SRC_LEN)
        if not 1 <= shape[1] <= limit:
            raise ValueError(f"input of {shape[1]} positions is too long: the model takes "
                             f"1..{limit} (max_len)")


def validate_source(model: ModelView, inputs: dict, params) -> None:
    """A job of an embedded input ``X`` (B, S, d): the model's d and at most max_len rows."""
    check_rows(tuple(inputs["X"]), check_model(model), "X")


def session_fuse(params) -> tuple:
    """The LayerNorm fusions a session-opening job's ``fuse`` parameter picks (ValueError,
    naming the allowed values, otherwise)."""
    return fusion_choice(params.get("fuse"), FUSIONS, DEFAULT_FUSE, "decode_open")


def _validate_open(model: ModelView, inputs: dict, params) -> None:
    validate_source(model, inputs, params)
    session_fuse(params)


def _validate_step(model: ModelView, inputs: dict, params) -> None:
    check_rows(tuple(inputs["Y"]), model.config, "Y")


# ------------------------------------------------------------------------ job kinds ----
def run_encoder(ctx: JobContext, inputs: dict) -> dict:
    return {"Y": encoder(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                         on_layer=ctx.costs.mark)}


class DecodeSession:
    """What a party keeps between the jobs of one decode session (shares + public counters)."""

    def __init__(self, cfg: M.ModelConfig, state: DecodeState) -> None:
        self.cfg = cfg
        self.state = state
        self.batch = state.batch


def run_decode_open(ctx: JobContext, inputs: dict) -> dict:
    cfg, shares = ctx.model.config, ctx.model.shares
    enc = encoder(ctx.party, cfg, shares, inputs["X"], on_layer=ctx.costs.mark)
    state = DecodeState.start(ctx.party, cfg, shares, enc, fuse=session_fuse(ctx.params),
                              schedule=session_schedule(
                                  cfg, ctx.model.meta.get("calibration"), ctx.party.cfg),
                              on_layer=ctx.costs.mark)
    ctx.costs.mark("dec.cross_kv")
    ctx.session.state = DecodeSession(cfg, state)
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
    return {"H": decoder_step(ctx.party, sess.cfg, ctx.model.shares, sess.state, y,
                              on_layer=ctx.costs.mark, wide=True)}


def run_decode_close(ctx: JobContext, inputs: dict) -> dict:
    ctx.session.state = None
    return {}


_ED = (ENCODER_DECODER,)
X_SRC = TensorSpec("X", ("B", "S", "d"))

SPECS = (
    JobSpec("encoder", run_encoder, (X_SRC,), (TensorSpec("Y", ("B", "S", "d")),), _ED,
            computation="encoder", validate=validate_source,
            doc="the encoder output of an embedded source (an intermediate value of a "
                "translation model: only when the owner permits 'encoder')"),
    JobSpec("decode_open", run_decode_open, (X_SRC,), (), _ED, computation="translate",
            validate=_validate_open, session="open", params=("session", "fuse"),
            doc="run the encoder once and keep the secret decode state in a session; "
                "'fuse' (default, all, none or a comma list of self, cross, ffn, wo): the "
                "LayerNorms whose next projection its steps form in their rounds, and (wo) "
                "the cross attention's W^O folded into K'^T V here - fewer rounds per "
                "token for more bytes, the same output"),
    JobSpec("decode_step", run_decode_step, (TensorSpec("Y", ("B", "d")),),
            (TensorSpec("H", ("B", "d"), wide=True),), _ED, computation="translate",
            validate=_validate_step, session="step", params=("session",),
            doc="one generated token: the decoder output row of the newest embedded token"),
    JobSpec("decode_close", run_decode_close, (), (), _ED, computation="translate",
            session="close", params=("session",), doc="forget a decode session"),
)
