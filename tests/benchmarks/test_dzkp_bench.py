"""benchmarks/dzkp.py at small sizes: its JSON carries provenance, the proof's measured rounds
and bytes equal the declared ones for products and matrix products, and the products are
right."""
import json

from helpers.bench_scripts import script

B = script("dzkp")


def test_the_benchmark_records_declared_equal_measured(tmp_path):
    out = tmp_path / "r.json"
    B.main(["--sizes", "50", "700", "--matmul", "4x48x8", "1x48x8", "--fxp", "3x16x5",
            "--widths", "2", "64", "--gram-terms", "8192", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["benchmark"] == "dzkp" and r["commit"] and "load_avg_1m_at_end" in r
    runs = r["runs"] + r["matmul_runs"]
    assert [x["gates"] for x in r["runs"]] == [50, 700] and len(runs) == 4
    assert all(x["declared_equals_measured"] for x in runs)
    assert all(x["soundness_bits"] >= 47.9 for x in runs)
    fxp, = r["fxp_runs"]
    semi, mal = fxp["semi-honest"], fxp["malicious"]
    assert semi["rounds"] == 2 and mal["rounds"] > semi["rounds"]       # exact truncation
    assert fxp["bytes_ratio"] > 1
    assert [(g["terms_per_gate"], g["gates"]) for g in r["gram_runs"]] == [(2, 4096), (64, 128)]
    assert [(f["terms_per_gate"], f["gates"]) for f in r["fold_runs"]] == [(2, 4096), (64, 128)]
    assert all(f["us_per_term"] > 0 for f in r["fold_runs"] + r["gram_runs"])


def test_kernels_only_times_the_first_compression_alone(tmp_path):
    out = tmp_path / "k.json"
    B.main(["--kernels-only", "--widths", "8", "--gram-terms", "4096", "--json", str(out)])
    r = json.loads(out.read_text())
    assert "runs" not in r and len(r["gram_runs"]) == len(r["fold_runs"]) == 1
