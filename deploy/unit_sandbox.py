#!/usr/bin/env python3
"""systemctl / journalctl for deploy/rehearse.py, where systemd is not PID 1.

    unit_sandbox.py systemctl daemon-reload | enable [--now] UNIT | start | stop | restart UNIT
    unit_sandbox.py journalctl -u UNIT

``start`` reads the unit file from /etc/systemd/system (``NAME@.service`` for an instance
``NAME@I``) and runs its ExecStart as systemd would with the unit's [Service] settings: the
StateDirectory created for the User, a private mount namespace (ProtectSystem=strict: every
mount read-only but ReadWritePaths, /dev, /proc, /sys; ProtectHome; PrivateTmp;
PrivateDevices; ProtectKernelTunables; ProtectControlGroups), then ``setpriv`` to User/Group
with NoNewPrivileges and LimitNOFILE, a clean environment, output to the journal (a file in
$REHEARSE_JOURNAL). A sandboxing key it does not know stops it, so a unit that gains a
setting cannot pass the rehearsal untested. RestrictAddressFamilies needs a seccomp filter
and is reported, not enforced.
"""
from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
from pathlib import Path

UNITS = Path("/etc/systemd/system")
#: [Service] keys that do not change what the process can do, or only how it is restarted
IGNORED = {"Type", "Restart", "RestartSec", "KillSignal", "TimeoutStopSec"}
NOT_ENFORCED = {"RestrictAddressFamilies"}
HANDLED = {"User", "Group", "ExecStart", "StateDirectory", "StateDirectoryMode",
           "ProtectSystem", "ReadWritePaths", "ProtectHome", "PrivateTmp", "NoNewPrivileges",
           "PrivateDevices", "ProtectKernelTunables", "ProtectControlGroups", "LimitNOFILE"}
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9), "tty": (5, 0)}


def journal() -> Path:
    return Path(os.environ.get("REHEARSE_JOURNAL", "/run"))


def die(msg: str) -> None:
    print(f"systemctl (rehearsal): {msg}", file=sys.stderr)
    sys.exit(1)


def service(unit: str) -> dict[str, str]:
    name, _, inst = unit.removesuffix(".service").partition("@")
    path = UNITS / (f"{name}@.service" if inst else f"{name}.service")
    if not path.exists():
        die(f"Unit {unit}.service not found ({path})")
    reloaded = journal() / "daemon-reload"
    if not reloaded.exists() or reloaded.stat().st_mtime < path.stat().st_mtime:
        die(f"Unit {unit} changed on disk (or is new): run 'systemctl daemon-reload' first")
    section, keys = None, {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            keys[k.strip()] = v.strip().replace("%i", inst)
    unknown = set(keys) - IGNORED - NOT_ENFORCED - HANDLED
    if unknown:
        die(f"{path}: {', '.join(sorted(unknown))} not emulated; teach deploy/unit_sandbox.py")
    return keys


def sandbox_script(s: dict[str, str]) -> str:
    """Shell commands, run as root in a new private mount namespace, that build the unit's
    view of the file system and end by exec'ing ExecStart as its user."""
    yes = {"true", "yes", "1", "on"}
    rw = s.get("ReadWritePaths", "").split()
    cmds = ["set -e"]
    for p in rw:
        cmds.append(f"mount --bind {p} {p}")
    keep = set(rw)
    if s.get("PrivateTmp", "").lower() in yes:
        cmds += [f"mount -t tmpfs -o mode=1777 tmpfs {d}" for d in ("/tmp", "/var/tmp")]
        keep |= {"/tmp", "/var/tmp"}
    if s.get("ProtectHome", "").lower() in yes:
        cmds += [f"[ ! -d {d} ] || mount -t tmpfs -o mode=000,ro tmpfs {d}"
                 for d in ("/home", "/root", "/run/user")]
    if s.get("PrivateDevices", "").lower() in yes:
        cmds += ["mount -t tmpfs -o mode=755,nosuid tmpfs /dev"]
        cmds += [f"mknod -m 666 /dev/{n} c {a} {b}" for n, (a, b) in DEVICES.items()]
        cmds += ["mkdir /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
                 "ln -s /proc/self/fd /dev/fd", "ln -s /proc/self/fd/0 /dev/stdin",
                 "ln -s /proc/self/fd/1 /dev/stdout", "ln -s /proc/self/fd/2 /dev/stderr"]
        keep |= {"/dev/shm"}
    ro = []
    if s.get("ProtectSystem") == "strict":
        ro.append("all")
    elif s.get("ProtectSystem"):
        die(f"ProtectSystem={s['ProtectSystem']} not emulated (strict is)")
    if s.get("ProtectKernelTunables", "").lower() in yes:
        cmds += ["mount --bind /proc/sys /proc/sys"]
        ro.append("/proc/sys")
        ro.append("/sys")
    if s.get("ProtectControlGroups", "").lower() in yes:
        ro.append("/sys/fs/cgroup")
    # remount read-only, mount by mount (a bind remount changes one mount point only); a
    # mount that is listed but shadowed by a later one cannot be remounted and is out of
    # reach - unless its path can still be written, which stops the start
    ro_mount = ('{ mount -o remount,bind,ro "$m" 2>/dev/null || ! touch "$m/.ro-probe" '
                '2>/dev/null || { rm -f "$m/.ro-probe"; echo "cannot make $m read-only" >&2; '
                'exit 1; }; }')
    cmds.append(
        "awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do "
        f"case \"$m\" in {'|'.join(sorted(keep)) or '/nonexistent'}) continue;; esac; "
        + ("case \"$m\" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) ;; *) "
           f"{ro_mount};; esac; " if "all" in ro else "")
        + " ".join(f"case \"$m\" in {p}|{p}/*) {ro_mount};; esac;"
                   for p in ro if p != "all")
        + " done")
    user, group = s.get("User", "root"), s.get("Group", s.get("User", "root"))
    pw = pwd.getpwnam(user)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "HOME": pw.pw_dir,
           "USER": user, "LOGNAME": user, "SHELL": pw.pw_shell, "LANG": "C.UTF-8"}
    setpriv = ["setpriv", f"--reuid={user}", f"--regid={group}", "--init-groups"]
    if s.get("NoNewPrivileges", "").lower() in yes:
        setpriv.append("--no-new-privs")
    if "LimitNOFILE" in s:
        n = int(s["LimitNOFILE"])          # systemd raises the hard limit; a container may not
        cmds.append(f"ulimit -n {n} 2>/dev/null || {{ echo \"LimitNOFILE={n}: this machine's "
                    f"hard limit is $(ulimit -Hn), using that\" >&2; ulimit -n $(ulimit -Hn); }}")
    cmds.append("cd / && exec env -i " + " ".join(f"{k}={shlex.quote(v)}" for k, v in
                                                   env.items())
                + " " + " ".join(setpriv) + " -- " + s["ExecStart"])
    return "\n".join(cmds)


def start(unit: str) -> None:
    s = service(unit)
    if "StateDirectory" in s:
        user = s.get("User", "root")
        mode = s.get("StateDirectoryMode", "0755")
        for d in s["StateDirectory"].split():
            subprocess.run(["install", "-d", "-o", user, "-g", s.get("Group", user), "-m",
                            mode, f"/var/lib/{d}"], check=True)
    for k in sorted(NOT_ENFORCED & set(s)):
        print(f"systemctl (rehearsal): {unit}: {k}={s[k]} not enforced (needs seccomp)",
              file=sys.stderr)
    log = open(journal() / f"{unit}.log", "ab")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             sandbox_script(s)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    (journal() / f"{unit}.pid").write_text(str(proc.pid))


def stop(unit: str) -> None:
    pid_file = journal() / f"{unit}.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 15)
        except ProcessLookupError:
            pass
        pid_file.unlink()


def systemctl(argv: list[str]) -> None:
    if argv == ["daemon-reload"]:
        (journal() / "daemon-reload").touch()
        return
    verb, rest = argv[0], [a for a in argv[1:] if not a.startswith("--")]
    now = "--now" in argv
    for unit in rest:
        if verb == "enable" and unit in ("nftables", "nftables.service"):
            # what nftables.service does at boot, checked (not applied twice)
            r = subprocess.run(["nft", "-c", "-f", "/etc/nftables.conf"], capture_output=True,
                               text=True)
            if r.returncode:
                die(f"/etc/nftables.conf would not load at boot: {r.stderr.strip()}")
        elif verb == "enable":
            service(unit)
            if now:
                start(unit)
        elif verb == "start":
            start(unit)
        elif verb == "stop":
            stop(unit)
        elif verb == "restart":
            stop(unit)
            start(unit)
        else:
            die(f"'{verb}' not emulated")


def main() -> None:
    tool, argv = sys.argv[1], sys.argv[2:]
    if tool == "systemctl":
        systemctl(argv)
    elif tool == "journalctl":
        unit = argv[argv.index("-u") + 1]
        sys.stdout.write((journal() / f"{unit}.log").read_text())
    else:
        die(f"unknown tool {tool}")


if __name__ == "__main__":
    main()
