"""Secure attention cores on replicated shares (Privformer Sec. 5, Alg. 1-3, Eq. 12-15).

Inputs are per-head tensors, heads already split: ``qf`` (B, h, Sq, r) and ``kf`` (B, h, Sk, r)
are the ReLU random features Q', K' and ``v`` (B, h, Sk, dh). All heads go through one
kernel call per step, so rounds never depend on ``h``. The public normalisation of
:func:`protocols.model.attn_norm` is *not* applied here: the constant ``c`` is folded into the
shared W^Q, W^K, W^V by :mod:`protocols.layers.secure_model` (free online), and
:mod:`protocols.layers.mha` applies the per-row ``1/n_i`` inside the truncation of the product with
W^O (no rounds of its own) only for ``attn_norm == "mean"``.

Cost declarations (``cost_*``) give rounds and bytes per party as formulas of the shapes and
are checked against the communicator's counters in
tests/protocols/layers/test_protocols_attention.py.

Batching helper: :func:`mul_many` runs several independent (mat)products in one truncated
resharing (one kernel invocation, the rounds of a single product), which is how Q'K'^T and
the block sums K'^T V of Alg. 3 share their rounds. It uses the 3-out-of-3 local product and
``arith.mul_many_aa`` (the fused reshare + truncation of mul_aa/matmul_aa).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, truncation
from mpc3.kernels.base import Cost
from mpc3.party import Party, profiled
from mpc3.shares import AShare

ORDERS = ("auto", "kv", "qk")
MASKED_FORMS = ("auto", "qk", "vk")
SOFTMAX_EXP = ("poly", "limit")


# ----------------------------------------------------------------- batched products ----
def mul_many(p: Party, items: list[tuple], trunc: bool | int = True,
             sites: list | None = None) -> list[AShare]:
    """Independent products ``x*y`` ("mul", same shapes) or ``x@y`` ("matmul") in one go.

    Items are ``(x, y, kind)`` or ``(x, y, kind, keep)`` with ``keep`` a public boolean array
    broadcastable to the output: only kept entries are reshared, the others are exactly 0
    (a causal mask never pays for the masked half of Q'K'^T). One fused reshare/truncation
    over all kept outputs (:func:`mpc3.kernels.arith.mul_many_aa`): the cost of a single
    mul_aa with that many elements (:func:`cost_mul_many`). ``sites``: per item, the
    calibration site (a shadow party's records, :mod:`protocols.calibration.shadow`).
    """
    return arith.mul_many_aa(p, [(x, y, kind, trunc, *rest) for x, y, kind, *rest in items],
                             sites)


def cost_mul_many(n_out: int, trunc: bool | int, p_cfg) -> Cost:
    return arith.cost_mul(n_out, p_cfg, trunc)


#: Extra fractional bits of a public 1/n row scale, in the truncation of the product it
#: scales (:func:`row_scale_trunc`: o W^O, K'^T V / n_enc, pooled logits / S, a deferred
#: decode step's Q'G and scores).
ROW_SCALE_EXTRA = 4


def row_scale_trunc(s, frac: int) -> arith.Scaled:
    """The truncation of a product times a public row scale ``s`` = 1/n (o W^O, a decode
    state's K'^T V, a classifier's pooled logits): s encoded with frac + ROW_SCALE_EXTRA
    fractional bits, as the separate scaling it replaces did."""
    return truncation.scaled(s, frac, frac + ROW_SCALE_EXTRA)


@profiled
def relu_many(p: Party, xs: list[AShare], site: str | None = None) -> list[AShare]:
    """ReLU of several arrays in one relu_a call (one call per protocol step)."""
    from mpc3.kernels import convert
    flat = AShare.concat([x.reshape(-1) for x in xs])
    out = convert.relu_a(p, flat, site)
    res, pos = [], 0
    for x in xs:
        res.append(out[pos:pos + x.size].reshape(x.shape))
        pos += x.size
    return res


def relu_products(p: Party, items: list[tuple], trunc, plain: list[tuple] | None = None,
                  site: str | None = None, relu_site: str | None = None):
    """ReLU(x @ w + b) for items ``(x, w, b)`` (``b`` None or a replicated bias broadcast over
    the rows) in one relu_a call, the products stopping at the split form relu_a reads
    (arith.mul_split_aa: 8 bytes per element less than products then :func:`relu_many`).
    With ``plain`` (items ``(x, w)``) the result is ``(relus, [x @ w])``: those products,
    truncated alike, come back completed from the same rounds. ``site``: the calibration
    site of every product, ``relu_site`` the ReLU's. Cost: :func:`cost_relu_products`."""
    shapes = [(*x.shape[:-1], w.shape[-1]) for x, w, _ in items]
    z = arith.mul_split_aa(p, [(x, w, "matmul") for x, w, _ in items], trunc=trunc,
                           biases=[b for _, _, b in items],
                           replicated=None if plain is None else [(x, w, "matmul")
                                                                  for x, w in plain],
                           sites=[site] * (len(items) + len(plain or [])))
    if plain is None:
        return relu_split(p, z, shapes, relu_site)
    z, done = z
    return relu_split(p, z, shapes, relu_site), done


@profiled
def relu_split(p: Party, z, shapes, site: str | None = None) -> list[AShare]:
    """ReLU of the flat products ``z`` (arith.mul_split_aa's split share, biases included)
    in one relu_a call, cut into arrays of ``shapes``. Cost: convert.cost_relu_split."""
    from mpc3.kernels import convert
    out, res, pos = convert.relu_a(p, z, site), [], 0
    for s in shapes:
        n = int(np.prod(s))
        res.append(out[pos:pos + n].reshape(s))
        pos += n
    return res


def cost_relu_products(p_cfg, n: int, trunc, n_plain: int = 0) -> Cost:
    """:func:`relu_products` on ``n`` ReLU and ``n_plain`` plain outputs."""
    from mpc3.kernels import convert
    return (arith.cost_mul_split(n, p_cfg, trunc, n_rep=n_plain)
            + convert.cost_relu_split(n, p_cfg, trunc))


# --------------------------------------------------------- unmasked (Alg. 1, Eq. 12) ----
def choose_order(B: int, h: int, Sq: int, Sk: int, r: int, dh: int) -> str:
    """Order with fewer reshared elements: K'^T V first (r*dh + Sq*dh) or Q'K'^T (Sq*Sk + Sq*dh)."""
    return "qk" if Sq * Sk < r * dh else "kv"


def relu_attention(p: Party, qf: AShare, kf: AShare, v: AShare, order: str = "auto") -> AShare:
    """Unnormalised ReLU attention Q'(K'^T V) per head (Alg. 1 steps 5-6).

    ``order``: "kv" = Q'(K'^T V) (Privformer), "qk" = (Q'K'^T)V (cheaper when Sq*Sk < r*dh),
    "auto" picks by declared communication. Cost: :func:`cost_relu_attention`.
    """
    if order not in ORDERS:
        raise ValueError(f"order={order!r} must be one of {ORDERS}")
    B, h, Sq, r = qf.shape
    Sk, dh = v.shape[-2], v.shape[-1]
    if order == "auto":
        order = choose_order(B, h, Sq, Sk, r, dh)
        if p.shadow is not None:       # calibrated: the order a shorter input takes, too
            relu_attention(p, qf, kf, v, "qk" if order == "kv" else "kv")
    if order == "kv":
        kv = arith.matmul_aa(p, kf.T, v, site="kv")
        return arith.matmul_aa(p, qf, kv, site="out")
    a = arith.matmul_aa(p, qf, kf.T, site="scores")
    return arith.matmul_aa(p, a, v, site="out")


def cost_relu_attention(p_cfg, B, h, Sq, Sk, r, dh, order="auto") -> Cost:
    if order == "auto":
        order = choose_order(B, h, Sq, Sk, r, dh)
    first = B * h * (r * dh if order == "kv" else Sq * Sk)
    return (arith.cost_mul(first, p_cfg)
            + arith.cost_mul(B * h * Sq * dh, p_cfg))


# ------------------------------------------------------------ masked (Alg. 2 and 3) ----
def tril_mask(S: int) -> np.ndarray:
    return np.tril(np.ones((S, S), dtype=np.uint64))


def masked_attention_qk(p: Party, qf: AShare, kf: AShare, v: AShare) -> AShare:
    """tril(Q'K'^T) V (Alg. 2). The mask is public: only the S(S+1)/2 entries on and below
    the diagonal are reshared (the others are zero). Cost: :func:`cost_masked_qk`."""
    S = qf.shape[-2]
    if kf.shape[-2] != S:
        raise ValueError(f"masked attention needs Sq == Sk, got {S} != {kf.shape[-2]}")
    a = mul_many(p, [(qf, kf.T, "matmul", tril_mask(S).astype(bool))])[0]
    return arith.matmul_aa(p, a, v)


def cost_masked_qk(p_cfg, B, h, S, r, dh) -> Cost:
    return (arith.cost_mul(B * h * S * (S + 1) // 2, p_cfg)
            + arith.cost_mul(B * h * S * dh, p_cfg))


def best_block(S: int, r: int, dh: int) -> int:
    """Row block L minimising (nb - 1)*r*dh + nb*L(L+1)/2 reshared elements (Alg. 3 blocked)."""
    best, best_cost = S, None
    for L in range(1, S + 1):
        nb = -(-S // L)
        c = (nb - 1) * r * dh + nb * L * (L + 1) // 2
        if best_cost is None or c < best_cost:
            best, best_cost = L, c
    return best


def masked_attention_vk(p: Party, qf: AShare, kf: AShare, v: AShare,
                        block: int | None = None) -> AShare:
    """Causal Q'_i G_i with G_i = sum_{j<=i} K'_j^T V_j (Alg. 3, Eq. 15) in row blocks.

    Rows are cut into ``nb`` blocks of ``L`` (``block``; default :func:`best_block`). Stage 1,
    one kernel call: K'_b^T V_b for blocks 0..nb-2 and the in-block causal scores
    Q'_b K'_b^T (lower triangles only).
    Locally: exclusive prefix sums P_b = sum_{c<b} K'_c^T V_c (additions of shares) and the
    in-block causal mask. Stage 2, one call: out_b = [Q'_b | tril(Q'_b K'_b^T)] @ [P_b ; V_b].
    Rounds are those of two products whatever S, L and h; L = 1 is Privformer's per-row
    running sum, L = S is Alg. 2. Cost: :func:`cost_masked_vk`.
    """
    B, h, S, r = qf.shape
    dh = v.shape[-1]
    if kf.shape[-2] != S or v.shape[-2] != S:
        raise ValueError("masked attention needs Sq == Sk")
    L = best_block(S, r, dh) if block is None else int(block)
    if not 1 <= L <= S:
        raise ValueError(f"block={block} must be in 1..{S}")
    nb = -(-S // L)
    pad = nb * L - S

    def blocks(x: AShare) -> AShare:   # (B,h,S,k) -> (B,h,nb,L,k), zero-padded rows
        if pad:
            z = np.zeros(x.shape[:-2] + (pad, x.shape[-1]), dtype=np.uint64)
            x = AShare.concat([x, AShare(z, z.copy())], axis=-2)
        return x.reshape(B, h, nb, L, x.shape[-1])

    qb, kb, vb = blocks(qf), blocks(kf), blocks(v)
    items = [(qb, kb.T, "matmul", tril_mask(L).astype(bool))]
    if nb > 1:
        items.append((kb[:, :, :-1].T, vb[:, :, :-1], "matmul"))
    got = mul_many(p, items)
    scores = got[0]
    zero = np.zeros((B, h, 1, r, dh), dtype=np.uint64)
    if nb > 1:
        csum = AShare(np.cumsum(got[1].a, axis=2, dtype=np.uint64),
                      np.cumsum(got[1].b, axis=2, dtype=np.uint64))
        prefix = AShare.concat([AShare(zero, zero.copy()), csum], axis=2)
        left = AShare.concat([qb, scores], axis=-1)              # (B,h,nb,L,r+L)
        right = AShare.concat([prefix, vb], axis=-2)             # (B,h,nb,r+L,dh)
    else:
        left, right = scores, vb
    out = arith.matmul_aa(p, left, right).reshape(B, h, nb * L, dh)
    return out[:, :, :S]


def cost_masked_vk(p_cfg, B, h, S, r, dh, block=None) -> Cost:
    L = best_block(S, r, dh) if block is None else block
    nb = -(-S // L)
    first = B * h * (nb * L * (L + 1) // 2 + (nb - 1) * r * dh)
    return (arith.cost_mul(first, p_cfg)
            + arith.cost_mul(B * h * nb * L * dh, p_cfg))


def masked_attention(p: Party, qf: AShare, kf: AShare, v: AShare, form: str = "auto",
                     block: int | None = None) -> AShare:
    """Causal ReLU attention; "auto" = blocked VK with the best block (== QK when L = S)."""
    if form not in MASKED_FORMS:
        raise ValueError(f"masked form={form!r} must be one of {MASKED_FORMS}")
    if form == "qk":
        return masked_attention_qk(p, qf, kf, v)
    return masked_attention_vk(p, qf, kf, v, block=block)


# ------------------------------------------------------------- incremental decoding ----
def default_decode_block(r: int, dh: int) -> int:
    """Cache length L minimising amortised traffic per token, r*dh/L + L/2 (per head)."""
    return max(1, int(round(math.sqrt(2 * r * dh))))


@dataclass
class PrefixState:
    """Secret incremental state of one masked self-attention (Eq. 15), per head.

    ``G`` (B, h, r, dh) = sum of K'_j^T V_j over the *folded* prefix; ``kc`` (B, h, n, r) and
    ``vc`` (B, h, n, dh) cache the last ``n < block`` tokens not yet folded into G. Every
    ``block`` tokens the cache is folded into G with one K'^T V product that rides in the same
    kernel call as the step's own products (no extra rounds). The state is O(block) = O(1) in
    the prefix length; block = 1 is Privformer's per-token G update (r*dh elements reshared
    every token), the default :func:`default_decode_block` amortises that to a few elements.
    """

    G: AShare
    kc: AShare | None = None
    vc: AShare | None = None
    block: int = 1
    t: int = 0

    @property
    def batch(self) -> int:
        return self.G.shape[0]
    folded: int = 0

    @staticmethod
    def empty(B: int, h: int, r: int, dh: int, block: int | None = None) -> "PrefixState":
        block = default_decode_block(r, dh) if block is None else int(block)
        if block < 1:
            raise ValueError(f"decode block={block} must be >= 1")
        z = np.zeros((B, h, r, dh), dtype=np.uint64)
        return PrefixState(AShare(z, z.copy()), block=block)

    @property
    def cached(self) -> int:
        return 0 if self.kc is None else self.kc.shape[2]


def attention_step(p: Party, state: PrefixState, qf: AShare, kf: AShare, v: AShare,
                   raw: bool = False, scale: float | None = None) -> AShare:
    """One new token: qf, kf (B, h, 1, r), v (B, h, 1, dh) -> Q'_t G_t (B, h, 1, dh).

    Stage 1 (one call): Q'_t G (if anything is folded), scores Q'_t K'_c^T against the cache
    (current token included) and, when the cache is full, its fold K'_c^T V_c;
    stage 2: scores @ V_c. Out = Q'_t G + (Q'_t K'_c^T) V_c. Cost: :func:`cost_attention_step`.

    ``raw`` (a decode step that defers this truncation into o W^O,
    :func:`protocols.stacks.schedule.deferred_wo`): stage 1 truncates Q'_t G and the scores times
    the public row scale ``scale`` (attn_norm "mean": 1/n; None: none) and stage 2 is
    reshared untruncated, so the output is ``scale * Out`` at 2 frac fractional bits, one
    round earlier.
    """
    kc = kf if state.kc is None else AShare.concat([state.kc, kf], axis=2)
    vc = v if state.vc is None else AShare.concat([state.vc, v], axis=2)
    fold = kc.shape[2] >= state.block
    first = True
    if raw and scale is not None:
        first = row_scale_trunc(scale, p.cfg.frac)
    items, sites = [(qf, kc.T, "matmul", first)], ["scores"]
    if state.folded:
        items.append((qf, state.G, "matmul", first))
        sites.append("out")
    if fold:
        items.append((kc.T, vc, "matmul", True))
        sites.append("kv")
    got = arith.mul_many_aa(p, items, sites)
    out = arith.matmul_aa(p, got[0], vc, trunc=not raw, site="out")
    if state.folded:
        prev = got[1].scale(np.uint64(1 << p.cfg.frac)) if raw else got[1]
        out = out + prev
    if fold:
        state.G = state.G + got[-1]
        state.folded += kc.shape[2]
        state.kc = state.vc = None
    else:
        state.kc, state.vc = kc, vc
    state.t += 1
    return out


def cost_attention_step(p_cfg, B, h, r, dh, cached: int, folded: bool, block: int,
                        raw: bool = False, scaled: bool = False) -> Cost:
    """Cost of a step taken with ``cached`` tokens already in the cache (``raw``, ``scaled``:
    :func:`attention_step`'s deferred form, with a row scale)."""
    n = cached + 1
    first = B * h * (n + (dh if folded else 0))
    fold = B * h * r * dh if n >= block else 0
    if not raw:
        return (arith.cost_mul(first + fold, p_cfg)
                + arith.cost_mul(B * h * dh, p_cfg))
    shift = row_scale_trunc(1.0, p_cfg.frac).shift if scaled else p_cfg.frac
    shifts = np.concatenate([np.full(first, shift), np.full(fold, p_cfg.frac)])
    return (arith.cost_mul_many(shifts, 0, p_cfg.trunc)
            + arith.cost_mul(B * h * dh, p_cfg, False))


def cross_attention_step(p: Party, qf: AShare, kv: AShare, raw: bool = False) -> AShare:
    """Q'_t (K'^T V) with the cross-attention K'^T V (B,h,r,dh) computed once; ``raw``:
    reshared untruncated (2 frac fractional bits, one round)."""
    return arith.matmul_aa(p, qf, kv, trunc=not raw, site="out")


# --------------------------------------------------- division by softmax row sums ----
def repeat_cols(x: AShare, d: int) -> AShare:
    """(..., S) -> (..., S, d): each row value repeated over d columns."""
    shape = x.shape + (d,)
    return AShare(np.ascontiguousarray(np.broadcast_to(x.a[..., None], shape)),
                  np.ascontiguousarray(np.broadcast_to(x.b[..., None], shape)))


def _two_minus(p: Party, x: AShare) -> AShare:
    return arith.add_public(p, -x, np.full(x.shape, ring.encode(np.array(2.0), p.cfg.frac)))


@profiled
def divide_rows(p: Party, e: AShare, v: AShare, den: AShare,
                den_site: str | None = None) -> AShare:
    """(e @ v) / den per row - e (..., S, Sk), v (..., Sk, dh), den (..., S) in
    ``fxp.RECIPROCAL_RANGE`` - in the rounds of ``fxp.reciprocal_a`` alone: its guess
    (``iterations=0``), then its two Newton steps y <- y (2 - den y) with e @ v riding in
    the first step's first product and the second step applied to (e @ v) y directly:
    out = ((e @ v) y1) (2 - den y1). Four products after the guess, where reciprocal, e @ v
    and the product by 1/den take six (4 rounds fewer); the value is reciprocal_a's up to
    rounding (same Newton iterates). Cost: :func:`cost_divide_rows`. Sites: ``den_site``
    (the denominators, when calibrated), ``vout`` (e @ v and the output's products)."""
    from mpc3.kernels import fxp
    dh = v.shape[-1]
    y = fxp.reciprocal_a(p, den, iterations=0, site=den_site)
    xy, ev = mul_many(p, [(den, y, "mul"), (e, v, "matmul")], sites=[None, "vout"])
    y = arith.mul_aa(p, y, _two_minus(p, xy))
    xy, evy = mul_many(p, [(den, y, "mul"), (ev, repeat_cols(y, dh), "mul")],
                       sites=[None, "vout"])
    return arith.mul_aa(p, evy, repeat_cols(_two_minus(p, xy), dh), site="vout")


def cost_divide_rows(p_cfg, rows: int, dh: int) -> Cost:
    """:func:`divide_rows` on ``rows`` rows of width ``dh``."""
    from mpc3.kernels import fxp
    return (fxp.cost_reciprocal(rows, p_cfg, iterations=0)
            + arith.cost_mul(rows + rows * dh, p_cfg) + arith.cost_mul(rows, p_cfg)
            + arith.cost_mul(rows + rows * dh, p_cfg)
            + arith.cost_mul(rows * dh, p_cfg))
