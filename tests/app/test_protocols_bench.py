"""`mpc3 bench layer`: every workload runs at a tiny shape, reports the DESIGN.md metric
names, and is accurate; the gRPC transport gives the same traffic as in-process."""
import argparse
import json

import pytest

from app.bench import layer as cli_layer
from protocols.jobs import workloads

TINY = ["--seq", "5", "--d-model", "12", "--heads", "2", "--features", "6", "--d-ff", "16",
        "--layers", "1", "--repeat", "1", "--attn-c", "0.002"]


def parse(argv):
    ap = argparse.ArgumentParser()
    cli_layer.register(ap.add_subparsers(dest="command"))
    return ap.parse_args(["layer"] + argv)


@pytest.mark.parametrize("name", cli_layer.WORKLOADS)
def test_workload_metrics(name):
    d = cli_layer.run_layer(parse([name] + TINY))
    assert set(d) == {"workload", "params", "transport", "net", "emulation", "wall_s",
                      "bytes_total", "bytes_per_party", "messages", "rounds", "max_abs_err",
                      "max_rel_err", "plain_wall_s", "peak_rss_bytes"}
    assert d["bytes_total"] == sum(d["bytes_per_party"]) > 0
    assert d["plain_wall_s"] > 0 and d["peak_rss_bytes"] > 10 * 2**20
    assert set(d["wall_s"]) == {"min", "median"}
    assert d["max_rel_err"] < 5e-3, d   # LN inputs stay inside sqrt_inv_a's domain (small c)


def test_grpc_transport_same_traffic(tmp_path):
    out = tmp_path / "r.json"
    a = parse(["ffn", "--transport", "grpc", "--json", str(out)] + TINY)
    assert a.func(a) == 0
    g = json.loads(out.read_text())
    i = cli_layer.run_layer(parse(["ffn"] + TINY))
    assert g["transport"] == "grpc"
    assert (g["bytes_per_party"], g["messages"], g["rounds"]) == \
        (i["bytes_per_party"], i["messages"], i["rounds"])


def test_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        cli_layer.run_layer(parse(["mha", "--heads", "5"] + TINY[:4] + TINY[6:]))


@pytest.mark.parametrize("name", [n for n, w in workloads.WORKLOADS.items() if w.cost])
def test_declared_cost_matches_traffic(name):
    """Where the catalog declares a cost, the measured traffic of the CLI run is exactly it."""
    from mpc3.party import RingConfig
    a = parse([name, "--block", "2"] + TINY)
    d = cli_layer.run_layer(a)
    cost = workloads.get(name).cost(RingConfig(), cli_layer._config(a), 1, cli_layer._options(a))
    assert (tuple(d["bytes_per_party"]), d["rounds"]) == (cost.bytes_per_party, cost.rounds)


def test_one_catalog():
    """The CLI, the bench job kind and the catalog list the same workloads and inputs."""
    assert cli_layer.WORKLOADS == workloads.LAYER_WORKLOADS == tuple(workloads.WORKLOADS)
    assert workloads.model_prefixes("ffn") == ("enc.0.ffn.",)
    assert workloads.layer_inputs("decoder-step") == ("X", "E")
    with pytest.raises(ValueError, match="unknown layer workload"):
        workloads.get("conv")
