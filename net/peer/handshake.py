"""Pairwise PRG seeds, agreed when a peer link comes up: inside the mutually authenticated TLS
channel both ends send a Hello with an ephemeral X25519 public key and a 32-byte nonce; the
seed is HKDF-SHA256 of the shared secret, salted with both nonces and bound to the direction
and both public keys. Seeds live only in memory and are fresh for every connection."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mpc3.comm import ProtocolError
from net.proto import mpc3_pb2 as pb


@dataclass
class Handshake:
    private: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    nonce: bytes = field(default_factory=lambda: os.urandom(32))

    def hello(self, rank: int) -> pb.Hello:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
        pub = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return pb.Hello(rank=rank, x25519_public=pub, nonce=self.nonce)

    def seed(self, mine: pb.Hello, theirs: pb.Hello, dialer: int, listener: int) -> bytes:
        if len(theirs.x25519_public) != 32 or len(theirs.nonce) != 32:
            raise ProtocolError("malformed peer hello")
        shared = self.private.exchange(X25519PublicKey.from_public_bytes(theirs.x25519_public))
        d, l_ = (mine, theirs) if mine.rank == dialer else (theirs, mine)
        info = (b"mpc3-pair-seed-v1/%d->%d/" % (dialer, listener) + d.x25519_public
                + l_.x25519_public)
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=d.nonce + l_.nonce,
                    info=info).derive(shared)
