"""LAN/WAN network emulation for the three MPC parties (benchmarks only).

Topology: three network namespaces ``mpc3-<pid>-<n>-p0..p2`` joined by a full
mesh of veth pairs (one independent link per pair of parties).  Party ``i``
owns ``10.77.0.<i+1>`` (private; exists only inside these namespaces) and
listens on ``listen_addr(i)`` = ``10.77.0.<i+1>:<base_port+i>``.

Shaping, on both ends of every link so every pair sees the profile:

* ``emulation == "netem"`` (kernel has sch_netem, detected once): one
  ``netem delay RTT/2 rate R`` qdisc per veth end; peers dial each other's
  listen address directly.
* ``emulation == "tbf+relay"`` (otherwise): ``tbf rate R`` per veth end; the
  one-way delay is added by a userspace TCP relay (:mod:`net.peer.relay`) running
  in the dialling party's namespace.  Party ``i`` dials ``127.0.1.<j+1>:port``
  (``dial_addr``); the relay timestamps every received chunk and forwards it,
  in order, once ``now >= t_recv + RTT/2`` -- in both directions, so a
  request/response costs >= one RTT.  Its queue is bounded (back-pressure).
  The relay's own forwarding latency is calibrated once and subtracted.
  Connection set-up through the relay is not delayed, only payload bytes.

Profile rates are application goodput (iperf-style); the qdisc rate is scaled
by ``GOODPUT_OVERHEAD`` because tc counts Ethernet/IP/TCP headers.

Stable API (for ``mpc3 bench --net``)::

    profile = parse_profile("lan" | "wan" | "custom:RATE_MBIT:RTT_MS")
    with Emulation(profile, base_port=47000) as emu:
        emu.emulation                   # "netem" | "tbf+relay"
        emu.ns(i), emu.listen_addr(i)   # namespace, "host:port" party i binds
        emu.dial_addr(i, j)             # "host:port" party i dials to reach j
        emu.peers(i)                    # {j: dial_addr(i, j)} for j != i
        emu.expose(j, port)             # make another port of party j reachable
        emu.run_in(i, argv, **popen_kwargs)  # subprocess.Popen inside ns i
        verify_link(emu, i, j)          # measured rtt/throughput dict

CLI: ``python -m net.peer.emulate check --net lan|wan|custom:R:RTT``.  Needs root
and iproute2 (``ip``, ``tc``).  Everything created (namespaces, links,
processes, relays) is removed on exit, on exceptions, on SIGINT/SIGTERM, at
interpreter exit, and -- after a SIGKILL -- by the next ``Emulation``.
"""
from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass

PARTIES = 3
SUBNET = "10.77.0"          # party i: 10.77.0.<i+1>
RELAY_NET = "127.0.1"       # relay towards party j: 127.0.1.<j+1> (in the dialler's ns)
NS_PREFIX = "mpc3-"
DEFAULT_BASE_PORT = 47000
PROBE_PORT_OFFSET = 100     # verify_link probe server of party j: base_port + 100 + j
GOODPUT_OVERHEAD = 1514 / 1448   # wire bytes per TCP payload byte (MTU 1500, timestamps)
_HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
_counter = itertools.count()


@dataclass(frozen=True)
class NetProfile:
    name: str
    rate_mbit: float        # per-link goodput, each direction
    rtt_ms: float           # round-trip time between any two parties

    @property
    def one_way_ms(self) -> float:
        return self.rtt_ms / 2.0


PROFILES = {                # Privformer paper, Sec. 9.1
    "lan": NetProfile("lan", 4930.0, 1.17),
    "wan": NetProfile("wan", 97.4, 141.67),
}


def parse_profile(spec: str | NetProfile) -> NetProfile:
    """``"lan"``, ``"wan"`` or ``"custom:RATE_MBIT:RTT_MS"`` -> NetProfile."""
    if isinstance(spec, NetProfile):
        return spec
    s = spec.strip().lower()
    if s in PROFILES:
        return PROFILES[s]
    parts = s.split(":")
    if len(parts) == 3 and parts[0] == "custom":
        rate, rtt = float(parts[1]), float(parts[2])
        if rate <= 0 or rtt < 0:
            raise ValueError(f"bad network profile {spec!r}: need rate > 0, rtt >= 0")
        return NetProfile(s, rate, rtt)
    raise ValueError(f"unknown network profile {spec!r} (lan | wan | custom:RATE_MBIT:RTT_MS)")


def _sh(*cmd, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {r.stderr.strip()}")
    return r


def _require_root_and_tools() -> None:
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"network emulation needs iproute2: {', '.join(missing)} not found")
    if os.geteuid() != 0:
        raise PermissionError("network emulation needs root (ip netns, tc)")


_NETEM: bool | None = None


def netem_available() -> bool:
    """Detect (once) whether the kernel accepts a netem qdisc, in a scratch ns."""
    global _NETEM
    if _NETEM is None:
        ns = f"{NS_PREFIX}{os.getpid()}-netemprobe"
        _sh("ip", "netns", "add", ns)
        try:
            _NETEM = _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                         "netem", "delay", "1ms", check=False).returncode == 0
        finally:
            _sh("ip", "netns", "del", ns, check=False)
    return _NETEM


def _kill_ns_pids(ns: str) -> None:
    for pid in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def cleanup_stale() -> list[str]:
    """Delete ``mpc3-<pid>-*`` namespaces (and their processes) whose owner is dead."""
    removed = []
    for name in (l.split()[0] for l in _sh("ip", "netns", "list", check=False).stdout.splitlines() if l.strip()):
        pid = name[len(NS_PREFIX):].split("-")[0] if name.startswith(NS_PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _kill_ns_pids(name)
            _sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


class Emulation:
    """Context manager owning the namespaces, links, shaping, relays and processes."""

    def __init__(self, profile: str | NetProfile, base_port: int = DEFAULT_BASE_PORT,
                 mechanism: str = "auto"):
        if mechanism not in ("auto", "netem", "tbf+relay"):
            raise ValueError(f"unknown mechanism {mechanism!r}")
        self.profile = parse_profile(profile)
        self.base_port = base_port
        self.mechanism = mechanism
        self.emulation: str | None = None       # "netem" | "tbf+relay" once active
        self.relay_overhead_ms = 0.0            # calibrated relay forwarding latency
        self.prefix = f"{NS_PREFIX}{os.getpid()}-{next(_counter)}"    # unique per instance
        self.namespaces = [f"{self.prefix}-p{i}" for i in range(PARTIES)]
        self._procs: list[subprocess.Popen] = []
        self._exposed: set[tuple[int, int]] = set()
        self._probe_ports: set[int] = set()
        self._old_handlers: dict = {}
        self._active = False

    # ---- addressing
    def ns(self, i: int) -> str:
        return self.namespaces[i]

    def host(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def port(self, i: int) -> int:
        return self.base_port + i

    def peer_port(self, i: int) -> int:
        """Party i's peer-link port (TLS sockets, :mod:`net.peer.tlslink`)."""
        return self.base_port + PARTIES + i

    def listen_addr(self, i: int, port: int | None = None) -> str:
        return f"{self.host(i)}:{self.port(i) if port is None else port}"

    def dial_addr(self, i: int, j: int, port: int | None = None) -> str:
        """Address party i dials to reach party j (``port`` defaults to j's party port)."""
        port = self.port(j) if port is None else port
        if self.emulation == "tbf+relay" and i != j:
            return f"{RELAY_NET}.{j + 1}:{port}"
        return f"{self.host(j)}:{port}"

    def peers(self, i: int, port_of=None) -> dict[int, str]:
        """Addresses party i dials for each other party j (``port_of(j)``: default the
        party port, e.g. :meth:`peer_port` for the peer links)."""
        return {j: self.dial_addr(i, j, port_of(j) if port_of else None)
                for j in range(PARTIES) if j != i}

    # ---- lifecycle
    def __enter__(self) -> "Emulation":
        _require_root_and_tools()
        cleanup_stale()
        self.emulation = self.mechanism if self.mechanism != "auto" else (
            "netem" if netem_available() else "tbf+relay")
        self._active = True
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, sig, frame):
        prev = self._old_handlers.get(sig, signal.SIG_DFL)
        self.close()
        if callable(prev):
            prev(sig, frame)
        elif prev != signal.SIG_IGN:
            raise KeyboardInterrupt if sig == signal.SIGINT else SystemExit(128 + sig)

    def _setup(self) -> None:
        # the party, probe and relay ports lie in Linux's ephemeral range (32768-60999): an
        # outgoing connection of a relay or probe could take one as its source port before
        # the party binds it ("Address already in use", seen once in CI) - reserve them
        # in every namespace (net.* sysctls are per namespace; explicit binds still work)
        ports = f"{self.base_port}-{self.base_port + PROBE_PORT_OFFSET + PARTIES}"
        for ns in self.namespaces:
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                f"net.ipv4.ip_local_reserved_ports={ports}")
        for i, j in itertools.combinations(range(PARTIES), 2):
            _sh("ip", "-n", self.ns(i), "link", "add", f"to{j}", "type", "veth",
                "peer", "name", f"to{i}", "netns", self.ns(j))
            for me, other in ((i, j), (j, i)):
                ns, dev = self.ns(me), f"to{other}"
                _sh("ip", "-n", ns, "addr", "add", self.host(me), "peer", self.host(other), "dev", dev)
                _sh("ip", "-n", ns, "link", "set", dev, "up")
                self._shape(ns, dev)
        if self.emulation == "tbf+relay":
            self.relay_overhead_ms = self._calibrate_relay()
            for j in range(PARTIES):
                self.expose(j, self.port(j))
                self.expose(j, self.peer_port(j))

    def _shape(self, ns: str, dev: str) -> None:
        p = self.profile
        rate = p.rate_mbit * GOODPUT_OVERHEAD
        rate_Bps = rate * 1e6 / 8
        tc = ("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root")
        if self.emulation == "netem":
            limit = max(1000, int(4 * rate_Bps * p.rtt_ms / 1e3 / 1500))   # >= 4 BDP in packets
            _sh(*tc, "netem", "delay", f"{p.one_way_ms:.3f}ms", "rate", f"{rate:.3f}mbit", "limit", limit)
        else:
            burst = int(max(64 * 1024, rate_Bps * 0.001))   # >= one GSO packet, ~1 ms of rate
            _sh(*tc, "tbf", "rate", f"{rate:.3f}mbit", "burst", burst, "limit", 2 * burst + 65536)

    def _calibrate_relay(self) -> float:
        """Per-direction latency the relay adds on top of its wait (wake-up, loopback hop),
        from a scratch relay at a small delay.  Uses minima, and the least of three
        estimates (one alone varied 0.04-0.07 ms on LAN), so exchanges still take >= RTT."""
        d, port = min(self.profile.one_way_ms, 0.5), self._probe_server(1)
        relay = self._start_relay(0, f"{RELAY_NET}.200:{port}", f"{self.host(1)}:{port}", d)
        estimates = []
        try:
            for _ in range(3):
                via = _probe(self, 0, f"{RELAY_NET}.200:{port}", 50, 0)["rtts_ms"]
                direct = _probe(self, 0, f"{self.host(1)}:{port}", 50, 0)["rtts_ms"]
                estimates.append((min(via) - 2 * d - min(direct)) / 2)
        finally:
            relay.kill()
        return min(max(0.0, min(estimates)), self.profile.one_way_ms)

    def _start_relay(self, i: int, local: str, remote: str, delay_ms: float) -> subprocess.Popen:
        return self._start_helper(i, "_relay", delay_ms, self.profile.rate_mbit, f"{local}={remote}")

    def _probe_server(self, j: int) -> int:
        """Start (once) the verify_link probe server of party j; return its port."""
        port = self.base_port + PROBE_PORT_OFFSET + j
        if port not in self._probe_ports:
            self._start_helper(j, "_probe-server", self.host(j), port)
            self._probe_ports.add(port)
        return port

    def _start_helper(self, i: int, *args) -> subprocess.Popen:
        proc = self.run_in(i, [sys.executable, _HELPERS, *args], stdout=subprocess.PIPE, text=True)
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"helper {args} in {self.ns(i)} failed to start")
        return proc

    def expose(self, j: int, port: int) -> None:
        """Make ``host(j):port`` reachable from the other parties via ``dial_addr(i, j, port)``.
        No-op with netem; with tbf+relay starts the delay relays (idempotent)."""
        if self.emulation != "tbf+relay" or (j, port) in self._exposed:
            return
        self._exposed.add((j, port))
        delay_ms = self.profile.one_way_ms - self.relay_overhead_ms
        for i in range(PARTIES):
            if i != j:
                self._start_relay(i, self.dial_addr(i, j, port), f"{self.host(j)}:{port}", delay_ms)

    def run_in(self, i: int, argv, **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside party i's namespace; it is killed on close()."""
        if not self._active:
            raise RuntimeError("Emulation is not active (use it as a context manager)")
        popen_kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *map(str, argv)], **popen_kwargs)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill started processes, delete the namespaces (and with them the links). Idempotent."""
        if not self._active:
            return
        self._active = False
        for proc in self._procs:
            if proc.poll() is None:
                try:                                # whole group only if it is the child's own
                    os.killpg(proc.pid, signal.SIGKILL) if os.getpgid(proc.pid) == proc.pid else proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (proc.stdin, proc.stdout, proc.stderr):
                f and f.close()
        for ns in self.namespaces:
            _kill_ns_pids(ns)
            _sh("ip", "netns", "del", ns, check=False)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
        atexit.unregister(self.close)


# ---- verification
def _probe(emu: Emulation, i: int, target: str, pings: int, seconds: float) -> dict:
    p = emu.run_in(i, [sys.executable, _HELPERS, "_probe-client", target, pings, seconds],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=30 + seconds + pings * emu.profile.rtt_ms / 500)
    if p.returncode != 0:
        raise RuntimeError(f"link probe {i}->{target} failed: {err.strip()}")
    return json.loads(out)


def verify_link(emu: Emulation, i: int, j: int, seconds: float = 2.0, pings: int = 20,
                quiet: bool = False) -> dict:
    """Measure RTT (median of ``pings`` TCP ping-pongs) and throughput (bulk i->j
    for ``seconds``) on the path party i uses to reach party j, against the
    profile (10% tolerance).  In tbf+relay mode a missed rate is reported as a
    ceiling (``rate_ceiling``, ``relay_ceiling_mbit``) with the relay-free
    tbf-only figure (``direct_throughput_mbit``) and the culprit (``ceiling``:
    "relay", or "host" if even the relay-free path is CPU-bound)."""
    prof, port = emu.profile, emu._probe_server(j)
    emu.expose(j, port)
    m = _probe(emu, i, emu.dial_addr(i, j, port), pings, seconds)
    rtt, rate = statistics.median(m["rtts_ms"]), m["throughput_mbit"]
    res = {"link": f"{i}->{j}", "rtt_ms": round(rtt, 3), "rtt_min_ms": round(min(m["rtts_ms"]), 3),
           "throughput_mbit": round(rate, 1), "target_rtt_ms": prof.rtt_ms,
           "target_rate_mbit": prof.rate_mbit, "emulation": emu.emulation,
           "relay_overhead_ms": round(emu.relay_overhead_ms, 4),
           "within_10pct": {"rtt": abs(rtt - prof.rtt_ms) <= 0.1 * prof.rtt_ms,
                            "rate": abs(rate - prof.rate_mbit) <= 0.1 * prof.rate_mbit}}
    if emu.emulation == "tbf+relay" and rate < 0.9 * prof.rate_mbit:
        direct = _probe(emu, i, f"{emu.host(j)}:{port}", 0, seconds)["throughput_mbit"]
        res.update(rate_ceiling=True, relay_ceiling_mbit=round(rate, 1),
                   direct_throughput_mbit=round(direct, 1),
                   ceiling="relay" if direct >= 0.9 * prof.rate_mbit else "host")
    if not quiet:
        print(_summary(res), flush=True)
    return res


def _summary(r: dict) -> str:
    ok = {True: "ok", False: "MISS"}
    s = (f"[net {r['emulation']}] link {r['link']}: rtt {r['rtt_ms']:.3f} ms (target "
         f"{r['target_rtt_ms']}, {ok[r['within_10pct']['rtt']]}), rate {r['throughput_mbit']:.1f} "
         f"Mbit/s (target {r['target_rate_mbit']}, {ok[r['within_10pct']['rate']]})")
    if r.get("rate_ceiling"):
        s += (f"; rate ceiling ({r['ceiling']}): via relay {r['relay_ceiling_mbit']:.1f}, "
              f"tbf-only {r['direct_throughput_mbit']:.1f} Mbit/s")
    return s


# ---- CLI
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m net.peer.emulate",
                                 description=__doc__.split("\n")[0])
    c = ap.add_subparsers(dest="cmd", required=True).add_parser(
        "check", help="set up the emulation, verify all three links, tear down")
    c.add_argument("--net", default="lan", help="lan | wan | custom:RATE_MBIT:RTT_MS")
    c.add_argument("--seconds", type=float, default=2.0, help="bulk transfer per link")
    c.add_argument("--pings", type=int, default=50)
    c.add_argument("--mechanism", default="auto", choices=["auto", "netem", "tbf+relay"])
    c.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    a = ap.parse_args(argv)
    prof = parse_profile(a.net)
    with Emulation(prof, base_port=a.base_port, mechanism=a.mechanism) as emu:
        print(f"profile {prof.name}: {prof.rate_mbit} Mbit/s, {prof.rtt_ms} ms RTT; emulation "
              f"{emu.emulation} (relay overhead {emu.relay_overhead_ms:.3f} ms); {', '.join(emu.namespaces)}")
        results = [verify_link(emu, i, j, a.seconds, a.pings) for i, j in ((0, 1), (1, 2), (2, 0))]
    print(f"\n{'link':6} {'rtt_ms':>9} {'target':>8} {'Mbit/s':>10} {'target':>9}  mechanism")
    for x in results:
        print(f"{x['link']:6} {x['rtt_ms']:9.3f} {x['target_rtt_ms']:8.2f} {x['throughput_mbit']:10.1f} "
              f"{x['target_rate_mbit']:9.1f}  {x['emulation']}"
              + (f"  ({x['ceiling']} ceiling)" if x.get("rate_ceiling") else ""))
    print(json.dumps({"profile": asdict(prof), "links": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
