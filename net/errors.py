"""The one error type a party returns to clients: a gRPC status code and a message that
names the party, the limit or the object concerned and the next step (never a server path,
never a secret)."""
from __future__ import annotations

import re

import grpc

Code = grpc.StatusCode


class BadRequest(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_id(value, what: str) -> str:
    """A model, upload, job, session or verification id: 1-64 safe characters."""
    if not isinstance(value, str) or not ID_RE.match(value):
        raise BadRequest(Code.INVALID_ARGUMENT,
                         f"{what} {value!r} is invalid (1-64 of A-Z a-z 0-9 _ . -)")
    return value
