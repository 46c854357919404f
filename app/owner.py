"""The model owner's flow: put a transformer on a cluster as secret shares.

:func:`share_transformer` builds the protocols.secure_model layout (Omega folded into W^Q,
W^K; attn_c folded into the projections; projections at frac + PROJ_EXTRA bits), records in
the model's public metadata its config, its kind and the computations query users may run
(``permit``; default: the model's own inference only), uploads the shares and verifies that
the parties hold consistent copies. The query-user tensors (embeddings, output layer) of a
model file are never shared: the owner hands them to its users, who thereby learn them.
"""
from __future__ import annotations

from net.client import ModelOwner
from net.config import ClusterConfig
from protocols import model as M
from protocols.jobs import DEFAULT_PERMITTED, ENCODER_DECODER, PRODUCTION

#: Computations a query user may be permitted to run on an encoder-decoder model.
COMPUTATIONS = tuple(sorted({s.computation for s in PRODUCTION
                             if ENCODER_DECODER in s.model_kinds}))


def check_permit(permit) -> tuple[str, ...]:
    """The permitted computations, refusing unknown names with the known ones listed."""
    permit = tuple(DEFAULT_PERMITTED[ENCODER_DECODER] if permit is None else permit)
    unknown = sorted(set(permit) - set(COMPUTATIONS))
    if unknown:
        raise ValueError(f"cannot permit {unknown}: an encoder-decoder model offers "
                         f"{', '.join(COMPUTATIONS)}")
    return permit


def transformer_meta(mcfg: M.ModelConfig, permit=None, source: str = "",
                     fold_omega: bool = True) -> dict:
    """Public metadata stored with a shared transformer."""
    return {"model_config": mcfg.to_dict(), "kind": ENCODER_DECODER,
            "layout": "protocols.secure_model", "fold_omega": fold_omega,
            "permitted": list(check_permit(permit)), "source": source}


def share_transformer(cfg: ClusterConfig, model_id: str, mcfg: M.ModelConfig,
                      weights: M.Weights, permit=None, cert=None, key=None,
                      source: str = "", fold_omega: bool = True) -> str:
    """Share ``weights`` with the cluster as ``model_id``; returns the upload id."""
    from protocols.secure_model import plain_tensors
    meta = transformer_meta(mcfg, permit, source, fold_omega)
    layout = plain_tensors(mcfg, weights, fold_omega=fold_omega)
    with ModelOwner(cfg, cert, key) as owner:
        return owner.upload(model_id, {k: v for k, (v, _) in layout.items()},
                            public_meta=meta,
                            extra_frac={k: e for k, (_, e) in layout.items() if e})
