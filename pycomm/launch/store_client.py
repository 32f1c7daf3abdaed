"""The rendezvous store's client: one authenticated TCP connection to a :class:`~pycomm.launch.store.StoreServer`.

The wire format, the handshake and the requests are described in :mod:`pycomm.launch.store`.
"""

from __future__ import annotations

import hmac
import os
import socket
import time
from typing import Any

import msgpack

from pycomm import config
from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError
from pycomm.launch.store_wire import (CLIENT_LABEL, MAX_KEY, FrameReader, HELLO, LENGTH, MAC_LEN, MAGIC, MAX_AUTH_FRAME, NONCE_LEN, REFUSED, REPLY_GRACE, SERVER_LABEL, _BIG, frame, hmac_proof, normalize_token)

__all__ = ["StoreClient"]


class _ClosedEarly(CommError):
    """The server closed the connection (without a REFUSED) before it answered."""


class StoreClient:
    """A connection to a :class:`StoreServer`; use it from one thread at a time.

    Args:
        host: the server's address (``PYCOMM_MASTER_ADDR``).
        port: the server's TCP port (``PYCOMM_MASTER_PORT``).
        token: the job secret (see :func:`normalize_token` for accepted forms).
        timeout: default seconds for connecting plus the handshake, and for every
            blocking call. A server that is not listening yet is retried until then.
        wait_for_server: False for a client made once the server is known to be up (the
            stall inspector's): a refused connection then means the server is gone, a
            CommError at once rather than retries for ``timeout`` seconds.

    Raises:
        CommTimeoutError: the server did not complete the handshake within ``timeout``.
        ProtocolError: the server refused us (wrong token) or failed to prove itself.
    """

    def __init__(self, host: str, port: int, token: bytes | str, *, timeout: float,
                 wait_for_server: bool = True):
        self.timeout = float(timeout)
        self._wait_for_server = wait_for_server
        self.address = f"{host}:{port}"
        self._key = normalize_token(token)
        self._max_bytes = int(config.get("PYCOMM_STORE_MAX_BYTES"))
        self._reader = FrameReader(MAX_AUTH_FRAME)     # until the server has proved itself
        self._frames: list[bytearray] = []
        self._rid = 0
        deadline = time.monotonic() + self.timeout
        while True:
            self._sock = self._connect(host, port, deadline)
            try:
                self._handshake(deadline)
                # A reply carries the value and a few fields around it.
                self._reader.limit = self._max_bytes + 4096
                break
            except _ClosedEarly:
                # Evicted by a server full of unauthenticated connections, or past its
                # deadline: try again with a fresh connection while time is left.
                self._sock.close()
                self._reader, self._frames = FrameReader(MAX_AUTH_FRAME), []
                time.sleep(0.01)
            except BaseException:
                self._sock.close()
                raise

    def _connect(self, host: str, port: int, deadline: float) -> socket.socket:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeoutError(f"store at {self.address}: no answer to the "
                                       f"authentication hello within {self.timeout:g} s")
            try:
                sock = socket.create_connection((host, port), timeout=min(left, 1.0))
            except ConnectionRefusedError as exc:
                if not self._wait_for_server:
                    raise CommError(f"store at {self.address} is gone: {exc}") from None
                # not listening yet (a rank may start before rank 0)
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
                continue
            except OSError:          # not reachable yet
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def _send(self, body: bytes) -> None:
        self._sock.settimeout(self.timeout)
        try:
            if len(body) < _BIG:
                self._sock.sendall(frame(body))
            else:
                self._sock.sendall(LENGTH.pack(len(body)))
                self._sock.sendall(body)
        except TimeoutError:
            raise CommTimeoutError(f"store at {self.address} did not take a request within "
                                   f"{self.timeout:g} s") from None
        except OSError as exc:
            raise CommError(f"store at {self.address}: connection lost ({exc})") from None

    def _recv_raw(self, deadline: float, what: str) -> bytearray:
        """The next message from the server, waiting until ``deadline`` (monotonic s)."""
        while not self._frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommTimeoutError(f"store at {self.address}: no answer to {what} "
                                       f"within {self.timeout:g} s")
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            except OSError as exc:
                raise CommError(f"store at {self.address}: connection lost during {what} "
                                f"({exc})") from None
            if not data:
                raise _ClosedEarly(f"store at {self.address} closed the connection during "
                                   f"{what}")
            try:
                self._frames.extend(self._reader.feed(data))
            except ProtocolError as exc:
                raise ProtocolError(f"store at {self.address} during {what}: {exc}") from None
        return self._frames.pop(0)

    def _handshake(self, deadline: float) -> None:
        """Authenticate on the fresh connection (see the module docstring).

        Raises:
            _ClosedEarly: the server closed the connection without refusing us.
            ProtocolError, CommTimeoutError: as the class says.
        """
        try:
            self._send(HELLO)
        except CommError as exc:
            raise _ClosedEarly(str(exc)) from None
        chall = self._recv_raw(deadline, "the authentication hello")
        if chall == REFUSED:
            raise ProtocolError(f"store at {self.address} refused us")
        if len(chall) != len(MAGIC) + NONCE_LEN or not chall.startswith(MAGIC):
            raise ProtocolError(f"store at {self.address} is not a pycomm store")
        nonce_s, nonce_c = chall[len(MAGIC):], os.urandom(NONCE_LEN)
        try:
            self._send(nonce_c + hmac_proof(self._key, CLIENT_LABEL, nonce_s, nonce_c))
        except CommError as exc:
            raise _ClosedEarly(str(exc)) from None
        answer = self._recv_raw(deadline, "the authentication proof")
        if answer == REFUSED:
            raise ProtocolError(f"store at {self.address} refused us (wrong PYCOMM_JOB_TOKEN?)")
        want = hmac_proof(self._key, SERVER_LABEL, nonce_c, nonce_s)
        if len(answer) != MAC_LEN or not hmac.compare_digest(answer, want):
            raise ProtocolError(f"store at {self.address} failed to prove it holds the job "
                                "token; not talking to it")

    def _call(self, op: str, what: str, wait: float, answer: bool = True,
              **fields: Any) -> Any:
        """Send one request and return its reply's value; ``wait`` is the server-side wait.
        With ``answer`` False, return None once it is sent (its reply is skipped later)."""
        if self._sock.fileno() < 0:
            raise CommError("store client is closed")
        self._rid += 1
        rid = self._rid
        if not answer:
            # the store's refusal of an unanswered request would be lost: check here
            key = fields.get("key")
            if not isinstance(key, str) or len(key) > MAX_KEY:
                raise ArgumentError(f"store {op} of {what}: a key is a string of at most "
                                    f"{MAX_KEY} characters")
            fields["reply"] = False
        body = msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)
        if len(body) > self._max_bytes:
            raise ArgumentError(f"store {op} of {what}: {len(body)} bytes exceed the store's "
                                f"limit of {self._max_bytes} (PYCOMM_STORE_MAX_BYTES)")
        self._send(body)
        if not answer:
            return None
        deadline = time.monotonic() + wait + REPLY_GRACE
        while True:
            try:
                raw = self._recv_raw(deadline, f"{op} of {what}")
            except _ClosedEarly as exc:     # (public from here: the retry is connect's)
                raise CommError(f"{exc}: the job's store is gone (the process that hosts "
                                "it, a launcher or the rank that runs it, has ended)"
                                ) from None
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

    def set(self, key: str, value: bytes, *, answer: bool = True) -> None:
        """Store ``value`` (bytes) under ``key``, waking every ``get`` parked on it.

        With ``answer`` False, return as soon as the request is sent: the store applies it
        before this client's next request, and this client never waits for the reply.

        Raises:
            ArgumentError: ``value`` is not bytes, or exceeds ``PYCOMM_STORE_MAX_BYTES``.
            CommError: the store refused it (only when ``answer``).
        """
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ArgumentError(f"store value for {key!r} must be bytes, got {type(value)}")
        self._call("set", f"key {key!r}", 0.0, answer, key=key, value=bytes(value))

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

    def wait(self, keys: list[str], timeout: float | None = None, *,
             take: bool = False) -> dict[str, bytes]:
        """Return the values of ``keys``, once all are set or after ``timeout`` seconds.

        One round trip, however many keys. The result maps each key that was set to its
        value; a key missing from it was not set in time, or did not fit into one reply
        (at most ``PYCOMM_STORE_MAX_BYTES`` of values): call again for the rest.

        Args:
            keys: the keys.
            timeout: seconds to wait (default: the client's timeout). Running out is not
                an error: the result then lacks the keys still unset.
            take: delete the keys returned, in the same step.
        """
        wait = self._wait_for(timeout)
        return self._call("wait", f"{len(keys)} keys", wait, keys=list(keys), timeout=wait,
                          take=bool(take))

    def delete(self, key: str, *, answer: bool = True) -> bool | None:
        """Remove ``key``; return whether it existed.

        With ``answer`` False, return None as soon as the request is sent, as :meth:`set`
        says.
        """
        return self._call("delete", f"key {key!r}", 0.0, answer, key=key)

    def barrier(self, name: str, n: int, timeout: float | None = None) -> None:
        """Return once ``n`` clients have entered the barrier ``name`` (then it resets).

        Raises:
            CommTimeoutError: fewer than ``n`` arrived within ``timeout`` seconds.
        """
        wait = self._wait_for(timeout)
        self._call("barrier", f"barrier {name!r}", wait, name=name, n=int(n), timeout=wait)

    def close(self) -> None:
        """Close the socket. Idempotent."""
        self._sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
