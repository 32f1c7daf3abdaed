"""Connection set-up over TCP: listen, dial, authenticate, keep alive.

Shared by the TCP transport (:mod:`transports.tcp`) and the emulated-RDMA NIC's
connection manager (:mod:`transports.rdma.nic`). A rank listens on one port
(:func:`bind_listener`: any free one, or one of ``PYCOMM_PORT_RANGE``) and publishes it; a
peer connects with :func:`dial`, which runs the mutual HMAC handshake of
:mod:`transports.handshake` before a single frame is parsed. The accepting side runs
through a :class:`Gate`: every connection is handshaken at once and without blocking,
within :data:`HANDSHAKE_S` seconds, and at most :data:`MAX_PENDING` unauthenticated ones
are kept, so a stranger that connects and stays silent (or trickles bytes) delays no one.
A rank that cannot reach its peer says so in the store (:func:`tell_unreachable`), so the
ranks waiting for it stop at once (:func:`heard_unreachable`). :func:`set_keepalive` makes
the kernel drop a connection whose peer went silent within ``PYCOMM_PEER_TIMEOUT``.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import handshake
from .base import HandshakeError, TransportError

__all__ = ["BACKLOG", "Gate", "HANDSHAKE_S", "MAX_PENDING", "UNREACHABLE_POLL_S",
           "bind_listener", "dial", "heard_unreachable", "recv_exact", "set_keepalive",
           "tell_unreachable"]

HANDSHAKE_S = 3.0       # seconds an accepted connection has to authenticate
MAX_PENDING = 64        # unauthenticated connections kept; a new one evicts the oldest
BACKLOG = 128           # the kernel's queue of connections not yet accepted
UNREACHABLE_POLL_S = 0.5  # how often a rank waiting for connections asks the store


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket before ``deadline`` (handshakes).

    Raises:
        ClosedEarly: the other end closed (or reset) the connection first.
        OSError: ``socket.timeout`` at the deadline, or another socket error.
    """
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise handshake.ClosedEarly("connection closed during handshake")
        buf += chunk
    return bytes(buf)


def dial(host: str, port: int, connector: Callable[[], handshake.Connector], deadline: float,
         then: Callable[[socket.socket], Any] | None = None) -> tuple[socket.socket, Any]:
    """Connect to the :class:`Gate` at ``host:port`` and authenticate with a ``connector()``.

    A gate closes its oldest pending connection when it is full and any connection past
    its deadline; either way the connection closes before OK, and this tries again (with
    a fresh nonce) until ``deadline`` (monotonic seconds).

    Args:
        then: run on the authenticated socket (the rdma address exchange); its result is
            returned too, and it is retried with the handshake when it meets ClosedEarly.

    Returns:
        The connected blocking socket, and what ``then`` returned (None without it).

    Raises:
        OSError: cannot connect, or the deadline passed.
        HandshakeError: the acceptor failed authentication, or spoke another protocol.
    """
    while True:
        sock = socket.create_connection((host, port),
                                        timeout=max(deadline - time.monotonic(), 0.1))
        try:
            hs = connector()
            sock.sendall(hs.hello())
            sock.sendall(hs.on_challenge(recv_exact(sock, handshake.CHALL.size, deadline)))
            hs.on_ok(recv_exact(sock, len(handshake.OK), deadline))
            return sock, (then(sock) if then is not None else None)
        except (handshake.ClosedEarly, BrokenPipeError, ConnectionResetError):
            sock.close()
            if deadline - time.monotonic() < 0.05:
                raise
            time.sleep(0.01)
        except BaseException:
            sock.close()
            raise


def bind_listener(host: str, port_range: tuple[int, int] | None = None) -> socket.socket:
    """Return a TCP socket bound to ``host`` on a free port, within ``port_range`` if given,
    and listening (a caller may call ``listen`` again for its own backlog).

    Ports of the range are tried in order from a point that depends on the pid, so ranks of
    one host starting together seldom race for the same port. A port is claimed by listening
    on it: with SO_REUSEADDR two sockets may both bind a port that neither listens on yet,
    and the second's ``listen`` then fails, so a port whose bind or listen finds it in use
    is passed over.

    Raises:
        TransportError: every port of the range is taken, or ``host`` is no local address.
    """
    if port_range is None:
        ports = [0]
    else:
        lo, hi = port_range
        start = os.getpid() % (hi - lo + 1)
        ports = [lo + (start + i) % (hi - lo + 1) for i in range(hi - lo + 1)]
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or port_range is None:
                raise TransportError(f"cannot listen on {host}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
    raise TransportError(f"no free port to listen on at {host} in {lo}-{hi} "
                         f"(PYCOMM_PORT_RANGE): all {hi - lo + 1} are in use")


def tell_unreachable(store, key: str, message: str) -> None:
    """Publish why this rank cannot reach a peer, so the ranks waiting for it stop at once."""
    if not hasattr(store, "add"):       # a store without counters: the waiters time out
        return
    try:
        store.set(key + "unreachable", message.encode())
        store.add(key + "unreachable#", 1)
    except Exception:  # noqa: BLE001, S110 - the error being raised matters more
        pass


def heard_unreachable(store, key: str) -> str | None:
    """The message of a rank that could not reach its peer, or None (a non-blocking read).

    The store's host may be the rank that failed: a store that is gone is an answer too.
    """
    if not hasattr(store, "add"):
        return None
    try:
        if store.add(key + "unreachable#", 0) == 0:
            return None
    except Exception as exc:  # noqa: BLE001 - any store failure: its rank is gone
        return f"lost the store while waiting for them ({exc})"
    try:    # set before the count: it is there unless the store went away meanwhile
        return store.get(key + "unreachable", timeout=5.0).decode(errors="replace")
    except Exception as exc:  # noqa: BLE001
        return f"a rank could not reach its peer, and the store went away with its words ({exc})"


def set_keepalive(sock: socket.socket, timeout: float) -> None:
    """Make the kernel drop ``sock`` within about ``timeout`` s of the peer going silent.

    Keepalive probes start after a third of it idle, one a second; ``TCP_USER_TIMEOUT``
    bounds both unacknowledged data and the probes, so the socket reports ETIMEDOUT
    after ``timeout`` s either way (Linux; elsewhere only what the platform offers).
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(timeout / 3))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 1),
                        ("TCP_KEEPCNT", max(1, int(timeout) - idle)),
                        ("TCP_USER_TIMEOUT", int(timeout * 1000))):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Gate:
    """Accepts connections on a listening socket and authenticates them, never waiting on one.

    Every accepted connection gets a fresh :class:`~transports.handshake.Admission` and is
    served as its bytes arrive, alongside all the others. A connection that has not
    authenticated within ``deadline_s`` seconds is closed, and so is the oldest pending one
    when a new arrival would exceed ``max_pending`` (a real peer finishes within a round
    trip, so the oldest are the strangers). A connection that fails its handshake is
    closed at once. Owns the listener (closes it in :meth:`close`). :meth:`poll` is for one
    thread; :meth:`wakeup` may be called from any.

    Args:
        listener: a bound, listening TCP socket.
        admission: makes the handshake state of one new connection.
        deadline_s: seconds a connection has to authenticate.
        max_pending: unauthenticated connections kept at once.
    """

    def __init__(self, listener: socket.socket, admission: Callable[[], handshake.Admission],
                 *, deadline_s: float = HANDSHAKE_S, max_pending: int = MAX_PENDING):
        self.listener = listener
        self._admission = admission
        self._deadline_s, self._max = deadline_s, max_pending
        listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        # socket -> (admission, deadline), oldest first
        self._pending: OrderedDict[socket.socket, tuple[handshake.Admission, float]] = \
            OrderedDict()

    @property
    def pending(self) -> int:
        """Connections accepted and not yet authenticated."""
        return len(self._pending)

    def poll(self, timeout: float) -> list[tuple[socket.socket, handshake.Admission]]:
        """Serve the listener and the pending handshakes for up to ``timeout`` seconds.

        Returns as soon as something happened (or :meth:`wakeup` was called).

        Returns:
            The connections that authenticated, as (non-blocking socket, its admission,
            whose ``peer_rank`` and ``blob`` say who it is); possibly none.
        """
        now = time.monotonic()
        if self._pending:
            timeout = min(timeout, next(iter(self._pending.values()))[1] - now)
        done: list[tuple[socket.socket, handshake.Admission]] = []
        arrivals = False
        for key, _ in self._sel.select(max(timeout, 0.0)):
            if key.data == "wake":
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
            elif key.fileobj is self.listener:
                arrivals = True
            else:
                self._serve(key.fileobj, done)
        if arrivals:            # after serving: a peer whose hello is here is not evicted
            self._accept()
        now = time.monotonic()
        while self._pending:
            sock, (_, deadline) = next(iter(self._pending.items()))
            if deadline > now:
                break
            self._drop(sock)
        return done

    def _accept(self) -> None:
        for _ in range(self._max):      # a bounded batch: pending handshakes get served too
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:             # out of descriptors or the like: retry next poll
                return
            while len(self._pending) >= self._max:
                self._drop(next(iter(self._pending)))
            sock.setblocking(False)
            self._pending[sock] = (self._admission(), time.monotonic() + self._deadline_s)
            self._sel.register(sock, selectors.EVENT_READ, "pending")

    def _serve(self, sock: socket.socket, done: list) -> None:
        entry = self._pending.get(sock)
        if entry is None:
            return
        adm = entry[0]
        try:
            data = sock.recv(adm.want())
            if not data:
                raise HandshakeError("closed during the handshake")
            reply = adm.receive(data)
            # A reply is a few hundred bytes at most into an empty send buffer: a send
            # that does not take it whole means the other end is not a pycomm peer.
            if reply and sock.send(reply) != len(reply):
                raise HandshakeError("peer does not read")
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, HandshakeError):
            self._drop(sock)
            return
        if adm.done:
            self._sel.unregister(sock)
            del self._pending[sock]
            done.append((sock, adm))

    def _drop(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def wakeup(self) -> None:
        """End a :meth:`poll` in progress early (from any thread)."""
        try:
            self._wake_w.send(b"w")
        except OSError:
            pass

    def close(self) -> None:
        """Close the pending connections, the listener and the wake-up pair."""
        for sock in list(self._pending):
            self._drop(sock)
        self._sel.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()
