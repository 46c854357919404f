"""A float64 trace of the secure model that measures the values reaching its range-limited
kernel sites (:mod:`protocols.calibration.site_catalog`: :data:`SITES`, :func:`site_range`).

Test-only since issue 34 (it was ``protocols/sites.py``, the calibration):
:func:`protocols.calibration.calibrate.calibrate` runs the secure stacks themselves on a shadow
party (:mod:`protocols.calibration.shadow`, docs/CALIBRATION.md). The trace is frozen here as an
independent oracle for the architectures it knows - tests/protocols/calibration/test_shadow.py
compares the shadow's records with it, other tests that it computes the float64 reference - and
a new layer or architecture is not added to it (docs/CALIBRATION.md, "Status").

A *site* is a place where the secure encoder (:func:`protocols.stacks.encoder.encoder`) or the
secure incremental decoder (:meth:`protocols.stacks.decoder.DecodeState.start` +
:func:`decoder_step`) hands a value to a kernel that is exact only on a documented range.

Every site is measured per layer in the secure protocol's own
representation - attn_c folded as s = |c|^(1/3) into W^Q, W^K and c/s^2 into W^V
(:func:`protocols.layers.secure_model.fold_scales`), Omega folded or not, LayerNorm's sum of squares
before its 1/d, unnormalised attention sums before the ``mean`` row scaling, and the decode
steps' partial products with the decode block of :class:`protocols.layers.attention.PrefixState`.

:class:`Trace` runs the same computation as :mod:`protocols.model.reference` in float64 and
records the largest magnitude reaching each site (for ``var_eps`` its minimum and maximum).
Its outputs equal the reference's (tests check it); the secure run differs from these values
by its fixed-point error only (~1e-3 relative after a LayerNorm).
"""
from __future__ import annotations

import numpy as np

from mpc3.kernels import fxp
from protocols import model as M
from protocols.layers.attention import default_decode_block
from protocols.model import variants as MV
from protocols.layers.secure_model import fold_scales
from protocols.calibration.site_catalog import SITES, Site, site_range

__all__ = ["SITES", "Recorder", "Site", "Trace", "site_range"]


#: secure weight share name -> the trace's weight name (ln_fused targets)
_TRACE_NAME = {"wq_proj": "wq", "wk_proj": "wk", "wv_c": "wv", "w1": "w1"}


def _targets(fusions: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    """ln prefix -> (prefix, trace name) of each projection it forms (:meth:`Trace.ln_fused`)."""
    return {ln: [(w.rsplit(".", 1)[0], _TRACE_NAME[w.rsplit(".", 1)[1]]) for w in names]
            for ln, names in fusions.items()}


def _bias(y: np.ndarray, w: dict, name: str, scale: float = 1.0) -> np.ndarray:
    """y + scale * w[name] when the model has that attention bias (added after the
    product, as the secure protocol does, so the product sites record y alone)."""
    return y + scale * w[name] if name in w else y


class _Below:
    """``w[prefix + "." + name]`` as ``view[name]`` (Trace.sub)."""

    def __init__(self, w: M.Weights, prefix: str) -> None:
        self.w, self.p = w, prefix + "."

    def __getitem__(self, name: str) -> np.ndarray:
        return self.w[self.p + name]

    def __contains__(self, name: str) -> bool:
        return self.p + name in self.w


class Recorder:
    """(layer, site) -> largest |value| seen; ``var_eps`` keeps (min, max)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, float | list[float]]] = {}

    def mag(self, layer: str, site: str, *arrays: np.ndarray) -> None:
        # max |a| as max(max a, -min a): no |a| copy of the (often largest) activation;
        # np.maximum keeps a NaN as np.max(np.abs(a)) did
        v = max((float(np.maximum(a.max(), -a.min())) for a in arrays if a.size), default=0.0)
        row = self.values.setdefault(layer, {})
        row[site] = max(row.get(site, 0.0), v)

    def span(self, layer: str, site: str, a: np.ndarray) -> None:
        row = self.values.setdefault(layer, {})
        lo, hi = row.get(site, [np.inf, -np.inf])
        row[site] = [min(lo, float(a.min())), max(hi, float(a.max()))]


class Trace:
    """Float64 mirror of the secure stacks that feeds a :class:`Recorder`."""

    def __init__(self, cfg: M.ModelConfig, weights: M.Weights, fold_omega: bool = True,
                 decode_block: int | None = None, rec: Recorder | None = None) -> None:
        self.cfg, self.w, self.fold, self.c_out = cfg, weights, fold_omega, None
        if cfg.ffn_bn:                    # traced as shared: the MLP's BatchNorm folded in,
            self.cfg, self.w = M.fold_ffn_bn(cfg, weights)
        if cfg.ffn_scale:                 # AERO's FFN scales too
            self.cfg, self.w, self.c_out = M.fold_ffn_scales(self.cfg, self.w)
        self.block = (default_decode_block(cfg.n_features, cfg.d_head) if decode_block is None
                      else int(decode_block))
        self.rec = rec or Recorder()
        self.sq, self.sk, self.vs = fold_scales(self.cfg)
        self.attn = {p: self.sub(p) for p in M.attn_prefixes(self.cfg)}
        self._linear: tuple[str, tuple[np.ndarray, np.ndarray]] | None = None

    def sub(self, prefix: str) -> "_Below":
        """The weights below ``prefix``, each looked up when used: a model read from its
        file (protocols.model.OnDemandTensors) is then held one tensor at a time."""
        return _Below(self.w, prefix)

    # ------------------------------------------------------------ building blocks ----
    def ln(self, layer: str, x: np.ndarray, want_y: bool = True) -> np.ndarray:
        """The model's normalization (cfg.norm; protocols.layers.norms)."""
        w, d, rec = self.sub(layer), x.shape[-1], self.rec
        if self.cfg.norm != "layernorm":
            if self.cfg.norm == "none":
                return x
            a, b = M.batchnorm_affine(w["gamma"], w["beta"], w["mean"], w["var"],
                                      self.cfg.ln_eps)
            rec.mag(layer, "bn", x * a)
            return x * a + b
        mu = x.mean(-1, keepdims=True)
        xc = x - mu
        xg = xc * w["gamma"]
        var = (xc * xc).sum(-1) / d
        ve = var + self.cfg.ln_eps
        y = xg / np.sqrt(ve)[..., None]
        s1 = x.sum(-1)                    # E[x^2] - mu^2 from products of x and of sum x
        rec.mag(layer, "sumsq", (x * x).sum(-1))
        rec.mag(layer, "sum2", s1 * s1)
        rec.mag(layer, "xgamma", d * xg)
        rec.span(layer, "var_eps", ve)
        if want_y:
            rec.mag(layer, "scale", y)
        return y + w["beta"]

    def ln_fused(self, layer: str, x: np.ndarray, targets: list[tuple[str, str]],
                 want_y: bool = True) -> np.ndarray:
        """A decode step's LayerNorm fused with its projections (decoder._ln_targets):
        ``targets`` = (attention prefix, "wq"/"wk"/"wv") or (ffn prefix, "w1")."""
        w = self.sub(layer)
        y = self.ln(layer, x, want_y)
        rs = 1.0 / np.sqrt(x.var(-1, keepdims=True) + self.cfg.ln_eps)
        xg = (x - x.mean(-1, keepdims=True)) * w["gamma"]
        beta = w["beta"].reshape(1, -1)
        for prefix, which in targets:
            site = "lnw1" if which == "w1" else "lnproj"
            f = (lambda t: t @ self._w1(prefix)) if which == "w1" else \
                (lambda t: self._project(prefix, t, which))
            proj = f(xg)
            self.rec.mag(layer, site, proj, f(beta))
            self.rec.mag(layer, "lnscale", proj * rs)
        return y

    def _w1(self, prefix: str) -> np.ndarray:
        """The FFN's first weight as shared: W1, or W1 W2 for a linear FFN (fused)."""
        return self._fused(prefix)[0] if self.cfg.ffn_act == "none" else self.sub(prefix)["w1"]

    def _fused(self, prefix: str) -> tuple[np.ndarray, np.ndarray]:
        """A linear FFN as shared (secure_model.plain_tensors): (W1 W2, b1 W2 + b2), kept
        for the FFN traced last (its calls follow each other)."""
        if self._linear is None or self._linear[0] != prefix:
            w = self.sub(prefix)
            self._linear = (prefix, (w["w1"] @ w["w2"], w["b1"] @ w["w2"] + w["b2"]))
        return self._linear[1]

    def _project(self, layer: str, x: np.ndarray, which: str) -> np.ndarray:
        """x times an attention weight as the secure model holds it (attn_c folded; W^Q Omega,
        W^K Omega when folded)."""
        w = self.attn[layer]
        if which == "wv":
            return self.vs * (x @ w["wv"])
        t = x @ w[which]
        scale = self.sq if which == "wq" else self.sk
        if not self.fold or self.cfg.attention != M.PERFORMER:     # no Omega to fold
            return scale * t
        lead = t.shape[:-1]
        heads = t.reshape(-1, self.cfg.n_heads, self.cfg.d_head)[:, :, None, :]
        return scale * (heads @ w["omega"][None]).reshape(*lead, -1)

    def ffn(self, layer: str, x: np.ndarray, w1: bool = True) -> np.ndarray:
        """``w1`` False: x W1 was formed inside the LayerNorm before (ln_fused)."""
        w = self.sub(layer)
        if self.cfg.ffn_act == "none":     # shared fused: x (W1 W2) + (b1 W2 + b2)
            xw = x @ self._w1(layer)
            if w1:
                self.rec.mag(layer, "w1", xw)
            return xw + self._fused(layer)[1]
        xw = x @ w["w1"]
        hid = xw + w["b1"]
        hw = M.ffn_activation(hid, self.cfg.ffn_act) @ w["w2"]
        if w1:
            self.rec.mag(layer, "w1", xw)
        self.rec.mag(layer, "hidden" if self.cfg.ffn_act == "relu" else "hidden_gelu", hid)
        self.rec.mag(layer, "w2", hw)
        return hw + w["b2"]

    def _features(self, layer: str, x: np.ndarray, which: str, proj: bool = True) -> np.ndarray:
        """Q' or K' (B, h, S, r). The products are formed unfolded, s * (X W_h) Omega_h, which
        equals the folded s * X (W Omega)_h up to float rounding and costs r/d_head less."""
        w, h = self.attn[layer], self.cfg.n_heads
        s = self.sq if which == "wq" else self.sk      # Performer: the same s
        t0 = x @ w[which]
        t = _bias(t0, w, f"b{which[1]}")    # the bias is added after the product
        pre = s * (np.ascontiguousarray(M.split_heads(t, h)) @ w["omega"])
        if self.fold:                       # one product X (s W Omega) per feature
            if proj:
                self.rec.mag(layer, "proj",
                             s * (np.ascontiguousarray(M.split_heads(t0, h)) @ w["omega"]))
        else:                               # X (s W), then (s X W + s b)_h Omega_h
            if proj:
                self.rec.mag(layer, "proj", s * t0)
            self.rec.mag(layer, "omega", pre)
        self.rec.mag(layer, "features", pre)
        return M.relu(pre)

    def _values(self, layer: str, x: np.ndarray, proj: bool = True) -> np.ndarray:
        v = self.vs * (x @ self.attn[layer]["wv"])
        if proj:
            self.rec.mag(layer, "proj", v)
        v = _bias(v, self.attn[layer], "bv", self.vs)
        return np.ascontiguousarray(M.split_heads(v, self.cfg.n_heads))

    def _finish(self, layer: str, o: np.ndarray, n: np.ndarray | None,
                steps: bool = False) -> np.ndarray:
        """``n`` None: the 1/n row scale was applied before (a decode state's K'^T V); else
        it rides in the truncation of o W^O, whose product is formed unnormalised.
        ``steps``: decode steps, which may form it normalised from an untruncated o instead
        (``wo_raw``, :func:`protocols.stacks.schedule.deferred_wo`)."""
        y = M.merge_heads(o) @ self.attn[layer]["wo"]
        self.rec.mag(layer, "wo", y)
        if self.cfg.attn_norm == "mean" and n is not None:
            y = y / np.asarray(n, dtype=np.float64)[:, None]
        if steps:
            self.rec.mag(layer, "wo_raw", y)
        return _bias(y, self.attn[layer], "bo")

    # ---------------------------------------------------------------- attention ----
    def variant_attention(self, layer: str, x: np.ndarray, masked: bool = False,
                          xkv: np.ndarray | None = None, proj: bool = True) -> np.ndarray:
        """A softmax-style attention (mha.heads): projections, scores and the kernel inputs
        of the model's variant. ``masked``: the causal rows, which are also the KV-cache
        decode steps' rows (protocols.layers.kv_cache: a step's row is the masked row); only the
        kept (causal) scores reach the kernels. ``xkv``: keys and values from there (cross
        attention); ``proj`` False: q, k, v were formed inside a LayerNorm (ln_fused)."""
        w, h, rec = self.attn[layer], self.cfg.n_heads, self.rec
        src = x if xkv is None else xkv
        q, k, v = x @ w["wq"], src @ w["wk"], src @ w["wv"]        # as shared: W^Q / sqrt(dh)
        formed = ([self.sq * q] if proj else []) + ([k, v] if proj or xkv is not None else [])
        if formed:                                  # cross K, V: projected at the start
            rec.mag(layer, "proj", *formed)
        q, k, v = (np.ascontiguousarray(M.split_heads(_bias(t, w, f"b{n}"), h))
                   for t, n in ((q, "q"), (k, "k"), (v, "v")))
        s = MV.scores(q, k)
        keep = np.tril(np.ones(s.shape[-2:])) if masked else np.ones(s.shape[-2:])
        kept = s[..., keep.astype(bool)]
        rec.mag(layer, "vscores", kept)
        kind = MV.head_kind(self.cfg)
        if kind == "softmax":                       # max-subtracted: e <= 1, den in [1, n]
            top = np.max(np.where(keep > 0, s, -np.inf), axis=-1, keepdims=True)
            low = np.min(np.where(keep > 0, s, np.inf), axis=-1)
            rec.mag(layer, "rowmax", top[..., 0] - low + fxp.EXP_NEG_FLOOR)
            rec.mag(layer, "vout", (np.exp(s - top) * keep) @ v)
        elif kind == "softmax-max-free":
            rec.span(layer, "exp", kept)
            with np.errstate(over="ignore", invalid="ignore"):   # out of range: refused
                e = np.exp(s) * keep
                rec.span(layer, "den", e.sum(-1))
                rec.mag(layer, "vout", e @ v)
        elif kind == "power-softmax":
            e = s ** MV.POWER * keep
            rec.mag(layer, "power", kept * kept, e)
            rec.span(layer, "den", MV.POWER_EPS + e.sum(-1))
            rec.mag(layer, "vout", e @ v)
        else:
            rec.mag(layer, "sigma", kept)
            rec.mag(layer, "sigma_sum", (np.maximum(s, 0) * keep) @ v)
        with np.errstate(over="ignore", invalid="ignore"):
            o = MV.ref_heads(kind, q, k, v, masked)
        rec.mag(layer, "vout", o)
        y = M.merge_heads(o) @ w["wo"]
        rec.mag(layer, "wo", y)
        return _bias(y, w, "bo")

    def self_attention(self, layer: str, x: np.ndarray) -> np.ndarray:
        """Encoder self attention; both core orders (kv, qk) are recorded, since the secure
        run picks one by the sequence length."""
        if self.cfg.attention != M.PERFORMER:
            return self.variant_attention(layer, x)
        qf, kf, v = self._features(layer, x, "wq"), self._features(layer, x, "wk"), \
            self._values(layer, x)
        kv = np.swapaxes(kf, -1, -2) @ v
        o = qf @ kv
        self.rec.mag(layer, "kv", kv)
        self.rec.mag(layer, "scores", qf @ np.swapaxes(kf, -1, -2))
        self.rec.mag(layer, "out", o)
        return self._finish(layer, o, np.full(x.shape[1], x.shape[1]))

    def masked_steps(self, layer: str, x: np.ndarray, prefill: bool = False,
                     proj: bool = True) -> np.ndarray:
        """Masked self attention as the decode steps compute it (attention.attention_step):
        token t sees the folded prefix G (one product) and the cached tokens of its block
        (scores, then scores @ V); a full block is folded into G with one K'^T V.
        ``prefill``: also the whole sum Q'_b G + scores V_b, which the LM's prefill
        (:func:`protocols.stacks.causal_lm.prefill_attention`) forms in one product."""
        T, L = x.shape[1], self.block
        qf, kf, v = self._features(layer, x, "wq", proj), self._features(layer, x, "wk", proj), \
            self._values(layer, x, proj)
        o = np.zeros(qf.shape[:-1] + (v.shape[-1],))
        G = np.zeros(qf.shape[:2] + (qf.shape[-1], v.shape[-1]))
        for b0 in range(0, T, L):
            sl = slice(b0, min(b0 + L, T))
            sc = np.tril(qf[..., sl, :] @ np.swapaxes(kf[..., sl, :], -1, -2))
            part = sc @ v[..., sl, :]
            self.rec.mag(layer, "scores", sc)
            self.rec.mag(layer, "out", part)
            if b0:
                prev = qf[..., sl, :] @ G
                self.rec.mag(layer, "out", prev)
                part = part + prev
                if prefill:
                    self.rec.mag(layer, "out", part)
            o[..., sl, :] = part
            if b0 + L <= T:
                kvb = np.swapaxes(kf[..., sl, :], -1, -2) @ v[..., sl, :]
                self.rec.mag(layer, "kv", kvb)
                G = G + kvb
        return self._finish(layer, o, np.arange(1, T + 1), steps=True)

    def cross_kv(self, layer: str, enc: np.ndarray) -> np.ndarray:
        """DecodeState.start: K' and V of the encoder output and K'^T V, once; times 1/n_enc
        for attn_norm "mean" (the steps' row scale, applied to the state)."""
        kf, v = self._features(layer, enc, "wk"), self._values(layer, enc)
        kv = np.swapaxes(kf, -1, -2) @ v
        self.rec.mag(layer, "kv", kv)                # times 1/n_enc in its truncation
        kv = kv / enc.shape[1] if self.cfg.attn_norm == "mean" else kv
        h, dh = self.cfg.n_heads, self.cfg.d_head       # (K'^T V)_h W^O_h, once per session
        wo = self.attn[layer]["wo"].reshape(h, dh, self.cfg.d_model)
        self.rec.mag(layer, "kvwo", kv @ wo)
        return kv

    def cross_steps(self, layer: str, x: np.ndarray, kv: np.ndarray,
                    proj: bool = True) -> np.ndarray:
        o = self._features(layer, x, "wq", proj) @ kv
        self.rec.mag(layer, "out", o)
        return self._finish(layer, o, None, steps=True)

    # ------------------------------------------------------------------- stacks ----
    def encoder(self, x: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        for i in range(cfg.n_enc_layers):
            pre = f"enc.{i}"
            if cfg.norm_first:
                x = x + self.self_attention(f"{pre}.attn", self.ln(f"{pre}.ln1", x))
                x = x + self.ffn(f"{pre}.ffn", self.ln(f"{pre}.ln2", x))
            else:
                x = self.ln(f"{pre}.ln1", x + self.self_attention(f"{pre}.attn", x))
                x = self.ln(f"{pre}.ln2", x + self.ffn(f"{pre}.ffn", x))
        return self.ln("enc.final_ln", x) if cfg.norm_first else x

    def decoder(self, y: np.ndarray, enc: np.ndarray, fuse=None) -> np.ndarray:
        """Every decode step of the target ``y`` (B, T, d), layer by layer (the same values
        as T calls of decoder_step: a step's layer i sees only layer i-1 up to its token),
        with the LayerNorm fusions ``fuse`` (default: the decode step's default)."""
        from protocols.stacks.decoder import DEFAULT_FUSE, ln_fusions
        cfg, x, L = self.cfg, y, self.cfg.n_dec_layers
        fused = _targets(ln_fusions(cfg, DEFAULT_FUSE if fuse is None else fuse))

        def ln(prefix, x, want_y):
            if prefix not in fused:
                return self.ln(prefix, x)
            return self.ln_fused(prefix, x, fused[prefix], want_y)

        post = not cfg.norm_first
        for i in range(L):
            pre = f"dec.{i}"
            kv = self.cross_kv(f"{pre}.cross", enc) if cfg.attention == M.PERFORMER else None
            # a projection is recorded at its own layer unless a LayerNorm formed it
            own = {"self": f"dec.{i - 1}.ln3" not in fused if post else f"{pre}.ln1" not in fused,
                   "cross": f"{pre}.ln{1 if post else 2}" not in fused,
                   "ffn": f"{pre}.ln{2 if post else 3}" not in fused}
            for n, kind in enumerate(("self", "cross", "ffn"), start=1):
                if post:
                    x = ln(f"{pre}.ln{n}", x + self._dec_sublayer(kind, pre, x, enc, kv,
                                                                  own[kind]), True)
                else:
                    x = x + self._dec_sublayer(kind, pre, ln(f"{pre}.ln{n}", x, False), enc, kv,
                                               own[kind])
        if cfg.norm_first and cfg.n_dec_layers:
            x = self.ln("dec.final_ln", x)
        return x

    def _dec_sublayer(self, kind: str, pre: str, x: np.ndarray, enc: np.ndarray,
                      kv: np.ndarray | None, proj: bool) -> np.ndarray:
        """Decoder layer ``pre``'s sublayer ``kind`` (self, cross, ffn) as the decode steps
        compute it: Performer's decode blocks and cross K'^T V ``kv``, or - softmax-style,
        KV-cache steps - the causal self rows and the cross rows against the whole source.
        ``proj`` False: its input projection was formed inside the LayerNorm before."""
        if kind == "ffn":
            return self.ffn(f"{pre}.ffn", x, proj)
        if self.cfg.attention != M.PERFORMER:
            return self.variant_attention(f"{pre}.{kind}", x, kind == "self",
                                          enc if kind == "cross" else None, proj)
        if kind == "self":
            return self.masked_steps(f"{pre}.self", x, proj=proj)
        return self.cross_steps(f"{pre}.cross", x, kv, proj)

    def classifier(self, x: np.ndarray) -> np.ndarray:
        """protocols.stacks.classifier.classify: encoder, sum over positions @ head.w, times 1/S,
        + head.b; and the logit differences the arg-max compares. Returns the logits."""
        h, w = self.encoder(x), self.sub("head")
        if self.cfg.pool == "cls-tanh":
            return self._cls_tanh(h, w)
        z = h.sum(axis=1) @ w["w"]
        self.rec.mag("head", "head", z)             # times 1/S in its truncation
        out = z / h.shape[1] + w["b"]
        self.rec.mag("head", "argmax", out.max(axis=-1) - out.min(axis=-1))
        return out

    def _cls_tanh(self, h: np.ndarray, w: dict) -> np.ndarray:
        """protocols.stacks.classifier.cls_tanh_head: BERT's pooler on the first row, the head."""
        pw = self.sub("pool")
        z = h[:, 0] @ pw["w"]
        self.rec.mag("head", "pool_dense", z)
        z = z + pw["b"]
        self.rec.mag("head", "tanh", z)
        out = np.tanh(z) @ w["w"]
        self.rec.mag("head", "head", out)
        out = out + w["b"]
        self.rec.mag("head", "argmax", out.max(axis=-1) - out.min(axis=-1))
        return out

    def embedding(self, x: np.ndarray) -> np.ndarray:
        """protocols.stacks.sentence.embed_sentence: encoder, pooling (the spread the max
        tournament's differences stay within; the mean's sum undivided when normalized), then
        normalization (the squared norm, its value / 4^K handed to sqrt_inv, the pooled row times
        2^K / norm). Returns the embeddings."""
        from protocols.stacks.sentence import norm_scale
        cfg, rec = self.cfg, self.rec
        h = self.encoder(x)
        if cfg.pool == "cls":
            e = h[:, 0]
        elif cfg.pool == "max":                 # every tournament difference is within the spread
            e = h.max(axis=1)
            rec.mag("pool", "pool_max", e - h.min(axis=1))
        else:
            e = h.sum(axis=1) if cfg.normalize else h.mean(axis=1)
        if not cfg.normalize:
            return e
        scale = 2.0 ** norm_scale(cfg.d_model, x.shape[1], cfg.pool)
        ss = (e * e).sum(-1)
        rec.mag("pool", "norm_sumsq", ss)
        rec.span("pool", "norm_sq", ss / scale ** 2)
        with np.errstate(divide="ignore", invalid="ignore"):      # 0: refused (norm_sq)
            r = scale / np.sqrt(ss)[:, None]
            rec.mag("pool", "norm_scale", e * r)
            return e * r / scale

    def lm(self, x: np.ndarray, fuse=None) -> np.ndarray:
        """The decoder-only LM (protocols.stacks.causal_lm): its prefill and every decode step of
        the sequence x (B, T, d), layer by layer (Performer's decode blocks, or the causal
        rows a KV cache computes), the steps' LayerNorms fused as ``fuse`` says (default:
        the LM step's); the prefill's own LayerNorms and projections are recorded too.
        Returns the final hidden rows."""
        from protocols.stacks.causal_lm import DEFAULT_LM_FUSE, lm_fusions
        cfg = self.cfg
        attn = (self.variant_attention if cfg.attention != M.PERFORMER else self.masked_steps)
        fused = _targets(lm_fusions(cfg, DEFAULT_LM_FUSE if fuse is None else fuse))

        def ln(prefix, x):                # the prefill needs y as well: want_y
            return self.ln_fused(prefix, x, fused[prefix]) if prefix in fused else \
                self.ln(prefix, x)

        for i in range(cfg.n_dec_layers):
            pre = f"dec.{i}"
            if cfg.norm_first:
                x = x + attn(f"{pre}.self", ln(f"{pre}.ln1", x), True)
                if cfg.has_ffn(i):
                    x = x + self.ffn(f"{pre}.ffn", ln(f"{pre}.ln2", x))
            else:
                x = ln(f"{pre}.ln1", x + attn(f"{pre}.self", x, True))
                if cfg.has_ffn(i):
                    x = ln(f"{pre}.ln2", x + self.ffn(f"{pre}.ffn", x))
        x = self.ln("dec.final_ln", x) if cfg.norm_first else x
        if self.c_out is not None:        # AERO's folded FFN scales: the last row times C_L
            x = x * self.c_out
            self.rec.mag("dec.out_scale", "out_scale", x)
        return x
