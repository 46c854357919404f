"""TLS contexts and socket settings of the party-to-party links (:mod:`net.peer.tlslink`)."""
from __future__ import annotations

import socket
import ssl
from pathlib import Path

from net import keys


def tls_contexts(cert: Path, key: Path, ca: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(listener, dialler) contexts: TLS 1.3 only, certificates of the cluster CA required."""
    out = []
    for side in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(side)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        if side == ssl.PROTOCOL_TLS_SERVER:
            ctx.num_tickets = 0             # no session tickets: nothing for the reader to write
        out.append(ctx)
    return out[0], out[1]


def identity(sock) -> keys.Identity | None:
    """The cluster identity of a TLS peer's certificate (None: plaintext or none)."""
    der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    return keys.identity_from_pem(ssl.DER_cert_to_PEM_cert(der).encode()) if der else None


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def tune(sock: socket.socket, user_timeout_s: float) -> None:
    """No Nagle delay; a peer that vanishes (with bytes in flight or silently) ends the
    connection: TCP user timeout and keepalive."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):     # unacknowledged bytes: keepalive is silent then
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout_s * 1e3))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, opt):            # a vanished host ends the link in ~20 s
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
