"""Three peer routers in one process over real sockets on loopback (tests and the
``--transport grpc`` layer benchmarks): the party-to-party transport - TLS socket links or
gRPC streams - without party processes."""
from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from net import keys
from net.grpcopts import SERVER_OPTIONS
from net.proto import mpc3_pb2_grpc as pb_grpc

from .router import PeerRouter, PeerUnavailable
from .streams import PeerServicer, StreamTransport


def local_mesh(cert_dir=None, host: str = "127.0.0.1", ready_timeout: float = 20.0,
               transport: str = "tls"):
    """Three routers in this process over real sockets on ephemeral loopback ports.

    ``cert_dir``: directory made by :func:`net.keys.generate` (mTLS); None = plaintext.
    ``transport``: ``"tls"`` (:mod:`net.peer.tlslink`, the default) or ``"grpc"`` (streams).
    Returns ``(routers, stop)``; call ``stop()`` to shut everything down.
    """
    if transport == "tls":
        return _socket_mesh(cert_dir, host, ready_timeout)
    if transport != "grpc":
        raise ValueError(f"unknown peer transport {transport!r} (tls | grpc)")
    servers, ports = [], []
    for r in range(3):
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=SERVER_OPTIONS)
        if cert_dir is None:
            ports.append(srv.add_insecure_port(f"{host}:0"))
        else:
            d = Path(cert_dir)
            ports.append(srv.add_secure_port(f"{host}:0", keys.server_credentials(
                d / f"party-{r}.pem", d / f"party-{r}.key", d / "ca.pem")))
        servers.append(srv)
    routers = []
    for r in range(3):
        creds = None
        if cert_dir is not None:
            d = Path(cert_dir)
            creds = keys.channel_credentials(d / f"party-{r}.pem", d / f"party-{r}.key",
                                             d / "ca.pem")
        router = PeerRouter(r, StreamTransport(f"{host}:{ports[(r + 1) % 3]}", creds,
                                               tls=cert_dir is not None))
        pb_grpc.add_PeerServiceServicer_to_server(PeerServicer(router), servers[r])
        routers.append(router)
    return _run(routers, ready_timeout, servers)


def _socket_mesh(cert_dir, host: str, ready_timeout: float):
    from .tlslink import SocketTransport
    from .tlssock import tls_contexts
    transports = []
    for r in range(3):
        ctx = None
        if cert_dir is not None:
            d = Path(cert_dir)
            ctx = tls_contexts(d / f"party-{r}.pem", d / f"party-{r}.key", d / "ca.pem")
        transports.append(SocketTransport(f"{host}:0", "", ctx))
    ports = [t.port for t in transports]
    routers = []
    for r, t in enumerate(transports):
        t.dial = f"{host}:{ports[(r + 1) % 3]}"
        routers.append(PeerRouter(r, t))
    return _run(routers, ready_timeout)


def _run(routers: list[PeerRouter], ready_timeout: float, servers=()):
    """Start the (gRPC servers and) routers; ``(routers, stop)`` once every link is up."""
    for srv in servers:
        srv.start()
    for router in routers:
        router.start()

    def stop() -> None:
        for router in routers:
            router.stopping.set()
        for router in routers:
            router.stop()
        for srv in servers:
            srv.stop(grace=None)

    if not all(router.wait_ready(ready_timeout) for router in routers):
        stop()
        raise PeerUnavailable("local mesh: links did not come up")
    return routers, stop
