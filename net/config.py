"""The cluster configuration: one TOML file used by every command and process.

Example (see deploy/cluster.toml)::

    [cluster]
    ca = "certs/ca.pem"            # relative paths are relative to this file
    peer_timeout_s = 30            # a peer message not arriving in time fails the job
    job_timeout_s = 600
    frac = 18                      # fixed-point fractional bits (ring Z_2^64)
    # peer_transport = "tls"       # party-to-party links: TLS sockets (default) or "grpc"
    # security = "malicious"       # default "semi-honest"; the same at every party (below)

    [limits]                       # optional; every key of net.limits.Limits, e.g.
    running_jobs = 8               # jobs computing at once; more wait in party 0's queue
    user_jobs = 12                 # queued + running jobs of one user

    [[party]]
    id = 0
    address = "mpc-a.example.org:7700"   # what peers and clients dial
    listen = "0.0.0.0:7700"              # optional bind address (default: address)
    # peer_address = "mpc-a.example.org:7701"  # peer links (default: address's port + 1)
    # peer_listen = "0.0.0.0:7701"             # their bind address (default: listen's port + 1)
    cert = "certs/party-0.pem"
    key = "certs/party-0.key"
    data_dir = "/var/lib/mpc3"
    # dial = { 1 = "10.0.0.2:7700" }     # optional per-peer dial overrides
    # peer_dial = { 1 = "10.0.0.2:7701" }
    # metrics_listen = "127.0.0.1:9700"  # Prometheus metrics (net.party.metrics): localhost only
    # log_format = "json"                # JSON log lines (net.party.logjson); default "text"

    [clients.model-owner]
    cert = "certs/owner.pem"
    key = "certs/owner.key"

``security``: ``"semi-honest"`` (default) or ``"malicious"`` - every job verified before any
output share leaves a party, or refused (:mod:`net.party.malicious`, docs/MALICIOUS.md). The
parties tell each other their mode when their links come up (``Hello.security``) and refuse
every job while any two disagree.

Plaintext mode (no TLS, no authentication) exists only for local development, as
``insecure_plaintext_for_local_dev = true`` in ``[cluster]`` or the CLI flag
``--insecure-plaintext-for-local-dev``.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .limits import Limits

INSECURE_KEY = "insecure_plaintext_for_local_dev"
PEER_TRANSPORTS = ("tls", "grpc")
SECURITY_MODES = ("semi-honest", "malicious")
REMOVED_KEYS = {
    "max_jobs": "use running_jobs in the [limits] table",
    "max_tensor_bytes": "use tensor_bytes in the [limits] table",
    "job_modules": "party processes run only the model-inference job kinds; benchmark "
                   "harnesses start their own processes",
}


@dataclass(frozen=True)
class PartyConfig:
    id: int
    address: str
    listen: str
    cert: Path | None
    key: Path | None
    data_dir: Path
    dial: dict[int, str] = field(default_factory=dict)
    peer_address: str = ""
    peer_listen: str = ""
    peer_dial: dict[int, str] = field(default_factory=dict)
    metrics_listen: str = ""       # host:port of GET /metrics (net.party.metrics); "" = off
    log_format: str = "text"       # or "json" (net.party.logjson)


@dataclass(frozen=True)
class ClientCreds:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterConfig:
    path: Path | None
    parties: tuple[PartyConfig, PartyConfig, PartyConfig]
    ca: Path | None
    peer_timeout_s: float = 30.0
    job_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    frac: int = 18
    limits: Limits = field(default_factory=Limits)
    clients: dict[str, ClientCreds] = field(default_factory=dict)
    insecure_plaintext_for_local_dev: bool = False
    peer_transport: str = "tls"
    security: str = "semi-honest"

    def party(self, n: int) -> PartyConfig:
        if n not in (0, 1, 2):
            raise ValueError(f"party id must be 0, 1 or 2, got {n}")
        return self.parties[n]

    def dial_address(self, src: int | None, dst: int) -> str:
        """Address that ``src`` (a party, or None for a client) dials to reach party ``dst``."""
        if src is not None and dst in self.parties[src].dial:
            return self.parties[src].dial[dst]
        return self.parties[dst].address

    def peer_dial_address(self, src: int, dst: int) -> str:
        """Address party ``src`` dials for its peer link to party ``dst`` (TLS sockets)."""
        return self.parties[src].peer_dial.get(dst) or self.parties[dst].peer_address

    @property
    def tls(self) -> bool:
        return not self.insecure_plaintext_for_local_dev


def _path(base: Path, value, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what}: expected a path string")
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _next_port(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() else address


def _address(table: dict, key: str, default: str, pid: int) -> str:
    v = table.get(key, default)
    if not isinstance(v, str) or ":" not in v or not v.rpartition(":")[2].isdigit():
        raise ValueError(f"party {pid}: {key} must be 'host:port', got {v!r}")
    return v


def _log_format(table: dict, pid: int) -> str:
    v = table.get("log_format", "text")
    if v not in ("text", "json"):
        raise ValueError(f"party {pid}: log_format must be \"text\" or \"json\", got {v!r}")
    return v


def _num(table: dict, key: str, default, kind, lo):
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or kind(v) < lo:
        raise ValueError(f"[cluster] {key} must be a number >= {lo}, got {v!r}")
    return kind(v)


def load(path, insecure_flag: bool = False) -> ClusterConfig:
    """Parse and validate a cluster TOML; every error names the offending key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"cluster config {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from None
    return from_dict(raw, path.parent.resolve(), path, insecure_flag)


def from_dict(raw: dict, base: Path, path: Path | None = None,
              insecure_flag: bool = False) -> ClusterConfig:
    cl = raw.get("cluster", {})
    insecure = bool(cl.get(INSECURE_KEY, False)) or insecure_flag
    parties_raw = raw.get("party")
    if not isinstance(parties_raw, list) or len(parties_raw) != 3:
        raise ValueError("config needs exactly three [[party]] tables")
    parties: list[PartyConfig | None] = [None, None, None]
    for t in parties_raw:
        pid = t.get("id")
        if pid not in (0, 1, 2) or parties[pid] is not None:
            raise ValueError(f"[[party]] id must be 0, 1, 2, each once; got {pid!r}")
        addr = t.get("address")
        if not isinstance(addr, str) or ":" not in addr:
            raise ValueError(f"party {pid}: address must be 'host:port', got {addr!r}")
        cert = key = None
        if not insecure:
            cert = _path(base, t.get("cert"), f"party {pid} cert")
            key = _path(base, t.get("key"), f"party {pid} key")
        dial = {int(k): str(v) for k, v in t.get("dial", {}).items()}
        listen = str(t.get("listen", addr))
        peer_addr = _address(t, "peer_address", _next_port(addr), pid)
        parties[pid] = PartyConfig(pid, addr, listen, cert, key,
                                   _path(base, t.get("data_dir", f"data/party-{pid}"),
                                         f"party {pid} data_dir"), dial, peer_addr,
                                   _address(t, "peer_listen", _next_port(listen)
                                            if "listen" in t else peer_addr, pid),
                                   {int(k): str(v) for k, v in t.get("peer_dial", {}).items()},
                                   _address(t, "metrics_listen", "", pid)
                                   if "metrics_listen" in t else "",
                                   _log_format(t, pid))
    clients = {role: ClientCreds(_path(base, c.get("cert"), f"clients.{role} cert"),
                                 _path(base, c.get("key"), f"clients.{role} key"))
               for role, c in raw.get("clients", {}).items()}
    ca = None if insecure else _path(base, cl.get("ca"), "[cluster] ca")
    for old, new in REMOVED_KEYS.items():
        if old in cl:
            raise ValueError(f"[cluster] {old} is no longer supported: {new}")
    transport = cl.get("peer_transport", "tls")
    if transport not in PEER_TRANSPORTS:
        raise ValueError(f"[cluster] peer_transport must be one of {', '.join(PEER_TRANSPORTS)}, "
                         f"got {transport!r}")
    security = cl.get("security", "semi-honest")
    if security not in SECURITY_MODES:
        raise ValueError(f"[cluster] security must be \"semi-honest\" or \"malicious\", got "
                         f"{security!r}")
    limits = raw.get("limits", {})
    if not isinstance(limits, dict):
        raise ValueError("[limits] must be a table")
    return ClusterConfig(
        path=path, parties=tuple(parties), ca=ca,
        peer_timeout_s=_num(cl, "peer_timeout_s", 30.0, float, 0.1),
        job_timeout_s=_num(cl, "job_timeout_s", 600.0, float, 1),
        connect_timeout_s=_num(cl, "connect_timeout_s", 10.0, float, 0.1),
        frac=_num(cl, "frac", 18, int, 1),
        limits=Limits.from_table(limits),
        clients=clients,
        insecure_plaintext_for_local_dev=insecure,
        peer_transport=transport, security=security)


def render(parties: list[dict], cluster: dict, clients: dict[str, dict],
           limits: dict | None = None) -> str:
    """TOML text for a config (used by ``cluster up``); values are str/int/float/bool or
    flat dicts of them (inline tables)."""
    def val(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = ["[cluster]"] + [f"{k} = {val(v)}" for k, v in cluster.items()]
    if limits:
        lines += ["", "[limits]"] + [f"{k} = {val(v)}" for k, v in limits.items()]
    for p in parties:
        lines += ["", "[[party]]"] + [f"{k} = {val(v)}" for k, v in p.items()]
    for role, c in clients.items():
        lines += ["", f"[clients.{role}]"] + [f"{k} = {val(v)}" for k, v in c.items()]
    return "\n".join(lines) + "\n"
