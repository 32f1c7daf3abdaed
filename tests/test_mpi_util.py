"""``mpi4py.util.dtlib`` and ``mpi4py.util.pkl5`` on pycomm (pycomm/MPI/_alias/mpi4py/util/)
under ``launch.py --mpi4py``.

One job per world size (2 and 3 ranks) runs the program below on every rank: dtlib round
trips (NumPy dtype -> MPI datatype -> NumPy dtype, compared with the original dtype, and
the MPI type's size and extent with the dtype's), a typed message through a converted
structured type, then pkl5's object communication (send/recv, isend, ssend, sendrecv,
probe, mprobe/improbe and Message.recv/irecv, bcast, gather, scatter, allgather, alltoall,
a 4 MB NumPy array that travels out of band, a part over a lowered ``blocksize``),
each result compared with the object that was sent. Each rank prints one JSON line: the
checks it ran and the failed ones with their error.
"""

from __future__ import annotations

import pytest

from mpi_checks import HARNESS, REPORT, run_checks

pytestmark = pytest.mark.usefixtures("no_shared_world")

PROGRAM = r'''
import json, pickle, sys, traceback
import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib, pkl5
''' + HARNESS + r'''

# -- dtlib ------------------------------------------------------------------------------
BASIC = ["?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d", "g", "F", "D",
         "G", "i1", "u2", "i4", "u8", "f4", "f8", "c8", "c16"]
COMPOUND = [
    np.dtype("i,d,b"),                                          # packed struct
    np.dtype("i,d,b", align=True),                              # aligned struct
    np.dtype([("x", "f8"), ("n", "i2"), ("c", "c16")], align=True),
    np.dtype({"names": ["a", "b"], "formats": ["i4", "f8"], "offsets": [0, 16],
              "itemsize": 32}),                                 # gaps and trailing pad
    np.dtype(("f8", (5,))),                                     # 1-d subarray
    np.dtype(("i4", (2, 3, 4))),                                # n-d subarray
    np.dtype([("p", "f4", (3,)), ("m", "i8", (2, 2))], align=True),
    np.dtype([("id", "i4"), ("pt", [("x", "f8"), ("y", "f8")]), ("tag", "u1", (3,))],
             align=True),                                       # nested struct
    np.dtype([("outer", [("inner", "i2", (3,)), ("d", "f8")], (2,)), ("z", "u1")]),
]


def round_trip(dt):
    dt = np.dtype(dt)
    mt = dtlib.from_numpy_dtype(dt)
    try:
        assert mt.Get_size() == sum_size(dt), (dt, mt.Get_size())
        assert mt.extent == dt.itemsize, (dt, mt.extent)
        back = dtlib.to_numpy_dtype(mt)
        assert back.itemsize == dt.itemsize, (dt, back)
        assert back.alignment == dt.alignment or not dt.isalignedstruct, (dt, back)
        assert same_layout(dt, back), (dt, back)
        again = dtlib.to_numpy_dtype(dtlib.from_numpy_dtype(back))
        assert again == back, (back, again)
        if not dt.fields:
            assert back == dt, (dt, back)
        return back
    finally:
        mt.Free()


def sum_size(dt):
    if dt.fields:
        return sum(sum_size(dt.fields[n][0]) for n in dt.names)
    if dt.subdtype:
        base, shape = dt.subdtype
        return sum_size(base) * int(np.prod(shape))
    return dt.itemsize


def leaves(dt, offset=0):
    """(offset, scalar dtype) of every element, in order."""
    if dt.fields:
        out = []
        for n in dt.names:
            out += leaves(dt.fields[n][0], offset + dt.fields[n][1])
        return out
    if dt.subdtype:
        base, shape = dt.subdtype
        return [x for i in range(int(np.prod(shape)))
                for x in leaves(base, offset + i * base.itemsize)]
    return [(offset, dt.str)]


def same_layout(a, b):
    return leaves(a) == leaves(b)


@check("dtlib basic")
def _():
    for code in BASIC:
        back = round_trip(code)
        assert back == np.dtype(code), (code, back)


@check("dtlib compound")
def _():
    for dt in COMPOUND:
        back = round_trip(dt)
        assert back.isalignedstruct or not dt.isalignedstruct, (dt, back)


@check("dtlib from MPI types")
def _():
    pairs = [(MPI.INT.Create_contiguous(4), np.dtype(("i", (4,)))),
             (MPI.DOUBLE.Create_subarray([2, 3], [2, 3], [0, 0]),
              np.dtype(("d", (2, 3)))),
             (MPI.DOUBLE.Create_subarray([2, 3], [2, 3], [0, 0],
                                         order=MPI.ORDER_FORTRAN),
              np.dtype(("d", (3, 2)))),
             (MPI.INT.Dup(), np.dtype("i"))]
    for mt, want in pairs:
        assert dtlib.to_numpy_dtype(mt) == want, (mt, want)
        mt.Free()
    vec = MPI.INT.Create_vector(3, 2, 4)
    dt = dtlib.to_numpy_dtype(vec)
    assert leaves(dt) == [(o, np.dtype("i").str) for o in (0, 4, 16, 20, 32, 36)], dt
    vec.Free()
    pair = dtlib.to_numpy_dtype(MPI.DOUBLE_INT)
    assert pair == np.dtype("d,i", align=True), pair
    for bad in (MPI.INT.Create_resized(0, 32), MPI.INT.Create_subarray([2], [1], [0])):
        try:
            dtlib.to_numpy_dtype(bad)
            raise AssertionError(f"{bad} converted")
        except ValueError:
            pass
        bad.Free()
    for bad in (np.dtype(">i" if np.dtype("<i").isnative else "<i"), np.dtype("O")):
        try:
            dtlib.from_numpy_dtype(bad)
            raise AssertionError(f"{bad} converted")
        except ValueError:
            pass


@check("dtlib typed message")
def _():
    dt = COMPOUND[7]
    mt = dtlib.from_numpy_dtype(dt).Commit()
    a = np.zeros(5, dtype=dt)
    a["id"] = np.arange(5) + rank
    a["pt"]["x"] = 1.5 * rank
    a["pt"]["y"] = np.arange(5) * 0.25
    a["tag"] = [7, 8, 9]
    b = np.zeros(5, dtype=dt)
    world.Sendrecv([a, mt], (rank + 1) % size, 3, [b, mt], (rank - 1) % size, 3)
    src = (rank - 1) % size
    assert list(b["id"]) == list(np.arange(5) + src), b
    assert np.all(b["pt"]["x"] == 1.5 * src) and np.all(b["tag"] == [7, 8, 9]), b
    mt.Free()


# -- pkl5 -------------------------------------------------------------------------------
comm = pkl5.Intracomm(world)
BASE = np.arange(1 << 19, dtype="f8")                           # 4 MiB


def big_of(r):
    return BASE * (r + 1)


big = big_of(rank)
OBJS = [None, 42, "text", {"k": [1, 2.5, (3, "x")]}, bytearray(b"b" * 100000),
        np.arange(10, dtype="i4")]


def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


dest, source = (rank + 1) % size, (rank - 1) % size


@check("pkl5 out of band")
def _():
    data, bufs = pkl5.pickle.dumps_oob(big)
    assert len(bufs) == 1 and memoryview(bufs[0]).nbytes == big.nbytes, len(bufs)
    assert len(data) < 1000, len(data)
    assert same(pkl5.pickle.loads_oob(data, bufs), big)


@check("pkl5 send recv")
def _():
    for i, obj in enumerate(OBJS + [big_of(0)]):
        if rank == 0:
            comm.send(obj, 1, tag=i)
        elif rank == 1:
            status = MPI.Status()
            got = comm.recv(None, 0, i, status)
            assert same(got, obj), (i, got)
            assert status.Get_source() == 0 and status.Get_tag() == i, status
    assert comm.recv(None, MPI.PROC_NULL) is None
    comm.send("x", MPI.PROC_NULL)


@check("pkl5 isend ssend sendrecv")
def _():
    reqs = [comm.isend(obj, dest, 10 + i) for i, obj in enumerate(OBJS)]
    got = [comm.recv(None, source, 10 + i) for i in range(len(OBJS))]
    assert pkl5.Request.waitall(reqs) == [None] * len(reqs)
    assert all(not r for r in reqs)
    assert all(map(same, got, OBJS)), got
    if rank == 0:
        comm.ssend(big, 1, 20)
        req = comm.issend(OBJS[3], 1, 21)
        req.wait()
    elif rank == 1:
        assert same(comm.recv(None, 0, 20), big_of(0))
        assert same(comm.recv(None, 0, 21), OBJS[3])
    got = comm.sendrecv(("from", rank, big), dest, 22, None, source, 22)
    assert got[:2] == ("from", source) and same(got[2], big_of(source))


@check("pkl5 probe mprobe")
def _():
    sreq = comm.isend({"r": rank, "a": big}, dest, 30)
    status = MPI.Status()
    comm.Probe(source, 30, status)
    assert status.Get_source() == source and status.Get_tag() == 30
    msg = comm.mprobe(source, 30, status)
    assert isinstance(msg, pkl5.Message) and msg
    assert status.Get_source() == source and status.Get_elements(MPI.BYTE) > big.nbytes
    got = msg.recv()
    assert got["r"] == source and same(got["a"], big_of(source))
    sreq.wait()
    comm.barrier()
    assert comm.improbe(source, 99) is None           # no tag 99 is ever sent
    comm.isend([rank] * 3, dest, 31).wait()
    msg = None
    while msg is None:
        msg = comm.improbe(source, 31)
    assert msg.irecv().wait() == [source] * 3
    req = comm.isend(OBJS[5], dest, 32)
    got = pkl5.Message.probe(comm, source, 32).irecv()
    assert same(got.wait(), OBJS[5]) and not got
    req.wait()
    msg = comm.mprobe(MPI.PROC_NULL)
    assert msg == MPI.MESSAGE_NO_PROC and msg.recv() is None


@check("pkl5 collectives")
def _():
    mine = {"rank": rank, "a": big}
    for root in range(size):
        got = comm.bcast(mine if rank == root else None, root)
        assert got["rank"] == root and same(got["a"], big_of(root))
        got = comm.gather(mine, root)
        if rank == root:
            assert [g["rank"] for g in got] == list(range(size))
            assert all(same(g["a"], big_of(g["rank"])) for g in got)
        else:
            assert got is None
        objs = [(root, d, np.full(1000, d)) for d in range(size)] if rank == root else None
        got = comm.scatter(objs, root)
        assert got[:2] == (root, rank) and same(got[2], np.full(1000, rank))
    got = comm.allgather(("ag", rank, np.arange(rank + 3)))
    assert [g[1] for g in got] == list(range(size))
    assert all(same(g[2], np.arange(g[1] + 3)) for g in got)
    got = comm.alltoall([(rank, d, np.full(50000, rank * 10 + d)) for d in range(size)])
    assert [g[:2] for g in got] == [(s, rank) for s in range(size)]
    assert all(same(g[2], np.full(50000, s * 10 + rank)) for s, g in enumerate(got))
    try:
        comm.alltoall([None] * (size + 1))
        raise AssertionError("alltoall took size + 1 objects")
    except ValueError:
        pass


@check("pkl5 blocksize")
def _():
    saved = pkl5._bigmpi
    pkl5._bigmpi = pkl5._BigMPI()
    pkl5._bigmpi.blocksize = 1000               # parts over 1000 bytes: contiguous types
    try:
        got = comm.sendrecv((rank, big[:5000]), dest, 40, None, source, 40)
        assert got[0] == source and same(got[1], big_of(source)[:5000])
        got = comm.bcast(big[:3000] if rank == 0 else None, 0)
        assert same(got, big_of(0)[:3000])
    finally:
        pkl5._bigmpi = saved
''' + REPORT

CHECKS = ["dtlib basic", "dtlib compound", "dtlib from MPI types", "dtlib typed message",
          "pkl5 out of band", "pkl5 send recv", "pkl5 isend ssend sendrecv",
          "pkl5 probe mprobe", "pkl5 collectives", "pkl5 blocksize"]


@pytest.mark.parametrize("n", [2, 3])
def test_dtlib_and_pkl5(n, tmp_path):
    pytest.importorskip("numpy")
    run_checks(tmp_path, PROGRAM, n, CHECKS, timeout=60)