"""Production job kind of a headless encoder (``arch = "encoder"``: BertModel,
sentence-transformers).

* ``embed`` (computation ``embed``, the model's own inference, permitted by default):
  input ``X`` (B, S, d), the embedded input -> output ``E`` (B, d), the sentence embeddings
  (:func:`protocols.stacks.sentence.embed_sentence`: encoder, the model's pooling, L2
  normalization when the config says so).

No parameters; per-layer costs are marked (``enc.i``, ``enc.final_ln``, ``pool``,
``normalize``).
"""
from __future__ import annotations

from protocols.stacks.sentence import embed_sentence

from .contract import ENCODER, JobContext, JobSpec, TensorSpec
from .transformer import validate_source


def run_embed(ctx: JobContext, inputs: dict) -> dict:
    return {"E": embed_sentence(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                                on_layer=ctx.costs.mark)}


SPECS = (
    JobSpec("embed", run_embed, (TensorSpec("X", ("B", "S", "d")),),
            (TensorSpec("E", ("B", "d")),), (ENCODER,), computation="embed",
            validate=validate_source,
            doc="sentence embeddings of an embedded input (encoder, pooling, normalization)"),
)
