"""The rendezvous store: key-value semantics, timeouts, and refusal of strangers."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from pycomm.errors import ArgumentError, CommError, CommTimeoutError, ProtocolError
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
from pycomm.launch.store_client import StoreClient

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


def test_a_store_that_ends_during_a_call_is_a_comm_error_saying_so():
    # a rank waiting on the store when its host (a launcher, or rank 0 under torchrun)
    # ends gets a CommError that says the store is gone, not the connect-time retry's
    # private error
    srv = StoreServer(TOKEN)
    cli = connect(srv, timeout=10.0)
    threading.Timer(0.3, srv.close).start()
    t0 = time.monotonic()
    with pytest.raises(CommError, match="the job's store is gone") as err:
        cli.get("never-set", timeout=8.0)
    assert type(err.value) is CommError and time.monotonic() - t0 < 5
    cli.close()


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


def test_wait_answers_once_every_key_is_set(server, client):
    client.set("w/0", b"zero")

    def later():
        with connect(server) as other:
            time.sleep(0.2)
            other.set("w/2", b"two")
            other.set("w/1", b"one", answer=False)   # the close still delivers it
    thread = threading.Thread(target=later)
    start = time.monotonic()
    thread.start()
    got = client.wait(["w/0", "w/1", "w/2"], timeout=5.0)
    assert 0.15 < time.monotonic() - start < 3.0
    assert got == {"w/0": b"zero", "w/1": b"one", "w/2": b"two"}
    thread.join(5)
    assert client.get("w/1") == b"one"          # not taken


def test_wait_times_out_with_the_keys_that_are_set_and_take_deletes_them(client):
    client.set("t/a", b"A")
    start = time.monotonic()
    assert client.wait(["t/a", "t/b"], timeout=0.3, take=True) == {"t/a": b"A"}
    assert 0.25 < time.monotonic() - start < 2.0
    assert client.delete("t/a") is False
    assert client.wait(["t/b"], timeout=0.0) == {}
    client.set("t/b", b"B", answer=False)
    assert client.wait(["t/b", "t/b"], timeout=1.0, take=True) == {"t/b": b"B"}
    assert client.wait([], timeout=5.0) == {}


def test_wait_reply_is_capped_at_the_store_limit(monkeypatch):
    monkeypatch.setenv("PYCOMM_STORE_MAX_BYTES", "3000")
    with StoreServer(TOKEN) as srv, connect(srv) as cli:
        for i in range(3):
            cli.set(f"big/{i}", bytes([i]) * 1200)
        first = cli.wait([f"big/{i}" for i in range(3)], timeout=1.0, take=True)
        assert len(first) == 2                  # 3600 bytes would not fit
        rest = cli.wait([f"big/{i}" for i in range(3) if f"big/{i}" not in first], timeout=1.0)
        assert {**first, **rest} == {f"big/{i}": bytes([i]) * 1200 for i in range(3)}


def test_wait_reply_of_many_small_keys_counts_the_keys_too(monkeypatch):
    # 400 values of 160 bytes (64,000 bytes) under a 65,536-byte cap: with their keys and
    # framing they do not fit one reply, and a reply the client refused would lose what
    # 'take' deleted
    monkeypatch.setenv("PYCOMM_STORE_MAX_BYTES", "65536")
    keys = [f"pool/done/1/{r}" for r in range(400)]
    with StoreServer(TOKEN) as srv, connect(srv) as cli:
        for k in keys:
            cli.set(k, k.encode().ljust(160, b"."), answer=False)
        got: dict = {}
        for _ in range(4):
            got.update(cli.wait([k for k in keys if k not in got], timeout=1.0, take=True))
            if len(got) == len(keys):
                break
        assert got == {k: k.encode().ljust(160, b".") for k in keys}


def test_answered_waits_do_not_pile_up_in_the_deadline_heap():
    # a pool's ranks park a 30 s get per task, answered within a millisecond: the heap of
    # deadlines must not keep them all until they expire
    with StoreServer(TOKEN) as srv, connect(srv) as setter, connect(srv) as getter:
        for i in range(1500):
            getter._send(msgpack.packb({"op": "get", "id": 10 ** 6 + i, "key": f"h/{i}",
                                        "timeout": 30.0}, use_bin_type=True))
            setter.set(f"h/{i}", b"v")          # answers the parked get at once
        assert getter.get("h/1499") == b"v"     # (the replies above are skipped by id)
        assert len(srv._deadlines) < 1100, len(srv._deadlines)


def test_an_unanswered_request_with_a_key_the_store_refuses_raises_here(client):
    with pytest.raises(ArgumentError, match="at most 4096 characters"):
        client.set("k" * 5000, b"v", answer=False)
    with pytest.raises(ArgumentError, match="at most 4096 characters"):
        client.delete("k" * 5000, answer=False)
    client.set("k", b"v", answer=False)
    assert client.get("k") == b"v"              # the connection is in step


def test_unanswered_requests_keep_order_and_get_no_reply(client):
    replies = []
    feed = client._reader.feed

    def spy(data):
        frames = feed(data)
        replies.extend(frames)
        return frames
    client._reader.feed = spy
    client.set("o", b"1", answer=False)
    assert client.delete("o", answer=False) is None
    client.set("o", b"2", answer=False)
    assert client.get("o") == b"2"
    assert [msgpack.unpackb(r)["id"] for r in replies] == [client._rid]   # the get's only


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


def test_unreachable_store_times_out():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=str(port)):
        StoreClient("127.0.0.1", port, TOKEN, timeout=0.3)
    assert time.monotonic() - start < 2.0


def test_a_client_that_does_not_wait_for_the_server_fails_at_once_on_a_refusal():
    """The stall inspector's client (wait_for_server=False): a refused connection means the
    store is gone, a CommError naming it at once; the start-up client retries until its
    timeout, since the server may not listen yet."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]              # closed from here on: connections refused
    t0 = time.monotonic()
    with pytest.raises(CommError, match=rf"store at 127.0.0.1:{port} is gone"):
        StoreClient("127.0.0.1", port, secrets.token_hex(16), timeout=5.0,
                    wait_for_server=False)
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError):
        StoreClient("127.0.0.1", port, secrets.token_hex(16), timeout=0.5)
    assert time.monotonic() - t0 >= 0.5


def test_a_store_that_cannot_bind_leaves_no_context_to_the_collector():
    """A store whose bind fails destroys its zmq context itself. Left to the collector in a
    reference cycle with its socket (an exception kept in a frame makes one: the spawn
    root's verdict does), the context's finalizer waited forever in term() for the
    socket whose weak reference the collection had already cleared: a later call that
    happened to collect hung."""
    program = (
        "import gc, zmq\n"
        "from pycomm.launch.store import StoreServer\n"
        "def fail():\n"
        "    try:\n"
        "        StoreServer('00' * 32, '192.0.2.1')    # TEST-NET-1: no interface here\n"
        "    except zmq.ZMQError as exc:\n"
        "        kept = exc     # frame -> exception -> traceback -> frame: a cycle\n"
        "        return kept\n"
        "fail()\n"
        "gc.collect()\n"
        "print('collected', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "collected\n", proc.stderr
