"""The rendezvous store: an authenticated key-value server over pyzmq, and its wire format.

One :class:`StoreServer` per job runs in a daemon thread of the process that hosts the
rendezvous (the launcher, :class:`pycomm.launch.spawning.Pool`, or rank 0 under a torchrun-style
launcher) on a ZeroMQ ``STREAM`` socket: raw TCP, so the server sees every connection and
every byte as it arrives and decides, per connection, how much it is willing to hold. Every
rank talks to it through a :class:`~pycomm.launch.store_client.StoreClient` (one TCP socket, confined to the thread
that uses it). Values are opaque bytes; the store never unpickles anything. Requests and
replies are msgpack maps.

Framing. Every message, both ways, is a u32 little-endian length and that many bytes
(:class:`~pycomm.launch.store_wire.FrameReader` parses them, sans-I/O; the constants and
helpers of the wire format live in :mod:`pycomm.launch.store_wire`).

Authentication comes before anything else (HMAC-SHA256 challenge-response with the job
token, mutual). The handshake messages are fixed-size binary, so nothing a stranger sends
is decoded before it has proved it holds the token::

    C -> S   HELLO    b"PYCS" version(1)                                        5 bytes
    S -> C   CHALL    b"PYCS" nonce_s(32)                                      36 bytes
    C -> S   PROOF    nonce_c(32) HMAC(k, "pycomm-store/client" | nonce_s | nonce_c)  64 bytes
    S -> C   WELCOME  HMAC(k, "pycomm-store/server" | nonce_c | nonce_s)      32 bytes
         or  REFUSED  b"PYCS-REFUSED"                                          12 bytes

Strangers. Until a connection has authenticated, the server holds at most
:data:`MAX_AUTH_FRAME` bytes of it (a longer frame, or any message out of turn, gets one
REFUSED and the connection is closed), gives it :data:`AUTH_DEADLINE` seconds to finish
the handshake, and keeps at most :data:`MAX_PENDING_AUTH` such connections (a new one
pushes out the oldest: a real client finishes its handshake within a round trip, so the
oldest are the idle ones). ZeroMQ reads ahead at most ``RCVHWM`` chunks of 8 KiB per
connection. So an unauthenticated peer can make the server hold a few KiB, for a few
seconds, and nothing it sends reaches the key-value code. An authenticated request is
capped at ``PYCOMM_STORE_MAX_BYTES``; a larger one closes its connection.

Requests after authentication (``id`` is the client's request number; replies echo it)::

    {"op": "set", "id", "key", "value"}            -> {"id", "ok": True}
    {"op": "get", "id", "key", "timeout"}          -> {"id", "ok": True, "value"}   (parked)
    {"op": "add", "id", "key", "delta"}            -> {"id", "ok": True, "value": int}
    {"op": "delete", "id", "key"}                  -> {"id", "ok": True, "value": bool}
    {"op": "wait", "id", "keys", "timeout", "take"} -> {"id", "ok": True, "value": {key: value}}
    {"op": "barrier", "id", "name", "n", "timeout"} -> {"id", "ok": True}            (parked)
    failure                                        -> {"id", "ok": False, "error", "message"}

A parked request is answered when it can be, or with ``error="timeout"`` at its deadline;
except ``wait``, which is answered once every key in ``keys`` is set, or at its deadline
with those that are (never a timeout error): one round trip collects many results while
the caller still wakes every ``timeout`` seconds. Its reply holds at most
``PYCOMM_STORE_MAX_BYTES`` of values (always at least one), so a key missing from it is
unset or did not fit: ask again. With ``take`` the keys in the reply are deleted.
Counters made by ``add`` are stored as ASCII decimal, so ``get`` on a counter reads b"3".
A client may send requests without reading the replies in between: one connection's
requests are served in the order sent, so a ``set`` whose reply the client skips is in
place before its next request runs. A ``set``, ``add`` or ``delete`` with ``"reply": False``
gets no reply when it succeeds (a failure is still answered; the client skips it).
"""

from __future__ import annotations

import heapq
import hmac
import itertools
import os
import threading
import time
from collections import OrderedDict
from typing import Any

import msgpack
import zmq

from pycomm import config
from pycomm.errors import ProtocolError
from pycomm.launch.store_wire import (_BIG, CLIENT_LABEL, MAX_KEY, HELLO, LENGTH, MAC_LEN, MAGIC,
                                      MAX_AUTH_FRAME, NONCE_LEN, REFUSED, SERVER_LABEL,
                                      FrameReader, frame, hmac_proof, normalize_token)

__all__ = ["FrameReader", "StoreServer", "frame", "hmac_proof", "normalize_token"]

AUTH_DEADLINE = 3.0     # seconds a connection has to authenticate before it is closed
MAX_PENDING_AUTH = 64   # unauthenticated connections kept; a new one evicts the oldest
RCVHWM = 16             # ZeroMQ read-ahead per connection, in chunks of at most 8 KiB
_QUIET_OPS = ("set", "add", "delete")    # the ops a request may ask not to be answered
MAX_GONE = 4096         # closed connections whose late chunks are recognised and dropped
_ENTRY_OVERHEAD = 16    # msgpack bytes around one key and value of a wait's reply, at most
_COMPACT_MIN = 1024     # parked waits before the first sweep of the answered ones


def _endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class _Parked:
    """A request waiting on the server: a get or a wait on missing keys, or a barrier
    entrant. ``keys`` and ``left`` are a wait's keys and how many of them are unset."""

    __slots__ = ("deadline", "done", "ident", "keys", "left", "rid", "take", "what")

    def __init__(self, ident: bytes, rid: int, deadline: float, what: str):
        self.ident, self.rid, self.deadline, self.what = ident, rid, deadline, what
        self.done = False
        self.keys: list[str] | None = None
        self.left, self.take = 0, False


class _Peer:
    """One connection to the server: its parser, and how far its handshake got."""

    __slots__ = ("authed", "deadline", "nonce_s", "reader")

    def __init__(self, deadline: float):
        self.reader = FrameReader(MAX_AUTH_FRAME)
        self.authed = False
        self.nonce_s: bytes | None = None
        self.deadline = deadline


class StoreServer:
    """The job's key-value store, served from a daemon thread.

    Args:
        token: the job secret (see :func:`normalize_token` for accepted forms).
        host: address to bind; loopback unless a host address is asked for.
        port: TCP port; 0 picks a free one (read it back from :attr:`port`).

    Raises:
        zmq.ZMQError: the address cannot be bound.
    """

    def __init__(self, token: bytes | str, host: str = "127.0.0.1", port: int = 0):
        self._key = normalize_token(token)
        self._max_bytes = int(config.get("PYCOMM_STORE_MAX_BYTES"))
        self._ctx = zmq.Context()
        try:
            self._sock = self._ctx.socket(zmq.STREAM)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.RCVHWM, RCVHWM)
            # Never drop an outgoing part: a frame's length and its body may leave as two
            # messages, and losing one would desynchronise the stream. A client has at most
            # a few replies queued (one per request), a stranger two small ones.
            self._sock.setsockopt(zmq.SNDHWM, 0)
            if ":" in host:
                self._sock.setsockopt(zmq.IPV6, 1)
            self._sock.bind(_endpoint(host, port or "*"))
            endpoint = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.host = host
            self.port = int(endpoint.rsplit(":", 1)[1])
            self._wake_rx = self._ctx.socket(zmq.PAIR)
            self._wake_rx.bind(f"inproc://store-wake-{id(self)}")
            self._wake_tx = self._ctx.socket(zmq.PAIR)
            self._wake_tx.connect(f"inproc://store-wake-{id(self)}")
        except BaseException:
            # Closed here, not left to the garbage collector: a context collected with its
            # sockets in one cycle loses its weak references to them first, and its
            # finalizer's term() then waits forever for sockets still open (a spawn root
            # whose store could not bind hung in a later call, inside a collection).
            self._ctx.destroy(linger=0)
            raise
        # State below is touched only by the server thread.
        self._data: dict[str, bytes] = {}
        self._getters: dict[str, list[_Parked]] = {}
        self._barriers: dict[str, tuple[int, list[_Parked]]] = {}
        self._deadlines: list[tuple[float, int, _Parked]] = []
        self._compact_at = _COMPACT_MIN     # heap size at which answered waits are dropped
        self._tie = itertools.count()
        self._peers: dict[bytes, _Peer] = {}
        self._pending: OrderedDict[bytes, _Peer] = OrderedDict()   # oldest first
        self._gone: OrderedDict[bytes, None] = OrderedDict()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"pycomm-store:{self.port}",
                                        daemon=True)
        self._thread.start()

    # -- lifecycle -----------------------------------------------------------------------

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None: for the process hosting the store, which
        reads it without a round trip (a dict read; the serving thread only replaces
        values whole)."""
        return self._data.get(key)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the server thread (waits up to ``timeout`` seconds) and close its sockets."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_tx.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._thread.join(timeout)
        self._wake_tx.close(0)
        if not self._thread.is_alive():
            self._ctx.term()

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the server thread ---------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        try:
            while not self._closed:
                wait = 1.0
                if self._deadlines:
                    wait = min(wait, self._deadlines[0][0] - time.monotonic())
                if self._pending:
                    wait = min(wait, next(iter(self._pending.values())).deadline
                               - time.monotonic())
                events = dict(poller.poll(max(0, int(wait * 1000) + 1)))
                if self._wake_rx in events:
                    break
                for _ in range(1000):  # drain, but let deadlines run now and then
                    try:
                        ident, data = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    except ValueError:
                        continue    # not [routing id, data]: cannot happen on STREAM
                    self._on_chunk(ident, data)
                self._expire(time.monotonic())
        finally:
            self._sock.close(0)
            self._wake_rx.close(0)

    def _send(self, ident: bytes, body: bytes) -> None:
        """Queue one framed message to ``ident``; never blocks (a store never waits on one
        client: a peer that is gone or not reading loses the message)."""
        try:
            if len(body) < _BIG:
                self._sock.send_multipart([ident, frame(body)], zmq.NOBLOCK)
            else:
                self._sock.send_multipart([ident, LENGTH.pack(len(body))], zmq.NOBLOCK)
                self._sock.send_multipart([ident, body], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass

    def _reply(self, ident: bytes | None, rid: int, **fields: Any) -> None:
        if ident is not None:
            self._send(ident, msgpack.packb({"id": rid, **fields}, use_bin_type=True))

    def _drop(self, ident: bytes, refuse: bool = False) -> None:
        """Close the connection ``ident`` (after one REFUSED if ``refuse``)."""
        self._peers.pop(ident, None)
        self._pending.pop(ident, None)
        if refuse:
            self._send(ident, REFUSED)
        try:
            self._sock.send_multipart([ident, b""], zmq.NOBLOCK)  # empty: close it
        except zmq.ZMQError:
            pass
        self._gone[ident] = None
        if len(self._gone) > MAX_GONE:
            self._gone.popitem(last=False)

    def _on_chunk(self, ident: bytes, data: bytes) -> None:
        peer = self._peers.get(ident)
        if not data:                         # ZeroMQ's notice of a connect or a disconnect
            if peer is not None:
                self._peers.pop(ident)
                self._pending.pop(ident, None)
            elif ident not in self._gone:
                self._welcome(ident)
            return
        if peer is None:
            return                           # late bytes of a connection already closed
        try:
            frames = peer.reader.feed(data)
        except ProtocolError:
            self._drop(ident, refuse=not peer.authed)
            return
        for body in frames:
            if peer.authed:
                self._on_request(ident, body)
            elif not self._on_handshake(ident, peer, bytes(body)):
                self._drop(ident, refuse=True)
                return

    def _welcome(self, ident: bytes) -> None:
        """A new connection: admit it as unauthenticated, evicting the oldest if full."""
        while len(self._pending) >= MAX_PENDING_AUTH:
            self._drop(next(iter(self._pending)))
        peer = _Peer(time.monotonic() + AUTH_DEADLINE)
        self._peers[ident] = peer
        self._pending[ident] = peer

    def _on_handshake(self, ident: bytes, peer: _Peer, body: bytes) -> bool:
        """Advance ``peer``'s handshake by one message; False: refuse it."""
        if peer.nonce_s is None:
            if body != HELLO:
                return False
            peer.nonce_s = os.urandom(NONCE_LEN)
            self._send(ident, MAGIC + peer.nonce_s)
            return True
        if len(body) != NONCE_LEN + MAC_LEN:
            return False
        nonce_c, proof = body[:NONCE_LEN], body[NONCE_LEN:]
        if not hmac.compare_digest(proof, hmac_proof(self._key, CLIENT_LABEL, peer.nonce_s,
                                                     nonce_c)):
            return False
        peer.authed = True
        peer.reader.limit = self._max_bytes
        self._pending.pop(ident, None)
        self._send(ident, hmac_proof(self._key, SERVER_LABEL, nonce_c, peer.nonce_s))
        return True

    def _on_request(self, ident: bytes, body: bytearray) -> None:
        try:
            req = msgpack.unpackb(body, raw=False, strict_map_key=True)
            rid = req["id"]
            op = req["op"]
            if not isinstance(rid, int) or not isinstance(op, str):
                raise TypeError("id must be an int and op a string")
        except Exception:  # noqa: BLE001 - an authenticated but broken client
            self._send(ident, msgpack.packb({"id": -1, "ok": False, "error": "bad-request",
                                             "message": "undecodable request"}))
            return
        try:
            handler = getattr(self, "_op_" + op, None)
            if handler is None:
                raise ValueError(f"unknown operation {op!r}")
            # a quiet request's reply is not sent: the client does not read it anyway
            quiet = req.get("reply", True) is False and op in _QUIET_OPS
            handler(None if quiet else ident, rid, req)
        except (KeyError, TypeError, ValueError) as exc:
            self._reply(ident, rid, ok=False, error="bad-request", message=str(exc))

    @staticmethod
    def _key_of(req: dict, field: str = "key") -> str:
        key = req[field]
        if not isinstance(key, str) or len(key) > MAX_KEY:
            raise ValueError(f"{field} must be a string of at most {MAX_KEY} characters")
        return key

    def _park(self, ident: bytes, rid: int, timeout: Any, what: str) -> _Parked:
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError("timeout must be a non-negative number of seconds")
        parked = _Parked(ident, rid, time.monotonic() + timeout, what)
        heap = self._deadlines
        if len(heap) >= self._compact_at:
            # An answered wait stays in the heap until its deadline: a pool's ranks park a
            # 30 s wait per task and are answered within a millisecond, so drop the
            # answered ones now and then (amortised: the next look is twice as far).
            heap[:] = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)
            self._compact_at = max(_COMPACT_MIN, 2 * len(heap))
        heapq.heappush(heap, (parked.deadline, next(self._tie), parked))
        return parked

    def _op_set(self, ident: bytes, rid: int, req: dict) -> None:
        key, value = self._key_of(req), req["value"]
        if not isinstance(value, bytes):
            raise TypeError("value must be bytes")
        self._put(key, value)
        self._reply(ident, rid, ok=True)

    def _put(self, key: str, value: bytes) -> None:
        self._data[key] = value
        for parked in self._getters.pop(key, ()):
            if parked.done:
                continue
            if parked.keys is None:
                parked.done = True
                self._reply(parked.ident, parked.rid, ok=True, value=value)
            else:
                parked.left -= 1
                if parked.left == 0:
                    self._answer_wait(parked)

    def _op_get(self, ident: bytes, rid: int, req: dict) -> None:
        key = self._key_of(req)
        if key in self._data:
            self._reply(ident, rid, ok=True, value=self._data[key])
            return
        parked = self._park(ident, rid, req["timeout"], f"key {key!r}")
        self._getters.setdefault(key, []).append(parked)

    def _op_wait(self, ident: bytes, rid: int, req: dict) -> None:
        keys = req["keys"]
        if not isinstance(keys, list) or not all(isinstance(k, str) and len(k) <= MAX_KEY
                                                 for k in keys):
            raise ValueError(f"keys must be a list of strings of at most {MAX_KEY} characters")
        parked = self._park(ident, rid, req["timeout"], "wait")
        parked.keys, parked.take = list(dict.fromkeys(keys)), bool(req.get("take", False))
        missing = [k for k in parked.keys if k not in self._data]
        parked.left = len(missing)
        for key in missing:
            # drop the earlier waits' entries already answered (a caller that waits in
            # slices leaves one per slice on each key still unset)
            parked_on = [p for p in self._getters.get(key, ()) if not p.done]
            parked_on.append(parked)
            self._getters[key] = parked_on
        if not missing:
            self._answer_wait(parked)

    def _answer_wait(self, parked: _Parked) -> None:
        """Reply to a wait with the values of its keys that are set, up to the size cap.

        The cap counts each entry's key and framing too: the client refuses a reply past
        ``PYCOMM_STORE_MAX_BYTES`` plus a little, and a taken value it refused would be lost.
        """
        parked.done = True
        values: dict[str, bytes] = {}
        size = 0
        for key in parked.keys or ():
            value = self._data.get(key)
            if value is None:
                continue
            entry = len(value) + len(key.encode()) + _ENTRY_OVERHEAD
            if values and size + entry > self._max_bytes:
                continue
            size += entry
            values[key] = self._data.pop(key) if parked.take else value
        self._reply(parked.ident, parked.rid, ok=True, value=values)

    def _op_add(self, ident: bytes, rid: int, req: dict) -> None:
        key, delta = self._key_of(req), req["delta"]
        if not isinstance(delta, int):
            raise TypeError("delta must be an int")
        try:
            value = int(self._data.get(key, b"0")) + delta
        except ValueError:
            raise ValueError(f"key {key!r} does not hold a counter") from None
        self._put(key, str(value).encode())
        self._reply(ident, rid, ok=True, value=value)

    def _op_delete(self, ident: bytes, rid: int, req: dict) -> None:
        existed = self._data.pop(self._key_of(req), None) is not None
        self._reply(ident, rid, ok=True, value=existed)

    def _op_barrier(self, ident: bytes, rid: int, req: dict) -> None:
        name, n = self._key_of(req, "name"), req["n"]
        if not isinstance(n, int) or n < 1:
            raise ValueError("n must be a positive int")
        want, waiting = self._barriers.get(name, (n, []))
        if want != n:
            raise ValueError(f"barrier {name!r} entered with n={n}, others use n={want}")
        waiting = [p for p in waiting if not p.done]
        waiting.append(self._park(ident, rid, req["timeout"], f"barrier {name!r}"))
        if len(waiting) < n:
            self._barriers[name] = (n, waiting)
            return
        self._barriers.pop(name, None)  # released: the name can be used again
        for parked in waiting:
            parked.done = True
            self._reply(parked.ident, parked.rid, ok=True)

    def _expire(self, now: float) -> None:
        while self._pending:
            ident, peer = next(iter(self._pending.items()))
            if peer.deadline > now:
                break
            self._drop(ident)           # too slow to authenticate: a stranger, or stuck
        while self._deadlines and self._deadlines[0][0] <= now:
            parked = heapq.heappop(self._deadlines)[2]
            if parked.keys is not None and not parked.done:
                self._answer_wait(parked)   # with the keys that are set
            elif not parked.done:
                parked.done = True
                self._reply(parked.ident, parked.rid, ok=False, error="timeout",
                            message=f"{parked.what} not ready in time")
