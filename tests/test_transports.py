"""Each transport between two engines in one process (two threads), no launcher.

Covers what the world-level tests reach only by chance: ring wrap-around and streaming of
payloads larger than the ring, queued sends, the rendezvous with and without cross-memory
attach, TCP partial sends and in-place receives, both directions at once, and that a
segment never outlives its set-up.
"""

from __future__ import annotations

import glob
import threading
import uuid

import numpy as np
import pytest

from pycomm.p2p import Engine
from transports import get_transport_class


class DictStore:
    """In-memory rendezvous store with blocking get."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()

    def set(self, key, value):
        with self.cv:
            self.data[key] = value
            self.cv.notify_all()

    def get(self, key, timeout=None):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, timeout or 10):
                raise TimeoutError(key)
            return self.data[key]


def make_pair(name: str, **opts):
    store, job = DictStore(), "t" + uuid.uuid4().hex[:8]
    engines = [Engine(r, 2, eager_limit=4096, spin_s=0.0, timeout=20.0) for r in range(2)]
    cls = get_transport_class(name)
    ts = [cls(r, 2, job, b"k" * 32, engines[r], **opts) for r in range(2)]
    errors = []

    def connect(r):
        try:
            ts[r].connect(store, [1 - r], 10.0)
            engines[r].attach(ts[r], [1 - r])
        except Exception as exc:       # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    return engines, ts, job


def exchange(engines, arrays, tag=1):
    """Both ranks send their array to the other and receive into a fresh one, at once."""
    out = [np.zeros_like(a) for a in arrays]
    errs = []

    def run(r):
        try:
            eng = engines[r]
            rr = eng.irecv(out[r].view(np.uint8).data, 1 - r, 0, tag)
            ss = eng.isend(arrays[r].view(np.uint8).data, 1 - r, 0, tag)
            eng.wait_all([rr, ss], timeout=30)
        except Exception as exc:
            errs.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errs, errs
    return out


CASES = [("shm", {"ring_bytes": 4096, "cma": False}),
         ("shm", {"ring_bytes": 4096, "cma": True}),
         ("shm", {}),
         ("tcp", {})]


@pytest.mark.parametrize("name,opts", CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 100_000, 3_000_000])
def test_exchange_both_ways(name, opts, n):
    engines, ts, job = make_pair(name, **dict(opts))
    try:
        a = (np.arange(n, dtype=np.int64) * 7) % 251
        b = a[::-1].copy()
        out = exchange(engines, [a.astype(np.uint8), b.astype(np.uint8)])
        assert np.array_equal(out[0], b.astype(np.uint8))
        assert np.array_equal(out[1], a.astype(np.uint8))
        # many small messages after a big one keep their order
        small = [np.full(3, i, np.uint8) for i in range(50)]
        recvs = [np.zeros(3, np.uint8) for _ in small]
        rr = [engines[1].irecv(x.data, 0, 0, 2) for x in recvs]
        ss = [engines[0].isend(x.data, 1, 0, 2) for x in small]
        done = threading.Thread(target=engines[0].wait_all, args=(ss,))
        done.start()
        engines[1].wait_all(rr, timeout=10)
        done.join()
        assert [int(x[0]) for x in recvs] == list(range(50))
    finally:
        for t in ts:
            t.close()
    assert not glob.glob(f"/dev/shm/pycomm-{job}-*")


@pytest.mark.parametrize("name", ["shm", "tcp"])
def test_send_now_writes_whole_frames_in_order_or_refuses(name):
    """Engine.send_now (a blocking Send's path without a request) hands a frame over only
    when the transport takes it at once: never on TCP, never past a full shm ring or ahead
    of frames queued before it; what it refuses goes by isend, and the receiver gets every
    message once, in the order sent."""
    engines, ts, job = make_pair(name, **({"ring_bytes": 4096} if name == "shm" else {}))
    try:
        sender, receiver = engines
        sent, refused = [], 0
        for i in range(400):            # 400 x ~50 B: more than the 4 KiB ring holds
            msg = np.full(32, i % 251, np.uint8)
            if sender.send_now(msg.data, 1, 0, 7):
                sent.append(None)
            else:
                refused += 1
                sent.append(sender.isend(msg.data, 1, 0, 7))
        out = [np.zeros(32, np.uint8) for _ in range(400)]
        rr = [receiver.irecv(o.data, 0, 0, 7) for o in out]
        pending = [r for r in sent if r is not None]
        done = threading.Thread(target=sender.wait_all, args=(pending,))
        done.start()
        receiver.wait_all(rr, timeout=20)
        done.join()
        assert [int(o[0]) for o in out] == [i % 251 for i in range(400)]
        assert all((o == o[0]).all() for o in out)
        if name == "tcp":
            assert refused == 400
        else:
            assert 0 < refused < 400 and sent[0] is None
        assert not sender.send_now(np.ones(4, np.uint8).data, 0, 0, 7)   # to itself
    finally:
        for t in ts:
            t.close()
    assert not glob.glob(f"/dev/shm/pycomm-{job}-*")


@pytest.mark.parametrize("name", ["shm", "tcp"])
def test_recv_now_takes_only_the_expected_next_frame(name):
    """Engine.recv_now (a blocking Recv's path without a request) takes a message straight
    from the transport only when it is the next frame from that peer, has exactly the
    expected context and tag, fits, and nothing held by the engine could match first;
    otherwise it leaves every frame for progress (-2), or says none has come yet (-1)."""
    engines, ts, job = make_pair(name, **({"ring_bytes": 4096} if name == "shm" else {}))
    try:
        sender, receiver = engines
        out = np.zeros(16, np.uint8)
        if name == "tcp":           # no such capability: always the general path
            sender.isend(np.full(16, 1, np.uint8).data, 1, 0, 5)
            assert receiver.recv_now(out.data, 0, 0, 5, spin=True) == -2
            return
        assert receiver.recv_now(out.data, 0, 0, 5) == -1              # nothing yet
        assert sender.send_now(np.full(16, 1, np.uint8).data, 1, 0, 4)   # tag 4 first
        assert sender.send_now(np.full(16, 2, np.uint8).data, 1, 0, 5)
        assert receiver.recv_now(out.data, 0, 0, 5) == -2              # tag 4 is next
        r4 = receiver.irecv(np.zeros(16, np.uint8).data, 0, 0, 4)
        assert receiver.recv_now(out.data, 0, 0, 5) == -2              # a posted receive
        receiver.wait(r4, timeout=10)
        # the progress that completed r4 may have taken tag 5 in as unexpected: then the
        # engine holds it and must not read past it
        if receiver.unexpected:
            assert receiver.recv_now(out.data, 0, 0, 5) == -2
            receiver.wait(receiver.irecv(out.data, 0, 0, 5), timeout=10)
        else:
            assert receiver.recv_now(out.data, 0, 0, 5) == 16
        assert (out == 2).all()
        assert sender.send_now(np.full(16, 3, np.uint8).data, 1, 0, 6)
        small = np.zeros(8, np.uint8)
        assert receiver.recv_now(small.data, 0, 0, 6) == -2            # would truncate
        assert receiver.recv_now(out.data, 0, 1, 6) == -2              # other context
        assert receiver.recv_now(out.data, 0, 0, 6, spin=True) == 16 and (out == 3).all()
        assert receiver.recv_now(out.data, 0, 0, 6, spin=True) == -1   # spun, none came
        # frames this rank still owes a peer need progress(): no fast path meanwhile
        owed = [receiver.isend(np.zeros(4000, np.uint8).data, 0, 0, 7) for _ in range(2)]
        assert receiver.transports[0].has_backlog()                   # the ring is full
        assert sender.send_now(np.full(16, 4, np.uint8).data, 1, 0, 6)
        assert receiver.recv_now(out.data, 0, 0, 6, spin=True) == -2
        r7 = [sender.irecv(np.zeros(4000, np.uint8).data, 1, 0, 7) for _ in range(2)]
        done = threading.Thread(target=sender.wait_all, args=(r7,), kwargs={"timeout": 10})
        done.start()
        receiver.wait_all(owed, timeout=10)
        done.join()
        receiver.wait(receiver.irecv(out.data, 0, 0, 6), timeout=10)
        assert (out == 4).all()
    finally:
        for t in ts:
            t.close()
    assert not glob.glob(f"/dev/shm/pycomm-{job}-*")


def test_shm_segments_are_unlinked_after_connect():
    engines, ts, job = make_pair("shm")
    try:
        assert not glob.glob(f"/dev/shm/pycomm-{job}-*")
    finally:
        for t in ts:
            t.close()


def test_tcp_rejects_wrong_token():
    store, job = DictStore(), "t" + uuid.uuid4().hex[:8]
    engines = [Engine(r, 2, eager_limit=64, spin_s=0.0, timeout=5.0) for r in range(2)]
    cls = get_transport_class("tcp")
    ts = [cls(0, 2, job, b"right" * 8, engines[0]), cls(1, 2, job, b"wrong" * 8, engines[1])]
    errors = []

    def connect(r):
        try:
            ts[r].connect(store, [1 - r], 2.0)
        except Exception as exc:
            errors.append((r, exc))

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for t in ts:
        t.close()
    assert {r for r, _ in errors} == {0, 1}
    assert any("authentication" in str(e) or "handshake" in str(e) for _, e in errors)


def test_copy_remote_scatter_gather_and_errors():
    # the one cross-memory-attach copy shm and the emulated NIC share: uneven iovec lists
    # of the same total copy byte for byte (here within this process), both directions,
    # and a failed call returns the errno (a pid that does not exist: ESRCH), raising
    # nothing
    import errno
    import os
    from transports.linux import copy_remote

    src = np.arange(1000, dtype=np.uint8)
    dst = np.zeros(1000, dtype=np.uint8)
    s, d = src.ctypes.data, dst.ctypes.data
    local = [(d, 10), (d + 10, 590), (d + 600, 400)]
    remote = [(s, 300), (s + 300, 700)]
    assert copy_remote(False, os.getpid(), local, remote) == 0
    assert np.array_equal(dst, src)
    back = np.zeros(1000, dtype=np.uint8)
    assert copy_remote(True, os.getpid(), [(s, 1000)],
                       [(back.ctypes.data, 999), (back.ctypes.data + 999, 1)]) == 0
    assert np.array_equal(back, src)
    assert copy_remote(False, 2 ** 22 + 12345, [(d, 8)], [(s, 8)]) == errno.ESRCH
    # one range each (its own path: every direct read of pycomm.shmdirect), both
    # directions, and an unmapped remote address: EFAULT returned, not raised
    one = np.zeros(1000, dtype=np.uint8)
    assert copy_remote(False, os.getpid(), [(one.ctypes.data, 1000)], [(s, 1000)]) == 0
    assert np.array_equal(one, src)
    again = np.zeros(1000, dtype=np.uint8)
    assert copy_remote(True, os.getpid(), [(s, 1000)], [(again.ctypes.data, 1000)]) == 0
    assert np.array_equal(again, src)
    assert copy_remote(False, os.getpid(), [(d, 8)], [(8, 8)]) == errno.EFAULT


def test_a_frame_the_layer_above_cannot_take_in_breaks_the_link_once_not_twice():
    """A sink that raises in the middle of a shm drain (a protocol bug above) must not get
    the frames before it again: the link from that peer is declared lost, naming it."""
    from transports import PeerLostError
    engines, ts, job = make_pair("shm")
    try:
        sender, receiver = engines
        seen = []
        real = receiver.on_frame

        def on_frame(peer, header, payload):
            seen.append(bytes(payload))
            if len(seen) == 2:
                raise KeyError("no such request")
            real(peer, header, payload)
        ts[1]._in_from[0].decoder.on_frame = on_frame
        for i in range(3):
            assert sender.send_now(np.full(4, i, np.uint8).data, 1, 0, 9)
        with pytest.raises(PeerLostError, match=r"rank 0: a frame from it could not be "
                                                 r"taken in \(KeyError"):
            ts[1].progress()
        assert sender.send_now(np.full(4, 7, np.uint8).data, 1, 0, 9)
        with pytest.raises(PeerLostError, match="rank 0"):
            ts[1].progress()
        assert seen == [bytes([0] * 4), bytes([1] * 4)]       # nothing delivered twice
    finally:
        for t in ts:
            t.close()
    assert not glob.glob(f"/dev/shm/pycomm-{job}-*")


def test_cross_memory_writes_into_a_live_peer_and_tells_when_it_is_gone():
    # what the two-rank direct broadcast's root uses (pycomm.shmdirect): write_live copies
    # into a peer's memory; alive() is True while the peer's process has its memory and
    # False once it has exited (its grace wait then ends at once); a write into a gone
    # peer raises PeerLostError
    import multiprocessing as mp

    from transports import PeerLostError
    from transports.cma import CrossMemory

    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def peer(conn):
        me = CrossMemory()
        buf = np.zeros(64, np.uint8)
        conn.send((me.published(), buf.ctypes.data))
        conn.recv()                                 # written: send what landed back
        conn.send(bytes(buf))
        conn.recv()                                 # then exit

    proc = ctx.Process(target=peer, args=(child,))
    proc.start()
    info, address = parent.recv()
    cma = CrossMemory()
    assert cma.admit(1, info) and cma.alive(1)
    src = np.arange(64, dtype=np.uint8)
    cma.write_live(1, src.ctypes.data + 8, address + 8, 48)
    parent.send("look")
    got = np.frombuffer(parent.recv(), np.uint8)
    assert np.array_equal(got[8:56], src[8:56]) and not got[:8].any() and not got[56:].any()
    parent.send("exit")
    proc.join(10)
    assert not cma.alive(1)
    with pytest.raises(PeerLostError):
        cma.write_live(1, src.ctypes.data, address, 8)


def test_a_rank_lets_its_siblings_read_it_where_yama_restricts_them():
    # Yama's ptrace_scope 1 (Ubuntu's default) lets only an ancestor read a process's
    # memory, and ranks are siblings: each lifts it for its peers with PR_SET_PTRACER.
    # The prctl is accepted exactly where the kernel has Yama (EINVAL elsewhere), so a
    # wrong option or argument shows on a kernel with Yama; without one, CMA is open.
    import os
    from transports.linux import allow_reads_by_peers
    assert allow_reads_by_peers() == os.path.exists("/proc/sys/kernel/yama/ptrace_scope")
