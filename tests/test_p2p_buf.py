"""Point-to-point buffer API on real worlds: Send/Recv of every dtype, shape and size (eager,
rendezvous, tiny rings), Irecv_alloc, buffer-protocol objects and specs, tags, wildcards
and non-overtaking order. Nonblocking completion, Sendrecv, Probe, self-sends, PROC_NULL and
cancel: test_p2p_buf_requests.py.

Every function named ``_rank_*`` runs on the ranks (``world.run``) and returns plain values;
the asserts are made here, in the parent. Neighbours are ring neighbours, so a world of one
rank exercises self-sends.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128", "bool"]
# Around the eager/rendezvous boundary, plus a large one.
NBYTES = [0, 8, EAGER_LIMIT - 1, EAGER_LIMIT, EAGER_LIMIT + 1, 4 << 20]


def pattern(dtype, shape, seed: int) -> np.ndarray:
    """Deterministic test data of any dtype (the same in the parent and in every rank)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        data = rng.integers(0, 2, n).astype(dt)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        data = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    elif dt.kind == "f":
        data = rng.standard_normal(n).astype(dt)
    else:
        data = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return data.reshape(shape)


def ring(comm) -> tuple[int, int]:
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def blocking_ring_exchange(comm, sendbuf, recvbuf, tag=0):
    """Send to the right neighbour, receive from the left one, with blocking calls only.

    Even ranks send first and odd ranks receive first, which cannot deadlock for any size
    (a one-rank world sends to itself, which the engine buffers).
    """
    right, left = ring(comm)
    status = pycomm.Status()
    if comm.rank % 2 == 0:
        comm.Send(sendbuf, right, tag)
        comm.Recv(recvbuf, left, tag, status)
    else:
        comm.Recv(recvbuf, left, tag, status)
        comm.Send(sendbuf, right, tag)
    return status


# -- dtypes, shapes and sizes --------------------------------------------------------------

def _rank_dtypes(dtypes, shape):
    comm = pycomm.COMM_WORLD
    out = {}
    for i, dt in enumerate(dtypes):
        send = pattern(dt, shape, 1000 * comm.rank + i)
        recv = np.zeros(shape, dtype=dt)
        st_ = blocking_ring_exchange(comm, send, recv, tag=i)
        out[dt] = (recv, st_.Get_source(), st_.Get_tag(), st_.Get_count(dt))
    return out


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (0,), (0, 3)], ids=str)
def test_send_recv_every_dtype_and_shape(world, shape):
    results = world.run(_rank_dtypes, DTYPES, shape)
    n = int(np.prod(shape))
    for rank, got in enumerate(results):
        left = (rank - 1) % world.size
        for i, dt in enumerate(DTYPES):
            arr, source, tag, count = got[dt]
            assert arr.dtype == np.dtype(dt) and arr.shape == shape
            np.testing.assert_array_equal(arr, pattern(dt, shape, 1000 * left + i),
                                          err_msg=f"rank {rank} dtype {dt}")
            assert (source, tag, count) == (left, i, n), f"rank {rank} dtype {dt} status"


def _rank_sizes(sizes):
    comm = pycomm.COMM_WORLD
    left = ring(comm)[1]
    bad = []
    for i, nbytes in enumerate(sizes):
        send = pattern("uint8", (nbytes,), 7 * comm.rank + nbytes)
        recv = np.full(nbytes + 16, 0xAB, dtype=np.uint8)   # guard bytes after the message
        st_ = blocking_ring_exchange(comm, send, recv, tag=i)
        want = pattern("uint8", (nbytes,), 7 * left + nbytes)
        if not np.array_equal(recv[:nbytes], want):
            first = int(np.argmax(recv[:nbytes] != want))
            bad.append(f"{nbytes} B: first wrong byte at {first}")
        if (recv[nbytes:] != 0xAB).any():
            bad.append(f"{nbytes} B: wrote past the message")
        if st_.Get_count() != nbytes:
            bad.append(f"{nbytes} B: Status.Get_count() = {st_.Get_count()}")
    return bad


def test_send_recv_sizes_across_eager_and_rendezvous(world):
    for rank, bad in enumerate(world.run(_rank_sizes, NBYTES)):
        assert bad == [], f"rank {rank}: {bad}"


def _rank_irecv_alloc(sizes):
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    bad = []
    # posted before the sends (matched on arrival) and after them (from the unexpected
    # queue); every size across the eager/rendezvous boundary
    early = [comm.Irecv_alloc(left, tag=i) for i in range(len(sizes))]
    sends = [comm.Isend(pattern("uint8", (n,), 11 * comm.rank + n), right, tag=100 + i)
             for i, n in enumerate(sizes)]
    sends += [comm.Isend(pattern("uint8", (n,), 11 * comm.rank + n), right, tag=i)
              for i, n in enumerate(sizes)]
    late = [comm.Irecv_alloc(pycomm.ANY_SOURCE, tag=100 + i) for i in range(len(sizes))]
    for i, n in enumerate(sizes):
        for how, req in (("posted early", early[i]), ("posted late", late[i])):
            st_ = pycomm.Status()
            req.Wait(st_)
            want = pattern("uint8", (n,), 11 * left + n).tobytes()
            if not isinstance(req.obj, bytearray) or bytes(req.obj) != want:
                bad.append(f"{n} B {how}: wrong data")
            if st_.Get_count() != n or st_.Get_source() != left:
                bad.append(f"{n} B {how}: status {st_.Get_source()}/{st_.Get_count()}")
    pycomm.Request.Waitall(sends)
    null = comm.Irecv_alloc(pycomm.PROC_NULL)
    null.Wait()
    if null.obj is not None:
        bad.append("PROC_NULL gave data")
    try:
        comm.Irecv_alloc(comm.size)
        bad.append("a source past the world was accepted")
    except pycomm.ArgumentError:
        pass
    return bad


def test_irecv_alloc_receives_any_size(world):
    for rank, bad in enumerate(world.run(_rank_irecv_alloc, NBYTES)):
        assert bad == [], f"rank {rank}: {bad}"


def test_send_recv_sizes_tiny_eager_limit_and_rings(world_tiny):
    """A 64-byte eager limit and 4 KiB rings: messages wrap around the rings many times."""
    sizes = [0, 63, 64, 65, 4095, 4096, 4097, 100000]
    for rank, bad in enumerate(world_tiny.run(_rank_sizes, sizes)):
        assert bad == [], f"rank {rank}: {bad}"
    count = 40
    for rank, order in enumerate(world_tiny.run(_rank_non_overtaking, count, [10, 64, 65, 9000])):
        assert [n for n, _, _ in order] == [[10, 64, 65, 9000][i % 4] for i in range(count)]
        assert [f for _, f, _ in order] == [i % 251 for i in range(count)], f"rank {rank}"


def _rank_buffer_kinds():
    import array
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    out = []
    # bytes -> bytearray
    recv = bytearray(4)
    comm.Sendrecv(b"abc%d" % comm.rank, right, recvbuf=recv, source=left)
    out.append(bytes(recv))
    # array.array -> memoryview of a numpy array
    a = np.zeros(3, dtype=np.int32)
    comm.Sendrecv(array.array("i", [comm.rank, 2, 3]), right, recvbuf=memoryview(a),
                  source=left)
    out.append(a.tolist())
    # mpi4py buffer specifications [buf, datatype] and [buf, count, datatype]
    b = np.zeros(4, dtype=np.float64)
    st_ = pycomm.Status()
    comm.Sendrecv([np.arange(4.0) + comm.rank, 2, np.float64], right,
                  recvbuf=[b, np.float64], source=left, status=st_)
    out.append((b.tolist(), st_.Get_count(np.float64)))
    return out


def test_buffer_protocol_objects_and_specs(world):
    for rank, got in enumerate(world.run(_rank_buffer_kinds)):
        left = (rank - 1) % world.size
        assert got[0] == b"abc%d" % left
        assert got[1] == [left, 2, 3]
        assert got[2] == ([left, left + 1, 0, 0], 2)   # the spec sent its first 2 elements


@settings(max_examples=12, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       shape=st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
       tag=st.integers(0, pycomm.TAG_UB))
def test_send_recv_property(world_small, dtype, shape, tag):
    results = world_small.run(_rank_dtypes_tagged, dtype, shape, tag)
    for rank, (arr, source, got_tag) in enumerate(results):
        left = (rank - 1) % world_small.size
        np.testing.assert_array_equal(arr, pattern(dtype, shape, left))
        assert (source, got_tag) == (left, tag)


def _rank_dtypes_tagged(dtype, shape, tag):
    comm = pycomm.COMM_WORLD
    recv = np.empty(shape, dtype=dtype)
    st_ = blocking_ring_exchange(comm, pattern(dtype, shape, comm.rank), recv, tag)
    return recv, st_.source, st_.tag


# -- tags, wildcards, ordering -------------------------------------------------------------

def _rank_any_source_any_tag():
    """Every rank (root included) sends rank+1 int32 values to rank 0 with tag 100+rank."""
    comm = pycomm.COMM_WORLD
    req = comm.Isend(np.arange(comm.rank + 1, dtype=np.int32) * 10, 0, 100 + comm.rank)
    got = []
    if comm.rank == 0:
        for _ in range(comm.size):
            buf = np.full(comm.size, -1, dtype=np.int32)
            st_ = pycomm.Status()
            comm.Recv(buf, pycomm.ANY_SOURCE, pycomm.ANY_TAG, st_)
            got.append((st_.Get_source(), st_.Get_tag(), st_.Get_count(np.int32),
                        st_.Get_count(), buf[:st_.Get_count(np.int32)].tolist()))
    req.Wait()
    return got


def test_any_source_any_tag_status(world):
    got = world.run(_rank_any_source_any_tag)[0]
    assert sorted(g[0] for g in got) == list(range(world.size))
    for source, tag, count, nbytes, data in got:
        assert tag == 100 + source
        assert count == source + 1 and nbytes == 4 * (source + 1)
        assert data == [10 * i for i in range(source + 1)]


def _rank_tag_selection():
    """Two messages, tags 1 then 2; the receiver asks for tag 2 first."""
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    small, large = np.array([1], dtype=np.int64), pattern("uint8", (EAGER_LIMIT + 5,), 3)
    reqs = [comm.Isend(small, right, 1), comm.Isend(large, right, 2)]
    a, b = np.zeros(1, dtype=np.int64), np.zeros(EAGER_LIMIT + 5, dtype=np.uint8)
    s2, s1 = pycomm.Status(), pycomm.Status()
    comm.Recv(b, left, 2, s2)
    comm.Recv(a, left, pycomm.ANY_TAG, s1)
    pycomm.Request.Waitall(reqs)
    return s2.tag, s1.tag, int(a[0]), bool(np.array_equal(b, large))


def test_receive_selects_by_tag(world):
    for rank, got in enumerate(world.run(_rank_tag_selection)):
        assert got == (2, 1, 1, True), f"rank {rank}"


def _rank_non_overtaking(count, sizes):
    """``count`` messages on one (pair, tag), sizes cycling through ``sizes``."""
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    msgs = [np.full(sizes[i % len(sizes)], i % 251, dtype=np.uint8) for i in range(count)]
    reqs = [comm.Isend(m, right, 5) for m in msgs]
    order = []
    buf = np.empty(max(sizes), dtype=np.uint8)
    for i in range(count):
        st_ = pycomm.Status()
        comm.Recv(buf, left, 5 if i % 2 else pycomm.ANY_TAG, st_)
        n = st_.Get_count()
        first = int(buf[0]) if n else None
        uniform = bool((buf[:n] == buf[0]).all()) if n else True
        order.append((n, first, uniform))
    pycomm.Request.Waitall(reqs)
    return order


@pytest.mark.parametrize("sizes", [[8], [10, EAGER_LIMIT + 100, 0, 3, 200000]],
                         ids=["small", "mixed-eager-rendezvous"])
def test_non_overtaking_order(world, sizes):
    count = 40
    want = [(sizes[i % len(sizes)], (i % 251) if sizes[i % len(sizes)] else None, True)
            for i in range(count)]
    for rank, order in enumerate(world.run(_rank_non_overtaking, count, sizes)):
        assert order == want, f"rank {rank} received messages out of order"


def _rank_ordered_any_source(per_peer):
    """Rank 0 receives from ANY_SOURCE; per sender the sequence numbers must increase."""
    comm = pycomm.COMM_WORLD
    if comm.rank != 0:
        reqs = [comm.Isend(np.full(1 + (i % 3) * 30000, i, dtype=np.int32), 0, 9)
                for i in range(per_peer)]
        pycomm.Request.Waitall(reqs)
        return None
    seen = {}
    buf = np.empty(60001, dtype=np.int32)
    for _ in range(per_peer * (comm.size - 1)):
        st_ = pycomm.Status()
        comm.Recv(buf, pycomm.ANY_SOURCE, 9, st_)
        seen.setdefault(st_.source, []).append(int(buf[0]))
    return seen


def test_non_overtaking_with_any_source(world):
    seen = world.run(_rank_ordered_any_source, 12)[0]
    assert seen == {r: list(range(12)) for r in range(1, world.size)}
