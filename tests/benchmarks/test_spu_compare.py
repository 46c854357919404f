"""benchmarks/spu_compare.py without SPU: arguments, interleaving order and the JSON it writes
(the runner is faked; the real harness needs SPU's own venv and is never run in CI)."""
import json

import pytest

from helpers.bench_scripts import script

C = script("spu_compare")


def test_args_defaults_and_row_selection(monkeypatch):
    monkeypatch.setenv("MPC3_SPU_PYTHON", "/opt/spu/bin/python")
    a = C.parse_args([])
    assert a.only == C.ROW_KEYS and a.rounds >= 1 and a.repeat >= 1
    assert a.spu_python == "/opt/spu/bin/python"
    assert C.parse_args(["--only", "ln,relu", "--spu-python", "/x"]).only == ("ln", "relu")
    with pytest.raises(SystemExit):
        C.parse_args(["--only", "gelu"])


def test_missing_spu_python_says_how_to_install(tmp_path):
    with pytest.raises(SystemExit, match=r"pip install spu==0\.9\.5"):
        C.check_spu_python(str(tmp_path / "no-such-python"))


def test_commands_run_party_processes():
    rows = {r.key: r for r in C.ROWS}
    op = C.mpc3_cmd(rows["relu"], 3, "o.json")
    assert op[1:4] == ["bench", "op", "relu"] and "--transport" in op and "grpc" in op
    layer = C.mpc3_cmd(rows["ln"], 3, "o.json")
    assert "mpc3-layer" in layer and "ln" in layer        # app.bench.remote: real processes
    spu = C.spu_cmd(rows["mha"], 3, "s.json", "/opt/spu/bin/python")
    assert spu[0] == "/opt/spu/bin/python" and spu[2:4] == ["run", "mha"]


def test_interleaved_run_writes_report(tmp_path):
    calls = []

    def fake(side, cmd, out, timeout):
        calls.append((side, cmd))
        t = 0.1 if side == "mpc3" else 0.4
        return {"wall_s": {"min": t, "median": t, "runs": [t, t * 1.1]},
                "bytes_total": 100 if side == "mpc3" else 400, "rounds": 7}

    out = tmp_path / "r.json"
    a = C.parse_args(["--only", "ln,matmul", "--rounds", "2", "--repeat", "2",
                      "--json", str(out), "--spu-python", "/opt/spu/bin/python"])
    C.run(a, runner=fake, spu_version="0.9.5 0.4.34")
    assert [s for s, _ in calls] == ["mpc3", "spu"] * 4
    rep = json.loads(out.read_text())
    assert rep["schema"] == C.SCHEMA and rep["versions"]["spu"] == "0.9.5"
    assert len(rep["host"]["loadavg_start"]) == 3 and len(rep["host"]["loadavg_end"]) == 3
    assert isinstance(rep["host"]["overloaded"], bool) and isinstance(rep["notes"], list)
    assert [r["key"] for r in rep["rows"]] == ["matmul", "ln"]
    for r in rep["rows"]:
        assert r["mpc3"]["wall_s"]["n"] == 4 and r["spu"]["wall_s"]["n"] == 4
        assert r["ratio_time_median"] == pytest.approx(0.25)
        assert r["ratio_bytes"] == pytest.approx(0.25) and r["mpc3_faster"]
        assert len(r["ratio_time_median_per_round"]) == 2
    assert len(rep["commands"]) == 8 and {"mpc3", "spu"} == {c["side"] for c in rep["commands"]}
    assert "| LayerNorm 64x512 |" in C.table(rep)
