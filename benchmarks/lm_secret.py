"""Secret embeddings and LM head against user-held ones, in one run (issue 36): the
GPT-2-small shape (d 768, 12 heads, d_ff 3072, 12 layers, vocabulary 50257, learned
positions, softmax attention + GELU, random weights), a 128-token prompt and one generated
token, three parties in this process (threads).

* ``user-held``: the user embeds the prompt and applies the LM head itself; the parties run
  :func:`protocols.stacks.causal_lm.lm_prefill` / :func:`~protocols.stacks.causal_lm.lm_step`
  and return hidden rows;
* ``secret``: one-hot rows in, :func:`protocols.stacks.secret_lm.lm_prefill_token` /
  :func:`~protocols.stacks.secret_lm.lm_step_token` (the lookup, the LM, the head's logits
  and the arg-max over 50257 entries), the token out.

Per mode and phase: rounds and bytes (the parties' counters, checked equal to the declared
costs), wall time (this machine, the three parties sharing its 2 cores). ``ratio``: secret /
user-held bytes of the prompt + token and of the token alone.

    python benchmarks/lm_secret.py --json benchmarks/results/lm_secret_gpt2small.json
    python benchmarks/lm_secret.py --layers 2 --prompt 16       # a quick look
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
from protocols.layers.vocab import onehot  # noqa: E402
from protocols.stacks import causal_lm as LM  # noqa: E402
from protocols.stacks import secret_lm as S  # noqa: E402

RC = RingConfig()


def config(layers: int, prompt: int, vocab: int) -> M.ModelConfig:
    return M.ModelConfig(d_model=768, n_heads=12, d_head=64, n_features=64, d_ff=3072,
                         attn_c=1.0, attn_norm="const", norm_first=True, max_len=prompt + 1,
                         arch="decoder-only", n_dec_layers=layers, tgt_vocab=vocab,
                         attention="softmax", ffn_act="gelu", embedding="learned").validate()


def run_mode(cfg, shares, inputs, secret: bool, prompt: int) -> dict:
    """Prefill then one step; per phase the measured and declared costs and the wall."""
    got: dict = {}

    def phase(p, name, fn):
        c0, t0 = p.stats.snapshot(), time.perf_counter()
        out = fn()
        d = p.stats.snapshot() - c0
        got.setdefault(name, {})[p.rank] = (d.bytes_sent, d.rounds, time.perf_counter() - t0)
        return out

    def fn(p, s, first, nxt):
        if secret:
            tok, st = phase(p, "prefill", lambda: S.lm_prefill_token(p, cfg, s, first))
            tok = phase(p, "token", lambda: S.lm_step_token(p, cfg, s, st, nxt))
        else:
            _, st = phase(p, "prefill", lambda: LM.lm_prefill(p, cfg, s, first))
            tok = phase(p, "token", lambda: LM.lm_step(p, cfg, s, st, nxt))
        return arith.open_a(p, tok)

    out = run_parties(fn, [(shares[i], inputs[0][i], inputs[1][i]) for i in range(3)],
                      parties=make_parties(RC))
    declared = {"prefill": (S.cost_prefill_token if secret else LM.cost_lm_prefill)(
                    RC, cfg, 1, prompt),
                "token": (S.cost_step_token if secret else LM.cost_lm_step)(RC, cfg, 1, prompt)}
    res = {}
    for name, per in got.items():
        b = [per[r][0] for r in range(3)]
        rounds = max(per[r][1] for r in range(3))
        res[name] = {"bytes_per_party": b, "bytes_total": sum(b), "rounds": rounds,
                     "wall_s": round(max(per[r][2] for r in range(3)), 3),
                     "declared_equals_measured": (tuple(b) == declared[name].bytes_per_party
                                                  and rounds == declared[name].rounds)}
    res["output"] = out[0]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    result = runinfo.start("lm_secret")
    warm = config(1, 8, 300)                    # numba compiles its kernels here, untimed
    ww, wu = M.random_weights(warm, 1), M.random_user(warm, 1)
    wsh = SM.share_model(warm, ww)
    for name, (make, extra) in SM.secret_layout(warm, wu).items():
        for i, s in enumerate(deal(ring.encode(make(), RC.frac + extra))):
            wsh[i][name] = s
    wids = np.zeros((1, 9), np.int64)
    run_mode(warm, wsh, (deal(onehot(wids[:, :-1], 300)), deal(onehot(wids[:, -1], 300))),
             True, 8)
    cfg = config(a.layers, a.prompt, a.vocab)
    result["shape"] = {**cfg.to_dict(), "prompt": a.prompt, "tokens": 1, "batch": 1}
    w, user = M.random_weights(cfg, 0, lazy=True), M.random_user(cfg, 0)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, a.vocab, (1, a.prompt + 1))
    modes = {}
    shares = SM.share_model(cfg, w, shared_replicas=True)
    plain = (deal(ring.encode(M.embed_tokens(cfg, user, ids[:, :-1]), RC.frac),
                  shared_replicas=True),
             deal(ring.encode(M.embed_tokens(cfg, user, ids[:, -1:], a.prompt)[:, 0],
                              RC.frac), shared_replicas=True))
    modes["user-held"] = run_mode(cfg, shares, plain, False, a.prompt)
    del plain
    for name, (make, extra) in SM.secret_layout(cfg, user).items():
        for i, s in enumerate(deal(ring.encode(make(), RC.frac + extra),
                                   shared_replicas=True)):
            shares[i][name] = s
    hot = (deal(onehot(ids[:, :-1], a.vocab), shared_replicas=True),
           deal(onehot(ids[:, -1], a.vocab), shared_replicas=True))
    modes["secret"] = run_mode(cfg, shares, hot, True, a.prompt)
    x = M.embed_tokens(cfg, user, ids)
    h = M.ref_lm(cfg, w, x)[:, -1]
    want = int(M.output_logits(user, h).argmax(-1)[0])
    got = int(round(ring.decode(modes["secret"].pop("output"), RC.frac)[0]))
    modes["user-held"].pop("output")
    result["modes"] = modes
    result["secret_token"], result["reference_token"] = got, want

    def total(m):
        return modes[m]["prefill"]["bytes_total"] + modes[m]["token"]["bytes_total"]
    result["ratio"] = {"bytes_prompt_and_token": round(total("secret") / total("user-held"), 4),
                       "bytes_token": round(modes["secret"]["token"]["bytes_total"]
                                            / modes["user-held"]["token"]["bytes_total"], 4),
                       "rounds_token": round(modes["secret"]["token"]["rounds"]
                                             / modes["user-held"]["token"]["rounds"], 4)}
    runinfo.finish(result, a.json)
    for m, r in modes.items():
        print(f"{m}: prefill {r['prefill']['bytes_total'] / 1e9:.3f} GB / "
              f"{r['prefill']['rounds']} rounds / {r['prefill']['wall_s']} s; token "
              f"{r['token']['bytes_total'] / 1e6:.2f} MB / {r['token']['rounds']} rounds / "
              f"{r['token']['wall_s']} s")
    print(f"ratio secret / user-held: {result['ratio']}; token {got} (reference {want})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
