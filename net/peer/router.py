"""The peer router: mpc3's :class:`~mpc3.comm.Communicator` over a party's links to its two
peers - per-job mailboxes, ops, aborts. A transport carries the links and calls the router's
sink methods: TLS sockets (:mod:`net.peer.tlslink`, the default) or gRPC streams
(:mod:`net.peer.streams`, ``peer_transport = "grpc"``).

Topology. Each pair of parties shares one bidirectional link; party ``i`` dials party ``i+1``
(mod 3) and accepts the link of party ``i-1``, so every party has one outgoing and one
incoming link, both carrying traffic in both directions.

Link set-up. Inside the (mutually authenticated) TLS channel both ends send a ``Hello`` with
an ephemeral X25519 public key and a nonce; the pairwise PRG seed is HKDF-SHA256 of the shared
secret, salted with both nonces. Seeds live only in memory, are never logged, and are fresh
for every connection; each party also draws a private seed from ``os.urandom`` at start. A job
gets its keys from :meth:`mpc3.prg.PRG.for_job` (seed_prev, seed_next, private, job id).
The dialled TLS name is ``party-N`` and the listener checks the caller's certificate OU, so
each end knows which party it talks to.

Messages. A communicator message (the list of arrays one round sends to one peer) is sent as
ONE frame tagged ``(job_id, op)`` - its layout in a compact header, its arrays' bytes back to
back - when it fits in :data:`~net.grpcopts.CHUNK_BYTES`, else as consecutive chunks
(:mod:`net.peer.frames`). Frames of one job arrive in order on a link, so the receiver puts them per
(job, peer) into a FIFO mailbox (on socket links the waiting job thread reads them itself,
:mod:`net.peer.readturn`); jobs never see each other's messages, and a message carrying another op
counter than the one expected raises :class:`~mpc3.comm.ProtocolError`.

Failures. A missing message raises :class:`~mpc3.comm.PeerTimeout` after the communicator's
timeout. A broken link (peer gone, network error) aborts every job open or buffered on this
party at once (:class:`~mpc3.comm.Aborted` naming the peer); a job that fails locally sends an
``abort`` frame to both peers. The dialler reconnects in the background: the process keeps
serving.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass

from mpc3.comm import Aborted, Communicator, Payload, PeerTimeout, ProtocolError
from mpc3.party import Party, RingConfig
from mpc3.prg import PRG
from net.proto import mpc3_pb2 as pb

from .frames import Partial, parse_layout, split
from .linkbase import DOWN, Link, Mailbox

log = logging.getLogger("mpc3.link")

_CLOSED_MEMORY = 4096          # ids of finished jobs remembered to drop their late frames
MAX_UNOPENED_BYTES = 256 << 20  # all messages held for jobs peers started, this party not yet


class PeerUnavailable(ProtocolError):
    """A link needed by a job is not up."""


class PeerRouter:
    """Links of one party to its two peers, and per-job mailboxes over them.

    The transport brings links up and reads them; it tells the router through the **sink**
    methods - :meth:`link_up`, :meth:`link_lost`, :meth:`on_frame`, :meth:`on_message` -
    and the router sends through :class:`~net.peer.linkbase.Link`. Nothing else crosses.
    """

    def __init__(self, rank: int, transport, security: str = "semi-honest") -> None:
        self.rank = rank
        #: this party's [cluster] security, sent in its hellos (net.peer.handshake)
        self.security = security
        self.next = (rank + 1) % 3
        self.prev = (rank - 1) % 3
        self._private_seed = os.urandom(32)
        self._lock = threading.Lock()
        self._links: dict[int, Link] = {}
        self._link_change = threading.Condition(self._lock)
        self._boxes: dict[str, Mailbox] = {}
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._used: set[str] = set()      # every job id ever opened: keys are never reused
        self._held = 0                    # sum of the boxes' held bytes
        #: set when the router stops: the transports' loops end, lost links are not logged
        self.stopping = threading.Event()
        #: what carries the links: :class:`net.peer.tlslink.SocketTransport` (default) or
        #: :class:`net.peer.streams.StreamTransport`; it calls the sink methods below
        self.transport = transport
        #: ``on_control(peer, job_id, control)``: control frames (job admission, net.party.runner)
        self.on_control = None

    # ---------------------------------------------------------------- lifecycle ----
    def start(self) -> None:
        self.transport.start(self)

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.close()
        self.transport.stop()

    def links_up(self) -> list[int]:
        with self._lock:
            return sorted(self._links)

    def security_problem(self) -> str:
        """Why this party must refuse jobs: a live link's hello named another [cluster]
        security mode than this party's ('' if no peer linked so far disagrees)."""
        with self._lock:
            other = {p: link.security for p, link in sorted(self._links.items())
                     if link.security and link.security != self.security}
        if not other:
            return ""
        return (f"party {self.rank} runs security = \"{self.security}\" but " +
                " and ".join(f"party {p} runs \"{m}\"" for p, m in other.items()) +
                " ([cluster] security in cluster.toml); every job is refused until all "
                "three parties use the same mode and are restarted")

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._links) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._link_change.wait(left)
            return True

    # -------------------------------------------------------------------- sink ----
    def link_up(self, peer: int, link: Link) -> None:
        """``link`` to ``peer`` finished its handshake (its ``seed`` is set); a link it
        replaces is lost."""
        with self._lock:
            old = self._links.get(peer)
            self._links[peer] = link
            self._link_change.notify_all()
        if old is not None:
            self.link_lost(peer, old, "replaced by a new connection", current=True)
        log.info("party %d: link to party %d up", self.rank, peer)

    def link_lost(self, peer: int, link: Link, reason: str, current: bool = False) -> None:
        """``link`` ended; if it was the live link to ``peer`` (``current``: it was until a
        new connection replaced it), every job on this party is aborted."""
        link.close()
        with self._lock:
            if self._links.get(peer) is link:
                del self._links[peer]
                self._link_change.notify_all()
                current = True
            boxes = list(self._boxes.values()) if current else []
        for box in boxes:
            box.abort(f"lost link to party {peer}: {reason}")
        if not self.stopping.is_set():
            log.warning("party %d: link to party %d down (%s)", self.rank, peer, reason)

    # -------------------------------------------------------------------- frames ----
    def _box(self, job_id: str, create: bool) -> Mailbox | None:
        with self._lock:
            box = self._boxes.get(job_id)
            if box is None and create and job_id not in self._closed:
                box = self._boxes[job_id] = Mailbox()
            return box

    def on_frame(self, peer: int, f: pb.PeerFrame) -> None:
        """A frame read from ``peer``'s link: a control, an abort or a (chunk of a) message."""
        if f.control:
            if self.on_control is not None:
                self.on_control(peer, f.job_id, f.control)
            return
        box = self._box(f.job_id, create=True)
        if box is None:
            return
        if f.abort:
            box.abort(f"party {peer} aborted the job: {f.abort}")
            return
        try:
            if self._hold(box, peer, len(f.data)):
                self._assemble(box, peer, f)
        except (ValueError, TypeError, ProtocolError) as exc:
            box.abort(f"bad frame from party {peer}: {exc}")

    def on_message(self, peer: int, job_id: str, op: int, arrays: list) -> None:
        """A whole message of a job (the socket links' raw form)."""
        box = self._box(job_id, create=True)
        if box is None or not self._hold(box, peer, sum(a.nbytes for a in arrays)):
            return
        with box.cond:
            if box.partial.get(peer) is not None:
                box.abort(f"bad frame from party {peer}: message {op} interleaved with "
                          f"message {box.partial[peer].op}")
                return
            box.msgs[peer].append((op, arrays))
            box.cond.notify_all()

    def _hold(self, box: Mailbox, peer: int, n: int) -> bool:
        """Count ``n`` bytes for ``box``; past MAX_UNOPENED_BYTES for unopened jobs, abort it."""
        if box.opened:                      # the per-round case: no lock (opened stays True)
            return not box.aborted
        with self._lock:
            if box.opened or box.aborted:
                return not box.aborted
            if self._held + n <= MAX_UNOPENED_BYTES:
                box.held += n
                self._held += n
                return True
            self._held, box.held = self._held - box.held, 0
        with box.cond:
            box.msgs.clear()
        box.abort(f"party {peer} sent more than {MAX_UNOPENED_BYTES} bytes for jobs that "
                  f"party {self.rank} has not opened")
        return False

    @staticmethod
    def _assemble(box: Mailbox, peer: int, f: pb.PeerFrame) -> None:
        with box.cond:
            part = box.partial.get(peer)
            if part is None:
                if f.n_arrays == 0:
                    box.msgs[peer].append((f.op, []))
                    box.cond.notify_all()
                    return
                layout, size = parse_layout(f.layout, f.n_arrays)
                part = Partial(f.op, layout, size, bytearray(f.data))
                if f.more:
                    box.partial[peer] = part
            elif f.op != part.op or f.n_arrays:
                raise ProtocolError(f"message {f.op} interleaved with message {part.op}")
            else:
                part.buf += f.data
            if len(part.buf) > part.size:
                raise ProtocolError(f"message longer than the {part.size} bytes announced")
            if f.more:
                return
            box.msgs[peer].append((part.op, split(part.buf, part.layout, part.size)))
            box.partial[peer] = None
            box.cond.notify_all()

    # ---------------------------------------------------------------------- jobs ----
    def open_job(self, job_id: str, cfg: RingConfig | None = None,
                 timeout: float = 30.0) -> Party:
        """A :class:`Party` for ``job_id`` on the current links (both must be up)."""
        with self._lock:
            if job_id in self._used:
                raise ValueError(f"job id {job_id!r} was already used")
            missing = [p for p in (self.prev, self.next) if p not in self._links]
            if missing:
                raise PeerUnavailable(f"party {self.rank}: no link to party "
                                      f"{' and '.join(map(str, missing))}")
            seed_prev = self._links[self.prev].seed
            seed_next = self._links[self.next].seed
            box = self._boxes.setdefault(job_id, Mailbox())
            box.opened, self._held, box.held = True, self._held - box.held, 0
            self._used.add(job_id)
            self._sweep_locked(timeout)
        prg = PRG.for_job(seed_prev, seed_next, self._private_seed, job_id)
        comm = PeerComm(rank=self.rank, timeout=timeout, router=self, job_id=job_id)
        return Party(rank=self.rank, comm=comm, prg=prg, cfg=cfg or RingConfig())

    def close_job(self, job_id: str) -> None:
        with self._lock:
            self._held -= getattr(self._boxes.pop(job_id, None), "held", 0)
            self._closed[job_id] = None
            while len(self._closed) > _CLOSED_MEMORY:
                self._closed.popitem(last=False)
            links = list(self._links.values())
        for link in links:
            link.wake(ended=True)

    def _sweep_locked(self, age: float) -> None:
        """Forget buffers of jobs that peers started but this party never opened."""
        now = time.monotonic()
        for jid in [j for j, b in self._boxes.items()
                    if not b.opened and now - b.created > max(age, 60.0)]:
            self._held -= self._boxes.pop(jid).held

    def send(self, job_id: str, peer: int, op: int, arrays: Payload) -> None:
        box = self._box(job_id, create=False)
        if box is not None and box.aborted:
            raise Aborted(f"party {self.rank}: job aborted ({box.aborted})")
        link = self._links.get(peer)        # one dict read (the GIL): no lock
        if link is None:
            raise Aborted(f"party {self.rank}: link to party {peer} is down")
        link.send_message(job_id, op, arrays)

    def take(self, job_id: str, peer: int, op: int, timeout: float) -> Payload:
        box = self._box(job_id, create=False)
        if box is None:
            raise ProtocolError(f"party {self.rank}: job {job_id!r} is not open")
        deadline, q = time.monotonic() + timeout, box.msgs[peer]
        done = lambda: bool(q) or box.aborted is not None  # noqa: E731
        while True:
            with box.cond:
                if box.aborted:
                    raise Aborted(f"party {self.rank}: job aborted ({box.aborted})")
                if q:
                    got_op, arrays = q.popleft()
                    if got_op != op:
                        raise ProtocolError(f"party {self.rank}: expected message {op} from "
                                            f"party {peer}, got {got_op}")
                    return arrays
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerTimeout(f"party {self.rank}: no message {op} from party {peer} "
                                      f"within {timeout:g} s")
            self._links.get(peer, DOWN).await_message(self, box, done, deadline)

    def send_control(self, peer: int, job_id: str, control: str) -> None:
        """A control frame for ``job_id`` to ``peer`` (PeerUnavailable if its link is down)."""
        with self._lock:
            link = self._links.get(peer)
        if link is None:
            raise PeerUnavailable(f"party {self.rank}: no link to party {peer}")
        link.put(pb.PeerFrame(job_id=job_id, control=control))

    def abort_job(self, job_id: str, reason: str) -> None:
        """Fail the job here and tell both peers (best effort, also when the job was
        already aborted here, e.g. by the loss of one link: the third party still waits)."""
        box = self._box(job_id, create=True)
        if box is not None:
            box.abort(reason)
        with self._lock:
            links = list(self._links.values())
        for link in links:
            try:
                link.put(pb.PeerFrame(job_id=job_id, abort=reason[:500]))
            except Aborted:
                pass


@dataclass
class PeerComm(Communicator):
    """Communicator of one job over the router's links."""

    router: PeerRouter | None = None
    job_id: str = ""

    def _post(self, direction: int, op: int, arrays: Payload) -> None:
        self.router.send(self.job_id, self.peer(direction), op, arrays)

    def _take(self, direction: int, op: int) -> Payload:
        return self.router.take(self.job_id, self.peer(direction), op, self.timeout)

    def abort(self, reason: str) -> None:
        self.router.abort_job(self.job_id, reason)
