"""benchmarks/malicious_decode.py on its smallest decoder: both modes decode the float64
reference's tokens, malicious mode proves the start and each token (one flush each at
this size) and costs more bytes and rounds a token, and the JSON carries provenance; a
short tamper campaign on a token's messages aborts or leaves every token unchanged."""
import json

from helpers.bench_scripts import script

B = script("malicious_decode")


def test_the_benchmark_compares_the_modes_per_token(tmp_path):
    out = tmp_path / "r.json"
    B.main(["--tiny", "--tokens", "2", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["benchmark"] == "malicious_decode" and r["commit"] and "load_avg_1m_at_end" in r
    semi, mal = r["semi_honest"], r["malicious"]
    assert semi["max_abs_err"] < 1e-2 and mal["max_abs_err"] < 1e-2
    assert len(semi["tokens"]) == len(mal["tokens"]) == 2
    assert semi["proof_gates_party0"] == [] and len(mal["proof_gates_party0"]) == 3
    for s, m in zip(semi["tokens"], mal["tokens"]):
        assert sum(m["bytes_per_party"]) > sum(s["bytes_per_party"])
        assert m["rounds"] > s["rounds"]
    assert r["last_token_ratio"]["rounds"] > 1


def test_a_campaign_tampers_with_the_last_tokens_messages(tmp_path):
    out = tmp_path / "r.json"
    B.main(["--tiny", "--tokens", "1", "--campaign", "3", "--honest", "1", "--json", str(out)])
    c = json.loads(out.read_text())["campaign"]
    assert c["trials"] == 3 and sum(c["outcomes"].values()) == 3 and c["messages_in_pool"]
    assert set(c["outcomes"]) <= {"aborted", "unchanged"}, c
    assert c["honest_aborts"] == 0
