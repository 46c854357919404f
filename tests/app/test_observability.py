"""Observability and `mpc3 doctor` on a real local cluster (three `mpc3 party` processes,
mTLS) whose parties serve metrics (``metrics_listen``) and log JSON lines
(``log_format = "json"``): a scrape after a job moved exactly the counters the job's own
cost reports; every log line is a JSON object without tensor data; doctor passes on the
healthy cluster and names the party that is down (issue 32)."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from app.doctor import tiny_model
from app.localcluster import LocalCluster, free_port, free_ports, write_config
from app.owner import share_transformer
from conftest import ROOT, mpc3_cli
from net import config as cconf
from net.party.metrics import Metrics
from protocols import model as M

SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(\{([a-z_]+="(\\.|[^"\\])*",?)*\})? (\S+)$')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("obs")
    ports = free_ports(9)
    parties = [{"address": f"127.0.0.1:{ports[3 + n]}", "log_format": "json",
                "peer_address": f"127.0.0.1:{ports[6 + n]}",
                "metrics_listen": f"127.0.0.1:{ports[n]}"} for n in range(3)]
    c = LocalCluster(d, peer_timeout=5.0, parties=parties)
    c.start(wait=240)
    c.metrics_urls = [f"http://127.0.0.1:{p}/metrics" for p in ports[:3]]
    yield c
    c.stop()


def scrape(url: str) -> dict[str, float]:
    """name{labels} -> value, checking every line of the exposition format 0.0.4."""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[line.rsplit(" ", 1)[0]] = float(m.group(5))
    return out


def _raw(**party0):
    parties = [{"id": n, "address": f"127.0.0.1:{7000 + n}"} for n in range(3)]
    parties[0].update(party0)
    return {"cluster": {"insecure_plaintext_for_local_dev": True}, "party": parties}


def test_party_keys_metrics_listen_and_log_format_are_checked(tmp_path):
    cfg = cconf.from_dict(_raw(metrics_listen="127.0.0.1:9700", log_format="json"), tmp_path)
    assert (cfg.party(0).metrics_listen, cfg.party(0).log_format) == ("127.0.0.1:9700", "json")
    assert (cfg.party(1).metrics_listen, cfg.party(1).log_format) == ("", "text")
    with pytest.raises(ValueError, match="^party 0: metrics_listen must be 'host:port'"):
        cconf.from_dict(_raw(metrics_listen="9700"), tmp_path)
    with pytest.raises(ValueError, match='^party 0: log_format must be "text" or "json"'):
        cconf.from_dict(_raw(log_format="xml"), tmp_path)


def test_exposition_escapes_user_names():
    m = Metrics(1, "v")
    m.job_finished("embed", 'a"b\\c\nd', "done", wall_s=0.5, wait_s=0.01, input_bytes=64)
    text = m.render()
    assert 'mpc3_user_jobs_total{user="a\\"b\\\\c\\nd",kind="embed"} 1' in text
    assert 'mpc3_job_queue_wait_seconds_bucket{le="0.025"} 1' in text
    assert 'mpc3_job_queue_wait_seconds_bucket{le="0.005"} 0' in text
    for line in text.splitlines():
        assert line.startswith("#") or SAMPLE.match(line), line


def test_party_flags_turn_metrics_and_json_logs_on(tmp_path):
    """`mpc3 party --metrics ADDR --log-json` over a config that has neither."""
    write_config(tmp_path, peer_timeout=5.0)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = open(tmp_path / "p0.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "party", "--config",
                             str(tmp_path / "cluster.toml"), "--id", "0", "--metrics",
                             f"127.0.0.1:{port}", "--log-json"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                got = scrape(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    assert got['mpc3_party_info{rank="0",version="mpc3-net/4"}'] == 1
    assert got["mpc3_jobs_running"] == 0 and got["mpc3_kernels_compile_seconds"] > 0
    events = [json.loads(line) for line in (tmp_path / "p0.log").read_text().splitlines()]
    assert [e["event"] for e in events][:1] == ["kernels_ready"]
    assert any(f"metrics on http://127.0.0.1:{port}/metrics" in e["message"] for e in events)


def test_metrics_count_a_job_as_its_cost_reports(cluster):
    before = [scrape(u) for u in cluster.metrics_urls]
    mcfg, w, user = tiny_model()
    owner_creds = cluster.creds("owner")
    share_transformer(cluster.cfg, "obs", mcfg, w, None, *owner_creds, user=user)
    x = M.embed_tokens(mcfg, user, np.array([[3, 4, 5]]))
    with cluster.user() as qu:
        job = qu.submit("obs", "classify", {"X": x})
        st = qu.wait(job)
        qu.fetch(job)
    after = [scrape(u) for u in cluster.metrics_urls]

    def delta(n, key):
        return after[n].get(key, 0.0) - before[n].get(key, 0.0)

    received = 0.0
    for n in range(3):
        assert delta(n, 'mpc3_jobs_total{kind="classify",outcome="done"}') == 1
        assert delta(n, 'mpc3_jobs_total{kind="classify",outcome="failed"}') == 0
        assert delta(n, 'mpc3_job_bytes_sent_total{kind="classify"}') == st[n].bytes_sent > 0
        assert delta(n, 'mpc3_job_rounds_total{kind="classify"}') == st[n].rounds > 0
        assert delta(n, 'mpc3_job_messages_total{kind="classify"}') == st[n].messages
        assert delta(n, 'mpc3_user_jobs_total{user="user",kind="classify"}') == 1
        assert delta(n, 'mpc3_user_input_bytes_total{user="user"}') == 2 * 8 * x.size
        assert delta(n, "mpc3_job_queue_wait_seconds_count") == 1
        assert delta(n, 'mpc3_job_queue_wait_seconds_bucket{le="+Inf"}') == 1
        assert after[n]["mpc3_jobs_running"] == 0 and after[n]["mpc3_models"] >= 1
        assert after[n][f'mpc3_party_info{{rank="{n}",version="mpc3-net/4"}}'] == 1
        received += delta(n, 'mpc3_job_bytes_received_total{kind="classify"}')
    # every byte a party sent in the job another one received
    assert received == sum(s.bytes_sent for s in st)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(cluster.metrics_urls[0].replace("/metrics", "/other"))
    assert e.value.code == 404


def test_json_log_lines_parse_and_hold_no_tensor_data(cluster):
    mcfg, w, user = tiny_model()
    x = M.embed_tokens(mcfg, user, np.array([[6, 7, 8, 9]]))
    with cluster.user() as qu:
        job = qu.submit("obs", "classify", {"X": x})
        qu.wait(job)
        logits = M.ref_classify(mcfg, w, x)
    secrets = {f"{v:.4f}" for v in np.concatenate([x.ravel(), logits.ravel(),
                                                    next(iter(w.tensors.values())).ravel()])}
    for n in range(3):
        lines = (cluster.dir / f"party-{n}.log").read_text().splitlines()
        events = [json.loads(line) for line in lines]       # every line is one JSON object
        for e in events:
            assert {"time", "level", "party", "event", "job", "user", "message"} <= set(e)
            assert e["party"] == n and e["time"].endswith("Z")
        mine = [e for e in events if e["job"] == job]
        assert [e["event"] for e in mine] == ["job_started", "job_done"]
        assert all(e["user"] == "user" and e["kind"] == "classify" for e in mine)
        assert any(e["event"] == "kernels_ready" for e in events)
        assert any(e["event"] == "model_stored" and e["user"] == "owner" for e in events)
        for line in lines:
            assert not any(s in line for s in secrets if s not in ("0.0000", "-0.0000"))
            assert not re.search(r"\[\s*-?\d+\.\d+", line), line       # no printed arrays


def test_doctor_passes_on_a_healthy_cluster(cluster):
    r = mpc3_cli("doctor", "--config", cluster.path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for n in range(3):
        line = next(ln for ln in lines if ln.startswith(f"party {n} "))
        assert "mpc3-net/4, kernels ready (" in line and "links [" in line
        assert re.search(r"clock [+-]\d+\.\d{3} s", line) and "running_jobs=8" in line
    job = next(ln for ln in lines if ln.startswith("test job:"))
    err = float(re.search(r"max error (\S+) against", job).group(1))
    assert err <= 2e-3 and re.search(r" [1-9]\d* bytes, [1-9]\d* rounds", job)
    assert lines[-1].startswith("doctor: OK")
    assert not [m for m in cluster.owner().list_models()[0] if m.model_id.startswith("doctor-")]


def test_doctor_names_the_party_that_is_down(cluster):
    cluster.procs[2].terminate()
    cluster.procs[2].wait(10)
    r = mpc3_cli("doctor", "--config", cluster.path)
    assert r.returncode == 1
    addr = cluster.cfg.parties[2].address
    assert r.stderr.startswith(f"mpc3 doctor: party 2 ({addr}) is down or unreachable: ")
    assert r.stderr.count("\n") == 1
    assert f"party 2 {addr}: DOWN" in r.stdout and "test job: not run" in r.stdout
