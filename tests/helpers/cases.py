"""Cases and tolerances that several test modules use, lifted out of the test module
each was written in (named above its part) so that no test module imports another."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import make_cfg
from mpc3.shares import AShare
from protocols import model as M
from protocols.calibration import calibrate as C
from protocols.layers import secure_model as SM


# ------------------------ the encoder-decoder (tests/protocols/stacks/test_protocols_stack.py) ----
TOL = 2e-3


def per_party(sh, *xs):
    return list(zip(*[(sh[i],) + tuple(x[i] for x in xs) for i in range(3)]))


# ---------------------- a calibrated decode schedule (tests/protocols/stacks/test_schedule.py) ----
def calibrated_case(rng, norm_first: bool, norm: str, c: float, steps: int):
    """(cfg, weights, shares, x (2, 7, 24), y (2, steps, 24), calibration dict): a model
    calibrated on these very inputs, as share-model would, with decode blocks of 2."""
    cfg = make_cfg(norm_first=norm_first, attn_norm=norm, attn_c=c)
    w = M.random_weights(cfg, 13)
    x, y = rng.uniform(-1, 1, (2, 7, 24)), rng.uniform(-1, 1, (2, steps, 24))
    pad = np.pad(y, ((0, 0), (0, cfg.max_len - steps), (0, 0)))
    cal = C.calibrate(cfg, w, C.Samples([x], [pad]), decode_block=2).to_dict()
    return cfg, w, SM.share_model(cfg, w), x, y, cal


# -------------------------- decoder-only LMs (tests/protocols/stacks/test_causal_lm.py) ----
def top2_gap(cfg, w, user, prompt, tokens):
    """Smallest margin between the best and second-best logit along the greedy path."""
    gaps = []
    for b, row in enumerate(tokens):
        ids = list(prompt[b])
        for tok in row:
            h = M.ref_lm(cfg, w, M.embed_tokens(cfg, user, np.array([ids])))[0, -1]
            top = np.sort(M.output_logits(user, h))
            gaps.append(top[-1] - top[-2])
            ids.append(tok)
    return min(gaps)


# ------------------------------- BatchNorm statistics (tests/protocols/stacks/test_norms.py) ----
def fit_batchnorm(cfg, w, x, y=None):
    """Set every BatchNorm's running mean / var to the statistics of its input on x (and the
    decoder input y), layer after layer - what training's running averages converge to; with
    random weights and unrelated statistics an un-normalised Performer stack (cubic in its
    input) overflows."""
    from protocols.model import reference as R
    plain = R.ref_norm

    def fit(cfg_, w_, prefix, t):
        flat = t.reshape(-1, t.shape[-1])
        w_[f"{prefix}.mean"], w_[f"{prefix}.var"] = flat.mean(0), flat.var(0)
        return plain(cfg_, w_, prefix, t)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "ref_norm", fit)
        if cfg.arch == M.ENCODER_DECODER:
            M.ref_decoder(cfg, w, y, M.ref_encoder(cfg, w, x))
        elif cfg.arch == M.DECODER_ONLY:
            M.ref_lm(cfg, w, x)
        else:
            M.ref_encoder(cfg, w, x)
    return w


# ------------------------ a session's LM at one party (tests/net/party/test_sessions.py) ----
def _lm():
    cfg = M.ModelConfig(d_model=8, n_heads=2, d_head=4, n_features=2, d_ff=8, attn_c=0.5,
                        attn_norm="mean", norm_first=True, max_len=8, arch="decoder-only",
                        n_dec_layers=1, tgt_vocab=5).validate()
    return cfg, M.random_weights(cfg, 0)


def _x(T: int = 3) -> dict:
    z = np.zeros((1, T, 8), np.uint64)
    return {"X": AShare(z, z.copy())}


# ------------------------ a read-only install (tests/net/party/test_kernel_cache.py) ----
PACKAGES = ("mpc3", "protocols", "net", "app")


def _skip_reason():
    if os.geteuid() != 0:
        return "a read-only bind mount needs root"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare / mount not installed"
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return None if r.returncode == 0 else "unshare -m not permitted here"
