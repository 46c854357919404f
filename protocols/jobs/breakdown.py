"""Measured cost breakdown by operation type (``mpc3 bench lm``; AERO's figures split a
private inference into linear layers, softmax, GELU and LayerNorm the same way).

The entry points of :data:`TARGETS` are marked :func:`mpc3.party.profiled`: a call whose
party has a :class:`Recorder` (:func:`recording` sets it as the party's ``profiler``) opens a
*region* of the target's category; other calls (parties without a recorder) go straight on.
The recorder attributes what its party's communicator counted (bytes, messages, rounds) and
the wall time between two region boundaries to the innermost open region, so the categories
partition the measured totals exactly: nothing is estimated, and the sum over categories is
the communicator's count.

Categories (:data:`CATEGORIES`):

* ``matmul`` - products outside every other region: Q/K/V projections, W^O, the FFN's W1 and
  W2, attention scores q k^T, the Performer products and the score-times-V products, public
  truncations (a kernel call of :mod:`mpc3.kernels.arith`);
* ``attention`` - the attention nonlinearity: softmax's row maximum, exp and the division by
  the row sums (:func:`protocols.layers.attention.divide_rows`: in fused softmax / PowerSoftmax the
  e V product shares the kernel call of the reciprocal's Newton step, so it is counted
  here), PowerSoftmax's powers, sigma's ReLU, Performer's ReLU features - and,
  for a full sequence of the folded Performer, its Q/K/V projections too
  (:func:`protocols.layers.mha.project_features` and the cross attention's
  :func:`protocols.layers.cross.cross_precompute` run them in the rounds of the feature ReLU, one
  region: concurrent branches cannot be told apart in one party's counters);
* ``ffn_act`` - the FFN's activation (ReLU, GELU); a ReLU's comparison with 0 taken in the
  rounds of the product that feeds it (:func:`mpc3.kernels.arith.mul_split_aa`, few
  elements) is that product's, so it counts where the product does (``matmul``, or
  ``norm`` for a LayerNorm's projection) - the same for the Performer's features;
* ``norm`` - LayerNorm (or RMSNorm), all of it (its products and inverse square root; a
  decode step's fused LayerNorm projection :func:`protocols.layers.layernorm.layernorm_project`
  included);
* ``rotary`` - LLaMA's rotary embeddings of q and k (their one truncation,
  :func:`protocols.layers.rotary.rope_many`); the gated FFN's SiLU is ``ffn_act``, its two
  products and the gate product ``matmul``;
* ``verify`` - malicious mode's flushes (:meth:`mpc3.checks.Checks.flush`: the witnesses,
  digests and the proof), wherever they run - between kernels, at a layer's end, between
  the blocks of a row-wise kernel - so the other categories hold semi-honest mode's work
  plus what each kernel itself adds in malicious mode;
* ``other`` - the classifier's pooler tanh and arg-max, a sentence embedding's pooling and
  normalization, and the time of local work between
  kernel calls (bias additions, head reshapes, KV-cache appends): no bytes for an LM.

Every region other than ``matmul`` claims everything called inside it (a LayerNorm's
products are normalization); a ``matmul`` region inside ``attention`` never opens. Nothing is
swapped at run time: a recorder belongs to one party for the span of :func:`recording`, and
production parties have none.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from mpc3.checks import VERIFY
from mpc3.comm import CommStats
from mpc3.party import Party

CATEGORIES = ("matmul", "attention", "ffn_act", "norm", "rotary", "verify", "other")
FIELDS = ("wall_ns", "bytes", "messages", "rounds")
#: (module, function, category): the entry points a region opens at.
TARGETS = (
    ("protocols.layers.layernorm", "layernorm", "norm"),
    ("protocols.layers.layernorm", "layernorm_project", "norm"),
    ("protocols.layers.layernorm", "rmsnorm", "norm"),
    ("protocols.layers.rotary", "rope_many", "rotary"),
    ("mpc3.kernels.silu", "silu_a", "ffn_act"),
    ("protocols.layers.norms", "batchnorm", "norm"),
    ("protocols.layers.ffn", "activation", "ffn_act"),
    ("protocols.layers.attention", "relu_many", "attention"),
    ("protocols.layers.attention", "relu_split", "attention"),
    # the folded Performer's Q/K/V products share rounds with its feature ReLU (one region)
    ("protocols.layers.mha", "project_features", "attention"),
    ("protocols.layers.cross", "_cross_features", "attention"),
    ("protocols.layers.attention", "divide_rows", "attention"),
    ("protocols.layers.attention_variants", "_power", "attention"),
    ("mpc3.kernels.fxp", "exp_a", "attention"),
    ("mpc3.kernels.fxp", "exp_neg_a", "attention"),
    ("mpc3.kernels.extrema", "max_rows_a", "attention"),
    ("mpc3.kernels.fxp", "reciprocal_a", "attention"),
    ("mpc3.kernels.convert", "relu_a", "attention"),     # FFN ReLU: inside ffn_act
    ("mpc3.kernels.activations", "tanh_a", "other"),
    ("protocols.layers.vocab", "argmax_a", "other"),
    ("protocols.stacks.sentence", "pool_a", "other"),
    ("protocols.stacks.sentence", "normalize_a", "other"),
    ("mpc3.kernels.arith", "mul_many_aa", "matmul"),
    ("mpc3.kernels.arith", "mul_split_aa", "matmul"),
    ("mpc3.kernels.arith", "matmul_aa", "matmul"),
    ("mpc3.kernels.arith", "mul_aa", "matmul"),
    ("mpc3.kernels.truncation", "trunc_a", "matmul"),
    # a decode step's projections: split-form and replicated products in shared rounds
    ("protocols.layers.ln_proj", "step_project", "matmul"),
    # a session's beta W of its fused LayerNorm projections (one kernel per LN, shared rounds)
    ("protocols.layers.ln_proj", "fused_biases", "matmul"),
)
_OTHER = CATEGORIES.index("other")
#: ``module.function`` (the name :func:`mpc3.party.profiled` reports) -> category index
_REGION = {f"{mod}.{name}": CATEGORIES.index(cat) for mod, name, cat in TARGETS}
#: the region a malicious-mode flush opens (:data:`mpc3.checks.VERIFY`), also inside another
#: region (a flush between a row-wise kernel's blocks)
_REGION[VERIFY] = CATEGORIES.index("verify")


class Recorder:
    """Exclusive attribution of one party's measured traffic and time to categories."""

    def __init__(self, party: Party) -> None:
        self.party = party
        self.stack: list[int] = []
        self.acc = np.zeros((len(CATEGORIES), len(FIELDS)), np.int64)
        self._last = party.stats.snapshot()
        self._t = time.perf_counter_ns()
        self._start = self._last
        self._t0 = self._t

    def _flush(self) -> None:
        now, t = self.party.stats.snapshot(), time.perf_counter_ns()
        d: CommStats = now - self._last
        row = self.stack[-1] if self.stack else _OTHER
        self.acc[row] += (t - self._t, d.bytes_sent, d.messages, d.rounds)
        self._last, self._t = now, t

    def enter(self, entry: str) -> bool:
        """Open a region of the category of ``entry`` (a :data:`TARGETS` entry point's
        ``module.function``, or :data:`VERIFY`); False (nothing opened) inside a region that
        claims its callees (a flush opens its own everywhere)."""
        if self.stack and CATEGORIES[self.stack[-1]] != "matmul" and entry != VERIFY:
            return False
        self._flush()
        self.stack.append(_REGION[entry])
        return True

    def exit(self) -> None:
        self._flush()
        self.stack.pop()

    def take(self) -> np.ndarray:
        """(len(CATEGORIES) + 1, len(FIELDS)): what each category got since the last take,
        and as the last row the communicator's and the clock's own totals over the same
        span; resets. Call between protocols (no region open)."""
        if self.stack:
            raise RuntimeError("Recorder.take inside an open region")
        self._flush()
        d = self._last - self._start
        total = np.array([self._t - self._t0, d.bytes_sent, d.messages, d.rounds], np.int64)
        out = np.vstack([self.acc, total[None]])
        self.acc = np.zeros_like(self.acc)
        self._start, self._t0 = self._last, self._t
        return out


@contextlib.contextmanager
def recording(party: Party):
    """A :class:`Recorder` as ``party``'s profiler for the duration."""
    if party.profiler is not None:
        raise RuntimeError("the party has a profiler already")
    rec = Recorder(party)
    party.profiler = rec
    try:
        yield rec
    finally:
        party.profiler = None
