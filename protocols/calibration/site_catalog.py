"""The range-limited kernel sites of the secure model (:data:`SITES`) and their ranges
(:func:`site_range`); :mod:`protocols.calibration.shadow` records the values reaching them.

A *site* is a place where the secure encoder (:func:`protocols.stacks.encoder.encoder`) or the
secure incremental decoder (:meth:`protocols.stacks.decoder.DecodeState.start` +
:func:`decoder_step`) hands a value to a kernel that is exact only on a documented range:

* ``product``: a truncated product (mul_aa / matmul_aa / mul_many_aa item) is
  exact while its real value satisfies |z| < ``arith.product_limit(frac, extra)``, ``extra``
  being the additional fractional bits of one operand (PROJ_EXTRA for the projections); a
  public factor in its truncation (a 1/n row scale) does not count: it never reduces the
  product mod 2^64 (``truncation.scaled``);
* ``relu``: relu_a inputs must satisfy |x| < ``convert.relu_limit(ring)``;
* ``gelu``: gelu_a inputs must satisfy |x| <= ``activations.gelu_limit(ring)`` (2^13);
* ``silu``: silu_a inputs must satisfy |x| <= ``silu.silu_limit(ring)`` (2^13);
* ``tanh``: tanh_a inputs (BERT's pooler) must satisfy |x| <= ``activations.TANH_LIMIT`` (24);
* ``sqrt_inv``: sqrt_inv_a inputs must lie in ``fxp.SQRT_INV_RANGE`` (a LayerNorm's
  ``var_eps`` checks the lower end only when ln_eps is below it; ``norm_sq``, a sentence
  embedding's squared norm, always).

* ``exp`` / ``reciprocal`` (models with softmax-style ``attention``): inputs inside
  ``fxp.EXP_RANGE`` / ``fxp.RECIPROCAL_RANGE``, both recorded as (min, max) spans. The
  max-subtracted softmax (the default ``softmax_form``) has neither: its exp inputs are
  s - max <= 0 (0 below -32) and its row sums lie in [1, n]; its row maximum is a ReLU
  tournament (site ``rowmax``), so no model is refused for the size of its scores below
  ~2^12 / margin.

Schedule sites (``Site.schedule``) never refuse a model: they record a value that decides
whether a faster schedule is exact for it. ``wo_raw``: a decode step's normalised o W^O,
whose truncation by 2 frac from an untruncated o (one round less,
:func:`protocols.stacks.schedule.deferred_wo`) is exact below ``arith.product_limit(frac, frac)``;
``kvwo``: the cross attention's (K'^T V)_h W^O_h, which a session may form once
(:func:`protocols.stacks.schedule.folded_wo`) below ``arith.product_limit(frac)``.

Sites per layer (:data:`SITES`): what reaches the kernel, and what the model owner can change
when a calibration (:mod:`protocols.calibration.calibrate`) refuses the model there.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpc3.kernels import activations, arith, convert, fxp, silu
from mpc3.party import RingConfig
from protocols.layers.attention_variants import SIG_BITS
from protocols.layers.secure_model import PROJ_EXTRA


@dataclass(frozen=True)
class Site:
    kernel: str         # "product" | "relu" | "sqrt_inv"
    what: str           # what reaches the kernel
    advice: str         # what the model owner can change
    extra: int = 0      # product: extra fractional bits of one operand
    raw: bool = False   # product: the other operand is untruncated (frac more bits)
    schedule: bool = False  # chooses a schedule where in range; never refuses a model


_ATTN = "lower attn_c or rescale W^Q/W^K/W^V"
_LONG = "lower attn_c (or use attn_norm 'mean') or shorten max_len"
_VAR = "rescale W^Q/W^K (the scores) or W^V"
_MAXFREE = ("share it with softmax_form 'max' (the default: the max-subtracted softmax takes "
            "any score range; a trained model keeps its weights)")
_VOUT = "shorten max_len (a row sums n values of V) or rescale W^V and W^O together"
_LAST_LN = ("rescale the last LayerNorm's gamma and beta by one factor (a normalized "
            "embedding does not change)")
SITES: dict[str, Site] = {
    # attention (enc.i.attn, dec.i.self, dec.i.cross)
    "proj": Site("product", "projection X [W^Q|W^K|W^V] (attn_c folded in)", _ATTN, PROJ_EXTRA),
    "omega": Site("product", "unfolded feature projection Q_h Omega_h / K_h Omega_h", _ATTN),
    "features": Site("relu", "ReLU feature input Q Omega / K Omega", _ATTN),
    "kv": Site("product", "Performer sum K'^T V", _LONG),
    "scores": Site("product", "attention scores Q'K'^T", _LONG),
    "out": Site("product", "attention output Q'(K'^T V) (or a decode step's part of it)", _LONG),
    "wo": Site("product", "output projection (.) W^O", "rescale W^O"),
    "wo_raw": Site("product", "a decode step's o W^O formed from an untruncated, normalised "
                   "o (protocols.stacks.schedule.deferred_wo)", "none needed: above the limit the "
                   "step truncates o first (one round more)", raw=True, schedule=True),
    "kvwo": Site("product", "a decode session's cross attention K'^T V (times 1/n) times "
                 "each head's rows of W^O, formed once at decode_open "
                 "(protocols.stacks.schedule.folded_wo)", "none needed: above the limit the steps "
                 "multiply by W^O themselves (one round more)", schedule=True),
    # softmax-style attentions (ModelConfig.attention != relu-performer)
    "vscores": Site("product", "attention scores q k^T (1/sqrt(d_head) folded into W^Q)",
                    _VAR),
    "rowmax": Site("relu", "softmax row spread max_j s - min_j s (+ 32, the exp floor's "
                   "comparison): the row maximum's ReLU inputs", "none an owner needs: scores "
                   "of this size do not occur in trained models; check the checkpoint"),
    "exp": Site("exp", "max-free softmax exponent (the scores)", _MAXFREE),
    "power": Site("product", "PowerSoftmax powers s^2 .. s^p", _VAR),
    "den": Site("reciprocal", "max-free softmax / PowerSoftmax row denominator",
                "softmax: " + _MAXFREE + "; PowerSoftmax: " + _VAR),
    "sigma": Site("relu", "sigma-attention ReLU input (the scores)", _VAR),
    "sigma_sum": Site("product", "sigma-attention ReLU(s) V before its 1/L (whose "
                      f"{SIG_BITS}-bit factor rides in that product)", _VAR, SIG_BITS),
    "vout": Site("product", "attention weights times V (and times 1/denominator)", _VOUT),
    # LayerNorm (enc.i.ln1, ..., dec.final_ln); RMSNorm reports at the same sites (its
    # "variance" the mean square, its "centred input" x itself)
    "sumsq": Site("product", "LayerNorm sum of squares sum_k x_k^2",
                  "lower attn_c or rescale the weights"),
    "sum2": Site("product", "LayerNorm squared row sum (sum_k x_k)^2",
                 "lower attn_c or rescale the weights"),
    "xgamma": Site("product", "LayerNorm centred input times gamma: d (x - mu) * gamma",
                   "rescale gamma or the weights"),
    "var_eps": Site("sqrt_inv", "LayerNorm variance+eps", "lower attn_c or rescale the weights"),
    "scale": Site("product", "LayerNorm output (x - mu) * gamma / sqrt(var + eps)",
                  "rescale gamma"),
    # a decode step's LayerNorm fused with the projection reading it (layernorm_project)
    "lnproj": Site("product", "unnormalised attention projection ((x - mu) * gamma) W "
                   "(and beta W)", "rescale gamma or W^Q/W^K/W^V", PROJ_EXTRA),
    "lnw1": Site("product", "unnormalised FFN product ((x - mu) * gamma) W1 (and beta W1)",
                 "rescale gamma or W1"),
    "lnscale": Site("product", "unnormalised projection times 1/sqrt(var + eps)",
                    "rescale gamma or the projection"),
    # BatchNorm (norm batchnorm): x times the folded per-channel scale gamma / sqrt(var + eps)
    "bn": Site("product", "BatchNorm input times gamma / sqrt(running var + eps)",
               "rescale gamma or raise the running var"),
    "out_scale": Site("product", "LM output times the product of AERO's betas", "rescale beta"),
    # FFN (enc.i.ffn, dec.i.ffn)
    "w1": Site("product", "FFN product x W1 (a linear FFN: x W1 W2, shared fused)",
               "rescale W1"),
    "hidden": Site("relu", "FFN hidden x W1 + b1", "rescale W1 and b1"),
    "hidden_gelu": Site("gelu", "FFN hidden x W1 + b1 (GELU input)", "rescale W1 and b1"),
    "hidden_silu": Site("silu", "FFN hidden x W1 + b1 (SiLU input)", "rescale W1 and b1"),
    "w2": Site("product", "FFN product ReLU(.) W2", "rescale W2"),
    # the gated FFN (ffn_act swiglu): silu(x W1) * (x W3), then W2
    "w3": Site("product", "gated FFN up product x W3", "rescale W3"),
    "gate": Site("product", "gated FFN product silu(x W1) * (x W3)", "rescale W1 or W3"),
    # classifier head (head), protocols.stacks.classifier
    "head": Site("product", "classifier head (sum over positions of h) @ head.w",
                 "rescale head.w or shorten max_len"),
    "argmax": Site("relu", "difference of two logits compared by the arg-max",
                   "rescale head.w and head.b"),
    # a secret LM head, protocols.layers.vocab.lm_head_token (its arg-max: site argmax)
    "lm_head": Site("product", "LM head logits h @ out.w", "rescale out.w"),
    # BERT's pooler (pool cls-tanh): first row @ pool.w, tanh, @ head.w
    "pool_dense": Site("product", "pooler product h[CLS] @ pool.w", "rescale pool.w"),
    "tanh": Site("tanh", "pooler tanh input h[CLS] @ pool.w + pool.b",
                 "rescale pool.w and pool.b"),
    # a headless encoder's pooling and normalization (pool), protocols.stacks.sentence
    "pool_max": Site("relu", "max pooling: spread max - min of a coordinate over the "
                     "positions (bounds every difference the tournament compares)", _LAST_LN),
    "norm_sumsq": Site("product", "normalize: sum of squares of the pooled embedding (mean "
                       "pooling: of the sum over the positions)",
                       "shorten max_len (mean pooling) or " + _LAST_LN),
    "norm_sq": Site("sqrt_inv", "normalize: squared norm of the pooled embedding / 4^K "
                    "(protocols.stacks.sentence.norm_scale)", _LAST_LN),
    "norm_scale": Site("product", "normalize: pooled embedding times 2^K / its norm",
                       "none needed: at most 2^K (protocols.stacks.sentence.norm_scale)"),
}


def site_range(site: str, ring: RingConfig) -> tuple[float, float]:
    """(lo, hi): magnitudes must stay below hi; sqrt_inv inputs inside [lo, hi]."""
    s = SITES[site]
    if s.kernel == "product":
        return 0.0, arith.product_limit(ring.frac, s.extra + (ring.frac if s.raw else 0))
    if s.kernel == "relu":
        return 0.0, convert.relu_limit(ring)
    if s.kernel == "gelu":
        return 0.0, activations.gelu_limit(ring)
    if s.kernel == "silu":
        return 0.0, silu.silu_limit(ring)
    if s.kernel == "tanh":
        return 0.0, activations.TANH_LIMIT
    if s.kernel == "exp":
        return tuple(float(v) for v in fxp.EXP_RANGE)
    if s.kernel == "reciprocal":
        return tuple(float(v) for v in fxp.RECIPROCAL_RANGE)
    return tuple(float(v) for v in fxp.SQRT_INV_RANGE)
