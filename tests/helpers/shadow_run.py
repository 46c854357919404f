"""The secure stacks on a shadow party (the calibration's backend, protocols.calibration.shadow),
returning what they compute, decoded: tests compare it with the float64 reference
(protocols.model.reference) to show that the calibration runs the model itself.

The shadow computes in the parties' fixed point (frac = 18) with exact nonlinearities, so it
meets the reference within fixed-point error (:data:`ATOL`, relative :data:`RTOL`), not the
float64 round-off the hand-written trace (now gone) met.
"""
import numpy as np

from mpc3.party import RingConfig
from mpc3.shadow import ShadowParty
from protocols.stacks import decoder as D
from protocols import model as M
from protocols.calibration import shadow as SH
from protocols.stacks.causal_lm import DEFAULT_LM_FUSE, lm_open, lm_step
from protocols.stacks.classifier import classify
from protocols.stacks.encoder import encoder
from protocols.stacks.sentence import embed_sentence

RTOL, ATOL = 2e-3, 2e-3


def _setup(cfg: M.ModelConfig, w: M.Weights, fold: bool = True, rec=None):
    p = ShadowParty(RingConfig(), rec) if rec is not None else ShadowParty()
    return p, SH.shadow_shares(cfg, w, fold, p.cfg.frac)


def classifier(cfg: M.ModelConfig, w: M.Weights, x: np.ndarray) -> np.ndarray:
    """Logits (B, n_classes) of :func:`protocols.stacks.classifier.classify`."""
    p, shares = _setup(cfg, w)
    return SH.decode(p, classify(p, cfg, shares, SH.shadow_input(p, x)))


def embedding(cfg: M.ModelConfig, w: M.Weights, x: np.ndarray) -> np.ndarray:
    """Sentence embeddings (B, d) of :func:`protocols.stacks.sentence.embed_sentence`."""
    p, shares = _setup(cfg, w)
    return SH.decode(p, embed_sentence(p, cfg, shares, SH.shadow_input(p, x)))


def lm(cfg: M.ModelConfig, w: M.Weights, x: np.ndarray, fuse=DEFAULT_LM_FUSE) -> np.ndarray:
    """Final hidden rows (B, T, d) of every token of ``x`` decoded as a step
    (:func:`protocols.stacks.causal_lm.lm_step`) from an empty session."""
    p, shares = _setup(cfg, w)
    st = lm_open(p, cfg, shares, x.shape[0], None, fuse)
    xs = SH.shadow_input(p, x)
    return np.stack([SH.decode(p, lm_step(p, cfg, shares, st, xs[:, t]))
                     for t in range(x.shape[1])], axis=1)


def translator(cfg: M.ModelConfig, w: M.Weights, x: np.ndarray, y: np.ndarray,
               fuse=None, fold: bool = True, block: int | None = None,
               rec: SH.ShadowRecorder | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(encoder output (B, S, d), every decode step's output (B, T, d)) of the
    encoder-decoder: :func:`protocols.stacks.encoder.encoder`, then each target row as a
    :func:`protocols.stacks.decoder.decoder_step` of a session with the fusions ``fuse``
    (default :data:`protocols.stacks.decoder.DEFAULT_FUSE`); ``rec``: records what the kernels
    see."""
    p, shares = _setup(cfg, w, fold, rec)
    enc = encoder(p, cfg, shares, SH.shadow_input(p, x))
    st = D.DecodeState.start(p, cfg, shares, enc, block, D.DEFAULT_FUSE if fuse is None
                             else fuse)
    ys = SH.shadow_input(p, y)
    out = [SH.decode(p, D.decoder_step(p, cfg, shares, st, ys[:, t])) for t in range(y.shape[1])]
    return SH.decode(p, enc), np.stack(out, axis=1)


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
