"""`mpc3 demo` (own local cluster, cleaned up) and `mpc3 bench translate` JSON metrics."""
import json
import tempfile

import pytest

from app import cli
from app import textdata as TD

KEYS = {"workload", "params", "transport", "net", "emulation", "wall_s", "bytes_total",
        "bytes_per_party", "messages", "rounds", "max_abs_err", "max_rel_err", "tokens",
        "token_agreement", "per_token_wall_s", "per_token_bytes", "per_token_rounds"}


@pytest.mark.parametrize("attention", ["relu-performer", "softmax"])
def test_bench_translate_random_json(tmp_path, capsys, attention):
    out = tmp_path / "r.json"
    assert cli.main(["bench", "translate", "--model", "random", "--d-model", "16", "--heads",
                     "2", "--features", "8", "--d-ff", "32", "--layers", "1", "--src-len",
                     "4", "--tokens", "3", "--sentences", "2", "--attention", attention,
                     "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["params"]["model_config"].get("attention", "relu-performer") == attention
    assert KEYS <= set(r)
    assert r["transport"] == "inproc" and r["tokens"] == 6 and r["steps"] == 3
    assert r["wall_s"]["min"] <= r["wall_s"]["median"]
    assert r["bytes_total"] == sum(r["bytes_per_party"]) > 0
    assert r["per_token_rounds"] * r["steps"] + r["open"]["rounds"] == r["rounds"]
    assert r["max_rel_err"] < 1e-2 and r["token_agreement"] == 1.0


@pytest.mark.skipif(not TD.SHIPPED_MODEL.exists(), reason="no shipped model")
def test_demo_runs_and_cleans_up(capsys, tmp_path, monkeypatch):
    """The demo's cluster directory goes into this test's own temporary folder (another
    demo on the machine cannot disturb the check) and is removed at the end."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.main(["demo", "7000"]) == 0
    out = capsys.readouterr().out
    assert "seven thousand" in out and "token agreement with the plaintext model: 3/3" in out
    assert "dec.0 (per step)" in out and "demo finished" in out
    assert not list(tmp_path.glob("mpc3-demo-*"))                    # its directory removed


def test_a_shared_model_must_be_the_local_files_but_for_how_parties_compute():
    """generate / translate / embed / classify check the cluster's config against the local
    model file: another softmax_form (share-model --softmax) is the same model, any other key
    is refused in one line naming it."""
    import dataclasses
    from app.cli.common import check_same_model
    from protocols import model as M
    cfg = M.ModelConfig(d_model=8, n_heads=2, d_head=4, n_features=2, d_ff=8, attn_c=1.0,
                        attn_norm="const", norm_first=True, max_len=8, arch="decoder-only",
                        n_dec_layers=1, tgt_vocab=5, attention="softmax").validate()
    check_same_model(dataclasses.replace(cfg, softmax_form="max-free"), cfg, "lm", "lm.npz")
    other = dataclasses.replace(cfg, max_len=16, ffn_act="gelu")
    with pytest.raises(ValueError, match=r"^model 'lm' on the cluster is not the model of "
                       r"lm.npz: ffn_act 'gelu' vs 'relu', max_len 16 vs 8$"):
        check_same_model(other, cfg, "lm", "lm.npz")


@pytest.mark.parametrize("argv, says", [
    (["demo", "--model", "lm", "hello"], "'hello' contains characters outside"),
    (["demo", "--model", "classifier", "123456"], "reads numbers below 10000"),
    (["demo", "--attention", "softmax"], "use it with --model lm"),
])
def test_demo_refuses_bad_arguments_before_starting(argv, says, capsys, tmp_path, monkeypatch):
    """Issue 32, item 6: `demo --model lm hello` generated and then crashed on int();
    --attention without --model lm was ignored. Both are refused at once, no party started."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_permit_and_kind_take_either_spelling():
    """Issue 32, item 6: the computation classify-argmax and the job kind classify_argmax
    are one name to a user: --permit and --kind accept both spellings."""
    from app.cli.models import job_kind
    from app.owner import check_permit
    assert check_permit(["classify_argmax"], "encoder-classifier") == ("classify-argmax",)
    assert job_kind("classify-argmax") == job_kind("classify_argmax") == "classify_argmax"
