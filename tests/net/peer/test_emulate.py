"""Quick tests for net/peer/emulate.py (need root + ip netns; skipped otherwise)."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, netns_skip_reason

from app.localcluster import free_ports
from net.peer import emulate
from net.peer.emulate import PROBE_PORT_OFFSET, Emulation, NetProfile, parse_profile, verify_link

PROFILE = "custom:100:40"          # 100 Mbit/s, 40 ms RTT


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


_SKIP = netns_skip_reason()
needs_netns = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(autouse=True)
def _no_leaks():
    """Whatever happens in a test, leave no namespace of this process behind."""
    yield
    if _SKIP is None:
        for ns in _netns_list():
            if ns.startswith(f"mpc3-{os.getpid()}-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_parse_profile():
    assert parse_profile("lan") == NetProfile("lan", 4930.0, 1.17)
    assert parse_profile("WAN").rtt_ms == 141.67
    p = parse_profile("custom:100:40")
    assert (p.rate_mbit, p.rtt_ms, p.one_way_ms) == (100.0, 40.0, 20.0)
    for bad in ("foo", "custom:1", "custom:0:5", "custom:x:5"):
        with pytest.raises(ValueError):
            parse_profile(bad)


def test_requires_root(monkeypatch):
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(emulate.shutil, "which", lambda t: "/usr/sbin/" + t)
    with pytest.raises(PermissionError, match="needs root"):
        Emulation("lan").__enter__()


@needs_netns
def test_link_rtt_rate_and_teardown():
    prof = parse_profile(PROFILE)
    with Emulation(prof) as emu:
        names = list(emu.namespaces)
        assert set(names) <= set(_netns_list())
        assert len({n.rsplit("-", 1)[0] for n in names}) == 1     # one shared prefix
        for n in names:     # party/probe ports never become an outgoing connection's port
            rsv = subprocess.run(["ip", "netns", "exec", n, "sysctl", "-n",
                                  "net.ipv4.ip_local_reserved_ports"], capture_output=True,
                                 text=True).stdout.strip()
            assert rsv == f"{emu.port(0)}-{emu.port(0) + PROBE_PORT_OFFSET + 3}", rsv
        # measured path (through the relay in tbf+relay mode)
        r = verify_link(emu, 0, 1, seconds=1.0, pings=10)
        assert r["emulation"] in ("netem", "tbf+relay")
        assert r["within_10pct"]["rtt"], r
        assert r["within_10pct"]["rate"], r
        assert r["rtt_min_ms"] >= prof.rtt_ms * 0.999, r

        # a party-style request/response: server binds listen_addr(1), client
        # in ns 0 dials dial_addr(0, 1); one exchange must cost >= one RTT.
        host, port = emu.listen_addr(1).rsplit(":", 1)
        server = emu.run_in(1, [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.create_server(({host!r}, {port}))
            print("READY", flush=True)
            c, _ = s.accept()
            while d := c.recv(100):
                c.sendall(d.upper())
            """)], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "READY"
        dhost, dport = emu.dial_addr(0, 1).rsplit(":", 1)
        client = emu.run_in(0, [sys.executable, "-c", textwrap.dedent(f"""
            import json, socket, time
            c = socket.create_connection(({dhost!r}, {dport}))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = time.perf_counter(); c.sendall(b"ping"); r = c.recv(100)
            print(json.dumps({{"ms": (time.perf_counter() - t) * 1e3, "r": r.decode()}}))
            """)], stdout=subprocess.PIPE, text=True)
        out, _ = client.communicate(timeout=10)
        res = json.loads(out)
        assert res["r"] == "PING"
        assert res["ms"] >= prof.rtt_ms, res
        procs = list(emu._procs)
    assert not set(names) & set(_netns_list())
    assert all(p.poll() is not None for p in procs)


@needs_netns
def test_teardown_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with Emulation(PROFILE) as emu:
            names = list(emu.namespaces)
            procs = list(emu._procs)
            raise RuntimeError("boom")
    assert not set(names) & set(_netns_list())
    assert all(p.poll() is not None for p in procs)


@needs_netns
def test_teardown_on_sigterm():
    repo = str(ROOT)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from net.peer.emulate import Emulation
        with Emulation("custom:100:40") as emu:
            print(" ".join(emu.namespaces), flush=True)
            time.sleep(60)
        """)], cwd=repo, stdout=subprocess.PIPE, text=True)
    try:
        names = child.stdout.readline().split()
        assert len(names) == 3 and set(names) <= set(_netns_list())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) != 0
        assert not set(names) & set(_netns_list())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for ns in _netns_list():                 # the child's pid is dead now
            if ns.startswith(f"mpc3-{child.pid}-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)




def test_relay_delays_keeps_order_and_half_closes():
    """The delay relay alone (plain loopback, no namespaces): 8 MB arrive intact and in order
    through its bounded queue, a ping-pong costs >= 2 x the delay, the sender's EOF reaches
    the server and the server's reply after it still comes back; a refused upstream closes
    the accepted connection instead of leaving it hanging."""
    import hashlib
    import socket
    import threading
    import time
    up, lp, dead = free_ports(3)
    server = socket.create_server(("127.0.0.1", up))

    def serve():
        c, _ = server.accept()
        with c:
            assert c.recv(4) == b"ping"
            c.sendall(b"pong")
            h, n = hashlib.sha256(), 0
            while data := c.recv(1 << 16):
                h.update(data)
                n += len(data)
            c.sendall(f"{n} {h.hexdigest()}".encode())
    threading.Thread(target=serve, daemon=True).start()
    relay = subprocess.Popen([sys.executable, emulate._HELPERS, "_relay", "5", "100",
                              f"127.0.0.1:{lp}=127.0.0.1:{up}", f"127.0.0.1:{dead}=127.0.0.1:1"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout.readline().strip() == "READY"
        with socket.create_connection(("127.0.0.1", dead), timeout=5) as s:
            assert s.recv(1) == b""                  # upstream refused -> closed, not hung
        payload = os.urandom(8 << 20)
        with socket.create_connection(("127.0.0.1", lp), timeout=10) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = time.perf_counter()
            c.sendall(b"ping")
            assert c.recv(4) == b"pong"
            assert time.perf_counter() - t >= 0.010
            c.sendall(payload)
            c.shutdown(socket.SHUT_WR)
            reply = b""
            while data := c.recv(256):
                reply += data
        assert reply.decode() == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}"
    finally:
        relay.kill()
        relay.wait()
        server.close()
