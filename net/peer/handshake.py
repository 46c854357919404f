"""Pairwise PRG seeds, agreed when a peer link comes up: inside the mutually authenticated TLS
channel both ends send a Hello with an ephemeral X25519 public key and a 32-byte nonce; the
seed is HKDF-SHA256 of the shared secret, salted with both nonces and bound to the direction
and both public keys. Seeds live only in memory and are fresh for every connection.

The Hello also carries the party's ``[cluster] security`` mode; :meth:`Handshake.seed` keeps
the peer's (``peer_security``), the link carries it (``Link.security``) and the router
reports a disagreement (:meth:`net.peer.router.PeerRouter.security_problem`), for which the
parties refuse every job instead of running one half verified."""
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
    security: str = "semi-honest"       # this party's mode, sent in its hello
    peer_security: str = ""             # the peer's, once :meth:`seed` read its hello

    def hello(self, rank: int) -> pb.Hello:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
        pub = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return pb.Hello(rank=rank, x25519_public=pub, nonce=self.nonce,
                        security=self.security)

    def seed(self, mine: pb.Hello, theirs: pb.Hello, dialer: int, listener: int) -> bytes:
        if len(theirs.x25519_public) != 32 or len(theirs.nonce) != 32:
            raise ProtocolError("malformed peer hello")
        self.peer_security = theirs.security or "semi-honest"   # a party predating the field
        shared = self.private.exchange(X25519PublicKey.from_public_bytes(theirs.x25519_public))
        d, l_ = (mine, theirs) if mine.rank == dialer else (theirs, mine)
        info = (b"mpc3-pair-seed-v1/%d->%d/" % (dialer, listener) + d.x25519_public
                + l_.x25519_public)
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=d.nonce + l_.nonce,
                    info=info).derive(shared)
