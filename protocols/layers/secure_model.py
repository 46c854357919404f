"""Secret-shared model: (ModelConfig, Weights) -> per-party dicts of AShares, and entry points.

Share layout (every tensor a replicated sharing over Z_2^64; names below an attention prefix
``p`` such as ``enc.0.attn`` / ``dec.1.self`` / ``dec.1.cross``):

* ``p.wq_proj``, ``p.wk_proj``: ``s * W^Q``, ``s * W^K`` (d, d) - or, folded (default),
  ``s * W^Q Omega``, ``s * W^K Omega`` (d, h*r) from :func:`protocols.model.fold_omega` - with
  ``s = |attn_c|^(1/3)``; encoded with ``frac + PROJ_EXTRA`` bits;
* ``p.wv_c``: ``attn_c / s^2 * W^V`` (d, d), ``frac + PROJ_EXTRA`` bits.
* softmax-style attentions instead: ``p.wq_proj`` = ``W^Q / sqrt(d_head)``, ``p.wk_proj`` =
  ``W^K``, ``p.wv_c`` = ``W^V`` (and ``p.bq`` = ``b^Q / sqrt(d_head)``): q k^T is then the
  scores, with no public constant in their product (protocols.layers.softmax, ``prescaled``).

  The public constant c of c * Q'(K'^T V) is folded into the weights by the model owner, split
  evenly over Q, K and V (ReLU is positively homogeneous: ReLU(s x) = s ReLU(x) for s > 0):
  applying it costs nothing online, and Q', K', V, K'^T V and the output all stay at moderate
  magnitudes - fixed point has an absolute resolution of 2^-frac, so folding all of a small c
  into V alone would leave c*V with few significant bits, and not folding it would let the
  unnormalised sums approach the ring's 2^26 limit;
* ``p.omega`` (h, dh, r) at ``frac`` bits (unfolded only); ``p.wo`` (d, d) at ``frac`` bits;
* attention biases (``cfg.attn_bias``), all at ``frac`` bits and added locally after the
  product's truncation: ``p.bq``, ``p.bk`` = ``s * b^Q``, ``s * b^K`` (d) - folded,
  ``s * b^Q Omega`` per head (h*r) - ``p.bv`` = ``attn_c / s^2 * b^V``, ``p.bo`` = ``b^O``:
  the same factors as their weights, since (X W + b) * f = X (f W) + f b;
* LayerNorm ``gamma``, ``beta`` and FFN ``w1, b1, w2, b2``: as in the Weights, ``frac`` bits;
* BatchNorm (``cfg.norm`` batchnorm): the running statistics folded by the owner,
  ``scale = gamma / sqrt(var + eps)``, ``shift = beta - mean * scale``
  (:func:`protocols.model.batchnorm_affine`), ``frac`` bits; ``norm`` none: nothing;
* a linear FFN (``cfg.ffn_act`` none, AERO) is one affine map, fused by the owner:
  ``w1`` = W1 W2 (d, d) and ``b1`` = b1 W2 + b2, no ``w2``, ``b2`` - exact in float64, and
  one product on shares instead of two (:func:`protocols.layers.ffn.ffn`: a round and the d_ff-wide
  hidden product saved);
* seed 002's BatchNorm in the MLP (``cfg.ffn_bn``): folded into ``w1``, ``b1`` by
  :func:`protocols.model.fold_ffn_bn` (no ``bn_*`` shares, no cost online);
* AERO's FFN scales (``cfg.ffn_scale``): folded into the attention and FFN weights by
  :func:`protocols.model.fold_ffn_scales`, no ``alpha``, ``beta`` shares; ``dec.out_scale``
  (1,) = the product of the betas, by which the LM multiplies its last hidden row.

The projection weights carry PROJ_EXTRA more fractional bits (and their products are truncated
by ``frac + PROJ_EXTRA``): weights like ``attn_c * W^V`` (attn_c = 1/r) keep full relative
precision; the products must stay below 2^(62 - 2*frac - PROJ_EXTRA) = 2^18 in real units.

This module is the layout only (encoding and dealing by the model owner, :func:`sub` and
:data:`PROJ_EXTRA` for the protocols that read it); it imports no protocol, so mha, encoder and
decoder import it without a cycle. The stacks are :func:`protocols.stacks.encoder.encoder`,
:meth:`protocols.stacks.decoder.DecodeState.start` and
:func:`protocols.stacks.decoder.decoder_step`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import math

import numpy as np

from mpc3 import ring
from mpc3.shares import AShare
from mpc3.sharing import deal
from protocols import model as M

PROJ_EXTRA = 8
#: AERO's FFN scales (``cfg.ffn_scale``), folded: the product of every layer's beta, applied to
#: the last hidden row (:func:`protocols.model.fold_ffn_scales`)
OUT_SCALE = "dec.out_scale"


def fold_scales(cfg: M.ModelConfig) -> tuple[float, float, float]:
    """Factors folded into W^Q, W^K and W^V (and their biases): Performer (s, s, c / s^2),
    whose product is attn_c; the softmax-style attentions (1/sqrt(d_head), 1, 1), so that
    q k^T is the scores themselves (exact to the weights' encoding; the protocols take q as
    ``prescaled``, protocols.layers.softmax)."""
    if cfg.attention != M.PERFORMER:
        return 1.0 / float(np.sqrt(cfg.d_head)), 1.0, 1.0
    c = float(cfg.attn_c)
    s = abs(c) ** (1.0 / 3.0)
    return s, s, (c / (s * s) if s else 0.0)


def plain_tensors(cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True,
                  secret_user: Mapping[str, np.ndarray] | None = None
                  ) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (float tensor, extra fractional bits) of everything that gets shared;
    ``secret_user``: the user tables an owner keeps secret, shared too (:func:`secret_layout`)."""
    recipes = layout(cfg, weights, fold_omega)
    if secret_user is not None:
        recipes.update(secret_layout(cfg, secret_user))
    return {k: (make(), e) for k, (make, e) in recipes.items()}


class LazyTensors(Mapping):
    """name -> float tensor of a :func:`layout`, each computed when read and not kept (the
    model owner's upload reads them one at a time, :mod:`net.client.upload`)."""

    def __init__(self, recipes: dict[str, tuple[Callable[[], np.ndarray], int]]) -> None:
        self.recipes = recipes

    def __getitem__(self, name: str) -> np.ndarray:
        return self.recipes[name][0]()

    def __iter__(self):
        return iter(self.recipes)

    def __len__(self) -> int:
        return len(self.recipes)

    def extra_frac(self) -> dict[str, int]:
        return {k: e for k, (_, e) in self.recipes.items() if e}


def layout(cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True
           ) -> dict[str, tuple[Callable[[], np.ndarray], int]]:
    """name -> (a function computing the float tensor, extra fractional bits): what
    :func:`plain_tensors` evaluates, without holding more than the tensor asked for beyond
    ``weights`` (weights read from their file, protocols.model.OnDemandTensors, are read when
    asked for; the BatchNorm and AERO folds hold their models in memory)."""
    weights.validate(cfg)
    out_scale = None
    if cfg.ffn_bn:                       # seed 002's BatchNorm in the MLP, folded into W1, b1
        cfg, weights = M.fold_ffn_bn(cfg, weights)
    if cfg.ffn_scale:                    # AERO's FFN scales folded into the weights
        cfg, weights, out_scale = M.fold_ffn_scales(cfg, weights)
    fold_omega = fold_omega and cfg.attention == M.PERFORMER
    attn = set(M.attn_prefixes(cfg))
    q_scale, k_scale, v_scale = fold_scales(cfg)
    qk_scale = {"q": q_scale, "k": k_scale}
    w = weights
    out: dict[str, tuple[Callable[[], np.ndarray], int]] = {}

    def scaled(f: float, name: str):        # W^Q Omega etc. folded when read
        return lambda: f * (M.fold_omega_one(w, name) if name.endswith("_omega") else w[name])
    for name in weights.keys():
        prefix, leaf = name.rsplit(".", 1)
        if cfg.norm == "batchnorm" and leaf in ("gamma", "beta", "mean", "var"):
            if leaf == "gamma":
                a, b = M.batchnorm_affine(*(w[f"{prefix}.{n}"] for n in
                                          ("gamma", "beta", "mean", "var")), cfg.ln_eps)
                out[f"{prefix}.scale"] = ((lambda a=a: a), 0)
                out[f"{prefix}.shift"] = ((lambda b=b: b), 0)
        elif cfg.ffn_act == "none" and prefix.endswith(".ffn"):
            if leaf == "w1":
                p = prefix
                out[name] = ((lambda p=p: w[f"{p}.w1"] @ w[f"{p}.w2"]), 0)
                out[f"{prefix}.b1"] = ((lambda p=p: w[f"{p}.b1"] @ w[f"{p}.w2"]
                                        + w[f"{p}.b2"]), 0)
        elif prefix not in attn:
            out[name] = ((lambda n=name: w[n]), 0)
        elif leaf in ("wq", "wk"):
            out[f"{prefix}.{leaf}_proj"] = (scaled(qk_scale[leaf[1]], f"{name}_omega"
                                                   if fold_omega else name), PROJ_EXTRA)
        elif leaf == "wv":
            out[f"{prefix}.wv_c"] = (scaled(v_scale, name), PROJ_EXTRA)
        elif leaf in ("bq", "bk"):
            out[name] = (scaled(qk_scale[leaf[1]], f"{name}_omega" if fold_omega else name), 0)
        elif leaf == "bv":
            out[name] = (scaled(v_scale, name), 0)
        elif leaf == "omega" and fold_omega:
            continue
        else:
            out[name] = ((lambda n=name: w[n]), 0)
    if out_scale is not None:
        out[OUT_SCALE] = ((lambda: np.array([out_scale])), 0)
    return out


#: the query user's tables an owner shares instead of handing them out: an LM's token table,
#: positions and head; an encoder's token table with its token types' rows stacked under it
#: (``embed.tokens``: one product looks up both), positions and embedding LayerNorm
SECRET_NAMES = ("embed.tgt", "embed.pos", "out.w", "out.b",
                "embed.tokens", "embed.ln.gamma", "embed.ln.beta")
#: the architectures whose owner may keep the embedding tables secret
SECRET_ARCHS = (M.DECODER_ONLY, M.ENCODER_CLASSIFIER, M.ENCODER)


def check_secret_arch(arch: str) -> None:
    """ValueError unless models of ``arch`` have a secret-embeddings mode."""
    if arch not in SECRET_ARCHS:
        raise ValueError(f"secret embeddings run decoder-only LMs and encoders, not arch "
                         f"{arch!r}")


def check_secret(cfg: M.ModelConfig) -> None:
    """ValueError unless ``cfg`` can keep its vocabulary ends secret: a decoder-only LM with
    sinusoidal, learned or rotary positions and no embedding LayerNorm or token types; an
    encoder (classifier or headless) with sinusoidal or learned positions, token types and
    an embedding LayerNorm allowed (BERT)."""
    check_secret_arch(cfg.arch)
    if cfg.arch == M.DECODER_ONLY and (cfg.embedding not in ("sinusoidal", "learned",
                                                             "rotary") or cfg.type_vocab):
        raise ValueError(f"secret embeddings: embedding {cfg.embedding!r} (with its "
                         f"LayerNorm / token types) has no secure lookup in an LM yet")
    if cfg.arch != M.DECODER_ONLY and cfg.embedding not in ("sinusoidal", "learned",
                                                            "learned-ln"):
        raise ValueError(f"secret embeddings: an encoder's embedding {cfg.embedding!r} has "
                         f"no secure lookup")


def secret_layout(cfg: M.ModelConfig, user: Mapping[str, np.ndarray]
                  ) -> dict[str, tuple[Callable[[], np.ndarray], int]]:
    """name -> (recipe, extra fractional bits) of the user tables the owner shares: the
    token table (times sqrt(d) for sinusoidal positions), the learned position table and
    the LM head; of an encoder ``embed.tokens`` - ``embed.src`` (times sqrt(d) for
    sinusoidal positions) with ``embed.type``'s rows stacked under it, (V + Tv, d) -,
    ``embed.pos`` and the embedding LayerNorm (:func:`secret_shapes`)."""
    check_secret(cfg)
    scale = math.sqrt(cfg.d_model) if cfg.embedding == "sinusoidal" else 1.0

    def plain(name: str, f: float = 1.0):
        return (lambda: np.asarray(user[name], np.float64) * f, 0)
    if cfg.arch != M.DECODER_ONLY:
        out = {n: plain(n) for n in secret_shapes(cfg) if n != "embed.tokens"}
        out["embed.tokens"] = (lambda: np.concatenate(
            [np.asarray(user["embed.src"], np.float64) * scale]
            + ([np.asarray(user["embed.type"], np.float64)] if cfg.type_vocab else [])), 0)
        return out
    out = {"embed.tgt": plain("embed.tgt", scale), "out.w": plain("out.w"),
           "out.b": plain("out.b")}
    if cfg.embedding == "learned":
        out["embed.pos"] = plain("embed.pos")
    return out


def secret_shapes(cfg: M.ModelConfig) -> dict[str, tuple]:
    """name -> shape of the tensors :func:`secret_layout` shares."""
    user = M.expected_user_shapes(cfg)
    out = {k: v for k, v in user.items() if k in SECRET_NAMES}
    if cfg.arch != M.DECODER_ONLY:
        out["embed.tokens"] = (cfg.src_vocab + cfg.type_vocab, cfg.d_model)
    return out


def share_model(cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True,
                frac: int = ring.DEFAULT_FRAC, rng=None, prefixes: tuple[str, ...] | None = None,
                shared_replicas: bool = False,
                secret_user: Mapping[str, np.ndarray] | None = None) -> list[dict[str, AShare]]:
    """Encode and deal the MPC tensors (those starting with one of ``prefixes``, default
    all); returns the three parties' share dicts. ``shared_replicas``: see
    :func:`mpc3.sharing.deal` (three parties in one process); ``secret_user``: as
    :func:`plain_tensors`'."""
    return deal_tensors(plain_tensors(cfg, weights, fold_omega, secret_user), frac, rng,
                        prefixes, shared_replicas)


def deal_tensors(tensors: dict[str, tuple[np.ndarray, int]], frac: int = ring.DEFAULT_FRAC,
                 rng=None, prefixes: tuple[str, ...] | None = None,
                 shared_replicas: bool = False) -> list[dict[str, AShare]]:
    """:func:`share_model` from :func:`plain_tensors`' dict, which it empties: each float
    tensor is dropped as its shares are made (a caller holding no other reference - e.g. a
    benchmark that deleted the weights - never holds the floats and all shares at once)."""
    parts: list[dict[str, AShare]] = [{}, {}, {}]
    for name in list(tensors):          # popped as dealt: float copies go as shares arrive
        t, extra = tensors.pop(name)
        if prefixes is not None and not name.startswith(tuple(prefixes)):
            continue
        for i, s in enumerate(deal(ring.encode(t, frac + extra), rng, shared_replicas)):
            parts[i][name] = s
        del t
    return parts


def share_input(x, frac: int = ring.DEFAULT_FRAC, rng=None) -> list[AShare]:
    """Query-user side: encode and deal an activation tensor."""
    return deal(ring.encode(np.asarray(x, dtype=np.float64), frac), rng)


def sub(shares: Mapping[str, AShare], prefix: str) -> Mapping[str, AShare]:
    """The shares below ``prefix`` (``"dec.0.self"``), named without it; of a mapping that
    makes its values when read (the shadow party's, protocols.calibration.shadow.ShadowTensors), a
    view that reads each one when used."""
    p = prefix + "."
    if not isinstance(shares, dict):
        return _Below(shares, p)
    return {k[len(p):]: v for k, v in shares.items() if k.startswith(p)}


class _Below(Mapping):
    """``shares[prefix + name]`` as ``view[name]``, read when asked for (:func:`sub`)."""

    def __init__(self, shares: Mapping[str, AShare], prefix: str) -> None:
        self.shares, self.prefix = shares, prefix

    def __getitem__(self, name: str) -> AShare:
        return self.shares[self.prefix + name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.prefix + name in self.shares

    def __iter__(self):
        n = len(self.prefix)
        return (k[n:] for k in self.shares if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def check_shares(cfg: M.ModelConfig, shares: dict[str, AShare], fold_omega: bool | None = None,
                 secret: bool = False):
    """Clear error if a share dict does not match ``cfg`` (missing/extra names, shapes);
    ``secret``: with the user tables an owner keeps secret (:func:`secret_layout`)."""
    if fold_omega is None:
        fold_omega = not any(k.endswith(".omega") for k in shares)
    fold_omega = fold_omega and cfg.attention == M.PERFORMER
    d, h, r = cfg.d_model, cfg.n_heads, cfg.n_features
    expect = {}
    for name, shape in M.expected_shapes(cfg).items():
        prefix, leaf = name.rsplit(".", 1)
        if leaf.startswith("bn_") or leaf in ("alpha", "beta") and prefix.endswith(".ffn"):
            continue                     # folded by the owner (ffn_bn, ffn_scale)
        if cfg.norm == "batchnorm" and leaf in ("gamma", "beta", "mean", "var"):
            expect.update({f"{prefix}.{n}": shape for n in ("scale", "shift")})
        elif cfg.ffn_act == "none" and prefix.endswith(".ffn"):
            if leaf in ("w1", "b1"):
                expect[name] = (d, d) if leaf == "w1" else (d,)
        elif leaf in ("wq", "wk"):
            expect[f"{prefix}.{leaf}_proj"] = (d, h * r) if fold_omega else shape
        elif leaf == "wv":
            expect[f"{prefix}.wv_c"] = shape
        elif leaf in ("bq", "bk"):
            expect[name] = (h * r,) if fold_omega else shape
        elif leaf == "omega" and fold_omega:
            continue
        else:
            expect[name] = shape
    if cfg.ffn_scale:
        expect[OUT_SCALE] = (1,)
    if secret:
        check_secret(cfg)
        expect.update(secret_shapes(cfg))
    missing = sorted(set(expect) - set(shares))
    if missing:
        raise ValueError(f"model shares lack {missing[:5]}{'...' if len(missing) > 5 else ''}")
    extra = sorted(set(shares) - set(expect))
    if extra:
        raise ValueError(f"unexpected model shares {extra[:5]}")
    for k, shape in expect.items():
        if shares[k].shape != tuple(shape):
            raise ValueError(f"share {k!r} has shape {shares[k].shape}, expected {tuple(shape)}")
