"""Cluster config, certificates and the cluster CLI (up/status/down, error exits)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import mpc3_cli
from net import config, keys

ROOT = Path(__file__).resolve().parents[2]


def mpc3(*args, timeout=90):
    return mpc3_cli(*args, timeout=timeout)


def test_example_deploy_config_loads():
    cfg = config.load(ROOT / "deploy" / "cluster.toml")
    assert cfg.tls and cfg.party(2).address == "mpc-c.example.org:7700"
    assert cfg.party(0).listen == "0.0.0.0:7700" and cfg.limits.running_jobs == 8
    assert cfg.clients["query-user"].cert.name == "user.pem"
    # peer links: TLS sockets on the next port unless configured
    assert cfg.peer_transport == "tls"
    assert cfg.party(2).peer_address == "mpc-c.example.org:7701"
    assert cfg.party(0).peer_listen == "0.0.0.0:7701"
    assert cfg.peer_dial_address(0, 1) == "mpc-b.example.org:7701"


def test_peer_addresses_and_overrides():
    raw = {"cluster": {"peer_transport": "grpc"}, "party": [
        {"id": 0, "address": "a:10", "peer_address": "a:20", "peer_dial": {"1": "10.0.0.2:21"}},
        {"id": 1, "address": "b:10", "listen": "0.0.0.0:10"},
        {"id": 2, "address": "c:10", "peer_address": "c:30", "peer_listen": "[::]:31"}]}
    cfg = config.from_dict(raw, Path("."), insecure_flag=True)
    assert cfg.peer_transport == "grpc"
    assert [p.peer_address for p in cfg.parties] == ["a:20", "b:11", "c:30"]
    assert [p.peer_listen for p in cfg.parties] == ["a:20", "0.0.0.0:11", "[::]:31"]
    assert cfg.peer_dial_address(0, 1) == "10.0.0.2:21"
    assert cfg.peer_dial_address(1, 2) == "c:30"
    for bad, match in (({"cluster": {"peer_transport": "udp"}}, "peer_transport"),
                       ({"party0": {"peer_address": "nohost"}}, "peer_address")):
        r = {"cluster": bad.get("cluster", {}), "party": [
            dict({"id": i, "address": f"h:{i}"}, **bad.get(f"party{i}", {})) for i in range(3)]}
        with pytest.raises(ValueError, match=match):
            config.from_dict(r, Path("."), insecure_flag=True)


def test_security_mode_is_semi_honest_or_malicious():
    parties = [{"id": i, "address": f"h:{i}"} for i in range(3)]
    assert config.load(ROOT / "deploy" / "cluster.toml").security == "semi-honest"
    assert config.from_dict({"party": parties}, Path("."), insecure_flag=True).security == \
        "semi-honest"
    cfg = config.from_dict({"cluster": {"security": "malicious"}, "party": parties}, Path("."),
                           insecure_flag=True)
    assert cfg.security == "malicious"
    for bad in ("active", "Malicious", True, ""):
        with pytest.raises(ValueError) as err:
            config.from_dict({"cluster": {"security": bad}, "party": parties}, Path("."),
                             insecure_flag=True)
        assert str(err.value) == ('[cluster] security must be "semi-honest" or "malicious", '
                                  f"got {bad!r}")


@pytest.mark.parametrize("text, match", [
    ("[cluster]\nca='ca.pem'\n", "exactly three"),
    ("[cluster]\nca='ca.pem'\n" + "[[party]]\nid=0\naddress='h:1'\ncert='c'\nkey='k'\n" * 3,
     "each once"),
    ("[cluster]\nca='c'\npeer_timeout_s=-1\n" + "".join(
        f"[[party]]\nid={i}\naddress='h:{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "peer_timeout_s"),
    ("[cluster]\nca='c'\n" + "".join(
        f"[[party]]\nid={i}\naddress='h{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "host:port"),
    ("not toml [", "invalid TOML"),
    ("[cluster]\nca='c'\nmax_jobs=8\n" + "".join(
        f"[[party]]\nid={i}\naddress='h:{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "running_jobs in the \\[limits\\] table"),
    ("[cluster]\nca='c'\njob_modules=['net.remote_bench']\n" + "".join(
        f"[[party]]\nid={i}\naddress='h:{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "model-inference job kinds"),
    ("[cluster]\nca='c'\n[limits]\nuser_jobs=0\n" + "".join(
        f"[[party]]\nid={i}\naddress='h:{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "user_jobs must be a positive integer"),
    ("[cluster]\nca='c'\n[limits]\nuser_job=3\n" + "".join(
        f"[[party]]\nid={i}\naddress='h:{i}'\ncert='c'\nkey='k'\n" for i in range(3)),
     "unknown keys \\['user_job'\\]"),
])
def test_config_errors_name_the_problem(tmp_path, text, match):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ValueError, match=match):
        config.load(tmp_path / "c.toml")


def test_certificates_carry_roles(tmp_path):
    keys.generate(tmp_path, clients=[("alice", "query-user")])
    assert keys.identity_from_pem((tmp_path / "alice.pem").read_bytes()) == \
        keys.Identity("alice", "query-user")
    assert keys.identity_from_pem((tmp_path / "party-2.pem").read_bytes()).party_rank == 2
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        keys.generate(tmp_path)


def test_cluster_up_status_down_in_plaintext_dev_mode(tmp_path):
    d = tmp_path / "c"
    r = mpc3("cluster", "up", "--dir", str(d), "--insecure-plaintext-for-local-dev")
    try:
        assert r.returncode == 0, r.stderr
        conf = r.stdout.strip()
        assert conf == str(d / "cluster.toml")
        r = mpc3("status", "--config", conf)
        assert r.returncode == 0 and r.stdout.count("PLAINTEXT") == 3, r.stdout + r.stderr
        assert "INSECURE" in r.stderr
        r = mpc3("cluster", "up", "--dir", str(d), "--insecure-plaintext-for-local-dev")
        assert r.returncode == 2 and "already running" in r.stderr
        # one dead party: `cluster up` starts it alone, the survivors keep running
        # (issue 32, item 6: it could not restart one party)
        import os
        import signal
        survivors = [(d / f"party-{n}.pid").read_text() for n in (0, 2)]
        os.kill(int((d / "party-1.pid").read_text()), signal.SIGKILL)
        r = mpc3("cluster", "up", "--dir", str(d), "--insecure-plaintext-for-local-dev")
        assert r.returncode == 0, r.stderr
        assert [(d / f"party-{n}.pid").read_text() for n in (0, 2)] == survivors
        r = mpc3("status", "--config", conf)
        assert r.returncode == 0 and r.stdout.count("OK links") == 3, r.stdout + r.stderr
    finally:
        r = mpc3("cluster", "down", "--dir", str(d))
    assert r.returncode == 0 and "stopped parties [0, 1, 2]" in r.stdout
    r = mpc3("status", "--config", str(d / "cluster.toml"))
    assert r.returncode == 1 and r.stdout.count("DOWN") == 3


def test_cli_errors_exit_nonzero(tmp_path):
    r = mpc3("status", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "not found" in r.stderr
    r = mpc3("share-model", str(tmp_path / "none.npz"), "--config",
             str(ROOT / "deploy" / "cluster.toml"), "--model-id", "m")
    assert r.returncode != 0 and "error" in r.stderr
    r = mpc3("cluster", "down", "--dir", str(tmp_path))
    assert r.returncode == 2 and "no cluster" in r.stderr


def test_cluster_up_keeps_its_ports_and_down_signals_only_its_parties(tmp_path):
    import subprocess as sp
    d = tmp_path / "c"
    flag = "--insecure-plaintext-for-local-dev"
    assert mpc3("cluster", "up", "--dir", str(d), flag).returncode == 0
    first = (d / "cluster.toml").read_text()
    assert mpc3("cluster", "down", "--dir", str(d)).returncode == 0
    r = mpc3("cluster", "up", "--dir", str(d), flag)
    try:
        assert r.returncode == 0, r.stderr
        assert (d / "cluster.toml").read_text() == first          # same ports
    finally:
        assert mpc3("cluster", "down", "--dir", str(d)).returncode == 0
    stranger = sp.Popen(["sleep", "30"])                          # a recycled pid
    try:
        (d / "party-0.pid").write_text(f"{stranger.pid}\n")
        r = mpc3("cluster", "down", "--dir", str(d))
        assert r.returncode == 0 and "no party was running" in r.stdout
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04truncated", b"not a model"])
def test_share_model_refuses_unreadable_files_in_one_line(tmp_path, content):
    f = tmp_path / "m.npz"
    f.write_bytes(content)
    r = mpc3("share-model", str(f), "--config", str(ROOT / "deploy" / "cluster.toml"),
             "--model-id", "m")
    assert r.returncode == 2 and "not a readable .npz archive" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_version():
    r = mpc3("--version")
    assert r.returncode == 0 and r.stdout.startswith("mpc3 ") and "mpc3-net/" in r.stdout


def test_party_processes_let_openmp_workers_sleep_unless_the_operator_chose():
    from net.party.server import runtime_defaults
    env: dict[str, str] = {}
    runtime_defaults(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    runtime_defaults(env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_a_local_cluster_splits_the_cores_among_its_parties_unless_the_operator_chose(
        monkeypatch):
    from app import localcluster
    assert [localcluster.shared_host_threads(c) for c in (1, 2, 3, 8)] == [1, 1, 1, 2]
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert localcluster._env()["NUMBA_NUM_THREADS"] == str(localcluster.shared_host_threads())
    monkeypatch.setenv("NUMBA_NUM_THREADS", "7")
    assert localcluster._env()["NUMBA_NUM_THREADS"] == "7"


def _mapped_by_a_30_mib_buffer(env: dict) -> int:
    """Bytes glibc mmap'd for a 30 MiB numpy buffer in a fresh process that first calls
    keep_freed_memory (mallinfo2's hblkhd)."""
    code = """if True:
        import ctypes, numpy as np
        from net.party import malloc
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                        "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        info = ctypes.CDLL(None).mallinfo2
        info.restype = Info
        malloc.keep_freed_memory()
        before = info().hblkhd
        buf = np.ones(30 << 20, dtype=np.uint8)
        print(info().hblkhd - before)
    """
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, cwd=ROOT, env=env).stdout)


def test_party_processes_keep_freed_memory_unless_the_operator_chose():
    """A fresh process maps a 30 MiB buffer with mmap (glibc's threshold starts at 128 KiB)
    and faults it in anew after every free; after keep_freed_memory it comes from the heap -
    unless the operator set malloc options of their own."""
    import ctypes
    from net.party import malloc
    if malloc._libc("mallopt") is None or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("no glibc mallopt / mallinfo2")
    env = {k: v for k, v in os.environ.items() if not malloc.operator_chose({k: v})}
    assert _mapped_by_a_30_mib_buffer(env) == 0
    assert _mapped_by_a_30_mib_buffer({**env, "MALLOC_TRIM_THRESHOLD_": "131072"}) >= 30 << 20
    assert malloc.operator_chose({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096"})
    assert not malloc.operator_chose({"GLIBC_TUNABLES": "glibc.rtld.nns=2", "PATH": "/bin"})
