"""Test-only probe: the values that reach range-limited kernels in a SECURE run.

:class:`Probe` wraps the kernel entry points (mul_aa, matmul_aa, mul_many_aa, trunc_a, relu_a,
drelu_a, sqrt_inv_a, reciprocal_a, exp_a) for three in-process parties. Each top-level call
(calls made inside another wrapped kernel, e.g. sqrt_inv_a's Newton products, are the kernel's
own business) is attributed from the call stack to a calibration site (layer, site) of
:mod:`protocols.calibration.site_catalog`; a call that matches no site fails the test, naming the
source line. After the run the operands are reconstructed from the three parties' shares and each
call's largest value is computed exactly in the ring: for a product the untruncated result (real
value = raw / 2^(2 frac + extra), so raw / 2^62 is the fraction of its limit used), for relu
the input, for sqrt_inv the input's minimum and maximum.
"""
from __future__ import annotations

import linecache
import sys
import threading
from collections import defaultdict

import numpy as np

from mpc3 import ring
from mpc3.kernels import arith, convert, fxp, truncation
from mpc3.kernels.base import group_bounds
from mpc3.shares import SplitShare
from mpc3.sharing import reveal

KERNELS = ((arith, "mul_aa"), (arith, "matmul_aa"), (arith, "mul_many_aa"),
           (arith, "mul_split_aa"), (truncation, "trunc_a"),
           (convert, "relu_a"), (convert, "drelu_a"), (fxp, "sqrt_inv_a"),
           (fxp, "reciprocal_a"), (fxp, "exp_a"))
#: kernels written as lockstep steps (generators), recorded under the name of their
#: blocking form: calls made while they run are theirs
STEPS = {(fxp, "sqrt_inv_steps"): "sqrt_inv_a", (arith, "mul_many_steps"): "mul_many_aa"}
HELPERS = {"mul_many", "relu_many", "relu_products", "wrapped",
           "activation", "<lambda>", "relu_split", "relu_outputs"}
SUBLAYER = {"mha": "attn", "ffn": "ffn", "ffn_hidden": "ffn", "_self_step": "self",
            "_cross_step": "cross"}


class UnmappedCall(AssertionError):
    pass


def _reveal_any(shares):
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


def _frames():
    f = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.startswith("protocols."):
            yield f
        f = f.f_back


def _layer(frames) -> str:
    kind = None
    for f in frames:
        name = f.f_code.co_name
        if name == "_ln":
            return f.f_locals["prefix"]
        if name == "ln_proj":
            return f.f_locals["ln"]
        if name == "fused_biases":                 # items of several layers: sites say which
            return "dec.*"
        if name in ("cross_precompute", "start"):
            return "dec.*.cross"
        if kind is None and name in SUBLAYER:
            kind = SUBLAYER[name]
        if kind is None and name == "sublayer":     # decoder_step: split features' ReLU
            kind = f.f_locals["kind"]
        if name == "decoder_step" and "pre" not in f.f_locals:
            return "dec.0.self"                # the first layer's own projection
        if name in ("encoder_layer", "decoder_step"):
            return f"{f.f_locals['pre']}.{kind}"
    raise UnmappedCall("kernel call outside an encoder layer / decode step")


def _sites(inner, kernel: str, n_items: int) -> list[str]:
    """Site of each product item (one entry unless mul_many_aa)."""
    fn = inner.f_code.co_name
    text = linecache.getline(inner.f_code.co_filename, inner.f_lineno)
    one = None
    if fn == "project" or (fn == "project_features" and kernel != "relu_a"):
        return ["proj"] * n_items
    if fn in ("project_features", "_cross_features") and kernel == "relu_a":
        return ["features"]
    if fn == "_cross_features":     # K' per decoder layer, then V of all layers (one item)
        return [f"dec.{i}.cross|proj" for i in range(n_items - 1)] + ["proj"]
    if fn == "features":
        one = "omega" if kernel == "matmul_aa" else "features"
    elif fn in ("cross_precompute", "_with_kv"):
        one = {"enc, wcat": "proj", "kst, om": "omega", "kf.T, vst": "kv"}.get(
            next((k for k in ("enc, wcat", "kst, om", "kf.T, vst") if k in text), None),
            "features" if kernel == "relu_a" else None)
    elif fn == "relu_attention":
        one = next((s for k, s in (("kf.T, v", "kv"), ("qf, kv", "out"), ("qf, kf.T", "scores"),
                                   ("a, v", "out")) if k in text), None)
    elif fn == "attention_step":
        if kernel == "mul_many_aa":
            st = inner.f_locals["state"]
            return ["scores"] + ["out"] * bool(st.folded) + ["kv"] * bool(inner.f_locals["fold"])
        one = "out"
    elif fn == "cross_attention_step":
        one = "out"
    elif fn == "fold_wo_into_kv":               # (K'^T V)_h W^O_h of every decoder layer
        one = "kvwo"
    elif fn == "_cross_step":                   # a folded W^O: o W^O = Q' M in one product
        one = "wo"
    elif fn == "finish":            # the 1/n row scale rides in its truncation, or (raw: a
        one = "wo_raw" if inner.f_locals.get("raw") else "wo"   # deferred one) is applied
    elif fn == "decoder_step" and kernel == "mul_many_aa":   # the first layer's projection
        return ["proj"] * n_items
    elif fn == "step_project":                          # decode step: split, then plain
        loc = inner.f_locals
        names = loc["split"] + loc["plain"] if kernel == "mul_split_aa" else loc["plain"]
        return [f"{w.rsplit('.', 1)[0]}|{'w1' if w.endswith('.w1') else 'proj'}"
                for w in names]
    elif fn == "sublayer" and kernel == "relu_a":            # decode step: split features
        one = "features"
    elif fn == "fused_biases":                      # beta W of each fused LayerNorm projection
        ln = inner.f_locals["ln"]
        return [f"{ln}|{'lnw1' if w.endswith('.w1') else 'lnproj'}" for w in inner.f_locals["ws"]]
    elif fn == "layernorm_project":
        if kernel == "mul_many_aa" and "rs" not in inner.f_locals:   # (x - mu) gamma W_i
            return ["lnw1" if bits == inner.f_locals["p"].cfg.frac else "lnproj"
                    for _, bits in inner.f_locals["mats"]]
        if kernel == "mul_many_aa":
            k = len(inner.f_locals["keep"])
            return ["scale"] * (n_items - k) + ["lnscale"] * k
        if kernel == "mul_split_aa":       # products feeding relu_a, then xg and the rest
            k, ns = len(inner.f_locals["keep"]), len(inner.f_locals["split"])
            return ["lnscale"] * ns + ["scale"] * (n_items - ns - k) + ["lnscale"] * k
        one = "var_eps" if kernel == "sqrt_inv_a" else None
    elif fn == "batchnorm":                     # norm batchnorm: x * scale
        one = "bn"
    elif fn in ("layernorm", "_stats"):
        if kernel == "mul_many_aa":
            return ["sumsq", "sum2", "xgamma"]
        one = {"sqrt_inv_a": "var_eps", "mul_aa": "scale"}.get(kernel)
    elif fn in ("ffn", "ffn_hidden"):
        one = "hidden" if kernel == "relu_a" else \
            "w1" if 'w["w1"]' in text else "w2" if 'w["w2"]' in text else None
    if one is None:
        raise UnmappedCall(f"{kernel} called from {inner.f_globals['__name__']}.{fn}:"
                           f"{inner.f_lineno} `{text.strip()}` is not a calibration site")
    return [one] * n_items


class Probe:
    def __init__(self, monkeypatch, n_dec_layers: int) -> None:
        self.calls: dict[int, list] = {0: [], 1: [], 2: []}
        self.local = threading.local()
        self.n_dec = n_dec_layers
        for mod, name in KERNELS:
            monkeypatch.setattr(mod, name, self._wrap(name, getattr(mod, name)))
        for (mod, name), kernel in STEPS.items():
            monkeypatch.setattr(mod, name, self._wrap_steps(kernel, getattr(mod, name)))

    def _wrap_steps(self, kernel, fn):
        """A steps kernel: recorded when called, its body runs one level deeper."""
        def wrapped(p, *args, **kw):
            self._record(kernel, p, args, kw)
            gen = fn(p, *args, **kw)

            def steps():
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
            return steps()
        return wrapped

    def _record(self, kernel, p, args, kw):
        if getattr(self.local, "depth", 0) == 0:
            frames = list(_frames())
            inner = next(f for f in frames if f.f_code.co_name not in HELPERS)
            seen = args
            if kernel == "mul_split_aa":              # its completed items too
                seen = (list(args[0]) + list(kw.get("replicated", ())),) + args[1:]
            n = len(seen[0]) if kernel in ("mul_many_aa", "mul_split_aa") else 1
            self.calls[p.rank].append((kernel, _layer(frames), _sites(inner, kernel, n),
                                       seen, kw))

    def _wrap(self, kernel, fn):
        def wrapped(p, *args, **kw):
            self._record(kernel, p, args, kw)
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1
            try:
                return fn(p, *args, **kw)
            finally:
                self.local.depth = depth
        return wrapped

    # ------------------------------------------------------------------ after the run ----
    def _split(self, layer: str, arr: np.ndarray, axis: int):
        if layer != "dec.*.cross":
            return [(layer, arr)]
        parts = np.split(arr, self.n_dec, axis=axis)
        return [(f"dec.{i}.cross", part) for i, part in enumerate(parts)]

    def values(self, frac: int, relu_limit: float) -> dict:
        """(layer, site) -> largest fraction of its product/relu limit, or (min, max) real
        for var_eps, over every probed call."""
        out: dict = defaultdict(float)
        spans: dict = {}
        for per in zip(*(self.calls[r] for r in range(3))):
            kernel, layer, sites, _, _ = per[0]
            args = [c[3] for c in per]
            if kernel in ("mul_many_aa", "mul_split_aa"):
                prods = []
                for k in range(len(args[0][0])):
                    item = [a[0][k] for a in args]
                    x, y = reveal([i[0] for i in item]), reveal([i[1] for i in item])
                    z = x * y if item[0][2] == "mul" else ring.matmul(x, y)
                    if len(item[0]) > 4:
                        z = np.where(np.broadcast_to(item[0][4], z.shape), z, np.uint64(0))
                    prods.append(z)
            elif kernel in ("mul_aa", "matmul_aa"):
                x, y = reveal([a[0] for a in args]), reveal([a[1] for a in args])
                prods = [x * y if kernel == "mul_aa" else ring.matmul(x, y)]
            elif kernel == "trunc_a":
                prods = [reveal([a[0] for a in args])]
            else:
                prods = None
            if prods is not None:
                for site, z in zip(sites, prods):
                    axis = -1 if site == "proj" else 0
                    if "|" in site:                      # fused_biases: "layer|site"
                        lay, site = site.split("|")
                        pairs = [(lay, z)]
                    else:
                        pairs = self._split(layer, z, axis)
                    for lay, part in pairs:
                        fill = float(np.abs(ring.to_signed(part).astype(np.float64)).max()) \
                            / 2.0 ** arith.OFFSET_BITS
                        out[(lay, site)] = max(out[(lay, site)], fill)
                continue
            x = ring.decode(_reveal_any([a[0] for a in args]), frac)
            if kernel == "relu_a":
                x = x.reshape(self.n_dec, -1) if layer == "dec.*.cross" else x
                for lay, part in self._split(layer, x, 0):
                    out[(lay, sites[0])] = max(out[(lay, sites[0])],
                                               float(np.abs(part).max()) / relu_limit)
            elif kernel == "sqrt_inv_a":
                lo, hi = spans.get((layer, "var_eps"), (np.inf, -np.inf))
                spans[(layer, "var_eps")] = (min(lo, float(x.min())), max(hi, float(x.max())))
            else:
                raise UnmappedCall(f"{kernel} reached from {layer}: no model site uses it")
        return {**out, **spans}
