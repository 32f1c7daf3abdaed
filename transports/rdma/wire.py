"""The NIC's wire: messages between two emulated NICs over one TCP connection.

Every message is a 40-byte header :data:`_MSG` (kind, flags, dst/src qpn, psn, imm, rkey,
length, remote address) and, for some kinds, a payload. :class:`_Link` is one
authenticated connection, parsed incrementally through a staging buffer; :class:`Wire`
(mixed into :class:`~transports.rdma.nic.Nic`) queues outgoing messages, flushes them
without blocking and feeds each arriving header to the responder
(:func:`~transports.rdma.responder.on_header`), whose payload then lands where it says.
"""

from __future__ import annotations

import selectors
import socket
import struct
from collections import deque

import msgpack

from ..base import HandshakeError
from ..handshake import BLOB_LEN, MAX_BLOB
from ..connect import recv_exact as _recv_exact

__all__ = ["Wire", "address_frame", "parse_address"]

_MSG = struct.Struct("<BBHIIIIIQQ")     # kind flags pad dst src psn imm rkey length raddr
M_SEND, M_WRITE, M_READ_REQ, M_READ_RESP, M_ACK, M_NAK, M_IMM = 1, 2, 3, 4, 5, 6, 7
F_IMM, F_PULL = 1, 2
NAK_RNR = 0xFFFF
_STAGE = 256 * 1024
_IOV = struct.Struct("<QQ")


class _Link:
    """One authenticated connection to another NIC, parsed incrementally."""

    def __init__(self, sock: socket.socket, peer: dict, cma: bool):
        self.sock, self.peer, self.cma = sock, peer, cma
        self.pid, self.peer_id = peer["pid"], peer["id"]
        self.out: deque = deque()
        self.stage = bytearray(_STAGE)
        self.sview = memoryview(self.stage)
        self.start = self.end = 0
        self.msg = None                 # header being served
        self.dest = None                # where its payload goes (None: discard)
        self.off = self.left = 0
        self.finish = None              # called when the payload is complete
        self.dead = False
        self.writing = False


class Wire:
    """Sending and receiving messages on links (a mixin: it uses the NIC's ``_dirty``,
    ``sel``, ``_link_lost`` and ``on_header(link, msg) -> (dest, nbytes, finish)``, the
    responder, which the NIC supplies so that this module imports neither)."""

    def _send(self, link: _Link, header: bytes, payload: list) -> None:
        if link.dead:
            return
        link.out.append(memoryview(header))
        link.out.extend(memoryview(p) for p in payload if len(p))
        self._dirty.add(link)

    def _flush(self, link: _Link) -> None:
        out = link.out
        while out:
            try:
                sent = link.sock.sendmsg(list(out)[:512])
            except BlockingIOError:
                sent = 0
            except OSError:
                self._link_lost(link)
                return
            if not sent:
                break
            while sent:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = head[sent:]
                    sent = 0
        if out and not link.writing:
            link.writing = True
            self.sel.modify(link.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, link)
        elif not out:
            self._dirty.discard(link)
            if link.writing:
                link.writing = False
                self.sel.modify(link.sock, selectors.EVENT_READ, link)

    def _read(self, link: _Link) -> None:
        while not link.dead:
            if link.left and link.dest is not None and link.start == link.end:
                n = self._recv_into(link, link.dest[link.off:link.off + link.left])
                if n <= 0:
                    return
                link.off += n
                link.left -= n
                if not link.left:
                    self._done(link)
                continue
            if link.start == link.end:
                link.start = link.end = 0
            elif link.end == _STAGE:
                rest = link.end - link.start
                link.stage[:rest] = link.stage[link.start:link.end]
                link.start, link.end = 0, rest
            n = self._recv_into(link, link.sview[link.end:])
            if n <= 0:
                return
            link.end += n
            while True:
                avail = link.end - link.start
                if link.msg is None:
                    if avail < _MSG.size:
                        break
                    msg = _MSG.unpack_from(link.stage, link.start)
                    link.start += _MSG.size
                    link.msg, link.off = msg, 0
                    link.dest, link.left, link.finish = self.on_header(link, msg)
                    if not link.left:
                        self._done(link)
                    continue
                n = min(avail, link.left)
                if not n:
                    break
                if link.dest is not None:
                    link.dest[link.off:link.off + n] = link.sview[link.start:link.start + n]
                link.start += n
                link.off += n
                link.left -= n
                if not link.left:
                    self._done(link)

    def _recv_into(self, link: _Link, view: memoryview) -> int:
        """Bytes the socket put into ``view``: 0 when none are there yet, -1 when the link
        is gone (then already handled)."""
        try:
            n = link.sock.recv_into(view)
        except BlockingIOError:
            return 0
        except OSError:
            n = 0
        if not n:
            self._link_lost(link)
            return -1
        return n

    def _done(self, link: _Link) -> None:
        finish, link.finish, link.msg, link.dest = link.finish, None, None, None
        if finish is not None:
            finish()


def address_frame(mine: dict) -> bytes:
    """This device's address as sent after authentication: u32 length + msgpack."""
    body = msgpack.packb(mine)
    return BLOB_LEN.pack(len(body)) + body


def parse_address(body: bytes) -> dict:
    """A peer's device address from its msgpack body.

    Raises:
        HandshakeError: it is not a map holding id, pid, host, mrt and cap.
    """
    try:
        peer = msgpack.unpackb(body)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types on bad input
        raise HandshakeError(f"undecodable device address ({exc})") from None
    if not isinstance(peer, dict) or not {"id", "pid", "host", "mrt", "cap"} <= set(peer):
        raise HandshakeError("malformed device address")
    return peer


def _exchange(sock: socket.socket, mine: dict, deadline: float) -> dict:
    """The connector's side after authentication: swap device addresses (u32 length +
    msgpack each way; the acceptor's side is :class:`~transports.handshake.Admission`)."""
    sock.sendall(address_frame(mine))
    (n,) = BLOB_LEN.unpack(_recv_exact(sock, BLOB_LEN.size, deadline))
    if n > MAX_BLOB:
        raise HandshakeError(f"device address of {n} bytes")
    return parse_address(_recv_exact(sock, n, deadline))
