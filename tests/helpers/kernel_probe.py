"""Test-only probe: what a SECURE run hands its range-limited kernels, measured the way the
calibration measures it.

:class:`Probe` wraps, for the duration of a test (pytest's ``monkeypatch``), every kernel
entry point a shadow party takes over at (:data:`ENTRIES`) and gives real parties a scoped
``p.at`` (:class:`Scoped`: the same party, carrying the layer the stack names). A top-level
call that names a calibration site (its ``site=`` / ``sites=`` keyword) is kept with its
layer and arguments, per party. After the run the arguments are reconstructed from the three
parties' shares and handed to the same-named method of a :class:`mpc3.shadow.ShadowParty`
recording into a :class:`protocols.calibration.shadow.ShadowRecorder`: ``values`` then holds,
in the calibration's units, what the secure parties' kernels received - which the
calibration (the stacks on a shadow party, each kernel's ideal functionality) claims to have
recorded. Calls made inside another probed kernel are the kernel's own business.

A real party that runs several decoder layers' cross attention in one call
(:func:`protocols.layers.cross.cross_precompute`, :func:`protocols.stacks.decoder.fold_wo_into_kv`)
names no layer there; its records are filed under :data:`ALL_CROSS`, and
:func:`compare` checks them against the largest of the shadow's per-layer records.
"""
from __future__ import annotations

import inspect
import sys
import threading

import numpy as np
import pytest

from mpc3.kernels import activations, arith, convert, extrema, fxp, silu
from mpc3.kernels.base import group_bounds
from mpc3.party import Party, RingConfig
from mpc3.shadow import ShadowParty
from mpc3.shares import AShare, SplitShare
from mpc3.sharing import reveal
from protocols.calibration.shadow import ShadowRecorder
from protocols.layers import vocab

#: (module, kernel) -> the ShadowParty method that stands for it
ENTRIES = {(arith, "mul_aa"): "mul_aa", (arith, "matmul_aa"): "matmul_aa",
           (arith, "mul_many_aa"): "mul_many_aa", (arith, "mul_many_steps"): "mul_many_aa",
           (arith, "mul_split_aa"): "mul_split_aa", (convert, "relu_a"): "relu_a",
           (convert, "drelu_a"): "drelu_a", (fxp, "sqrt_inv_a"): "sqrt_inv_a",
           (fxp, "sqrt_inv_steps"): "sqrt_inv_a", (fxp, "reciprocal_a"): "reciprocal_a",
           (fxp, "exp_a"): "exp_a", (fxp, "exp_neg_a"): "exp_neg_a",
           (activations, "gelu_a"): "gelu_a", (activations, "tanh_a"): "tanh_a",
           (silu, "silu_a"): "silu_a", (extrema, "max_rows_a"): "max_rows_a",
           (vocab, "argmax_a"): "argmax_a"}
#: the layer of a call no ``p.at`` scope names (several decoder layers' cross attention)
ALL_CROSS = ""


class Scoped:
    """A real party seen through ``p.at(layer)``: every attribute is the party's (reads and
    writes), ``probe_layer`` the scope."""

    def __init__(self, party: Party, layer: str) -> None:
        object.__setattr__(self, "_party", party)
        object.__setattr__(self, "probe_layer", layer)

    def __getattr__(self, name):
        return getattr(self._party, name)

    def __setattr__(self, name, value) -> None:
        setattr(self._party, name, value)

    def at(self, layer: str) -> "Scoped":
        return Scoped(self._party, layer)


def _reveal_any(shares) -> np.ndarray:
    """reveal, or for SplitShares (arith.mul_split_aa) A + B per element group: role 0 of
    group g is rank g % 3 (its a + b), role 1 the next rank (its b)."""
    if not isinstance(shares[0], SplitShare):
        return reveal(shares)
    flat = [s.reshape(-1) for s in shares]
    out = np.empty(flat[0].size, dtype=np.uint64)
    for g, sl in enumerate(group_bounds(out.size)):
        single, pair = flat[g % 3], flat[(g + 1) % 3]
        out[sl] = single.a[sl] + single.b[sl] + pair.b[sl]
    return out.reshape(shares[0].shape)


def _plain(per_party):
    """The three parties' values of one argument -> the shadow party's: shares revealed
    (as AShare(x, 0)), lists and tuples item by item, public values as party 0 holds them."""
    first = per_party[0]
    if isinstance(first, (AShare, SplitShare)):
        v = _reveal_any(per_party)
        return AShare(v, np.zeros_like(v))
    if type(first) in (list, tuple):
        return type(first)(_plain(items) for items in zip(*per_party))
    return first


class Probe:
    def __init__(self, monkeypatch) -> None:
        self.calls: dict[int, list] = {0: [], 1: [], 2: []}
        self.local = threading.local()
        monkeypatch.setattr(Party, "at", lambda p, layer: Scoped(p, layer))
        for (mod, name), method in ENTRIES.items():
            fn = getattr(mod, name)
            wrapped = self._wrap(fn, method)
            for m in list(sys.modules.values()):       # every binding of the kernel
                if getattr(m, "__name__", "").split(".")[0] in ("mpc3", "protocols") \
                        and vars(m).get(name) is fn:
                    monkeypatch.setattr(m, name, wrapped)

    def _wrap(self, fn, method: str):
        sig = inspect.signature(fn)
        steps = inspect.isgeneratorfunction(fn)

        def wrapped(p, *args, **kw):
            depth = getattr(self.local, "depth", 0)
            if depth == 0:
                bound = sig.bind(p, *args, **kw).arguments
                if bound.get("site") or any(bound.get("sites") or ()):
                    self.calls[p.rank].append((getattr(p, "probe_layer", ALL_CROSS), method,
                                               bound))
            if steps:              # a steps kernel's body runs later, inside lockstep
                return self._steps(fn(p, *args, **kw))
            self.local.depth = depth + 1
            try:
                return fn(p, *args, **kw)
            finally:
                self.local.depth = depth
        return wrapped

    def _steps(self, gen):
        value = None
        while True:
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1
            try:
                r = gen.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                self.local.depth = depth
            value = yield r

    def values(self, ring: RingConfig = RingConfig()) -> dict:
        """``values[layer][site]`` (a ShadowRecorder's) of every probed call."""
        rec = ShadowRecorder(ring)
        assert [len(c) for c in self.calls.values()] == [len(self.calls[0])] * 3
        for per in zip(*(self.calls[r] for r in range(3))):
            layer, method, bound = per[0]
            fn = getattr(ShadowParty(ring, rec, layer), method)
            names = inspect.signature(fn).parameters
            fn(**{k: _plain([c[2][k] for c in per]) for k in bound if k in names})
        return rec.values


def compare(probed: dict, shadow: dict, rtol: float, bounded=lambda layer, site: False) -> None:
    """Every (layer, site) the secure run reached was recorded by the shadow with the same
    value (``rtol``: the secure run's fixed-point error), or at least that value where
    ``bounded(layer, site)`` (a site the shadow reaches on more inputs than a secure run).
    A site of :data:`ALL_CROSS` (several decoder layers' cross attention in one call) is
    compared as the largest over the decoder layers' cross attentions, where a layer's own
    calls only bound it."""
    joint = probed.get(ALL_CROSS, {})
    for layer, row in probed.items():
        for site, got in row.items():
            if layer == ALL_CROSS:
                per = [r[site] for lay, r in shadow.items() if lay.endswith(".cross") and site in r]
                assert per, f"cross attention site {site} not in the shadow's records"
                got = max([got] + [r[site] for lay, r in probed.items()
                                   if lay.endswith(".cross") and site in r])
                np.testing.assert_allclose(got, max(per), rtol=rtol, err_msg=f"cross.{site}")
                continue
            assert site in shadow.get(layer, {}), f"{layer}.{site} not recorded by the shadow"
            want = shadow[layer][site]
            if (layer.endswith(".cross") and site in joint) or bounded(layer, site):
                assert got <= want * (1 + rtol), f"{layer}.{site}: {got} > {want}"
            else:
                np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f"{layer}.{site}")


def reached(probed: dict, n_dec_layers: int) -> set:
    """(layer, site) of every record, those of :data:`ALL_CROSS` as every decoder layer's."""
    return {(lay, s) for layer, row in probed.items() for s in row
            for lay in ([layer] if layer != ALL_CROSS else
                        [f"dec.{i}.cross" for i in range(n_dec_layers)])}


def secure_trace(cfg, w, X, Y=None, fold: bool = True, block: int | None = None,
                 ring: RingConfig = RingConfig(), seed: int | None = 0,
                 beyond: frozenset = frozenset()) -> dict:
    """What a secure run on three in-process parties hands its range-limited kernels
    (:meth:`Probe.values`) when it runs what the calibration's driver for ``cfg.arch``
    (:func:`protocols.calibration.shadow.trace`, without a secret head) runs on a shadow party:
    the same passes over the samples ``X`` (and targets ``Y``), the same sessions and
    schedules, each input row as the parties would receive it. ``seed`` fixes the run: the
    model's and the inputs' shares and every job's PRG keys (the same run every time; None:
    fresh ones). ``beyond``: attention sublayers whose decode-step o W^O is past the
    deferred W^O's exact range (site ``wo_raw`` >= ``arith.product_limit(frac, frac)``), left
    out of the deferred-W^O passes - the parties' truncation by 2 frac fails there (13-37 % of
    the elements, a 2^(64 - 3 frac) error each), as the calibration's schedule choice
    (:func:`protocols.stacks.schedule.deferred_wo`) never has it run."""
    from protocols import model as M
    from protocols.calibration.shadow import rows
    from protocols.layers.secure_model import share_model
    from protocols.stacks import causal_lm as LM
    from protocols.stacks import decoder as D
    from protocols.stacks.classifier import classify
    from protocols.stacks.encoder import encoder
    from protocols.stacks.schedule import Schedule
    from protocols.stacks.sentence import embed_sentence
    from mpc3 import ring as R
    from mpc3.sharing import deal
    from mpc3.sim import make_parties, run_parties

    every = frozenset(f"dec.{i}.{k}" for i in range(cfg.n_dec_layers) for k in ("self", "cross"))
    performer = cfg.attention == M.PERFORMER

    def job(p, s, x, y):
        if cfg.arch == M.ENCODER_CLASSIFIER:
            classify(p, cfg, s, x)
        elif cfg.arch == M.ENCODER:
            embed_sentence(p, cfg, s, x)
        elif cfg.arch == M.DECODER_ONLY:
            for t in range(1, x.shape[1] + 1):     # the calibration's prefill takes every
                LM.lm_prefill(p, cfg, s, x[:, :t], block)   # row on: the prompt ending there
            lm_self = frozenset(k for k in every if k.endswith(".self")) - beyond
            for raw in [frozenset()] + [lm_self] * performer:
                st = LM.lm_open(p, cfg, s, x.shape[0], block, LM.DEFAULT_LM_FUSE,
                                Schedule(raw_wo=raw))
                for t in range(x.shape[1]):
                    LM.lm_step(p, cfg, s, st, x[:, t])
        else:
            enc = encoder(p, cfg, s, x)
            sessions = [(frozenset(), frozenset(), True)]
            sessions += [(every - beyond, frozenset(), True),
                         (frozenset(), every, False)] * performer
            for raw, fold_wo, steps in sessions if cfg.n_dec_layers else ():
                st = D.DecodeState.start(p, cfg, s, enc, block, D.DEFAULT_FUSE,
                                         Schedule(raw_wo=raw, fold_wo=fold_wo))
                for t in range(y.shape[1] if steps else 0):
                    D.decoder_step(p, cfg, s, st, y[:, t])

    rng = None if seed is None else np.random.default_rng(seed)

    def dealt(a):
        return deal(R.encode(np.asarray(a, dtype=np.float64), ring.frac), rng) \
            if a is not None else [None] * 3

    sh = share_model(cfg, w, fold_omega=fold, frac=ring.frac, rng=rng)
    jobs = 0
    with pytest.MonkeyPatch.context() as mp:
        probe = Probe(mp)
        for i, x in enumerate(X):
            y = Y[i] if Y is not None else None
            parts = [(c, None) for c in rows(cfg, x)] if cfg.arch in (M.ENCODER_CLASSIFIER,
                                                                      M.ENCODER) else [(x, y)]
            for c, cy in parts:
                xs, ys = dealt(c), dealt(cy)
                keys = None if seed is None else b"probe %d job %d" % (seed, jobs)
                run_parties(job, [(sh[r], xs[r], ys[r]) for r in range(3)],
                            parties=make_parties(ring, seed=keys))
                jobs += 1
    return probe.values(ring)
