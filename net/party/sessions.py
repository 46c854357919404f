"""Decode sessions: state a party keeps between the jobs of one user's session.

A session is named by the client (``params["session"]``), owned by the query user who opened
it and bound to one upload of one model. Every job of a session - each decoding step - is its
own job with its own job id, so PRG keys are never reused. One job of a session runs (or
waits in the queue) at a time; a failed or cancelled job that had started drops the session
(its state may be half updated); a session idle for ``session_idle_s`` is dropped; ``close``
drops it at once. Each user holds at most ``user_sessions`` sessions, each organisation (the
O of its users' certificates) ``org_sessions``, the party ``sessions``.

Session ids are each user's own: one user's ids and another's never meet, so a user cannot
tell whether an id is in use by someone else (every foreign id is unknown). An opening job
that never completed - refused by a limit, cancelled because another party refused it,
expired in the queue, or failed - leaves nothing behind: its id may be opened again, so a
client's retry of a refused open succeeds. Ids of sessions that did open are never reused.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from net.errors import BadRequest, Code
from net.limits import Limits
from protocols.jobs import SessionSlot


@dataclass
class Session(SessionSlot):
    session_id: str = ""
    owner: str = ""
    org: str = ""                 # the owner's organisation ("" if none: counted as its own)
    model_id: str = ""
    upload_id: str = ""
    state: object = None          # owned by the job kinds (e.g. protocols.jobs DecodeSession)
    busy: bool = True             # a job of the session is queued or running (true while opening)
    last_used: float = field(default_factory=time.monotonic)
    jobs: int = 0


class SessionStore:
    def __init__(self, rank: int, limits: Limits) -> None:
        self.rank = rank
        self.limits = limits
        self._lock = threading.Lock()
        # keyed by (owner, session id): one user's ids never meet another's
        self._live: dict[tuple[str, str], Session] = {}
        self._gone: dict[tuple[str, str], str] = {}   # recently ended -> why (clear errors)
        self._used: set[tuple[str, str]] = set()

    @property
    def idle_s(self) -> float:
        return self.limits.session_idle_s

    def _bury_locked(self, key: tuple[str, str], why: str) -> None:
        self._live.pop(key, None)
        self._gone[key] = why
        while len(self._gone) > 4 * self.limits.sessions:
            self._gone.pop(next(iter(self._gone)))

    def count(self, owner: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self._live.values() if owner is None or s.owner == owner)

    def open(self, sid: str, owner: str, model_id: str, upload_id: str,
             org: str = "") -> Session:
        key = (owner, sid)
        with self._lock:
            if key in self._used:
                raise BadRequest(Code.ALREADY_EXISTS, f"session id {sid!r} already used")
            mine = sum(1 for s in self._live.values() if s.owner == owner)
            if mine >= self.limits.user_sessions:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: user {owner!r} "
                                 f"already keeps {mine} sessions (limit user_sessions = "
                                 f"{self.limits.user_sessions} in [limits]); close some")
            ours = sum(1 for s in self._live.values() if org and s.org == org)
            if ours >= self.limits.org_sessions:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: organisation "
                                 f"{org!r} already keeps {ours} sessions (limit org_sessions "
                                 f"= {self.limits.org_sessions} in [limits]); close some")
            if len(self._live) >= self.limits.sessions:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank} already keeps "
                                 f"{len(self._live)} sessions (limit sessions = "
                                 f"{self.limits.sessions} in [limits]); retry later")
            self._used.add(key)
            sess = Session(session_id=sid, owner=owner, org=org, model_id=model_id,
                           upload_id=upload_id)
            self._live[key] = sess
            return sess

    def acquire(self, sid: str, owner: str, model_id: str, upload_id: str,
                closing: bool = False) -> Session:
        """The caller's idle session, marked busy (or removed, when ``closing``)."""
        key = (owner, sid)
        with self._lock:
            sess = self._live.get(key)
            if sess is None:
                why = self._gone.get(key)
                raise BadRequest(Code.NOT_FOUND, f"session {sid!r} " + (
                    f"has ended on party {self.rank}: {why}" if why else
                    f"is unknown on party {self.rank}"))
            if (sess.model_id, sess.upload_id) != (model_id, upload_id):
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} runs on model "
                                 f"{sess.model_id!r}, not {model_id!r}")
            if sess.busy and not closing:
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} still runs a "
                                 "job; wait for it before the next step")
            if closing:
                sess.state = None
                self._bury_locked(key, "closed by its owner")
            else:
                sess.busy = True
                sess.jobs += 1
            return sess

    def release(self, sess: Session, ok: bool, why: str = "") -> None:
        """End of a job of the session: ``ok`` keeps it (a job that never started is ok)."""
        key = (sess.owner, sess.session_id)
        with self._lock:
            if self._live.get(key) is not sess:
                return
            if ok:
                sess.busy = False
                sess.last_used = time.monotonic()
            else:
                sess.state = None
                self._bury_locked(key, f"dropped after a failed job ({why})")

    def forget(self, sess: Session) -> None:
        """An opening job that did not complete: the session and its id leave no trace (the
        id may be opened again)."""
        key = (sess.owner, sess.session_id)
        with self._lock:
            if self._live.get(key) is sess:
                sess.state = None
                del self._live[key]
                self._used.discard(key)

    def expire(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            old = [key for key, s in self._live.items()
                   if not s.busy and now - s.last_used > self.idle_s]
            for key in old:
                self._live[key].state = None
                self._bury_locked(key, f"idle for more than {self.idle_s:g} s")
        return [sid for _, sid in old]
