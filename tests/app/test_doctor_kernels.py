"""`mpc3 doctor` catches the numba-cache failure of issue 32, item 1: party 2 of a local
cluster runs from a read-only install (a copy of the packages behind a read-only bind
mount in a private mount namespace, HOME on it too, as tests/net/party/test_kernel_cache.py)
and with a read-only data directory - the shipped systemd unit without its StateDirectory - so it
cannot compile or cache its secure kernels. It refuses to start; doctor names it as the
party that is down and quotes why from its log, while parties 0 and 1 are up."""
import shutil
import subprocess
import time

import pytest

from app.localcluster import LocalCluster, write_config
from conftest import ROOT, mpc3_cli
from helpers.cases import PACKAGES, _skip_reason
from net import config as cconf

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _answers(cl, n: int) -> bool:
    from net.client.failures import ClusterError
    from net.proto import mpc3_pb2 as pb
    try:
        return cl._call(n, "Status", pb.Empty(), 2.0).rank == n
    except ClusterError:
        return False


def test_doctor_reports_a_party_whose_kernels_cannot_compile(tmp_path):
    inst = tmp_path / "install"
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, inst / pkg, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "*.nbi", "*.nbc"))

    def launch(n, argv, **kw):
        if n != 2:
            return subprocess.Popen(argv, start_new_session=True, **kw)
        data = tmp_path / "c" / "data" / "party-2"
        data.mkdir(parents=True, exist_ok=True)
        script = " && ".join(f"mount --bind {d} {d} && mount -o remount,bind,ro {d}"
                             for d in (inst, data)) + ' && exec "$@"'
        env = {k: v for k, v in kw.pop("env").items() if k != "NUMBA_CACHE_DIR"}
        env.update(HOME=str(inst), XDG_CACHE_HOME=str(inst / "cache"), PYTHONPATH=str(inst))
        kw["cwd"] = str(tmp_path)
        return subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", *argv],
                                start_new_session=True, env=env, **kw)

    c = LocalCluster(tmp_path / "c", peer_timeout=5.0, launch=launch)
    write_config(c.dir, peer_timeout=5.0)
    c.cfg = cconf.load(c.path)
    try:
        for n in range(3):
            c.start_party(n)
        assert c.procs[2].wait(timeout=300) != 0
        assert "cannot compile its secure kernels" in (c.dir / "party-2.log").read_text()
        with c.user(rpc_timeout=2.0) as cl:                 # parties 0, 1 serve
            deadline = time.monotonic() + 240
            while not all(_answers(cl, n) for n in (0, 1)):
                assert time.monotonic() < deadline and c.procs[0].poll() is None
                time.sleep(0.5)
        r = mpc3_cli("doctor", "--config", c.path)
    finally:
        c.stop()
    assert r.returncode == 1, r.stdout
    addr = c.cfg.parties[2].address
    line = r.stderr.strip()
    assert r.stderr.count("\n") == 1
    assert line.startswith(f"mpc3 doctor: party 2 ({addr}) is down or unreachable: ")
    assert "party-2.log ends: mpc3 party: error: party 2 cannot compile its secure kernels (" \
        in line
    for n in (0, 1):
        assert f"party {n} 127.0.0.1" in r.stdout and "kernels ready (" in r.stdout
