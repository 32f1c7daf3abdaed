"""TCP transport: one authenticated, non-blocking connection per peer.

Connection set-up. Every rank listens on one port (loopback unless ``host`` is given; in
``port_range`` when one is given) and publishes ``host:port`` and its hostname in the
store, so a peer that cannot reach it names both. A rank connects to every lower-ranked
peer and accepts every higher-ranked one, so the dependency always points down and set-up
cannot deadlock. Each connection is authenticated before a single frame is parsed
(:mod:`transports.connect`: the dialer, the listener and its :class:`~transports.connect.Gate`).
With ``peer_timeout``, a rank with peers on other hosts also publishes the port of its
process watch (:mod:`transports.procwatch`).

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
import sys
import time
from collections import deque
from typing import Any

import msgpack

from . import handshake, procwatch
from .base import HandshakeError, PeerLostError, Transport, TransportError
from .connect import (BACKLOG, MAX_PENDING, UNREACHABLE_POLL_S, Gate, bind_listener, dial,
                      heard_unreachable, set_keepalive, tell_unreachable)
from .frames import FrameDecoder, frame_prefix

__all__ = ["TcpTransport"]

_STAGE = 256 * 1024
_SOCKBUF = 4 * 1024 * 1024


def _note_watch(watches: dict, peer: int, host: str, card_rest: list) -> None:
    """Record the watch address of ``peer`` if it published one (``card_rest``: what
    follows host and port in its card; a rank publishes one only for a world in which
    it has peers on other hosts)."""
    if len(card_rest) >= 2 and card_rest[1]:
        watches[peer] = (host, card_rest[1])


class _Conn:
    __slots__ = ("peer", "sock", "fd", "stage", "sview", "decoder", "queue", "wants_write")

    def __init__(self, peer: int, sock: socket.socket, decoder: FrameDecoder):
        self.peer, self.sock = peer, sock
        self.fd = sock.fileno()
        self.stage = bytearray(_STAGE)
        self.sview = memoryview(self.stage)
        self.decoder = decoder          # decoder.goodbye: the peer announced a clean close
        self.queue: deque = deque()     # [list of views, token]
        self.wants_write = False


class TcpTransport(Transport):
    """Frames over TCP sockets, authenticated with the job token.

    Options:
        host: address to listen on and to publish (default 127.0.0.1).
        port_range: (lo, hi): listen on a port of this range (default: any free port).
        peer_timeout: seconds after which a silent or unacknowledging peer is lost (TCP
            keepalive probes from a third of it on, and ``TCP_USER_TIMEOUT``): a pulled
            cable or a frozen host becomes a PeerLostError naming the peer's host (None: the
            kernel's defaults, i.e. hours). With it and ``remote_peers``, the rank also
            starts a process watch (:mod:`transports.procwatch`), so that a peer on another
            host whose process is stopped while its kernel runs (which keepalive cannot
            see) is found too: see :meth:`not_running`.
        remote_peers: the peers on other hosts (the world's layout, known before the
            transports connect); a peer on this host is never asked about.
    """

    name = "tcp"
    # seconds into a stalled wait from which :meth:`not_running` is worth asking (None:
    # never; set when this rank has peers on other hosts and a peer_timeout)
    watch_after: float | None = None

    def __init__(self, rank, size, job_id, token, sink, *, host: str | None = None,
                 port_range: tuple[int, int] | None = None, peer_timeout: float | None = None,
                 remote_peers=(), **options: Any):
        super().__init__(rank, size, job_id, token, sink)
        self.host = host or "127.0.0.1"
        self.port_range = port_range
        self.peer_timeout = peer_timeout
        self.remote_peers = frozenset(remote_peers)
        self._where: dict[int, str] = {}    # peer -> "host NAME at ADDR:PORT", for errors
        self._conns: dict[int, _Conn] = {}
        self._by_fd: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        # A socket pair another thread of ours writes to, to end a sleep in select().
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._listener: socket.socket | None = None
        self._watch: procwatch.Watch | None = None   # this rank's process watch, if any
        self._asker: procwatch.Asker | None = None
        self._closed = False

    @staticmethod
    def can_connect(mine: dict, theirs: dict) -> bool:
        return True

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, store, peers: list[int], timeout: float) -> None:
        self.peers = sorted(peers)
        deadline = time.monotonic() + timeout
        try:
            lst = bind_listener(self.host, self.port_range)
        except TransportError as exc:
            raise TransportError(f"rank {self.rank} (host {socket.gethostname()}): "
                                 f"{exc}") from exc
        lst.listen(max(BACKLOG, 2 * len(peers)))
        self._listener = lst
        # Room for every peer at once on top of the strangers' share.
        gate = Gate(lst, lambda: handshake.Admission(self.token, self.rank, self.size),
                    max_pending=MAX_PENDING + len(peers))
        # The watch's port is bound and listening before it is published, so a peer may
        # ask before the watch runs: the kernel queues the question until it does.
        watch_lst = None
        watches: dict[int, tuple[str, int]] = {}
        try:
            if self.peer_timeout and self.remote_peers.intersection(peers):
                try:
                    watch_lst = bind_listener(self.host, self.port_range)
                except TransportError as exc:
                    raise TransportError(f"rank {self.rank} (host {socket.gethostname()}), "
                                         f"its process watch: {exc}") from exc
                self._start_watch(watch_lst)    # listening, answering before any ask
            key = f"tcp/{self.job_id}/"
            store.set(key + str(self.rank), msgpack.packb(
                [self.host, lst.getsockname()[1], socket.gethostname(),
                 watch_lst.getsockname()[1] if watch_lst is not None else 0]))
            for peer in (p for p in self.peers if p < self.rank):
                try:
                    self._connect_to(store, key, peer, deadline, timeout, watches)
                except TransportError as exc:
                    tell_unreachable(store, key, str(exc))
                    raise
            waiting = {p for p in self.peers if p > self.rank}
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"rank {self.rank}: ranks {sorted(waiting)} did not "
                                         f"connect within {timeout:.0f} s")
                said = heard_unreachable(store, key)
                if said is not None:
                    raise TransportError(f"rank {self.rank}: ranks {sorted(waiting)} cannot "
                                         f"connect: {said}")
                for sock, adm in gate.poll(min(left, UNREACHABLE_POLL_S)):
                    if adm.peer_rank not in waiting:
                        sock.close()        # a second connection claiming the same rank
                        continue
                    waiting.discard(adm.peer_rank)
                    self._add(adm.peer_rank, sock)
            for peer in (p for p in self.peers if p > self.rank):
                # Published before it dialed us: its name, for the errors that blame it.
                host, port, *rest = msgpack.unpackb(store.get(key + str(peer),
                                                              timeout=timeout))
                self._where[peer] = f"host {rest[0] if rest else '?'} at {host}:{port}"
                _note_watch(watches, peer, host, rest)
            watches = {p: a for p, a in watches.items() if p in self.remote_peers}
            # Only a rank with its own watch asks: the watch tells it when it was stopped
            # itself, without which a whole job suspended would read as its peers stopped.
            if watches and self._watch is not None:
                self._asker = procwatch.Asker(watches, self.peer_timeout / 2, self.token)
                self.watch_after = self.peer_timeout / 4
        finally:
            gate.close()
            self._listener = None
            if watch_lst is not None:
                watch_lst.close()           # the watch has its own copy, if it started

    def _connect_to(self, store, key: str, peer: int, deadline: float,
                    timeout: float, watches: dict) -> None:
        host, port, *rest = msgpack.unpackb(store.get(key + str(peer), timeout=timeout))
        name = rest[0] if rest else "?"
        self._where[peer] = f"host {name} at {host}:{port}"
        _note_watch(watches, peer, host, rest)
        try:
            sock, _ = dial(host, port, lambda: handshake.Connector(self.token, self.rank, peer),
                           deadline)
        except (OSError, HandshakeError) as exc:
            hint = (" (it listens on loopback: set PYCOMM_HOST, or PYCOMM_MASTER_ADDR to an "
                    "address of the store's host)" if host.startswith("127.")
                    and name != socket.gethostname() else "")
            raise TransportError(f"rank {self.rank} (host {socket.gethostname()}) cannot "
                                 f"reach rank {peer} on host {name} at {host}:{port}: "
                                 f"{exc}{hint}") from exc
        self._add(peer, sock)

    def _add(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKBUF)
            except OSError:
                pass
        if self.peer_timeout:
            set_keepalive(sock, self.peer_timeout)
        sock.setblocking(False)
        conn = _Conn(peer, sock, FrameDecoder(peer, self.sink))
        self._conns[peer] = conn
        self._by_fd[conn.fd] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _start_watch(self, listener: socket.socket) -> None:
        """Start this rank's process watch on ``listener``. A watch that cannot start (no
        interpreter to run it, no process to spare) costs only the stopped-peer check,
        which the others then cannot make about this rank: say so, and go on."""
        try:
            self._watch = procwatch.Watch(listener, self.token, tick=self.peer_timeout / 8)
        except OSError as exc:
            print(f"pycomm: rank {self.rank} (host {socket.gethostname()}): cannot start "
                  f"its process watch ({exc}): neither it nor its peers will learn that the "
                  "other is stopped, if ever", file=sys.stderr, flush=True)

    def not_running(self, peers, awake_since: float) -> tuple[int, str] | None:
        """A peer (of ``peers``, or one not reading what we queued for it) on another host
        whose process has not run for half ``peer_timeout`` while this rank was awake
        (since ``awake_since``, ``time.monotonic()``, or since this rank's own watch last
        saw it or its host stopped), by its host's process watch: ``(peer, why)``, ``why``
        naming its host; else None. Asks without blocking
        (:meth:`transports.procwatch.Asker.poll`); call it every few hundred milliseconds
        of a stalled wait."""
        if self._asker is None:
            return None
        awake_since = max(awake_since, self._watch.stopped_at())
        queued = [p for p, conn in self._conns.items() if conn.queue]
        found = self._asker.poll([*peers, *queued] if queued else peers, awake_since)
        if found is None:
            return None
        peer, why = found
        where = self._where.get(peer)
        return peer, (f"{why} ({where}; PYCOMM_PEER_TIMEOUT {self.peer_timeout:g} s)"
                      if where else why)

    def _lost(self, peer: int, why: OSError | str) -> PeerLostError:
        """The error for a dropped connection, naming the peer's host and address."""
        if isinstance(why, OSError) and why.errno == errno.ETIMEDOUT and self.peer_timeout:
            detail = (f"no answer for {self.peer_timeout:g} s (PYCOMM_PEER_TIMEOUT): the link "
                      "is down or the host is frozen")
        else:
            detail = str(why)
        where = self._where.get(peer)
        return PeerLostError(peer, f"{detail} ({where})" if where else detail)

    # -- sending --------------------------------------------------------------------------
    def send(self, peer: int, header: bytes, payload, token: Any) -> bool:
        conn = self._conns[peer]
        hb = frame_prefix(header, len(payload) if payload is not None else 0)
        parts = [memoryview(hb), payload] if payload is not None and len(payload) else \
            [memoryview(hb)]
        if not conn.queue:
            try:
                sent = conn.sock.sendmsg(parts)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise self._lost(peer, exc) from None
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
                raise self._lost(conn.peer, exc) from None
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
        dec = conn.decoder
        try:
            target = dec.payload_target()
            if target is not None and len(target) > _STAGE // 4:
                # a large payload's rest: straight from the socket into its destination
                n = conn.sock.recv_into(target)
                if n == 0:
                    return self._closed_by_peer(conn)
                dec.landed(n)
                return True
            n = conn.sock.recv_into(conn.sview)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise self._lost(conn.peer, exc) from None
        if n == 0:
            return self._closed_by_peer(conn)
        dec.feed(conn.sview[:n])
        return True

    def closed_peers(self) -> set[int]:
        return {peer for peer, conn in self._conns.items() if conn.decoder.goodbye}

    def _closed_by_peer(self, conn: _Conn) -> bool:
        """EOF: fine after the peer's goodbye frame (forget it), a failure otherwise."""
        if not conn.decoder.goodbye:
            raise self._lost(conn.peer, "connection closed by peer")
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        return True

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
                conn.sock.sendall(frame_prefix(b"", 0))
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
        if self._asker is not None:
            self._asker.close()
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
