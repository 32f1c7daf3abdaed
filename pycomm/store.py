"""The rendezvous store: an authenticated key-value server over pyzmq, and its client.

One :class:`StoreServer` per job runs in a daemon thread of the process that hosts the
rendezvous (the launcher, :class:`pycomm.spawn.Pool`, or rank 0 under a torchrun-style
launcher) on a ROUTER socket. Every rank talks to it through a :class:`StoreClient` (a
DEALER socket, confined to the thread that uses it). Values are opaque bytes; the store
never unpickles anything. Requests and replies are msgpack maps.

Authentication comes before anything else (HMAC-SHA256 challenge-response with the job
token, mutual). The handshake messages are fixed-size binary, so nothing a stranger sends
is decoded before it has proved it holds the token::

    C -> S   HELLO    b"PYCS" version(1)                                        5 bytes
    S -> C   CHALL    b"PYCS" nonce_s(32)                                      36 bytes
    C -> S   PROOF    nonce_c(32) HMAC(k, "pycomm-store/client" | nonce_s | nonce_c)  64 bytes
    S -> C   WELCOME  HMAC(k, "pycomm-store/server" | nonce_c | nonce_s)      32 bytes
         or  REFUSED  b"PYCS-REFUSED"                                          12 bytes

A peer identity that sends anything else, or a wrong proof, gets exactly one REFUSED and
is ignored from then on. Clients pick a random 16-byte routing id (first byte non-zero),
so a stranger can neither predict it nor take over an authenticated session; a second
connection claiming a live id is rejected by ZeroMQ (``ROUTER_HANDOVER`` stays off).
Request size is capped by ``ZMQ_MAXMSGSIZE`` (``PYCOMM_STORE_MAX_BYTES``): a peer sending a
larger message is disconnected by ZeroMQ before the server sees a byte of it.

Requests after authentication (``id`` is the client's request number; replies echo it)::

    {"op": "set", "id", "key", "value"}            -> {"id", "ok": True}
    {"op": "get", "id", "key", "timeout"}          -> {"id", "ok": True, "value"}   (parked)
    {"op": "add", "id", "key", "delta"}            -> {"id", "ok": True, "value": int}
    {"op": "delete", "id", "key"}                  -> {"id", "ok": True, "value": bool}
    {"op": "barrier", "id", "name", "n", "timeout"} -> {"id", "ok": True}            (parked)
    failure                                        -> {"id", "ok": False, "error", "message"}

A parked request is answered when it can be, or with ``error="timeout"`` at its deadline.
Counters made by ``add`` are stored as ASCII decimal, so ``get`` on a counter reads b"3".
"""

from __future__ import annotations

import hashlib
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
from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError

__all__ = ["StoreClient", "StoreServer", "hmac_proof", "normalize_token"]

MAGIC = b"PYCS"
VERSION = 1
HELLO = MAGIC + bytes([VERSION])
NONCE_LEN = 32
MAC_LEN = 32
REFUSED = b"PYCS-REFUSED"
CLIENT_LABEL = b"pycomm-store/client"
SERVER_LABEL = b"pycomm-store/server"
MAX_KEY = 4096          # bytes of a key or barrier name
MAX_REFUSED = 4096      # refused identities remembered (oldest forgotten first)
MAX_PENDING_AUTH = 1024  # identities between HELLO and PROOF
REPLY_GRACE = 5.0       # seconds a client waits beyond a request's own timeout


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


def _endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class _Parked:
    """A request waiting on the server: a get on a missing key, or a barrier entrant."""

    __slots__ = ("deadline", "done", "ident", "rid", "what")

    def __init__(self, ident: bytes, rid: int, deadline: float, what: str):
        self.ident, self.rid, self.deadline, self.what = ident, rid, deadline, what
        self.done = False


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
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(config.get("PYCOMM_STORE_MAX_BYTES")))
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
        # State below is touched only by the server thread.
        self._data: dict[str, bytes] = {}
        self._getters: dict[str, list[_Parked]] = {}
        self._barriers: dict[str, tuple[int, list[_Parked]]] = {}
        self._deadlines: list[tuple[float, int, _Parked]] = []
        self._tie = itertools.count()
        self._authed: set[bytes] = set()
        self._challenged: OrderedDict[bytes, bytes] = OrderedDict()
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"pycomm-store:{self.port}",
                                        daemon=True)
        self._thread.start()

    # -- lifecycle -----------------------------------------------------------------------

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
                wait_ms = 1000
                if self._deadlines:
                    wait_ms = max(0, min(wait_ms, int((self._deadlines[0][0] - time.monotonic())
                                                      * 1000) + 1))
                events = dict(poller.poll(wait_ms))
                if self._wake_rx in events:
                    break
                for _ in range(1000):  # drain, but let deadlines run now and then
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._on_message(frames)
                self._expire(time.monotonic())
        finally:
            self._sock.close(0)
            self._wake_rx.close(0)

    def _send(self, ident: bytes, body: bytes) -> None:
        try:
            self._sock.send_multipart([ident, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or not reading; a store never blocks on one client

    def _reply(self, ident: bytes, rid: int, **fields: Any) -> None:
        self._send(ident, msgpack.packb({"id": rid, **fields}, use_bin_type=True))

    def _refuse(self, ident: bytes) -> None:
        self._challenged.pop(ident, None)
        self._refused[ident] = None
        if len(self._refused) > MAX_REFUSED:
            self._refused.popitem(last=False)
        self._send(ident, REFUSED)

    def _on_message(self, frames: list[bytes]) -> None:
        ident = frames[0]
        if ident in self._refused:
            return
        body = frames[1] if len(frames) == 2 else None
        if ident in self._authed:
            if body is None:
                return  # malformed framing from an authenticated peer: drop it
            self._on_request(ident, body)
            return
        nonce_s = self._challenged.pop(ident, None)
        if nonce_s is None:
            if body != HELLO:
                self._refuse(ident)
                return
            nonce_s = os.urandom(NONCE_LEN)
            self._challenged[ident] = nonce_s
            if len(self._challenged) > MAX_PENDING_AUTH:
                self._challenged.popitem(last=False)
            self._send(ident, MAGIC + nonce_s)
            return
        if body is None or len(body) != NONCE_LEN + MAC_LEN:
            self._refuse(ident)
            return
        nonce_c, proof = body[:NONCE_LEN], body[NONCE_LEN:]
        if not hmac.compare_digest(proof, hmac_proof(self._key, CLIENT_LABEL, nonce_s, nonce_c)):
            self._refuse(ident)
            return
        self._authed.add(ident)
        self._send(ident, hmac_proof(self._key, SERVER_LABEL, nonce_c, nonce_s))

    def _on_request(self, ident: bytes, body: bytes) -> None:
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
            handler(ident, rid, req)
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
        heapq.heappush(self._deadlines, (parked.deadline, next(self._tie), parked))
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
            if not parked.done:
                parked.done = True
                self._reply(parked.ident, parked.rid, ok=True, value=value)

    def _op_get(self, ident: bytes, rid: int, req: dict) -> None:
        key = self._key_of(req)
        if key in self._data:
            self._reply(ident, rid, ok=True, value=self._data[key])
            return
        parked = self._park(ident, rid, req["timeout"], f"key {key!r}")
        self._getters.setdefault(key, []).append(parked)

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
        while self._deadlines and self._deadlines[0][0] <= now:
            parked = heapq.heappop(self._deadlines)[2]
            if not parked.done:
                parked.done = True
                self._reply(parked.ident, parked.rid, ok=False, error="timeout",
                            message=f"{parked.what} not ready in time")


class StoreClient:
    """A connection to a :class:`StoreServer`; use it from one thread at a time.

    Args:
        host: the server's address (``PYCOMM_MASTER_ADDR``).
        port: the server's TCP port (``PYCOMM_MASTER_PORT``).
        token: the job secret (see :func:`normalize_token` for accepted forms).
        timeout: default seconds for the handshake and for every blocking call.

    Raises:
        CommTimeoutError: the server did not complete the handshake within ``timeout``.
        ProtocolError: the server refused us (wrong token) or failed to prove itself.
    """

    def __init__(self, host: str, port: int, token: bytes | str, *, timeout: float):
        self.timeout = float(timeout)
        self.address = f"{host}:{port}"
        self._key = normalize_token(token)
        self._max_bytes = int(config.get("PYCOMM_STORE_MAX_BYTES"))
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTING_ID, bytes([1 + os.urandom(1)[0] % 255]) +
                              os.urandom(15))
        if ":" in host:
            self._sock.setsockopt(zmq.IPV6, 1)
        self._rid = 0
        try:
            self._sock.connect(_endpoint(host, port))
            self._handshake()
        except BaseException:
            self._sock.close(0)
            raise

    def _recv_raw(self, deadline: float, what: str) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
            raise CommTimeoutError(f"store at {self.address}: no answer to {what} "
                                   f"within {self.timeout:g} s")
        return self._sock.recv()

    def _handshake(self) -> None:
        deadline = time.monotonic() + self.timeout
        self._sock.send(HELLO)
        chall = self._recv_raw(deadline, "the authentication hello")
        if chall == REFUSED:
            raise ProtocolError(f"store at {self.address} refused us")
        if len(chall) != len(MAGIC) + NONCE_LEN or not chall.startswith(MAGIC):
            raise ProtocolError(f"store at {self.address} is not a pycomm store")
        nonce_s, nonce_c = chall[len(MAGIC):], os.urandom(NONCE_LEN)
        self._sock.send(nonce_c + hmac_proof(self._key, CLIENT_LABEL, nonce_s, nonce_c))
        answer = self._recv_raw(deadline, "the authentication proof")
        if answer == REFUSED:
            raise ProtocolError(f"store at {self.address} refused us (wrong PYCOMM_JOB_TOKEN?)")
        want = hmac_proof(self._key, SERVER_LABEL, nonce_c, nonce_s)
        if len(answer) != MAC_LEN or not hmac.compare_digest(answer, want):
            raise ProtocolError(f"store at {self.address} failed to prove it holds the job "
                                "token; not talking to it")

    def _call(self, op: str, what: str, wait: float, **fields: Any) -> Any:
        """Send one request and return its reply's value; ``wait`` is the server-side wait."""
        if self._sock.closed:
            raise CommError("store client is closed")
        self._rid += 1
        rid = self._rid
        body = msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)
        if len(body) > self._max_bytes:
            raise ArgumentError(f"store {op} of {what}: {len(body)} bytes exceed the store's "
                                f"limit of {self._max_bytes} (PYCOMM_STORE_MAX_BYTES)")
        self._sock.send(body)
        deadline = time.monotonic() + wait + REPLY_GRACE
        while True:
            raw = self._recv_raw(deadline, f"{op} of {what}")
            if raw == REFUSED:
                raise ProtocolError(f"store at {self.address} no longer knows us "
                                    "(connection re-established?)")
            reply = msgpack.unpackb(raw, raw=False)
            if reply.get("id") != rid:
                continue  # a late answer to a request that already timed out here
            if reply.get("ok"):
                return reply.get("value")
            if reply.get("error") == "timeout":
                raise CommTimeoutError(f"store at {self.address}: timed out after {wait:g} s "
                                       f"waiting for {what}")
            raise CommError(f"store refused {op} of {what}: {reply.get('message')}")

    def _wait_for(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else max(0.0, float(timeout))

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (bytes) under ``key``, waking every ``get`` parked on it."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ArgumentError(f"store value for {key!r} must be bytes, got {type(value)}")
        self._call("set", f"key {key!r}", 0.0, key=key, value=bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until some client sets it.

        Args:
            key: the key.
            timeout: seconds to wait (default: the client's timeout).

        Raises:
            CommTimeoutError: the key was not set within ``timeout``; the message names it.
        """
        wait = self._wait_for(timeout)
        return self._call("get", f"key {key!r}", wait, key=key, timeout=wait)

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the counter ``key`` (absent counts as 0); return it."""
        return self._call("add", f"key {key!r}", 0.0, key=key, delta=int(delta))

    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it existed."""
        return self._call("delete", f"key {key!r}", 0.0, key=key)

    def barrier(self, name: str, n: int, timeout: float | None = None) -> None:
        """Return once ``n`` clients have entered the barrier ``name`` (then it resets).

        Raises:
            CommTimeoutError: fewer than ``n`` arrived within ``timeout`` seconds.
        """
        wait = self._wait_for(timeout)
        self._call("barrier", f"barrier {name!r}", wait, name=name, n=int(n), timeout=wait)

    def close(self) -> None:
        """Close the socket. Idempotent."""
        if not self._sock.closed:
            self._sock.close(0)

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
