"""The rendezvous store's authentication (pycomm.launch.store): strangers, raw or with a
wrong token or proof, learn nothing and are closed; the client holds little of a server
that has not proved itself. Key-value semantics and timeouts: tests/test_store.py."""

from __future__ import annotations

import os
import socket
import threading
import time

import msgpack
import pytest

from pycomm.errors import ArgumentError, CommError, ProtocolError
from pycomm.launch.store import (
    AUTH_DEADLINE,
    HELLO,
    LENGTH,
    MAGIC,
    MAX_AUTH_FRAME,
    MAX_PENDING_AUTH,
    NONCE_LEN,
    REFUSED,
    FrameReader,
    StoreServer,
    frame,
    hmac_proof,
    normalize_token,
)
from conftest import STORE_TOKEN as TOKEN     # (the store fixtures': server, client)
from pycomm.launch.store_client import StoreClient
from test_store import connect


# -- strangers --------------------------------------------------------------------------------

def replies(sock, wait=0.5) -> tuple[list[bytes], bool]:
    """The store messages a raw connection gets within ``wait`` s, and whether it closed."""
    reader, got = FrameReader(1 << 20), []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return got, True
        if not data:
            return got, True
        got.extend(bytes(f) for f in reader.feed(data))
    return got, False


@pytest.fixture
def stranger(server):
    with socket.create_connection((server.host, server.port), timeout=2) as sock:
        yield sock


def test_wrong_token_is_refused(server, client):
    client.set("secret", b"value")
    with pytest.raises(ProtocolError, match="refused"):
        connect(server, "ab" * 32)
    assert client.get("secret") == b"value"  # the server survives


def test_stranger_without_handshake_gets_one_refusal_and_is_closed(server, client, stranger):
    client.set("secret", b"value")
    get = msgpack.packb({"op": "get", "id": 1, "key": "secret", "timeout": 0})
    stranger.sendall(frame(get) + frame(b"junk") + frame(HELLO) + frame(get))
    assert replies(stranger) == ([REFUSED], True)
    assert client.get("secret") == b"value"


def test_stranger_with_a_wrong_proof_learns_nothing(server, client, stranger):
    client.set("secret", b"value")
    stranger.sendall(frame(HELLO))
    challenge, closed = replies(stranger, 0.3)
    assert len(challenge) == 1 and challenge[0].startswith(MAGIC) and not closed
    stranger.sendall(frame(os.urandom(NONCE_LEN) + os.urandom(32)))
    stranger.sendall(frame(msgpack.packb({"op": "get", "id": 1, "key": "secret",
                                          "timeout": 0})))
    assert replies(stranger) == ([REFUSED], True)
    assert b"value" not in b"".join(challenge)
    assert client.get("secret") == b"value"


def test_raw_tcp_junk_does_not_hurt(server, client):
    for junk in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"\xff" * 10 + b"\x7f"):
        with socket.create_connection((server.host, server.port), timeout=2) as raw:
            raw.sendall(junk)
            time.sleep(0.05)
    client.set("still", b"alive")
    assert client.get("still") == b"alive"


def test_long_frame_before_authentication_is_refused_at_once(server, client, stranger):
    stranger.sendall(LENGTH.pack(MAX_AUTH_FRAME + 1))  # only the announcement: no body yet
    assert replies(stranger) == ([REFUSED], True)
    client.set("still", b"alive")
    assert client.get("still") == b"alive"


def test_idle_stranger_is_closed_at_the_authentication_deadline(server, client, stranger):
    stranger.sendall(frame(HELLO))
    challenge, closed = replies(stranger, AUTH_DEADLINE / 2)
    assert len(challenge) == 1 and not closed
    assert replies(stranger, AUTH_DEADLINE + 1.0) == ([], True)


def test_pending_strangers_are_capped_oldest_first(server, client):
    socks = [socket.create_connection((server.host, server.port), timeout=2)
             for _ in range(MAX_PENDING_AUTH + 8)]
    try:
        time.sleep(0.3)
        closed = [replies(s, 0.005)[1] for s in socks]
        assert closed == [True] * 8 + [False] * MAX_PENDING_AUTH
        with connect(server) as late:     # a real client still gets in, and stays in
            late.set("late", b"in")
            assert client.get("late") == b"in"
    finally:
        for s in socks:
            s.close()


def test_oversized_request_drops_the_sender(monkeypatch):
    monkeypatch.setenv("PYCOMM_STORE_MAX_BYTES", "1024")
    with StoreServer(TOKEN) as srv, connect(srv) as cli:
        with pytest.raises(ArgumentError, match="PYCOMM_STORE_MAX_BYTES"):
            cli.set("big", b"x" * 4096)  # refused before a byte moves
        cli._send(msgpack.packb({"op": "set", "id": 99, "key": "big", "value": b"x" * 2048}))
        with pytest.raises(CommError, match="closed the connection"):
            cli.get("anything", timeout=1.0)
        with connect(srv) as fresh:
            fresh.set("small", b"ok")
            assert fresh.get("small") == b"ok"


def test_large_values_round_trip():
    value = os.urandom(3 << 20)
    with StoreServer(TOKEN) as srv, connect(srv) as a, connect(srv) as b:
        a.set("big", value)
        assert b.get("big") == value


def test_frame_reader_splits_and_joins_frames():
    reader = FrameReader(16)
    stream = frame(b"abc") + frame(b"") + frame(b"x" * 16)
    got = [bytes(f) for i in range(len(stream)) for f in reader.feed(stream[i:i + 1])]
    assert got == [b"abc", b"", b"x" * 16]
    assert [bytes(f) for f in FrameReader(16).feed(stream)] == got
    with pytest.raises(ProtocolError, match="17 bytes"):
        FrameReader(16).feed(LENGTH.pack(17))


def test_client_rejects_a_server_without_the_token():
    fake = socket.create_server(("127.0.0.1", 0))
    port = fake.getsockname()[1]

    def impostor():
        conn, _ = fake.accept()
        with conn:
            reader = FrameReader(1024)
            conn.recv(64)                                           # the hello
            conn.sendall(frame(MAGIC + os.urandom(NONCE_LEN)))
            while not reader.feed(conn.recv(1024)):                # the proof
                pass
            conn.sendall(frame(os.urandom(32)))     # cannot compute the real answer

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(ProtocolError, match="prove"):
            StoreClient("127.0.0.1", port, TOKEN, timeout=3.0)
    finally:
        thread.join(5)
        fake.close()


def test_client_holds_little_of_a_server_that_has_not_proved_itself():
    fake = socket.create_server(("127.0.0.1", 0))
    port = fake.getsockname()[1]

    def announce_a_huge_challenge():
        conn, _ = fake.accept()
        with conn:
            conn.recv(64)
            conn.sendall(LENGTH.pack(1 << 30))
            conn.recv(1)

    thread = threading.Thread(target=announce_a_huge_challenge)
    thread.start()
    try:
        with pytest.raises(ProtocolError, match="exceeds"):
            StoreClient("127.0.0.1", port, TOKEN, timeout=3.0)
    finally:
        thread.join(5)
        fake.close()


def test_client_connects_again_when_closed_before_the_challenge():
    """A server full of unauthenticated connections evicts the oldest (closes it without a
    REFUSED): the client tries again on a new connection instead of failing."""
    key = normalize_token(TOKEN)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []

    def evict_first_then_answer():
        first, _ = server.accept()
        accepted.append(first)
        first.close()
        conn, _ = server.accept()
        accepted.append(conn)
        with conn:
            reader, got = FrameReader(64), []
            while len(got) < 1:
                got += reader.feed(conn.recv(64))
            assert bytes(got[0]) == HELLO
            nonce_s = os.urandom(NONCE_LEN)
            conn.sendall(frame(MAGIC + nonce_s))
            while len(got) < 2:
                got += reader.feed(conn.recv(128))
            nonce_c = bytes(got[1][:NONCE_LEN])
            conn.sendall(frame(hmac_proof(key, b"pycomm-store/server", nonce_c, nonce_s)))
            conn.recv(1)        # until the client closes

    thread = threading.Thread(target=evict_first_then_answer)
    thread.start()
    try:
        StoreClient("127.0.0.1", port, TOKEN, timeout=5.0).close()
    finally:
        thread.join(5)
        server.close()
    assert len(accepted) == 2
