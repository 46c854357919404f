#!/usr/bin/env python3
"""Rehearse deploy/README.md on three party hosts and a client built on one Linux machine.

    sudo python3 deploy/rehearse.py [--work DIR] [--tag TAG] [--keep]

Each host is a network namespace (the guide's addresses 192.0.2.1-3, the client 192.0.2.10,
on one bridge; the host names resolve through each host's own /etc/hosts) with a mount
namespace of its own in which /etc, /opt and /var are copy-on-write overlays: useradd,
/opt/mpc3 and /etc/mpc3 of one host exist on that host only and vanish afterwards.

The guide's command blocks - each fenced ``sh`` block after a ``<!-- rehearse: ... -->``
comment - run as written, in order, on the hosts the comment names (``on=admin|parties|
client``, comma-separated; ``set=ID``: the block's ``ID=`` line gets the host's party id;
``net=outside``: the block reaches the package registry, which the hosts' namespaces cannot;
``same=PATH``: the block writes only PATH, the same on every host, so it runs on the first
host and the others get a copy of PATH - unless ``--install-each``; ``retry=S``: run it again
until it succeeds, S seconds at most; ``check=translate|generate``: its output is compared
with the plaintext model of the installed package). Between the certificate and the install
blocks, the files the guide's table lists are copied to each host (the scp step).

``sudo``, ``systemctl`` and ``journalctl`` are emulated (systemd is not PID 1 here):
``systemctl enable --now mpc3-party@N`` reads the unit the guide installed under
/etc/systemd/system and runs its ExecStart as its User in a private mount namespace built
from the unit's own settings (deploy/unit_sandbox.py); a setting it cannot emulate stops the
rehearsal, so the unit and the rehearsal do not drift apart.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTY_HOSTS = {"mpc-a.example.org": "192.0.2.1", "mpc-b.example.org": "192.0.2.2",
               "mpc-c.example.org": "192.0.2.3"}
CLIENT_ADDR = "192.0.2.10"
HOSTS = ("a", "b", "c", "client")            # party i on HOSTS[i]
OVERLAID = ("etc", "opt", "var")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARK = re.compile(r"<!-- rehearse: (.*?) -->\s*\n```sh\n(.*?)```", re.DOTALL)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, **kw)


# ----------------------------------------------------------------------- the guide ----
def blocks(readme: Path) -> list[tuple[dict, str]]:
    """(options, commands) of every marked block, in the guide's order."""
    out = []
    for opts, body in MARK.findall(readme.read_text()):
        o = dict(kv.split("=", 1) for kv in opts.split())
        if not set(o.get("on", "-").split(",")) <= {"admin", "parties", "client"}:
            raise SystemExit(f"rehearse: a block's on= must list admin, parties, client: {opts}")
        out.append((o, body))
    if not out:
        raise SystemExit(f"rehearse: no '<!-- rehearse: ... -->' blocks in {readme}")
    return out


# --------------------------------------------------------------------------- hosts ----
class Lab:
    """The namespaces, the hosts' file systems and the commands run on them."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work, self.tag = work, tag
        self.keepers: dict[str, subprocess.Popen] = {}
        self.shims = work / "shims"

    def ns(self, h: str) -> str:
        return f"{self.tag}-{h}"

    def home(self, h: str) -> Path:
        return self.work / h / "home"

    def up(self) -> None:
        sw = self.ns("sw")
        run(["ip", "netns", "add", sw])
        run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", sw, "link", "set", "br0", "up"])
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {n} {n.split('.')[0]}\n" for n, a in PARTY_HOSTS.items())
        addrs = [*PARTY_HOSTS.values(), CLIENT_ADDR]
        for h, addr in zip(HOSTS, addrs):
            ns = self.ns(h)
            run(["ip", "netns", "add", ns])
            run(["ip", "-n", sw, "link", "add", f"v{h}", "type", "veth", "peer", "name",
                 "eth0", "netns", ns])
            run(["ip", "-n", sw, "link", "set", f"v{h}", "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            for dev in ("lo", "eth0"):
                run(["ip", "-n", ns, "link", "set", dev, "up"])
            self.home(h).mkdir(parents=True)
            mounts = []
            for d in OVERLAID:
                up, wk = self.work / h / f"{d}-upper", self.work / h / f"{d}-work"
                up.mkdir()
                wk.mkdir()
                mounts.append(f"mount -t overlay overlay -o lowerdir=/{d},upperdir={up},"
                              f"workdir={wk} /{d}")
            script = " && ".join(mounts + [
                "rm -f /etc/hosts", f"printf '%s' '{hosts_file}' > /etc/hosts",
                f"echo {h}-{self.tag} > /etc/hostname", "exec sleep 86400"])
            self.keepers[h] = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private",
                 "sh", "-c", script], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not all(self._ready(h) for h in HOSTS):
            if time.monotonic() > deadline or any(k.poll() is not None
                                                  for k in self.keepers.values()):
                raise SystemExit("rehearse: a host's file system did not come up (overlayfs "
                                 "in a mount namespace needed)")
            time.sleep(0.1)
        self._shims()

    def _ready(self, h: str) -> bool:
        pid = self.keepers[h].pid
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")
        except OSError:
            return False

    def _shims(self) -> None:
        """sudo (we are root), systemctl and journalctl (systemd is not PID 1 here)."""
        self.shims.mkdir()
        me = f"{sys.executable} {HERE / 'unit_sandbox.py'}"
        for name, body in (("sudo", 'exec "$@"'),
                           ("systemctl", f'exec {me} systemctl "$@"'),
                           ("journalctl", f'exec {me} journalctl "$@"')):
            (self.shims / name).write_text(f"#!/bin/sh\n{body}\n")
            (self.shims / name).chmod(0o755)

    def sh(self, h: str, commands: str, outside: bool = False, env: dict | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
        """bash -e COMMANDS on host ``h`` (in its mount namespace; in its network namespace
        unless ``outside``), in its working directory, with a login's clean environment."""
        home = self.home(h)
        path_file = self.work / h / "path"
        path = path_file.read_text().strip() if path_file.exists() else SYSTEM_PATH
        e = {"PATH": f"{self.shims}:{path}", "HOME": str(home), "USER": "root",
             "LOGNAME": "root", "LANG": "C.UTF-8", "REHEARSE_JOURNAL": str(self.work / h),
             "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", "/root/.cache/pip"),
             **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}, **(env or {})}
        script = (f"set -e\ncd {home}\n{commands}\n"
                  f"printf '%s' \"${{PATH#{self.shims}:}}\" > {path_file}\n")
        argv = ["bash", "-c", script]
        if h != "admin":
            argv = ["nsenter", "-t", str(self.keepers[h].pid), "-m",
                    *([] if outside else ["-n"]), "--", *argv]
        return subprocess.run(argv, env=e, text=True, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def dead(self) -> list[str]:
        """Units started on the hosts whose process is gone (a party that exited)."""
        out = []
        for pid_file in self.work.glob("*/mpc3-party@*.pid"):
            if not Path(f"/proc/{pid_file.read_text().strip()}").exists():
                out.append(pid_file.stem)
        return out

    def down(self) -> None:
        for h in (*HOSTS, "sw"):
            ns = self.ns(h)
            if not Path(f"/run/netns/{ns}").exists():
                continue
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for k in self.keepers.values():
            if k.poll() is None:
                k.kill()
            k.wait()


# ---------------------------------------------------------------------- the run ----
def copy_tree_of_clone(dst: Path) -> None:
    """The repository's tracked files as they are in this work tree: the admin's clone."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached",
                            "--others", "--exclude-standard"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)


def scp(lab: Lab, clone: Path) -> None:
    """The guide's table of what goes to which host."""
    wheel = next((clone / "dist").glob("mpc3-*.whl"))
    certs = clone / "certs"
    for n, h in enumerate(HOSTS[:3]):
        d = lab.home(h)
        for f in (wheel, clone / "deploy/cluster.toml", clone / "deploy/mpc3-party@.service",
                  clone / "deploy/mpc3.nft"):
            shutil.copy2(f, d)
        (d / "certs").mkdir()
        for f in ("ca.pem", f"party-{n}.pem", f"party-{n}.key"):
            shutil.copy2(certs / f, d / "certs")
    d = lab.home("client")
    shutil.copy2(wheel, d)
    shutil.copy2(clone / "deploy/cluster.toml", d)
    (d / "certs").mkdir()
    for f in ("ca.pem", "owner.pem", "owner.key", "user.pem", "user.key"):
        shutil.copy2(certs / f, d / "certs")


REFERENCE = r"""
import sys
from protocols import model as M
from app import textdata as TD
from app.generate import eos_of
kind, args = sys.argv[1], sys.argv[2:]
if kind == "translate":
    cfg, w, user, vocab = TD.load_shipped()
    for t in args:
        out = M.greedy_decode(cfg, w, user, [TD.encode_src(t, vocab)], vocab.bos, vocab.eos,
                              max_steps=vocab.max_tgt_len)[0]
        print(f"{t}\t{TD.decode_tgt(out, vocab)}\t{TD.reference_translation(t)}")
else:
    cfg, w, user = M.load_model(TD.SHIPPED_LM)
    prompt, n = args[0], int(args[1])
    ids = M.greedy_generate(cfg, w, user, [list(prompt.encode())], n, eos=eos_of(cfg))[0]
    print(bytes(t for t in ids if t < 256).decode("utf-8", "replace"))
"""


def check(lab: Lab, kind: str, block: str, out: str) -> str:
    """The secure output of a translate / generate block against the plaintext model of
    the package installed on the client."""
    py = "/opt/mpc3/venv/bin/python"
    cmd = block.replace("\\\n", " ").strip().splitlines()[-1]
    if kind == "translate":
        texts = [a for a in cmd.split() if a.isdigit()]
        ref = lab.sh("client", f"{py} -c '{REFERENCE}' translate {' '.join(texts)}")
        want = {r.split("\t")[0]: r.split("\t")[1:] for r in ref.stdout.splitlines()}
        got = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
        for t in texts:
            if got.get(t) != want[t][0]:
                raise SystemExit(f"rehearse: translate {t!r}: secure {got.get(t)!r}, "
                                 f"plaintext model {want[t][0]!r}")
        return "; ".join(f"{t} -> {got[t]!r} (plaintext model: same; exact words: "
                         f"{'yes' if got[t] == want[t][1] else 'no'})" for t in texts)
    prompt = re.search(r'"([^"]*)"\s*$', cmd).group(1)
    tokens = re.search(r"--tokens (\d+)", cmd).group(1)
    ref = lab.sh("client", f"{py} -c '{REFERENCE}' generate '{prompt}' {tokens}")
    got, want = out.strip("\n").splitlines()[-1], ref.stdout.strip("\n")
    if got != want:
        raise SystemExit(f"rehearse: generate {prompt!r}: secure {got!r}, plaintext model "
                         f"{want!r}")
    return f"{prompt!r} -> {got!r} (plaintext model: same)"


RO = "for p in {}; do findmnt -no OPTIONS -T $p | grep -q '^ro'; done"
SANDBOX_PROBES = (                  # (what, shell test run as the party's user in its view)
    ("/, /etc, /usr and the install mounted read-only", RO.format("/ /etc /usr /opt/mpc3/venv")),
    ("/var/lib/mpc3 writable", "touch /var/lib/mpc3/probe && rm /var/lib/mpc3/probe"),
    ("/root and /home hidden", "! ls /root >/dev/null 2>&1 && ! ls /home >/dev/null 2>&1"),
    ("/tmp private", "touch /tmp/probe && [ \"$(ls -A /tmp)\" = probe ] && rm /tmp/probe"),
    ("no devices but the basic ones", "[ -c /dev/null ] && [ $(ls /dev | wc -l) -lt 16 ]"),
    ("/proc/sys and /sys read-only", RO.format("/proc/sys /sys")),
)


def sandbox_probe(lab: Lab) -> str:
    """The running parties have the unit's settings: its user, no new privileges, and the
    file system view of SANDBOX_PROBES (checked inside each party's mount namespace)."""
    seen = []
    for n, h in enumerate(HOSTS[:3]):
        pid = (lab.work / h / f"mpc3-party@{n}.pid").read_text().strip()
        status = dict(line.split(":\t", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
        uid = int(status["Uid"].split()[0])
        if uid == 0 or status.get("NoNewPrivs", "0").strip() != "1":
            raise SystemExit(f"rehearse: party {n} runs as uid {uid}, NoNewPrivs "
                             f"{status.get('NoNewPrivs')}: not the unit's sandbox")
        for what, test in SANDBOX_PROBES:
            r = subprocess.run(["nsenter", "-t", pid, "-m", "--", "setpriv", f"--reuid={uid}",
                                f"--regid={status['Gid'].split()[0]}", "--clear-groups",
                                "sh", "-ec", test], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"rehearse: party {n}'s sandbox: not {what} ({test})")
        seen.append(uid)
    return (f"the parties run as uid {seen} with NoNewPrivs; "
            + ", ".join(w for w, _ in SANDBOX_PROBES))


def firewall_probe(lab: Lab) -> str:
    """Who can open which port once the parties listen: exactly the guide's table."""
    addr = dict(zip(HOSTS, [*PARTY_HOSTS.values(), CLIENT_ADDR]))
    want = {}
    for src in HOSTS:
        for n, dst in enumerate(HOSTS[:3]):
            if src != dst:
                want[(src, dst, 7700)] = src == "client"
                want[(src, dst, 7701)] = src == HOSTS[(n - 1) % 3]
    probe = ("for t in {}; do if timeout 1 bash -c \"exec 3<>/dev/tcp/${{t%:*}}/${{t#*:}}\""
             " 2>/dev/null; then echo \"$t open\"; else echo \"$t shut\"; fi; done")
    wrong = []
    for src in HOSTS:
        targets = [f"{addr[d]}:{p}" for (s, d, p) in want if s == src]
        res = lab.sh(src, probe.format(" ".join(targets))).stdout.split("\n")
        seen = dict(line.split() for line in res if line)
        for (s, d, p), ok in want.items():
            if s == src and (seen[f"{addr[d]}:{p}"] == "open") != ok:
                wrong.append(f"{s} -> {d}:{p} is {seen[f'{addr[d]}:{p}']}")
    if wrong:
        raise SystemExit("rehearse: the firewall does not match the guide: " + ", ".join(wrong))
    return f"{sum(want.values())} allowed and {len(want) - sum(want.values())} refused " \
           "connections as the guide's table says"


def same(lab: Lab, src: str, dst: str, path: str) -> None:
    """Host ``dst`` gets what host ``src`` wrote to ``path`` (under one of OVERLAID), as hard
    links into its overlay's upper directory: no copy of a 400 MB venv per host. ``dst``
    has never looked ``path`` up, so its overlay finds the new entry like its own."""
    top, _, rest = path.strip("/").partition("/")
    if top not in OVERLAID or not rest:
        raise SystemExit(f"rehearse: same={path} must be below /{', /'.join(OVERLAID)}")
    have = lab.work / src / f"{top}-upper" / rest
    want = lab.work / dst / f"{top}-upper" / rest
    want.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-al", str(have), str(want)])


def rehearse(work: Path, tag: str, install_each: bool = False) -> None:
    t0 = time.monotonic()
    lab = Lab(work, tag)
    clone = work / "admin" / "home"
    clone.mkdir(parents=True)
    copy_tree_of_clone(clone)
    (work / "admin" / "bin").mkdir()
    (work / "admin" / "bin" / "mpc3").write_text(         # the admin's mpc3: the clone's
        f"#!/bin/sh\nPYTHONPATH={clone} exec {sys.executable} -m app.cli \"$@\"\n")
    (work / "admin" / "bin" / "mpc3").chmod(0o755)
    (work / "admin" / "path").write_text(f"{work / 'admin' / 'bin'}:{SYSTEM_PATH}")
    try:
        lab.up()
        log(f"hosts up: namespaces {tag}-a/-b/-c (parties), {tag}-client, {tag}-sw (bridge)")
        copied = False
        for opts, body in blocks(HERE / "README.md"):
            on = opts["on"]
            if on != "admin" and not copied:
                scp(lab, clone)
                copied = True
                log("copied the wheel, cluster.toml, unit, mpc3.nft and certificates")
            hosts = [h for o in on.split(",") for h in
                     {"admin": ["admin"], "parties": HOSTS[:3], "client": ["client"]}[o]]
            copies = []
            if "same" in opts and not install_each:     # run once, copy the result
                hosts, copies = hosts[:1], hosts[1:]
            first = next(ln for ln in body.strip().splitlines() if not ln.startswith("ID="))

            def one(h, body=body, opts=opts):
                text = body
                env = {}
                if "set" in opts:
                    n = HOSTS.index(h)
                    text = re.sub(r"(?m)^ID=\d+$", f"ID={n}", text)
                    env["ID"] = str(n)
                deadline = time.monotonic() + float(opts.get("retry", 0))
                while True:
                    r = lab.sh(h, text, outside=opts.get("net") == "outside", env=env)
                    if r.returncode == 0 or time.monotonic() > deadline or lab.dead():
                        return r
                    time.sleep(5)

            with ThreadPoolExecutor(max_workers=2) as pool:
                results = list(pool.map(one, hosts))
            for h, r in zip(hosts, results):
                if r.returncode != 0:
                    journal = "".join(f"\n--- {p}:\n{p.read_text()[-3000:]}"
                                      for p in sorted(work.glob("*/mpc3-party@*.log")))
                    raise SystemExit(f"rehearse: on {h}, the block starting {first!r} failed "
                                     f"({r.returncode}):\n{r.stdout}{r.stderr}{journal}")
            last = body.strip().splitlines()[-1]
            for h in copies:
                same(lab, hosts[0], h, opts["same"])
                if last.startswith("export "):
                    lab.sh(h, last)
            log(f"ran on {', '.join(hosts)}: {first}"
                + (f" ({opts['same']} linked from there to {', '.join(copies)}; "
                   "--install-each runs it everywhere)" if copies else ""))
            if "check" in opts:
                log(f"{opts['check']}: " + check(lab, opts["check"], body, results[0].stdout))
                if opts["check"] == "translate":
                    log("firewall: " + firewall_probe(lab))
                    log("sandbox: " + sandbox_probe(lab))
        log(f"the guide works as written: {time.monotonic() - t0:.0f} s")
    finally:
        lab.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="directory for the hosts' files (default: a new temp dir)")
    ap.add_argument("--tag", default=f"m3r{os.getpid()}", help="namespace name prefix")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--install-each", action="store_true", help="run a block marked same= "
                    "(the install) on every host; default: on the first, the others get "
                    "what it wrote (saves three package installs)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("rehearse: run as root (network and mount namespaces, nft)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("rehearse: terminated"))  # cleans up
    work = Path(args.work or tempfile.mkdtemp(prefix="mpc3-rehearse-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        rehearse(work, args.tag, args.install_each)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
