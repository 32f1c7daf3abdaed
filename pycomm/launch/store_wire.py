"""The rendezvous store's wire format, shared by server and client: framing and the handshake.

The protocol itself (the handshake's messages, the requests and their replies) is described
in :mod:`pycomm.launch.store`; this module holds its constants and sans-I/O helpers, so that
:mod:`pycomm.launch.store_client` does not need the server.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from pycomm.errors import ArgumentError, ProtocolError

__all__ = ["FrameReader", "frame", "hmac_proof", "normalize_token"]

MAGIC = b"PYCS"
VERSION = 2             # 2: length-prefixed frames over plain TCP (1 was ZMTP)
HELLO = MAGIC + bytes([VERSION])
NONCE_LEN = 32
MAC_LEN = 32
REFUSED = b"PYCS-REFUSED"
CLIENT_LABEL = b"pycomm-store/client"
SERVER_LABEL = b"pycomm-store/server"
LENGTH = struct.Struct("<I")
MAX_AUTH_FRAME = 64     # bytes: the largest handshake message (PROOF)
REPLY_GRACE = 5.0       # seconds a client waits beyond a request's own timeout
MAX_KEY = 4096          # characters of a key or barrier name
_BIG = 1 << 16          # bytes from which a frame's body is sent without concatenation


def hmac_proof(token: bytes, *parts: bytes) -> bytes:
    """Return HMAC-SHA256 keyed by ``token`` over the concatenation of ``parts`` (32 bytes).

    Sans-I/O helper of the handshake; compare proofs with :func:`hmac.compare_digest`.
    """
    return hmac.new(token, b"".join(parts), hashlib.sha256).digest()


def normalize_token(token: bytes | str) -> bytes:
    """Return the HMAC key for a job token given in any of its usual forms.

    The ``PYCOMM_JOB_TOKEN`` text (``str``), its ASCII bytes, and the raw bytes that text
    encodes in hex all yield the same key (the lower-case hex text as ASCII bytes), so a
    server and a client that decoded the environment differently still agree.

    Raises:
        ArgumentError: the token is empty.
    """
    if isinstance(token, str):
        text = token.strip()
    else:
        raw = bytes(token)
        try:
            text = raw.decode("ascii")
            if not (text.isprintable() or _is_hex(text)):
                raise UnicodeDecodeError("ascii", raw, 0, 1, "not text")
        except UnicodeDecodeError:
            text = raw.hex()  # raw secret bytes: use the hex text they would be sent as
    if not text:
        raise ArgumentError("the job token is empty (set PYCOMM_JOB_TOKEN)")
    return text.lower().encode() if _is_hex(text) else text.encode()


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return len(text) > 0 and " " not in text



def frame(body: bytes) -> bytes:
    """Return ``body`` with its u32 little-endian length in front (one store message)."""
    return LENGTH.pack(len(body)) + body


class FrameReader:
    """Length-prefixed frames out of a byte stream (sans-I/O): feed bytes, get bodies.

    Memory held is what has arrived of the current frame: nothing is allocated for the
    length a frame merely announces.

    Args:
        limit: the largest body accepted, in bytes (may be raised later, e.g. once the
            peer has authenticated).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._head = bytearray()
        self._body: bytearray | None = None
        self._want = 0

    @property
    def buffered(self) -> int:
        """Bytes held of the frame being read."""
        return len(self._head) + (len(self._body) if self._body is not None else 0)

    def feed(self, data: bytes) -> list[bytearray]:
        """Consume ``data``; return the bodies of the frames it completed, in order.

        Raises:
            ProtocolError: a frame announces a body longer than ``limit``.
        """
        done: list[bytearray] = []
        view, pos, end = memoryview(data), 0, len(data)
        while pos < end:
            if self._body is None:
                take = min(LENGTH.size - len(self._head), end - pos)
                self._head += view[pos:pos + take]
                pos += take
                if len(self._head) < LENGTH.size:
                    break
                (self._want,) = LENGTH.unpack(self._head)
                self._head.clear()
                if self._want > self.limit:
                    raise ProtocolError(f"a frame of {self._want} bytes exceeds the limit "
                                        f"of {self.limit}")
                self._body = bytearray()
            take = min(self._want - len(self._body), end - pos)
            self._body += view[pos:pos + take]
            pos += take
            if len(self._body) == self._want:
                done.append(self._body)
                self._body = None
        return done

