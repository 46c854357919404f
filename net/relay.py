"""Helper processes of the network emulation (:mod:`net.emulate`), started inside a network
namespace as ``python relay.py _relay|_probe-server|_probe-client ...`` (a plain script:
standard library only, no package imports, so it starts fast in any namespace).

* ``_relay DELAY_MS RATE_MBIT LHOST:LPORT=RHOST:RPORT ...`` - the userspace delay relay:
  every byte is forwarded in order once ``now >= t_recv + delay`` (both directions), with a
  bounded queue (back-pressure), for kernels without sch_netem.
* ``_probe-server HOST PORT`` / ``_probe-client HOST:PORT PINGS SECONDS`` - the RTT and
  throughput probe behind :func:`net.emulate.verify_link`.
"""
from __future__ import annotations

import collections
import json
import os
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


def _ready_then_wait(detach: bool = False) -> None:
    """Report readiness; then exit when the Emulation owner dies (even by SIGKILL)."""
    print("READY", flush=True)
    parent = os.getppid()
    while detach or os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _sleep_until(deadline: float, comp: list) -> None:
    """Sleep until ``time.monotonic() >= deadline``, never waking early: sleep
    ``wait - comp[0]`` (running estimate of the kernel's overshoot), then spin
    (releasing the GIL) for the rest."""
    wait = deadline - time.monotonic() - comp[0]
    if wait > 0:
        t = time.monotonic()
        time.sleep(wait)
        comp[0] = min(max(0.9 * comp[0] + 0.1 * (time.monotonic() - t - wait), 0.0), 0.002)
    while time.monotonic() < deadline:
        time.sleep(0)


def _relay_main(delay_ms: str, rate_mbit: str, *maps: str) -> None:
    """Delay relay: ``maps`` are ``LHOST:LPORT=RHOST:RPORT``; every byte is
    forwarded (in order) ``delay_ms`` after it was received, both directions."""
    sys.setswitchinterval(0.0002)
    try:                                            # prctl(PR_SET_TIMERSLACK, 1 ns)
        import ctypes
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)
    except Exception:
        pass
    delay = float(delay_ms) / 1e3
    limit = int(max(4 << 20, 4 * float(rate_mbit) * 1e6 / 8 * delay))   # queue >= 4 BDP

    def pump(src: socket.socket, dst: socket.socket) -> None:
        q: collections.deque = collections.deque()  # (deadline, chunk); b"" marks EOF
        cv, st = threading.Condition(), {"buffered": 0, "dead": False}

        def reader():                               # timestamp chunks as they arrive
            try:
                while True:
                    data = src.recv(1 << 18)
                    with cv:
                        q.append((time.monotonic() + delay, data))
                        st["buffered"] += len(data)
                        cv.notify_all()
                        while st["buffered"] > limit and not st["dead"]:
                            cv.wait()               # back-pressure
                        if not data or st["dead"]:
                            return
            except OSError:
                with cv:
                    q.append((time.monotonic() + delay, b""))
                    cv.notify_all()
        threading.Thread(target=reader, daemon=True).start()
        comp = [0.0001]
        try:                                        # writer: release chunks when due
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    deadline = q[0][0]
                _sleep_until(deadline, comp)
                with cv:
                    _, data = q.popleft()
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
                with cv:
                    st["buffered"] -= len(data)
                    cv.notify_all()
        except OSError:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            with cv:
                st["dead"] = True
                cv.notify_all()

    def handler_for(target: tuple[str, int]):
        def handle(client: socket.socket) -> None:
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                return client.close()
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
            back.start()
            pump(client, upstream)
            back.join()
            client.close()
            upstream.close()
        return handle

    for m in maps:
        (lh, lp), (rh, rp) = (x.rsplit(":", 1) for x in m.split("="))
        _listen(lh, int(lp), handler_for((rh, int(rp))))
    _ready_then_wait(detach=os.environ.get("MPC3_RELAY_DETACH") == "1")


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
