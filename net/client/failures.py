"""What went wrong, for a client: errors that name the party and the next step.

:func:`rpc_error` turns a gRPC failure into a :class:`ClusterError`; when a party is
unreachable over TLS, :func:`diagnose_tls` tells a rejected certificate (and why, as far as
the client can see) from a party that is down.
"""
from __future__ import annotations

import re

import grpc

from net import keys


class ClusterError(RuntimeError):
    """A party refused or failed a request; carries the party and the gRPC status code."""

    def __init__(self, party: int | None, code: grpc.StatusCode | None, message: str) -> None:
        where = f"party {party}: " if party is not None and \
            not message.startswith(f"party {party}") else ""
        super().__init__(f"{where}{message}" + (f" [{code.name}]" if code else ""))
        self.party = party
        self.code = code


class InconsistentModel(ClusterError):
    """The parties do not hold the same upload of a model, or a stored share was changed."""


class JobFailed(ClusterError):
    """A job failed or was aborted on the parties; nothing of it is kept, it can be resubmitted."""


class TamperingDetected(RuntimeError):
    """Two copies of a replicated output share disagree: a party deviated or data was hit."""


#: Work a party refused for now is retried with backoff for this fraction of ``retry_s``:
#: a full limit frees up as jobs finish; a party that is down rarely comes back in seconds.
RETRY_WINDOWS = {grpc.StatusCode.RESOURCE_EXHAUSTED: 1.0, grpc.StatusCode.UNAVAILABLE: 0.05}
_BLAME = re.compile(r"from party (\d)")


def diagnose_tls(address: str, cert, key, ca, server_name: str,
                 timeout: float = 3.0) -> str | None:
    """Why a TLS connection to ``address`` fails, in words; None if it does not (or the
    party is not even listening, which the gRPC error already says)."""
    import socket
    import ssl
    host, _, port = address.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(str(ca))
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        return f"cannot use this client's certificate or the cluster's CA: {exc}"
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=server_name) as tls:
                tls.settimeout(timeout)
                if tls.recv(1):        # a party that accepted us sends its HTTP/2 preface
                    return None
    except ssl.SSLCertVerificationError as exc:
        return (f"this client rejected the party's certificate ({exc.verify_message}): "
                "is --config's CA the cluster's?")
    except ssl.SSLEOFError:
        pass
    except (OSError, ValueError, ssl.SSLError):
        return None
    # the party closed the connection in or right after the handshake: it refused our cert
    return ("the party rejected this client's certificate: "
            + keys.why_not_trusted(cert, ca) + " (use --cert/--key issued for this cluster)")


def rpc_error(n: int, exc: grpc.RpcError) -> ClusterError:
    """A ClusterError for party ``n`` with a message a user can act on."""
    code, details = exc.code(), exc.details() or ""
    low = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and any(k in low for k in (
            "certificate", "handshake", "ssl", "tls", "alert")):
        details = ("the TLS connection failed - a certificate was rejected (check that "
                   f"--cert/--key and the config's CA belong to this cluster) [{details[:200]}]")
    elif code == grpc.StatusCode.UNAVAILABLE:
        details = f"party {n} is not reachable ({details[:200]}); is it running? ('mpc3 status')"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"party {n} did not answer in time ({details[:200]})"
    return ClusterError(n, code, details)


