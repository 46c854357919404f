"""Plaintext definition of the Privformer-style transformer, in five modules:

* :mod:`.config`    - :class:`ModelConfig` (public hyper-parameters) and tensor names/shapes;
* :mod:`.weights`   - the :class:`Weights` container, random weights/Omega, the ``.npz`` format;
* :mod:`.features`  - Performer ReLU random features, Omega folding, the attention scale;
* :mod:`.reference` - the float64 reference (layers, stacks, incremental decoding) whose
  semantics the MPC protocols compute on shares;
* :mod:`.decode`    - the query user's side: embedding, logits, greedy decoding;
* :mod:`.archs`     - the float64 reference of the encoder classifier, the headless encoder
  (sentence embeddings) and the decoder-only LM;
* :mod:`.presets`   - named config presets (AERO's softmax-only block);
* :mod:`.hf_import` - checkpoints laid out like Hugging Face BERT and GPT-2 -> mpc3 models;
* :mod:`.st_import` - sentence-transformers directories, and every import with its tokenizer.

Everything public is re-exported here: ``from protocols import model as M; M.ref_encoder``.
"""
from .archs import (RefLMState, fold_ffn_scales, greedy_generate, ref_classify, ref_embed, ref_lm,
                    ref_lm_step)
from .config import (ARCHS, ATTENTIONS, ATTN_NORMS, DECODER_ONLY, GATED, ROTARY, NORMS, DEFAULT_LN_EPS, ENCODER,
                     ENCODER_CLASSIFIER, ENCODER_DECODER, PERFORMER, ModelConfig, attn_prefixes, config_keys, expected_shapes,
                     expected_user_shapes)
from .decode import (embed, embed_tokens, greedy_decode, input_table, output_logits,
                     positional_encoding, take_tokens)
from .features import (attn_norm, attn_params, fold_omega, fold_omega_one, merge_heads, project, ref_features,
                       relu, split_heads)
from .presets import PRESETS, aero, apply_preset
from .variants import head_kind
from .reference import (RefDecodeState, ffn_activation, ref_decoder, ref_decoder_step, ref_encoder, ref_ffn,
                        batchnorm_affine, fold_ffn_bn, ref_batchnorm, ref_layernorm, ref_mha, ref_norm,
                        qkv_heads, ref_rmsnorm, ref_swiglu)
from .rotary import ref_rope, rope_tables, rotate_half
from .weights import (FORMAT_VERSION, USER_NAMES, OnDemandTensors, Weights, load_labels, load_model,
                      load_tokenizer, make_omega,
                      orthogonal_features, random_user, random_weights, save_model,
                      validate_user)

__all__ = [
    "ARCHS", "ATTENTIONS", "NORMS", "GATED", "ROTARY", "qkv_heads", "ref_rmsnorm", "ref_swiglu", "ref_rope", "rope_tables", "rotate_half", "PRESETS", "fold_ffn_scales", "fold_ffn_bn", "aero", "apply_preset", "batchnorm_affine", "ref_batchnorm", "ref_norm", "PERFORMER", "DECODER_ONLY", "ENCODER", "ENCODER_CLASSIFIER", "ENCODER_DECODER", "RefLMState",
    "config_keys", "greedy_generate", "ref_classify", "ref_embed", "ref_lm", "ref_lm_step", "ATTN_NORMS", "DEFAULT_LN_EPS", "FORMAT_VERSION", "USER_NAMES", "ModelConfig",
    "RefDecodeState", "OnDemandTensors", "Weights", "ffn_activation", "attn_norm", "attn_params", "attn_prefixes", "embed", "embed_tokens", "input_table", "take_tokens",
    "expected_shapes", "expected_user_shapes", "fold_omega", "fold_omega_one", "greedy_decode", "load_model",
    "make_omega", "merge_heads", "load_labels", "load_tokenizer", "orthogonal_features", "project", "output_logits", "positional_encoding",
    "random_user", "random_weights", "ref_decoder", "ref_decoder_step", "ref_encoder",
    "ref_features", "ref_ffn", "ref_layernorm", "ref_mha", "relu", "save_model", "split_heads",
    "validate_user", "head_kind",
]
