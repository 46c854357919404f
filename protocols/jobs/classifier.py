"""Production job kinds of an encoder classifier (``arch = "encoder-classifier"``).

* ``classify`` (computation ``classify``, the model's own inference, permitted by default):
  input ``X`` (B, S, d), the embedded input -> output ``logits`` (B, C), C = n_classes.
* ``classify_argmax`` (computation ``classify-argmax``): the same, then the arg-max class is
  computed on shares (:func:`protocols.layers.vocab.argmax_a`) and only ``class`` (B,) - the
  index, in fixed point - is returned. An owner that permits only ``classify-argmax`` lets
  its users learn the class and nothing of the logits.

Neither takes parameters; per-layer costs are marked (``enc.i``, ``enc.final_ln``, ``head``).
"""
from __future__ import annotations

from protocols.layers.vocab import argmax_a
from protocols.stacks.classifier import classify

from .contract import ENCODER_CLASSIFIER, JobContext, JobSpec, TensorSpec
from .transformer import validate_source


def run_classify(ctx: JobContext, inputs: dict) -> dict:
    return {"logits": classify(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                               on_layer=ctx.costs.mark)}


def run_classify_argmax(ctx: JobContext, inputs: dict) -> dict:
    logits = classify(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                      on_layer=ctx.costs.mark)
    out = argmax_a(ctx.party, logits)
    ctx.costs.mark("argmax")
    return {"class": out}


_EC = (ENCODER_CLASSIFIER,)
X_IN = (TensorSpec("X", ("B", "S", "d")),)

SPECS = (
    JobSpec("classify", run_classify, X_IN, (TensorSpec("logits", ("B", "C")),), _EC,
            computation="classify", validate=validate_source,
            doc="class logits of an embedded input (encoder, mean pooling, head)"),
    JobSpec("classify_argmax", run_classify_argmax, X_IN, (TensorSpec("class", ("B",)),), _EC,
            computation="classify-argmax", validate=validate_source,
            doc="only the arg-max class of an embedded input, computed on shares"),
)
