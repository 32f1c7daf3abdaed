"""Strangers on the machine: no unauthenticated peer can block, slow or bloat a job.

A pycomm job listens in three places: the rendezvous store (a thread of the process that
owns the :class:`pycomm.Pool`), the tcp transport's start-up listener, and the rdma NIC's
listener, which stays open for the whole job. For each, a live job must keep producing
correct results at normal speed while local strangers, without the job token,

* (a) hold many idle connections,
* (b) trickle bytes (a slow loris),
* (c) send random and adversarial bytes (hypothesis): random bytes, huge length prefixes,
  a ZMTP greeting with a 128 MiB frame, well-formed handshakes with a wrong token,

and the resident memory (``VmRSS``) of the process behind the listener must not grow by
more than a few MiB. Speed is checked with a generous bound (a fixed number of calls
within a few seconds), never a timing micro-assertion. Only loopback is ever targeted.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
import uuid

import cloudpickle
import msgpack
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pycomm
from pycomm.p2p import Engine
from pycomm.launch.store import HELLO, StoreServer
from transports import get_transport_class, handshake

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIB = 1 << 20
RSS_SLACK_MIB = 6        # growth allowed while strangers are attached
IDLE = 20                # idle connections per listener
CALLS = 200              # all-reduces per timed task
CALLS_WITHIN_S = 5.0     # they complete in well under a second without strangers


# -- observing processes --------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    return psutil.Process(pid).memory_info().rss / MIB


def listening_ports(pid: int) -> list[int]:
    """The loopback TCP ports ``pid`` listens on."""
    return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip in ("127.0.0.1", "::1")]


_ZEROS_64K = bytes(64 * 1024)


def frame(body: bytes) -> bytes:
    """A store message: u32 little-endian length, then the body."""
    return struct.pack("<I", len(body)) + body


# -- the strangers --------------------------------------------------------------------------

ZMTP_GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
                 + b"\0" + b"\0" * 31)
_READY = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER" + b"\x08Identity" + \
    struct.pack(">I", 0)
ZMTP_READY = b"\x04" + bytes([len(_READY)]) + _READY
ZMTP_HUGE_FRAME = b"\x02" + struct.pack(">Q", 128 * MIB)
# What a stranger sends before streaming filler: a plausible start, then a huge length.
BLOAT_HEADS = [ZMTP_GREETING + ZMTP_READY + ZMTP_HUGE_FRAME,
               struct.pack("<I", 2 ** 31),
               frame(HELLO) + struct.pack("<I", 2 ** 30)]


class Strangers:
    """Connections a local stranger opens to one listener; close() ends them all."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def _open(self, host: str, port: int) -> socket.socket:
        assert host in LOOPBACK, f"only loopback may be targeted, not {host}"
        sock = socket.create_connection((host, port), timeout=2)
        self.socks.append(sock)
        return sock

    def idle(self, host: str, port: int, n: int) -> None:
        """(a) ``n`` connections that never send a byte."""
        for _ in range(n):
            self._open(host, port)

    def loris(self, host: str, port: int, n: int, data: bytes, every_s: float = 0.05) -> None:
        """(b) ``n`` connections that each send ``data``, one byte every ``every_s`` s."""
        for _ in range(n):
            sock = self._open(host, port)
            self._spawn(self._trickle, sock, data, every_s)

    def bloat(self, host: str, port: int, mib: int) -> None:
        """Per head of BLOAT_HEADS, a connection that sends it and then ``mib`` MiB of filler
        (or until the listener closes it); the connection stays open afterwards."""
        for head in BLOAT_HEADS:
            sock = self._open(host, port)
            self._spawn(self._stream, sock, head, mib)

    def send(self, host: str, port: int, data: bytes | tuple[bytes, int]) -> None:
        """(c) one connection that sends ``data`` and stays open; ``(head, kib)`` sends
        ``head`` and then ``kib`` KiB of zeros (streamed: nothing that large is built)."""
        sock = self._open(host, port)
        head, kib = data if isinstance(data, tuple) else (data, 0)
        try:
            sock.sendall(head)
            for _ in range(kib // 64):
                sock.sendall(_ZEROS_64K)
        except OSError:
            pass            # the listener already hung up on it: that is its right

    def settle(self, timeout: float = 20.0) -> None:
        """Wait until every bloating stream has been sent or refused."""
        for t in self.threads:
            if t.name == "bloat":
                t.join(timeout)

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True,
                             name="bloat" if fn == self._stream else "loris")
        t.start()
        self.threads.append(t)

    def _trickle(self, sock: socket.socket, data: bytes, every_s: float) -> None:
        for i in range(len(data)):
            if self.stop.wait(every_s):
                return
            try:
                sock.send(data[i:i + 1])
            except OSError:
                return

    def _stream(self, sock: socket.socket, head: bytes, mib: int) -> None:
        filler = b"\0" * (256 * 1024)
        try:
            sock.sendall(head)
            for _ in range(mib * 4):
                if self.stop.is_set():
                    return
                sock.sendall(filler)
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)
        for sock in self.socks:
            sock.close()
        self.socks.clear()


@pytest.fixture
def strangers():
    s = Strangers()
    yield s
    s.close()


# A handshake with the wrong token, as a slow loris sends it (3.9 s for the store's, 3.7 s
# for the transports' at 20 bytes/s: longer than any handshake deadline).
STORE_LORIS = frame(HELLO) + frame(os.urandom(64))
NIC_LORIS = handshake.Connector(b"not the token", 5, 0).hello() + os.urandom(32)


# -- the job --------------------------------------------------------------------------------

def allreduce_calls(n: int) -> tuple[bool, float]:
    """On every rank: ``n`` all-reduces of rank+1 (float64 x 8); (all correct?, seconds)."""
    comm = pycomm.COMM_WORLD
    send = np.full(8, comm.rank + 1.0)
    recv = np.empty(8)
    want = comm.size * (comm.size + 1) / 2
    ok = True
    start = time.perf_counter()
    for i in range(n):
        send[0] = comm.rank + 1.0 + i
        comm.Allreduce(send, recv)
        ok = ok and recv[0] == want + comm.size * i and bool(np.all(recv[1:] == want))
    return ok, time.perf_counter() - start


def check_job(pool: pycomm.Pool, calls: int = CALLS, within: float = CALLS_WITHIN_S) -> None:
    """``calls`` all-reduces on every rank of ``pool`` are all correct and take < ``within`` s."""
    start = time.monotonic()
    results = pool.run(allreduce_calls, calls, timeout=within + 10)
    took = time.monotonic() - start
    assert all(ok for ok, _ in results), results
    assert took < within, f"{calls} all-reduces took {took:.1f} s with strangers attached"


@pytest.fixture(scope="module")
def shm_pool(own_ranks_only):
    with pycomm.Pool(2, transport="shm", timeout=30) as pool:
        yield pool


@pytest.fixture(scope="module")
def rdma_pool(own_ranks_only):
    with pycomm.Pool(2, transport="rdma", timeout=30) as pool:
        yield pool


@pytest.fixture(scope="module")
def own_ranks_only():
    """Close the suite's shared pool first (module-wide, unlike conftest's
    ``no_shared_world``), so that only this module's ranks compete for the cores."""
    from conftest import _CACHE
    _CACHE.close()


def nic_ports(pool: pycomm.Pool) -> list[int]:
    ports = [p for pid in pool.pids for p in listening_ports(pid)]
    assert len(ports) == len(pool.pids), ports    # one NIC listener per rank
    return ports


def store_of(pool: pycomm.Pool) -> StoreServer:
    return pool._group.store


# -- (a) + (b) + bloat, per listener --------------------------------------------------------

def test_store_serves_the_job_through_idle_slow_and_bloating_strangers(shm_pool, strangers):
    store = store_of(shm_pool)
    check_job(shm_pool)
    before = rss_mib(os.getpid())
    strangers.idle(store.host, store.port, IDLE)
    strangers.loris(store.host, store.port, 4, STORE_LORIS)
    strangers.bloat(store.host, store.port, mib=32)
    strangers.settle()
    for _ in range(20):                 # every task goes through the store, twice per rank
        check_job(shm_pool, calls=10, within=2.0)
    grown = rss_mib(os.getpid()) - before
    assert grown < RSS_SLACK_MIB, f"the store's process grew by {grown:.0f} MiB"


def test_rdma_job_runs_at_speed_with_strangers_on_every_nic(rdma_pool, strangers):
    check_job(rdma_pool)
    before = [rss_mib(pid) for pid in rdma_pool.pids]
    for port in nic_ports(rdma_pool):
        strangers.idle("127.0.0.1", port, IDLE)
        strangers.loris("127.0.0.1", port, 2, NIC_LORIS)
        strangers.bloat("127.0.0.1", port, mib=8)
    check_job(rdma_pool)
    strangers.settle()
    check_job(rdma_pool)
    grown = [rss_mib(pid) - b for pid, b in zip(rdma_pool.pids, before)]
    assert max(grown) < RSS_SLACK_MIB, f"ranks grew by {grown} MiB"


def test_tcp_start_up_is_not_held_by_strangers_who_connect_first(own_ranks_only,
                                                                 monkeypatch, strangers):
    """Every rank's listener gets its strangers before any peer can know its address."""
    put = StoreServer._put

    def put_after_strangers(self, key: str, value: bytes) -> None:
        if key.startswith("tcp/") and key.count("/") == 2 and key.rsplit("/", 1)[1].isdigit():
            host, port = msgpack.unpackb(value)[:2]   # [host, port, hostname]
            strangers.idle(host, port, IDLE)
            strangers.loris(host, port, 2, NIC_LORIS)
            strangers.send(host, port, handshake.Connector(b"x" * 32, 1, 0).hello())
        put(self, key, value)

    monkeypatch.setattr(StoreServer, "_put", put_after_strangers)
    start = time.monotonic()
    with pycomm.Pool(3, transport="tcp", timeout=12) as pool:
        took = time.monotonic() - start
        assert len(strangers.socks) == 3 * (IDLE + 3)   # every listener was attacked
        check_job(pool)
    assert took < 8.0, f"start-up took {took:.1f} s with strangers queued first"


# -- (c) random and adversarial frames (hypothesis) -----------------------------------------

def adversarial(hello: bytes, proof: st.SearchStrategy[bytes],
                bloat: bool) -> st.SearchStrategy[list]:
    """What strangers send, one element per connection: random bytes, huge length prefixes,
    a ZMTP greeting with a huge frame, ``hello`` cut short, ``hello`` and a wrong ``proof``,
    with random trailing bytes; with ``bloat``, also a huge length prefix followed by up to
    16 MiB, as (head, KiB) for :meth:`Strangers.send` (only where the listener runs on a
    thread of its own, so that the sender cannot stall the test)."""
    one = st.one_of(
        st.binary(max_size=512),
        st.builds(lambda n, tail: struct.pack("<I", n) + tail,
                  st.integers(2 ** 10, 2 ** 32 - 1), st.binary(max_size=64)),
        st.builds(lambda n, tail: ZMTP_GREETING + ZMTP_READY + b"\x02" + struct.pack(">Q", n)
                  + tail, st.integers(2 ** 10, 2 ** 40), st.binary(max_size=64)),
        st.integers(1, len(hello) - 1).map(lambda k: hello[:k]),
        st.builds(lambda p, tail: hello + p + tail, proof, st.binary(max_size=64)),
    )
    if bloat:
        one |= st.tuples(st.sampled_from(BLOAT_HEADS), st.integers(0, 16384))
    return st.lists(one, min_size=1, max_size=4)


FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def store_rss(shm_pool) -> float:
    """The store's process's VmRSS (MiB) before the fuzzing."""
    return rss_mib(os.getpid())


@FUZZ
@given(sends=adversarial(frame(HELLO), st.binary(min_size=64, max_size=64).map(frame),
                         bloat=True))
@example(sends=[(BLOAT_HEADS[0], 16384)])          # a 128 MiB ZMTP frame, 16 MiB of it sent
def test_store_fuzzed_while_the_job_runs(shm_pool, store_rss, sends):
    store = store_of(shm_pool)
    s = Strangers()
    try:
        for data in sends:
            s.send(store.host, store.port, data)
        check_job(shm_pool, calls=5, within=2.0)
        grown = rss_mib(os.getpid()) - store_rss        # the strangers still connected
    finally:
        s.close()
    assert grown < RSS_SLACK_MIB, f"the store's process grew by {grown:.0f} MiB"


@pytest.fixture(scope="module")
def rdma_rss(rdma_pool) -> list[float]:
    """The ranks' VmRSS (MiB) before the fuzzing."""
    return [rss_mib(pid) for pid in rdma_pool.pids]


WRONG_PROOF = st.binary(min_size=handshake.PROOF_LEN, max_size=handshake.PROOF_LEN)


@FUZZ
@given(sends=adversarial(handshake.Connector(b"not the token", 7, 0).hello(), WRONG_PROOF,
                         bloat=True))
@example(sends=[NIC_LORIS[:10]])                    # a hello cut short, then silence
def test_rdma_nics_fuzzed_while_the_job_runs(rdma_pool, rdma_rss, sends):
    s = Strangers()
    try:
        for port in nic_ports(rdma_pool):
            for data in sends:
                s.send("127.0.0.1", port, data)
        check_job(rdma_pool, calls=20, within=2.0)
        grown = [rss_mib(pid) - b for pid, b in zip(rdma_pool.pids, rdma_rss)]
    finally:
        s.close()
    assert max(grown) < RSS_SLACK_MIB, f"ranks grew by {grown} MiB"


class _AttackedStore:
    """A two-rank in-memory store that lets ``attack(host, port)`` at rank 0's listener
    before rank 1 can read its address (published as ``[host, port, hostname]``)."""

    def __init__(self, attack):
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()
        self.attack = attack

    def set(self, key, value):
        if key.endswith("/0"):
            host, port = msgpack.unpackb(value)[:2]
            self.attack(host, port)
        with self.cv:
            self.data[key] = value
            self.cv.notify_all()

    def get(self, key, timeout=None):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, timeout or 10):
                raise TimeoutError(key)
            return self.data[key]


@pytest.fixture(scope="module")
def tcp_rss() -> float:
    """This process's VmRSS (MiB) before the fuzzing."""
    return rss_mib(os.getpid())


@FUZZ
@given(sends=adversarial(handshake.Connector(b"not the token", 1, 0).hello(), WRONG_PROOF,
                         bloat=False))
@example(sends=[b""])                               # connected, and silent
def test_tcp_start_up_fuzzed(tcp_rss, sends):
    """Two tcp transports (in this process) connect and move a message while rank 0's
    listener holds the strangers' connections, which arrived first."""
    s = Strangers()
    store = _AttackedStore(lambda host, port: [s.send(host, port, d) for d in sends])
    job = "h" + uuid.uuid4().hex[:8]
    engines = [Engine(r, 2, eager_limit=4096, spin_s=0.0, timeout=10.0) for r in range(2)]
    cls = get_transport_class("tcp")
    ts = [cls(r, 2, job, b"k" * 32, engines[r]) for r in range(2)]
    errors: list[Exception] = []

    def connect(r):
        try:
            ts[r].connect(store, [1 - r], 4.0)
            engines[r].attach(ts[r], [1 - r])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        start = time.monotonic()
        threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert not errors, errors
        assert time.monotonic() - start < 2.0, "start-up held up by strangers"
        out = np.zeros(16, np.uint8)
        recv = engines[0].irecv(out.data, 1, 0, 3)
        sent = np.arange(16, dtype=np.uint8)
        send = engines[1].isend(sent.data, 0, 0, 3)
        done = threading.Thread(target=engines[1].wait_all, args=([send],), kwargs={"timeout": 5})
        done.start()
        engines[0].wait_all([recv], timeout=5)
        done.join(5)
        assert np.array_equal(out, sent)
    finally:
        for t in ts:
            t.close()
        s.close()
    grown = rss_mib(os.getpid()) - tcp_rss
    assert grown < RSS_SLACK_MIB, f"the process grew by {grown:.0f} MiB"
