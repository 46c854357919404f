"""mpc3's Python API for the model owner and the query user (docs/API.md)::

    import app.api as mpc3api

    with mpc3api.Cluster.connect("cluster.toml", role="model-owner") as owner:
        owner.share_model("translator.npz", model_id="translator")
    with mpc3api.Cluster.connect("cluster.toml") as user:          # role="query-user"
        print(user.translate("translator", ["4096", "77"]))
        for piece in user.generate("lm", "12 = ", 14, model="lm.npz", stream=True):
            print(piece, end="", flush=True)
        print(user.last_costs)

The same flows as the ``mpc3`` commands (the CLI and this module call the same functions:
:mod:`app.owner`, :mod:`app.translate`, :mod:`app.generate`, :mod:`app.text`): the query
user's model file - embedding tables, output layer, tokenizer - stays in this process; only
secret shares of embedded inputs leave it, and only outputs the model's owner permitted
come back. A cluster runs only its job kinds (:data:`protocols.jobs.PRODUCTION`) on shared
models: there is no call to compute anything else, by design (docs/API.md). Errors are
the CLI's one-line exceptions: ``ValueError`` (bad input), ``net.client.failures.ClusterError`` (a
party refused or failed; a RuntimeError), ``OSError`` (files).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from mpc3 import ring
from net import config as cconf

from .translate import Traffic

ROLES = ("query-user", "model-owner")


@dataclass
class Costs:
    """What the last call cost, as the parties counted it: bytes and messages of all three
    parties together, rounds on the critical path, jobs run, the jobs' own seconds."""

    bytes_total: int
    bytes_per_party: list[int]
    messages: int
    rounds: int
    jobs: int
    wall_s: float

    @classmethod
    def of(cls, t: Traffic) -> "Costs":
        return cls(t.bytes_total, list(t.bytes_per_party), t.messages, t.rounds, t.jobs,
                   t.wall_s)

    def __str__(self) -> str:
        return (f"{self.bytes_total / 1e6:.3f} MB, {self.messages} messages, {self.rounds} "
                f"rounds, {self.jobs} jobs, {self.wall_s:.2f} s")


@dataclass
class PartyStatus:
    rank: int
    address: str
    up: bool
    error: str = ""
    links_up: list[int] = field(default_factory=list)
    models: int = 0
    jobs_running: int = 0
    jobs_queued: int = 0
    version: str = ""
    kernels_ready: bool = False


@dataclass
class Model:
    """A model as the parties list it (public metadata only)."""

    model_id: str
    kind: str                 # the architecture: encoder-decoder, decoder-only, ...
    permitted: list[str]      # computations its owner lets query users run
    upload_id: str
    owner: str
    parties: list[int]        # parties holding a complete copy
    states: list[str]         # each of those parties' state (verified, stored, corrupt)


@dataclass
class Classification:
    index: int
    label: str | None              # the class name when the model file has them
    logits: np.ndarray | None      # None for classify_argmax (only the class is revealed)


class Cluster:
    """A connection to the three parties as one role; a context manager (closes channels)."""

    def __init__(self, cfg: cconf.ClusterConfig, role: str = "query-user", cert=None,
                 key=None, rpc_timeout: float = 60.0, step_timeout: float = 120.0) -> None:
        from net.client.owner import ModelOwner
        from net.client.user import QueryUser
        if role not in ROLES:
            raise ValueError(f"role {role!r}: choose {' or '.join(ROLES)}")
        self.cfg, self.role, self.cert, self.key = cfg, role, cert, key
        self.step_timeout = step_timeout
        self.client = (QueryUser if role == "query-user" else ModelOwner)(
            cfg, cert, key, rpc_timeout=rpc_timeout)
        #: the cost of the last embed / classify / translate / generate call
        self.last_costs: Costs | None = None
        #: the token ids of the last generate call, per prompt row
        self.last_tokens: list[list[int]] | None = None

    @classmethod
    def connect(cls, config, role: str = "query-user", cert=None, key=None,
                insecure: bool = False, **kw) -> "Cluster":
        """``config``: the cluster TOML (or a :class:`net.config.ClusterConfig`); ``cert`` /
        ``key``: the client's certificate (default: ``[clients.ROLE]`` of the config)."""
        cfg = config if isinstance(config, cconf.ClusterConfig) else \
            cconf.load(config, insecure_flag=insecure)
        return cls(cfg, role, cert, key, **kw)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _need(self, role: str, what: str) -> None:
        if self.role != role:
            raise ValueError(f"{what} needs role {role!r}; this connection is "
                             f"{self.role!r} (Cluster.connect(..., role={role!r}))")

    # ---------------------------------------------------------------- any role ----
    def status(self) -> list[PartyStatus]:
        """Each party's status; a party that does not answer is ``up=False`` with why."""
        from net.proto import mpc3_pb2 as pb
        out = []
        for n, (st, err) in enumerate(self.client._settled(
                lambda n: self.client._call(n, "Status", pb.Empty(), 5.0))):
            addr = self.cfg.dial_address(None, n)
            if err is not None:
                out.append(PartyStatus(n, addr, False, str(err)))
                continue
            out.append(PartyStatus(n, addr, len(st.links_up) == 2, "", sorted(st.links_up),
                                   st.models, st.jobs_running, st.jobs_queued, st.version,
                                   st.kernels_ready))
        return out

    def doctor(self, job: bool = True):
        """``mpc3 doctor``'s checks (:func:`app.doctor.diagnose`): a Report whose
        ``lines`` describe every party and the test job and whose ``problems`` are empty
        when the cluster is fit to serve. The test job uses the config's owner and user
        certificates (``job=False``: the parties' status only)."""
        from .doctor import diagnose
        mine = (self.cert, self.key)
        return diagnose(self.cfg, job,
                        owner_creds=mine if self.role == "model-owner" else (None, None),
                        user_creds=mine if self.role == "query-user" else (None, None))

    def models(self) -> list[Model]:
        """The models on the cluster (from every party's list, merged)."""
        import json
        seen: dict[str, Model] = {}
        for n, models in enumerate(self.client.list_models()):
            for m in models:
                if not m.complete:
                    continue
                meta = json.loads(m.public_meta or "{}")
                got = seen.setdefault(m.model_id, Model(
                    m.model_id, meta.get("kind", ""), list(meta.get("permitted", [])),
                    m.upload_id, m.owner, [], []))
                got.parties.append(n)
                got.states.append(m.state)
        return [seen[k] for k in sorted(seen)]

    # ------------------------------------------------------------- model owner ----
    def share_model(self, path, model_id: str, permit: Sequence[str] | None = None,
                    samples=None, margin: float | None = None,
                    secret_embeddings: bool = False) -> str:
        """Calibrate the model file at ``path`` (.npz, .safetensors, or a Hugging Face /
        sentence-transformers directory) and share it as ``model_id``; ``permit``: the
        computations query users may run (default: the model's own inference);
        ``secret_embeddings``: its embedding tables (and an LM's head) are shared too
        (``share-model --secret-embeddings``; :meth:`embed` and :meth:`classify` find the
        mode). Returns the upload id; the parties hold verified copies when it returns."""
        from protocols.calibration import calibrate as C

        from .cli.common import load_model_file
        from .owner import calibration_samples, share_transformer
        self._need("model-owner", "share_model")
        mcfg, weights, user = load_model_file(str(path))
        cal = calibration_samples(mcfg, weights, user, samples)
        return share_transformer(self.cfg, model_id, mcfg, weights,
                                 None if permit is None else list(permit), self.cert,
                                 self.key, source=Path(path).name, user=user, samples=cal,
                                 margin=C.DEFAULT_MARGIN if margin is None else margin,
                                 secret_embeddings=secret_embeddings)

    def delete_model(self, model_id: str) -> None:
        self._need("model-owner", "delete_model")
        self.client.delete(model_id)

    # -------------------------------------------------------------- query user ----
    def _job(self, model_id: str, kind: str, x: np.ndarray, cost: Traffic,
             onehot: bool = False) -> dict:
        """``onehot``: x is one-hot rows (ring integers, shared as they are) for ONEHOT."""
        qu = self.client
        t0 = time.perf_counter()
        job = qu.submit(model_id, kind, {"ONEHOT" if onehot else "X": x}, encoded=onehot)
        st = qu.wait(job)                  # up to the cluster's job deadline, as qu.run
        out = {k: ring.decode(v, qu.frac) for k, v in qu.fetch(job).items()}
        cost.add_parties([(s.bytes_sent, s.messages, s.rounds) for s in st],
                         time.perf_counter() - t0)
        return out

    def _rows(self, model_id: str, kind: str, out_name: str, model, arch: str, texts,
              ids) -> tuple[np.ndarray, object]:
        from .text import model_inputs
        self._need("query-user", kind)
        mcfg, user, seqs = model_inputs(str(model), arch, texts, ids, kind)
        return self.run_rows(model_id, kind, out_name, mcfg, user, seqs, str(model)), mcfg

    def run_rows(self, model_id: str, kind: str, out_name: str, mcfg, user, seqs,
                 local_name: str) -> np.ndarray:
        """The output ``out_name`` of job ``kind`` for each token sequence of ``seqs``
        (one job per token length, rows in input order), embedded with the user tensors
        ``user`` of the local model file ``local_name`` (config ``mcfg``), which must be
        the shared model's: what embed and classify (and ``mpc3 embed`` / ``classify``)
        run. A model whose owner keeps its embedding tables secret (``share-model
        --secret-embeddings``) is sent the sequences' one-hot rows instead, by the job kind
        :data:`app.text.SECRET_KINDS` names."""
        from .cli.common import check_same_model
        from .text import SECRET_KINDS, run_grouped
        from .translate import ClusterBackend
        self._need("query-user", kind)
        backend = ClusterBackend(self.client, model_id)
        check_same_model(backend.model_config(), mcfg, model_id, local_name)
        secret = backend.secret_embeddings()          # one-hot rows in, as its owner chose
        kind = SECRET_KINDS.get(kind, kind) if secret else kind
        cost = Traffic()
        rows = run_grouped(lambda x: self._job(model_id, kind, x, cost, secret)[out_name],
                           mcfg, user, seqs, secret)
        self.last_costs = Costs.of(cost)
        return rows

    def embed(self, model_id: str, texts: Sequence[str] | None = None, *, model,
              ids: Sequence[int] | None = None) -> np.ndarray:
        """Sentence embeddings (N, d) of ``texts`` (or one input of token ``ids``) with a
        shared headless encoder; ``model``: its file with the query-user part."""
        return self._rows(model_id, "embed", "E", model, "encoder", texts, ids)[0]

    def classify(self, model_id: str, texts: Sequence[str] | None = None, *, model,
                 ids: Sequence[int] | None = None,
                 argmax: bool = False) -> list[Classification]:
        """The class of each text with a shared encoder classifier; ``argmax``: the
        ``classify_argmax`` job, which reveals only the class (all that an owner permitting
        only classify-argmax lets a user learn)."""
        from protocols.model import load_labels
        kind = "classify_argmax" if argmax else "classify"
        rows, _ = self._rows(model_id, kind, "class" if argmax else "logits", model,
                             "encoder-classifier", texts, ids)
        labels = load_labels(str(model))
        out = []
        for row in rows:
            k = int(round(float(row))) if argmax else int(np.argmax(row))
            out.append(Classification(k, labels[k] if labels and 0 <= k < len(labels)
                                      else None, None if argmax else row))
        return out

    def translate(self, model_id: str, texts: Sequence[str], *, model=None) -> list[str]:
        """Translations of ``texts`` (digits to English words with the shipped translator;
        ``model``: another translator file with the query-user tensors)."""
        from .cli.common import check_same_model
        from .translate import ClusterBackend, translate_texts
        self._need("query-user", "translate")
        mcfg, user, vocab = translator_side(model)
        backend = ClusterBackend(self.client, model_id, step_timeout=self.step_timeout)
        check_same_model(backend.model_config(), mcfg, model_id,
                         str(model or "the shipped translator"))
        res, cost, _ = translate_texts(backend, mcfg, user, list(texts), vocab)
        self.last_costs = Costs.of(cost)
        return [r.secure for r in res]

    def generate(self, model_id: str, prompt: str | None = None, max_new_tokens: int = 16,
                 *, model, ids: Sequence[int] | None = None, stream: bool = False):
        """Continue ``prompt`` (text; or token ``ids``) by ``max_new_tokens`` tokens with a
        shared decoder-only LM; ``model``: its file with the query-user part. Returns the
        text, or with ``stream=True`` an iterator of text pieces as the tokens arrive (the
        session is closed if the iteration stops early). Token ids go to
        :attr:`last_tokens`, the cost to :attr:`last_costs`."""
        from .cli.common import check_same_model
        from .translate import ClusterBackend
        from .text import lm_prompt
        self._need("query-user", "generate")
        mcfg, user, prompt_ids, text, eos = lm_prompt(str(model), prompt, ids)
        backend = ClusterBackend(self.client, model_id, step_timeout=self.step_timeout)
        check_same_model(backend.model_config(), mcfg, model_id, str(model))
        it = self._generate(backend, mcfg, user, prompt_ids, max_new_tokens, text, eos)
        return it if stream else "".join(it)

    def _generate(self, backend, mcfg, user, prompt_ids, n, stream, eos) -> Iterator[str]:
        """The pieces of text as generate() runs on a worker thread (``stream``: the
        prompt's text stream, None to show token ids)."""
        from .generate import generate
        pieces: queue.Queue = queue.Queue()
        stop = threading.Event()

        class Stopped(Exception):
            pass

        def on_token(k: int, tok: np.ndarray) -> None:
            if stop.is_set():
                raise Stopped
            t = int(tok[0])
            if eos is None or t != eos:
                pieces.put(stream.feed(t) if stream is not None else f"{t} ")

        def run() -> None:
            try:
                res = generate(backend, mcfg, user, np.array([prompt_ids]), n, eos=eos,
                               on_token=on_token)
                self.last_tokens = res.tokens
                total = Traffic()
                total += res.prefill_cost
                total += res.step_cost
                self.last_costs = Costs.of(total)
                pieces.put(stream.flush() if stream is not None else "")
                pieces.put(None)
            except Stopped:
                pieces.put(None)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                pieces.put(exc)

        worker = threading.Thread(target=run, daemon=True, name="mpc3-api-generate")
        worker.start()
        try:
            while True:
                got = pieces.get()
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                if got:
                    yield got
        finally:
            stop.set()
            worker.join()


def translator_side(path=None):
    """(config, user tensors, vocabulary) of the query user's translator: the shipped one
    unless ``path`` names another model file holding the query-user tensors."""
    from protocols import model as M
    from app import textdata as TD
    if path is None:
        if not TD.SHIPPED_MODEL.exists():
            raise FileNotFoundError(f"shipped model {TD.SHIPPED_MODEL} is missing; pass "
                                    "model=PATH")
        mcfg, _, user, vocab = TD.load_shipped()
        return mcfg, user, vocab
    mcfg, _, user = M.load_model(path)
    if not user:
        raise ValueError(f"{path} holds no query-user tensors (embed.src, embed.tgt, out.*)")
    return mcfg, user, TD.VOCAB


__all__ = ["Cluster", "Costs", "Classification", "Model", "PartyStatus", "ROLES"]
