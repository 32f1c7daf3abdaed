"""The rendezvous store: key-value semantics and timeouts (its authentication:
tests/test_store_auth.py)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from conftest import STORE_TOKEN
from pycomm.errors import ArgumentError, CommError, CommTimeoutError
from pycomm.launch.store import StoreServer, hmac_proof, normalize_token
from pycomm.launch.store_client import StoreClient

TOKEN = STORE_TOKEN      # the store fixtures' (conftest.py: server, client)


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
