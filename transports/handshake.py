"""Mutual HMAC challenge-response for TCP connections (sans-I/O).

Before a single frame is parsed, both ends of a connection prove they hold the job's
secret without revealing it (RFC 2104 HMAC-SHA256 over fresh nonces, as in a standard
challenge-response). Every message is fixed-size binary, so nothing attacker-controlled is
decoded before authentication. Flow (C = connecting rank, A = accepting rank)::

    C -> A   HELLO   magic(4) version(2) rank(4) nonce_c(32)                42 bytes
    A -> C   CHALL   nonce_a(32) rank(4) HMAC(k, "A" | nonce_c | nonce_a | rank_a)   68 bytes
    C -> A   PROOF   HMAC(k, "C" | nonce_a | nonce_c | rank_c)               32 bytes
    A -> C   OK      magic(4)                                                 4 bytes

The classes here only turn bytes into decisions; the socket code lives in
:mod:`transports.tcp`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from .base import HandshakeError

MAGIC = b"PYCM"
VERSION = 1
HELLO = struct.Struct("<4sHi32s")
CHALL = struct.Struct("<32si32s")
PROOF_LEN = 32
OK = MAGIC


def _mac(token: bytes, *parts: bytes) -> bytes:
    return hmac.new(token, b"".join(parts), hashlib.sha256).digest()


class Connector:
    """The connecting side. Call ``hello()``, feed ``on_challenge``, send what it returns."""

    def __init__(self, token: bytes, rank: int, expected_peer: int):
        self.token, self.rank, self.expected_peer = token, rank, expected_peer
        self.nonce = os.urandom(32)

    def hello(self) -> bytes:
        return HELLO.pack(MAGIC, VERSION, self.rank, self.nonce)

    def on_challenge(self, data: bytes) -> bytes:
        """Verify the acceptor; return the PROOF message.

        Raises:
            HandshakeError: wrong length, wrong peer rank, or a proof that does not verify.
        """
        if len(data) != CHALL.size:
            raise HandshakeError(f"challenge of {len(data)} bytes, expected {CHALL.size}")
        nonce_a, rank_a, proof = CHALL.unpack(data)
        if rank_a != self.expected_peer:
            raise HandshakeError(f"expected rank {self.expected_peer}, peer says {rank_a}")
        want = _mac(self.token, b"A", self.nonce, nonce_a, struct.pack("<i", rank_a))
        if not hmac.compare_digest(want, proof):
            raise HandshakeError(f"rank {rank_a} failed authentication (wrong job token?)")
        return _mac(self.token, b"C", nonce_a, self.nonce, struct.pack("<i", self.rank))

    @staticmethod
    def on_ok(data: bytes) -> None:
        if data != OK:
            raise HandshakeError("peer refused our proof")


class Acceptor:
    """The accepting side. Feed ``on_hello``, then ``on_proof``; learn ``peer_rank``."""

    def __init__(self, token: bytes, rank: int, world_size: int):
        self.token, self.rank, self.world_size = token, rank, world_size
        self.nonce = os.urandom(32)
        self.peer_rank = -1
        self._peer_nonce = b""

    def on_hello(self, data: bytes) -> bytes:
        """Check the HELLO; return the CHALL message.

        Raises:
            HandshakeError: wrong length, magic, version or an out-of-range rank.
        """
        if len(data) != HELLO.size:
            raise HandshakeError(f"hello of {len(data)} bytes, expected {HELLO.size}")
        magic, version, rank, nonce = HELLO.unpack(data)
        if magic != MAGIC or version != VERSION:
            raise HandshakeError(f"not a pycomm peer (magic {magic!r}, version {version})")
        if not 0 <= rank < self.world_size or rank == self.rank:
            raise HandshakeError(f"peer claims invalid rank {rank}")
        self.peer_rank, self._peer_nonce = rank, nonce
        proof = _mac(self.token, b"A", nonce, self.nonce, struct.pack("<i", self.rank))
        return CHALL.pack(self.nonce, self.rank, proof)

    def on_proof(self, data: bytes) -> bytes:
        """Verify the connector's proof; return OK.

        Raises:
            HandshakeError: the proof does not verify.
        """
        want = _mac(self.token, b"C", self.nonce, self._peer_nonce,
                    struct.pack("<i", self.peer_rank))
        if len(data) != PROOF_LEN or not hmac.compare_digest(want, data):
            raise HandshakeError(f"connection claiming rank {self.peer_rank} failed "
                                 "authentication (wrong job token?)")
        return OK
