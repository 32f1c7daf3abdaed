"""TCP transport: one authenticated, non-blocking connection per peer.

Connection set-up. Every rank listens on one port (loopback unless ``host`` is given) and
publishes ``host:port`` in the store. A rank connects to every lower-ranked peer and
accepts every higher-ranked one, so the dependency always points down and set-up cannot
deadlock. Each connection runs the mutual HMAC handshake of :mod:`transports.handshake`
before a single frame is parsed.

Data path. Frames (prefix, header, payload) leave through ``sendmsg`` with the header and
the payload as separate iovecs: the payload is never copied in user space. A frame that
does not fit the socket buffer stays queued (holding a view of the caller's buffer) and
drains as the socket becomes writable. Incoming bytes are read into a 256 KiB staging
buffer, where small frames are parsed and copied once to their destination; the tail of a
large payload is read with ``recv_into`` straight into the destination buffer (zero extra
copies). Reads and writes are driven by the same ``progress()``, so two ranks streaming
large messages at each other both make progress: no deadlock on full socket buffers.

Copies: eager payload = kernel copies only on the send side, one user-space copy from the
staging buffer on the receive side; rendezvous payload (large) = received in place, i.e.
only the kernel's copies.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections import deque
from typing import Any

import msgpack

from . import handshake
from .base import MAX_HEADER, PREFIX, HandshakeError, PeerLostError, Transport, TransportError

__all__ = ["TcpTransport"]

_STAGE = 256 * 1024
_SOCKBUF = 4 * 1024 * 1024
_HDR, _PAYLOAD = 0, 1


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket before ``deadline`` (handshakes)."""
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise HandshakeError("connection closed during handshake")
        buf += chunk
    return bytes(buf)


class _Conn:
    __slots__ = ("peer", "sock", "fd", "stage", "sview", "start", "end", "state", "dest",
                 "off", "left", "queue", "wants_write", "bye")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer, self.sock = peer, sock
        self.fd = sock.fileno()
        self.stage = bytearray(_STAGE)
        self.sview = memoryview(self.stage)
        self.start = self.end = 0
        self.state = _HDR
        self.dest = None
        self.off = self.left = 0
        self.queue: deque = deque()     # [list of views, token]
        self.wants_write = False
        self.bye = False                # the peer announced a clean close


class TcpTransport(Transport):
    """Frames over TCP sockets, authenticated with the job token.

    Options:
        host: address to listen on and to publish (default 127.0.0.1).
    """

    name = "tcp"

    def __init__(self, rank, size, job_id, token, sink, *, host: str | None = None,
                 **options: Any):
        super().__init__(rank, size, job_id, token, sink)
        self.host = host or "127.0.0.1"
        self._conns: dict[int, _Conn] = {}
        self._by_fd: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        # A socket pair another thread of ours writes to, to end a sleep in select().
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._listener: socket.socket | None = None
        self._closed = False

    @staticmethod
    def can_connect(mine: dict, theirs: dict) -> bool:
        return True

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, store, peers: list[int], timeout: float) -> None:
        self.peers = sorted(peers)
        deadline = time.monotonic() + timeout
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((self.host, 0))
        lst.listen(max(16, len(peers)))
        self._listener = lst
        key = f"tcp/{self.job_id}/"
        store.set(key + str(self.rank), msgpack.packb([self.host, lst.getsockname()[1]]))
        for peer in (p for p in self.peers if p < self.rank):
            host, port = msgpack.unpackb(store.get(key + str(peer), timeout=timeout))
            sock = socket.create_connection((host, port),
                                            timeout=max(deadline - time.monotonic(), 0.1))
            try:
                hs = handshake.Connector(self.token, self.rank, peer)
                sock.sendall(hs.hello())
                sock.sendall(hs.on_challenge(recv_exact(sock, handshake.CHALL.size,
                                                         deadline)))
                hs.on_ok(recv_exact(sock, len(handshake.OK), deadline))
            except (OSError, HandshakeError) as exc:
                sock.close()
                raise TransportError(f"rank {self.rank}: handshake with rank {peer} at "
                                     f"{host}:{port} failed: {exc}") from exc
            self._add(peer, sock)
        waiting = {p for p in self.peers if p > self.rank}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"rank {self.rank}: ranks {sorted(waiting)} did not "
                                     f"connect within {timeout:.0f} s")
            lst.settimeout(left)
            try:
                sock, _ = lst.accept()
            except socket.timeout:
                continue
            hs = handshake.Acceptor(self.token, self.rank, self.size)
            try:
                sock.sendall(hs.on_hello(recv_exact(sock, handshake.HELLO.size, deadline)))
                sock.sendall(hs.on_proof(recv_exact(sock, handshake.PROOF_LEN, deadline)))
            except (OSError, HandshakeError):
                sock.close()            # a stranger or a confused peer: refuse, keep waiting
                continue
            if hs.peer_rank not in waiting:
                sock.close()
                continue
            waiting.discard(hs.peer_rank)
            self._add(hs.peer_rank, sock)
        lst.close()
        self._listener = None

    def _add(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKBUF)
            except OSError:
                pass
        sock.setblocking(False)
        conn = _Conn(peer, sock)
        self._conns[peer] = conn
        self._by_fd[conn.fd] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    # -- sending --------------------------------------------------------------------------
    def send(self, peer: int, header: bytes, payload, token: Any) -> bool:
        conn = self._conns[peer]
        hb = PREFIX.pack(len(header), len(payload) if payload is not None else 0) + header
        parts = [memoryview(hb), payload] if payload is not None and len(payload) else \
            [memoryview(hb)]
        if not conn.queue:
            try:
                sent = conn.sock.sendmsg(parts)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise PeerLostError(peer, str(exc)) from None
            parts = self._advance(parts, sent)
            if not parts:
                return True
        conn.queue.append([parts, token])
        if not conn.wants_write:
            conn.wants_write = True
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        return False

    @staticmethod
    def _advance(parts: list, sent: int) -> list:
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts = parts[1:]
        if parts and sent:
            parts = [parts[0][sent:]] + parts[1:]
        return parts

    def _flush(self, conn: _Conn) -> bool:
        moved = False
        q = conn.queue
        while q:
            item = q[0]
            try:
                sent = conn.sock.sendmsg(item[0])
            except BlockingIOError:
                break
            except OSError as exc:
                raise PeerLostError(conn.peer, str(exc)) from None
            moved = moved or sent > 0
            item[0] = self._advance(item[0], sent)
            if item[0]:
                break
            q.popleft()
            if item[1] is not None:
                self.sink.on_sent(item[1])
        if not q and conn.wants_write:
            conn.wants_write = False
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        return moved

    # -- receiving ------------------------------------------------------------------------
    def has_backlog(self) -> bool:
        return any(c.queue for c in self._conns.values())

    def progress(self) -> bool:
        return self._handle(self._sel.select(0))

    def _handle(self, events) -> bool:
        busy = False
        for key, mask in events:
            conn = key.data
            if conn is None:                # the wake-up socket
                self._drain_wakeups()
                continue
            if mask & selectors.EVENT_WRITE and conn.queue:
                busy = self._flush(conn) or busy
            if mask & selectors.EVENT_READ:
                busy = self._read(conn) or busy
        return busy

    def _read(self, conn: _Conn) -> bool:
        try:
            if conn.state == _PAYLOAD and conn.start == conn.end and conn.left > _STAGE // 4:
                n = conn.sock.recv_into(conn.dest[conn.off:], conn.left)
                if n == 0:
                    return self._closed_by_peer(conn)
                conn.off += n
                conn.left -= n
                if not conn.left:
                    conn.state, conn.dest = _HDR, None
                    self.sink.on_payload(conn.peer)
                return True
            if conn.start == conn.end:
                conn.start = conn.end = 0
            elif conn.end > _STAGE - 4096:      # compact so a whole header fits
                n = conn.end - conn.start
                conn.stage[:n] = conn.stage[conn.start:conn.end]
                conn.start, conn.end = 0, n
            n = conn.sock.recv_into(conn.sview[conn.end:])
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise PeerLostError(conn.peer, str(exc)) from None
        if n == 0:
            return self._closed_by_peer(conn)
        conn.end += n
        self._parse(conn)
        return True

    def _closed_by_peer(self, conn: _Conn) -> bool:
        """EOF: fine after the peer's goodbye frame (forget it), a failure otherwise."""
        if not conn.bye:
            raise PeerLostError(conn.peer, "connection closed by peer")
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        return True

    def _parse(self, conn: _Conn) -> None:
        sink, peer, view = self.sink, conn.peer, conn.sview
        while True:
            avail = conn.end - conn.start
            if conn.state == _HDR:
                if avail < 12:
                    return
                hlen, plen = PREFIX.unpack_from(view, conn.start)
                if hlen == 0 and plen == 0:      # goodbye frame: EOF follows, not a crash
                    conn.bye = True
                    conn.start += 12
                    continue
                if hlen > MAX_HEADER:
                    raise TransportError(f"rank {peer} sent a {hlen}-byte header")
                if avail < 12 + hlen:
                    if 12 + hlen > _STAGE - conn.start:
                        n = conn.end - conn.start
                        conn.stage[:n] = conn.stage[conn.start:conn.end]
                        conn.start, conn.end = 0, n
                    return
                s = conn.start + 12
                header = bytes(view[s:s + hlen])
                conn.start = s + hlen
                dest = sink.on_header(peer, header, plen)
                if plen == 0:
                    sink.on_payload(peer)
                    continue
                conn.state, conn.dest, conn.off, conn.left = _PAYLOAD, dest, 0, plen
            else:
                n = min(avail, conn.left)
                if not n:
                    return
                conn.dest[conn.off:conn.off + n] = view[conn.start:conn.start + n]
                conn.start += n
                conn.off += n
                conn.left -= n
                if conn.left:
                    return
                conn.state, conn.dest = _HDR, None
                sink.on_payload(peer)

    # -- waiting --------------------------------------------------------------------------
    def block(self, timeout: float) -> None:
        # Only wait: the events are handled by the next progress(), under the caller's lock.
        for key, _ in self._sel.select(max(timeout, 0.0)):
            if key.data is None:
                self._drain_wakeups()

    def wakeup(self) -> None:
        try:
            self._wake_w.send(b"w")
        except (BlockingIOError, OSError):   # already pending, or closing
            pass

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 5.0
        for conn in self._conns.values():
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            try:                            # finish queued sends, then say goodbye
                conn.sock.setblocking(True)
                for item in conn.queue:
                    conn.sock.settimeout(max(deadline - time.monotonic(), 0.01))
                    for part in item[0]:
                        conn.sock.sendall(part)
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.01))
                conn.sock.sendall(PREFIX.pack(0, 0))
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass                        # the peer is gone already: nothing to tell it
            conn.sock.close()
        self._conns.clear()
        self._by_fd.clear()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._listener is not None:
            self._listener.close()
