"""``mpc3 import`` of Hugging Face ``LlamaForCausalLM`` directories (``--format hf-llama``),
checked against transformers' own forward pass and greedy generation (CPU torch; the
``test`` extra installs both). Tiny random models are built here from a ``LlamaConfig`` and
saved with ``save_pretrained`` - no hub downloads.

Shapes: vocab 100, d=32, 4 query heads (d_head 8), 2 layers, intermediate 48, 64 positions,
rms_norm_eps 1e-5; key/value heads 2 (grouped-query), 4 (multi-head) or 1 (multi-query);
rope_theta 10000 or 500; tied and untied LM heads. Every parameter is perturbed by
N(0, 0.15^2) after HF's initialisation (which sets the RMSNorm weights to 1), so norms,
gates and attention patterns all matter.

Bounds: the float64 reference (embed_tokens + ref_lm + output_logits) vs transformers'
logits 1e-4 - transformers computes RMSNorm and the rotary tables in float32 even in a
float64 model, so both its float32 and float64 forwards are ~1e-6 from the reference
(measured over the three models and 1-64 positions: max 3.0e-6 vs float32, 1.6e-6 vs
float64, on logits of magnitude ~3.5; the KV-cache steps vs generate's step logits 2.1e-6).
Greedy tokens (16 per prompt, 4 prompts) must be equal, from the reference's whole-sequence
``greedy_generate`` and from its KV-cache steps (``ref_lm_step``); each step's top-2 logit
gap is checked to be above 1e-4 (measured >= 3e-3), far above those 1e-6, so the equality
is not luck.
"""
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from app.cli import main as cli  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.model import hf_import as HF  # noqa: E402
from protocols.model.llama_import import load_llama  # noqa: E402
from protocols.model.st_import import import_checkpoint  # noqa: E402

NOISE = 0.15
V, D, HEADS, LAYERS, FF, POS = 100, 32, 4, 2, 48, 64
WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "dog", "sat", "on", "mat", "a", "runs"]
TOL = 1e-4


def make_llama(path, kv=2, theta=10000.0, tie=False, seed=0, tokenizer=True):
    """A tiny random LlamaForCausalLM (and a word-level tokenizer.json) in ``path``."""
    torch.manual_seed(seed)
    conf = transformers.LlamaConfig(
        vocab_size=V, hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=kv,
        num_hidden_layers=LAYERS, intermediate_size=FF, max_position_embeddings=POS,
        rms_norm_eps=1e-5, rope_theta=theta, tie_word_embeddings=tie)
    model = transformers.LlamaForCausalLM(conf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():          # tied: the one shared table is perturbed once
            p.add_(torch.randn(p.shape, generator=g) * NOISE)
    model.eval().save_pretrained(path, safe_serialization=True)
    model.generation_config.eos_token_id = None      # 16 tokens always, no early stop
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(path / "tokenizer.json"))
    return model


CASES = {"gqa": dict(kv=2, theta=10000.0, tie=False), "mha-tied": dict(kv=4, theta=500.0,
                                                                        tie=True),
         "mqa": dict(kv=1, theta=500.0, tie=False)}


@pytest.fixture(scope="module", params=list(CASES))
def llama(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return make_llama(path, **CASES[request.param]), path, CASES[request.param]


def _import(tmp_path, src, *args):
    out = tmp_path / "imported.npz"
    assert cli(["import", str(src), *args, "--out", str(out)]) == 0
    return M.load_model(out)


def _logits(model, ids, double=False):
    with torch.no_grad():
        m = model.double() if double else model
        out = m(input_ids=torch.tensor(ids)).logits.double().numpy()
        model.float()
    return out


def test_reference_logits_match_transformers(llama, tmp_path, capsys):
    model, path, case = llama
    cfg, w, user = _import(tmp_path, path)                   # auto picks hf-llama
    assert "MPC parameters" in capsys.readouterr().out
    assert (cfg.arch, cfg.attention, cfg.norm, cfg.ffn_act, cfg.embedding, cfg.norm_first,
            cfg.attn_bias, cfg.kv_heads, cfg.rope_theta, cfg.ln_eps, cfg.max_len) == \
        ("decoder-only", "softmax", "rmsnorm", "swiglu", "rotary", True, False, case["kv"],
         case["theta"], 1e-5, POS)
    assert set(user) == {"embed.tgt", "out.w", "out.b"}       # user-side, never shared
    assert not user["out.b"].any()
    assert np.array_equal(user["out.w"], user["embed.tgt"].T) == case["tie"]
    sd = model.state_dict()
    assert np.array_equal(w["dec.1.self.wk"], sd["model.layers.1.self_attn.k_proj.weight"].T)
    assert w["dec.0.self.wv"].shape == (D, case["kv"] * D // HEADS)
    rng = np.random.default_rng(0)
    for S in (1, 7, POS):
        ids = rng.integers(0, V, (3, S))
        ours = M.output_logits(user, M.ref_lm(cfg, w, M.embed_tokens(cfg, user, ids)))
        f32, f64 = _logits(model, ids), _logits(model, ids, double=True)
        assert np.abs(f64).max() > 0.5                       # not a trivial output
        assert np.max(np.abs(ours - f32)) < TOL and np.max(np.abs(ours - f64)) < TOL, S


def _kv_cache_greedy(cfg, w, user, prompts, n):
    """Greedy decoding through the reference's KV-cache steps: (tokens, step logits)."""
    st = M.RefLMState(cfg, len(prompts))
    for t in range(prompts.shape[1]):
        h = M.ref_lm_step(cfg, w, st, M.embed_tokens(cfg, user, prompts[:, t:t + 1], t)[:, 0])
    toks, logits = [], []
    for _ in range(n):
        logits.append(M.output_logits(user, h))
        toks.append(logits[-1].argmax(-1))
        h = M.ref_lm_step(cfg, w, st, M.embed_tokens(cfg, user, toks[-1][:, None], st.t)[:, 0])
    return np.stack(toks, 1), np.stack(logits, 1)


def test_greedy_generation_matches_transformers(llama):
    model, path, _ = llama
    cfg, w, user, _ = load_llama(path)
    prompts = np.random.default_rng(1).integers(0, V, (4, 6))
    with torch.no_grad():
        got = model.generate(input_ids=torch.tensor(prompts),
                             attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                             do_sample=False, max_new_tokens=16, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
    theirs = got.sequences[:, 6:].numpy()
    their_logits = torch.stack(got.logits, 1).double().numpy()       # (4, 16, V)
    assert theirs.shape == (4, 16)
    assert M.greedy_generate(cfg, w, user, prompts, 16) == theirs.tolist()
    toks, logits = _kv_cache_greedy(cfg, w, user, prompts, 16)
    assert np.array_equal(toks, theirs)
    assert np.max(np.abs(logits - their_logits)) < TOL
    top2 = np.sort(logits, -1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-4          # no near-tie decided the test


def test_cli_hf_llama_writes_the_llama_keys_and_the_tokenizer(tmp_path, capsys):
    make_llama(tmp_path / "m", kv=2, theta=500.0)
    cfg, w, user = _import(tmp_path, tmp_path / "m", "--format", "hf-llama", "--max-len", "32")
    assert "tokenizer" in capsys.readouterr().out
    d = json.loads(json.dumps(cfg.to_dict()))
    assert {k: d[k] for k in ("arch", "attention", "norm", "ffn_act", "embedding",
                              "n_kv_heads", "rope_theta", "ln_eps", "max_len",
                              "norm_first")} == {
        "arch": "decoder-only", "attention": "softmax", "norm": "rmsnorm",
        "ffn_act": "swiglu", "embedding": "rotary", "n_kv_heads": 2, "rope_theta": 500.0,
        "ln_eps": 1e-5, "max_len": 32, "norm_first": True}
    assert "attn_bias" not in d and HF.detect_format(tmp_path / "m") == "hf-llama"
    tok = M.load_tokenizer(tmp_path / "imported.npz")
    assert tok.encode("the cat sat on a mat").ids == [3, 4, 6, 7, 9, 8]
    from app.cli.common import load_model_file      # share-model's reader takes the directory
    assert load_model_file(str(tmp_path / "m"))[0] == M.ModelConfig.from_dict(
        {**d, "max_len": POS})
    with pytest.raises(ValueError, match="load_hf reads hf-bert, hf-gpt2"):
        HF.load_hf(tmp_path / "m")


def test_transformers_4_config_layout_imports(tmp_path):
    """transformers 4.x wrote rope_theta at the top level with rope_scaling null (5.x:
    rope_parameters {"rope_type": "default", "rope_theta": ...}); both read the same."""
    model = make_llama(tmp_path / "m", kv=2, theta=500.0, tokenizer=False)
    f = tmp_path / "m" / "config.json"
    conf = json.loads(f.read_text())
    assert conf["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    del conf["rope_parameters"]
    f.write_text(json.dumps({**conf, "rope_theta": 500.0, "rope_scaling": None}))
    got = import_checkpoint(tmp_path / "m")
    assert got.cfg.rope_theta == 500.0 and got.tokenizer is None and any(
        "no tokenizer.json" in n for n in got.notes)
    ids = np.random.default_rng(2).integers(0, V, (2, 9))
    ours = M.output_logits(got.user, M.ref_lm(got.cfg, got.weights,
                                              M.embed_tokens(got.cfg, got.user, ids)))
    assert np.max(np.abs(ours - _logits(model, ids))) < TOL


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src")
    make_llama(path, tokenizer=False)
    return path


def _copy(source, dst, **changes):
    import shutil
    shutil.copytree(source, dst)
    f = dst / "config.json"
    conf = json.loads(f.read_text())
    conf.update(changes)
    f.write_text(json.dumps(conf))
    return dst


@pytest.mark.parametrize("changes,fmt,message", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "auto",
     "rope scaling \\(rope_parameters rope_type 'linear'\\) is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}, "auto",
     "rope_type 'llama3'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "auto",
     "rope scaling \\(rope_scaling type 'dynamic'\\)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.5}}, "auto",
     "rope_parameters \\['partial_rotary_factor'\\] are not supported"),
    ({"rope_theta": 500.0}, "auto", "rope_theta=500.0 and rope_parameters' 10000.0 differ"),
    ({"attention_bias": True}, "auto", "attention biases \\(attention_bias=True\\)"),
    ({"mlp_bias": True}, "hf-llama", "MLP biases \\(mlp_bias=True\\) is not supported"),
    ({"hidden_act": "gelu"}, "auto", "activation hidden_act='gelu' is not supported"),
    ({"head_dim": 16}, "auto", "head_dim=16 is not hidden_size / num_attention_heads = 8"),
    ({"sliding_window": 16}, "auto", "sliding-window attention \\(sliding_window=16\\)"),
    ({"num_local_experts": 8}, "auto", "mixture of experts \\(num_local_experts=8\\)"),
    ({"model_type": "mistral"}, "auto", "model_type 'mistral' is not supported"),
    ({"model_type": "qwen2"}, "hf-llama", "model_type 'qwen2' is not 'llama'"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "auto",
     "LlamaForSequenceClassification.* is not supported"),
    ({"num_key_value_heads": 3}, "auto", "num_key_value_heads=3 does not divide"),
    ({"max_position_embeddings": 4096}, "auto",
     "max_len=4096 \\(config.json max_position_embeddings\\) exceeds"),
])
def test_unsupported_features_are_refused_by_name(source, tmp_path, capsys, changes, fmt,
                                                  message):
    src = _copy(source, tmp_path / "m", **changes)
    capsys.readouterr()
    assert cli(["import", str(src), "--format", fmt, "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpc3 import: error: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert not (tmp_path / "x.npz").exists()                  # nothing stored


def test_max_len_cuts_a_long_context_to_the_ceiling(source, tmp_path):
    src = _copy(source, tmp_path / "m", max_position_embeddings=4096)
    assert load_llama(src, max_len=128)[0].max_len == 128


def test_unexpected_missing_and_misshapen_tensors_are_refused(source, tmp_path):
    from protocols.model.safetensors import read_safetensors, write_safetensors
    src = _copy(source, tmp_path / "m")
    st = src / "model.safetensors"
    tensors = read_safetensors(st)[0]
    q = "model.layers.0.self_attn.q_proj"

    f = src / "config.json"
    original = f.read_text()

    def refused(changed, message, **conf):
        write_safetensors(st, changed)
        f.write_text(json.dumps({**json.loads(original), **conf}))
        with pytest.raises(HF.ImportRefused, match=message):
            load_llama(src)
        write_safetensors(st, tensors)
        f.write_text(original)
    refused({**tensors, f"{q}.bias": np.zeros(D, np.float32)},
            r"\['layers.0.self_attn.q_proj.bias'\] are not part")
    k = "model.layers.1.self_attn.k_proj.weight"
    refused({**tensors, k: np.ascontiguousarray(tensors[k].T)},
            r"'layers.1.self_attn.k_proj.weight' has shape \(32, 16\), expected \(16, 32\)")
    refused({n: a for n, a in tensors.items() if n != "lm_head.weight"},
            "no lm_head.weight and tie_word_embeddings is false")
    refused({n: a for n, a in tensors.items() if "up_proj" not in n},
            "'layers.0.mlp.up_proj.weight' is missing")
    refused(tensors, "tie_word_embeddings is true but lm_head.weight differs",
            tie_word_embeddings=True)
    with pytest.raises(HF.ImportRefused, match="--pool and --normalize apply"):
        import_checkpoint(src, pool="mean")
    inv = "model.layers.0.self_attn.rotary_emb.inv_freq"     # older checkpoints: ignored
    write_safetensors(st, {**tensors, inv: np.ones(4, np.float32)})
    assert load_llama(src)[0].rope_theta == 10000.0
    (src / "tokenizer.model").write_bytes(b"sentencepiece")
    with pytest.raises(HF.ImportRefused, match="tokenizer is there only as tokenizer.model"):
        import_checkpoint(src)
