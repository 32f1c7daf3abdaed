"""Point-to-point buffer API on real worlds, beyond test_p2p_buf.py: Isend/Irecv between
every pair completed by Waitall, Testall or Waitany, Sendrecv around the ring, a 64 MiB
exchange both ways, Probe/Iprobe and a receive of the probed size, self-sends, PROC_NULL,
a cancelled receive, and blocking calls whose size and kind change on one tag.

As in test_p2p_buf.py (whose helpers these use), every ``_rank_*`` function runs on the
ranks and the asserts are made in the parent.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import pycomm
from test_p2p_buf import EAGER_LIMIT, blocking_ring_exchange, pattern, ring

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- nonblocking ---------------------------------------------------------------------------

def _rank_all_to_all_nonblocking(nbytes, how):
    comm = pycomm.COMM_WORLD
    recvs = {r: np.zeros(nbytes, dtype=np.uint8) for r in range(comm.size)}
    rreqs = [comm.Irecv(recvs[r], r, 20) for r in range(comm.size)]
    sends = {r: pattern("uint8", (nbytes,), 31 * comm.rank + r) for r in range(comm.size)}
    sreqs = [comm.Isend(sends[r], r, 20) for r in range(comm.size)]
    statuses = [pycomm.Status() for _ in rreqs]
    if how == "Waitall":
        pycomm.Request.Waitall(rreqs + sreqs, statuses + [None] * len(sreqs))
    elif how == "Testall":
        while not pycomm.Request.Testall(rreqs + sreqs):
            pass
        pycomm.Request.Waitall(rreqs, statuses)
    else:   # Waitany until all have completed, then Test each
        pending = list(rreqs + sreqs)
        while pending:
            i = pycomm.Request.Waitany(pending)
            pending.pop(i)
        assert all(r.Test() for r in rreqs + sreqs)
        pycomm.Request.Waitall(rreqs, statuses)
    ok = [bool(np.array_equal(recvs[r], pattern("uint8", (nbytes,), 31 * r + comm.rank)))
          for r in range(comm.size)]
    return ok, [(s.source, s.tag, s.count) for s in statuses]


@pytest.mark.parametrize("how", ["Waitall", "Testall", "Waitany"])
@pytest.mark.parametrize("nbytes", [100, 3 * EAGER_LIMIT])
def test_isend_irecv_every_pair(world, nbytes, how):
    for rank, (ok, statuses) in enumerate(
            world.run(_rank_all_to_all_nonblocking, nbytes, how)):
        wrong = [i for i, o in enumerate(ok) if not o]
        assert not wrong, f"rank {rank}: wrong data from ranks {wrong}"
        assert statuses == [(r, 20, nbytes) for r in range(world.size)]


def _rank_sendrecv_ring(nbytes):
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    recv = np.zeros(nbytes // 8, dtype=np.float64)
    st_ = pycomm.Status()
    comm.Sendrecv(pattern("float64", (nbytes // 8,), comm.rank), right, 3, recv, left, 3, st_)
    ok = bool(np.array_equal(recv, pattern("float64", (nbytes // 8,), left)))
    return ok, st_.source, st_.tag, st_.Get_count(np.float64)


@pytest.mark.parametrize("nbytes", [0, 64, 1 << 20])
def test_sendrecv_ring(world, nbytes):
    for rank, (ok, source, tag, count) in enumerate(world.run(_rank_sendrecv_ring, nbytes)):
        assert ok and (source, tag, count) == ((rank - 1) % world.size, 3, nbytes // 8)


def _rank_sendrecv_edges():
    """The small Sendrecv, whose send goes at once: a receive that is too small, one from
    ANY_SOURCE/ANY_TAG, and receive arguments that are refused before anything is sent."""
    from pycomm.errors import ArgumentError, InvalidBufferError, TruncationError
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    out = {}
    small, st_ = np.zeros(2), pycomm.Status()
    try:
        comm.Sendrecv(np.arange(5.0) + comm.rank, right, 4, small, left, 4, st_)
        out["truncated"] = None
    except TruncationError:
        out["truncated"] = (small.tolist(), st_.source, st_.tag, st_.count)
    got, st_ = np.zeros(3), pycomm.Status()
    comm.Sendrecv(np.full(3, comm.rank, dtype=np.float64), right, 5, got, pycomm.ANY_SOURCE,
                  pycomm.ANY_TAG, st_)
    out["any"] = (got.tolist(), st_.source, st_.tag)
    refused = []
    for recvbuf, source, tag in ((np.zeros(1), left, -5), (np.zeros(1), comm.size + 3, 6),
                                 (np.frombuffer(b"\0" * 8), left, 6)):   # read-only
        try:
            comm.Sendrecv(np.ones(1), right, 6, recvbuf, source, tag)
        except (ArgumentError, InvalidBufferError) as exc:
            refused.append(type(exc).__name__)
    comm.Barrier()
    out["refused"] = refused
    out["nothing sent"] = not comm.Iprobe(left, 6)
    return out


def test_sendrecv_small_edges(world):
    for rank, out in enumerate(world.run(_rank_sendrecv_edges)):
        left = (rank - 1) % world.size
        assert out["truncated"] == ([float(left), left + 1.0], left, 4, 16), out
        assert out["any"] == ([float(left)] * 3, left, 5), out
        assert out["refused"] == ["ArgumentError", "ArgumentError", "InvalidBufferError"], out
        assert out["nothing sent"], out


def _rank_small_exchange_requests():
    """Irecv + Isend + Waitall/Wait of small messages, whose send may complete inside the
    Isend and whose receive, the one posted, may be taken straight from the transport in
    the wait: data and statuses over many rounds, another tag arriving first, a message
    larger than the buffer, and what a completed send request reports."""
    from pycomm.errors import TruncationError
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    out = {}
    bad = []
    got, st_ = np.zeros(4), pycomm.Status()
    for i in range(60):
        rr = comm.Irecv(got, left, 9)
        sr = comm.Isend(np.arange(4.0) + 100 * comm.rank + i, right, 9)
        if i % 2:
            pycomm.Request.Waitall([rr, sr], [st_, pycomm.Status()])
        else:
            sr.Wait()
            rr.Wait(st_)
        if got.tolist() != (np.arange(4.0) + 100 * left + i).tolist() or \
                (st_.source, st_.tag, st_.count) != (left, 9, 32):
            bad.append((i, got.tolist(), st_.source, st_.tag, st_.count))
    out["rounds wrong"] = bad
    # another tag's message comes first: the posted receive (tag 11) still gets its own,
    # and tag 10's waits for the receive that names it
    first, second = np.zeros(1), np.zeros(1)
    rr = comm.Irecv(second, left, 11)
    comm.Barrier()
    comm.Send(np.full(1, 10.0 + comm.rank), right, 10)
    comm.Send(np.full(1, 11.0 + comm.rank), right, 11)
    rr.Wait()
    comm.Recv(first, left, 10)
    out["two tags"] = (first[0], second[0])
    # larger than the buffer: truncated, as MPI says, with what fit received
    small, st_ = np.zeros(1), pycomm.Status()
    rr = comm.Irecv(small, left, 12)
    sr = comm.Isend(np.arange(3.0) + comm.rank, right, 12)
    try:
        pycomm.Request.Waitall([rr, sr], [st_, None])
        out["truncated"] = None
    except TruncationError:
        sr.Wait()
        out["truncated"] = (small[0], st_.source, st_.tag, st_.count)
    # a small send's request: complete, a send's status, not cancelled
    sr = comm.Isend(np.ones(2), right, 13)
    sr.Cancel()
    st_ = pycomm.Status()
    sr.Wait(st_)
    comm.Recv(np.zeros(2), left, 13)
    out["send status"] = (st_.cancelled, sr.Test())
    comm.Barrier()
    out["left over"] = comm.Iprobe(pycomm.ANY_SOURCE, pycomm.ANY_TAG)
    return out


def test_small_exchange_requests(world):
    for rank, out in enumerate(world.run(_rank_small_exchange_requests)):
        left = (rank - 1) % world.size
        assert out["rounds wrong"] == [], out
        assert out["two tags"] == (10.0 + left, 11.0 + left), out
        assert out["truncated"] == (float(left), left, 12, 8), out
        assert out["send status"] == (False, True), out
        assert out["left over"] is False, out


def _rank_traffic_counters():
    """The engine's counters of what this rank sends (``sent_bytes``, ``sent_messages``),
    over each way a message leaves: a Send and a small Isend that the transport takes at
    once, a rendezvous Isend, a Sendrecv, and a recursive-doubling Allreduce (on 2 ranks:
    one exchange, request-free). Messages to itself are not counted."""
    comm = pycomm.COMM_WORLD
    eng = comm._engine
    right, left = ring(comm)
    got = np.zeros(3 * EAGER_LIMIT // 8)
    b0, m0 = eng.sent_bytes, eng.sent_messages
    if comm.rank % 2:
        comm.Recv(got[:2], left, 1)
        comm.Send(np.ones(2), right, 1)
    else:
        comm.Send(np.ones(2), right, 1)
        comm.Recv(got[:2], left, 1)
    r = comm.Isend(np.ones(4), right, 2)
    comm.Recv(got[:4], left, 2)
    r.Wait()
    r = comm.Isend(np.ones(3 * EAGER_LIMIT // 8), right, 3)
    comm.Recv(got, left, 3)
    r.Wait()
    comm.Sendrecv(np.ones(2), right, 4, got[:2], left, 4)
    p2p = (eng.sent_bytes - b0, eng.sent_messages - m0)
    b0, m0 = eng.sent_bytes, eng.sent_messages
    x = np.ones(1)
    comm.Allreduce(pycomm.IN_PLACE, x, algorithm="recursive_doubling")
    return p2p, (eng.sent_bytes - b0, eng.sent_messages - m0), x[0]


def test_traffic_counters(world):
    for p2p, coll, x in world.run(_rank_traffic_counters):
        if world.size == 1:
            assert p2p == (0, 0) and coll == (0, 0), (p2p, coll)
        else:
            assert p2p == (16 + 32 + 3 * EAGER_LIMIT + 16, 4), p2p
            assert x == world.size
            if world.size == 2:
                assert coll == (8, 1), coll


def _rank_big_exchange(nbytes):
    """Ranks 0 and 1 send ``nbytes`` to each other at the same time; the rest idle."""
    comm = pycomm.COMM_WORLD
    if comm.rank > 1 or comm.size < 2:
        return None
    peer = 1 - comm.rank
    send = np.full(nbytes // 8, comm.rank + 1, dtype=np.int64)
    send[::4096] = np.arange(send[::4096].size)          # a few markers against offsets
    recv = np.zeros_like(send)
    t0 = pycomm.Wtime()
    reqs = [comm.Isend(send, peer, 1), comm.Irecv(recv, peer, 1)]
    pycomm.Request.Waitall(reqs)
    seconds = pycomm.Wtime() - t0
    want = np.full_like(send, peer + 1)
    want[::4096] = np.arange(want[::4096].size)
    ok_nonblocking = bool(np.array_equal(recv, want))
    recv[:] = 0
    comm.Sendrecv(send, peer, 2, recv, peer, 2)
    return ok_nonblocking, bool(np.array_equal(recv, want)), seconds


# Only ranks 0 and 1 exchange (the others idle) and a pair's rings and sockets do not
# depend on the world size: a pair alone and a pair beside an idle rank, on each transport.
BIG_EXCHANGE_WORLDS = [(2, "shm"), (3, "shm"), (2, "tcp"), (3, "tcp")]


@pytest.mark.parametrize("world_small", BIG_EXCHANGE_WORLDS, indirect=True,
                         ids=[f"n{n}-{t}" for n, t in BIG_EXCHANGE_WORLDS])
def test_large_exchange_both_ways_no_deadlock(world_small):
    results = world_small.run(_rank_big_exchange, 64 << 20, timeout=90)
    for rank in (0, 1):
        ok_nb, ok_sr, _seconds = results[rank]
        assert ok_nb and ok_sr, f"rank {rank}: 64 MiB exchange corrupted"


# -- probe ---------------------------------------------------------------------------------

def _rank_probe(sizes):
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    # Nothing is ever sent with tag 77: Iprobe must say so.
    absent = comm.Iprobe(pycomm.ANY_SOURCE, 77)
    reqs = [comm.Isend(pattern("float32", (n,), comm.rank + n), right, 40 + i)
            for i, n in enumerate(sizes)]
    got = []
    for i, n in enumerate(sizes):
        st_ = pycomm.Status()
        if i % 2:
            comm.Probe(left, pycomm.ANY_TAG, st_)
        else:
            while not comm.Iprobe(pycomm.ANY_SOURCE, 40 + i, st_):
                pass
        count = st_.Get_count(np.float32)
        buf = np.empty(count, dtype=np.float32)
        comm.Recv(buf, st_.source, st_.tag)
        got.append((st_.source, st_.tag, count,
                    bool(np.array_equal(buf, pattern("float32", (n,), left + n)))))
    pycomm.Request.Waitall(reqs)
    return absent, got


def test_probe_then_receive_probed_size(world):
    sizes = [0, 1, 1000, EAGER_LIMIT // 4 + 1, 300000]
    for rank, (absent, got) in enumerate(world.run(_rank_probe, sizes)):
        left = (rank - 1) % world.size
        assert absent is False
        assert got == [(left, 40 + i, n, True) for i, n in enumerate(sizes)], f"rank {rank}"


# -- self and PROC_NULL --------------------------------------------------------------------

def _rank_self_send():
    comm = pycomm.COMM_WORLD
    out = []
    for n in (0, 8, EAGER_LIMIT + 1, 1 << 20):
        data = pattern("uint8", (n,), n + comm.rank)
        comm.Send(data, comm.rank, 6)                 # buffered: returns before the Recv
        buf = np.zeros(n, dtype=np.uint8)
        st_ = pycomm.Status()
        comm.Recv(buf, comm.rank, 6, st_)
        r = comm.Irecv(buf2 := np.zeros(n, dtype=np.uint8), comm.rank, 7)
        s = comm.Isend(data, comm.rank, 7)
        pycomm.Request.Waitall([r, s])
        out.append((n, st_.source, bool(np.array_equal(buf, data)),
                    bool(np.array_equal(buf2, data))))
    return out


def test_self_send(world):
    for rank, got in enumerate(world.run(_rank_self_send)):
        assert got == [(n, rank, True, True) for n in (0, 8, EAGER_LIMIT + 1, 1 << 20)]


def _rank_proc_null():
    comm = pycomm.COMM_WORLD
    P = pycomm.PROC_NULL
    buf = np.full(4, 9, dtype=np.int32)
    comm.Send(np.arange(4, dtype=np.int32), P)
    st_ = pycomm.Status()
    comm.Recv(buf, P, 3, st_)
    recv_status = (st_.source, st_.tag, st_.count)
    r = comm.Irecv(buf, P)
    s = comm.Isend(buf, P)
    pycomm.Request.Waitall([r, s])
    st2 = pycomm.Status()
    comm.Sendrecv(np.arange(4, dtype=np.int32), P, 0, buf, P, 0, st2)
    st3 = pycomm.Status()
    probed = comm.Iprobe(P, pycomm.ANY_TAG, st3)
    st4 = pycomm.Status()
    comm.Probe(P, 5, st4, timeout=5)
    return (buf.tolist(), recv_status, (st2.source, st2.count), probed,
            (st3.source, st3.tag, st3.count), (st4.source, st4.tag, st4.count))


def test_proc_null(world):
    P, A = pycomm.PROC_NULL, pycomm.ANY_TAG
    for rank, got in enumerate(world.run(_rank_proc_null)):
        buf, recv_status, sr_status, probed, iprobe_status, probe_status = got
        assert buf == [9, 9, 9, 9], "a PROC_NULL receive must not touch the buffer"
        assert recv_status == (P, A, 0)
        assert sr_status == (P, 0)
        # MPI: probing PROC_NULL succeeds at once with source PROC_NULL, tag ANY_TAG, count 0
        assert probed is True
        assert iprobe_status == (P, A, 0) and probe_status == (P, A, 0)


def _rank_cancel():
    """A cancelled receive completes as cancelled and never takes a later message."""
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    stale = np.zeros(1)
    req = comm.Irecv(stale, left, 11)
    req.Cancel()
    st_ = pycomm.Status()
    req.Wait(st_)
    cancelled = st_.Is_cancelled()
    s = comm.Isend(np.array([float(comm.rank)]), right, 11)
    buf = np.zeros(1)
    comm.Recv(buf, left, 11)
    s.Wait()
    return cancelled, stale[0], buf[0]


def test_cancelled_receive(world):
    for rank, got in enumerate(world.run(_rank_cancel)):
        assert got == (True, 0.0, float((rank - 1) % world.size))


def _rank_blocking_shapes_and_sizes_on_one_tag():
    """Blocking Send/Recv of small messages on one tag whose size and kind change from call
    to call: what the request-free path caches per header (the frame's prefix when sending,
    the unpack of a frame that fills the buffer when receiving) must follow each call."""
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    bad = []
    cases = [("uint8", (8,), 8), ("uint8", (16,), 16), ("uint8", (8,), 8),
             ("uint8", (8,), 24),              # a shorter message than the buffer
             ("uint8", (2, 4), 8),             # a 2-D uint8 buffer: cast to bytes
             ("float32", (2,), 8), ("int64", (1,), 8),
             ("uint8", (5000,), 5000),         # eager, past the one-unpack size
             ("uint8", (0,), 8)]               # an empty message into a larger buffer
    for i, (dt, shape, rbytes) in enumerate(cases * 2):
        send = pattern(dt, shape, 100 * comm.rank + i)
        recv = np.full(rbytes, 0xAB, dtype=np.uint8)
        st_ = blocking_ring_exchange(comm, send, recv, tag=3)
        want = pattern(dt, shape, 100 * left + i).tobytes()
        got = recv.tobytes()
        if got[:len(want)] != want or set(got[len(want):]) - {0xAB}:
            bad.append(f"case {i} ({dt} {shape} into {rbytes} B): wrong bytes")
        if (st_.Get_source(), st_.Get_tag(), st_.Get_count()) != (left, 3, len(want)):
            bad.append(f"case {i}: status {st_.Get_source()}/{st_.Get_tag()}/{st_.Get_count()}")
    # a message one byte larger than the buffer: TruncationError, also after the same tag
    # carried messages that fit
    if comm.size > 1:
        err = None
        if comm.rank % 2 == 0:
            comm.Send(np.ones(9, np.uint8), right, 4)
            try:
                comm.Recv(np.zeros(8, np.uint8), left, 4)
            except pycomm.TruncationError as exc:
                err = exc
        else:
            try:
                comm.Recv(np.zeros(8, np.uint8), left, 4)
            except pycomm.TruncationError as exc:
                err = exc
            comm.Send(np.ones(9, np.uint8), right, 4)
        if err is None:
            bad.append("a 9-byte message into 8 bytes did not raise TruncationError")
        comm.Barrier()
    return bad


def test_blocking_shapes_and_sizes_on_one_tag(world):
    for rank, bad in enumerate(world.run(_rank_blocking_shapes_and_sizes_on_one_tag)):
        assert bad == [], f"rank {rank}: {bad}"
