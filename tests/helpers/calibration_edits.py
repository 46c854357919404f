"""A small decoder-only LM and the edits of its stored calibration that the parties and
the query user's client must refuse, each with the words its refusal must hold
(tests/protocols/calibration/test_calibration_check.py without a cluster,
tests/protocols/calibration/test_calibration_trust.py over party processes)."""
from protocols import model as M
from protocols.calibration import calibrate as C
from protocols.calibration.check import sites_reached

BASE = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
            attn_norm="mean", ln_eps=1e-3)
ARCHS = {"encoder-decoder": dict(n_enc_layers=1, n_dec_layers=2, src_vocab=7, tgt_vocab=9),
         "encoder-classifier": dict(arch="encoder-classifier", n_enc_layers=2, src_vocab=7,
                                    n_classes=3),
         "decoder-only": dict(arch="decoder-only", n_dec_layers=2, tgt_vocab=9),
         "encoder": dict(arch="encoder", n_enc_layers=2, src_vocab=7)}

LM = M.ModelConfig(**BASE, **ARCHS["decoder-only"], max_len=16, norm_first=True).validate()
REACHED = sites_reached(LM)
N_SITES = sum(len(row) for row in REACHED.values())
N_SITES_3 = sum(len(row) for row in
                sites_reached(M.ModelConfig(**{**LM.to_dict(), "n_dec_layers": 3})).values())


def _cal(m):
    return m["calibration"]


def _drop(d, key):
    del d[key]


EDITS = {
    "missing": (lambda m: _drop(m, "calibration"), "it has no calibration"),
    "not an object": (lambda m: m.update(calibration=[1, 2]), "not a JSON object"),
    "old version": (lambda m: _cal(m).update(version=C.VERSION - 1),
                    f"version {C.VERSION - 1}, not the current {C.VERSION}"),
    "no margin": (lambda m: _drop(_cal(m), "margin"), "malformed (no 'margin')"),
    "margin below 1": (lambda m: _cal(m).update(margin=0.5), "safety margin 0.5 is not >= 1"),
    "margin NaN": (lambda m: _cal(m).update(margin=float("nan")), "safety margin nan"),
    "other frac": (lambda m: _cal(m).update(frac=16), "frac = 16; the model runs with 18"),
    "other ln_eps": (lambda m: _cal(m).update(ln_eps=1.0), "ln_eps = 1.0"),
    "unfolded": (lambda m: _cal(m).update(fold_omega=False), "fold_omega = False"),
    "other block": (lambda m: _cal(m).update(decode_block=1), "decode_block = 1"),
    "site removed": (lambda m: _drop(_cal(m)["layers"]["dec.1.ffn"], "w1"),
                     f"lacks 1 of the {N_SITES} sites the model reaches (dec.1.ffn.w1)"),
    "layer removed": (lambda m: _drop(_cal(m)["layers"], "dec.0.self"),
                      f"lacks {len(REACHED['dec.0.self'])} of the {N_SITES} sites the model "
                      "reaches (dec.0.self.proj, "),
    "more layers": (lambda m: m["model_config"].update(n_dec_layers=100000),
                    f"has {len(REACHED)} rows for a model of 100000 layers"),
    "one more layer": (lambda m: m["model_config"].update(n_dec_layers=3),
                       f"lacks {N_SITES_3 - N_SITES} of the {N_SITES_3} sites the model "
                       "reaches (dec.2.ln1.sumsq"),
    "over a limit": (lambda m: _cal(m)["layers"]["dec.1.ffn"].update(w1=1e9),
                     "out of range at dec.1.ffn: FFN product x W1"),
    "NaN value": (lambda m: _cal(m)["layers"]["dec.0.ln1"].update(sumsq=float("nan")),
                  "dec.0.ln1.sumsq is nan, not a finite magnitude"),
    "negative value": (lambda m: _cal(m)["layers"]["dec.0.ln1"].update(sumsq=-1.0),
                       "dec.0.ln1.sumsq is -1.0"),
    "span as a number": (lambda m: _cal(m)["layers"]["dec.0.ln1"].update(var_eps=1.0),
                         "dec.0.ln1.var_eps is 1.0, not a finite [min, max] span"),
    "unknown site": (lambda m: _cal(m)["layers"]["dec.0.ln1"].update(warp=1.0),
                     "unknown sites ['warp']"),
    "input range missing": (lambda m: _drop(_cal(m)["input_range"], "Y"),
                            "no input range for Y (has: X)"),
    "input range inf": (lambda m: _cal(m)["input_range"].update(X=float("inf")),
                        "input range for X is inf, not a finite bound > 0"),
    "input range NaN": (lambda m: _cal(m)["input_range"].update(Y=float("nan")),
                        "input range for Y is nan"),
    "input range 0": (lambda m: _cal(m)["input_range"].update(X=0.0), "for X is 0.0"),
    "bad config": (lambda m: m["model_config"].update(n_heads=3), "its model_config is invalid"),
}
