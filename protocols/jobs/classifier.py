"""Production job kinds of an encoder classifier (``arch = "encoder-classifier"``).

* ``classify`` (computation ``classify``, the model's own inference, permitted by default):
  input ``X`` (B, S, d), the embedded input -> output ``logits`` (B, C), C = n_classes.
* ``classify_argmax`` (computation ``classify-argmax``): the same, then the arg-max class is
  computed on shares (:func:`protocols.layers.vocab.argmax_a`) and only ``class`` (B,) - the
  index, in fixed point - is returned. An owner that permits only ``classify-argmax`` lets
  its users learn the class and nothing of the logits.

Neither takes parameters; per-layer costs are marked (``enc.i``, ``enc.final_ln``, ``head``).

A model whose owner keeps its embedding tables secret (``share-model --secret-embeddings``,
:mod:`protocols.stacks.secret_encoder`) takes its tokens as one-hot rows ``ONEHOT`` (B, S,
V + Tv) - ring integers 0/1, dealt unencoded, each word's row then its token type's - in
``classify_secret`` (computation ``classify-secret``: the logits) and
``classify_argmax_secret`` (computation ``classify-argmax-secret``: the class alone, what
such a model permits by default); an ``embed`` mark precedes the layers'.
"""
from __future__ import annotations

from protocols.layers.vocab import argmax_a
from protocols.model import ModelConfig
from protocols.stacks.classifier import classify
from protocols.stacks.secret_encoder import check_onehot_shape, classify_secret

from .contract import ENCODER_CLASSIFIER, JobContext, JobSpec, ModelView, TensorSpec
from .transformer import MAX_BATCH, MAX_SRC_LEN, secret_model, validate_source


def run_classify(ctx: JobContext, inputs: dict) -> dict:
    return {"logits": classify(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                               on_layer=ctx.costs.mark)}


def run_classify_argmax(ctx: JobContext, inputs: dict) -> dict:
    logits = classify(ctx.party, ctx.model.config, ctx.model.shares, inputs["X"],
                      on_layer=ctx.costs.mark)
    out = argmax_a(ctx.party, logits)
    ctx.costs.mark("argmax")
    return {"class": out}


# ------------------------------------------------------- secret embedding tables ----
def secret_encoder(model: ModelView, inputs: dict, plain: str) -> ModelConfig:
    """Checks of a secret-embeddings encoder job: the model's mode and calibration (the
    embedding LayerNorm's sites), one-hot rows (B, S, V + Tv) of a bounded batch and at most
    max_len positions."""
    ln = model.config.embedding == "learned-ln"       # its LayerNorm runs on shares
    cfg = secret_model(model, {"embed.ln": ("var_eps", "scale")} if ln else {}, plain)
    shape = tuple(inputs["ONEHOT"])
    check_onehot_shape(cfg, shape)
    if not 1 <= shape[0] <= MAX_BATCH:
        raise ValueError(f"batch size {shape[0]} outside 1..{MAX_BATCH}")
    if shape[1] > MAX_SRC_LEN:
        raise ValueError(f"an input of {shape[1]} tokens: at most {MAX_SRC_LEN}")
    return cfg


def _validate_secret(model: ModelView, inputs: dict, params) -> None:
    secret_encoder(model, inputs, "classify / classify_argmax on embedded inputs")


def run_classify_secret(ctx: JobContext, inputs: dict) -> dict:
    return {"logits": classify_secret(ctx.party, ctx.model.config, ctx.model.shares,
                                      inputs["ONEHOT"], on_layer=ctx.costs.mark)}


def run_classify_argmax_secret(ctx: JobContext, inputs: dict) -> dict:
    logits = run_classify_secret(ctx, inputs)["logits"]
    out = argmax_a(ctx.party, logits)
    ctx.costs.mark("argmax")
    return {"class": out}


_EC = (ENCODER_CLASSIFIER,)
#: an encoder's tokens as secret one-hot rows: each word's, then its token type's
ONEHOT_IN = (TensorSpec("ONEHOT", ("B", "S", "V"), integers=True),)
X_IN = (TensorSpec("X", ("B", "S", "d")),)

SPECS = (
    JobSpec("classify", run_classify, X_IN, (TensorSpec("logits", ("B", "C")),), _EC,
            computation="classify", validate=validate_source,
            doc="class logits of an embedded input (encoder, mean pooling, head)"),
    JobSpec("classify_argmax", run_classify_argmax, X_IN, (TensorSpec("class", ("B",)),), _EC,
            computation="classify-argmax", validate=validate_source,
            doc="only the arg-max class of an embedded input, computed on shares"),
    JobSpec("classify_secret", run_classify_secret, ONEHOT_IN,
            (TensorSpec("logits", ("B", "C")),), _EC, computation="classify-secret",
            validate=_validate_secret,
            doc="class logits of secret one-hot tokens (the owner's tables stay secret)"),
    JobSpec("classify_argmax_secret", run_classify_argmax_secret, ONEHOT_IN,
            (TensorSpec("class", ("B",)),), _EC, computation="classify-argmax-secret",
            validate=_validate_secret,
            doc="only the arg-max class of secret one-hot tokens, computed on shares"),
)
