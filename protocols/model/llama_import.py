"""Hugging Face ``LlamaForCausalLM`` directories -> mpc3 decoder-only models (``mpc3 import
DIR --format hf-llama``; ``auto`` picks it for config.json's ``model_type`` ``llama``).

The directory is read as :mod:`.hf_import` reads BERT and GPT-2 (config.json and
model.safetensors or its shards, mpc3's own safetensors reader, no torch); its
``tokenizer.json`` is carried by :func:`protocols.model.st_import.import_checkpoint`, as for
GPT-2. The model becomes arch ``decoder-only`` with ``attention`` softmax (no biases),
``norm`` rmsnorm (``ln_eps`` = ``rms_norm_eps``), pre-norm with the final ``model.norm``,
``ffn_act`` swiglu, ``embedding`` rotary with ``rope_theta``, ``n_kv_heads`` =
``num_key_value_heads`` (0 when it equals ``num_attention_heads``) and ``max_len`` =
``max_position_embeddings`` (``--max-len`` and ``MPC3_MAX_LEN`` as for every import).

``rope_theta`` is read where either transformers generation writes it: 4.x top-level
``rope_theta`` (with ``rope_scaling`` null), 5.x ``rope_parameters`` = ``{"rope_type":
"default", "rope_theta": ...}`` (both present must agree; neither: 10000).

Name mapping (prefix ``model.`` dropped; every ``nn.Linear`` weight is stored (out, in) and
transposed):

=========================================  ==================================  ======
Hugging Face                               mpc3                                side
=========================================  ==================================  ======
embed_tokens                               embed.tgt                           user
lm_head (tied: embed_tokens), transposed   out.w; out.b = 0                    user
layers.i.self_attn.q_proj / k_proj         dec.i.self.wq / wk (d, kv dh)       shared
layers.i.self_attn.v_proj / o_proj         dec.i.self.wv (d, kv dh) / wo       shared
layers.i.input_layernorm                   dec.i.ln1.gamma                     shared
layers.i.post_attention_layernorm          dec.i.ln2.gamma                     shared
layers.i.mlp.gate_proj / up_proj           dec.i.ffn.w1 / w3                   shared
layers.i.mlp.down_proj                     dec.i.ffn.w2                        shared
norm                                       dec.final_ln.gamma                  shared
=========================================  ==================================  ======

Refused, naming the feature (nothing is written): other model types (mistral, qwen2,
mixtral, ... are other formats, even where their config could be LLaMA's) and other
architectures than ``LlamaForCausalLM``; rope scaling (``rope_scaling``, a ``rope_type`` but
default, other ``rope_parameters`` keys); ``attention_bias`` or ``mlp_bias`` true; a
``hidden_act`` other than silu; ``head_dim`` other than hidden_size / num_attention_heads;
sliding-window attention; mixture-of-experts keys; logit soft-capping; a head that
contradicts ``tie_word_embeddings``; tensors of unexpected shape, missing or extra tensors.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .config import DECODER_ONLY, GATED, ROTARY, ModelConfig, check_ceilings
from .hf_import import (_SIZES, ImportRefused, _check_layers, _common, _eps, _refuse_flags,
                        _sizes, _Tensors, cap_max_len, read_checkpoint)
from .weights import Weights, validate_user

FORMAT = "hf-llama"
LLAMA_ARCHS = ("LlamaForCausalLM",)
#: The config.json keys mpc3's config sizes come from (for the ceilings' messages).
LLAMA_KEYS = {"d_model": "hidden_size", "n_heads": "num_attention_heads",
              "n_dec_layers": "num_hidden_layers", "d_ff": "intermediate_size",
              "tgt_vocab": "vocab_size", "max_len": "max_position_embeddings"}
#: Mixture-of-experts keys of LLaMA's relatives: any nonzero one is refused.
_MOE_KEYS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts",
             "moe_intermediate_size")
_ROPE_KEYS = ("rope_type", "rope_theta")
DEFAULT_ROPE_THETA = 10000.0


def rope_theta(conf: dict, name: str) -> float:
    """RoPE's base from config.json (module docstring); refuses any rope scaling."""
    scaling = conf.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) \
            else scaling
        raise ImportRefused(f"{name}: rope scaling (rope_scaling type {str(kind)[:40]!r}) is "
                            f"not supported: mpc3 rotates with the default RoPE")
    theta = conf.get("rope_theta")
    params = conf.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise ImportRefused(f"{name}: config.json rope_parameters is not an object")
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise ImportRefused(f"{name}: rope scaling (rope_parameters rope_type "
                                f"{str(kind)[:40]!r}) is not supported: mpc3 rotates with "
                                f"the default RoPE")
        extra = sorted(str(k)[:40] for k in set(params) - set(_ROPE_KEYS))
        if extra:
            raise ImportRefused(f"{name}: rope_parameters {extra} are not supported (mpc3 "
                                f"reads rope_type default and rope_theta)")
        if "rope_theta" in params:
            if theta is not None and theta != params["rope_theta"]:
                raise ImportRefused(f"{name}: config.json rope_theta={str(theta)[:40]} and "
                                    f"rope_parameters' {str(params['rope_theta'])[:40]} differ")
            theta = params["rope_theta"]
    theta = DEFAULT_ROPE_THETA if theta is None else theta
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) \
            or not (math.isfinite(theta) and theta > 1):
        raise ImportRefused(f"{name}: rope_theta={str(theta)[:40]} is not a number > 1")
    return float(theta)


def _check_config(conf: dict, name: str) -> None:
    """Refuse by name what a LLaMA config may switch on and mpc3 cannot compute."""
    kind = conf.get("model_type")
    if kind != "llama":
        raise ImportRefused(f"{name}: model_type {str(kind)[:40]!r} is not 'llama' (mpc3 "
                            f"imports LLaMA itself; its relatives are other formats)")
    arch = conf.get("architectures") or list(LLAMA_ARCHS)
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        raise ImportRefused(f"{name}: config.json architectures is not a list of names")
    if not set(LLAMA_ARCHS) & set(arch):
        raise ImportRefused(f"{name}: architecture {arch} is not supported (mpc3 imports "
                            f"LlamaForCausalLM as a decoder-only LM)")
    _refuse_flags(conf, {
        "attention_bias": (bool, "attention biases"),
        "mlp_bias": (bool, "MLP biases"),
        "sliding_window": (lambda v: v is not None, "sliding-window attention"),
        "use_sliding_window": (bool, "sliding-window attention"),
        "attn_logit_softcapping": (lambda v: v is not None, "attention logit soft-capping"),
        "final_logit_softcapping": (lambda v: v is not None, "final logit soft-capping"),
        **{k: (bool, "mixture of experts") for k in _MOE_KEYS}})
    act = conf.get("hidden_act", "silu")
    if act != "silu":
        raise ImportRefused(f"{name}: activation hidden_act={str(act)[:40]!r} is not "
                            f"supported (mpc3's gated FFN is SwiGLU: silu)")
    if not isinstance(conf.get("tie_word_embeddings", False), bool):
        raise ImportRefused(f"{name}: config.json tie_word_embeddings is not a boolean")


def llama(conf: dict, tensors: dict, name: str = "LLaMA") -> tuple:
    """(cfg, weights, user, notes) of a LlamaForCausalLM checkpoint (module docstring)."""
    _check_config(conf, name)
    d, h, L, f, V, P, kv = _sizes(
        conf, name, hidden_size=..., num_attention_heads=..., num_hidden_layers=...,
        intermediate_size=..., vocab_size=..., max_position_embeddings=...,
        num_key_value_heads=None)
    common = _common(d, h, f, P, _eps(conf, "rms_norm_eps", 1e-6, name))
    dh = common["d_head"]
    if conf.get("head_dim") is not None and conf["head_dim"] != dh:
        raise ImportRefused(f"{name}: head_dim={str(conf['head_dim'])[:40]} is not "
                            f"hidden_size / num_attention_heads = {dh} (not supported)")
    kv = h if kv is None else kv
    if kv < 1 or h % kv:
        raise ImportRefused(f"{name}: num_key_value_heads={kv} does not divide "
                            f"num_attention_heads={h}")
    _check_layers(L, tensors, r"^(?:model\.)?layers\.(\d+)\.", "num_hidden_layers", name)
    cfg = ModelConfig(**{**common, "attn_bias": False}, norm_first=True, arch=DECODER_ONLY,
                      n_dec_layers=L, tgt_vocab=V, norm="rmsnorm", ffn_act=GATED,
                      embedding=ROTARY, rope_theta=rope_theta(conf, name),
                      n_kv_heads=0 if kv == h else kv).validate()
    check_ceilings(cfg, name, _SIZES, LLAMA_KEYS)
    t = _Tensors(tensors, "model.", (".rotary_emb.inv_freq",), name)
    embed = t.take("embed_tokens.weight", (V, d))
    if conf.get("tie_word_embeddings", False):
        head = embed
        if t.has("lm_head.weight") and not np.array_equal(t.take("lm_head.weight", (V, d)),
                                                          embed):
            raise ImportRefused(f"{name}: tie_word_embeddings is true but lm_head.weight "
                                f"differs from embed_tokens.weight")
    elif not t.has("lm_head.weight"):
        raise ImportRefused(f"{name}: no lm_head.weight and tie_word_embeddings is false "
                            f"(the LM head is missing)")
    else:
        head = t.take("lm_head.weight", (V, d))
    user = {"embed.tgt": embed, "out.w": head.T.copy(), "out.b": np.zeros(V)}

    def linear(src, n_in, n_out):            # nn.Linear without bias: (out, in) -> (in, out)
        return t.take(f"{src}.weight", (n_out, n_in)).T.copy()

    w = Weights()
    for i in range(L):
        src, dst = f"layers.{i}", f"dec.{i}"
        for hf, q, n_out in (("q_proj", "q", d), ("k_proj", "k", kv * dh),
                             ("v_proj", "v", kv * dh), ("o_proj", "o", d)):
            w[f"{dst}.self.w{q}"] = linear(f"{src}.self_attn.{hf}", d, n_out)
        w[f"{dst}.ln1.gamma"] = t.take(f"{src}.input_layernorm.weight", (d,))
        w[f"{dst}.ln2.gamma"] = t.take(f"{src}.post_attention_layernorm.weight", (d,))
        w[f"{dst}.ffn.w1"] = linear(f"{src}.mlp.gate_proj", d, f)
        w[f"{dst}.ffn.w3"] = linear(f"{src}.mlp.up_proj", d, f)
        w[f"{dst}.ffn.w2"] = linear(f"{src}.mlp.down_proj", f, d)
    w["dec.final_ln.gamma"] = t.take("norm.weight", (d,))
    t.done()
    w.validate(cfg)
    validate_user(cfg, user)
    return cfg, w, user, []


def load_llama(path, max_len: int | None = None) -> tuple[ModelConfig, Weights, dict,
                                                           list[str]]:
    """(cfg, weights, user tensors, notes) of a LlamaForCausalLM save_pretrained directory;
    ``max_len``: :func:`.hf_import.cap_max_len`. (With its tokenizer:
    :func:`protocols.model.st_import.import_checkpoint`.)"""
    if not Path(path).is_dir():
        raise ValueError(f"{path}: format {FORMAT} reads a directory (config.json + "
                         f"model.safetensors, as save_pretrained writes it)")
    conf, tensors = read_checkpoint(path)
    name = f"{path} ({FORMAT})"
    cfg, w, user, notes = llama(conf, tensors, name)
    return check_ceilings(cap_max_len(cfg, user, max_len, name), name, source=LLAMA_KEYS), \
        w, user, notes
