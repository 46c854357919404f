"""The declared costs of docs/MODELS.md's cost tables (rounds, and bytes sent by the three
parties together, B = 1; the architectures and the normalization / AERO variants), from the
protocols' cost functions - which the tests check equal to
the measured traffic - so the table can be regenerated after a protocol change:

    python benchmarks/model_costs.py
"""
from __future__ import annotations

import functools

import numpy as np

from mpc3.party import RingConfig
from protocols.layers import attention as A
from protocols.stacks import causal_lm as LM
from protocols.stacks import decoder as D
from protocols.layers import ln_proj as LP
from protocols import model as M
from protocols.layers.vocab import cost_argmax
from protocols.stacks.classifier import cost_classify
from protocols.stacks.encoder import cost_encoder
from protocols.stacks.schedule import GENERAL

RC = RingConfig()
SMALL = dict(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
             attn_norm="mean")
TABLE2 = dict(d_model=512, n_heads=8, d_head=64, n_features=266, d_ff=2048, attn_c=1 / 266,
              attn_norm="mean")
VARIANTS = ("softmax", "power-softmax", "sigma-relu")


def _mb(c) -> str:
    b = c if isinstance(c, (int, float, np.floating)) else c.bytes_total
    return f"{b / 1e6:.3g} MB" if b >= 1e5 else f"{b:.0f} B"


def att_perf(cfg: M.ModelConfig) -> bool:
    return cfg.attention == M.PERFORMER


def _cfg(base, **kw) -> M.ModelConfig:
    return M.ModelConfig(**{**base, **kw}).validate()


def classifier_rows() -> list[tuple]:
    small = _cfg(SMALL, norm_first=False, max_len=16, arch="encoder-classifier",
                 n_enc_layers=2, src_vocab=11, n_classes=5)
    big = _cfg(TABLE2, norm_first=False, max_len=64, arch="encoder-classifier",
               n_enc_layers=6, src_vocab=256, n_classes=2)
    c1, c2, c3 = cost_classify(RC, small, 1, 16), cost_argmax(RC, 1, 5), cost_classify(RC, big, 1, 64)
    return [("classify, d=16, h=2, r=8, 2 layers, S=16, 5 classes", c1.rounds, _mb(c1)),
            ("arg-max of 5 logits", c2.rounds, _mb(c2)),
            ("classify, Table 2 shape, 6 layers, S=64", c3.rounds, _mb(c3))]


def lm_rows() -> list[tuple]:
    rows = []
    for attention in ("relu-performer",) + VARIANTS:
        for base, layers, T, nf in ((SMALL, 2, 8, attention != "relu-performer"),
                                    (TABLE2, 6, 64, True)):
            cfg = _cfg(base, norm_first=nf, max_len=T + 200, arch="decoder-only",
                       n_dec_layers=layers, tgt_vocab=64,
                       attention=M.PERFORMER if attention == "relu-performer" else attention)
            pre = LM.cost_lm_prefill(RC, cfg, 1, T)
            # Performer: the mean over one decode block of its prefix state (the bytes vary
            # with the cache fill); softmax-style: the token after the prompt
            n = A.default_decode_block(cfg.n_features, cfg.d_head) if att_perf(cfg) else 1
            steps = [LM.cost_lm_step(RC, cfg, 1, T + t) for t in range(n)]
            rows.append((f"LM {attention}, {'d=16' if base is SMALL else 'Table 2'}, "
                         f"{layers} layers, {'pre' if nf else 'post'}-LN, T={T}: prefill / "
                         "next token", f"{pre.rounds} / {steps[0].rounds}",
                         f"{_mb(pre)} / {_mb(np.mean([s.bytes_total for s in steps]))}"))
    return rows


def translator_rows() -> list[tuple]:
    rows = []
    for attention in ("relu-performer",) + VARIANTS:
        att = M.PERFORMER if attention == "relu-performer" else attention
        for base, layers, S, nf in ((SMALL, 2, 8, True), (TABLE2, 6, 64, False)):
            cfg = _cfg(base, norm_first=nf, max_len=65, n_enc_layers=layers,
                       n_dec_layers=layers, src_vocab=256, tgt_vocab=256, attention=att)
            opened = cost_encoder(RC, cfg, 1, S) + D.cost_decode_start(RC, cfg, 1, S)
            ts = [S] if base is SMALL else range(64)          # Table 2: mean of t < 64
            steps = [D.cost_decoder_step(RC, cfg, 1, t, n_enc=S, wide=True) for t in ts]
            rows.append((f"translator {attention}, {'d=16' if base is SMALL else 'Table 2'}, "
                         f"{layers}+{layers} layers, {'pre' if nf else 'post'}-LN, source {S}: "
                         "decode_open / token", f"{opened.rounds} / {steps[0].rounds}",
                         f"{_mb(opened)} / {_mb(np.mean([s.bytes_total for s in steps]))}"))
    return rows


@functools.lru_cache(maxsize=1)
def _random_schedule() -> tuple[M.ModelConfig, dict]:
    """The Table 2 translator of ``mpc3 bench translate --model random`` (seed 0) and the
    decode schedule its calibration gives (protocols.stacks.schedule.session_schedule)."""
    from app.owner import calibrate_model
    from protocols.stacks.schedule import session_schedule
    cfg = _cfg(TABLE2, norm_first=False, max_len=65, n_enc_layers=6, n_dec_layers=6,
               src_vocab=256, tgt_vocab=256)
    w, user = M.random_weights(cfg, 0), M.random_user(cfg, 0)
    return cfg, session_schedule(cfg, calibrate_model(cfg, w, user).to_dict(), RC)


def schedule_summary() -> str:
    """Which of the random model's attention sublayers defer o W^O, and the sizes of its
    decoder LayerNorms' sqrt_inv tables (decode steps: 16 thresholds per octave)."""
    from mpc3.kernels import fxp
    cfg, sched = _random_schedule()
    every = {f"dec.{i}.{k}" for i in range(cfg.n_dec_layers) for k in ("self", "cross")}
    sizes = [16 * (hi - lo) + 1 for lo, hi in sched.ln_spans.values()]
    full = 16 * (fxp.FULL_SPAN[1] - fxp.FULL_SPAN[0]) + 1
    kept = ", ".join(sorted(every - sched.raw_wo)) or "none"
    return (f"random model's schedule: o W^O deferred in {len(sched.raw_wo)} of "
            f"{len(every)} attention sublayers (not: {kept}); {len(sizes)} LayerNorm tables "
            f"of {min(sizes)} - {max(sizes)} thresholds (whole range: {full})")


def fusion_rows() -> list[tuple]:
    """The translator's token at the Table 2 shape (6+6 layers, post-LN, relu-performer,
    source 64, mean of t < 64) for each session fusion choice (decode_open's ``fuse``): the
    general schedule, and the one the random model's calibration gives (``mpc3 bench
    translate --model random`` shares that model: protocols.stacks.schedule), with the bytes of
    that session's DecodeState.start (K'^T V, W^O folded into it, beta W)."""
    cfg, sched = _random_schedule()
    rows = []
    for fuse in ("none", "ffn", "cross,ffn", "default", "self,ffn", "all"):
        kinds = LP.fusion_choice(fuse, D.FUSIONS, D.DEFAULT_FUSE, "model_costs")
        row = [fuse if fuse != "default" else f"default ({','.join(kinds)})"]
        for schedule in (GENERAL, sched):
            steps = [D.cost_decoder_step(RC, cfg, 1, t, fuse=kinds, wide=True,
                                         schedule=schedule)
                     for t in range(64)]
            row += [steps[0].rounds, _mb(np.mean([c.bytes_total for c in steps]))]
        opened = D.cost_decode_start(RC, cfg, 1, 64, fuse=kinds, schedule=sched)
        row.append(_mb(opened))
        rows.append(tuple(row))
    return rows


#: docs/MODELS.md's normalization / AERO table: (attention, norm, FFN, AERO preset options)
NORM_ROWS = (("softmax", "layernorm", "gelu", None), ("softmax", "batchnorm", "gelu", None),
             ("softmax", "none", "gelu", None), ("softmax", "layernorm", "relu", None),
             ("softmax", "none", "none", {}), ("softmax", "none", "none", {"scale": True}),
             ("softmax", "none", "none", {"scale": True, "pruned": 1}),
             (M.PERFORMER, "layernorm", "relu", None), (M.PERFORMER, "batchnorm", "relu", None),
             (M.PERFORMER, "none", "none", None))


def norm_rows() -> list[tuple]:
    """Decoder-only, d=16, h=2, r=8, d_ff=32, 2 layers, pre-norm, B=1: prompt T=8 / the
    token after it (the Performer: its first step)."""
    rows = []
    for attention, norm, ffn, aero in NORM_ROWS:
        cfg = _cfg(SMALL, norm_first=True, max_len=12, arch="decoder-only", n_dec_layers=2,
                   tgt_vocab=7, attention=attention, norm=norm, ffn_act=ffn)
        if aero is not None:
            cfg = M.aero(cfg, **aero)
        pre, step = LM.cost_lm_prefill(RC, cfg, 1, 8), LM.cost_lm_step(RC, cfg, 1, 8)
        name = f"{attention}, {norm}, {ffn}" + (f", AERO {aero}" if aero is not None else "")
        rows.append((name, f"{pre.rounds} / {step.rounds}", f"{_mb(pre)} / {_mb(step)}"))
    return rows


def main() -> None:
    print("| workload | rounds | bytes |\n|---|---|---|")
    for name, rounds, nbytes in classifier_rows() + lm_rows() + translator_rows():
        print(f"| {name} | {rounds} | {nbytes} |")
    print("\n| attention, norm, FFN | rounds prefill / token | bytes prefill / token |\n"
          "|---|---|---|")
    for name, rounds, nbytes in norm_rows():
        print(f"| {name} | {rounds} | {nbytes} |")
    print("\n| translator token, Table 2 shape: session fuse | rounds | bytes | rounds, bytes "
          "with the random model's calibrated schedule | its decode_open's cross attention "
          "state |\n|---|---|---|---|---|")
    for name, rounds, nbytes, r_cal, b_cal, opened in fusion_rows():
        print(f"| {name} | {rounds} | {nbytes} | {r_cal}, {b_cal} | {opened} |")
    print(f"\n{schedule_summary()}")


if __name__ == "__main__":
    main()
