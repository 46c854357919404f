"""Peer links over gRPC streams (``peer_transport = "grpc"``): each pair of parties shares
one bidirectional ``PeerService.Link`` stream on the parties' gRPC port; party ``i`` dials
party ``i+1``. Inside the (mutually authenticated) TLS channel both ends send a ``Hello``
(:mod:`net.peer.handshake`) before any frame. The default transport is :mod:`net.peer.tlslink`.

:class:`StreamTransport` dials and hands each stream's frames to the router's sink;
:class:`PeerServicer` is what the party's gRPC server answers ``PeerService.Link`` with - it
accepts party ``i-1``'s stream, or refuses it naming the setting when this party's links run
over TLS sockets.
"""
from __future__ import annotations

import threading

import grpc

from mpc3.comm import ProtocolError
from net import keys
from net.grpcopts import GRPC_OPTIONS
from net.proto import mpc3_pb2 as pb
from net.proto import mpc3_pb2_grpc as pb_grpc

from .handshake import Handshake
from .linkbase import Link


class StreamTransport:
    """The dialler of one party's stream to party ``rank+1``.

    ``dial``: party ``rank+1``'s gRPC address; ``channel_creds``: this party's TLS credentials
    (None only in the development plaintext mode, ``tls=False``).
    """

    def __init__(self, dial: str, channel_creds=None, tls: bool = True) -> None:
        self.dial, self.tls = dial, tls
        self._creds = channel_creds
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._dialer: threading.Thread | None = None
        self.router = None

    def start(self, router) -> None:
        self.router = router
        self._dialer = threading.Thread(target=self._dial_loop, daemon=True,
                                        name=f"mpc3-p{router.rank}-dial")
        self._dialer.start()

    def stop(self) -> None:
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.close()
        if self._dialer is not None:
            self._dialer.join(timeout=5)

    def _dial_loop(self) -> None:
        r, backoff = self.router, 0.1
        while not r.stopping.is_set():
            target = keys.party_target_name(r.next)
            if self.tls:
                channel = grpc.secure_channel(
                    self.dial, self._creds,
                    options=GRPC_OPTIONS + [("grpc.ssl_target_name_override", target)])
            else:
                channel = grpc.insecure_channel(self.dial, options=GRPC_OPTIONS)
            with self._lock:
                self._channel = channel
            link = Link(r.next)
            reason = "stream ended"
            try:
                grpc.channel_ready_future(channel).result(timeout=2)
                hs = Handshake(security=r.security)
                mine = hs.hello(r.rank)

                def requests():
                    yield pb.PeerFrame(hello=mine)
                    yield from link.frames()

                responses = pb_grpc.PeerServiceStub(channel).Link(requests())
                first = next(responses)
                if not first.HasField("hello") or first.hello.rank != r.next:
                    raise ProtocolError(f"party {r.next} sent no valid hello")
                link.seed = hs.seed(mine, first.hello, r.rank, r.next)
                link.security = hs.peer_security
                r.link_up(r.next, link)
                backoff = 0.1
                for frame in responses:
                    r.on_frame(r.next, frame)
            except grpc.FutureTimeoutError:
                reason = f"party {r.next} at {self.dial} unreachable"
            except grpc.RpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except (ProtocolError, StopIteration, ValueError) as exc:
                reason = f"handshake failed: {exc}"
            finally:
                r.link_lost(r.next, link, reason) if link.seed else link.close()
                channel.close()
            r.stopping.wait(backoff)
            backoff = min(2 * backoff, 1.0)


class PeerServicer(pb_grpc.PeerServiceServicer):
    """``PeerService.Link`` of one party: the stream of party ``rank-1``."""

    def __init__(self, router) -> None:
        self.router = router

    def Link(self, request_iterator, context):
        r = self.router
        ident = keys.peer_identity(context)
        if r.transport.tls and (ident is None or ident.party_rank != r.prev):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"party {r.rank} accepts links only from party {r.prev}")
        if not isinstance(r.transport, StreamTransport):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"party {r.rank} takes peer links on its TLS socket, not over gRPC "
                          "(all parties must use the same [cluster] peer_transport)")
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if not first.HasField("hello") or first.hello.rank != r.prev:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"expected a hello from party {r.prev}")
        hs = Handshake(security=r.security)
        mine = hs.hello(r.rank)
        link = Link(r.prev)
        try:
            link.seed = hs.seed(mine, first.hello, r.prev, r.rank)
            link.security = hs.peer_security
        except (ProtocolError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad hello: {exc}")

        def reader() -> None:
            reason = f"party {r.prev} closed the stream"
            try:
                for frame in request_iterator:
                    r.on_frame(r.prev, frame)
            except Exception as exc:  # noqa: BLE001 - any stream error ends the link
                reason = f"stream from party {r.prev} failed ({type(exc).__name__})"
            r.link_lost(r.prev, link, reason)

        r.link_up(r.prev, link)
        threading.Thread(target=reader, daemon=True, name=f"mpc3-p{r.rank}-in").start()
        yield pb.PeerFrame(hello=mine)
        yield from link.frames(context.is_active)
        if not link.closed.is_set():
            r.link_lost(r.prev, link, "stream cancelled")
