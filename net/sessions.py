"""Decode sessions: state a party keeps between the jobs of one user's session.

A session is named by the client (``params["session"]``), owned by the query user who opened
it and bound to one upload of one model. Every job of a session - each decoding step - is its
own job with its own job id, so PRG keys are never reused. One job of a session runs (or
waits in the queue) at a time; a failed or cancelled job that had started drops the session
(its state may be half updated); a session idle for ``session_idle_s`` is dropped; ``close``
drops it at once. Each user holds at most ``user_sessions`` sessions, the party ``sessions``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from protocols.jobs import SessionSlot

from .errors import BadRequest, Code
from .limits import Limits


@dataclass
class Session(SessionSlot):
    session_id: str = ""
    owner: str = ""
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
        self._live: dict[str, Session] = {}
        self._gone: dict[str, str] = {}       # recently ended session -> why (clear errors)
        self._used: set[str] = set()

    @property
    def idle_s(self) -> float:
        return self.limits.session_idle_s

    def _bury_locked(self, sid: str, why: str) -> None:
        self._live.pop(sid, None)
        self._gone[sid] = why
        while len(self._gone) > 4 * self.limits.sessions:
            self._gone.pop(next(iter(self._gone)))

    def count(self, owner: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self._live.values() if owner is None or s.owner == owner)

    def open(self, sid: str, owner: str, model_id: str, upload_id: str) -> Session:
        with self._lock:
            if sid in self._used:
                raise BadRequest(Code.ALREADY_EXISTS, f"session id {sid!r} already used")
            mine = sum(1 for s in self._live.values() if s.owner == owner)
            if mine >= self.limits.user_sessions:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank}: user {owner!r} "
                                 f"already keeps {mine} sessions (limit user_sessions = "
                                 f"{self.limits.user_sessions} in [limits]); close some")
            if len(self._live) >= self.limits.sessions:
                raise BadRequest(Code.RESOURCE_EXHAUSTED, f"party {self.rank} already keeps "
                                 f"{len(self._live)} sessions (limit sessions = "
                                 f"{self.limits.sessions} in [limits]); retry later")
            self._used.add(sid)
            sess = Session(session_id=sid, owner=owner, model_id=model_id, upload_id=upload_id)
            self._live[sid] = sess
            return sess

    def acquire(self, sid: str, owner: str, model_id: str, upload_id: str,
                closing: bool = False) -> Session:
        """The caller's idle session, marked busy (or removed, when ``closing``)."""
        with self._lock:
            sess = self._live.get(sid)
            if sess is None:
                why = self._gone.get(sid)
                raise BadRequest(Code.NOT_FOUND, f"session {sid!r} " + (
                    f"has ended on party {self.rank}: {why}" if why else
                    f"is unknown on party {self.rank}"))
            if sess.owner != owner:
                raise BadRequest(Code.PERMISSION_DENIED, f"session {sid!r} belongs to "
                                 "another user")
            if (sess.model_id, sess.upload_id) != (model_id, upload_id):
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} runs on model "
                                 f"{sess.model_id!r}, not {model_id!r}")
            if sess.busy and not closing:
                raise BadRequest(Code.FAILED_PRECONDITION, f"session {sid!r} still runs a "
                                 "job; wait for it before the next step")
            if closing:
                sess.state = None
                self._bury_locked(sid, "closed by its owner")
            else:
                sess.busy = True
                sess.jobs += 1
            return sess

    def release(self, sess: Session, ok: bool, why: str = "") -> None:
        """End of a job of the session: ``ok`` keeps it (a job that never started is ok)."""
        with self._lock:
            if self._live.get(sess.session_id) is not sess:
                return
            if ok:
                sess.busy = False
                sess.last_used = time.monotonic()
            else:
                sess.state = None
                self._bury_locked(sess.session_id, f"dropped after a failed job ({why})")

    def expire(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            old = [sid for sid, s in self._live.items()
                   if not s.busy and now - s.last_used > self.idle_s]
            for sid in old:
                self._live[sid].state = None
                self._bury_locked(sid, f"idle for more than {self.idle_s:g} s")
        return old
