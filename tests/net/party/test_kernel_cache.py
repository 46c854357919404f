"""A party compiles its kernels before it serves, and finds a place for numba's cache on a
read-only install (issue 32, item 1: under the shipped systemd unit - ProtectSystem=strict,
ProtectHome - every secure job failed with "cannot cache function ...: no locator
available", while `mpc3 status` showed the parties OK).

The install is reproduced as a copy of the packages, without compiled caches, behind a
read-only bind mount in a private mount namespace (``unshare -m``; root only), with HOME and
XDG_CACHE_HOME on the same read-only mount: the situation of the unit. The party's data
directory is writable, as StateDirectory makes it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cases import PACKAGES, _skip_reason

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _read_only_install(tmp_path: Path, code: str, data: Path):
    """Run ``code`` with the packages imported from a read-only copy (no __pycache__)."""
    inst = tmp_path / "install"
    for pkg in PACKAGES:
        if not (inst / pkg).exists():
            shutil.copytree(ROOT / pkg, inst / pkg, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    script = (f"mount --bind {inst} {inst} && mount -o remount,bind,ro {inst} && "
              f"exec {sys.executable} -c \"$CODE\"")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(inst), XDG_CACHE_HOME=str(inst / "cache"), PYTHONPATH=str(inst),
               CODE=code, DATA=str(data))
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def test_a_read_only_install_compiles_into_the_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    # what a job did before: compile lazily with nowhere to cache
    r = _read_only_install(tmp_path, "from mpc3.kernels import catalog; catalog.warm_up()", data)
    assert r.returncode != 0 and "no locator available" in r.stderr
    # the party's start: the cache goes to its data dir, every kernel compiled up front
    r = _read_only_install(tmp_path, "import os; from net.party.server import prepare_kernels; "
                           "print(prepare_kernels(os.environ['DATA'], 1))", data)
    assert r.returncode == 0, r.stderr
    assert any((data / "numba-cache").rglob("*.nbi"))


def test_a_party_that_cannot_compile_says_so_in_one_line(tmp_path):
    data = tmp_path / "install" / "data"             # inside the read-only mount
    r = _read_only_install(tmp_path, "import os; from net.party.server import prepare_kernels\n"
                           "try:\n    prepare_kernels(os.environ['DATA'], 2)\n"
                           "except RuntimeError as e:\n    print('ERR', e)", data)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("ERR party 2 cannot compile its secure kernels (") and "\n" not in line
    assert "writable NUMBA_CACHE_DIR" in line
