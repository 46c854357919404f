"""Party-to-party links over TLS 1.3 sockets: the default peer transport.

Why not the gRPC stream. A round over a bidirectional gRPC stream passed every message
through four Python threads (the sender's queue consumer, gRPC's completion-queue poller, our
stream reader, the job) plus gRPC's C event engine: ~0.42 ms of CPU per party and round
(``benchmarks/thread_cpu.py``), three times that on a host running all three parties. Here
the job thread writes its frame to the socket itself and, waiting for a message, reads the
link itself too (:mod:`net.peer.readturn`); a reader thread per link reads only what no job thread
waits for: no hand-off between threads in a round.

What stays the same (:mod:`net.peer.router`, :mod:`net.peer.streams`): the router, its per-job
mailboxes and ops, the ``PeerFrame`` messages (hello, data chunks of at most
:data:`net.grpcopts.CHUNK_BYTES`, abort, control), the X25519 hello that derives the pairwise PRG
seeds, and the topology (party ``i`` dials party ``i+1``; each link carries both directions).

Security. TLS 1.3 with the cluster CA in both directions: the dialler checks that the
listener's certificate is party ``i+1``'s (``party-N`` DNS name and OU), the listener
refuses any caller whose certificate is not party ``i-1``'s. Plaintext only in the
development mode that also makes gRPC plaintext.

Wire format (little-endian). A kind byte, then either
* 0: a 4-byte length and a serialised ``PeerFrame`` (hello, abort, control), at most
  :data:`MAX_FRAME_BYTES`; or
* 1: a whole communicator message without protobuf: lengths of its job id and layout
  (:mod:`net.peer.frames`), its array count, op and payload length, then the job id, the layout and
  the arrays' bytes. The sender writes large arrays straight from their memory and the
  receiver reads the payload straight into the buffer its arrays will view: no chunking and
  no copies beyond TLS's own (the gRPC stream made ~10 of every byte). The layout is
  validated and must account for the payload before anything is allocated; a payload buffer
  starts at most :data:`FIRST_BYTES` long and doubles as bytes arrive. A sender refuses (in
  its job) what the receiver would refuse, so one job's mistake never ends a link.
Anything else ends the link. One SSL object is never used by two threads at once: the
socket is non-blocking, reads and writes take a lock around each SSL call, and threads wait
for readiness with ``poll`` outside it, each with its own poll object. A write that cannot
finish within the peer deadline (the peer timeout plus a 1 MB/s floor for its size) closes the
link, which aborts the jobs on it; TCP's user timeout does the same for a host that vanished
with bytes in flight. Closing shuts the socket down under the same lock, never through
``SSLSocket.shutdown`` (which drops the SSL object first: a write racing it would leave in
plaintext), and the descriptor is closed only under that lock, after which no thread touches it.

Unauthenticated callers: at most :data:`MAX_HANDSHAKES` connections complete their TLS
handshake at once, at most :data:`MAX_HANDSHAKES_PER_HOST` from one address (more are closed
at once), each within the connect timeout; refusals are logged at most every 10 s.
"""
from __future__ import annotations

import logging
import select
import socket
import ssl
import struct
import threading
import time

import numpy as np

from mpc3.comm import Aborted, Payload, PeerTimeout, ProtocolError
from net import keys
from net.grpcopts import MAX_FRAME_BYTES
from net.proto import mpc3_pb2 as pb

from .frames import MAX_HEADER_BYTES, MAX_MESSAGE_BYTES, contiguous, parse_layout, split
from .handshake import Handshake
from .linkbase import Link
from .readturn import SLICE_S, Paused, ReadTurns, poller
from .router import PeerRouter
from .tlssock import identity, split_address, tune

log = logging.getLogger("mpc3.link")

_FRAME = struct.Struct("<BI")           # kind 0, PeerFrame length
_MSG = struct.Struct("<BHIIQQ")         # kind 1, job id length, layout length, arrays, op, bytes
MAX_JOB_ID_BYTES = 1024
FIRST_BYTES = 8 << 20                   # a payload buffer's first allocation, at most
MAX_HANDSHAKES = 8
MAX_HANDSHAKES_PER_HOST = 2
_MIN_RATE = 1e6                         # bytes/s a peer must take for a write to go on
_JOIN_BELOW = 1 << 16                   # smaller messages go out as one write
_READ = 1 << 18
_WAIT_MS = 500                  # readiness waits re-check closing this often
_NOT_READY = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)


class SocketLink(ReadTurns, Link):
    """A live TLS (or development-plaintext) connection to a peer; who reads it:
    :mod:`net.peer.readturn`."""

    def __init__(self, peer: int, sock: socket.socket, send_timeout: float) -> None:
        super().__init__(peer)
        self.sock = sock
        self.send_timeout = send_timeout
        self._io = threading.Lock()         # one SSL call at a time
        self._dead = False                  # under _io: the socket is shut down or closed
        self._writer = threading.Lock()     # whole frames, one after the other
        self._rbuf = bytearray()
        self._chunk = bytearray(_READ)      # recv_into: no 256 KiB allocation per read
        # poll (no fd limit, unlike select); a poll object serves one thread at a time:
        # _readable the read turn's holder, _write_readable a writer SSL makes read
        self._readable = poller(sock, select.POLLIN)
        self._writable = poller(sock, select.POLLOUT)
        self._write_readable = poller(sock, select.POLLIN)
        self._read_writable = poller(sock, select.POLLOUT)
        # a frame read in several turns (net.peer.readturn): its parsed message header, and its
        # payload buffer with the bytes it holds so far
        self._head: tuple | None = None
        self._part: list | None = None
        self._stop = None                   # the turn holder's reason to pause mid-frame
        self._init_turns(sock)

    # ------------------------------------------------------------------ writing ----
    def put(self, frame: pb.PeerFrame) -> None:
        data = frame.SerializeToString()
        self._send([_FRAME.pack(0, len(data)) + data])

    def send_message(self, job_id: str, op: int, arrays: Payload) -> None:
        arrays, layout = contiguous(arrays) if arrays else ([], b"")
        jid = job_id.encode()
        if len(jid) > MAX_JOB_ID_BYTES:
            raise ProtocolError(f"party {self.peer} would refuse job id {job_id[:40]!r}...")
        if arrays:                          # the receiver's own check (cached per layout)
            parse_layout(layout, len(arrays))
        size = sum(a.nbytes for a in arrays)
        head = _MSG.pack(1, len(jid), len(layout), len(arrays), op, size) + jid + layout
        if size <= _JOIN_BELOW:
            self._send([head + b"".join(arrays)])
        else:
            self._send([head] + [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays
                                 if a.nbytes])

    def _send(self, parts: list) -> None:
        if self.closed.is_set():
            raise Aborted(f"link to party {self.peer} is down")
        size = sum(memoryview(p).nbytes for p in parts)
        deadline = time.monotonic() + self.send_timeout + size / _MIN_RATE
        if not self._writer.acquire(timeout=self.send_timeout):
            raise PeerTimeout(f"the link to party {self.peer} stayed busy for "
                              f"{self.send_timeout:g} s")
        try:
            for part in parts:
                self._write(part, deadline)
        finally:
            self._writer.release()

    def _write(self, data, deadline: float) -> None:
        view, failed = memoryview(data), None
        while view:
            with self._io:
                if self._dead:
                    raise Aborted(f"link to party {self.peer} is down")
                try:
                    n, wait = self.sock.send(view), None
                except ssl.SSLWantReadError:
                    n, wait = 0, self._write_readable
                except _NOT_READY:
                    n, wait = 0, self._writable
                except (OSError, ValueError) as exc:
                    n, failed = 0, exc
            if failed is not None:
                self.close()
                raise Aborted(f"link to party {self.peer} failed: {failed}") from None
            if n:
                view = view[n:]
                continue
            if time.monotonic() > deadline:
                self.close()                # a partial frame: the stream is unusable
                raise PeerTimeout(f"party {self.peer} read too slowly (write deadline passed)")
            self.writer_blocked(True)       # the peer may be writing to us: read meanwhile
            try:
                wait.poll(_WAIT_MS)
            finally:
                self.writer_blocked(False)

    # ------------------------------------------------------------------ reading ----
    def _recv_into(self, view: memoryview) -> int:
        """Bytes received into ``view`` (> 0), waiting for them; ConnectionError at the end."""
        while True:
            with self._io:
                if self._dead:
                    raise ConnectionError("link closed")
                try:
                    n, wait = self.sock.recv_into(view), None
                except ssl.SSLWantWriteError:
                    n, wait = None, self._read_writable
                except _NOT_READY:
                    n, wait = None, self._readable
            if n:
                return n
            if n == 0:
                raise ConnectionError(f"party {self.peer} closed the connection")
            stop = self._stop               # a job thread's deadline or abort: pause the frame
            if stop is not None and stop():
                raise Paused
            wait.poll(_WAIT_MS if stop is None else 1e3 * SLICE_S)

    def buffered(self) -> bool:
        """Bytes read (or decrypted by TLS and held by it) that no frame consumed yet: poll
        cannot see them."""
        if self._rbuf or self._head is not None:
            return True
        pending = getattr(self.sock, "pending", None)      # TLS only
        if pending is None:
            return False
        with self._io:
            return not self._dead and pending() > 0

    def _fill(self, need: int) -> None:
        with memoryview(self._chunk) as mv:
            while len(self._rbuf) < need:
                self._rbuf += mv[:self._recv_into(mv)]

    def _take(self, skip: int, end: int) -> bytes:
        """Buffered bytes ``skip:end`` (after ``_fill(end)``); drops the first ``end``."""
        with memoryview(self._rbuf) as mv:
            out = bytes(mv[skip:end])
        del self._rbuf[:end]
        return out

    def _payload(self, size: int) -> bytearray:
        """The next ``size`` bytes, received straight into their own buffer (resumed where
        a paused turn left it)."""
        if self._part is None:
            buf = bytearray(min(size, FIRST_BYTES))
            got = min(size, len(self._rbuf))
            buf[:got] = self._rbuf[:got]
            del self._rbuf[:got]
            self._part = [buf, got]
        buf, got = self._part
        while got < size:
            if got == len(buf):             # past FIRST_BYTES: double as the bytes arrive
                buf.extend(bytes(min(len(buf), size - got)))
            with memoryview(buf) as mv:
                got += self._recv_into(mv[got:])
            self._part[1] = got
        self._part = None
        return buf

    def read_frame(self):
        """The next ``PeerFrame``, or a message as ``(job_id, op, arrays)``; :class:`Paused`
        leaves a partly read frame to the next call (nothing is consumed before its header is
        complete, then the header and the payload received so far are kept)."""
        if self._head is None:
            head = self._read_head()
            if not isinstance(head, tuple):
                return head                 # a PeerFrame: read whole or not at all
            self._head = head
        job_id, op, layout, size, n_arrays = self._head
        data = self._payload(size)
        self._head = None
        return job_id, op, split(data, layout, size) if n_arrays else []

    def _read_head(self):
        """A whole ``PeerFrame``, or a message's parsed header ``(job_id, op, layout, size,
        n_arrays)``."""
        self._fill(1)
        if self._rbuf[0] == 0:
            self._fill(_FRAME.size)
            _, n = _FRAME.unpack_from(self._rbuf)
            if n > MAX_FRAME_BYTES:
                raise ProtocolError(f"party {self.peer} announced a frame of {n} bytes "
                                    f"(limit {MAX_FRAME_BYTES})")
            self._fill(_FRAME.size + n)
            body = self._take(_FRAME.size, _FRAME.size + n)
            try:
                return pb.PeerFrame.FromString(body)
            except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
                raise ProtocolError(f"party {self.peer} sent a malformed frame ({exc})") \
                    from None
        if self._rbuf[0] != 1:
            raise ProtocolError(f"party {self.peer} sent a frame of unknown kind "
                                f"{self._rbuf[0]}")
        self._fill(_MSG.size)
        _, n_id, n_layout, n_arrays, op, size = _MSG.unpack_from(self._rbuf)
        if n_id > MAX_JOB_ID_BYTES or n_layout > MAX_HEADER_BYTES or size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"party {self.peer} sent a message header out of bounds")
        self._fill(_MSG.size + n_id + n_layout)
        head = self._take(_MSG.size, _MSG.size + n_id + n_layout)
        try:
            job_id = head[:n_id].decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"party {self.peer} sent a malformed job id") from None
        layout, expected = parse_layout(head[n_id:], n_arrays) if n_arrays else ((), 0)
        if expected != size or (not n_arrays and n_layout):
            raise ProtocolError(f"party {self.peer} sent a message of {size} bytes whose "
                                f"layout accounts for {expected}")
        return job_id, op, layout, size, n_arrays

    def close(self) -> None:
        """Shut the connection down (both ways); the reader sees its end."""
        self.closed.set()
        self.wake()
        with self._io:
            if not self._dead:
                self._dead = True
                try:                        # the plain socket's shutdown, see the module doc
                    socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    def release(self) -> None:
        """Close the descriptor (after the reader ended); no thread uses it afterwards."""
        self.close()
        with self._io:
            self.sock.close()


def _self_connected(sock: socket.socket) -> bool:
    """A dial to a local port nobody listens on can, rarely, connect to itself (TCP
    simultaneous open, when the kernel picks that very port as the source port)."""
    try:
        return sock.getsockname() == sock.getpeername()
    except OSError:
        return False


class SocketTransport:
    """The dialler and the listener of one party's peer links.

    ``listen``: this party's peer address to bind; ``dial``: party ``rank+1``'s;
    ``contexts``: :func:`tls_contexts` (None = development plaintext).
    """

    def __init__(self, listen: str, dial: str, contexts=None, connect_timeout: float = 10.0,
                 send_timeout: float = 30.0) -> None:
        self.listen, self.dial = listen, dial
        self.contexts = contexts
        self.tls = contexts is not None
        self.connect_timeout = connect_timeout
        self.send_timeout = send_timeout
        host, port = split_address(listen)
        self._ls = socket.create_server((host or "0.0.0.0", port), backlog=16,
                                        family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._ls.getsockname()[1]
        self._pending: dict[str, int] = {}  # source address -> connections in handshake
        self._pending_lock = threading.Lock()
        self._closing = False
        self._refusals, self._refusal_logged = 0, 0.0
        self.router: PeerRouter | None = None
        self._threads: list[threading.Thread] = []

    def start(self, router: PeerRouter) -> None:
        self.router = router
        for target, name in ((self._accept_loop, "accept"), (self._dial_loop, "dial")):
            t = threading.Thread(target=target, daemon=True, name=f"mpc3-p{router.rank}-{name}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._closing = True
        try:
            self._ls.shutdown(socket.SHUT_RDWR)     # wakes the accept (close alone does not)
        except OSError:
            pass
        self._ls.close()
        for t in self._threads:
            t.join(timeout=5)

    # ---------------------------------------------------------------- handshake ----
    def _hello(self, link: SocketLink, dialler: int, listener: int) -> bytes:
        """Exchange hellos (the dialler speaks first); the pairwise seed."""
        r = self.router
        hs = Handshake(security=r.security)
        mine = hs.hello(r.rank)
        if r.rank == dialler:
            link.put(pb.PeerFrame(hello=mine))
        first = link.read_frame()
        if (not isinstance(first, pb.PeerFrame) or not first.HasField("hello")
                or first.hello.rank != link.peer):
            raise ProtocolError(f"party {link.peer} sent no valid hello")
        if r.rank == listener:
            link.put(pb.PeerFrame(hello=mine))
        seed = hs.seed(mine, first.hello, dialler, listener)
        link.security = hs.peer_security
        return seed

    def _open(self, sock: socket.socket, peer: int, dialling: bool) -> SocketLink:
        """TLS handshake, identity check and hello on a fresh connection (each step bounded
        by the connect timeout); then the link, non-blocking."""
        r = self.router
        tune(sock, self.send_timeout)
        sock.settimeout(self.connect_timeout)
        if self.contexts is not None:
            server_ctx, client_ctx = self.contexts
            sock = (client_ctx.wrap_socket(sock, server_hostname=keys.party_target_name(peer))
                    if dialling else server_ctx.wrap_socket(sock, server_side=True))
            ident = identity(sock)
            if ident is None or ident.party_rank != peer:
                sock.close()
                raise PermissionError(f"party {r.rank} accepts links only from party {peer}, "
                                      f"not from {ident.role if ident else 'an anonymous caller'}")
        link = SocketLink(peer, sock, self.send_timeout)
        dialler, listener = (r.rank, peer) if dialling else (peer, r.rank)
        link.seed = self._hello(link, dialler, listener)
        sock.setblocking(False)
        return link

    # -------------------------------------------------------------------- loops ----
    def _run_link(self, sock: socket.socket, peer: int, dialling: bool, opened=None) -> str:
        """Open the link on a fresh connection and read it until it ends; why it ended.
        ``opened()`` is called once the handshake is over, however it went."""
        r = self.router
        try:
            link = self._open(sock, peer, dialling)
        except Exception as exc:  # noqa: BLE001 - any failure refuses this connection
            sock.close()
            return f"handshake failed: {exc}"
        finally:
            if opened is not None:
                opened()
        r.link_up(peer, link)
        reason = "link reader failed"
        try:
            reason = link.serve(r)
        finally:
            r.link_lost(peer, link, reason)
            link.release()
        return reason

    def _dial_loop(self) -> None:
        r, backoff, said = self.router, 0.1, None
        addr = split_address(self.dial)
        while not r.stopping.is_set():
            try:
                sock = socket.create_connection(addr, timeout=self.connect_timeout)
            except OSError as exc:
                reason = f"party {r.next} at {self.dial} unreachable ({exc})"
            else:
                if _self_connected(sock):   # it would hold the port its party must bind
                    sock.close()
                    reason = f"party {r.next} at {self.dial} not listening yet"
                else:
                    try:
                        reason = self._run_link(sock, r.next, dialling=True)
                    except Exception as exc:  # noqa: BLE001 - keep dialling whatever happened
                        reason = f"link failed ({type(exc).__name__}: {exc})"
                    backoff = 0.1 if not reason.startswith("handshake") else backoff
            if not r.stopping.is_set() and reason != said:     # each new reason once
                log.warning("party %d: link to party %d at %s: %s", r.rank, r.next, self.dial,
                            reason)
                said = reason
            r.stopping.wait(backoff)
            backoff = min(2 * backoff, 1.0)

    def _accept_loop(self) -> None:
        r = self.router
        while not (r.stopping.is_set() or self._closing):
            try:
                sock, addr = self._ls.accept()
            except OSError as exc:          # EMFILE, ECONNABORTED...: keep listening
                if not self._closing:
                    self._refused(f"accept failed: {exc}")
                    r.stopping.wait(0.1)
                continue
            host = addr[0]
            why = self._admit(host)
            if why:
                sock.close()
                self._refused(why)
                continue
            try:
                threading.Thread(target=self._accepted, args=(sock, host), daemon=True,
                                 name=f"mpc3-p{r.rank}-in").start()
            except RuntimeError as exc:     # no thread to be had
                self._done(host)
                sock.close()
                self._refused(str(exc))

    def _admit(self, host: str) -> str | None:
        """Count a connection from ``host`` into its handshake; why not, if it may not."""
        with self._pending_lock:
            if sum(self._pending.values()) >= MAX_HANDSHAKES:
                return f"more than {MAX_HANDSHAKES} connections in their handshake"
            if self._pending.get(host, 0) >= MAX_HANDSHAKES_PER_HOST:
                return f"more than {MAX_HANDSHAKES_PER_HOST} connections from {host} in " \
                       "their handshake"
            self._pending[host] = self._pending.get(host, 0) + 1
        return None

    def _done(self, host: str) -> None:
        with self._pending_lock:
            self._pending[host] -= 1
            if not self._pending[host]:
                del self._pending[host]

    def _accepted(self, sock: socket.socket, host: str) -> None:
        reason = self._run_link(sock, self.router.prev, dialling=False,
                                opened=lambda: self._done(host))
        if reason.startswith("handshake"):
            self._refused(reason)

    def _refused(self, reason: str) -> None:
        """Log a refused connection, at most every 10 s (with how many since)."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusal_logged >= 10.0:
            log.warning("party %d: refused %d peer connection(s); latest: %s",
                        self.router.rank, self._refusals, reason)
            self._refusals, self._refusal_logged = 0, now
