"""deploy/README.md works as written on three hosts (issue 32): deploy/rehearse.py builds
three party hosts and a client as network namespaces with copy-on-write /etc, /opt and /var,
runs the guide's marked command blocks on them - wheel, certificates, service user, install,
firewall (deploy/mpc3.nft), the shipped unit's sandbox, status, a secure translation and a
secure generation checked against the plaintext model - and removes everything after.

Root with ip netns, nft, setpriv, unshare, nsenter and overlayfs only; the package registry
must be reachable (the guide's install pulls the dependencies)."""
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from app import cli
from app import textdata as TD

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("ip", "nft", "setpriv", "unshare", "nsenter", "mknod")


def _skip_reason():
    if os.geteuid() != 0:
        return "network namespaces and mounts need root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed"
    if not Path("/usr/bin/python3").exists():
        return "no system python3 (the guide installs with it)"
    probe = f"m3probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if r.returncode:
        return "ip netns add is not permitted here"
    try:
        r = subprocess.run(["ip", "netns", "exec", probe, "nft", "list", "ruleset"],
                           capture_output=True)
        if r.returncode:
            return "nft does not work in a network namespace here"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs t /mnt"],
                       capture_output=True)
    return None if r.returncode == 0 else "mounts in a private mount namespace not permitted"


def _leftovers(tag: str) -> list[str]:
    return [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout.split() if n.startswith(tag)]


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_the_guide_works_as_written_on_three_hosts(tmp_path):
    tag = f"m3t{uuid.uuid4().hex[:6]}"
    work = tmp_path / "rehearsal"
    try:
        r = subprocess.run([sys.executable, str(ROOT / "deploy" / "rehearse.py"), "--work",
                            str(work), "--tag", tag], capture_output=True, text=True,
                           timeout=900)
    finally:
        for ns in _leftovers(tag):                     # the script's own cleanup failed
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = r.stdout
    ran = re.findall(r"\] ran on ([a-z, ]+): (.*?)(?: \(/opt/mpc3 linked|$)", out, re.M)
    blocks = re.findall(r"<!-- rehearse: on=(\S+)[^>]*-->\s*\n```sh\n(.*?)```",
                        (ROOT / "deploy" / "README.md").read_text(), re.S)
    assert len(ran) == len(blocks) >= 8, out                 # every block of the guide ran
    for (hosts, line), (on, body) in zip(ran, blocks):
        assert line == next(ln for ln in body.splitlines() if not ln.startswith("ID="))
        assert hosts == {"admin": "admin", "parties": "a, b, c", "client": "client",
                         "parties,client": "a"}[on], (hosts, on)
    translated = re.search(r"translate: 4096 -> '([^']*)' \(plaintext model: same", out)
    assert translated and translated.group(1) == TD.reference_translation("4096"), out
    assert re.search(r"generate: '4096 = ' -> '[^']+' \(plaintext model: same\)", out), out
    assert "firewall: 6 allowed and 12 refused connections" in out, out
    assert "the guide works as written" in out
    assert not _leftovers(tag) and not work.exists()


def test_every_guide_block_says_where_it_runs():
    """The rehearsal runs only marked blocks: a fenced sh block without a marker would be
    a step of the guide nothing checks."""
    text = (ROOT / "deploy" / "README.md").read_text()
    fenced = text.count("```sh\n")
    marked = len(re.findall(r"<!-- rehearse: [^>]*-->\s*\n```sh\n", text))
    assert fenced == marked >= 8


def test_export_model_writes_the_shipped_file(tmp_path, capsys):
    out = tmp_path / "lm.npz"
    assert cli.main(["export-model", "lm", str(out)]) == 0
    assert out.read_bytes() == TD.SHIPPED_LM.read_bytes()
    assert cli.main(["export-model", "translator", str(tmp_path / "t.txt")]) == 2
    assert "use a .npz file name" in capsys.readouterr().err
