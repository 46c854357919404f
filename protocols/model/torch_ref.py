"""A PyTorch module computing exactly :mod:`protocols.model`'s float64 reference, for every
config (training recipes; the ``[train]`` extra). Imported only explicitly (``from
protocols.model.torch_ref import TorchModel``): nothing else in mpc3 needs torch.

:class:`TorchModel` holds every tensor of a config - the MPC weights of
:func:`~protocols.model.expected_shapes` and the query user's of
:func:`~protocols.model.expected_user_shapes` - as parameters named like the model file
(``.`` -> ``__``); BatchNorm's running ``mean``, ``var`` (``norm`` batchnorm; ``bn_mean``,
``bn_var`` of ``ffn_bn``) are buffers,
and Performer's ``omega`` is a fixed buffer (Privformer draws it, it is not trained).
:meth:`TorchModel.export` returns ``(Weights, user)`` for :func:`protocols.model.save_model`.

Forward paths, each equal to the reference on the same weights
(tests/protocols/model/test_torch_ref.py:
every arch x attention x ffn_act x norm x norm_first x attn_bias x pool x embedding x
n_kv_heads, 1e-9 in float64; and LLaMA-shaped decoders: rmsnorm, swiglu, rotary, grouped-query):

* :meth:`embed` == :func:`protocols.model.embed_tokens` (sinusoidal, learned, learned-ln,
  rotary: the table alone);
* :meth:`encoder` == ``ref_encoder``, :meth:`decoder` == ``ref_decoder``, :meth:`lm` ==
  ``ref_lm``, :meth:`classify` == ``ref_classify``, :meth:`embed_sentence` == ``ref_embed``
  - on embedded inputs; :meth:`mha` repeats grouped keys / values to the query heads
  (``n_kv_heads``, query head j reads kv head j // (h / n_kv_heads), transformers'
  ``repeat_kv``) and rotates q and k at their positions (``embedding`` rotary, Hugging Face's
  ``rotate_half`` convention, computed here in torch from ``rope_theta``);
* :meth:`forward` from token ids to logits: ``classify`` for a classifier (a headless
  encoder: its sentence embeddings), the LM head on
  every position for a decoder-only LM, the output layer on the decoder rows for a
  translator (``tgt_ids`` teacher-forced).

Training-mode differences (``module.train()``): BatchNorm normalises with the batch's
statistics over (batch, positions) and updates the running ones (momentum 0.1, unbiased
variance, as ``torch.nn.BatchNorm1d``); everything else is the same in both modes (no
dropout). The equality with the reference holds in eval mode.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from .archs import NORM_EPS
from .config import DECODER_ONLY, ENCODER, ENCODER_CLASSIFIER, GATED, PERFORMER, ROTARY, \
    ModelConfig, expected_shapes, expected_user_shapes
from .decode import positional_encoding
from .variants import POWER, POWER_EPS
from .weights import Weights, random_user, random_weights

_BUFFERS = ("omega", "mean", "var", "bn_mean", "bn_var")
BN_MOMENTUM = 0.1


def _key(name: str) -> str:
    return name.replace(".", "__")


class TorchModel(torch.nn.Module):
    """``cfg``'s transformer in torch; weights from ``weights`` / ``user`` (numpy, e.g.
    :func:`protocols.model.load_model`) or random (:func:`random_weights`, seed)."""

    def __init__(self, cfg: ModelConfig, weights: Weights | None = None,
                 user: Mapping | None = None, seed: int = 0,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        self.cfg = cfg.validate()
        weights = random_weights(cfg, seed) if weights is None else weights.validate(cfg)
        user = random_user(cfg, seed) if user is None else user
        mpc = expected_shapes(cfg)
        self._names = list(mpc) + list(expected_user_shapes(cfg))
        for name in self._names:
            src = weights if name in mpc else user
            t = torch.tensor(np.asarray(src[name], dtype=np.float64), dtype=dtype)
            if name.rsplit(".", 1)[1] in _BUFFERS:
                self.register_buffer(_key(name), t)
            else:
                self.register_parameter(_key(name), torch.nn.Parameter(t))
        self.register_buffer("pe", torch.tensor(positional_encoding(cfg.max_len, cfg.d_model),
                                                dtype=dtype), persistent=False)
        #: ``on_scores(s, mask)``, when set: called with every softmax-style attention's
        #: scores q k^T / sqrt(dh) (B, h, Sq, Sk) and its 0/1 mask (training regularisers).
        self.on_scores = None

    def p(self, name: str) -> torch.Tensor:
        return getattr(self, _key(name))

    def has(self, name: str) -> bool:
        return hasattr(self, _key(name))

    def export(self) -> tuple[Weights, dict[str, np.ndarray]]:
        """(MPC weights, user tensors) as float64 numpy, ready for save_model."""
        mpc = set(expected_shapes(self.cfg))
        arrays = {n: self.p(n).detach().cpu().double().numpy().copy() for n in self._names}
        w = Weights({n: a for n, a in arrays.items() if n in mpc})
        return w.validate(self.cfg), {n: a for n, a in arrays.items() if n not in mpc}

    # ------------------------------------------------------------------- blocks ----
    def norm(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if cfg.norm == "none":
            return x
        if cfg.norm == "rmsnorm":                  # LLaMA: no centring, no bias
            ms = (x * x).mean(-1, keepdim=True)
            return x / torch.sqrt(ms + cfg.ln_eps) * self.p(f"{prefix}.gamma")
        if cfg.norm == "layernorm":
            g, b = self.p(f"{prefix}.gamma"), self.p(f"{prefix}.beta")
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + cfg.ln_eps) * g + b
        return self.batchnorm(f"{prefix}.", x)

    def batchnorm(self, stem: str, x: torch.Tensor) -> torch.Tensor:
        """BatchNorm over the last dim with ``{stem}gamma, beta, mean, var``."""
        g, b = self.p(f"{stem}gamma"), self.p(f"{stem}beta")
        mean, var = self.p(f"{stem}mean"), self.p(f"{stem}var")
        if self.training:                      # batch statistics over (batch, positions)
            flat = x.reshape(-1, x.shape[-1])
            mean, var = flat.mean(0), flat.var(0, unbiased=False)
            with torch.no_grad():
                n = flat.shape[0]
                mean_r, var_r = self.p(f"{stem}mean"), self.p(f"{stem}var")
                mean_r.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * mean)
                var_r.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * var * n / max(n - 1, 1))
        return (x - mean) / torch.sqrt(var + self.cfg.ln_eps) * g + b

    def ffn(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.ffn_act == GATED:            # LLaMA: down(silu(gate x) * up x)
            return (F.silu(x @ self.p(f"{prefix}.w1")) * (x @ self.p(f"{prefix}.w3"))) \
                @ self.p(f"{prefix}.w2")
        h = x @ self.p(f"{prefix}.w1") + self.p(f"{prefix}.b1")
        if self.cfg.ffn_bn:                     # seed 002: BatchNorm inside the MLP
            h = self.batchnorm(f"{prefix}.bn_", h)
        act = self.cfg.ffn_act
        h = F.relu(h) if act == "relu" else F.gelu(h) if act == "gelu" else h
        return h @ self.p(f"{prefix}.w2") + self.p(f"{prefix}.b2")

    def _proj(self, prefix: str, x: torch.Tensor, which: str) -> torch.Tensor:
        y = x @ self.p(f"{prefix}.w{which}")
        return y + self.p(f"{prefix}.b{which}") if self.has(f"{prefix}.b{which}") else y

    def _heads(self, t: torch.Tensor, h: int) -> torch.Tensor:  # (B, S, h dh) -> (B, h, S, dh)
        B, S, _ = t.shape
        return t.view(B, S, h, self.cfg.d_head).transpose(1, 2)

    def rope(self, t: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of per-head rows t (B, h, S, dh) at positions 0..S-1:
        t cos + rotate_half(t) sin, angles pos * theta^(-2i/dh) repeated over both halves."""
        dh, S = t.shape[-1], t.shape[-2]
        inv = float(self.cfg.rope_theta) ** (
            -torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], dim=-1).to(t.dtype)
        half = torch.cat([-t[..., dh // 2:], t[..., :dh // 2]], dim=-1)
        return t * torch.cos(ang) + half * torch.sin(ang)

    def mha(self, prefix: str, xq: torch.Tensor, xkv: torch.Tensor,
            causal: bool = False) -> torch.Tensor:
        """:func:`protocols.model.ref_mha` (any ``cfg.attention``)."""
        cfg = self.cfg
        q = self._heads(self._proj(prefix, xq, "q"), cfg.n_heads)
        k, v = (self._heads(self._proj(prefix, xkv, n), cfg.kv_heads).repeat_interleave(
            cfg.n_heads // cfg.kv_heads, dim=1) for n in "kv")
        if cfg.embedding == ROTARY:               # self attention only (decoder-only)
            q, k = self.rope(q), self.rope(k)
        Sq, Sk = q.shape[-2], k.shape[-2]
        # the causal mask by comparison: torch.tril costs ~2 ms a call on some CPU builds
        mask = ((torch.arange(Sq)[:, None] >= torch.arange(Sk)).to(q.dtype) if causal
                else torch.ones(Sq, Sk, dtype=q.dtype))
        if cfg.attention == PERFORMER:
            om = self.p(f"{prefix}.omega")
            qf = F.relu(torch.einsum("bhsd,hdr->bhsr", q, om))
            kf = F.relu(torch.einsum("bhsd,hdr->bhsr", k, om))
            n = mask.sum(-1, keepdim=True)
            scale = cfg.attn_c / n if cfg.attn_norm == "mean" else \
                torch.full_like(n, float(cfg.attn_c))
            o = ((qf @ kf.transpose(-1, -2)) * mask) @ v * scale
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
            if self.on_scores is not None:
                self.on_scores(s, mask)
            if cfg.attention == "softmax":
                e = torch.exp(s) * mask
                o = (e / e.sum(-1, keepdim=True)) @ v
            elif cfg.attention == "power-softmax":
                e = s ** POWER * mask
                o = (e / (POWER_EPS + e.sum(-1, keepdim=True))) @ v
            else:                                              # sigma-relu, L = row's keys
                o = (F.relu(s) * mask) @ v / mask.sum(-1, keepdim=True)
        B, h, S, dh = o.shape
        return self._proj(prefix, o.transpose(1, 2).reshape(B, S, h * dh), "o")

    # ------------------------------------------------------------------- stacks ----
    def _layer(self, pre: str, x: torch.Tensor, subs: list) -> torch.Tensor:
        """Pre- or post-norm residual layer: ``subs`` = [(norm prefix, sublayer fn)]."""
        for ln, f in subs:
            if self.cfg.norm_first:
                x = x + f(self.norm(f"{pre}.{ln}", x))
            else:
                x = self.norm(f"{pre}.{ln}", x + f(x))
        return x

    def encoder(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.cfg.n_enc_layers):
            pre = f"enc.{i}"
            x = self._layer(pre, x, [("ln1", lambda u: self.mha(f"{pre}.attn", u, u)),
                                     ("ln2", lambda u: self.ffn(f"{pre}.ffn", u))])
        return self.norm("enc.final_ln", x) if self.cfg.norm_first else x

    def decoder(self, y: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        for i in range(self.cfg.n_dec_layers):
            pre = f"dec.{i}"
            y = self._layer(pre, y, [
                ("ln1", lambda u: self.mha(f"{pre}.self", u, u, causal=True)),
                ("ln2", lambda u: self.mha(f"{pre}.cross", u, enc)),
                ("ln3", lambda u: self.ffn(f"{pre}.ffn", u))])
        return self.norm("dec.final_ln", y) if self.cfg.norm_first and \
            self.cfg.n_dec_layers else y

    def lm(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        for i in range(cfg.n_dec_layers):
            pre = f"dec.{i}"
            x = self._layer(pre, x, [("ln1", lambda u: self.mha(f"{pre}.self", u, u, True))])
            if not cfg.has_ffn(i):                 # AERO's pruned FFN: identity
                continue
            if cfg.ffn_scale:                      # AERO Eq. 6 (norm none)
                x = self.p(f"{pre}.ffn.beta") * x \
                    + self.ffn(f"{pre}.ffn", x) / self.p(f"{pre}.ffn.alpha")
            else:
                x = self._layer(pre, x, [("ln2", lambda u: self.ffn(f"{pre}.ffn", u))])
        return self.norm("dec.final_ln", x) if cfg.norm_first else x

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.cfg.pool == "cls-tanh":
            pooled = torch.tanh(h[:, 0] @ self.p("pool.w") + self.p("pool.b"))
        else:
            pooled = h.mean(1)
        return pooled @ self.p("head.w") + self.p("head.b")

    def embed_sentence(self, x: torch.Tensor) -> torch.Tensor:
        """A headless encoder's pooled (and, with ``normalize``, L2-normalised) rows."""
        h = self.encoder(x)
        e = {"cls": lambda: h[:, 0], "max": lambda: h.max(1).values,
             "mean": lambda: h.mean(1)}[self.cfg.pool]()
        return F.normalize(e, p=2.0, dim=-1, eps=NORM_EPS) if self.cfg.normalize else e

    # --------------------------------------------------------------- user side ----
    def embed(self, ids: torch.Tensor, table: str | None = None, offset: int = 0,
              types: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`protocols.model.embed_tokens` of ids (B, S)."""
        cfg = self.cfg
        table = table or ("embed.tgt" if cfg.arch == DECODER_ONLY else "embed.src")
        S = ids.shape[-1]
        if cfg.embedding == "sinusoidal":
            return self.p(table)[ids] * math.sqrt(cfg.d_model) + self.pe[offset:offset + S]
        if cfg.embedding == ROTARY:                # positions are rotated into q and k
            return self.p(table)[ids]
        x = self.p(table)[ids] + self.p("embed.pos")[offset:offset + S]
        if self.has("embed.type"):
            x = x + self.p("embed.type")[torch.zeros_like(ids) if types is None else types]
        if cfg.embedding == "learned-ln":
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            x = (x - mu) / torch.sqrt(var + cfg.ln_eps) * self.p("embed.ln.gamma") \
                + self.p("embed.ln.beta")
        return x

    def forward(self, ids: torch.Tensor, tgt_ids: torch.Tensor | None = None,
                types: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from token ids: (B, n_classes) for a classifier, (B, T, vocab) for a
        decoder-only LM (every position) or a translator (``tgt_ids`` teacher-forced); the
        sentence embeddings (B, d) of a headless encoder."""
        cfg = self.cfg
        if cfg.arch == ENCODER_CLASSIFIER:
            return self.classify(self.embed(ids, types=types))
        if cfg.arch == ENCODER:
            return self.embed_sentence(self.embed(ids, types=types))
        if cfg.arch == DECODER_ONLY:
            h = self.lm(self.embed(ids, types=types))
        else:
            if tgt_ids is None:
                raise ValueError("an encoder-decoder forward needs tgt_ids (teacher forcing)")
            h = self.decoder(self.embed(tgt_ids, "embed.tgt"), self.encoder(self.embed(ids)))
        return h @ self.p("out.w") + self.p("out.b")
