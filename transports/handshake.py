"""Mutual HMAC challenge-response for TCP connections (sans-I/O).

Before a single frame is parsed, both ends of a connection prove they hold the job's
secret without revealing it (RFC 2104 HMAC-SHA256 over fresh nonces, as in a standard
challenge-response). Every message is fixed-size binary, so nothing attacker-controlled is
decoded before authentication. Flow (C = connecting rank, A = accepting rank)::

    C -> A   HELLO   magic(4) version(2) rank(4) nonce_c(32)                42 bytes
    A -> C   CHALL   nonce_a(32) rank(4) HMAC(k, "A" | nonce_c | nonce_a | rank_a)   68 bytes
    C -> A   PROOF   HMAC(k, "C" | nonce_a | nonce_c | rank_c)               32 bytes
    A -> C   OK      magic(4)                                                 4 bytes

A device that has more to say once both ends are authenticated (the emulated NIC's
address) appends it to OK as one u32-length-prefixed blob, and reads the connector's blob
back the same way (:class:`Admission`'s ``greeting``).

The classes here only turn bytes into decisions; the socket code lives in
:mod:`transports.tcp` (:class:`~transports.connect.Gate` drives :class:`Admission` for every
listener, many connections at a time).
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
BLOB_LEN = struct.Struct("<I")
MAX_BLOB = 4096         # bytes of the blob an authenticated connector may send after OK


class ClosedEarly(HandshakeError):
    """The acceptor closed the connection before the handshake finished, without saying
    the proof was wrong: it evicted us to make room, or we missed its deadline. A
    connector may try again."""


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


class Admission:
    """The accepting side of one connection, from its first byte to its end (sans-I/O).

    Ask :meth:`want` how many bytes to read (never more than the current message still
    needs, so not a byte of what follows the handshake is consumed), pass them to
    :meth:`receive` and send what it returns. :attr:`done` turns true once the connector
    has proved it holds the token (and sent its blob, with a ``greeting``). Until then at
    most one handshake message (42 bytes) is held.

    Args:
        token: the job secret.
        rank: this side's rank (or device id).
        world_size: ranks (or device ids) a connector may claim are ``0 <= r < world_size``.
        greeting: bytes to send right after OK; the connector then must answer with one
            blob of at most :data:`MAX_BLOB` bytes, u32-length-prefixed. None: no blob.
    """

    def __init__(self, token: bytes, rank: int, world_size: int, *,
                 greeting: bytes | None = None):
        self._hs = Acceptor(token, rank, world_size)
        self._greeting = greeting
        self._buf = bytearray()
        self._stage = 0         # 0 hello, 1 proof, 2 blob length, 3 blob, 4 done
        self._need = HELLO.size
        self.blob = b""

    @property
    def done(self) -> bool:
        return self._stage == 4

    @property
    def peer_rank(self) -> int:
        """The rank (or device id) the connector claimed; proven once :attr:`done`."""
        return self._hs.peer_rank

    def want(self) -> int:
        """Bytes the current message still needs (0 once done)."""
        return self._need - len(self._buf)

    def receive(self, data: bytes) -> bytes:
        """Consume ``data`` (at most :meth:`want` bytes); return the bytes to send back.

        Raises:
            HandshakeError: more bytes than asked for, a message that fails its check (see
                :class:`Acceptor`), or a blob longer than :data:`MAX_BLOB`.
        """
        if len(data) > self.want():
            raise HandshakeError(f"{len(data)} bytes where {self.want()} were expected")
        self._buf += data
        if len(self._buf) < self._need:
            return b""
        message, self._buf = bytes(self._buf), bytearray()
        if self._stage == 0:
            self._stage, self._need = 1, PROOF_LEN
            return self._hs.on_hello(message)
        if self._stage == 1:
            reply = self._hs.on_proof(message)
            if self._greeting is None:
                self._stage, self._need = 4, 0
                return reply
            self._stage, self._need = 2, BLOB_LEN.size
            return reply + self._greeting
        if self._stage == 2:
            (n,) = BLOB_LEN.unpack(message)
            if n > MAX_BLOB:
                raise HandshakeError(f"rank {self.peer_rank} announced a {n}-byte address")
            self._stage, self._need = (3, n) if n else (4, 0)
            return b""
        self._stage, self._need, self.blob = 4, 0, message
        return b""
