"""A party's log as JSON lines (``mpc3 party --log-json`` or ``log_format = "json"`` in its
``[[party]]`` table): one object per line with ``time`` (UTC, ISO 8601), ``level``,
``party``, ``event``, ``job``, ``user``, ``kind`` and ``message``, for a log shipper.

``event`` is the short name a log call gives in ``extra`` (``job_started``, ``job_done``,
``job_failed``, ...), else the logger's name; ``job``, ``user`` (the client's certificate
CN) and ``kind`` come from ``extra`` too, null when the line concerns no job. The message
is the same text as the plain log's: a party never logs inputs, outputs, shares or model
contents (:mod:`net.party.service`), and an exception adds only its type and first line, never
a traceback with local values.
"""
from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    def __init__(self, party: int) -> None:
        super().__init__()
        self.party = party

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", t) +
                f".{int(record.msecs):03d}Z",
                "level": record.levelname, "party": self.party,
                "event": getattr(record, "event", None) or record.name,
                "job": getattr(record, "job", None), "user": getattr(record, "user", None),
                "kind": getattr(record, "kind", None), "message": record.getMessage()}
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            first = (str(exc).strip().splitlines() or [""])[0]
            line["error"] = f"{type(exc).__name__}: {first}"
        return json.dumps(line, ensure_ascii=False)


def configure(party: int, level: str = "INFO", fmt: str = "text", stream=None) -> None:
    """The party process's root logger: plain text lines (default) or JSON lines."""
    if fmt not in FORMATS:
        raise ValueError(f"log_format {fmt!r}: choose {' or '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(party) if fmt == "json" else
                         logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
