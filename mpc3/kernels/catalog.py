"""The kernel catalog: every kernel once, in one registration list (SPU style).

Each :class:`Kernel` names a per-party function (as ``mpc3 bench op NAME`` calls it), its
declared cost - the kernel module's own ``cost_*(n, cfg, **options)``, every kernel cost
function taking the element count and the RingConfig first (options bound with
``functools.partial``) - a float64 reference, an input generator that stays inside the kernel's
documented range, the error tolerance on that range, and the range itself. The generic test
(tests/mpc3/test_kernel_catalog.py), ``mpc3 bench op`` and the benchmark job kinds all read this
list, so adding a kernel touches only its own module and :data:`KERNELS`.

Operands are plaintext float64/0-1 arrays of one of three kinds, shared by :meth:`Kernel.deal`:

* ``"fxp"`` - fixed point at scale ``cfg.frac``, dealt as a replicated AShare;
* ``"bit"`` - 0/1 values, dealt as a one-plane replicated BShare;
* ``"add"`` - fixed point dealt 3-out-of-3 (party i holds one ring array z_i; reshare's input).

Outputs are ``"fxp"`` (AShare at scale frac), ``"int"`` (AShare at scale 0), ``"bit"``
(BShare) or ``"public"`` (the opened ring array every party holds).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from .. import ring
from ..party import Party, RingConfig
from ..shares import BShare, bits_to_planes, planes_to_bits
from ..sharing import deal, reveal
from . import activations, arith, boolean, convert, extrema, fxp, silu, truncation
from .base import Cost

#: Shift of the "trunc" kernel (its operand is a value at scale frac + TRUNC_SHIFT).
TRUNC_SHIFT = 10

Shapes = tuple  # the operand shapes, in operand order


def _n(shapes: Shapes) -> int:
    """An elementwise kernel's n: the first operand's elements."""
    return math.prod(shapes[0])


@dataclass(frozen=True)
class Kernel:
    """One kernel: see the module docstring for operand and output kinds."""

    name: str
    fn: Callable[..., Any]                                   # fn(party, *operand shares)
    cost: Callable[[int, RingConfig], Cost]                  # declared: cost_*(n, cfg)
    reference: Callable[..., np.ndarray]                     # float64 on the plaintext operands
    inputs: Callable[[np.random.Generator, int, tuple, RingConfig], tuple]
    tolerance: Callable[[Shapes, RingConfig], tuple[float, float]]   # |e| <= rel |y| + abs
    domain: str                                              # the documented range, in words
    operands: tuple[str, ...] = ("fxp",)
    output: str = "fxp"
    size: Callable[[Shapes], int] = _n                       # the n of its cost

    def run(self, party: Party, *operands) -> Any:
        return self.fn(party, *operands)

    def plaintext(self, rng: np.random.Generator, n: int = 1000, shape=(8, 16, 8),
                  cfg: RingConfig | None = None) -> tuple:
        """Operands inside the documented range, exactly representable in fixed point
        (so the reference sees the values the parties share). ``shape`` is matmul's MxKxN."""
        cfg = cfg or RingConfig()
        ops = self.inputs(rng, n, tuple(shape), cfg)
        return tuple(o if kind == "bit" else _quantize(o, cfg.frac)
                     for kind, o in zip(self.operands, ops))

    def deal(self, plain: tuple, cfg: RingConfig | None = None,
             rng: np.random.Generator | None = None) -> list[tuple]:
        """Per-party operand tuples: fresh uniform shares of every operand (``os.urandom``;
        a numpy Generator only in tests that need reproducible shares)."""
        cfg = cfg or RingConfig()
        shared = [_DEAL[k](o, cfg.frac, rng) for k, o in zip(self.operands, plain)]
        return [tuple(s[i] for s in shared) for i in range(3)]

    def value(self, outputs: list, cfg: RingConfig | None = None) -> np.ndarray:
        """float64 value of the three parties' outputs (checking that replicas agree)."""
        cfg = cfg or RingConfig()
        if self.output == "bit":                # padding bits beyond n are not compared
            n = outputs[0].n
            a, b = ([planes_to_bits(getattr(o, h), n) for o in outputs] for h in "ab")
            if any((b[i] != a[(i + 1) % 3]).any() for i in range(3)):
                raise ValueError("replicated bit shares disagree")
            return (a[0] ^ a[1] ^ a[2])[0].astype(np.float64)
        if self.output == "public":
            if any((o != outputs[0]).any() for o in outputs):
                raise ValueError("parties opened different values")
            return ring.decode(outputs[0], cfg.frac)
        return ring.decode(reveal(outputs), cfg.frac if self.output == "fxp" else 0)

    def cost_of(self, plain: tuple, cfg: RingConfig | None = None) -> Cost:
        return self.cost(self.size(tuple(np.shape(o) for o in plain)), cfg or RingConfig())

    def bound(self, plain: tuple, cfg: RingConfig | None = None) -> np.ndarray:
        """Per-element error bound rel * |reference| + abs on these operands."""
        cfg = cfg or RingConfig()
        rel, ab = self.tolerance(tuple(np.shape(o) for o in plain), cfg)
        return rel * np.abs(self.reference(*plain)) + ab


# ------------------------------------------------------------------ operand helpers ----
def _quantize(x, frac: int) -> np.ndarray:
    return ring.decode(ring.encode(np.asarray(x, dtype=np.float64), frac), frac)


def _uniform(shape, rng) -> np.ndarray:
    if rng is not None:
        return rng.integers(0, 2 ** 64, size=shape, dtype=np.uint64)
    return np.frombuffer(os.urandom(8 * math.prod(shape)), dtype=np.uint64).reshape(shape)


def _deal_bits(bits, frac: int, rng=None) -> list[BShare]:
    bits = np.asarray(bits, dtype=np.uint8).reshape(-1)
    planes = bits_to_planes(bits[None, :])
    r1, r2 = _uniform(planes.shape, rng), _uniform(planes.shape, rng)
    slots = [r1, r2, planes ^ r1 ^ r2]
    return [BShare(slots[i].copy(), slots[(i + 1) % 3].copy(), bits.size) for i in range(3)]


def _deal_additive(x, frac: int, rng=None) -> list[np.ndarray]:
    z = ring.encode(x, frac)
    r0, r1 = _uniform(z.shape, rng), _uniform(z.shape, rng)
    return [r0, r1, z - r0 - r1]


_DEAL = {"fxp": lambda x, frac, rng=None: deal(ring.encode(x, frac), rng),
         "bit": _deal_bits, "add": _deal_additive}


def _ulp(cfg: RingConfig) -> float:
    return 2.0 ** -cfg.frac


def _exact(shapes, cfg):
    return 0.0, 0.0


def _one_ulp(shapes, cfg):
    return 0.0, _ulp(cfg)


def _spread(rng, lo, hi, n, log=False) -> np.ndarray:
    """n values over [lo, hi] (log-uniform if ``log``) with both ends included."""
    a, b = (np.log2(lo), np.log2(hi)) if log else (lo, hi)
    v = rng.uniform(a, b, n)
    v[:2] = [a, b][:n]
    return 2.0 ** v if log else v


def _signs(rng, lim, n, avoid=0.0) -> np.ndarray:
    """n values in (-lim, lim), ends included, none in [-avoid, 0) (moved below it)."""
    x = _spread(rng, -lim * (1 - 2 ** -20), lim * (1 - 2 ** -20), n)
    return np.where((x < 0) & (x >= -avoid), x - 2 * avoid, x)


def _bits(rng, n) -> np.ndarray:
    return rng.integers(0, 2, n).astype(np.uint8)


def _relu_inputs(rng, n, shape, cfg):
    drop = 2.0 ** (cfg.relu_drop_bits - cfg.frac)      # documented either-answer region
    return (_signs(rng, convert.relu_limit(cfg), n, avoid=drop),)


def _product_inputs(rng, n, shape, cfg):
    """Typical products, and in exact mode two at the edges of the range (prob mode has
    no edge: a product z fails w.p. ~|z| 2^(2 frac - 64), 25 % near 2^26)."""
    lim = arith.product_limit(cfg.frac)
    x, y = rng.normal(size=n) * 4, rng.normal(size=n)
    if n >= 2 and cfg.trunc == "exact":
        x[:2], y[:2] = [-math.sqrt(0.99 * lim), math.sqrt(0.99 * lim)], math.sqrt(0.99 * lim)
    return x, y


def _matmul_inputs(rng, n, shape, cfg):
    m, k, nn = shape
    return rng.normal(size=(m, k)), rng.normal(size=(k, nn)) / math.sqrt(k)


def _matmul_relu(p, x, y):
    """ReLU(x @ y), the product stopping at the split form relu_a reads (mul_split_aa)."""
    return convert.relu_a(p, arith.mul_split_aa(p, [(x, y, "matmul")])).reshape(
        x.shape[0], y.shape[1])


def _matmul_relu_inputs(rng, n, shape, cfg):
    """matmul's operands with at least ``n`` outputs (M x max(N, n // M)): its comparison
    bits are packed a few per element group, and a handful of random bits can all be 0 (the
    wire tests look for all-zero messages)."""
    m, k, nn = shape
    return _matmul_inputs(rng, n, (m, k, max(nn, n // m)), cfg)


def _matmul_relu_tolerance(shapes, cfg):
    """One ulp of the product, and relu's either-answer region [-2^(drop-frac), 0)."""
    return 0.0, 2.0 ** (cfg.relu_drop_bits - cfg.frac) + 2 * _ulp(cfg)


#: Fractional bits of the public row scales 1/n_i of the "matmul-rowscale" kernel (as
#: attention's: protocols.layers.mha.row_scale_trunc).
ROWSCALE_BITS = 4


def _matmul_outputs(shapes: Shapes) -> int:
    """A matmul's output elements, the n of its cost."""
    return shapes[0][0] * shapes[1][1]


def _cost_matmul_relu(n: int, cfg: RingConfig) -> Cost:
    return arith.cost_mul_split(n, cfg) + convert.cost_relu_split(n, cfg)


def _cost_rowscale(n: int, cfg: RingConfig) -> Cost:
    return arith.cost_mul(n, cfg, _row_scale(1, cfg).shift)


def _cost_max_rows(n: int, cfg: RingConfig) -> Cost:
    return extrema.cost_max_rows(np.full(n // MAX_ROW, MAX_ROW), cfg)


def _row_scale(rows: int, cfg: RingConfig) -> arith.Scaled:
    """Row i times 1/(i + 1) (a causal attention's 1/n_i) in the product's truncation."""
    n = np.arange(1, rows + 1, dtype=np.float64)[:, None]
    return truncation.scaled(1.0 / n, cfg.frac, cfg.frac + ROWSCALE_BITS)


def _rowscale_tolerance(shapes, cfg):
    """One ulp of the product, and 1/n encoded with frac + ROWSCALE_BITS bits (relative
    n 2^-(frac + ROWSCALE_BITS + 1), n up to M)."""
    return shapes[0][0] * 2.0 ** -(cfg.frac + ROWSCALE_BITS + 1), 2 * _ulp(cfg)


def _sqrt_inv_tolerance(shapes, cfg):
    rel, ulps = fxp.SQRT_INV_ERROR[fxp._sqrt_inv_mode("auto", _n(shapes))][cfg.trunc]
    return rel, ulps * _ulp(cfg)


def _activation_inputs(limit, spread: float):
    """Inputs of an activation that is 0 far left and x far right (gelu, silu): mostly its
    polynomials' [-spread, spread], the range's ends (``limit(cfg)``), and the tails."""
    def inputs(rng, n, shape, cfg):
        lim = limit(cfg)
        x = rng.uniform(-spread, spread, n)
        x[:4] = [-lim, lim, -100.0, 100.0][:n]
        return (x,)
    return inputs


def _absolute(errors: dict):
    """Tolerance of a kernel whose error claim is absolute, per truncation mode."""
    return lambda shapes, cfg: (0.0, errors[cfg.trunc])


_gelu_inputs = _activation_inputs(activations.gelu_limit, 5.0)
_gelu_tolerance = _absolute(activations.GELU_ERROR)
_silu_inputs = _activation_inputs(silu.silu_limit, 12.0)


def _tanh_inputs(rng, n, shape, cfg):
    """The range's ends, zero, and values spread over it (mostly where tanh bends)."""
    lim = activations.TANH_LIMIT
    x = np.concatenate([rng.uniform(-4, 4, n - n // 4), rng.uniform(-lim, lim, n // 4)])
    x[:3] = [-lim, lim, 0.0][:n]
    return (x,)


def _exp_tolerance(shapes, cfg):
    rel, ulps = fxp.EXP_ERROR[cfg.trunc]
    return rel, ulps * _ulp(cfg)


def _reciprocal_tolerance(shapes, cfg):
    rel, ulps = fxp.RECIPROCAL_ERROR[cfg.trunc]
    return rel, ulps * _ulp(cfg)


def _exp_neg_inputs(rng, n, shape, cfg):
    """The range's ends, the floor (either answer just below it), 0, and values spread
    over [-40, 9.5] (where exp is not 0) and the whole range."""
    lo, hi = fxp.EXP_NEG_RANGE
    x = np.concatenate([rng.uniform(-40, hi, n - n // 4), rng.uniform(lo, hi, n // 4)])
    x[:5] = [lo, hi, 0.0, -fxp.EXP_NEG_FLOOR, -fxp.EXP_NEG_FLOOR - 1][:n]
    return (x,)


def _exp_neg_tolerance(shapes, cfg):
    """exp's relative error on [0, 9.5] and EXP_NEG_ERROR ulps below 0 (the floor's e^-32
    included)."""
    return fxp.EXP_ERROR[cfg.trunc][0], fxp.EXP_NEG_ERROR[cfg.trunc] * _ulp(cfg)


#: Values per row of the "max-rows" kernel (its operand holds MAX_ROW * n values: every
#: level pairs at least n values, so its packed comparison bits fill every message).
MAX_ROW = 8


def _max_rows_reference(x) -> np.ndarray:
    return x.reshape(-1, MAX_ROW).max(axis=1)


def _max_rows_inputs(rng, n, shape, cfg):
    """n rows of MAX_ROW values inside |x| < 2^13 (pairwise differences inside relu's
    range), a few ties."""
    x = rng.uniform(-2.0 ** 13, 2.0 ** 13, n * MAX_ROW) * rng.choice([1e-3, 1.0], n * MAX_ROW)
    x[1::5] = x[0]
    return (x,)


def _max_rows_tolerance(shapes, cfg):
    """Each level may keep the smaller of two values closer than relu's either-answer
    region 2^(drop - frac)."""
    return 0.0, math.log2(MAX_ROW) * 2.0 ** (cfg.relu_drop_bits - cfg.frac)


# ------------------------------------------------------------------------ the list ----
_ALL = [
    Kernel("mult", lambda p, x, y: arith.mul_aa(p, x, y),
           arith.cost_mul,
           lambda x, y: x * y, _product_inputs, _one_ulp,
           "|x*y| < arith.product_limit(frac) = 2^26", ("fxp", "fxp")),
    Kernel("matmul", lambda p, x, y: arith.matmul_aa(p, x, y), arith.cost_mul,
           lambda x, y: x @ y, _matmul_inputs, _one_ulp,
           "every |sum_k x_ik y_kj| < arith.product_limit(frac) = 2^26", ("fxp", "fxp"),
           size=_matmul_outputs),
    Kernel("matmul-rowscale",
           lambda p, x, y: arith.matmul_aa(p, x, y, _row_scale(x.shape[0], p.cfg)),
           _cost_rowscale,
           lambda x, y: (x @ y) / np.arange(1, x.shape[0] + 1)[:, None], _matmul_inputs,
           _rowscale_tolerance,
           "as matmul (the scale rides in the truncation, whose product is never reduced)",
           ("fxp", "fxp"), size=_matmul_outputs),
    Kernel("matmul-relu", _matmul_relu, _cost_matmul_relu,
           lambda x, y: np.maximum(x @ y, 0), _matmul_relu_inputs, _matmul_relu_tolerance,
           "as matmul, and every |sum_k x_ik y_kj| < convert.relu_limit(cfg) = 2^14",
           ("fxp", "fxp"), size=_matmul_outputs),
    Kernel("trunc", lambda p, x: truncation.trunc_a(p, x, TRUNC_SHIFT),
           partial(truncation.cost_trunc, bits=TRUNC_SHIFT),
           lambda x: x / 2.0 ** TRUNC_SHIFT,
           lambda r, n, sh, c: (r.normal(size=n) * 4 * 2.0 ** TRUNC_SHIFT,), _one_ulp,
           "|x| < 2^(62 - frac) (exact mode; prob fails w.p. ~|x| 2^(frac-64))"),
    Kernel("open", lambda p, x: arith.open_a(p, x),
           arith.cost_open_a,
           lambda x: x, lambda r, n, sh, c: (r.normal(size=n) * 100,), _exact,
           "any ring value", output="public"),
    Kernel("reshare", lambda p, z: arith.reshare(p, z),
           arith.cost_reshare,
           lambda x: x, lambda r, n, sh, c: (r.normal(size=n) * 100,), _exact,
           "any ring value (3-out-of-3 input)", ("add",)),
    Kernel("drelu", lambda p, x: convert.drelu_a(p, x),
           convert.cost_drelu,
           lambda x: (x >= 0).astype(np.float64), _relu_inputs, _exact,
           "|x| < convert.relu_limit(cfg) = 2^14; either answer on [-2^(drop-frac), 0)",
           output="bit"),
    Kernel("msb", lambda p, x: convert.msb_a(p, x),
           convert.cost_msb,
           lambda x: (x < 0).astype(np.float64), _relu_inputs, _exact,
           "as drelu", output="bit"),
    Kernel("relu", lambda p, x: convert.relu_a(p, x),
           convert.cost_relu,
           lambda x: np.maximum(x, 0), _relu_inputs, _exact,
           "as drelu (error < 2^(drop-frac) on the either-answer region)"),
    Kernel("b2a", lambda p, b: convert.b2a(p, b),
           convert.cost_b2a,
           lambda b: b.astype(np.float64), lambda r, n, sh, c: (_bits(r, n),), _exact,
           "bits", ("bit",), "int"),
    Kernel("and", lambda p, a, b: boolean.and_bb(p, a, b),
           boolean.cost_and_bb,
           lambda a, b: (a & b).astype(np.float64),
           lambda r, n, sh, c: (_bits(r, n), _bits(r, n)), _exact, "bits", ("bit", "bit"),
           "bit"),
    Kernel("mul-ab", lambda p, b, x: convert.mul_ab(p, b, x),
           convert.cost_inject,
           lambda b, x: b * x, lambda r, n, sh, c: (_bits(r, n), r.normal(size=n) * 100),
           _exact, "any ring value", ("bit", "fxp")),
    Kernel("select", lambda p, b, x, y: convert.select_ab(p, b, x, y),
           convert.cost_inject,
           lambda b, x, y: np.where(b == 1, y, x),
           lambda r, n, sh, c: (_bits(r, n), r.normal(size=n) * 4, r.normal(size=n)), _exact,
           "any ring value", ("bit", "fxp", "fxp")),
    Kernel("sqrt-inv", lambda p, x: fxp.sqrt_inv_a(p, x),
           fxp.cost_sqrt_inv,
           lambda x: 1 / np.sqrt(x),
           lambda r, n, sh, c: (_spread(r, *fxp.SQRT_INV_RANGE, n, log=True),),
           _sqrt_inv_tolerance, "x in fxp.SQRT_INV_RANGE = [2^-12, 2^16]"),
    Kernel("reciprocal", lambda p, x: fxp.reciprocal_a(p, x),
           fxp.cost_reciprocal,
           lambda x: 1 / x,
           lambda r, n, sh, c: (_spread(r, *fxp.RECIPROCAL_RANGE, n, log=True),),
           _reciprocal_tolerance, "x in fxp.RECIPROCAL_RANGE = [2^-12, 2^16]"),
    Kernel("exp", lambda p, x: fxp.exp_a(p, x, "limit"),
           partial(fxp.cost_exp, method="limit"),
           np.exp, lambda r, n, sh, c: (_spread(r, *fxp.EXP_RANGE, n),),
           _exp_tolerance, "x in fxp.EXP_RANGE = [-48, 9.5]"),
    Kernel("exp-neg", lambda p, x: fxp.exp_neg_a(p, x),
           fxp.cost_exp_neg, np.exp, _exp_neg_inputs,
           _exp_neg_tolerance, "x in fxp.EXP_NEG_RANGE = [-2^13, 9.5]; 0 below -32"),
    Kernel("max-rows",
           lambda p, x: extrema.max_rows_a(p, x, np.full(x.size // MAX_ROW, MAX_ROW)),
           _cost_max_rows,
           _max_rows_reference, _max_rows_inputs, _max_rows_tolerance,
           "|x| < 2^13 (differences inside convert.relu_limit); rows of MAX_ROW values"),
    Kernel("gelu", lambda p, x: activations.gelu_a(p, x),
           activations.cost_gelu, activations.gelu_ref,
           _gelu_inputs, _gelu_tolerance,
           "|x| <= activations.gelu_limit(cfg) = 2^13; error <= 6e-4"),
    Kernel("gelu-cheb", lambda p, x: activations.gelu_a(p, x, "cheb"),
           partial(activations.cost_gelu, method="cheb"), activations.gelu_ref,
           _gelu_inputs, _gelu_tolerance,
           "as gelu (the bytes-lean form gelu uses above 2^14 elements)"),
    Kernel("silu", lambda p, x: silu.silu_a(p, x),
           silu.cost_silu, silu.silu_ref,
           _silu_inputs, _absolute(silu.SILU_ERROR),
           "|x| <= silu.silu_limit(cfg) = 2^13; error <= 6e-4 (prob 7e-4)"),
    Kernel("silu-cheb", lambda p, x: silu.silu_a(p, x, "cheb"),
           partial(silu.cost_silu, method="cheb"), silu.silu_ref,
           _silu_inputs, _absolute(silu.SILU_ERROR),
           "as silu (the bytes-lean form silu uses above 2^14 elements)"),
    Kernel("tanh", lambda p, x: activations.tanh_a(p, x),
           activations.cost_tanh, np.tanh, _tanh_inputs,
           _absolute(activations.TANH_ERROR),
           "|x| <= activations.TANH_LIMIT = 24; error <= 1e-4"),
]

#: name (as typed in ``mpc3 bench op``) -> Kernel, in registration order.
KERNELS: dict[str, Kernel] = {k.name: k for k in _ALL}
assert len(KERNELS) == len(_ALL), "duplicate kernel name in the catalog"
#: refused alone in malicious mode by design: a bare resharing of a 3-out-of-3 input, which no
#: other party's values determine (verified inside the kernels that make such an input)
UNVERIFIED = frozenset({"reshare"})


# ------------------------------------------------------------- benchmark workloads ----
def workload(name: str, n: int, shape: tuple[int, int, int], rng,
             cfg: RingConfig | None = None) -> tuple[list[list], np.ndarray]:
    """(shares of each operand as [party0, party1, party2], float64 reference) of one kernel
    on ``n`` elements (matmul: ``shape`` MxKxN) inside its documented range."""
    if name not in KERNELS:
        raise ValueError(f"unknown op {name!r}; choose from {', '.join(KERNELS)}")
    kernel, cfg = KERNELS[name], cfg or RingConfig()
    plain = kernel.plaintext(rng, n, shape, cfg)
    per_party = kernel.deal(plain, cfg)
    operands = [[per_party[i][j] for i in range(3)] for j in range(len(plain))]
    return operands, kernel.reference(*plain)


#: Sizes :func:`warm_up` runs every kernel at: elements, and matmul's MxKxN (few elements
#: and the batched paths of larger calls compile different code).
WARM_UP_SIZES = ((7, (3, 5, 4)), (64, (8, 16, 8)))


def warm_up(cfg: RingConfig | None = None) -> None:
    """Every kernel once at each of :data:`WARM_UP_SIZES` on three in-process parties: the
    small, serial forms of its compiled (numba) code are built - or loaded from numba's
    cache - now (:mod:`mpc3.warmup` adds the other forms; a party calls that before it
    serves)."""
    from ..sim import make_parties, run_parties
    cfg = cfg or RingConfig()
    rng = np.random.default_rng(0)
    for kernel in KERNELS.values():
        for n, shape in WARM_UP_SIZES:
            plain = kernel.plaintext(rng, n, shape, cfg)
            run_parties(kernel.run, kernel.deal(plain, cfg, rng), parties=make_parties(cfg))


def errors(name: str, operands, out: list, ref: np.ndarray, cfg: RingConfig) -> dict:
    """max_abs_err / max_rel_err of the three parties' outputs ``out`` against ``ref``
    (DReLU's documented either-answer region [-2^drop, 0) is not counted as an error)."""
    err = np.abs(KERNELS[name].value(out, cfg) - ref)
    extra = {}
    if name == "drelu":
        x = ring.decode(reveal(operands[0]), cfg.frac)
        region = (x < 0) & (x >= -2.0 ** (cfg.relu_drop_bits - cfg.frac))
        extra = {"elements_in_documented_error_region": int(region.sum())}
        err = np.where(region, 0.0, err)
    return {"max_abs_err": float(err.max()),
            "max_rel_err": float((err / np.maximum(np.abs(ref), 1e-3)).max()), **extra}
