"""Secure translation, query-user side: the incremental decoding loop of DESIGN.md
("One inference").

The query user keeps the embedding tables and the output projection (never sent). Per batch
of sources of one length it

1. tokenises and embeds locally (``embed * sqrt(d) + PE``), shares X_src and opens a decode
   session: the parties run the encoder once and keep the cross-attention K'^T V and empty
   prefix sums (job ``decode_open``);
2. per step shares only the newest token's embedding (job ``decode_step``, its own job id),
   fetches the three output pairs, reconstructs the new row with the replica check
   (:class:`~net.client.failures.TamperingDetected`), applies Linear + softmax locally and picks the
   most likely token greedily;
3. stops when every row emitted ``<eos>`` or at the length limit, and closes the session.

Two backends run the same job functions (:mod:`protocols.jobs`): :class:`ClusterBackend`
(party processes over gRPC, via :class:`~net.client.user.QueryUser`) and :class:`InprocBackend`
(three in-process threads, one fresh :func:`mpc3.sim.make_parties` - fresh PRG keys - per job).
Costs: each party counts its own traffic per job; bytes and messages are summed over the
parties, rounds are the maximum.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from mpc3 import ring
from mpc3.sharing import deal
from protocols import model as M
from protocols.jobs import output_fracs

from net.client.failures import ClusterError, TamperingDetected
from net.client.user import QueryUser
from net.client.outputs import reconstruct


class TranslationError(RuntimeError):
    """Secure translation could not finish (a party failed, a deadline passed, ...)."""


@dataclass
class Traffic:
    """Measured traffic of a set of jobs: bytes/messages summed over parties, rounds the
    maximum; ``layers`` the same jobs' per-layer costs as the parties report them."""

    wall_s: float = 0.0
    bytes_per_party: list = field(default_factory=lambda: [0, 0, 0])
    messages: int = 0
    rounds: int = 0
    jobs: int = 0
    layers: "LayerCosts" = field(default_factory=lambda: LayerCosts())

    @property
    def bytes_total(self) -> int:
        return int(sum(self.bytes_per_party))

    def add_parties(self, per_party: list[tuple[int, int, int]], wall_s: float) -> None:
        """``per_party``: (bytes, messages, rounds) of one job on each party."""
        for n, (b, _, _) in enumerate(per_party):
            self.bytes_per_party[n] += int(b)
        self.messages += int(sum(m for _, m, _ in per_party))
        self.rounds += int(max(r for _, _, r in per_party))
        self.wall_s += wall_s
        self.jobs += 1

    def __iadd__(self, other: "Traffic") -> "Traffic":
        self.wall_s += other.wall_s
        self.bytes_per_party = [a + b for a, b in zip(self.bytes_per_party,
                                                      other.bytes_per_party)]
        self.messages += other.messages
        self.rounds += other.rounds
        self.jobs += other.jobs
        self.layers += other.layers
        return self


class LayerCosts:
    """Per-layer traffic reported by the parties (public), accumulated over jobs (a
    :class:`Traffic`'s ``layers``)."""

    def __init__(self) -> None:
        self.rows: dict[str, list] = {}     # layer -> [bytes_total, messages, rounds, calls]

    def add(self, per_party: list[list[dict]]) -> None:
        """One job's entries from the three parties (ignored unless all three reported)."""
        if not per_party or not all(per_party) or \
                len({len(p) for p in per_party}) != 1:
            return
        for entries in zip(*per_party):
            row = self.rows.setdefault(entries[0]["layer"], [0, 0, 0, 0])
            row[0] += sum(e["bytes"] for e in entries)
            row[1] += sum(e["messages"] for e in entries)
            row[2] += max(e["rounds"] for e in entries)
            row[3] += 1

    def __iadd__(self, other: "LayerCosts") -> "LayerCosts":
        for layer, got in other.rows.items():
            row = self.rows.setdefault(layer, [0, 0, 0, 0])
            for i, v in enumerate(got):
                row[i] += v
        return self


# ------------------------------------------------------------------------ backends ----
def opening(fuse: str | None) -> dict:
    """The extra job parameters of a job that opens a session: its LayerNorm fusions ``fuse``
    (None: the parties' default; :func:`protocols.layers.ln_proj.fusion_choice`)."""
    return {} if fuse is None else {"fuse": fuse}


@dataclass
class JobRun:
    """One job of a session as a backend ran it: the reconstructed outputs, each party's
    (bytes, messages, rounds), the wall time and each party's per-layer costs (public)."""

    outputs: dict
    per_party: list
    wall_s: float
    layers: list


class ClusterBackend:
    """Decode sessions on a running cluster (three party processes)."""

    transport = "grpc"

    def __init__(self, user: QueryUser, model_id: str, step_timeout: float | None = None,
                 fuse: str | None = None):
        self.user = user
        self.model_id = model_id
        self.info = user.model(model_id)          # checks the parties hold the same upload
        self.step_timeout = step_timeout
        self.frac = user.frac
        self.fuse = fuse

    def secret_embeddings(self) -> bool:
        """Whether the model's owner keeps its embedding table and LM head secret."""
        import json
        return json.loads(self.info.public_meta or "{}").get("embeddings") == "secret"

    def model_config(self) -> M.ModelConfig:
        import json
        meta = json.loads(self.info.public_meta or "{}")
        if "model_config" not in meta:
            raise TranslationError(f"model {self.model_id!r} has no public model_config "
                                   "(not shared by 'mpc3 share-model'?)")
        return M.ModelConfig.from_dict(meta["model_config"])

    def job(self, kind: str, inputs: dict, session: str, params: dict | None = None,
            encoded: bool = False) -> JobRun:
        """``encoded``: the inputs are ring integers, shared as they are (one-hot rows)."""
        t0 = time.perf_counter()
        job = self.user.submit(self.model_id, kind, inputs, {"session": session, **(params or {})},
                               upload_id=self.info.upload_id, allow_empty=not inputs,
                               encoded=encoded)
        st = self.user.wait(job, timeout=self.step_timeout)
        out = self.user.fetch(job) if not kind.endswith("_close") else {}
        return JobRun(out, [(s.bytes_sent, s.messages, s.rounds) for s in st],
                      time.perf_counter() - t0, st.costs)


class InprocBackend:
    """Three in-process parties (threads) holding model shares: the party service's own job
    runner without a network (:class:`net.party.inproc.InprocParties`)."""

    transport = "inproc"

    def __init__(self, cfg: M.ModelConfig, weights: M.Weights, frac: int = ring.DEFAULT_FRAC,
                 timeout: float = 120.0, fuse: str | None = None,
                 calibration: dict | None = None, secret_user: dict | None = None):
        """``calibration``: the model's (``Calibration.to_dict()``), as ``share-model`` stores
        it - the decode steps' schedule follows from it
        (:func:`protocols.stacks.schedule.deferred_wo`); ``secret_user``: the user tables the
        owner keeps secret (``share-model --secret-embeddings``), shared with the model."""
        from net.party.inproc import InprocParties
        self.cfg = cfg
        self.frac = frac
        self.fuse = fuse
        self.parties = InprocParties.for_model(cfg, weights, frac=frac, timeout=timeout,
                                               calibration=calibration, secret_user=secret_user)

    def model_config(self) -> M.ModelConfig:
        return self.cfg

    def open_sessions(self) -> int:
        """Decode sessions the three parties hold (one per session and party)."""
        return sum(r.sessions.count() for r in self.parties.runners)

    def job(self, kind: str, inputs: dict, session: str, params: dict | None = None,
            encoded: bool = False) -> JobRun:
        dealt = {k: deal(np.asarray(v, dtype=np.uint64) if encoded else
                         ring.encode(np.asarray(v, dtype=np.float64), self.frac))
                 for k, v in inputs.items()}
        t0 = time.perf_counter()
        jobs = self.parties.run(kind, {"session": session, **(params or {})},
                                [{k: v[n] for k, v in dealt.items()} for n in range(3)])
        per_party = [] if jobs[0].party is None else \
            [(j.party.stats.bytes_sent, j.party.stats.messages, j.party.stats.rounds)
             for j in jobs]
        outs = [j.outputs for j in jobs]
        wide = {k: f - self.frac for k, f in output_fracs(jobs[0].spec, self.frac).items()}
        return JobRun(reconstruct(outs, wide) if outs[0] else {}, per_party,
                      time.perf_counter() - t0, [j.costs for j in jobs])


# ------------------------------------------------------------------------ sessions ----
#: the job kinds of a session: (open, step, close)
DECODE = ("decode_open", "decode_step", "decode_close")
LM = ("lm_prefill", "lm_step", "lm_close")
#: an LM whose owner keeps the vocabulary ends secret: one-hot rows in, tokens out
LM_TOKEN = ("lm_prefill_token", "lm_step_token", "lm_close_token")


class Session:
    """One decode session from the query user's side, owning its tallies: ``opened`` (the
    traffic of the job that opened it), ``steps`` (of its steps) and ``last`` (of the latest
    job), each with the per-layer costs the parties report (:attr:`Traffic.layers`).

    ``kinds``: :data:`DECODE` (translator) or :data:`LM`; ``sid``: the session's name at the
    parties (default: fresh and random). As a context manager it closes the session when
    left (best effort; not after the cluster failed one of its jobs: the failed job dropped
    the session where it ran, and a party that stopped answering would hold the close for
    its whole timeout)."""

    def __init__(self, backend, kinds: tuple[str, str, str] = DECODE,
                 sid: str | None = None) -> None:
        self.backend, self.kinds = backend, kinds
        self.id = sid or "s" + os.urandom(12).hex()
        self.opened, self.steps, self.last = Traffic(), Traffic(), Traffic()
        self._started = False

    def open(self, x: np.ndarray) -> dict:
        """Share ``x`` and open the session (its outputs: ``H`` for an LM's prompt; with
        :data:`LM_TOKEN` ``x`` is the prompt's one-hot rows and the output ``TOK``)."""
        self._started = True
        token = self.kinds == LM_TOKEN
        return self._run(self.kinds[0], {"ONEHOT" if token else "X": x}, self.opened,
                         opening(self.backend.fuse), token)

    def step(self, y: np.ndarray) -> np.ndarray:
        """One step on the embedded token rows ``y`` (B, d): the hidden rows, ring values
        (:data:`LM_TOKEN`: the one-hot rows (B, V) -> the tokens, ring values)."""
        if self.kinds == LM_TOKEN:
            return self._run(self.kinds[1], {"ONEHOT": y}, self.steps, None, True)["TOK"]
        return self._run(self.kinds[1], {"Y": y}, self.steps)["H"]

    def close(self, failure: BaseException | None = None) -> None:
        if not self._started or isinstance(failure, ClusterError):
            return
        self._started = False
        try:
            self.backend.job(self.kinds[2], {}, self.id)
        except Exception:  # noqa: BLE001 - best effort: parties also drop idle sessions
            pass

    def _run(self, kind: str, inputs: dict, tally: Traffic, params: dict | None = None,
             encoded: bool = False) -> dict:
        run = (self.backend.job(kind, inputs, self.id, params, encoded=True) if encoded else
               self.backend.job(kind, inputs, self.id, params))
        self.last = Traffic()
        if run.per_party:
            self.last.add_parties(run.per_party, run.wall_s)
        self.last.layers.add(run.layers)
        tally += self.last
        return run.outputs

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        self.close(exc)
        return False


# ---------------------------------------------------------------------------- loop ----
@dataclass
class BatchResult:
    tokens: list[list[int]]            # per row, without BOS/EOS
    open_cost: Traffic
    step_cost: Traffic
    steps: int
    logits: list[np.ndarray]           # (B, V) per step (for checks/diagnostics)
    hidden: list[np.ndarray] = field(default_factory=list)   # (B, d) decoder rows per step
    fed: list[np.ndarray] = field(default_factory=list)      # (B,) token fed at each step


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def decode_batch(backend, cfg: M.ModelConfig, user: Mapping[str, np.ndarray], src_ids,
                 bos: int, eos: int | None, max_steps: int,
                 on_token: Callable[[int, np.ndarray, np.ndarray], None] | None = None
                 ) -> BatchResult:
    """Secure greedy decoding of a batch of equal-length sources; == M.greedy_decode.

    ``eos=None`` decodes exactly ``max_steps`` tokens (benchmarks). ``on_token(t, tokens,
    probs)`` is called after every step with the picked tokens (B,) and their probabilities.
    """
    src = np.asarray(src_ids, dtype=np.int64)
    if src.ndim == 1:
        src = src[None]
    B = src.shape[0]
    out: list[list[int]] = [[] for _ in range(B)]
    all_logits, hidden, fed = [], [], []
    steps = 0
    with Session(backend, DECODE) as session:
        session.open(M.embed(cfg, user["embed.src"], src))
        tok = np.full(B, bos, dtype=np.int64)
        done = np.zeros(B, dtype=bool)
        for t in range(max_steps):
            y = M.embed(cfg, user["embed.tgt"], tok[:, None], offset=t)[:, 0, :]
            h = ring.decode(session.step(y), backend.frac)
            steps += 1
            hidden.append(h)
            fed.append(tok.copy())
            logits = M.output_logits(user, h)
            all_logits.append(logits)
            tok = logits.argmax(-1)
            if on_token is not None:
                on_token(t, tok, softmax(logits)[np.arange(B), tok])
            M.take_tokens(out, done, tok, eos)
            if done.all():
                break
    return BatchResult(out, session.opened, session.steps, steps, all_logits, hidden, fed)


def reference_rows(cfg: M.ModelConfig, w: M.Weights, user, src_ids, fed) -> list[np.ndarray]:
    """Float64 decoder rows for the same source and the same fed tokens (error metrics)."""
    x = M.embed(cfg, user["embed.src"], np.asarray(src_ids))
    st = M.RefDecodeState(cfg, w, M.ref_encoder(cfg, w, x))
    return [M.ref_decoder_step(cfg, w, st, M.embed(cfg, user["embed.tgt"], tok[:, None],
                                                   offset=t)[:, 0, :])
            for t, tok in enumerate(fed)]


@dataclass
class Translation:
    source: str
    secure: str
    plaintext: str | None = None

    @property
    def agrees(self) -> bool | None:
        return None if self.plaintext is None else self.secure == self.plaintext


def translate_texts(backend, cfg, user, texts: list[str], vocab=None, batch: int = 32,
                    on_token=None, plaintext_weights: M.Weights | None = None, parallel: int = 1
                    ) -> tuple[list[Translation], Traffic, list[tuple[list[int], list[int]]]]:
    """Translate ``texts`` securely (grouped by source length, at most ``batch`` per group).

    ``parallel`` > 1 runs that many groups at once, each in its own decode session (the
    parties run their jobs concurrently; latency-bound rounds overlap). ``on_token(t, tokens,
    probs, sources)`` reports every step of every group. The cost adds up every job's own
    wall time, so with ``parallel`` > 1 it exceeds the elapsed time.

    Returns the translations, the total cost (per layer too: ``.layers``) and the (secure,
    plaintext) token lists per text
    (with EOS; plaintext None unless ``plaintext_weights`` is given) for token agreement.
    """
    from app import textdata as TD
    vocab = vocab or TD.VOCAB
    ids = [TD.encode_src(t, vocab) for t in texts]     # ValueError on bad/over-long input
    for t, s in zip(texts, ids):
        if len(s) > cfg.max_len:
            raise ValueError(f"source {t!r} has {len(s)} tokens; the model takes at most "
                             f"{cfg.max_len}")
    results: list[Translation | None] = [None] * len(texts)
    pairs: list = [None] * len(texts)
    total = Traffic()
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(ids):
        groups.setdefault(len(s), []).append(i)
    parts = [idx[k:k + batch] for _, idx in sorted(groups.items())
             for k in range(0, len(idx), batch)]
    lock = threading.Lock()

    def run(part: list[int]) -> None:
        src = np.array([ids[i] for i in part])
        cb = None
        if on_token is not None:
            def cb(t, tok, probs, _srcs=[texts[i] for i in part]):
                with lock:
                    on_token(t, tok, probs, _srcs)
        res = decode_batch(backend, cfg, user, src, vocab.bos, vocab.eos,
                           vocab.max_tgt_len, cb)
        with lock:
            nonlocal total
            total += res.open_cost
            total += res.step_cost
            plain = None
            if plaintext_weights is not None:
                plain = M.greedy_decode(cfg, plaintext_weights, user, src, vocab.bos,
                                        vocab.eos, max_steps=vocab.max_tgt_len)
            for j, i in enumerate(part):
                results[i] = Translation(texts[i], TD.decode_tgt(res.tokens[j], vocab),
                                         None if plain is None else
                                         TD.decode_tgt(plain[j], vocab))
                pairs[i] = (_with_eos(res.tokens[j], vocab),
                            None if plain is None else _with_eos(plain[j], vocab))

    if parallel <= 1 or len(parts) == 1:
        for part in parts:
            run(part)
    else:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            for f in [pool.submit(run, part) for part in parts]:
                f.result()
    return results, total, pairs


def _with_eos(toks: list[int], vocab) -> list[int]:
    return list(toks) + ([vocab.eos] if len(toks) < vocab.max_tgt_len else [])


def token_agreement(pairs) -> tuple[int, int]:
    """(equal positions, compared positions) over (secure, plaintext) token lists."""
    same = total = 0
    for a, b in pairs:
        if b is None:
            continue
        n = max(len(a), len(b))
        total += n
        same += sum(1 for i in range(min(len(a), len(b))) if a[i] == b[i])
    return same, total


__all__ = ["ClusterBackend", "InprocBackend", "Traffic", "LayerCosts", "decode_batch",
           "translate_texts", "token_agreement", "Translation", "TranslationError",
           "TamperingDetected"]
