"""Production job kind of a headless encoder (``arch = "encoder"``: BertModel,
sentence-transformers).

* ``embed`` (computation ``embed``, the model's own inference, permitted by default):
  input ``X`` (B, S, d), the embedded input -> output ``E`` (B, d), the sentence embeddings
  (:func:`protocols.stacks.sentence.embed_sentence`: encoder, the model's pooling, L2
  normalization when the config says so).

* ``embed_secret`` (computation ``embed-secret``, what a model whose owner keeps its
  embedding tables secret permits by default, :mod:`protocols.stacks.secret_encoder`): input
  ``ONEHOT`` (B, S, V + Tv), each token's one-hot row then its type's (ring integers 0/1,
  dealt unencoded) -> ``E`` (B, d), the same embeddings; an ``embed`` mark first.

No parameters; per-layer costs are marked (``enc.i``, ``enc.final_ln``, ``pool``,
``normalize``).
"""
from __future__ import annotations

from protocols.stacks.secret_encoder import embed_secret
from protocols.stacks.sentence import embed_sentence

from .classifier import ONEHOT_IN, secret_encoder
from .contract import ENCODER, JobContext, JobSpec, ModelView, TensorSpec
from .transformer import validate_source


def run_embed(ctx: JobContext, inputs: dict) -> dict:
    return {"E": embed_sentence(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                                on_layer=ctx.costs.mark)}


def run_embed_secret(ctx: JobContext, inputs: dict) -> dict:
    return {"E": embed_secret(ctx.party, ctx.model.config, ctx.model.shares, inputs["ONEHOT"],
                              on_layer=ctx.costs.mark)}


def _validate_secret(model: ModelView, inputs: dict, params) -> None:
    secret_encoder(model, inputs, "embed on embedded inputs")


SPECS = (
    JobSpec("embed", run_embed, (TensorSpec("X", ("B", "S", "d")),),
            (TensorSpec("E", ("B", "d")),), (ENCODER,), computation="embed",
            validate=validate_source,
            doc="sentence embeddings of an embedded input (encoder, pooling, normalization)"),
    JobSpec("embed_secret", run_embed_secret, ONEHOT_IN, (TensorSpec("E", ("B", "d")),),
            (ENCODER,), computation="embed-secret", validate=_validate_secret,
            doc="sentence embeddings of secret one-hot tokens (the owner's tables stay "
                "secret)"),
)
