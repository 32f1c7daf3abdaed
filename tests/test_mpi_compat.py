"""pycomm.MPI on real worlds: mpi4py's buffer and object methods with MPI datatypes.

Every ``_rank_*`` function runs on the ranks (``world.run``); it computes the expected
bytes with numpy from seeds every rank knows and returns a list of mismatches (empty when
right), so the parent's assert shows what differed on which rank. Sizes include 1 and
non-powers of two (the shared ``world``/``world_small`` fixtures); every root is tried.
Communicators, groups, topologies and neighbourhood collectives: test_mpi_compat_comms.py.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _check(bad: list, label: str, got, want) -> None:
    if not np.array_equal(np.asarray(got), np.asarray(want)):
        bad.append(f"rank {MPI.COMM_WORLD.rank}: {label}: got {np.asarray(got).tolist()} "
                   f"want {np.asarray(want).tolist()}")


def _grid(rank: int, rows: int = 4, cols: int = 5) -> np.ndarray:
    return (np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) + 100 * rank)


# -- point-to-point --------------------------------------------------------------------------

def _rank_p2p() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    bad: list = []
    # [buf, count, datatype], integral-float ranks and tags, Status counts in datatype units
    out = np.arange(6, dtype=np.int32) + 10 * rank
    got = np.full(6, -1, dtype=np.int32)
    st = MPI.Status()
    comm.Sendrecv([out, 4, MPI.INT], float(right), 7.0, [got, 6, MPI.INT], left, 7, st)
    _check(bad, "Sendrecv count", got, np.r_[np.arange(4) + 10 * left, [-1, -1]])
    _check(bad, "Status", [st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT),
                           st.Get_count(MPI.SHORT), st.Get_count(MPI.DOUBLE)],
           [left, 7, 4, 8, 2])
    # halo exchange of a 2-D block's edge columns with a vector type
    col = MPI.DOUBLE.Create_vector(4, 1, 5).Commit()
    col8 = col.Create_resized(0, 8).Commit()     # displacements count whole columns
    a = _grid(rank)
    comm.Sendrecv([a, (1, 3), col8], right, 1, [a, (1, 0), col8], left, 1)
    _check(bad, "halo column", a[:, 0], _grid(left)[:, 3])
    _check(bad, "halo rest", a[:, 1:], _grid(rank)[:, 1:])
    # blocking Recv into a column, small and large: a full message, then a short one
    # (the rest of the column untouched)
    for rows, cols, n, tag in ((4, 5, 4, 11), (4, 5, 2, 12), (600, 3, 600, 13),
                               (600, 3, 7, 14)):
        column = MPI.DOUBLE.Create_vector(rows, 1, cols).Create_resized(0, 8).Commit()
        s = comm.Isend(np.arange(n, dtype=np.float64) + 1000 * rank + 0.5 * n, right, tag)
        a = _grid(rank, rows, cols)
        st = MPI.Status() if tag % 2 else None
        comm.Recv([a, (1, 2), column], left, tag, st)
        s.Wait()
        want = _grid(rank, rows, cols)
        want[:n, 2] = np.arange(n) + 1000 * left + 0.5 * n
        _check(bad, f"Recv column of {n}/{rows}", a, want)
        if st is not None:
            _check(bad, f"Recv column of {n} count", st.Get_count(MPI.DOUBLE), n)
        column.Free()
    # Isend/Irecv with a derived type: the receive is unpacked when the request completes
    b = np.zeros((4, 5))
    r = comm.Irecv([b, 1, col], left, 2)
    s = comm.Isend([_grid(rank), 1, col], right, 2)
    MPI.Request.Waitall([r, s])
    _check(bad, "Irecv column", b[:, 0], _grid(left)[:, 0])
    _check(bad, "Irecv untouched", b[:, 1:], np.zeros((4, 4)))
    if r != MPI.REQUEST_NULL or s != MPI.REQUEST_NULL:
        bad.append(f"rank {rank}: completed requests are not REQUEST_NULL")
    # complex buffer read as floats
    z = np.arange(3, dtype=np.complex64) * (1 + 1j) + rank
    zz = np.zeros(6, dtype=np.float32)
    comm.Sendrecv([z, MPI.FLOAT], right, 3, [zz, MPI.FLOAT], left, 3)
    _check(bad, "complex as FLOAT", zz, (np.arange(3, dtype=np.complex64) * (1 + 1j)
                                        + left).view(np.float32))
    # persistent requests, started three times
    sbuf, rbuf = np.zeros(3), np.zeros(3)
    ps, pr = comm.Send_init([sbuf, MPI.DOUBLE], right, 4), comm.Recv_init(rbuf, left, 4)
    for k in range(3):
        sbuf[:] = rank * 10 + k
        MPI.Prequest.Startall([pr, ps])
        MPI.Request.Waitall([pr, ps])
        _check(bad, f"persistent round {k}", rbuf, np.full(3, left * 10 + k))
    if pr == MPI.REQUEST_NULL:
        bad.append(f"rank {rank}: an inactive persistent request became REQUEST_NULL")
    ps.Free()
    pr.Free()
    # Probe, then Recv of the probed size
    comm.Send(np.arange(rank + 1, dtype=np.float64), right, 5)
    st = MPI.Status()
    comm.Probe(left, 5, st)
    n = st.Get_count(MPI.DOUBLE)
    got = np.empty(n)
    comm.Recv([got, MPI.DOUBLE], st.Get_source(), 5)
    _check(bad, "Probe+Recv", got, np.arange(left + 1, dtype=np.float64))
    # Sendrecv_replace, Bsend, Waitany/Testall, object methods through Request
    x = np.full(2, rank, dtype=np.int64)
    comm.Sendrecv_replace([x, MPI.LONG], right, 6, left, 6)
    _check(bad, "Sendrecv_replace", x, [left, left])
    comm.Bsend([np.full(2, rank, np.int16), MPI.SHORT], right, 8)
    y = np.zeros(2, np.int16)
    comm.Recv(y, left, 8)
    _check(bad, "Bsend", y, [left, left])
    reqs = [comm.irecv(source=left, tag=9), comm.isend({"from": rank}, right, 9)]
    i, obj = MPI.Request.waitany(reqs)
    objs = MPI.Request.waitall(reqs)          # the one waitany completed is now null
    got_obj = obj if i == 0 else objs[0]
    if got_obj != {"from": left} or objs[i] is not None or reqs[i] != MPI.REQUEST_NULL:
        bad.append(f"rank {rank}: waitany {i, obj}, then waitall {objs}")
    if MPI.Request.Waitany([MPI.REQUEST_NULL, MPI.Request()]) != MPI.UNDEFINED:
        bad.append(f"rank {rank}: Waitany over null requests is not UNDEFINED")
    if comm.sendrecv(rank, right, 10, source=left, recvtag=10) != left:
        bad.append(f"rank {rank}: sendrecv object")
    return bad


def test_p2p_with_datatypes_and_requests(world):
    assert world.run(_rank_p2p) == [[]] * world.size


# -- collectives ------------------------------------------------------------------------------

def _rank_collectives(root: int) -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    # Bcast of a column of a 2-D array (derived type) and of [buf, count, datatype]
    col = MPI.DOUBLE.Create_vector(4, 1, 5).Commit()
    a = _grid(rank)
    comm.Bcast([a, 1, col], root=root)
    _check(bad, "Bcast column", a[:, 0], _grid(root)[:, 0])
    _check(bad, "Bcast rest", a[:, 1:], _grid(rank)[:, 1:])
    v = np.arange(5, dtype=np.int64) * (rank + 1)
    comm.Bcast([v, 3, MPI.INT64_T], root)
    _check(bad, "Bcast count", v, np.r_[np.arange(3) * (root + 1), np.array([3, 4]) * (rank + 1)])
    # Reduce of complex64 buffers described as FLOAT (the OSU reduce benchmark's way)
    z = (np.arange(4) + rank * 1j).astype(np.complex64)
    out = np.zeros(4, dtype=np.complex64)
    comm.Reduce([z, MPI.FLOAT], [out, MPI.FLOAT] if rank == root else None, MPI.SUM, root)
    if rank == root:
        _check(bad, "Reduce FLOAT", out, size * np.arange(4) + 1j * sum(range(size)))
    # Allreduce MAXLOC over C-layout DOUBLE_INT pairs
    pairs = np.zeros(3, dtype=np.dtype([("val", "f8"), ("idx", "i4")], align=True))
    pairs["val"], pairs["idx"] = [(rank * 7) % size, -rank, 1.0], rank
    res = np.zeros_like(pairs)
    comm.Allreduce([pairs, MPI.DOUBLE_INT], [res, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    vals = [(r * 7) % size for r in range(size)]
    _check(bad, "MAXLOC val", res["val"], [max(vals), 0, 1.0])
    _check(bad, "MAXLOC idx", res["idx"], [vals.index(max(vals)), 0, 0])
    # Gather / Scatter / Allgather / Alltoall with typecodes and datatypes
    mine = np.arange(2, dtype=np.int32) + 10 * rank
    allv = np.full(2 * size, -1, dtype=np.int32)
    comm.Gather([mine, MPI.INT], [allv, "i"] if rank == root else None, root)
    want = (np.arange(2)[None, :] + 10 * np.arange(size)[:, None]).ravel()
    if rank == root:
        _check(bad, "Gather", allv, want)
    part = np.zeros(2, dtype=np.int32)
    comm.Scatter([want.astype(np.int32), 2, MPI.INT] if rank == root else None, part, root)
    _check(bad, "Scatter", part, want[2 * rank:2 * rank + 2])
    allv[:] = -1
    comm.Allgather([mine, 2, MPI.INT], [allv, MPI.INT])
    _check(bad, "Allgather", allv, want)
    send = np.arange(size, dtype=np.float64) + 100 * rank
    recv = np.zeros(size)
    comm.Alltoall([send, 1, MPI.DOUBLE], [recv, 1, MPI.DOUBLE])
    _check(bad, "Alltoall", recv, np.arange(size) * 100 + rank)
    # Gatherv into displacements in reverse rank order, leaving gaps
    counts = [r % 3 for r in range(size)]
    displs = list(np.cumsum([0] + [c + 1 for c in counts[::-1]])[:-1][::-1])
    gv = np.full(int(sum(counts) + size), -1, dtype=np.int32)
    comm.Gatherv([np.full(counts[rank], rank, np.int32), MPI.INT],
                 [gv, counts, displs, MPI.INT] if rank == root else None, root)
    if rank == root:
        ref = np.full_like(gv, -1)
        for r in range(size):
            ref[displs[r]:displs[r] + counts[r]] = r
        _check(bad, "Gatherv", gv, ref)
    sv = np.zeros(counts[rank], np.int32)
    comm.Scatterv([np.repeat(np.arange(size, dtype=np.int32), counts), counts, None,
                   MPI.INT] if rank == root else None, [sv, MPI.INT], root)
    _check(bad, "Scatterv", sv, np.full(counts[rank], rank))
    agv = np.zeros(sum(counts), np.float64)
    comm.Allgatherv(np.full(counts[rank], rank, np.float64), [agv, (counts, None), "d"])
    _check(bad, "Allgatherv", agv, np.repeat(np.arange(size), counts))
    # Alltoallv of matrix columns (a resized vector type: one column per rank)
    colr = MPI.DOUBLE.Create_vector(2, 1, size).Create_resized(0, 8).Commit()
    m_send = np.arange(2 * size, dtype=np.float64).reshape(2, size) + 1000 * rank
    m_recv = np.zeros((2, size))
    comm.Alltoallv([m_send, [1] * size, list(range(size)), colr],
                   [m_recv, [1] * size, list(range(size)), colr])
    ref = np.stack([np.arange(2) * size + rank + 1000 * r for r in range(size)], axis=1)
    _check(bad, "Alltoallv columns", m_recv, ref)
    # Reduce_scatter(_block), Scan, Exscan with datatypes; a nonblocking Iallreduce
    rsb = np.zeros(2, np.int64)
    comm.Reduce_scatter_block([np.arange(2 * size, dtype=np.int64) + rank, MPI.LONG],
                              [rsb, MPI.LONG], MPI.SUM)
    _check(bad, "Reduce_scatter_block", rsb,
           size * np.arange(2 * rank, 2 * rank + 2) + sum(range(size)))
    rcounts = [1 + r % 2 for r in range(size)]
    rs = np.zeros(rcounts[rank], np.float64)
    comm.Reduce_scatter([np.ones(sum(rcounts)), MPI.DOUBLE], [rs, MPI.DOUBLE], rcounts,
                        MPI.SUM)
    _check(bad, "Reduce_scatter", rs, np.full(rcounts[rank], float(size)))
    sc = np.zeros(2, np.int32)
    comm.Scan([np.full(2, rank + 1, np.int32), MPI.INT], [sc, MPI.INT], MPI.PROD)
    _check(bad, "Scan", sc, np.full(2, np.prod(np.arange(1, rank + 2))))
    ex = np.full(2, -5, np.int32)
    comm.Exscan([np.full(2, rank + 1, np.int32), MPI.INT], [ex, MPI.INT], MPI.SUM)
    _check(bad, "Exscan", ex, np.full(2, rank * (rank + 1) // 2) if rank else [-5, -5])
    ia = np.zeros(3)
    req = comm.Iallreduce([np.full(3, float(rank)), MPI.DOUBLE], [ia, MPI.DOUBLE], MPI.MAX)
    req.Wait()
    _check(bad, "Iallreduce", ia, np.full(3, float(size - 1)))
    ib = np.zeros((4, 5))
    comm.Ibcast([ib if rank != root else _grid(root), 1, col], root).Wait()
    if rank != root:
        _check(bad, "Ibcast column", ib[:, 0], _grid(root)[:, 0])
    comm.Barrier()
    return bad


def test_collectives_with_datatypes(world_small):
    for root in range(world_small.size):
        assert world_small.run(_rank_collectives, root) == [[]] * world_small.size, root


# -- errors, the environment, matched probes, user ops (truncation: test_mpi_truncation.py) --

def test_environment_without_a_world():
    assert MPI.Get_version() == (4, 1)
    assert MPI.get_vendor()[0] == "pycomm"
    assert "pycomm" in MPI.Get_library_version()
    assert MPI.Wtick() > 0 and MPI.Wtime() <= MPI.Wtime()
    assert MPI.Get_error_string(MPI.ERR_TRUNCATE).startswith("MPI_ERR_TRUNCATE")
    assert MPI.Get_error_class(MPI.ERR_ARG) == MPI.ERR_ARG
    assert issubclass(MPI.Exception, __import__("pycomm").CommError)
    exc = MPI.Exception(MPI.ERR_COUNT)
    assert exc.Get_error_code() == MPI.ERR_COUNT and exc == MPI.ERR_COUNT
    assert MPI.Request() == MPI.REQUEST_NULL and not MPI.REQUEST_NULL
    assert MPI.Request().Wait() is True
    st = MPI.Status()
    st.Set_source(3)
    st.Set_tag(4)
    st.Set_elements(MPI.DOUBLE, 5)
    st.Set_cancelled(True)
    assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE), st.Get_elements(MPI.INT),
            st.Is_cancelled()) == (3, 4, 5, 10, True)
    assert MPI.Status(st) == st
    assert MPI.SUM(2, 3) == 5 and MPI.REPLACE(2, 3) == 3 and MPI.NO_OP(2, 3) == 2
    with pytest.raises(NotImplementedError, match="MPI ABI queries"):
        _ = MPI.Get_abi_info
    for call, code in ((MPI.Request().Free, MPI.ERR_REQUEST),
                       (MPI.REQUEST_NULL.Cancel, MPI.ERR_REQUEST),
                       (MPI.SUM.Free, MPI.ERR_OP),
                       (lambda: MPI.COMM_NULL.Get_attr(MPI.TAG_UB), MPI.ERR_COMM),
                       (lambda: MPI.COMM_NULL.Compare(MPI.COMM_NULL), MPI.ERR_COMM)):
        with pytest.raises(MPI.Exception) as info:
            call()
        assert info.value.Get_error_class() == code
    MPI.Op.Create(lambda a, b: None).Free()          # a user op frees silently
    assert MPI.Compute_dims(12, [0, 0, 0]) == [3, 2, 2]
    assert MPI.Compute_dims(6, [0, 3]) == [2, 3]
    with pytest.raises(MPI.Exception):
        MPI.Compute_dims(7, [2, 0])


def _rank_mprobe_and_user_ops() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    bad: list = []
    # matched probe of a buffer message and of an object message
    comm.Send([np.arange(rank + 2, dtype=np.int32), MPI.INT], right, 21)
    comm.send({"rank": rank}, right, 22)
    st = MPI.Status()
    msg = comm.Mprobe(left, 21, st)
    got = np.zeros(st.Get_count(MPI.INT), np.int32)
    msg.Recv([got, MPI.INT])
    _check(bad, "Mprobe+Message.Recv", got, np.arange(left + 2))
    if msg != MPI.MESSAGE_NULL:
        bad.append(f"rank {rank}: a received Message is not MESSAGE_NULL")
    msg = None
    while msg is None:
        msg = comm.improbe(MPI.ANY_SOURCE, 22)
    if msg.recv() != {"rank": left}:
        bad.append(f"rank {rank}: improbe/recv")
    if comm.Mprobe(MPI.PROC_NULL) != MPI.MESSAGE_NO_PROC:
        bad.append(f"rank {rank}: Mprobe(PROC_NULL) is not MESSAGE_NO_PROC")
    # a non-commutative user op with mpi4py's signature: rank order kept
    def compose(inbuf, inoutbuf, datatype):      # 2x2 matrix product, row-major
        a = np.frombuffer(inbuf, dtype=datatype.tocode()).reshape(-1, 2, 2)
        b = np.frombuffer(inoutbuf, dtype=datatype.tocode()).reshape(-1, 2, 2)
        b[...] = a @ b
    op = MPI.Op.Create(compose, commute=False)
    mats = [np.array([[1.0, r + 1], [0.0, 1.0]]) @ np.array([[1.0, 0.0], [r % 2, 1.0]])
            for r in range(size)]
    out = np.zeros(4)
    comm.Allreduce([mats[rank].ravel(), MPI.DOUBLE], [out, MPI.DOUBLE], op=op)
    want = mats[0]
    for m in mats[1:]:
        want = want @ m
    if not np.allclose(out.reshape(2, 2), want):
        bad.append(f"rank {rank}: non-commutative user op gave {out.tolist()}, "
                   f"want {want.ravel().tolist()}")
    # the user function is told the datatype the call named (MPI.BYTE), not the one a
    # uint8 array maps to, in a collective as in Reduce_local (mpi4py's test_op)
    seen = []

    def bor(inbuf, inoutbuf, datatype):
        seen.append(datatype)
        b = np.frombuffer(inoutbuf, np.uint8)
        b |= np.frombuffer(inbuf, np.uint8)
    bor_op = MPI.Op.Create(bor, commute=True)
    flags = np.zeros(3, np.uint8)
    comm.Allreduce([np.full(3, 1 << (rank % 8), np.uint8), MPI.BYTE], [flags, MPI.BYTE],
                   op=bor_op)
    if flags.tolist() != [sum({1 << (r % 8) for r in range(size)})] * 3:
        bad.append(f"rank {rank}: BYTE bitwise-or user op gave {flags.tolist()}")
    if any(d != MPI.BYTE for d in seen):
        bad.append(f"rank {rank}: user op saw datatypes {seen}, want MPI.BYTE")
    bor_op.Free()
    op.Free()
    return bad


def test_matched_probe_and_user_ops(world):
    assert world.run(_rank_mprobe_and_user_ops) == [[]] * world.size


# -- an object that does not pickle ---------------------------------------------------------

def _rank_unpicklable() -> list:
    """The last rank passes a lock: as under mpi4py, its call raises pickle's TypeError
    (here also MPI.Exception, ERR_ARG), before anything is sent; its peers in the
    collective get MPI.Exception (where MPICH's would wait for ever), and the communicator
    is usable after."""
    import threading
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    culprit = size - 1
    bad: list = []
    for call in ("allgather", "bcast", "send", "ssend", "isend"):
        obj = threading.Lock() if rank == culprit else rank
        try:
            if call == "allgather":
                comm.allgather(obj)
            elif call == "bcast":
                comm.bcast(obj, root=culprit)
            elif rank == culprit:      # to itself: refused before anything is posted
                getattr(comm, call)(obj, dest=rank, tag=5)
            else:
                continue
            bad.append(f"rank {rank}: {call} returned")
        except TypeError as exc:
            if rank != culprit or not isinstance(exc, MPI.Exception) or \
                    exc.Get_error_class() != MPI.ERR_ARG or \
                    f"rank {rank}: {call}" not in str(exc) or "cannot pickle" not in str(exc):
                bad.append(f"rank {rank}: {call}: {type(exc).__name__}: {exc}")
        except MPI.Exception as exc:
            if rank == culprit or f"failed on rank {culprit}" not in str(exc):
                bad.append(f"rank {rank}: {call}: {exc}")
    if comm.allreduce(1) != size:
        bad.append(f"rank {rank}: the allreduce after is wrong")
    return bad


def test_an_object_that_does_not_pickle_is_a_type_error_as_under_mpi4py(world_small):
    assert world_small.run(_rank_unpicklable) == [[]] * world_small.size
