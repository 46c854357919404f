"""Transformer job kinds of a party process: ``encoder``, ``decode_open``, ``decode_step``,
``decode_close`` (imported by :mod:`net.server` through ``JOB_KIND_MODULES``, which calls
:func:`register_job_kinds`).

A model shared by ``mpc3 share-model`` carries its public :class:`~protocols.model.ModelConfig`
in ``public_meta["model_config"]`` and the share layout of :mod:`protocols.secure_model`.

* ``encoder``: inputs ``X`` (B, S, d) -> outputs ``Y`` (B, S, d), the encoder output.
* ``decode_open`` (session job): inputs ``X`` (B, S, d), the embedded source. Runs the encoder
  once and builds the secret decode state (cross-attention K'^T V of every decoder layer, empty
  self-attention prefix sums, :class:`protocols.decoder.DecodeState`), kept by the party under
  the session id. No output: the encoder output never leaves the parties.
* ``decode_step`` (session job): inputs ``Y`` (B, d), the newest embedded target token ->
  outputs ``H`` (B, d), the decoder output row of that token. O(1) in the prefix length.
* ``decode_close`` (session job, no inputs): forgets the state.

Every job - each step included - runs under its own job id, so its PRG keys are fresh.
A job function sees its session as ``params["_session"]`` (set by the server; ``.state`` is
ours) and may report public per-layer costs into ``params["_costs"]`` (a list the server
returns with the job status).

The per-layer split (:func:`encoder_by_layer`, :func:`decoder_step_by_layer`) performs exactly
the kernel calls of :func:`protocols.encoder.encoder` / :func:`protocols.decoder.decoder_step`
in the same order, only taking a traffic snapshot between layers.
"""
from __future__ import annotations

from types import SimpleNamespace

from mpc3.party import Party
from mpc3.shares import AShare

from . import model as M
from .decoder import DecodeState, decoder_step
from .encoder import _ln, encoder_layer
from .secure_model import PROJ_EXTRA, check_shares

MAX_BATCH = 256
MAX_SRC_LEN = 4096


def model_config(params: dict) -> M.ModelConfig:
    """The public model config stored with the model (ValueError if it is not a transformer)."""
    meta = params.get("model_meta") or {}
    if "model_config" not in meta:
        raise ValueError("the model has no public model_config: share it with "
                         "'mpc3 share-model' (a transformer in the protocols/model.py format)")
    if meta.get("layout") not in (None, "protocols.secure_model"):
        raise ValueError(f"model layout {meta.get('layout')!r} is not protocols.secure_model")
    return M.ModelConfig.from_dict(meta["model_config"])


def _check_model(model_shapes: dict, params: dict) -> M.ModelConfig:
    cfg = model_config(params)
    check_shares(cfg, {k: SimpleNamespace(shape=tuple(s)) for k, s in model_shapes.items()})
    fr = params.get("model_frac") or {}
    if fr:
        base = min(fr.values())
        for k, f in fr.items():
            want = base + PROJ_EXTRA if k.endswith(("_proj", ".wv_c")) else base
            if f != want:
                raise ValueError(f"model tensor {k!r} is encoded with {f} fractional bits, "
                                 f"expected {want} (protocols.secure_model layout)")
    return cfg


def _check_inputs(inputs: dict, name: str, ndim: int, cfg: M.ModelConfig) -> tuple:
    if set(inputs) != {name}:
        raise ValueError(f"takes exactly one input {name!r}, got {sorted(inputs)}")
    shape = tuple(inputs[name])
    if len(shape) != ndim or shape[-1] != cfg.d_model:
        want = "(B, S, d)" if ndim == 3 else "(B, d)"
        raise ValueError(f"input {name} must be {want} with d = {cfg.d_model}, got {shape}")
    if not 1 <= shape[0] <= MAX_BATCH:
        raise ValueError(f"batch size {shape[0]} outside 1..{MAX_BATCH}")
    if ndim == 3:
        limit = min(cfg.max_len, MAX_SRC_LEN)
        if not 1 <= shape[1] <= limit:
            raise ValueError(f"input of {shape[1]} positions is too long: the model takes "
                             f"1..{limit} (max_len)")
    return shape


def _cost(p: Party, before) -> dict:
    d = p.stats - before
    return {"bytes": d.bytes_sent, "messages": d.messages, "rounds": d.rounds}


# ------------------------------------------------------------------ per-layer stacks ----
def encoder_by_layer(p: Party, cfg: M.ModelConfig, shares: dict, x: AShare,
                     costs: list | None = None) -> AShare:
    """== protocols.encoder.encoder, recording the traffic of every layer into ``costs``."""
    if len(x.shape) != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"encoder input must be (B, S, {cfg.d_model}), got {x.shape}")
    for i in range(cfg.n_enc_layers):
        s0 = p.stats.snapshot()
        x = encoder_layer(p, cfg, shares, i, x)
        if costs is not None:
            costs.append({"layer": f"enc.{i}", **_cost(p, s0)})
    if cfg.norm_first:
        s0 = p.stats.snapshot()
        x = _ln(p, cfg, shares, "enc.final_ln", x)
        if costs is not None:
            costs.append({"layer": "enc.final_ln", **_cost(p, s0)})
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
                          y_t: AShare, costs: list | None = None,
                          views: list | None = None) -> AShare:
    """== protocols.decoder.decoder_step, recording the traffic of every decoder layer.

    Post-LN stacks run layer by layer (each layer through ``decoder_step`` on a one-layer
    view sharing this state's prefix sums); pre-LN stacks run in one call (one cost entry).
    """
    if cfg.norm_first or cfg.n_dec_layers <= 1:
        s0 = p.stats.snapshot()
        out = decoder_step(p, cfg, shares, state, y_t)
        if costs is not None:
            costs.append({"layer": "dec", **_cost(p, s0)})
        return out
    views = views if views is not None else [_LayerView(cfg, shares, i)
                                             for i in range(cfg.n_dec_layers)]
    x = y_t
    for i, v in enumerate(views):
        s0 = p.stats.snapshot()
        sub_state = DecodeState([state.prefix[i]], [state.cross_kv[i]], state.n_enc, state.t)
        x = decoder_step(p, v.cfg, v.shares, sub_state, x)
        if costs is not None:
            costs.append({"layer": f"dec.{i}", **_cost(p, s0)})
    state.t += 1
    return x


# ------------------------------------------------------------------------ job kinds ----
def job_encoder(p: Party, model: dict, inputs: dict, params: dict) -> dict:
    cfg = model_config(params)
    return {"Y": encoder_by_layer(p, cfg, model, inputs["X"], params.get("_costs"))}


def validate_encoder(model_shapes: dict, input_shapes: dict, params: dict) -> None:
    _check_inputs(input_shapes, "X", 3, _check_model(model_shapes, params))


class DecodeSession:
    """What a party keeps between the jobs of one decode session (shares + public counters)."""

    def __init__(self, cfg: M.ModelConfig, shares: dict, state: DecodeState) -> None:
        self.cfg = cfg
        self.state = state
        self.views = (None if cfg.norm_first or cfg.n_dec_layers <= 1 else
                      [_LayerView(cfg, shares, i) for i in range(cfg.n_dec_layers)])
        self.batch = state.prefix[0].G.shape[0] if state.prefix else None


def job_decode_open(p: Party, model: dict, inputs: dict, params: dict) -> dict:
    cfg = model_config(params)
    costs = params.get("_costs")
    enc = encoder_by_layer(p, cfg, model, inputs["X"], costs)
    s0 = p.stats.snapshot()
    state = DecodeState.start(p, cfg, model, enc)
    if costs is not None:
        costs.append({"layer": "dec.cross_kv", **_cost(p, s0)})
    params["_session"].state = DecodeSession(cfg, model, state)
    return {}


def job_decode_step(p: Party, model: dict, inputs: dict, params: dict) -> dict:
    sess: DecodeSession = params["_session"].state
    if sess is None:
        raise ValueError("the decode session was not opened")
    y = inputs["Y"]
    if sess.batch is not None and y.shape[0] != sess.batch:
        raise ValueError(f"step batch {y.shape[0]} differs from the session's {sess.batch}")
    if sess.state.t >= sess.cfg.max_len:
        raise ValueError(f"the session reached the model's length limit of "
                         f"{sess.cfg.max_len} tokens")
    out = decoder_step_by_layer(p, sess.cfg, model, sess.state, y, params.get("_costs"),
                                sess.views)
    return {"H": out}


def job_decode_close(p: Party, model: dict, inputs: dict, params: dict) -> dict:
    params["_session"].state = None
    return {}


def validate_decode_open(model_shapes: dict, input_shapes: dict, params: dict) -> None:
    _check_inputs(input_shapes, "X", 3, _check_model(model_shapes, params))


def validate_decode_step(model_shapes: dict, input_shapes: dict, params: dict) -> None:
    _check_inputs(input_shapes, "Y", 2, model_config(params))


def validate_decode_close(model_shapes: dict, input_shapes: dict, params: dict) -> None:
    if input_shapes:
        raise ValueError(f"decode_close takes no inputs, got {sorted(input_shapes)}")


JOBS = {
    "encoder": (job_encoder, validate_encoder, None),
    "decode_open": (job_decode_open, validate_decode_open, "open"),
    "decode_step": (job_decode_step, validate_decode_step, "step"),
    "decode_close": (job_decode_close, validate_decode_close, "close"),
}


def register_job_kinds(register) -> None:
    """Called by :func:`net.server.load_job_kinds` with its ``register_job_kind``
    (protocols does not import net: layering net -> protocols -> mpc3)."""
    for name, (fn, validate, session) in JOBS.items():
        register(name, fn, validate, session=session)
