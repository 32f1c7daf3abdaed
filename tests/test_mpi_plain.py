"""The façade's plain-array way (pycomm.MPI.msg.plain): the common call of an mpi4py
program, a C-contiguous numpy array of a predefined numeric dtype, goes straight to the
Communicator (Send, Recv, Isend, Irecv, Sendrecv, Bcast, Reduce, Allreduce,
Reduce_scatter_block, Allgather, Alltoall, Gather, Scatter, Scan, Exscan);
every other spec takes the general parse.

* which specs are plain: C-contiguous arrays of numeric dtypes with a predefined
  datatype, of any shape (viewed 1-D, no copy), writable where written; not a
  non-contiguous, read-only-when-written, byte-swapped, structured or object array, nor a
  list spec or another buffer type;
* on real worlds (2 and 3 ranks, shm and tcp), each of the fifteen calls gives numpy's
  result for plain arrays of several shapes and dtypes, IN_PLACE, every root, and for the
  specs beside them that go the general way (a [buf, count, datatype] list, a column of a
  2-D array, a numpy integer root), and raises what the general way raises for a
  read-only receive buffer and OP_NULL.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import World
from pycomm import MPI
from pycomm.MPI.msg import plain

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_which_specs_are_plain():
    a = np.arange(12.0)
    assert plain(a, True) is a                       # 1-D: the array itself
    grid = a.reshape(3, 4)
    flat = plain(grid, True)
    assert flat.shape == (12,) and np.shares_memory(flat, grid)    # a view, no copy
    assert plain(np.ones((), np.float32), False).shape == (1,)       # 0-d
    assert plain(np.float64(3.0), False) is None                      # a numpy scalar
    for dtype in (np.int8, np.uint16, np.int32, np.int64, np.float32, np.complex128,
                  np.bool_):
        assert plain(np.zeros(3, dtype), True) is not None, dtype
    ro = np.zeros(4)
    ro.flags.writeable = False
    assert plain(ro, False) is ro and plain(ro, True) is None       # written: general way
    assert plain(grid[:, 1], False) is None                          # non-contiguous
    assert plain(np.zeros(3, ">f8" if sys.byteorder == "little" else "<f8"), False) is None
    assert plain(np.zeros(3, [("x", "f8"), ("y", "i4")]), False) is None
    assert plain(np.zeros(3, object), False) is None
    assert plain([a, MPI.DOUBLE], False) is None
    assert plain(bytearray(8), True) is None
    assert plain(memoryview(a), False) is None


def _rank_calls() -> list:
    comm = MPI.COMM_WORLD
    r, n = comm.rank, comm.size
    bad = []

    def check(label, got, want):
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            bad.append(f"rank {r}: {label}: got {np.asarray(got).ravel()[:6].tolist()} want "
                       f"{np.asarray(want).ravel()[:6].tolist()}")

    for shape in ((5,), (2, 3), ()):
        for dtype in (np.float64, np.int32, np.uint8):
            base = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)

            def at(k, base=base, dtype=dtype):
                # base + k in base's dtype (a numpy scalar for shape ()), as NumPy 2 has
                # it: NumPy 1 makes a 0-d int32 + an int an int64
                return np.asarray(base + k, dtype=dtype)[()]
            tag = f"{shape} {np.dtype(dtype).name}"
            for root in range(n):
                buf = at(root) if r == root else np.zeros_like(base)
                comm.Bcast(buf, root)
                check(f"Bcast {tag} root {root}", buf, at(root))
                out = np.full_like(base, 7)
                comm.Reduce(at(r), out if r == root else None, MPI.SUM, root)
                check(f"Reduce {tag} root {root}", out,
                      sum(at(k) for k in range(n)) if r == root else np.full_like(base, 7))
            out = np.zeros_like(base)
            comm.Allreduce(at(r), out, MPI.MAX)
            check(f"Allreduce {tag}", out, at(n - 1))
            inplace = np.asarray(at(r))      # (0-d: at(r) is a numpy scalar)
            comm.Allreduce(MPI.IN_PLACE, inplace, MPI.SUM)
            check(f"Allreduce IN_PLACE {tag}", inplace, sum(at(k) for k in range(n)))
            gathered = np.zeros((n,) + shape, dtype)
            comm.Allgather(at(r), gathered)
            check(f"Allgather {tag}", gathered, np.stack([at(k) for k in range(n)]))
            block = np.zeros_like(base)
            comm.Reduce_scatter_block(np.stack([at(r)] * n), block, MPI.SUM)
            check(f"Reduce_scatter_block {tag}", block, sum(at(k) for k in range(n)))
            mine = np.stack([at(10 * r + j) for j in range(n)])
            got = np.zeros_like(mine)
            comm.Alltoall(mine, got)
            check(f"Alltoall {tag}", got, np.stack([at(10 * k + r) for k in range(n)]))
            inplace = mine.copy()
            comm.Alltoall(MPI.IN_PLACE, inplace)
            check(f"Alltoall IN_PLACE {tag}", inplace, got)
            for root in range(n):
                out = np.full((n,) + shape, 7, dtype)
                comm.Gather(at(r), out if r == root else None, root)
                check(f"Gather {tag} root {root}", out, np.stack(
                    [at(k) for k in range(n)]) if r == root else np.full_like(out, 7))
                part = np.zeros_like(base)
                comm.Scatter(mine if r == root else None, part, root)
                check(f"Scatter {tag} root {root}", part, at(10 * root + r))
            out = np.zeros_like(base)
            comm.Scan(at(r), out, MPI.SUM)
            check(f"Scan {tag}", out, sum(at(k) for k in range(r + 1)))
            out = np.full_like(base, 7)
            comm.Exscan(at(r), out, MPI.SUM)
            check(f"Exscan {tag}", out, sum(at(k) for k in range(r)) if r else
                  np.full_like(base, 7))
            # p2p around the ring
            got = np.zeros_like(base)
            if r % 2 == 0:
                comm.Send(at(r), (r + 1) % n, 3)
                comm.Recv(got, (r - 1) % n, 3)
            else:
                comm.Recv(got, (r - 1) % n, 3)
                comm.Send(at(r), (r + 1) % n, 3)
            check(f"Send/Recv {tag}", got, at((r - 1) % n))
            got = np.zeros_like(base)
            reqs = [comm.Irecv(got, (r + 1) % n, 4), comm.Isend(at(r), (r - 1) % n, 4)]
            MPI.Request.Waitall(reqs)
            check(f"Isend/Irecv {tag}", got, at((r + 1) % n))
            got = np.zeros_like(base)
            comm.Sendrecv(at(r), (r + 1) % n, 5, got, (r - 1) % n, 5)
            check(f"Sendrecv {tag}", got, at((r - 1) % n))

    # Plain arrays reach the Communicator without the general parse (_send_recv for
    # buffers, _allv for vector specs), which is counted here while they run.
    general, saved = [], {name: getattr(MPI.Intracomm, name) for name in ("_send_recv",
                                                                           "_allv")}
    for name, fn in saved.items():
        setattr(MPI.Intracomm, name, lambda self, *a, _fn=fn, _name=name, **k:
                (general.append(_name), _fn(self, *a, **k))[1])
    try:
        x, y = np.arange(2.0 * n) + r, np.zeros(2 * n)
        comm.Alltoall(x, y)
        comm.Gather(x[:2], y if r == 0 else None, 0)
        comm.Scatter(x if r == 0 else None, y[:2], 0)
        comm.Scan(x, y, MPI.SUM)
        comm.Exscan(x, y, MPI.SUM)
        counts, displs = [2] * n, list(range(0, 2 * n, 2))
        comm.Alltoallv([x, (counts, displs), MPI.DOUBLE], [y, (counts, displs), MPI.DOUBLE])
        check("Alltoallv plain", y,     # (rank k's block r: 2 r + k, 2 r + 1 + k)
              np.concatenate([np.arange(2 * r, 2 * r + 2.0) + k for k in range(n)]))
    finally:
        for name, fn in saved.items():
            setattr(MPI.Intracomm, name, fn)
    if general:
        bad.append(f"rank {r}: plain calls took the general way: {general}")

    # beside them, the general way: a count and a datatype, a column, a numpy root
    x = np.arange(6.0) if r == 0 else np.zeros(6)
    comm.Bcast([x, 4, MPI.DOUBLE], np.int64(0))
    check("Bcast [buf, 4, DOUBLE]", x, np.r_[np.arange(4.0), [0.0] * 2 if r else [4, 5]])
    grid = np.arange(12.0).reshape(3, 4) + 10 * r
    column = MPI.DOUBLE.Create_vector(3, 1, 4).Commit()
    out = np.zeros(3)
    comm.Allreduce([grid, 1, column], out, MPI.SUM)
    check("Allreduce column", out, sum(np.arange(0, 12.0, 4) + 10 * k for k in range(n)))
    column.Free()
    st = MPI.Status()
    if n > 1 and r < 2:
        if r == 0:
            comm.Send(np.arange(3, dtype=np.int32), 1, 5)
        else:
            got = np.zeros(3, np.int32)
            comm.Recv(got, 0, 5, st)
            check("Recv status", [st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT)],
                  [0, 5, 3])

    # errors as the general way raises them: a read-only receive buffer (a numpy scalar
    # too, as mpi4py refuses it: a receive into a copy of it would be lost), OP_NULL
    ro = np.zeros(4)
    ro.flags.writeable = False
    for label, call in (("Allreduce", lambda: comm.Allreduce(np.ones(4), ro, MPI.SUM)),
                        ("Allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, np.float64(3),
                                                             MPI.SUM)),
                        ("Allreduce OP_NULL",
                         lambda: comm.Allreduce(np.ones(4), np.zeros(4), MPI.OP_NULL))):
        try:
            call()
            bad.append(f"rank {r}: {label}: no error")
        except MPI.Exception as exc:
            want = MPI.ERR_BUFFER if label == "Allreduce" else MPI.ERR_OP
            if exc.Get_error_class() != want:
                bad.append(f"rank {r}: {label}: error class {exc.Get_error_class()}")
    comm.Barrier()
    return bad


@pytest.fixture(scope="session", params=[(2, "shm"), (3, "shm"), (3, "tcp")],
                ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    return World(*request.param)


def test_which_vector_specs_take_the_short_way():
    from pycomm.MPI.msg import plain_vector
    a = np.arange(6.0)
    for spec in ([a, ([1, 2], [0, 3])], [a, ((1, 2), (0, 3)), MPI.DOUBLE],
                 [a, [1, 2], [0, 3]], [a, [1, 2], [0, 3], MPI.DOUBLE]):
        m, counts, displs = plain_vector(spec, 2, True)
        assert m.array is a and (counts, displs) == ([1, 2], [0, 3])
    for spec in ([a, ([1, 2], [0, 5])],                 # block 1 overruns: the general way
                 [a, ([1, 2], [0, 3]), MPI.FLOAT],      # another dtype
                 [a, ([1, np.int64(2)], [0, 3])],       # a numpy integer
                 [a, (1, 2)], [a, [1, 2]], [a[::2], ([1, 1], [0, 1])]):
        assert plain_vector(spec, 2, True) is None, spec
    # The last accepted pair is kept; an equal pair is taken without the walk, but only
    # of ints, and only where its blocks fit this array.
    assert plain_vector([a, ([1, 2], [0, 3])], 2, True)[1:] == ([1, 2], [0, 3])
    for spec in ([a[:4], ([1, 2], [0, 3])], [a, ([1.0, 2], [0, 3])],
                 [a, ([1, 2], [0, np.int64(3)])], [a, ([True, 2], [0, 3])]):
        assert plain_vector(spec, 2, True) is None, spec
    assert plain_vector([a[:5], ([1, 2], [0, 3])], 2, True)[1:] == ([1, 2], [0, 3])


_SPEC_SHAPES = ["pair", "pair+type", "lists", "lists+type", "pair+other type"]


@given(size=st.integers(1, 5), n=st.integers(0, 12),
       shape=st.sampled_from(_SPEC_SHAPES),
       counts=st.lists(st.integers(-1, 6), min_size=0, max_size=6),
       displs=st.lists(st.integers(-1, 12), min_size=0, max_size=6),
       as_tuples=st.booleans(), writable=st.booleans(), frozen=st.booleans())
@settings(max_examples=400, deadline=None)
# found by a suite run: a tuple second item of three is mpi4py's (counts, displs) pair,
# the third then a datatype; the short way took the tuples as counts and displacements
@example(size=2, n=0, shape="lists", counts=[0, 0], displs=[0, 0], as_tuples=True,
         writable=False, frozen=False)
def test_plain_vector_specs_parse_as_the_general_way(size, n, shape, counts, displs,
                                                      as_tuples, writable, frozen):
    """pycomm.MPI.msg.plain_vector, the v-collectives' short way, gives the general
    parse's array, counts and displacements, or declines (None) and leaves the spec to it:
    every spec it takes, the general way takes alike; none it refuses is taken."""
    from pycomm.MPI import msgspec
    buf = np.arange(float(n))
    buf.flags.writeable = not frozen
    seq = tuple if as_tuples else list
    c, d = seq(counts), seq(displs)
    dt = {"pair+type": MPI.DOUBLE, "lists+type": MPI.DOUBLE,
          "pair+other type": MPI.INT64_T}.get(shape)
    spec = {"pair": [buf, (c, d)], "pair+type": [buf, (c, d), dt],
            "pair+other type": [buf, (c, d), dt], "lists": [buf, c, d],
            "lists+type": [buf, c, d, dt]}[shape]
    fast = msgspec.plain_vector(spec, size, writable)

    def general():
        saved = msgspec.plain_vector
        msgspec.plain_vector = lambda *a: None
        try:
            return msgspec.vector_message(spec, size, "rank 0: Alltoallv", "recvbuf",
                                          writable=writable)
        finally:
            msgspec.plain_vector = saved
    try:
        m, gc, gd = general()
    except (MPI.Exception, TypeError, ValueError):
        assert fast is None, (spec, size)
        return
    if fast is None:
        return
    assert fast[0].array.dtype == m.array.dtype
    assert n == 0 or np.shares_memory(fast[0].array, buf)       # the array, no copy
    assert fast[0].array.size == m.array.size and fast[0]._unpack is None
    assert (fast[1], fast[2]) == (gc, gd)
    assert type(fast[1]) is list and type(fast[2]) is list


def test_plain_calls_match_numpy_and_the_general_way(world):
    for bad in world.run(_rank_calls):
        assert bad == [], bad[:5]
