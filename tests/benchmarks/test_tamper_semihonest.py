"""benchmarks/tamper_semihonest.py on two kernels: the JSON it writes (provenance, one outcome
per trial, counts that add up) and its reproducibility from the seed."""
import json

from helpers.bench_scripts import script

T = script("tamper_semihonest")


def test_the_baseline_writes_counts_that_add_up_and_repeat(tmp_path):
    out = tmp_path / "r.json"
    T.main(["--only", "open,relu", "--trials", "2", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["benchmark"] == "tamper_semihonest" and r["commit"] and "load_avg_1m_at_end" in r
    assert r["command"].endswith("--only open,relu --trials 2 --json " + str(out))
    for name, k in r["kernels"].items():
        for d in T.DEVIATIONS:                 # open has one round: nothing to replay
            assert sum(k["counts"][d].values()) == (0 if (name, d) == ("open", "replay") else 2)
        assert len(k["trials"]) == sum(sum(c.values()) for c in k["counts"].values())
        trials = [T.parse_row(t) for t in k["trials"]]
        assert all(t["outcome"] in T.OUTCOMES for t in trials)
        assert sum(k["exceptions"].values()) == sum(t["outcome"].startswith("raised")
                                                    for t in trials)
    # an opened share changed on its way makes the parties open different values; a copy of
    # the job's last message is never read
    opened = [T.parse_row(t) for t in r["kernels"]["open"]["trials"]]
    assert {t["outcome"] for t in opened if t["deviation"] != "duplicate"} == {
        "raised_at_reveal"}
    assert {t["outcome"] for t in opened if t["deviation"] == "duplicate"} == {"unchanged"}
    again = tmp_path / "again.json"
    T.main(["--only", "open,relu", "--trials", "2", "--json", str(again)])
    assert json.loads(again.read_text())["kernels"] == r["kernels"]
