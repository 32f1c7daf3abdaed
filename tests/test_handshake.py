"""The HMAC handshake of TCP connections (transports/handshake.py), and the Gate.

A Connector and an Acceptor (or an Admission) are driven by handing each one's output to
the other, as the TCP transport does, with no socket; attacks are made by changing the
bytes in between. The last tests put a Gate (transports/connect.py) on a loopback listener.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time

import pytest

from transports import HandshakeError
from transports.handshake import (
    BLOB_LEN,
    CHALL,
    HELLO,
    MAGIC,
    MAX_BLOB,
    OK,
    VERSION,
    Acceptor,
    Admission,
    Connector,
)
from transports.connect import Gate, dial

TOKEN = b"job-secret-" + bytes(range(21))
WORLD = 4


def handshake(connector: Connector, acceptor: Acceptor, tamper=lambda step, data: data):
    """Run the four messages; ``tamper(step, data)`` may rewrite each one in flight."""
    chall = acceptor.on_hello(tamper("hello", connector.hello()))
    proof = connector.on_challenge(tamper("chall", chall))
    ok = acceptor.on_proof(tamper("proof", proof))
    connector.on_ok(tamper("ok", ok))
    return acceptor.peer_rank


def proof_for(token: bytes, nonce_a: bytes, nonce_c: bytes, rank_c: int) -> bytes:
    """PROOF as the module docstring defines it: HMAC(k, "C" | nonce_a | nonce_c | rank_c)."""
    return hmac.new(token, b"C" + nonce_a + nonce_c + struct.pack("<i", rank_c),
                    hashlib.sha256).digest()


@pytest.mark.parametrize("crank,arank", [(1, 0), (0, 3), (3, 2)])
def test_pair_succeeds_and_learns_the_peer_rank(crank, arank):
    assert handshake(Connector(TOKEN, crank, arank), Acceptor(TOKEN, arank, WORLD)) == crank


def test_messages_have_the_documented_sizes():
    c, a = Connector(TOKEN, 1, 0), Acceptor(TOKEN, 0, WORLD)
    hello = c.hello()
    chall = a.on_hello(hello)
    proof = c.on_challenge(chall)
    assert (len(hello), len(chall), len(proof), len(a.on_proof(proof))) == (42, 68, 32, 4)


def test_fresh_nonces_each_time():
    assert Connector(TOKEN, 1, 0).hello() != Connector(TOKEN, 1, 0).hello()
    a1, a2 = Acceptor(TOKEN, 0, WORLD), Acceptor(TOKEN, 0, WORLD)
    hello = Connector(TOKEN, 1, 0).hello()
    assert a1.on_hello(hello) != a2.on_hello(hello)


def test_wrong_token_connector_side():
    """An acceptor without the token cannot prove itself to a connector that has it."""
    c = Connector(TOKEN, 1, 0)
    with pytest.raises(HandshakeError, match="authentication"):
        c.on_challenge(Acceptor(b"another job's token", 0, WORLD).on_hello(c.hello()))


def test_wrong_token_acceptor_side():
    """A connector without the token cannot prove itself to an acceptor that has it."""
    a = Acceptor(TOKEN, 0, WORLD)
    c = Connector(b"another job's token", 1, 0)
    chall = a.on_hello(c.hello())
    nonce_a = CHALL.unpack(chall)[0]
    # The formula is right: with the right key the same construction is accepted...
    good = Acceptor(TOKEN, 0, WORLD)
    good_chall = good.on_hello(c.hello())
    assert good.on_proof(proof_for(TOKEN, CHALL.unpack(good_chall)[0], c.nonce, 1)) == OK
    # ...and with the wrong key it is refused.
    with pytest.raises(HandshakeError, match="authentication"):
        a.on_proof(proof_for(b"another job's token", nonce_a, c.nonce, 1))


@pytest.mark.parametrize("garbage", [
    b"", b"\x00" * 41, b"\x00" * 43, os.urandom(1000), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    HELLO.pack(b"XXXX", VERSION, 1, b"n" * 32), HELLO.pack(MAGIC, VERSION + 1, 1, b"n" * 32),
], ids=["empty", "short", "long", "random", "http", "bad-magic", "bad-version"])
def test_garbage_hello_rejected(garbage):
    a = Acceptor(TOKEN, 0, WORLD)
    with pytest.raises(HandshakeError):
        a.on_hello(garbage)
    assert a.peer_rank == -1


@pytest.mark.parametrize("claimed", [-1, WORLD, 2**31 - 1, 0], ids=["negative", "size",
                                                                   "huge", "own-rank"])
def test_hello_with_invalid_rank_rejected(claimed):
    with pytest.raises(HandshakeError, match="invalid rank"):
        Acceptor(TOKEN, 0, WORLD).on_hello(HELLO.pack(MAGIC, VERSION, claimed, b"n" * 32))


def test_rank_rewritten_in_flight_is_rejected():
    """A man in the middle turns 'I am rank 1' into 'I am rank 2': the proof binds the rank."""
    def tamper(step, data):
        if step == "hello":
            magic, version, _, nonce = HELLO.unpack(data)
            return HELLO.pack(magic, version, 2, nonce)
        return data
    with pytest.raises(HandshakeError, match="claiming rank 2"):
        handshake(Connector(TOKEN, 1, 0), Acceptor(TOKEN, 0, WORLD), tamper)


def test_acceptor_claiming_the_wrong_rank_is_rejected():
    c = Connector(TOKEN, 1, expected_peer=0)
    with pytest.raises(HandshakeError, match="expected rank 0, peer says 2"):
        c.on_challenge(Acceptor(TOKEN, 2, WORLD).on_hello(c.hello()))


def test_challenge_rank_rewritten_in_flight_is_rejected():
    c = Connector(TOKEN, 1, expected_peer=3)
    chall = Acceptor(TOKEN, 2, WORLD).on_hello(c.hello())
    nonce, _, proof = CHALL.unpack(chall)
    with pytest.raises(HandshakeError, match="authentication"):
        c.on_challenge(CHALL.pack(nonce, 3, proof))


@pytest.mark.parametrize("step", ["chall", "proof"])
def test_flipped_bit_rejected(step):
    def tamper(s, data):
        return bytes([data[0], *data[1:-1], data[-1] ^ 1]) if s == step else data
    with pytest.raises(HandshakeError):
        handshake(Connector(TOKEN, 1, 0), Acceptor(TOKEN, 0, WORLD), tamper)


@pytest.mark.parametrize("length", [0, 31, 33, 68])
def test_wrong_length_challenge_and_proof_rejected(length):
    c = Connector(TOKEN, 1, 0)
    with pytest.raises(HandshakeError):
        c.on_challenge(b"\x01" * length)
    a = Acceptor(TOKEN, 0, WORLD)
    a.on_hello(Connector(TOKEN, 1, 0).hello())
    with pytest.raises(HandshakeError):
        a.on_proof(b"\x01" * length)


def test_replayed_proof_rejected():
    """A proof recorded from one session is useless against a fresh acceptor nonce."""
    c = Connector(TOKEN, 1, 0)
    hello = c.hello()
    proof = c.on_challenge(Acceptor(TOKEN, 0, WORLD).on_hello(hello))
    replay = Acceptor(TOKEN, 0, WORLD)
    replay.on_hello(hello)
    with pytest.raises(HandshakeError):
        replay.on_proof(proof)


def test_reflected_challenge_is_not_a_proof():
    """An attacker without the token opens a second connection with the acceptor's nonce
    as its own and replays the acceptor's answer as its proof: the "A"/"C" labels differ."""
    a = Acceptor(TOKEN, 0, WORLD)
    a.on_hello(HELLO.pack(MAGIC, VERSION, 1, b"c" * 32))
    nonce_a = a.nonce
    mirror = Acceptor(TOKEN, 0, WORLD)
    _, _, reflected = CHALL.unpack(mirror.on_hello(HELLO.pack(MAGIC, VERSION, 1, nonce_a)))
    with pytest.raises(HandshakeError):
        a.on_proof(reflected)


def test_proof_before_hello_rejected():
    with pytest.raises(HandshakeError):
        Acceptor(TOKEN, 0, WORLD).on_proof(b"\x00" * 32)


@pytest.mark.parametrize("data", [b"", b"PYC", b"NOPE", OK + b"x"])
def test_refusal_instead_of_ok_detected(data):
    with pytest.raises(HandshakeError):
        Connector.on_ok(data)


# -- Admission: the acceptor's side over a byte stream, and the Gate that drives it --------

def admit(connector: Connector, adm: Admission, chunk: int, blob: bytes | None = None):
    """Drive ``adm`` with the connector's bytes ``chunk`` at a time; return what it sent."""
    def feed(data: bytes) -> bytes:
        out, i = b"", 0
        while i < len(data):
            n = min(chunk, adm.want())
            assert n > 0
            out += adm.receive(data[i:i + n])
            i += n
        return out

    sent = feed(connector.hello())
    assert len(sent) == CHALL.size
    sent = feed(connector.on_challenge(sent))
    connector.on_ok(sent[:len(OK)])
    if blob is not None:
        feed(BLOB_LEN.pack(len(blob)) + blob)
    return sent[len(OK):]


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_admission_byte_by_byte_or_whole(chunk):
    adm = Admission(TOKEN, 0, WORLD)
    assert admit(Connector(TOKEN, 2, 0), adm, chunk) == b""
    assert adm.done and adm.peer_rank == 2 and adm.want() == 0


@pytest.mark.parametrize("blob", [b"", b"address" * 10, b"x" * MAX_BLOB],
                         ids=["empty", "70B", "max"])
def test_admission_greets_and_reads_the_blob(blob):
    adm = Admission(TOKEN, 0, WORLD, greeting=b"GREETING")
    assert admit(Connector(TOKEN, 1, 0), adm, 7, blob) == b"GREETING"
    assert adm.done and adm.blob == blob


def test_admission_never_reads_past_a_message():
    adm = Admission(TOKEN, 0, WORLD)
    assert adm.want() == HELLO.size
    with pytest.raises(HandshakeError, match="expected"):
        adm.receive(Connector(TOKEN, 1, 0).hello() + b"extra")


def test_admission_refuses_a_long_blob_and_a_wrong_proof():
    adm = Admission(TOKEN, 0, WORLD, greeting=b"")
    c = Connector(TOKEN, 1, 0)
    chall = adm.receive(c.hello())
    adm.receive(c.on_challenge(chall))
    with pytest.raises(HandshakeError, match="address"):
        adm.receive(BLOB_LEN.pack(MAX_BLOB + 1))
    adm = Admission(TOKEN, 0, WORLD)
    stranger = Connector(b"wrong token", 1, 0)
    adm.receive(stranger.hello())
    with pytest.raises(HandshakeError, match="authentication"):
        adm.receive(os.urandom(32))
    assert not adm.done


def test_dial_retries_after_an_eviction():
    """The first connection is closed before the challenge (as a full Gate evicts its
    oldest); dial connects again and authenticates through the Gate."""
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]

    def evict_first_then_admit():
        sock, _ = lst.accept()
        sock.close()
        gate = Gate(lst, lambda: Admission(TOKEN, 0, WORLD))
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for s, adm in gate.poll(0.2):
                    admitted.append(adm.peer_rank)
                    s.close()
                    return
        finally:
            gate.close()

    admitted: list[int] = []
    thread = threading.Thread(target=evict_first_then_admit)
    thread.start()
    sock, _ = dial("127.0.0.1", port, lambda: Connector(TOKEN, 3, 0), time.monotonic() + 5)
    sock.close()
    thread.join(5)
    assert admitted == [3]


def test_gate_keeps_the_newest_strangers_and_admits_a_peer():
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    gate = Gate(lst, lambda: Admission(TOKEN, 0, WORLD), max_pending=4, deadline_s=0.5)
    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    dialled: list[socket.socket] = []
    try:
        for _ in range(5):
            gate.poll(0.05)
        assert gate.pending == 4
        assert strangers[0].recv(1) == b"" and strangers[1].recv(1) == b""   # evicted
        peer = threading.Thread(target=lambda: dialled.append(dial(
            "127.0.0.1", port, lambda: Connector(TOKEN, 1, 0), time.monotonic() + 5)[0]))
        peer.start()
        admitted: list = []
        deadline = time.monotonic() + 5
        while not admitted and time.monotonic() < deadline:
            admitted += gate.poll(0.05)
        peer.join(5)
        assert [adm.peer_rank for _, adm in admitted] == [1] and len(dialled) == 1
        admitted[0][0].close()
        time.sleep(0.6)
        gate.poll(0.05)
        assert gate.pending == 0            # the silent ones are gone at their deadline
    finally:
        gate.close()
        for s in strangers + dialled:
            s.close()
