"""Performer ReLU random features (Privformer Sec. 5, Eq. 12-15) in float64: the public
attention scale, Omega folding into W^Q / W^K and the feature maps Q' = ReLU(Q_h Omega_h),
K' = ReLU(K_h Omega_h) per head (Omega itself is drawn by :func:`weights.make_omega`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .config import ModelConfig
from .weights import Weights


def relu(x):
    return np.maximum(x, 0.0)


def attn_norm(cfg: ModelConfig, n_keys) -> np.ndarray:
    """Public scale per query row: c (const) or c / n_keys (mean)."""
    n = np.asarray(n_keys, dtype=np.float64)
    if cfg.attn_norm == "const":
        return np.full(n.shape, float(cfg.attn_c))
    return float(cfg.attn_c) / n


def project(p: Mapping, x, which: str):
    """x @ W^which (+ its bias ``b<which>`` when the model has attention biases), which in
    q, k, v, o; unfolded weights."""
    y = x @ p[f"w{which}"]
    return y + p[f"b{which}"] if f"b{which}" in p else y


def fold_omega(weights: Weights | Mapping, cfg: ModelConfig | None = None) -> dict[str, np.ndarray]:
    """Fold Omega into W^Q / W^K.

    Returns for every attention prefix ``p`` (``enc.0.attn``, ``dec.0.self``,
    ...) the tensors ``p.wq_omega`` and ``p.wk_omega`` of shape
    ``(d_model, n_heads * r)`` with column block ``h`` equal to
    ``W^Q[:, h-slice] @ Omega_h`` so that ``Q'_h = ReLU(X @ W^{QOmega})[..., h*r:(h+1)*r]``.

    Folding removes one matmul (and its MPC communication / truncation) per
    attention input per layer, but multiplies the size of the folded weight by
    ``r / d_head`` (``d_model x h*r`` instead of ``d_model x d_model``).
    """
    t = weights.tensors if isinstance(weights, Weights) else weights
    out = {}
    for k in sorted(t):
        if not k.endswith(".omega"):
            continue
        p = k[: -len(".omega")]
        for leaf in ("wq", "wk", "bq", "bk"):
            if f"{p}.{leaf}" in t:
                out[f"{p}.{leaf}_omega"] = fold_omega_one(t, f"{p}.{leaf}_omega")
    return out


def fold_omega_one(weights: Weights | Mapping, name: str) -> np.ndarray:
    """One tensor of :func:`fold_omega` (``p.wq_omega``, ``p.wk_omega``, ``p.bq_omega`` or
    ``p.bk_omega``), reading only the two tensors it folds."""
    p, leaf = name.rsplit(".", 1)
    om = np.asarray(weights[f"{p}.omega"], dtype=np.float64)
    W = np.asarray(weights[f"{p}.{leaf[:2]}"], dtype=np.float64)
    h, dh, _ = om.shape
    return np.concatenate([W[..., j * dh:(j + 1) * dh] @ om[j] for j in range(h)], axis=-1)


def attn_params(w: Weights, prefix: str, folded: Mapping | None = None) -> dict[str, np.ndarray]:
    p = w.sub(prefix)
    if folded is not None:
        for n in ("wq_omega", "wk_omega", "bq_omega", "bk_omega"):
            if f"{prefix}.{n}" in folded:
                p[n] = folded[f"{prefix}.{n}"]
    return p


def split_heads(x, h):
    # (..., S, h*k) -> (..., h, S, k)
    *lead, S, D = x.shape
    return np.moveaxis(x.reshape(*lead, S, h, D // h), -2, -3)


def merge_heads(x):
    # (..., h, S, k) -> (..., S, h*k)
    x = np.moveaxis(x, -3, -2)
    *lead, S, h, k = x.shape
    return x.reshape(*lead, S, h * k)


def ref_features(cfg: ModelConfig, p: Mapping, x, which: str) -> np.ndarray:
    """ReLU random features per head: (..., h, S, r) for which in {'q','k'}."""
    h = cfg.n_heads
    if f"w{which}_omega" in p:
        y = x @ p[f"w{which}_omega"]
        y = y + p[f"b{which}_omega"] if f"b{which}_omega" in p else y
        return split_heads(relu(y), h)
    proj = split_heads(project(p, x, which), h)  # (..., h, S, dh)
    return relu(np.einsum("...hsd,hdr->...hsr", proj, p["omega"]))
