"""Who reads a socket link (:mod:`net.peer.tlslink`): the job thread that waits for a message
reads it itself; the link's reader thread reads only what no job thread is there to read.

Why. With one reader thread per link, every message crossed two threads: the reader woke from
``poll``, took the GIL, parsed the frame, notified the job's mailbox, and the job thread woke
and took the GIL again - about 25 futex calls and 0.14 ms of the reader threads' CPU per party
and round on top of the job's 0.25 ms (``benchmarks/thread_cpu.py mult --n 1``; on a host
that runs all three parties, that CPU is the round's time).

How (leader/follower). A link has one *turn* to read (a lock): its holder reads whole frames
and hands each to the router (in stream order: frames are dispatched under the turn).

* A job thread waiting for a message on the link (:meth:`ReadTurns.await_message`) takes the
  turn if it is free and reads until its message is in its mailbox (re-checking its mailbox,
  aborts and its deadline every :data:`SLICE_S`); frames of other jobs it passes on as the
  reader would. If another thread has the turn, it waits as a *follower* on its mailbox,
  woken by a delivery or when the turn is released.
* The reader thread (:meth:`ReadTurns.serve`) stands aside while job threads read: for
  :data:`GRACE_S` after a job thread last read, it sleeps instead of polling (so a frame wakes
  one thread, not two). Otherwise - no job thread waiting, control frames, aborts, the first
  message of a job that has not asked yet, a link that fails while idle - it reads as before.
* A writer whose peer does not take its bytes may be waiting, through a cycle of parties, for
  a peer that writes to this party on another link (in a round every party sends to both
  neighbours first, then reads): while any writer of the process is blocked, every reader
  thread reads regardless of the grace, so the cycle's writes complete.

A read that fails in a job thread ends the link as the reader's would: the link closes, the
reader thread reports that first failure, the router aborts the link's jobs.
"""
from __future__ import annotations

import select
import threading
import time
import weakref

GRACE_S = 0.1           # the reader thread stands aside this long after a job thread read
SLICE_S = 0.05          # a job thread reading for itself re-checks its mailbox this often


class Paused(Exception):
    """The turn's holder stops mid-frame (its deadline, or its job's abort); the link keeps
    the partly read frame for the next holder."""


class _Writers:
    """The process's writers blocked on a peer, and the links whose readers they call in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocked = 0
        self.links: weakref.WeakSet = weakref.WeakSet()

    def change(self, delta: int) -> None:
        with self.lock:
            self.blocked += delta
            links = list(self.links) if delta > 0 else []
        for link in links:
            link._kick.set()


_WRITERS = _Writers()


def poller(sock, events: int):
    p = select.poll()
    p.register(sock, events | select.POLLERR | select.POLLHUP)
    return p


class ReadTurns:
    """The turn to read a link (mixed into :class:`net.peer.tlslink.SocketLink`, which provides
    ``read_frame()`` - raising :class:`Paused` when ``_stop()`` says so while it waits for
    bytes -, ``buffered()`` - bytes poll cannot see -, ``closed`` and ``_readable``, the
    poll object of the turn's holder)."""

    def _init_turns(self, sock) -> None:
        self._turn = threading.Lock()
        self._direct_at = float("-inf")     # when a job thread last read for itself
        self._kick = threading.Event()      # a writer blocked or the link closed
        with _WRITERS.lock:
            _WRITERS.links.add(self)
        self._idle = poller(sock, select.POLLIN)   # a poll object serves one thread at a time
        self._followers: set = set()        # mailboxes waiting while another thread reads
        self._flock = threading.Lock()
        self._failure: str | None = None    # why a job thread's read ended the link

    # ------------------------------------------------------------------ the turn ----
    def _release(self) -> None:
        """Give the turn back and wake the followers (one of them takes it)."""
        self._turn.release()
        with self._flock:
            waiting = list(self._followers)
        for box in waiting:
            with box.cond:
                box.cond.notify_all()

    def _dispatch(self, router, item) -> None:
        if isinstance(item, tuple):
            router.on_message(self.peer, *item)
        else:
            router.on_frame(self.peer, item)

    @staticmethod
    def writer_blocked(blocked: bool) -> None:
        """A writer starts (True) or stops (False) waiting for its peer to take bytes."""
        _WRITERS.change(1 if blocked else -1)

    def wake(self, ended: bool = False) -> None:
        """The link closed, or (``ended``) a job ended: the reader thread stops waiting - no
        job thread may be about to read, and the next job's first frames (the leader's
        "start", net.party.runner) must not wait out the grace."""
        if ended:
            self._direct_at = float("-inf")
        self._kick.set()

    # ---------------------------------------------------------------- job threads ----
    def await_message(self, router, box, done, deadline: float) -> None:
        """For at most :data:`SLICE_S` (and not past ``deadline``): read the link until
        ``done()`` (a message in ``box`` or its abort) if the turn is free, else wait on
        ``box`` as a follower."""
        until = min(deadline, time.monotonic() + SLICE_S)
        if self.closed.is_set():            # the reader is about to abort the jobs: wait for it
            return super().await_message(router, box, done, until)
        if self._turn.acquire(blocking=False):
            try:
                self._read_until(router, done, until)
            finally:
                self._direct_at = time.monotonic()
                self._release()
            return
        with box.cond:
            with self._flock:
                self._followers.add(box)
            try:
                if not done() and self._turn.locked():
                    box.cond.wait(max(0.0, until - time.monotonic()))
            finally:
                with self._flock:
                    self._followers.discard(box)

    def _read_until(self, router, done, until: float) -> None:
        self._stop = lambda: done() or time.monotonic() >= until
        try:
            while not done() and not self.closed.is_set():
                self._direct_at = now = time.monotonic()
                if now >= until:
                    return
                if self.buffered() or self._readable.poll(1e3 * (until - now)):
                    self._dispatch(router, self.read_frame())
        except Paused:                      # the frame goes on in the next turn
            pass
        except Exception as exc:  # noqa: BLE001 - ends the link; the reader thread reports it
            self._failure = self._failure or str(exc) or type(exc).__name__
            self.close()
        finally:
            self._stop = None

    # -------------------------------------------------------------- reader thread ----
    def _await_turn(self) -> None:
        """Until the link has bytes that no job thread is there to read, or a blocked
        writer needs them read."""
        while True:
            if self.closed.is_set():
                raise ConnectionError("link closed")
            self._kick.clear()
            quiet = time.monotonic() - self._direct_at
            if not _WRITERS.blocked and quiet < GRACE_S:
                self._kick.wait(GRACE_S - quiet)
                continue
            if self.buffered() or self._idle.poll(1e3 * SLICE_S):
                return

    def serve(self, router) -> str:
        """Hand the frames no job thread reads to the router until the link fails; the
        reason it ended (a job thread's failed read, if that came first)."""
        try:
            while True:
                self._await_turn()
                self._turn.acquire()
                try:
                    if self.buffered() or self._readable.poll(0):   # else a job took them
                        self._dispatch(router, self.read_frame())
                finally:
                    self._release()
        except Exception as exc:  # noqa: BLE001 - whatever ends the reader ends the link
            return self._failure or str(exc) or type(exc).__name__
