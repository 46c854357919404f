"""Helper processes of the network emulation (:mod:`net.peer.emulate`), started inside a network
namespace as ``python relay.py _relay|_probe-server|_probe-client ...`` (a plain script:
standard library only, no package imports, so it starts fast in any namespace).

* ``_relay DELAY_MS RATE_MBIT LHOST:LPORT=RHOST:RPORT ...`` - the userspace delay relay:
  every byte is forwarded in order once ``now >= t_recv + delay`` (both directions), with a
  bounded queue (back-pressure), for kernels without sch_netem; one thread per relay.
* ``_probe-server HOST PORT`` / ``_probe-client HOST:PORT PINGS SECONDS`` - the RTT and
  throughput probe behind :func:`net.peer.emulate.verify_link`.
"""
from __future__ import annotations

import collections
import json
import os
import select
import socket
import sys
import threading
import time


def _listen(host: str, port: int, handler) -> None:
    """Accept connections on host:port in a daemon thread; one thread per connection."""
    ls = socket.create_server((host, port), reuse_port=False, backlog=128)

    def serve():
        while True:
            c, _ = ls.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=handler, args=(c,), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()


def _ready_then_wait() -> None:
    """Report readiness; then exit when the Emulation owner dies (even by SIGKILL)."""
    print("READY", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


class _Direction:
    """One direction of a relayed connection: chunks read from ``src`` wait in ``q`` as
    ``(due, bytes)`` (``b""`` = end of stream) until due, then go to ``dst``."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.q: collections.deque = collections.deque()
        self.buffered = 0
        self.reading = True             # until src reaches EOF or fails
        self.blocked = False            # dst's send buffer is full: wait until writable


def _relay_main(delay_ms: str, rate_mbit: str, *maps: str) -> None:
    """Delay relay: ``maps`` are ``LHOST:LPORT=RHOST:RPORT``; every byte is forwarded (in
    order) ``delay_ms`` after it was received, both directions. One thread: ``select``
    (microsecond timeouts) wakes on incoming bytes and on the next chunk's due time, so an
    idle relay uses no CPU and a busy one takes no CPU from the parties beyond the copy."""
    try:                                            # prctl(PR_SET_TIMERSLACK, 1 ns)
        import ctypes
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)
    except Exception:
        pass
    delay = float(delay_ms) / 1e3
    limit = int(max(4 << 20, 4 * float(rate_mbit) * 1e6 / 8 * delay))   # queue >= 4 BDP
    listeners: dict[socket.socket, tuple[str, int]] = {}
    for m in maps:
        (lh, lp), (rh, rp) = (x.rsplit(":", 1) for x in m.split("="))
        ls = socket.create_server((lh, int(lp)), reuse_port=False, backlog=128)
        ls.setblocking(False)
        listeners[ls] = (rh, int(rp))
    print("READY", flush=True)
    detach, parent = os.environ.get("MPC3_RELAY_DETACH") == "1", os.getppid()
    dirs: list[_Direction] = []
    check_parent = time.monotonic() + 0.5

    def close(d: _Direction) -> None:               # a connection failed: drop both ways
        for x in [x for x in dirs if {x.src, x.dst} == {d.src, d.dst}]:
            dirs.remove(x)
        for s in (d.src, d.dst):
            try:
                s.close()
            except OSError:
                pass

    while True:
        now = time.monotonic()
        if now >= check_parent:
            if not detach and os.getppid() != parent:
                os._exit(0)                         # the Emulation owner died (even SIGKILL)
            check_parent = now + 0.5
        for d in list(dirs):                        # forward every chunk that is due
            if d not in dirs:
                continue                            # closed with its other direction
            try:
                while d.q and not d.blocked and d.q[0][0] <= now:
                    due, data = d.q[0]
                    if not data:
                        d.q.popleft()
                        d.dst.shutdown(socket.SHUT_WR)
                        if not any(x.q or x.reading for x in dirs if x.src is d.dst):
                            close(d)                # both ways ended
                        break
                    n = d.dst.send(data)
                    d.buffered -= n
                    if n < len(data):
                        d.q[0] = (due, data[n:])
                        d.blocked = True
                    else:
                        d.q.popleft()
            except BlockingIOError:
                d.blocked = True
            except OSError:
                close(d)
        wake = min((d.q[0][0] for d in dirs if d.q and not d.blocked), default=now + 0.5)
        rlist = list(listeners) + [d.src for d in dirs if d.reading and d.buffered < limit]
        wlist = [d.dst for d in dirs if d.blocked]
        readable, writable, _ = select.select(rlist, wlist, [],
                                              max(0.0, min(wake, check_parent) - time.monotonic()))
        t = time.monotonic()
        for d in dirs:
            if d.blocked and d.dst in writable:
                d.blocked = False
        for s in readable:
            if s in listeners:
                try:
                    client, _ = s.accept()
                except OSError:
                    continue
                try:
                    upstream = socket.create_connection(listeners[s], timeout=10)
                except OSError:
                    client.close()
                    continue
                for c in (client, upstream):
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    c.setblocking(False)
                dirs += [_Direction(client, upstream), _Direction(upstream, client)]
                continue
            d = next((x for x in dirs if x.src is s and x.reading), None)
            if d is None:
                continue
            try:
                data = s.recv(1 << 18)
            except BlockingIOError:
                continue
            except OSError:
                close(d)
                continue
            d.q.append((t + delay, data))
            d.buffered += len(data)
            d.reading = bool(data)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        if not (chunk := s.recv(n - len(out))):
            return b""
        out += chunk
    return out


def _probe_server_main(host: str, port: str) -> None:
    """'P' connections: echo 64-byte messages; 'B': count bulk bytes until EOF, reply JSON."""
    def handle(c: socket.socket) -> None:
        with c:
            mode = c.recv(1)
            while mode == b"P" and (msg := _recv_exact(c, 64)):
                c.sendall(msg)
            if mode == b"B":
                n, t0, t1, first, buf = 0, None, None, 0, bytearray(1 << 20)
                while k := c.recv_into(buf):
                    t1 = time.monotonic()
                    if t0 is None:
                        t0, first = t1, k
                    n += k
                secs = (t1 - t0) if t0 is not None else 0.0
                c.sendall(json.dumps({"bytes": n - first, "seconds": secs}).encode() + b"\n")
    _listen(host, int(port), handle)
    _ready_then_wait()


def _probe_client_main(target: str, pings: str, seconds: str) -> None:
    addr, res = (target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1])), {}
    if int(pings) > 0:
        with socket.create_connection(addr, timeout=30) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"P")
            msg, rtts = b"x" * 64, []
            for k in range(int(pings) + 1):         # first exchange is a warm-up
                t = time.perf_counter()
                s.sendall(msg)
                if _recv_exact(s, 64) != msg:
                    raise RuntimeError("ping-pong: bad echo")
                rtts.append((time.perf_counter() - t) * 1e3)
        res["rtts_ms"] = rtts[1:]
    if float(seconds) > 0:
        with socket.create_connection(addr, timeout=60) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            s.sendall(b"B")
            buf, end = b"\0" * (1 << 20), time.monotonic() + float(seconds)
            while time.monotonic() < end:
                s.sendall(buf)
            s.shutdown(socket.SHUT_WR)
            stats = json.loads(s.makefile().readline())
        res["throughput_mbit"] = stats["bytes"] * 8 / 1e6 / max(stats["seconds"], 1e-9)
    print(json.dumps(res), flush=True)


def main(argv: list[str]) -> int:
    helpers = {"_relay": _relay_main, "_probe-server": _probe_server_main,
               "_probe-client": _probe_client_main}
    if not argv or argv[0] not in helpers:
        print(f"usage: relay.py {'|'.join(helpers)} ARGS...", file=sys.stderr)
        return 2
    helpers[argv[0]](*argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
