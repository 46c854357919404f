"""Benchmarks over the network (app/bench/remote.py, protocols/jobs/diagnostic.py,
benchmarks/paper.py).

The loopback tests start three real party processes; the emulated one needs root and
``ip netns`` and is skipped cleanly otherwise.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import netns_skip_reason

from mpc3 import ring
from mpc3.sharing import deal, reveal
from mpc3.shares import AShare
from net.party.inproc import InprocParties
from protocols.jobs import ModelView, benchmark_registry
from protocols.jobs import diagnostic as D

ROOT = Path(__file__).resolve().parents[2]


_SKIP = netns_skip_reason()


def test_bench_job_reports_public_stats_in_process():
    """The job kind times R runs per party and returns a (3, 4, R) public sharing that
    reconstructs to the communicators' own counters."""
    x = np.random.default_rng(0).normal(size=300)
    models = [ModelView("m", {"in0": s}, {}) for s in deal(ring.encode(x))]
    parties = InprocParties(models, benchmark_registry())
    jobs = parties.run("bench_op", {"op": "relu", "repeat": 2},
                       [{"X": s} for s in deal(np.zeros(1, np.uint64))])
    outs = [j.outputs for j in jobs]
    st = reveal([o["stats"] for o in outs]).astype(np.int64)
    assert st.shape == (3, 4, 2)
    assert (st[:, 0] > 0).all()                                  # wall_ns
    # ReLU on few elements: 4 rounds (the two-round comparison, mpc3.kernels.thresholds)
    assert (st[:, 1, 0] == st[:, 1, 1]).all() and st[:, 3, 0].max() == 4
    # counted: barrier (1 round) + 2 runs + stats swap (1 round)
    assert [j.party.stats.bytes_sent for j in jobs] == list(st[:, 1].sum(1) + 16 + 2 * 8 * 8)
    y = ring.decode(reveal([o["Y"] for o in outs]))
    assert np.abs(y - np.maximum(x, 0)).max() < 1e-3


def test_validators_refuse_bad_params():
    model = ModelView("m", {"in0": AShare(np.zeros(3, np.uint64), np.zeros(3, np.uint64))}, {})
    with pytest.raises(ValueError):
        D.validate_bench_op(model, {"X": (1,)}, {"op": "nope"})
    with pytest.raises(ValueError):
        D.validate_bench_op(model, {"X": (1,)}, {"op": "relu", "repeat": 0})
    with pytest.raises(ValueError):
        D.validate_bench_layer(model, {"X": (1,)}, {"workload": "mha", "config": {}})


def test_loopback_cluster_matches_inproc_counts():
    from app.bench.op import run_op
    from mpc3.party import RingConfig
    from app.bench.remote import RemoteCluster, layer_config
    with RemoteCluster("none", quiet=True) as rc:
        r = rc.bench_op("relu", n=2048, repeat=2)
        lay = rc.bench_layer("ln", layer_config(seq=8, d_model=32, heads=2, features=8,
                                                d_ff=64, layers=1))
        d = rc.dir
    assert not d.exists()                                        # temp dir cleaned
    ref = run_op("relu", 2048, (1, 1, 1), 1, RingConfig())
    assert (r["transport"], r["net"], r["emulation"], r["tls"]) == ("grpc", "none", "none", True)
    assert r["bytes_total"] == ref["bytes_total"] and r["rounds"] == ref["rounds"]
    assert r["messages"] == ref["messages"] and r["max_abs_err"] < 1e-3
    assert len(r["wall_s"]["runs"]) == 2 and r["wall_s"]["min"] > 0
    assert lay["workload"] == "layer/ln" and lay["max_abs_err"] < 0.05 and lay["rounds"] > 0


def test_plaintext_cluster_measures_the_same_protocol():
    """--insecure-plaintext-for-local-dev (throughput.py's measure of what TLS costs): the
    same messages, bytes and rounds, the result saying it ran without TLS."""
    from app.bench.op import run_op
    from app.bench.remote import RemoteCluster
    from mpc3.party import RingConfig
    with RemoteCluster("none", quiet=True, insecure=True) as rc:
        assert not rc.cfg.tls
        r = rc.bench_op("relu", n=512)
    ref = run_op("relu", 512, (1, 1, 1), 1, RingConfig())
    assert r["tls"] is False and r["max_abs_err"] < 1e-3
    assert (r["bytes_total"], r["rounds"], r["messages"]) == \
        (ref["bytes_total"], ref["rounds"], ref["messages"])


@pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")
def test_emulated_network_delays_every_round():
    """Under emulation, measured time >= rounds x one-way delay; links verified and recorded;
    nothing left behind."""
    from app.bench.remote import RemoteCluster
    with RemoteCluster("custom:200:30", quiet=True, verify_seconds=0.5) as rc:
        r = rc.bench_op("relu", n=1024)
        ns = list(rc.emu.namespaces)
    assert r["emulation"] in ("netem", "tbf+relay") and r["net"] == "custom:200:30"
    assert len(r["links"]) == 3 and all(29 <= x["rtt_min_ms"] <= 36 for x in r["links"])
    assert r["wall_s"]["min"] >= r["rounds"] * 0.015
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in ns)


def test_paper_quick_report_from_results(tmp_path):
    """The report/plot stage works from JSON points alone (no cluster needed)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import paper_report
    finally:
        sys.path.pop(0)
    pts = []
    for net in ("none", "lan", "wan"):
        for s in (32, 64):
            for w in ("mha", "softmax-attn"):
                pts.append({"experiment": "fig3", "workload": f"layer/{w}", "net": net,
                            "emulation": "none" if net == "none" else "tbf+relay",
                            "params": {"seq": s, "batch": 1}, "wall_s": {"min": 0.1 * s,
                                                                         "median": 0.1 * s},
                            "bytes_total": 1000 * s, "rounds": 10, "messages": 60,
                            "max_abs_err": 0.01, "time_model": {}})
    md = paper_report.render_report(pts, quick=True)
    assert "Fig. 3" in md
