"""``mpc3 bench lm``: a whole model's private inference - prompt, then generated tokens - with
the measured breakdown by operation type that AERO's figures show.

    mpc3 bench lm --arch decoder-only --attention softmax --d-model 768 --heads 12 \\
        --layers 12 --d-ff 3072 --ffn gelu --prompt 128 --tokens 1 --transport grpc \\
        --net lan --json R.json --plot R.png          # the GPT-2-small-shaped workload

Random weights (Xavier, :func:`protocols.model.random_weights`, seed ``--seed``), pre-LN
with a final LayerNorm, batch 1; the prompt is ``--prompt`` random token ids embedded by the
query user (sinusoidal positions), the T = ``--tokens`` steps are fed the embeddings of
further random ids (what a generation feeds back does not change its cost). Architectures:
``decoder-only`` (prefill of the prompt, then T KV-cache / Performer steps), ``encoder-decoder``
(the translator: ``--prompt`` source positions through the encoder once, then T decoder
steps: Performer prefix sums, or a KV cache and the source's K, V for the softmax-style
attentions), ``classifier`` (encoder + pooling + head on ``--prompt``
positions, T = 0), ``encoder`` (a sentence embedding: encoder, mean pooling and L2
normalization on ``--prompt`` positions, T = 0). ``--preset aero`` here is softmax attention and a
linear FFN (``ffn_act`` none) with the LayerNorms kept: random weights without normalization leave
the kernels' ranges. The full preset (``norm`` none, W1 W2 fused, scaled / pruned FFN) is
:func:`protocols.model.aero`, for trained models.

The parties run one diagnostic ``bench_lm`` job (:mod:`protocols.jobs.bench_lm`): in process
(``--transport inproc``, three threads) or on three party processes (``grpc``; ``--net lan|wan``
in emulated network namespaces, :mod:`app.bench.remote`), after an untimed warm-up job at a
tiny shape. Metrics (DESIGN.md names; shares already in place, protocol only): per phase
(``prefill`` - the prompt / the encoder / the classification - and each generated token)
``wall_s`` (the slowest party), ``bytes_total`` and ``bytes_per_party``, ``messages``,
``rounds``, all counted by the parties' communicators; ``per_token_*`` the mean over the
steps; ``breakdown`` the same split into :data:`protocols.jobs.breakdown.CATEGORIES` (measured:
:mod:`protocols.jobs.breakdown`; wall time of the slowest party); ``declared`` the protocols'
declared costs (cost_lm_prefill / cost_lm_step, cost_classify, cost_embed_sentence,
cost_encoder +
cost_decode_start / cost_decoder_step) and ``checks`` whether the
categories sum to the measured totals and the declarations equal them (semi-honest mode:
``--security malicious`` runs the parties in malicious mode, every phase ending with its
flush, the ``verify`` category; the declarations are semi-honest mode's, not compared); ``max_abs_err``
against the float64 reference (:func:`protocols.model.ref_lm` etc.) on the same inputs,
``plain_wall_s`` that reference's time; ``peak_rss_bytes`` of this process and of each party
process.
"""
from __future__ import annotations

import math
import os
import platform
import time

import numpy as np

from mpc3.procinfo import peak_rss
ARCHS = {"decoder-only": "decoder-only", "encoder-decoder": "encoder-decoder",
         "classifier": "encoder-classifier", "encoder": "encoder"}
ATTENTIONS = {"relu-performer": "relu-performer", "softmax": "softmax",
              "power-softmax": "power-softmax", "sigma-relu": "sigma-relu",
              "sigma": "sigma-relu"}      # sigma: the short name of earlier result files
PHASE0 = {"decoder-only": "prefill", "encoder-decoder": "encoder", "encoder-classifier":
          "classify", "encoder": "embed"}


def lm_config(arch: str, attention: str, d_model: int, heads: int, layers: int, d_ff: int,
              prompt: int, tokens: int, ffn: str | None = None, preset: str | None = None,
              features: int | None = None, vocab: int = 64, softmax: str = "max",
              kv_heads: int | None = None):
    """The ModelConfig of a ``bench lm`` run (``arch``/``attention``: the command's names;
    ``softmax``: the softmax form, ModelConfig.softmax_form; ``preset`` llama: RMSNorm,
    rotary positions, the SiLU-gated FFN, ``kv_heads`` key/value heads)."""
    from protocols import model as M
    if arch not in ARCHS or attention not in ATTENTIONS:
        raise ValueError(f"--arch must be one of {list(ARCHS)} and --attention one of "
                         f"{list(ATTENTIONS)}")
    if preset == "aero":
        if ffn not in (None, "none"):
            raise ValueError("--preset aero is the softmax-only block: its FFN is linear "
                             "(leave --ffn out or give none)")
        if attention != "softmax":
            raise ValueError("--preset aero is the softmax-only block (--attention softmax)")
        ffn = "none"
    elif preset == "llama":
        if ffn not in (None, "swiglu") or attention != "softmax" or arch != "decoder-only":
            raise ValueError("--preset llama is a decoder-only LM with softmax attention and "
                             "the gated FFN (leave --ffn out)")
        ffn = "swiglu"
    elif preset is not None:
        raise ValueError(f"unknown --preset {preset!r} (aero, llama)")
    if kv_heads and preset != "llama":
        raise ValueError("--kv-heads (grouped-query attention) needs --preset llama")
    if d_model % heads:
        raise ValueError(f"--d-model {d_model} is not divisible by --heads {heads}")
    kind, dh = ARCHS[arch], d_model // heads
    if kind in (M.ENCODER_CLASSIFIER, M.ENCODER) and tokens:
        raise ValueError(f"{'a classifier' if arch == 'classifier' else 'an encoder'} "
                         f"generates no tokens: use --tokens 0")
    if kind == M.ENCODER_DECODER and tokens < 1:
        raise ValueError("the encoder-decoder run decodes: --tokens >= 1")
    r = features or max(1, math.ceil(dh * math.log(max(dh, 2))))     # Privformer: d ln d
    max_len = {M.DECODER_ONLY: prompt + tokens, M.ENCODER_CLASSIFIER: prompt, M.ENCODER: prompt,
               M.ENCODER_DECODER: max(prompt, tokens) + 1}[kind]
    keys = {M.DECODER_ONLY: {"n_dec_layers": layers, "tgt_vocab": vocab},
            M.ENCODER_CLASSIFIER: {"n_enc_layers": layers, "src_vocab": vocab, "n_classes": 2},
            # sentence-transformers' usual head: mean pooling, L2 normalization
            M.ENCODER: {"n_enc_layers": layers, "src_vocab": vocab, "normalize": True},
            M.ENCODER_DECODER: {"n_enc_layers": layers, "n_dec_layers": layers,
                                "src_vocab": vocab, "tgt_vocab": vocab}}[kind]
    return M.ModelConfig(d_model=d_model, n_heads=heads, d_head=dh, n_features=r, d_ff=d_ff,
                         attn_c=1.0 / r, attn_norm="mean", norm_first=True, max_len=max_len,
                         arch=kind, ffn_act=ffn or "relu", attention=ATTENTIONS[attention],
                         softmax_form=softmax if attention == "softmax" else "max",
                         **keys, **(LLAMA_KEYS if preset == "llama" else {}),
                         n_kv_heads=kv_heads or 0).validate()


#: ``--preset llama``'s keys beside the gated FFN (docs/MODELS.md, LLaMA-family decoders)
LLAMA_KEYS = {"norm": "rmsnorm", "embedding": "rotary", "ln_eps": 1e-5}


# ---------------------------------------------------------------- inputs, reference ----
def make_case(cfg, prompt: int, tokens: int, seed: int = 0, lazy: bool = False):
    """(weights, X (1, prompt, d), Y (tokens, 1, d) or None): random weights (``lazy``:
    drawn when used, :func:`protocols.model.random_weights`) and the query user's
    embeddings of random token ids."""
    from protocols import model as M
    w, user = M.random_weights(cfg, seed, lazy), M.random_user(cfg, seed)
    rng = np.random.default_rng(seed + 1)
    vocab = cfg.tgt_vocab if cfg.arch == M.DECODER_ONLY else cfg.src_vocab
    ids, nxt = rng.integers(0, vocab, (1, prompt)), rng.integers(0, vocab, (1, tokens))
    if cfg.arch == M.ENCODER_DECODER:
        x = M.embed_tokens(cfg, user, ids, table="embed.src")
        y = M.embed_tokens(cfg, user, nxt, table="embed.tgt")
    else:
        x = M.embed_tokens(cfg, user, ids)
        y = M.embed_tokens(cfg, user, nxt, offset=prompt) if tokens else None
    return w, x, (None if y is None else np.ascontiguousarray(y.transpose(1, 0, 2)))


def reference(cfg, w, x: np.ndarray, y: np.ndarray | None) -> np.ndarray:
    """The float64 outputs the job returns as ``Y``."""
    from protocols import model as M
    if cfg.arch == M.DECODER_ONLY:
        seq = x if y is None else np.concatenate([x, y.transpose(1, 0, 2)], axis=1)
        return M.ref_lm(cfg, w, seq)[:, x.shape[1] - 1:].transpose(1, 0, 2)
    if cfg.arch == M.ENCODER_CLASSIFIER:
        return M.ref_classify(cfg, w, x)[None]
    if cfg.arch == M.ENCODER:
        return M.ref_embed(cfg, w, x)[None]
    state = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x))
    return np.stack([M.ref_decoder_step(cfg, w, state, y[t]) for t in range(y.shape[0])])


def declared(cfg, B: int, S: int, T: int, fuse=None) -> list:
    """Declared Cost of each phase (prefill / encoder + decode start / classify, then steps),
    the session fusing the LayerNorms ``fuse`` picks (bench_lm's parameter)."""
    from mpc3.party import RingConfig
    from protocols import model as M
    from protocols.jobs.bench_lm import session_fuse
    ring, kinds = RingConfig(), session_fuse(cfg, {"fuse": fuse})
    if cfg.arch == M.DECODER_ONLY:
        from protocols.stacks.causal_lm import cost_lm_prefill, cost_lm_step
        return [cost_lm_prefill(ring, cfg, B, S, fuse=kinds)] + [
            cost_lm_step(ring, cfg, B, S + t, fuse=kinds) for t in range(T)]
    if cfg.arch == M.ENCODER_CLASSIFIER:
        from protocols.stacks.classifier import cost_classify
        return [cost_classify(ring, cfg, B, S)]
    if cfg.arch == M.ENCODER:
        from protocols.stacks.sentence import cost_embed_sentence
        return [cost_embed_sentence(ring, cfg, B, S)]
    from protocols.stacks.decoder import cost_decode_start, cost_decoder_step
    from protocols.stacks.encoder import cost_encoder
    first = cost_encoder(ring, cfg, B, S) + cost_decode_start(ring, cfg, B, S, fuse=kinds)
    return [first] + [cost_decoder_step(ring, cfg, B, t, n_enc=S, fuse=kinds)
                      for t in range(T)]


# ------------------------------------------------------------------------ running ----
def _inputs(x, y) -> dict:
    return {"X": x} if y is None else {"X": x, "Y": y}


def _params(cfg, y, fuse) -> dict:
    out = {"config": cfg.to_dict(), "tokens": 0 if y is None else int(y.shape[0])}
    return out if fuse is None else {**out, "fuse": fuse}


def run_inproc(cfg, shares: list, x, y, fuse=None, security: str = "semi-honest") -> dict:
    """The bench_lm job on three in-process parties holding ``shares``
    (:func:`protocols.layers.secure_model.share_model`), in ``security`` mode: {"Y", "stats",
    "mem"} as ring arrays."""
    from mpc3.sharing import reveal
    from net.party.inproc import InprocParties
    from protocols.jobs import ModelView, benchmark_registry
    from protocols.layers.secure_model import share_input
    models = [ModelView("bench", shares[r], {"bench": "bench_lm"}) for r in range(3)]
    ip = InprocParties(models, registry=benchmark_registry(), security=security,
                       timeout=600.0 if security == "semi-honest" else 4 * 3600.0)
    ins = {k: share_input(v) for k, v in _inputs(x, y).items()}
    jobs = ip.run("bench_lm", _params(cfg, y, fuse),
                  [{k: s[r] for k, s in ins.items()} for r in range(3)])
    return {k: reveal([j.outputs[k] for j in jobs]) for k in ("Y", "stats", "mem")}


def run_remote(rc, cfg, w, x, y, fuse=None) -> dict:
    """The same on a :class:`app.bench.remote.RemoteCluster`, uploading the weights ``w``
    one tensor at a time (:class:`protocols.layers.secure_model.LazyTensors`) as the model
    (deleted after)."""
    from net.client.outputs import reconstruct
    from protocols.layers.secure_model import LazyTensors, layout
    tensors = LazyTensors(layout(cfg, w))
    pairs = rc.run_job("bench_lm", tensors, tensors.extra_frac(), _inputs(x, y),
                       _params(cfg, y, fuse))
    return reconstruct(pairs)


# ----------------------------------------------------------------------- metrics ----
def _phase(st: np.ndarray, cost, malicious: bool = False) -> dict:
    """One phase's (3, len(CATEGORIES) + 1, 4) stats -> metrics, breakdown, declared (the
    protocols' semi-honest costs: compared with the measured ones in semi-honest mode only)."""
    from protocols.jobs.breakdown import CATEGORIES
    tot = st[:, -1]
    slow = int(np.argmax(tot[:, 0]))
    out = {"wall_s": float(tot[slow, 0] / 1e9), "bytes_total": int(tot[:, 1].sum()),
           "bytes_per_party": tot[:, 1].tolist(), "messages": int(tot[:, 2].sum()),
           "rounds": int(tot[:, 3].max())}
    out["breakdown"] = {c: {"wall_s": float(st[slow, i, 0] / 1e9),
                            "bytes_total": int(st[:, i, 1].sum()),
                            "messages": int(st[:, i, 2].sum()), "rounds": int(st[:, i, 3].max())}
                        for i, c in enumerate(CATEGORIES)}
    out["declared"] = {"rounds": cost.rounds, "bytes_total": cost.bytes_total,
                       "bytes_per_party": list(cost.bytes_per_party)}
    out["checks"] = {
        "breakdown_equals_measured": bool((st[:, :-1].sum(axis=1) == tot).all())}
    if not malicious:
        out["checks"]["declared_equals_measured"] = bool(
            list(cost.bytes_per_party) == out["bytes_per_party"]
            and (tot[:, 3] == cost.rounds).all())
    return out


def _mean(phases: list[dict]) -> dict:
    """Mean of the metrics (and breakdown) over the generated tokens."""
    n = len(phases)
    keys = ("wall_s", "bytes_total", "messages", "rounds")
    out = {k: sum(p[k] for p in phases) / n for k in keys}
    out["breakdown"] = {c: {k: sum(p["breakdown"][c][k] for p in phases) / n for k in keys}
                        for c in phases[0]["breakdown"]}
    return out


def _sum(phases: list[dict]) -> dict:
    keys = ("wall_s", "bytes_total", "messages", "rounds")
    out = {k: sum(p[k] for p in phases) for k in keys}
    out["bytes_per_party"] = [sum(p["bytes_per_party"][r] for p in phases) for r in range(3)]
    out["breakdown"] = {c: {k: sum(p["breakdown"][c][k] for p in phases) for k in keys}
                        for c in phases[0]["breakdown"]}
    return out


def run_lm(a) -> dict:
    """The ``mpc3 bench lm`` result object for parsed arguments ``a``."""
    from mpc3 import ring
    from .op import provenance
    load_at_start, source = os.getloadavg()[0], provenance()
    cfg = lm_config(a.arch, a.attention, a.d_model, a.heads, a.layers, a.d_ff, a.prompt,
                    a.tokens, a.ffn, a.preset, a.features, softmax=a.softmax,
                    kv_heads=a.kv_heads)
    try:                                # an unknown choice is refused before any setup
        from protocols.jobs.bench_lm import session_fuse
        session_fuse(cfg, {"fuse": a.fuse})
    except ValueError as exc:
        raise SystemExit(f"--fuse: {exc}") from None
    warm_len = min(a.prompt, 32)        # > 16 rows: the kernels' batched paths warm up too
    tiny = lm_config(a.arch, a.attention, 8, 2, 1, 8, warm_len, min(a.tokens, 1), a.ffn,
                     a.preset, 4, softmax=a.softmax, kv_heads=1 if a.kv_heads else None)
    warm = make_case(tiny, warm_len, min(a.tokens, 1))
    inproc = a.transport == "inproc" and a.net == "none"
    # over party processes the weights are drawn when shared and when the reference runs:
    # this process (the model owner) holds one tensor at a time
    w, x, y = make_case(cfg, a.prompt, a.tokens, a.seed, lazy=not inproc)
    t0 = time.perf_counter()
    ref = reference(cfg, w, x, y)
    plain_wall = time.perf_counter() - t0
    network = {"net": "none", "emulation": "none"}
    t_setup = time.perf_counter()
    if inproc:
        from protocols.layers.secure_model import share_model
        run_inproc(tiny, share_model(tiny, warm[0], shared_replicas=True), *warm[1:],
                   security=a.security)
        shares = share_model(cfg, w, shared_replicas=True)
        del w                                  # the parties' shares only from here on
        got = run_inproc(cfg, shares, x, y, a.fuse, a.security)
    else:
        from .remote import RemoteCluster
        with RemoteCluster(a.net, security=a.security) as rc:
            run_remote(rc, tiny, *warm)
            network = rc.network
            got = run_remote(rc, cfg, w, x, y, a.fuse)
    elapsed = time.perf_counter() - t_setup
    stats = got["stats"].astype(np.int64)
    costs = declared(cfg, 1, a.prompt, a.tokens, a.fuse)
    malicious = a.security == "malicious"
    phases = [_phase(stats[:, k], costs[k], malicious) for k in range(stats.shape[1])]
    secure = ring.decode(got["Y"], ring.DEFAULT_FRAC)
    err = float(np.max(np.abs(secure - ref)))
    total = _sum(phases)
    steps = phases[1:]
    name = PHASE0[cfg.arch]
    return {
        "workload": f"lm/{a.arch}/{a.attention}" + (f"/{a.preset}" if a.preset else "")
                    + (f"/kv{a.kv_heads}" if a.kv_heads else ""),
        "params": {"arch": cfg.arch, "attention": cfg.attention,
                   "softmax_form": cfg.softmax_form, "ffn_act": cfg.ffn_act,
                   "norm": f"{cfg.norm} (pre-LN, final norm)", "preset": a.preset,
                   "kv_heads": cfg.kv_heads, "embedding": cfg.embedding,
                   "preset_note": PRESET_NOTE if a.preset == "aero" else None,
                   "d_model": cfg.d_model, "heads": cfg.n_heads, "layers": a.layers,
                   "d_ff": cfg.d_ff, "features": cfg.n_features, "prompt": a.prompt,
                   "tokens": a.tokens, "batch": 1, "seed": a.seed, "frac": ring.DEFAULT_FRAC,
                   "fuse": a.fuse or "default",
                   "trunc": "exact", "model_config": cfg.to_dict(), "host": platform.node(),
                   "cpus": os.cpu_count(), "run_s_with_upload": round(elapsed, 3),
                   "load_avg_1m_at_start": load_at_start, **source,
                   "load_avg_1m_at_end": os.getloadavg()[0]},
        "security": a.security,
        "transport": "grpc" if a.net != "none" else a.transport,
        "net": network.get("net", "none"), "emulation": network.get("emulation", "none"),
        "links": network.get("links"),
        "wall_s": {"min": total["wall_s"], "median": total["wall_s"]},
        "bytes_total": total["bytes_total"], "bytes_per_party": total["bytes_per_party"],
        "messages": total["messages"], "rounds": total["rounds"],
        "phase0": name, name: phases[0],
        "per_token_wall_s": _mean(steps)["wall_s"] if steps else None,
        "per_token_bytes": _mean(steps)["bytes_total"] if steps else None,
        "per_token_rounds": _mean(steps)["rounds"] if steps else None,
        "per_token": _mean(steps) if steps else None, "steps": steps,
        "breakdown": total["breakdown"],
        "checks": {k: all(p["checks"][k] for p in phases) for k in phases[0]["checks"]},
        "max_abs_err": err, "max_rel_err": err / max(float(np.abs(ref).max()), 1e-12),
        "plain_wall_s": plain_wall,
        "peak_rss_bytes": {"this_process": peak_rss(),
            "parties": (None if a.transport == "inproc" and a.net == "none"
                        else got["mem"].astype(np.int64).reshape(3, -1)[:, 0].tolist())},
    }


PRESET_NOTE = ("AERO softmax-only block, partial: softmax attention and ffn_act none (linear "
               "FFN; shared fused as one matrix since the norms merge); LayerNorms kept "
               "(random weights without normalization leave the kernels' ranges; the full "
               "preset is protocols.model.aero, for trained models)")


def _print(r: dict) -> None:
    name = r["phase0"]
    rows = [("workload", r["workload"]), ("security", r["security"]),
            ("transport / net", f"{r['transport']} / {r['net']}"),
            ("wall_s (all phases)", f"{r['wall_s']['min']:.3f}"),
            ("bytes_total / rounds", f"{r['bytes_total']} / {r['rounds']}"),
            (f"{name}: wall_s / bytes / rounds", f"{r[name]['wall_s']:.3f} / "
             f"{r[name]['bytes_total']} / {r[name]['rounds']}")]
    if r["per_token"]:
        rows.append(("per token: wall_s / bytes / rounds", f"{r['per_token_wall_s']:.3f} / "
                     f"{r['per_token_bytes']:.0f} / {r['per_token_rounds']:.1f}"))
    for c, v in r["breakdown"].items():
        rows.append((f"  {c}: bytes / rounds / wall_s",
                     f"{v['bytes_total']} / {v['rounds']} / {v['wall_s']:.3f}"))
    rows += [("checks", ", ".join(f"{k}={v}" for k, v in r["checks"].items())),
             ("max_abs_err / plain_wall_s", f"{r['max_abs_err']:.3g} / {r['plain_wall_s']:.3f}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _cmd(a) -> int:
    from .op import write_json
    if a.plot:
        from .lm_plot import require_matplotlib
        require_matplotlib()
    r = run_lm(a)
    _print(r)
    write_json(r, a.json)
    if a.plot:
        from .lm_plot import plot_breakdown
        plot_breakdown(r, a.plot)
        print(f"wrote {a.plot}")
    return 0


def register(bsub) -> None:
    from protocols.stacks.causal_lm import LM_FUSIONS
    from protocols.stacks.decoder import FUSIONS
    from ..options import add_fuse
    p = bsub.add_parser("lm", help="a whole model: prompt + generated tokens, with the "
                        "breakdown by operation type")
    p.add_argument("--arch", choices=tuple(ARCHS), default="decoder-only")
    p.add_argument("--attention", choices=tuple(ATTENTIONS), default="softmax")
    p.add_argument("--softmax", choices=("max", "max-free"), default="max",
                   help="softmax form: max-subtracted (default, any score range) or "
                   "Privformer's max-free (scores must stay in exp's range)")
    p.add_argument("--ffn", choices=("relu", "gelu", "none"), default=None,
                   help="FFN activation (default relu; --preset aero: none)")
    p.add_argument("--preset", choices=("aero", "llama"), default=None,
                   help="aero: AERO's softmax-only block (partial: LayerNorms stay); llama: "
                   "RMSNorm, rotary positions, the SiLU-gated FFN (--d-ff its width)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="--preset llama: key/value heads (grouped-query attention; default "
                   "--heads)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--features", type=int, default=None,
                   help="relu-performer random features r (default d_head ln d_head)")
    p.add_argument("--prompt", type=int, default=16,
                   help="prompt tokens (encoder-decoder: source length; classifier, encoder: "
                   "input)")
    p.add_argument("--tokens", type=int, default=1, help="generated tokens (classifier, "
                   "encoder: 0)")
    p.add_argument("--transport", choices=("inproc", "grpc"), default="inproc")
    p.add_argument("--net", default="none",
                   help="none | lan | wan | custom:RATE_MBIT:RTT_MS: party processes in emulated "
                        "network namespaces (needs root; implies grpc)")
    p.add_argument("--security", choices=("semi-honest", "malicious"), default="semi-honest",
                   help="the parties' [cluster] security mode; malicious: every phase ends "
                        "with its verification (docs/MALICIOUS.md), counted in its stats as "
                        "the breakdown's verify category")
    p.add_argument("--seed", type=int, default=0)
    add_fuse(p, tuple(dict.fromkeys(LM_FUSIONS + FUSIONS)))
    p.add_argument("--json", help="write the result object here")
    p.add_argument("--plot", help="draw the breakdown into this PNG (needs the plot extra: "
                   "matplotlib)")
    p.set_defaults(func=_cmd)
