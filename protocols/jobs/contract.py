"""The typed contract between a party process and the computations it runs.

A *job kind* is a :class:`JobSpec`: its name, the tensors it takes and returns (with symbolic
shapes), the model kinds it applies to, the *computation* a model owner must permit for a
query user to run it, its role in a session, and the public parameters it accepts. The
server (:mod:`net.party.runner`) and the in-process backend run every job the same way:

1. :func:`admit` - before anything is started: the kind exists in the process's
   :class:`JobRegistry`, applies to the model, is permitted by the model's owner, takes
   exactly the parameters and input shapes it declares. Refusals raise :class:`JobRefused`
   with a reason code and a message for the user.
2. :func:`execute` - ``spec.run(ctx, inputs)`` with a :class:`JobContext` (party, model,
   validated parameters, session slot, cost recorder) and a check of the declared outputs.

What a query user may learn (DESIGN.md threat model): only the outputs of a computation the
owner permitted for that model. No parameter selects weights or exposes an intermediate
value; job kinds that run on arbitrary tensors are *diagnostic* and exist only in the
registries of benchmark and test processes (:data:`protocols.jobs.PRODUCTION` has none).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Mapping

from mpc3.party import Party
from mpc3.shares import AShare

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SESSION_ROLES = ("open", "step", "close")

#: Model kinds (``public_meta["kind"]``): what a shared model is - for a transformer, its
#: ``ModelConfig.arch``.
ENCODER_DECODER = "encoder-decoder"
ENCODER_CLASSIFIER = "encoder-classifier"
DECODER_ONLY = "decoder-only"
ENCODER = "encoder"                  # a headless encoder (sentence embeddings)
TENSORS = "tensors"                  # bare tensors (benchmarks, tests): no inference of its own
#: ``public_meta["layout"]`` of a transformer shared by ``share-model``
#: (:mod:`protocols.layers.secure_model`); other models (bare tensors) carry no calibration.
TRANSFORMER_LAYOUT = "protocols.secure_model"


class JobRefused(ValueError):
    """A submission that must not start; ``reason`` is one of :data:`REASONS`."""

    REASONS = ("unknown", "forbidden", "invalid")

    def __init__(self, reason: str, message: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor with a symbolic shape such as ``("B", "S", "d")``. ``wide``: an output
    carried at 2 frac fractional bits (its last product reshared untruncated, one round
    fewer); the chunks say so (their ``frac``) and the query user rounds it to frac bits
    after reconstructing it (:func:`net.client.outputs.reconstruct`)."""

    name: str
    shape: tuple[str, ...]
    wide: bool = False
    #: ring integers dealt as they are (one-hot rows): no fixed-point range to calibrate
    integers: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.shape)})"


@dataclass
class ModelView:
    """A stored model as a job sees it: this party's shares and the owner's public metadata."""

    model_id: str
    shares: dict[str, AShare]
    meta: dict
    fracs: dict[str, int] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        kind = self.meta.get("kind")
        if kind is None:   # models shared before kinds were recorded
            kind = self.meta.get("model_config", {}).get("arch", ENCODER_DECODER) \
                if self.meta.get("layout") == TRANSFORMER_LAYOUT else TENSORS
        return kind

    @cached_property
    def config(self):
        """The public :class:`protocols.model.ModelConfig` (ValueError if there is none)."""
        from .. import model as M
        if "model_config" not in self.meta:
            raise ValueError(f"model {self.model_id!r} has no public model_config")
        return M.ModelConfig.from_dict(self.meta["model_config"])

    @property
    def permitted(self) -> tuple[str, ...]:
        """Computations the owner permits query users to run (stored with the model)."""
        got = self.meta.get("permitted")
        if got is None:
            return DEFAULT_PERMITTED.get(self.kind, ())
        return tuple(got)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in self.shares.items()}


#: What a model of each kind permits when its owner does not say: its own inference only.
DEFAULT_PERMITTED = {ENCODER_DECODER: ("translate",), ENCODER_CLASSIFIER: ("classify",),
                     DECODER_ONLY: ("generate",), ENCODER: ("embed",), TENSORS: ()}
#: ... and when its owner keeps the embedding tables secret (``share-model
#: --secret-embeddings``): an LM's tokens, a classifier's class, an encoder's embedding
SECRET_PERMITTED = {DECODER_ONLY: ("generate-token",),
                    ENCODER_CLASSIFIER: ("classify-argmax-secret",), ENCODER: ("embed-secret",)}


class CostRecorder:
    """Public per-layer traffic of one party, marked by the protocol as layers finish."""

    def __init__(self, party: Party | None = None) -> None:
        self.party = party
        self.entries: list[dict] = []
        self._last = party.stats.snapshot() if party is not None else None

    def mark(self, layer: str) -> None:
        """Record the traffic since the previous mark (or the start) as ``layer``."""
        if self.party is None:
            return
        now = self.party.stats.snapshot()
        d = now - self._last
        self.entries.append({"layer": layer, "bytes": d.bytes_sent, "messages": d.messages,
                             "rounds": d.rounds})
        self._last = now


class SessionSlot:
    """Where a session's job kinds keep their state between jobs (``state`` is theirs).

    Rule for session job kinds: change ``state`` only after the job's first exchange, so a
    job aborted before it communicated (cancelled while its peers were not ready) leaves
    the session usable."""

    state: object = None


@dataclass
class JobContext:
    party: Party
    model: ModelView
    params: Mapping
    costs: CostRecorder
    session: SessionSlot | None = None


JobFn = Callable[[JobContext, dict[str, AShare]], dict[str, AShare]]
Validator = Callable[[ModelView, dict[str, tuple], Mapping], None]


@dataclass(frozen=True)
class JobSpec:
    """One job kind. ``validate(model, input_shapes, params)`` raises ValueError on bad
    shapes or parameters (after the generic checks of :func:`admit`)."""

    name: str
    run: JobFn
    inputs: tuple[TensorSpec, ...] | None      # None: varies, checked by ``validate``
    outputs: tuple[TensorSpec, ...]
    model_kinds: tuple[str, ...]
    computation: str
    doc: str
    validate: Validator | None = None
    session: str | None = None
    params: tuple[str, ...] = ()
    diagnostic: bool = False

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ValueError(f"invalid job kind name {self.name!r}")
        if self.session is not None and self.session not in SESSION_ROLES:
            raise ValueError(f"session must be one of {SESSION_ROLES}, got {self.session!r}")
        if self.session is not None and "session" not in self.params:
            raise ValueError(f"session job kind {self.name!r} must accept 'session'")
        if self.inputs is None and not (self.diagnostic and self.validate is not None):
            raise ValueError(f"job kind {self.name!r}: only diagnostic kinds with a "
                             "validator may leave their inputs undeclared")


class JobRegistry:
    """The job kinds one process runs; fixed at construction (no import side effects)."""

    def __init__(self, specs: Iterable[JobSpec] = ()) -> None:
        self._specs: dict[str, JobSpec] = {}
        for s in specs:
            if s.name in self._specs:
                raise ValueError(f"job kind {s.name!r} registered twice")
            self._specs[s.name] = s

    def __contains__(self, name: str) -> bool:
        return name in self._specs

    def __iter__(self):
        return iter(self._specs.values())

    def get(self, name: str) -> JobSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def extended(self, specs: Iterable[JobSpec]) -> "JobRegistry":
        return JobRegistry([*self._specs.values(), *specs])

    def inputs_of(self, model_kind: str) -> set[str]:
        """Names of the inputs this registry's production (non-diagnostic) kinds take on a
        model of ``model_kind`` (those a calibration must give a range)."""
        return {t.name for s in self._specs.values() if not s.diagnostic and
                model_kind in s.model_kinds for t in (s.inputs or ()) if not t.integers}

    @property
    def diagnostic(self) -> bool:
        """True if any kind runs on arbitrary tensors (never in a production party)."""
        return any(s.diagnostic for s in self._specs.values())


def admit(registry: JobRegistry, kind: str, model: ModelView,
          input_shapes: Mapping[str, tuple], params: Mapping) -> JobSpec:
    """The spec of an acceptable submission; :class:`JobRefused` otherwise."""
    spec = registry.get(kind)
    if spec is None:
        raise JobRefused("unknown", f"unknown job kind {kind!r} (this party runs: "
                         f"{', '.join(registry.names())})")
    if model.kind not in spec.model_kinds:
        raise JobRefused("forbidden", f"job kind {kind!r} does not apply to model "
                         f"{model.model_id!r} (a {model.kind} model)")
    if not spec.diagnostic and spec.computation not in model.permitted:
        allowed = ", ".join(model.permitted) or "nothing"
        raise JobRefused("forbidden", f"model {model.model_id!r} does not permit "
                         f"{spec.computation!r} (job kind {kind!r}); its owner permitted: "
                         f"{allowed}")
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise JobRefused("invalid", f"{kind}: unknown parameters {unknown} (accepted: "
                         f"{list(spec.params) or 'none'})")
    if spec.inputs is not None:
        if set(input_shapes) != {t.name for t in spec.inputs}:
            raise JobRefused("invalid", f"{kind} takes inputs "
                             f"{[str(t) for t in spec.inputs] or 'none'}, got "
                             f"{sorted(input_shapes)}")
        for t in spec.inputs:
            if len(input_shapes[t.name]) != len(t.shape):
                raise JobRefused("invalid", f"{kind}: input {t} has shape "
                                 f"{tuple(input_shapes[t.name])}")
    if spec.validate is not None:
        try:
            spec.validate(model, dict(input_shapes), params)
        except (ValueError, KeyError, TypeError) as exc:
            raise JobRefused("invalid", f"{kind}: {exc}") from None
    return spec


def output_fracs(spec: JobSpec, frac: int) -> dict[str, int]:
    """Output name -> the fractional bits its shares carry (``frac``, 2 frac if wide)."""
    return {t.name: 2 * frac if t.wide else frac for t in spec.outputs}


def execute(spec: JobSpec, ctx: JobContext, inputs: dict[str, AShare]) -> dict[str, AShare]:
    """Run an admitted job on this party; checks the outputs it declares. Where the model's
    owner asked for it, the inputs are first checked against the calibrated range on shares
    (:mod:`protocols.calibration.input_check`: one opened bit; refused at every party alike)."""
    from protocols.calibration.input_check import check_inputs
    if not spec.diagnostic and check_inputs(ctx.party, ctx.model.meta, inputs):
        ctx.costs.mark("input_check")
    out = spec.run(ctx, inputs)
    if not isinstance(out, dict) or not all(isinstance(v, AShare) for v in out.values()):
        raise TypeError(f"job kind {spec.name!r} must return dict[str, AShare]")
    want = {t.name for t in spec.outputs}
    if set(out) != want:
        raise TypeError(f"job kind {spec.name!r} returned {sorted(out)}, declared "
                        f"{sorted(want)}")
    return out
