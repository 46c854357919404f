"""Job kinds a party runs, behind one typed contract (:mod:`protocols.jobs.contract`).

:data:`PRODUCTION` is the registry of every party started by ``mpc3 party`` / ``cluster up``:
model inference only. Benchmark and diagnostic kinds (:mod:`protocols.jobs.diagnostic`) are added
by benchmark processes alone. To add a job kind: write its function and :class:`JobSpec`
beside the protocol it runs, and list it here.
"""
from __future__ import annotations

from .causal_lm import SPECS as _CAUSAL_LM
from .classifier import SPECS as _CLASSIFIER
from .contract import (
    DECODER_ONLY,
    DEFAULT_PERMITTED,
    ENCODER,
    ENCODER_CLASSIFIER,
    ENCODER_DECODER,
    SECRET_PERMITTED,
    TENSORS,
    TRANSFORMER_LAYOUT,
    CostRecorder,
    JobContext,
    JobRefused,
    JobRegistry,
    JobSpec,
    ModelView,
    SessionSlot,
    TensorSpec,
    admit,
    execute,
    output_fracs,
)
from .runnable import model_problem
from .sentence import SPECS as _SENTENCE
from .transformer import SPECS as _TRANSFORMER

PRODUCTION = JobRegistry(_TRANSFORMER + _CLASSIFIER + _CAUSAL_LM + _SENTENCE)

__all__ = ["PRODUCTION", "benchmark_registry", "DECODER_ONLY", "DEFAULT_PERMITTED", "ENCODER",
           "ENCODER_CLASSIFIER", "ENCODER_DECODER", "SECRET_PERMITTED", "TENSORS",
           "CostRecorder",
           "JobContext", "JobRefused", "JobRegistry", "JobSpec", "ModelView", "SessionSlot",
           "TRANSFORMER_LAYOUT", "TensorSpec", "admit", "execute", "model_problem",
           "output_fracs"]


def benchmark_registry() -> JobRegistry:
    """PRODUCTION plus the diagnostic kinds: for benchmark and test party processes only."""
    from .bench_lm import SPECS as LM
    from .diagnostic import SPECS
    return PRODUCTION.extended(SPECS + LM)
