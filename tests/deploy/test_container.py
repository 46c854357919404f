"""The party container recipe (issue 32: "a container recipe for a party if you can test it
here"): deploy/container/rehearse.sh builds the image from a wheel of this checkout and runs a
secure translation through three party containers. Needs root, podman with runc and a local
base image with Python 3.11 (this machine cannot reach Docker Hub; the script's header says
how to import a debootstrap root as localhost/bookworm-python:1); skipped elsewhere."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("MPC3_BASE_IMAGE", "localhost/bookworm-python:1")
PODMAN = "podman --runtime runc --cgroup-manager cgroupfs"


def _skip_reason():
    if os.geteuid() != 0:
        return "needs root"
    if not (shutil.which("podman") and shutil.which("runc")):
        return "podman and runc are not installed"
    r = subprocess.run(["podman", "image", "exists", BASE], capture_output=True)
    if r.returncode != 0:
        return f"no local base image {BASE} (see deploy/container/rehearse.sh)"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_three_party_containers_translate():
    env = {**os.environ, "PODMAN": PODMAN, "MPC3_BASE_IMAGE": BASE, "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "deploy" / "container" / "rehearse.sh")], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "4096\tfour thousand ninety six" in r.stdout
    assert r.stdout.count(": OK links=") == 3
