"""Secret embedding tables of a BERT-style encoder against user-held ones, in one run
(issue 36): one input of ``--seq`` tokens, three parties in this process (threads), random
weights of a real checkpoint's shape.

* ``--shape minilm`` (default): all-MiniLM-L6-v2's (d 384, 12 heads, d_ff 1536, 6 layers,
  vocabulary 30522, 2 token types, post-LN, embedding LayerNorm, mean pooling, L2
  normalization): a sentence embedding (:func:`protocols.stacks.sentence.embed_sentence`);
* ``--shape bert-base``: BERT-base's (d 768, 12 heads, d_ff 3072, 12 layers, the same
  vocabulary, BERT's pooler) as a 2-class classifier, the class alone out (arg-max on
  shares in both modes).

Modes: ``user-held`` - the user embeds the tokens (lookup, positions, types, embedding
LayerNorm in float64) and shares the rows; ``secret`` - one-hot rows in
(:mod:`protocols.stacks.secret_encoder`: the lookup, positions and types in one product,
the embedding LayerNorm on shares). Per mode: rounds and bytes (the parties' counters,
checked equal to the declared costs), wall time (this machine, the three parties sharing
its cores), the output's max abs error against the float64 reference; ``ratio``: secret /
user-held bytes and rounds.

    python benchmarks/encoder_secret.py --json benchmarks/results/encoder_secret_minilm.json
    python benchmarks/encoder_secret.py --shape bert-base --json benchmarks/results/encoder_secret_bertbase.json
    python benchmarks/encoder_secret.py --layers 1 --seq 16        # a quick look
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import runinfo  # noqa: E402
from mpc3 import ring  # noqa: E402
from mpc3.kernels import arith  # noqa: E402
from mpc3.party import RingConfig  # noqa: E402
from mpc3.sharing import deal  # noqa: E402
from mpc3.sim import make_parties, run_parties  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.layers import secure_model as SM  # noqa: E402
from protocols.layers.vocab import argmax_a, cost_argmax  # noqa: E402
from protocols.stacks import secret_encoder as SE  # noqa: E402
from protocols.stacks.classifier import classify, cost_classify  # noqa: E402
from protocols.stacks.sentence import cost_embed_sentence, embed_sentence  # noqa: E402

RC = RingConfig()
SHAPES = {"minilm": dict(d_model=384, n_heads=12, d_head=32, d_ff=1536, layers=6,
                         arch="encoder", pool="mean", normalize=True),
          "bert-base": dict(d_model=768, n_heads=12, d_head=64, d_ff=3072, layers=12,
                            arch="encoder-classifier", pool="cls-tanh", n_classes=2)}


def config(shape: str, layers: int | None, seq: int, vocab: int) -> M.ModelConfig:
    s = dict(SHAPES[shape])
    n = s.pop("layers") if layers is None else (s.pop("layers") and layers)
    return M.ModelConfig(n_features=s["d_head"], attn_c=1.0, attn_norm="const",
                         norm_first=False, max_len=seq, n_enc_layers=n, src_vocab=vocab,
                         attention="softmax", ffn_act="gelu", embedding="learned-ln",
                         type_vocab=2, attn_bias=True, ln_eps=1e-3, **s).validate()


def run_mode(cfg, shares, x, secret: bool) -> dict:
    """The model on x (embedded rows or one-hot rows): measured and declared cost, wall."""
    got: dict = {}
    B, S = x[0].shape[:2]
    clf = cfg.arch == M.ENCODER_CLASSIFIER

    def fn(p, s, xs):
        c0, t0 = p.stats.snapshot(), time.perf_counter()
        if clf:
            out = argmax_a(p, SE.classify_secret(p, cfg, s, xs) if secret
                           else classify(p, cfg, s, xs))
        else:
            out = SE.embed_secret(p, cfg, s, xs) if secret else embed_sentence(p, cfg, s, xs)
        d = p.stats.snapshot() - c0
        got[p.rank] = (d.bytes_sent, d.rounds, time.perf_counter() - t0)
        return arith.open_a(p, out)

    out = run_parties(fn, [(shares[i], x[i]) for i in range(3)], parties=make_parties(RC))
    if clf:
        declared = (SE.cost_classify_secret if secret else cost_classify)(RC, cfg, B, S) \
            + cost_argmax(RC, B, cfg.n_classes)
    else:
        declared = (SE.cost_embed_secret if secret else cost_embed_sentence)(RC, cfg, B, S)
    b = [got[r][0] for r in range(3)]
    rounds = max(got[r][1] for r in range(3))
    return {"bytes_per_party": b, "bytes_total": sum(b), "rounds": rounds,
            "wall_s": round(max(got[r][2] for r in range(3)), 3),
            "declared_equals_measured": tuple(b) == declared.bytes_per_party
            and rounds == declared.rounds, "output": ring.decode(out[0], RC.frac)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="minilm")
    ap.add_argument("--layers", type=int, default=None, help="default: the shape's")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    result = runinfo.start("encoder_secret")
    warm = config(a.shape, 1, 8, 300)          # numba compiles its kernels here, untimed
    wsh = SM.share_model(warm, M.random_weights(warm, 1), secret_user=M.random_user(warm, 1))
    wx = M.embed_tokens(warm, M.random_user(warm, 1), np.zeros((1, 8), np.int64))
    run_mode(warm, wsh, deal(ring.encode(wx, RC.frac)), False)
    run_mode(warm, wsh, deal(SE.encoder_onehot(np.zeros((1, 8), np.int64), warm)), True)
    cfg = config(a.shape, a.layers, a.seq, a.vocab)
    result["shape"] = {**cfg.to_dict(), "name": a.shape, "seq": a.seq, "batch": 1}
    w, user = M.random_weights(cfg, 0, lazy=True), M.random_user(cfg, 0)
    rng = np.random.default_rng(1)
    ids, types = rng.integers(0, a.vocab, (1, a.seq)), rng.integers(0, 2, (1, a.seq))
    x = M.embed_tokens(cfg, user, ids, types=types)
    ref = M.ref_classify(cfg, w, x).argmax(-1) if cfg.arch == M.ENCODER_CLASSIFIER \
        else M.ref_embed(cfg, w, x)
    shares = SM.share_model(cfg, w, shared_replicas=True, secret_user=user)
    modes = {"user-held": run_mode(cfg, shares, deal(ring.encode(x, RC.frac),
                                                     shared_replicas=True), False)}
    modes["secret"] = run_mode(cfg, shares, deal(SE.encoder_onehot(ids, cfg, types),
                                                 shared_replicas=True), True)
    for m in modes.values():
        m["max_abs_err"] = float(np.abs(m.pop("output") - ref).max())
    result["modes"] = modes
    result["ratio"] = {k: round(modes["secret"][k] / modes["user-held"][k], 4)
                       for k in ("bytes_total", "rounds")}
    runinfo.finish(result, a.json)
    for m, r in modes.items():
        print(f"{m}: {r['bytes_total'] / 1e6:.2f} MB / {r['rounds']} rounds / {r['wall_s']} s; "
              f"declared == measured: {r['declared_equals_measured']}; max abs err "
              f"{r['max_abs_err']:.2g}")
    print(f"ratio secret / user-held: {result['ratio']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
