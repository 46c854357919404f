"""What every peer link has (:mod:`net.peer.streams`' gRPC streams, :mod:`net.peer.tlslink`'s
sockets) and a job's mailbox of messages from its two peers."""
from __future__ import annotations

import collections
import queue
import threading
import time

from mpc3.comm import Aborted, Payload
from net.proto import mpc3_pb2 as pb

from .frames import Partial, frames_of


# ----------------------------------------------------------------------- mailboxes ----
class Mailbox:
    """Messages of one job from both peers, in arrival order."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.msgs: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.partial: dict[int, Partial | None] = {}
        self.aborted: str | None = None
        self.opened = False
        self.held = 0                       # bytes buffered before this party opened the job
        self.created = time.monotonic()

    def abort(self, reason: str) -> None:
        with self.cond:
            if self.aborted is None:        # the first reason stays
                self.aborted = reason
                self.cond.notify_all()


class Link:
    """One live stream to a peer: an outgoing frame queue and its pairwise seed."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.seed: bytes | None = None
        self.security = ""              # the peer's [cluster] security, from its hello
        self.outq: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = threading.Event()

    def put(self, frame: pb.PeerFrame) -> None:
        if self.closed.is_set():
            raise Aborted(f"link to party {self.peer} is down")
        self.outq.put(frame)

    def send_message(self, job_id: str, op: int, arrays: Payload) -> None:
        """One communicator message (the socket links override this with a raw form)."""
        for frame in frames_of(job_id, op, arrays):
            self.put(frame)

    def close(self) -> None:
        self.closed.set()
        self.outq.put(None)

    def await_message(self, router, box: Mailbox, done, deadline: float) -> None:
        """Wait until ``done()`` while the stream's reader delivers (socket links read for
        themselves: :mod:`net.peer.readturn`)."""
        with box.cond:
            if not done():
                box.cond.wait(max(0.0, deadline - time.monotonic()))

    def wake(self, ended: bool = False) -> None:
        """A job ended: nothing to do, a stream's reader never stands aside."""

    def frames(self, active=lambda: True):
        while True:
            try:
                f = self.outq.get(timeout=0.5)
            except queue.Empty:
                if self.closed.is_set() or not active():
                    return
                continue
            if f is None:
                return
            yield f


DOWN = Link(-1)      # a lost link: wait for the abort its loss brings
