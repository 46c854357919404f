"""The model owner's flow: put a transformer on a cluster as secret shares.

:func:`share_transformer` first **calibrates** the model (:mod:`protocols.calibration.calibrate`:
the secure protocols themselves on sample inputs, on a shadow party; a model whose values leave a
kernel's range is refused with the layer, the value and the limit), then builds the
protocols.layers.secure_model layout (Omega folded into W^Q, W^K; attn_c folded into the
projections; projections at frac + PROJ_EXTRA bits), records in the model's public metadata
its config, its kind, the computations query users may run (``permit``; default: the model's
own inference only) and the calibration (with the input range clients check), uploads the
shares and verifies that the parties hold consistent copies. The query-user tensors (embeddings,
output layer) of a model file are not shared by default: the owner hands them to its users, who
thereby learn them - unless the owner keeps them secret (``secret_embeddings``, decoder-only
LMs and BERT-style encoders): then they are shared with the rest and users send one-hot
tokens and receive tokens only (an LM), the class or logits (a classifier), the embedding
(a headless encoder), as the owner permits.
"""
from __future__ import annotations

from mpc3.party import RingConfig
from net.client.owner import ModelOwner
from net.config import ClusterConfig
from protocols.calibration import calibrate as C
from protocols import model as M
from protocols.jobs import (DEFAULT_PERMITTED, ENCODER_DECODER, PRODUCTION, SECRET_PERMITTED,
                           TRANSFORMER_LAYOUT)


def computations(arch: str = ENCODER_DECODER) -> tuple[str, ...]:
    """Computations a query user may be permitted to run on a model of ``arch``."""
    return tuple(sorted({s.computation for s in PRODUCTION if arch in s.model_kinds}))


def check_permit(permit, arch: str = ENCODER_DECODER, secret: bool = False) -> tuple[str, ...]:
    """The permitted computations (default: the model's own inference; with ``secret``
    embeddings its token-only form), refusing names the architecture does not offer with the
    ones it does. Computations are spelt with hyphens; the job kind's underscore spelling
    (``classify_argmax``) names the same one."""
    if secret:
        from protocols.layers.secure_model import check_secret_arch
        check_secret_arch(arch)
    default = (SECRET_PERMITTED if secret else DEFAULT_PERMITTED)[arch]
    permit = tuple(default if permit is None else (p.replace("_", "-") for p in permit))
    offered = computations(arch)
    unknown = sorted(set(permit) - set(offered))
    if unknown:
        article = "an" if arch[0] in "aeiou" else "a"
        raise ValueError(f"cannot permit {unknown}: {article} {arch} model offers "
                         f"{', '.join(offered)}")
    return permit


def calibration_samples(mcfg: M.ModelConfig, weights: M.Weights, user=None,
                        path=None) -> C.Samples:
    """The owner's samples (``path``: .npy/.npz of embedded inputs), else real inputs for a
    model of the digits-to-words task (app.textdata), else random token sequences
    embedded with the model's own tables; a bare model needs ``path``."""
    from app import textdata as TD
    import numpy as np
    if path is not None:
        return C.load_samples(path)
    if not user or not ({"embed.src", "embed.tgt"} & set(user)):
        raise ValueError("the model file has no embedding tables: pass sample inputs "
                         "(--samples FILE.npz with X (B, S, d) and, for a decoder, Y) so that "
                         "share-model can calibrate it")
    if mcfg.arch == ENCODER_DECODER and \
            (mcfg.src_vocab, mcfg.tgt_vocab) == (len(TD.VOCAB.src), len(TD.VOCAB.tgt)):
        return TD.calibration_samples(mcfg, weights, user)
    return C.default_samples(mcfg, user, np.random.default_rng(0))


def calibrate_model(mcfg: M.ModelConfig, weights: M.Weights, user=None,
                    samples: C.Samples | None = None, ring: RingConfig = RingConfig(),
                    margin: float = C.DEFAULT_MARGIN, fold_omega: bool = True,
                    secret: bool = False) -> C.Calibration:
    """The calibration ``share-model`` stores with a model: on ``samples`` (default:
    :func:`calibration_samples`; ``secret``: the LM head too); raises
    :class:`protocols.calibration.calibrate.RangeError` if the model leaves a kernel's range."""
    if samples is None:
        samples = calibration_samples(mcfg, weights, user)
    return C.calibrate(mcfg, weights, samples, ring, margin, user=user, fold_omega=fold_omega,
                       secret=secret)


def transformer_meta(mcfg: M.ModelConfig, calibration: C.Calibration, permit=None,
                     source: str = "", fold_omega: bool = True,
                     check_inputs: bool = False, secret: bool = False) -> dict:
    """Public metadata stored with a shared transformer (``check_inputs``: the parties
    check jobs' inputs against the calibrated range on shares,
    :mod:`protocols.calibration.input_check`; ``secret``: ``embeddings`` "secret", the owner
    shares the embedding table and LM head instead of handing them out)."""
    from protocols.calibration.input_check import META_KEY
    meta = {"model_config": mcfg.to_dict(), "kind": mcfg.arch,
            "layout": TRANSFORMER_LAYOUT, "fold_omega": fold_omega,
            "permitted": list(check_permit(permit, mcfg.arch, secret)), "source": source,
            "calibration": calibration.to_dict(), META_KEY: bool(check_inputs)}
    if secret:
        meta["embeddings"] = "secret"
    return meta


def share_transformer(cfg: ClusterConfig, model_id: str, mcfg: M.ModelConfig,
                      weights: M.Weights, permit=None, cert=None, key=None,
                      source: str = "", fold_omega: bool = True, user=None,
                      samples: C.Samples | None = None,
                      margin: float = C.DEFAULT_MARGIN, check_inputs: bool = False,
                      to_diagnostic_parties: bool = False,
                      secret_embeddings: bool = False) -> str:
    """Calibrate and share ``weights`` with the cluster as ``model_id``; returns the upload
    id. ``user``: the model's query-user tensors (never shared; they give the exact input
    range and default samples); ``samples``: calibration inputs (default:
    :func:`calibration_samples`). Raises :class:`protocols.calibration.calibrate.RangeError` before
    anything is uploaded if the model leaves a kernel's range, and ValueError if a party runs
    the diagnostic job kinds (benchmark/test processes, where any user can read every
    weight matrix) unless ``to_diagnostic_parties`` (test and benchmark weights).
    ``secret_embeddings``: ``user``'s embedding table and LM head are shared too and the
    model's users send one-hot tokens (:mod:`protocols.stacks.secret_lm`,
    :mod:`protocols.stacks.secret_encoder`)."""
    from protocols.layers.secure_model import LazyTensors, check_secret, layout, secret_layout
    check_permit(permit, mcfg.arch, secret_embeddings)
    recipes = layout(mcfg, weights, fold_omega=fold_omega)
    if secret_embeddings:
        check_secret(mcfg)
        need = "out.w" if mcfg.arch == M.DECODER_ONLY else "embed.src"
        if not user or need not in user:
            raise ValueError("--secret-embeddings shares the model file's embedding tables "
                             "(and an LM's head): this file has none")
        recipes.update(secret_layout(mcfg, user))
    cal = calibrate_model(mcfg, weights, user, samples, RingConfig(frac=cfg.frac), margin,
                          fold_omega, secret_embeddings)
    meta = transformer_meta(mcfg, cal, permit, source, fold_omega, check_inputs,
                            secret_embeddings)
    tensors = LazyTensors(recipes)
    with ModelOwner(cfg, cert, key) as owner:       # one tensor at a time (net.client.upload)
        diagnostic = [n for n, st in enumerate(owner.status()) if st.diagnostic]
        if diagnostic and not to_diagnostic_parties:
            raise ValueError(
                f"part{'ies' if len(diagnostic) > 1 else 'y'} "
                f"{', '.join(map(str, diagnostic))} run the diagnostic (benchmark/test) job "
                "kinds, which let any user read every weight matrix of a model shared with "
                "them: share real models only with production parties (mpc3 party, cluster "
                "up); for test weights pass --to-diagnostic-parties")
        return owner.upload(model_id, tensors, public_meta=meta,
                            extra_frac=tensors.extra_frac())
