"""``mpc3 bench lm`` and the measured breakdown by operation type (protocols.jobs.breakdown): the
command runs for every architecture and attention, the JSON has DESIGN.md's fields, the
categories sum to the communicators' totals, the totals equal the declared costs, and the
categories hold what they say (LayerNorm and FFN-activation bytes = their declared costs)."""
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.bench import lm as L
from app.cli import build_parser, main
from mpc3.kernels import arith, truncation
from mpc3.party import RingConfig
from mpc3.sharing import deal
from mpc3.sim import make_parties, run_parties
from protocols.jobs import breakdown as BD
from protocols.stacks import causal_lm as LM
from protocols.layers import ln_proj as LP
from protocols.layers.ffn import cost_activation
from protocols.layers.layernorm import cost_layernorm

SMALL = ["--d-model", "16", "--heads", "2", "--layers", "2", "--d-ff", "32", "--prompt", "8"]
NAMES = sorted(set(L.ATTENTIONS.values()))          # "sigma" is an alias of sigma-relu
CASES = ([("decoder-only", a, 2) for a in NAMES]
         + [("classifier", a, 0) for a in NAMES]
         + [("encoder-decoder", a, 2) for a in NAMES]
         + [("encoder", a, 0) for a in NAMES])
KEYS = ("wall_s", "bytes_total", "messages", "rounds")


def _run(*extra):
    a = build_parser().parse_args(["bench", "lm", *SMALL, *extra])
    return L.run_lm(a)


def _check_phase(ph, arch=None):
    """``arch`` encoder: its pooling and normalization are ``other`` (protocols.jobs.breakdown)."""
    bd = ph["breakdown"]
    assert set(bd) == set(BD.CATEGORIES)
    for k in ("bytes_total", "messages"):
        assert sum(v[k] for v in bd.values()) == ph[k]
    assert sum(v["wall_s"] for v in bd.values()) == pytest.approx(ph["wall_s"], rel=1e-9)
    assert sum(v["rounds"] for v in bd.values()) == ph["rounds"]
    if arch != "encoder":
        assert bd["other"]["bytes_total"] == 0 and bd["other"]["rounds"] == 0
    assert ph["declared"]["bytes_total"] == ph["bytes_total"]
    assert ph["declared"]["bytes_per_party"] == ph["bytes_per_party"]
    assert ph["declared"]["rounds"] == ph["rounds"]


@pytest.mark.parametrize("arch,attention,tokens", CASES)
def test_bench_lm_runs_every_arch_and_attention(arch, attention, tokens):
    r = _run("--arch", arch, "--attention", attention, "--tokens", str(tokens))
    for k in ("workload", "params", "transport", "net", "wall_s", "bytes_total",
              "bytes_per_party", "messages", "rounds", "breakdown", "checks", "max_abs_err",
              "plain_wall_s", "peak_rss_bytes", "per_token_bytes", "per_token_rounds"):
        assert k in r, k
    assert r["params"]["load_avg_1m_at_end"] >= 0
    assert r["checks"] == {"breakdown_equals_measured": True, "declared_equals_measured": True}
    phases = [r[r["phase0"]]] + r["steps"]
    assert len(phases) == 1 + tokens
    for ph in phases:
        _check_phase(ph, arch)
    if arch == "encoder":                     # mean pooling is local; normalization is other
        assert r["breakdown"]["other"]["bytes_total"] > 0
    assert sum(p["bytes_total"] for p in phases) == r["bytes_total"]
    assert sum(p["rounds"] for p in phases) == r["rounds"]
    for c in BD.CATEGORIES:
        assert r["breakdown"][c]["bytes_total"] == sum(p["breakdown"][c]["bytes_total"]
                                                       for p in phases)
    if tokens:
        assert r["per_token_bytes"] == pytest.approx(np.mean([p["bytes_total"]
                                                              for p in r["steps"]]))
    assert r["max_abs_err"] < 1e-2
    assert r["breakdown"]["matmul"]["bytes_total"] > 0
    assert r["breakdown"]["attention"]["bytes_total"] > 0
    assert r["breakdown"]["norm"]["bytes_total"] > 0


@pytest.mark.parametrize("ffn", ["relu", "gelu"])
def test_categories_hold_their_layers(ffn):
    """Decoder-only, pre-LN, L = 2, T = 8: the prefill's LayerNorms (LN1 on T rows, LN2 on
    T rows then on the last row only, the final LN on one row) and FFN activations, and a
    step's (one row each; its LN2 forms W1 in its rounds, so that product is the norm's:
    causal_lm.lm_fusions), are exactly their declared costs."""
    r = _run("--arch", "decoder-only", "--attention", "softmax", "--ffn", ffn, "--tokens", "1")
    ring, d, T, dff = RingConfig(), 16, 8, 32
    ln = lambda rows: cost_layernorm(ring, rows, d).bytes_total          # noqa: E731
    act = lambda rows: cost_activation(ring, rows * dff, ffn,  # noqa: E731
                                       split=ffn == "relu").bytes_total
    pre, step = r["prefill"]["breakdown"], r["steps"][0]["breakdown"]
    assert pre["norm"]["bytes_total"] == ln(T) + ln(T) + ln(T) + ln(1) + ln(1)
    assert pre["ffn_act"]["bytes_total"] == act(T) + act(1)
    cfg = L.lm_config("decoder-only", "softmax", d, 2, 2, dff, T, 1, ffn)
    fused = LM.lm_fusions(cfg)
    assert sorted(fused) == ["dec.0.ln2", "dec.1.ln2"]          # LN2 forms W1 (pre-LN)
    assert step["norm"]["bytes_total"] == 3 * ln(1) + sum(
        LP.cost_ln_proj(ring, cfg, 1, names, False, True, True).bytes_total
        for names in fused.values())
    assert step["ffn_act"]["bytes_total"] == 2 * act(1)


def test_aero_preset_has_no_ffn_activation():
    r = _run("--preset", "aero", "--tokens", "1")
    assert r["params"]["ffn_act"] == "none" and r["params"]["preset_note"]
    act = r["breakdown"]["ffn_act"]                     # the identity: no traffic
    assert (act["bytes_total"], act["messages"], act["rounds"]) == (0, 0, 0)
    with pytest.raises(ValueError, match="softmax-only"):
        _run("--preset", "aero", "--attention", "sigma")


def test_recorder_attributes_innermost_and_passes_through():
    """A product inside a region of another category belongs to that region; calls from a
    party without a recorder are not counted; no module attribute is swapped for it."""
    rng = np.random.default_rng(0)
    x = deal(rng.integers(0, 2 ** 20, (4, 4), dtype=np.uint64))
    from mpc3.kernels import fxp
    original = arith.mul_aa

    def fn(p, x):
        y = arith.mul_aa(p, x, x)                         # matmul
        z = fxp.exp_a(p, truncation.trunc_a(p, y, 20))        # trunc: matmul; exp: attention
        return y, z

    parties = make_parties(RingConfig())
    recs = []

    def body(p, x):
        if p.rank == 2:                               # no recorder: passes through
            return fn(p, x)
        with BD.recording(p) as rec:
            assert arith.mul_aa is original and p.profiler is rec
            out = fn(p, x)
            recs.append((p.rank, rec.take()))
        assert p.profiler is None
        return out

    run_parties(body, [(s,) for s in x], parties=parties)
    assert len(recs) == 2
    for rank, got in recs:
        cats, total = got[:-1], got[-1]
        assert (cats.sum(axis=0) == total).all()
        assert total[1] == parties[rank].stats.bytes_sent
        m, a = BD.CATEGORIES.index("matmul"), BD.CATEGORIES.index("attention")
        assert cats[m, 3] == (arith.cost_mul(16, RingConfig(frac=18, trunc="exact")).rounds
                              + truncation.cost_trunc(16, RingConfig(trunc="exact"), 20).rounds)
        assert cats[a, 3] > 0 and cats[a, 1] > 0
        assert cats[BD.CATEGORIES.index("norm"), 1] == 0


def test_cli_writes_json_and_plot(tmp_path, capsys):
    """With the plot extra a PNG; without it (CI installs .[test,interop], no matplotlib) one
    clear error before anything runs."""
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["bench", "lm", *SMALL, "--attention", "sigma", "--tokens", "1", "--json", str(out)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main(argv + ["--plot", str(png)]) == 2
        assert "pip install" in capsys.readouterr().err and not out.exists()
        assert main(argv) == 0
    else:
        assert main(argv + ["--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads(out.read_text())
    assert r["workload"] == "lm/decoder-only/sigma" and r["checks"]["declared_equals_measured"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(L.__file__).parents[2]).stdout.strip()
    assert r["params"]["commit"] == (head or None) and "dirty" in r["params"]


@pytest.mark.parametrize("arch", ["decoder-only", "encoder-decoder"])
def test_fuse_changes_rounds_not_the_function(arch):
    """--fuse reaches the session (prefill / decode_open): every step's measured traffic is
    its declared cost with those fusions, the steps take fewer rounds than the default's, the
    output stays the plaintext model's."""
    runs = {f: _run("--arch", arch, "--attention", "relu-performer", "--tokens", "2",
                    *(["--fuse", f] if f else [])) for f in (None, "all", "none")}
    for f, r in runs.items():
        assert r["checks"] == {"breakdown_equals_measured": True,
                               "declared_equals_measured": True}, f
        assert r["params"]["fuse"] == (f or "default") and r["max_abs_err"] < 1e-2
    rounds = {f: r["per_token_rounds"] for f, r in runs.items()}
    assert rounds["all"] < rounds[None] < rounds["none"]


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="--fuse: lm_prefill fuse 'cross'"):
        _run("--fuse", "cross")
    with pytest.raises(ValueError, match="no tokens"):
        _run("--arch", "classifier", "--tokens", "1")
    with pytest.raises(ValueError, match="an encoder generates no tokens"):
        _run("--arch", "encoder", "--tokens", "1")
    with pytest.raises(ValueError, match="divisible"):
        L.lm_config("decoder-only", "softmax", 10, 3, 1, 8, 4, 1)


def test_gpt2small_extrapolation_is_exact_for_bytes_and_rounds():
    """benchmarks/lm_gpt2small.py extrapolates a run measured at fewer layers linearly: for
    bytes and rounds that is exact (L - 1 full layers + the last one), checked against a
    measured run with more layers."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import lm_gpt2small as G
    runs = {n: _run("--layers", str(n), "--tokens", "1") for n in (1, 2, 3)}
    est = G.extrapolate({n: runs[n] for n in (1, 2)}, layers=3)
    assert est["from_layers"] == [1, 2]
    assert est["bytes_total"] == runs[3]["bytes_total"]
    assert est["rounds"] == runs[3]["rounds"]
    assert G.extrapolate({2: runs[2]}, layers=3) is None


def test_bench_lm_llama_preset_breaks_down_rmsnorm_rotary_and_the_gated_ffn():
    """--preset llama (RMSNorm, rotary, SiLU-gated FFN) with grouped KV heads: the checks
    hold, and the categories hold what they say - norm is the RMSNorms' declared cost,
    rotary the q/k truncations', ffn_act the SiLUs'."""
    from mpc3.kernels.silu import cost_silu
    from protocols.layers.layernorm import cost_rmsnorm
    from protocols.layers.rotary import cost_rope
    a = build_parser().parse_args(["bench", "lm", "--d-model", "32", "--heads", "4",
                                   "--kv-heads", "2", "--layers", "2", "--d-ff", "48",
                                   "--prompt", "6", "--tokens", "2", "--preset", "llama"])
    r = L.run_lm(a)
    assert r["checks"] == {"breakdown_equals_measured": True, "declared_equals_measured": True}
    assert r["params"]["model_config"]["n_kv_heads"] == 2 and r["max_abs_err"] < 1e-2
    step, rc = r["steps"][0], RingConfig()
    _check_phase(step)
    bd = step["breakdown"]                 # one row per step; 2 layers, q 32 + k 16 wide
    assert bd["norm"]["bytes_total"] == sum(cost_rmsnorm(rc, 1, 32).bytes_per_party) * 5
    assert bd["rotary"]["bytes_total"] == sum(cost_rope(rc, 48).bytes_per_party) * 2
    assert bd["ffn_act"]["bytes_total"] == sum(cost_silu(48, rc).bytes_per_party) * 2
    with pytest.raises(ValueError, match="needs --preset llama"):
        L.lm_config("decoder-only", "softmax", 32, 4, 1, 48, 4, 1, kv_heads=2)


def test_every_target_is_a_profiled_entry_point():
    """protocols.jobs.breakdown.TARGETS names exactly the functions marked
    mpc3.party.profiled (no stale entry, no region without a category)."""
    import importlib
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    marked = {f"{'.'.join(f.relative_to(root).with_suffix('').parts)}.{name}"
              for pkg in ("mpc3", "protocols") for f in (root / pkg).rglob("*.py")
              for name in re.findall(r"^@profiled\ndef (\w+)\(", f.read_text(), re.M)}
    assert marked == {f"{m}.{n}" for m, n, _ in BD.TARGETS}
    for m, n, _ in BD.TARGETS:
        assert getattr(importlib.import_module(m), n).profiled == f"{m}.{n}"


@pytest.mark.parametrize("transport", ["inproc", "grpc"])
def test_malicious_mode_counts_each_phases_verification(transport):
    """--security malicious: the parties (in process, or three party processes whose
    cluster.toml says so) run in malicious mode; every phase ends with its flush, whose
    traffic is the breakdown's ``verify`` category (absent from semi-honest mode); the
    categories still sum to the measured totals, the output is the reference's, and every
    other category carries at least semi-honest mode's bytes and rounds (malicious mode
    keeps their messages and adds to some)."""
    args = ["--layers", "1", "--prompt", "4", "--tokens", "1", "--attention",
            "relu-performer", "--ffn", "relu", "--transport", transport]
    semi = _run(*args)
    mal = _run(*args, "--security", "malicious")
    assert (semi["security"], mal["security"]) == ("semi-honest", "malicious")
    assert mal["checks"] == {"breakdown_equals_measured": True}
    assert mal["max_abs_err"] < 1e-2
    for s, m in zip([semi["prefill"]] + semi["steps"], [mal["prefill"]] + mal["steps"]):
        _check_phase(s)
        assert s["breakdown"]["verify"]["bytes_total"] == 0
        assert m["breakdown"]["verify"]["bytes_total"] > 0
        assert m["breakdown"]["verify"]["rounds"] >= 10       # digests, a proof, verdicts
        for c in BD.CATEGORIES:
            if c != "verify":
                assert m["breakdown"][c]["bytes_total"] >= s["breakdown"][c]["bytes_total"]
                assert m["breakdown"][c]["rounds"] >= s["breakdown"][c]["rounds"], c
