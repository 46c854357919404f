"""benchmarks/malicious.py on its smallest encoder: both modes give the float64 reference's
output, malicious mode sends more and takes more rounds than semi-honest, the JSON carries
provenance, and a short tamper campaign aborts or leaves the output bit-for-bit unchanged in
every trial, with no abort in an honest run."""
import json

from helpers.bench_scripts import script

B = script("malicious")


def test_the_benchmark_compares_the_modes_and_runs_a_campaign(tmp_path):
    out = tmp_path / "r.json"
    B.main(["--tiny", "--campaign", "4", "--honest", "1", "--kernels", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["benchmark"] == "malicious" and r["commit"] and "load_avg_1m_at_end" in r
    semi, mal = r["semi_honest"], r["malicious"]
    assert semi["max_abs_err"] < 1e-2 and mal["max_abs_err"] < 1e-2
    assert r["ratio"]["bytes"] > 1 and mal["rounds"] > semi["rounds"]
    parts, flushes = mal["flush_bytes_party0"], len(mal["proof_gates_party0"])
    assert parts["digests"] == 64 * flushes and parts["proof"] > 0
    assert parts["witness fused_claims"] > 0 and parts["witness fused_claims"] % 16 == 0
    extra = r["extra_bytes_party0"]
    assert extra["flushes"] == sum(parts.values()) and extra["inside_kernels"] >= 0
    assert extra["flushes"] + extra["inside_kernels"] == (mal["bytes_per_party"][0]
                                                          - semi["bytes_per_party"][0])
    c = r["campaign"]
    assert c["trials"] == 4 and sum(c["outcomes"].values()) == 4
    assert set(c["outcomes"]) <= {"aborted", "unchanged"}, c
    assert sum(c["aborts_by_error"].values()) == c["outcomes"].get("aborted", 0)
    spent = mal["proof_kernel_s_summed_over_parties"]     # --kernels: every kernel ran
    assert {k.split()[0] for k in spent} == {name for _, name in B.KERNELS}
    assert min(spent.values()) >= 0
    assert "proof_kernel_s_summed_over_parties" not in semi
    assert c["honest_aborts"] == 0


def test_a_campaigns_budget_stops_its_trials(tmp_path):
    """--minutes: no trial starts past the budget (here none fits), the honest runs run."""
    out = tmp_path / "r.json"
    B.main(["--tiny", "--campaign", "50", "--honest", "1", "--minutes", "0.001", "--json",
            str(out)])
    c = json.loads(out.read_text())["campaign"]
    assert c["trials"] == 0 and c["trials_asked"] == 50 and c["minutes"] == 0.001
    assert c["honest_runs"] == 1 and c["honest_aborts"] == 0


def test_the_pending_profile_names_each_kernel_and_adds_up(tmp_path):
    """benchmarks/malicious_pending.py on a tiny causal LM: every point between kernels is
    named, the increases add up to the end's pending, and nothing flushed inside a layer."""
    P = script("malicious_pending")
    out = tmp_path / "p.json"
    P.main(["--prompt", "4", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--json",
            str(out)])
    r = json.loads(out.read_text())
    pts = r["points"]
    assert pts and all(p["kernel"].count(".") >= 2 for p in pts)
    assert sum(p["added"] for p in pts) == r["pending_at_end"] == pts[-1]["pending"]
    assert r["largest_added"] == max(p["added"] for p in pts) > 0 and r["flushes"] == 1
    assert "protocols.layers.ffn.activation" in {p["kernel"] for p in pts}
