"""The rendezvous store: key-value semantics, timeouts, and refusal of strangers."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time

import msgpack
import pytest
import zmq

from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError
from pycomm.store import (
    HELLO,
    MAGIC,
    NONCE_LEN,
    REFUSED,
    StoreClient,
    StoreServer,
    hmac_proof,
    normalize_token,
)

TOKEN = secrets.token_hex(32)


@pytest.fixture
def server():
    with StoreServer(TOKEN) as srv:
        yield srv


@pytest.fixture
def client(server):
    with StoreClient(server.host, server.port, TOKEN, timeout=5.0) as cli:
        yield cli


def connect(server, token=TOKEN, timeout=5.0) -> StoreClient:
    return StoreClient(server.host, server.port, token, timeout=timeout)


# -- key-value semantics --------------------------------------------------------------------

def test_set_get_overwrite_delete(client):
    client.set("a", b"1")
    assert client.get("a") == b"1"
    client.set("a", b"\x00binary\xff")
    assert client.get("a") == b"\x00binary\xff"
    assert client.delete("a") is True
    assert client.delete("a") is False


def test_get_waits_for_a_later_set(server, client):
    def later():
        with connect(server) as other:
            time.sleep(0.2)
            other.set("late", b"here")

    thread = threading.Thread(target=later)
    start = time.monotonic()
    thread.start()
    assert client.get("late", timeout=5.0) == b"here"
    assert 0.15 < time.monotonic() - start < 3.0
    thread.join(5)


def test_get_times_out_naming_the_key(client):
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match="missing-key"):
        client.get("missing-key", timeout=0.3)
    assert 0.25 < time.monotonic() - start < 2.0
    client.set("after", b"ok")  # the late timeout reply does not confuse the next request
    assert client.get("after") == b"ok"


def test_add_is_an_atomic_counter(server):
    def bump():
        with connect(server) as cli:
            for _ in range(50):
                cli.add("counter", 1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    with connect(server) as cli:
        assert cli.add("counter", 0) == 200
        assert cli.add("counter", -5) == 195
        assert cli.get("counter") == b"195"
        cli.set("text", b"abc")
        with pytest.raises(CommError, match="counter"):
            cli.add("text", 1)


@pytest.mark.parametrize("n", [1, 3])
def test_barrier_releases_all_and_resets(server, n):
    released = []

    def enter(i):
        with connect(server) as cli:
            for round_ in range(2):  # the same name works again once released
                cli.barrier("b", n, timeout=5.0)
                released.append((round_, i))

    threads = [threading.Thread(target=enter, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(released) == sorted((r, i) for r in range(2) for i in range(n))


def test_barrier_times_out(client):
    with pytest.raises(CommTimeoutError, match="barrier 'lonely'"):
        client.barrier("lonely", 2, timeout=0.2)


def test_token_forms_are_one_key(server):
    for token in (TOKEN, TOKEN.encode(), bytes.fromhex(TOKEN), TOKEN.upper()):
        with connect(server, token) as cli:
            cli.set("k", b"v")
    assert normalize_token(bytes.fromhex(TOKEN)) == TOKEN.encode()
    assert normalize_token("not-hex secret") == b"not-hex secret"


def test_hmac_proof_is_hmac_sha256():
    import hashlib
    import hmac
    assert hmac_proof(b"k", b"a", b"b") == hmac.new(b"k", b"ab", hashlib.sha256).digest()


# -- strangers --------------------------------------------------------------------------------

def replies(sock, wait=0.5) -> list[bytes]:
    got, deadline = [], time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            got.append(sock.recv())
    return got


@pytest.fixture
def stranger(server):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{server.host}:{server.port}")
    yield sock
    sock.close(0)


def test_wrong_token_is_refused(server, client):
    client.set("secret", b"value")
    with pytest.raises(ProtocolError, match="refused"):
        connect(server, "ab" * 32)
    assert client.get("secret") == b"value"  # the server survives


def test_stranger_without_handshake_gets_one_refusal_only(server, client, stranger):
    client.set("secret", b"value")
    get = msgpack.packb({"op": "get", "id": 1, "key": "secret", "timeout": 0})
    for message in (get, b"junk", HELLO, get):
        stranger.send(message)
    assert replies(stranger) == [REFUSED]
    assert client.get("secret") == b"value"


def test_stranger_with_a_wrong_proof_learns_nothing(server, client, stranger):
    client.set("secret", b"value")
    stranger.send(HELLO)
    challenge = replies(stranger, 0.3)
    assert len(challenge) == 1 and challenge[0].startswith(MAGIC)
    stranger.send(os.urandom(NONCE_LEN) + os.urandom(32))
    stranger.send(msgpack.packb({"op": "get", "id": 1, "key": "secret", "timeout": 0}))
    assert replies(stranger) == [REFUSED]
    assert b"value" not in b"".join(challenge)
    assert client.get("secret") == b"value"


def test_raw_tcp_junk_does_not_hurt(server, client):
    for junk in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"\xff" * 10 + b"\x7f"):
        with socket.create_connection((server.host, server.port), timeout=2) as raw:
            raw.sendall(junk)
            time.sleep(0.05)
    client.set("still", b"alive")
    assert client.get("still") == b"alive"


def test_oversized_message_drops_the_sender(monkeypatch):
    monkeypatch.setenv("PYCOMM_STORE_MAX_BYTES", "1024")
    with StoreServer(TOKEN) as srv, connect(srv) as cli:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{srv.host}:{srv.port}")
        try:
            sock.send(b"\0" * 4096)
            assert replies(sock, 0.3) == []
        finally:
            sock.close(0)
        with pytest.raises(ArgumentError, match="PYCOMM_STORE_MAX_BYTES"):
            cli.set("big", b"x" * 4096)  # refused before a byte moves
        with connect(srv) as fresh:
            fresh.set("small", b"ok")
            assert fresh.get("small") == b"ok"


def test_client_rejects_a_server_without_the_token():
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")

    def impostor():
        ident, _hello = fake.recv_multipart()
        fake.send_multipart([ident, MAGIC + os.urandom(NONCE_LEN)])
        ident, _proof = fake.recv_multipart()
        fake.send_multipart([ident, os.urandom(32)])  # cannot compute the real answer

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(ProtocolError, match="prove"):
            StoreClient("127.0.0.1", port, TOKEN, timeout=3.0)
    finally:
        thread.join(5)
        fake.close(0)


def test_unreachable_store_times_out():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=str(port)):
        StoreClient("127.0.0.1", port, TOKEN, timeout=0.3)
    assert time.monotonic() - start < 2.0
