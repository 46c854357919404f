"""``mpc3 import`` of checkpoints laid out like Hugging Face BERT and GPT-2, checked against
the original framework's forward pass (transformers, CPU torch; the ``test`` extra installs
both). Tiny models are built here from a config object with a fixed seed and saved with
``save_pretrained`` - no hub downloads.

Shapes: d=32, 2 layers, 4 heads, vocab 50, 16 positions, BERT d_ff 64 and 3 labels, GPT-2
d_ff 128; every parameter is perturbed by N(0, 0.15^2) noise after HF's initialisation
(which zeroes biases and sets LayerNorms to 1), so biases, LayerNorm affine parameters and
attention patterns all matter.

Bounds:
* plaintext reference vs transformers in float64 (``model.double()``): 1e-9 - the same
  function up to float64 rounding (measured 4e-16 BERT, 3e-15 GPT-2 on logits of magnitude
  1-3); vs the float32 forward: 1e-4 (float32 rounding over two layers; measured 2e-7 BERT,
  1.3e-6 GPT-2);
* GPT-2's ``gelu_new`` (tanh approximation) vs mpc3's exact-erf GELU: the FFN
  pre-activations of the test inputs are checked to differ by <= hf_import.GELU_TANH_GAP
  per activation, and the logits by < 1e-2 (measured 7.7e-4);
* secure BERT classify (three in-process parties, the production ``classify`` job) vs
  transformers' logits: 1e-2 absolute (measured 2.1e-4 on B=4, S=16), vs mpc3's reference
  2e-3; secure GPT-2 prefill + KV-cache steps vs transformers' logits: 1e-2.
"""
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from app.cli import main as cli  # noqa: E402
from app.owner import calibration_samples  # noqa: E402
from helpers.hf_models import _perturb, make_bert  # noqa: E402
from mpc3 import ring  # noqa: E402
from mpc3.sharing import deal  # noqa: E402
from net.client.outputs import reconstruct  # noqa: E402
from net.party.inproc import InprocParties  # noqa: E402
from protocols.calibration import calibrate as C  # noqa: E402
from protocols import model as M  # noqa: E402
from protocols.layers import secure_model as SM  # noqa: E402
from protocols.model import hf_import as HF  # noqa: E402

def make_gpt2(path, **kw):
    torch.manual_seed(0)
    conf = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4,
                                   n_positions=16, bos_token_id=0, eos_token_id=0, **kw)
    model = _perturb(transformers.GPT2LMHeadModel(conf), 2)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    return make_bert(path), path


def _import(tmp_path, src, fmt="auto"):
    out = tmp_path / "imported.npz"
    assert cli(["import", str(src), "--format", fmt, "--out", str(out)]) == 0
    return M.load_model(out)


def _ids(rng, B, S, vocab=50):
    return rng.integers(0, vocab, (B, S))


def test_bert_reference_matches_transformers(bert, tmp_path, capsys):
    model, path = bert
    cfg, w, user = _import(tmp_path, path)
    assert "MPC parameters" in capsys.readouterr().out
    assert (cfg.arch, cfg.attention, cfg.pool, cfg.embedding, cfg.attn_bias, cfg.norm_first,
            cfg.ffn_act, cfg.type_vocab, cfg.n_classes) == \
        ("encoder-classifier", "softmax", "cls-tanh", "learned-ln", True, False, "gelu", 2, 3)
    assert set(user) == {"embed.src", "embed.pos", "embed.type", "embed.ln.gamma",
                         "embed.ln.beta"}                        # user-side, never shared
    rng = np.random.default_rng(0)
    ids, types = _ids(rng, 3, 9), rng.integers(0, 2, (3, 9))
    ours = M.ref_classify(cfg, w, M.embed_tokens(cfg, user, ids, types=types))
    with torch.no_grad():
        t_ids, t_types = torch.tensor(ids), torch.tensor(types)
        f32 = model(input_ids=t_ids, token_type_ids=t_types).logits.numpy()
        f64 = model.double()(input_ids=t_ids, token_type_ids=t_types).logits.numpy()
        model.float()
    assert np.abs(f64).max() > 0.1                              # not a trivial output
    assert np.max(np.abs(ours - f64)) < 1e-9
    assert np.max(np.abs(ours - f32)) < 1e-4
    from argparse import Namespace                  # `mpc3 infer --ids` embeds the same way
    from app.cli.models import _embedded_ids
    x = _embedded_ids(Namespace(model=str(tmp_path / "imported.npz"), ids="4,7,1"))
    np.testing.assert_array_equal(x, M.embed_tokens(cfg, user, [[4, 7, 1]]))


def test_bert_shares_calibrates_and_classifies_securely(bert, tmp_path):
    model, path = bert
    cfg, w, user = _import(tmp_path, path)
    # what share-model does before uploading: samples from the user tables, calibration
    cal = C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)
    assert {"tanh", "pool_dense", "rowmax", "vout"} <= {s for row in cal.layers.values()
                                                        for s in row}
    rng = np.random.default_rng(1)
    ids = _ids(rng, 2, 8)
    x = M.embed_tokens(cfg, user, ids)
    C.check_input(cal, "X", x)
    parties = InprocParties.for_model(cfg, w)
    dealt = deal(ring.encode(x, ring.DEFAULT_FRAC))
    jobs = parties.run("classify", {}, [{"X": dealt[n]} for n in range(3)])
    got = ring.decode(reconstruct([j.outputs for j in jobs])["logits"])
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.max(np.abs(got - M.ref_classify(cfg, w, x))) < 2e-3
    assert np.max(np.abs(got - theirs)) < 1e-2
    assert [e["layer"] for e in jobs[0].costs] == ["enc.0", "enc.1", "head"]


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_gpt2_reference_matches_transformers(tmp_path, capsys, act):
    model = make_gpt2(tmp_path / "gpt2", activation_function=act)
    cfg, w, user = _import(tmp_path, tmp_path / "gpt2", "hf-gpt2")
    notes = capsys.readouterr().out
    assert ("tanh approximation" in notes) == (act == "gelu_new")
    assert (cfg.arch, cfg.attention, cfg.embedding, cfg.norm_first, cfg.attn_bias) == \
        ("decoder-only", "softmax", "learned", True, True)
    assert np.array_equal(user["out.w"], user["embed.tgt"].T)   # LM head tied to wte
    rng = np.random.default_rng(2)
    ids = _ids(rng, 2, 16)
    x = M.embed_tokens(cfg, user, ids)
    ours = M.output_logits(user, M.ref_lm(cfg, w, x))
    with torch.no_grad():
        f32 = model(input_ids=torch.tensor(ids)).logits.numpy()
        f64 = model.double()(input_ids=torch.tensor(ids)).logits.numpy()
        model.float()
    assert np.abs(f64).max() > 0.1
    if act == "gelu":
        assert np.max(np.abs(ours - f64)) < 1e-9
        assert np.max(np.abs(ours - f32)) < 1e-4
        want = []                                  # greedy continuation, token by token
        seq = ids[:1, :5]
        for _ in range(4):
            with torch.no_grad():
                tok = int(model(input_ids=torch.tensor(seq)).logits[0, -1].argmax())
            want.append(tok)
            seq = np.concatenate([seq, [[tok]]], axis=1)
        assert M.greedy_generate(cfg, w, user, ids[:1, :5], 4) == [want]
        return
    pre = []                                       # FFN pre-activations on these inputs

    def grab(module, inputs, output):
        pre.append(output.detach().double().numpy())
    hooks = [blk.mlp.c_fc.register_forward_hook(grab) for blk in model.transformer.h]
    with torch.no_grad():
        model(input_ids=torch.tensor(ids))
    for h in hooks:
        h.remove()
    a = np.concatenate([p.ravel() for p in pre])
    tanh_gelu = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
    gap = np.abs(tanh_gelu - M.ffn_activation(a, "gelu")).max()
    assert np.abs(a).max() > 1.5 and gap <= HF.GELU_TANH_GAP
    assert np.max(np.abs(ours - f64)) < 1e-2


def test_gpt2_secure_prefill_and_steps_match_transformers(tmp_path, run):
    """An imported GPT-2 (softmax attention with biases, pre-LN, learned positions) runs
    securely: calibration passes, the prompt's prefill and two KV-cache steps give logits
    within 1e-2 of transformers' (three in-process parties)."""
    model = make_gpt2(tmp_path / "gpt2")
    cfg, w, user = _import(tmp_path, tmp_path / "gpt2")
    C.calibrate(cfg, w, calibration_samples(cfg, w, user), user=user)
    from conftest import share, value
    from protocols.stacks import causal_lm as LM
    ids = _ids(np.random.default_rng(3), 1, 7)
    x = M.embed_tokens(cfg, user, ids)

    def fn(p, s, xs):
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :5])
        return [h] + [LM.lm_step(p, cfg, s, st, xs[:, t]) for t in (5, 6)]

    res = run(fn, SM.share_model(cfg, w), share(x))
    with torch.no_grad():
        want = model.double()(input_ids=torch.tensor(ids)).logits.numpy()
    for k, t in enumerate((4, 5, 6)):
        got = M.output_logits(user, value([r[k] for r in res]))
        assert np.max(np.abs(got - want[:, t])) < 1e-2, t


def test_sharded_checkpoint_and_directory_share_model_input(tmp_path):
    model = make_bert(tmp_path / "b")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = HF.load_hf(tmp_path / "b")
    b = HF.load_hf(tmp_path / "sharded")
    assert a[0] == b[0] and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
    from app.cli.common import load_model_file      # share-model's reader takes the directory
    cfg, w, user = load_model_file(str(tmp_path / "b"))
    assert cfg == a[0] and sorted(user) == sorted(a[2])


def _edit_config(path, **changes):
    f = path / "config.json"
    conf = json.loads(f.read_text())
    conf.update(changes)
    f.write_text(json.dumps(conf))


@pytest.mark.parametrize("maker,changes,message", [
    (make_bert, {"hidden_act": "silu"}, "activation hidden_act='silu' is not supported"),
    (make_bert, {"position_embedding_type": "relative_key"},
     "relative position embeddings .* is not supported"),
    (make_bert, {"add_cross_attention": True}, "cross-attention .* is not supported"),
    (make_bert, {"model_type": "t5"}, "model_type 't5' is not supported"),
    (make_bert, {"architectures": ["BertForMaskedLM"]}, "BertForMaskedLM.* is not supported"),
    (make_gpt2, {"scale_attn_by_inverse_layer_idx": True},
     "attention scaled by 1 / layer index .* is not supported"),
    (make_gpt2, {"activation_function": "swish"}, "activation_function='swish'"),
])
def test_unsupported_features_are_refused_by_name(tmp_path, capsys, maker, changes, message):
    maker(tmp_path / "m")
    _edit_config(tmp_path / "m", **changes)
    capsys.readouterr()                           # transformers' progress bar
    assert cli(["import", str(tmp_path / "m"), "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpc3 import: error: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert not (tmp_path / "x.npz").exists()


def test_other_heads_wrong_layouts_and_pickles_are_refused(tmp_path):
    from protocols.model.safetensors import read_safetensors, write_safetensors
    make_bert(tmp_path / "m")
    st = tmp_path / "m" / "model.safetensors"
    tensors = read_safetensors(st)[0]
    write_safetensors(st, {**tensors, "cls.predictions.bias": np.zeros(50, np.float32)})
    with pytest.raises(HF.ImportRefused, match=r"\['cls.predictions.bias'\] are not part"):
        HF.load_hf(tmp_path / "m")
    write_safetensors(st, {k: v for k, v in tensors.items() if not k.startswith("classifier")})
    with pytest.raises(HF.ImportRefused, match="no classifier head"):
        HF.load_hf(tmp_path / "m")
    make_gpt2(tmp_path / "g")
    st = tmp_path / "g" / "model.safetensors"
    tensors = read_safetensors(st)[0]
    k = "transformer.h.0.attn.c_attn.weight"
    write_safetensors(st, {**tensors, k: np.ascontiguousarray(tensors[k].T)})
    with pytest.raises(HF.ImportRefused, match="stores Conv1D weights as \\(in, out\\)"):
        HF.load_hf(tmp_path / "g")
    st.unlink()
    (tmp_path / "g" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(HF.ImportRefused, match="reads safetensors only"):
        HF.load_hf(tmp_path / "g")
    with pytest.raises(ValueError, match="no config.json"):
        HF.load_hf(tmp_path, "hf-bert")
