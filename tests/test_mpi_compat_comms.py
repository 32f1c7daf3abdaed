"""pycomm.MPI on real worlds: communicators, groups and topologies.

Dup/Compare/Free, Split (and UNDEFINED), Cartesian grids, group operations and the errors
MPI names (test_communicators_groups_topologies); neighbourhood collectives on a periodic
ring, a non-periodic grid and a distributed graph with a repeated edge; Isendrecv(_replace),
Split_type, Idup, Create_from_group, None buffers, Ireduce_scatter, Alltoallw and
persistent PROC_NULL requests. As in test_mpi_compat.py, each ``_rank_*`` function returns
a list of mismatches (empty when right).
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np

from pycomm import MPI
from test_mpi_compat import _check

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- communicators, groups, topologies, errors -------------------------------------------

def _rank_comms() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    if not (isinstance(comm, MPI.Intracomm) and isinstance(comm, MPI.Comm)):
        bad.append("COMM_WORLD is not an Intracomm")
    me = MPI.COMM_SELF
    if (me.Get_size(), me.Get_rank()) != (1, 0) or me.allreduce(rank) != rank:
        bad.append(f"rank {rank}: COMM_SELF")
    dup = comm.Dup()
    if dup == comm or dup.Compare(comm) != MPI.CONGRUENT or comm.Compare(comm) != MPI.IDENT:
        bad.append(f"rank {rank}: Dup/Compare")
    dup.Free()
    if dup != MPI.COMM_NULL:
        bad.append(f"rank {rank}: a freed communicator is not COMM_NULL")
    half = comm.Split(rank % 2, -rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    if half.size != len(members) or half.allgather(rank) != members[::-1]:
        bad.append(f"rank {rank}: Split gave {half.allgather(rank)}")
    none = comm.Split(MPI.UNDEFINED if rank == 0 else 1)
    if (rank == 0) != (none == MPI.COMM_NULL):
        bad.append(f"rank {rank}: Split(UNDEFINED) did not give COMM_NULL")
    # Cartesian grid over all ranks: a periodic ring of rows
    dims = MPI.Compute_dims(size, 2)
    cart = comm.Create_cart(dims, periods=[True, False])
    coords = cart.Get_coords(cart.rank)
    if cart.Get_cart_rank(coords) != cart.rank or cart.Get_topo()[0] != dims:
        bad.append(f"rank {rank}: cart coords {coords}")
    src, dst = cart.Shift(0, 1)
    got = np.zeros(1)
    cart.Sendrecv(np.array([float(cart.rank)]), dst, 0, got, src, 0)
    _check(bad, "cart shift", got, [float(src)])
    _, d1 = cart.Shift(1, 1)
    if coords[1] == dims[1] - 1 and d1 != MPI.PROC_NULL:
        bad.append(f"rank {rank}: non-periodic edge is not PROC_NULL")
    row = cart.Sub([False, True])
    if row.Get_size() != dims[1] or row.Get_topo()[0] != [dims[1]]:
        bad.append(f"rank {rank}: Sub gave size {row.Get_size()}")
    # groups
    g = comm.Get_group()
    evens = g.Range_incl([(0, size - 1, 2)])
    if evens.Get_size() != (size + 1) // 2 or g.Union(MPI.GROUP_EMPTY).Compare(g) != MPI.IDENT:
        bad.append(f"rank {rank}: group ops")
    if g.Difference(g).Get_size() != 0 or evens.Translate_ranks([0], g) != [0]:
        bad.append(f"rank {rank}: Difference/Translate_ranks")
    # errors: MPI.Exception with the right class, also the pycomm class, before any byte
    try:
        comm.Bcast(np.zeros(1), root=size)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_ROOT or not isinstance(exc, ValueError):
            bad.append(f"rank {rank}: bad root gave class {exc.Get_error_class()}")
    else:
        bad.append(f"rank {rank}: Bcast(root=size) did not raise")
    try:
        comm.Recv([np.zeros(2), MPI.DOUBLE], source=size)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_RANK or f"source={size}" not in str(exc):
            bad.append(f"rank {rank}: bad source gave {exc.Get_error_class()}: {exc}")
    else:
        bad.append(f"rank {rank}: Recv(source=size) did not raise")
    try:
        comm.Send(np.zeros(1), 0.5)
    except TypeError as exc:
        if "dest=0.5" not in str(exc):
            bad.append(f"rank {rank}: non-integral dest message: {exc}")
    else:
        bad.append(f"rank {rank}: Send(dest=0.5) did not raise")
    try:
        comm.Recv([np.zeros(1), MPI.DOUBLE], MPI.PROC_NULL, 0)
    except MPI.Exception as exc:
        bad.append(f"rank {rank}: Recv from PROC_NULL raised {exc}")
    if comm.Get_attr(MPI.TAG_UB) < 32767 or MPI.Query_thread() not in (
            MPI.THREAD_SINGLE, MPI.THREAD_FUNNELED, MPI.THREAD_SERIALIZED,
            MPI.THREAD_MULTIPLE):
        bad.append(f"rank {rank}: attributes")
    names = comm.allgather(MPI.Get_processor_name())
    if len(set(names)) != 1 or not names[0]:
        bad.append(f"rank {rank}: processor names {names}")
    return bad


def test_communicators_groups_topologies(world_small):
    assert world_small.run(_rank_comms) == [[]] * world_small.size


def _rank_neighbors() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    # a periodic ring: both neighbours' blocks, in MPI's order (source of Shift, then dest)
    ring = comm.Create_cart([size], periods=[True])
    left, right = ring.Shift(0, 1)
    got = np.full(4, -1, np.int32)
    ring.Neighbor_allgather([np.array([rank, 10 * rank], np.int32), MPI.INT], [got, MPI.INT])
    _check(bad, "ring allgather", got, [left, 10 * left, right, 10 * right])
    out = np.array([100 + rank, 200 + rank], np.float64)      # to left, to right
    got = np.zeros(2)
    ring.Neighbor_alltoall([out, 1, MPI.DOUBLE], [got, 1, MPI.DOUBLE])
    # from my left neighbour comes what it sent to ITS right (200 + left), and vice versa
    _check(bad, "ring alltoall", got, [200 + left, 100 + right])
    # a 2-D halo exchange on a non-periodic grid: edges are PROC_NULL and stay untouched
    dims = MPI.Compute_dims(size, 2)
    grid = comm.Create_cart(dims, periods=[False, False])
    nbrs = grid.inedges
    got = np.full(4, -7.0)
    grid.Neighbor_allgather(np.array([float(rank)]), got)
    _check(bad, "grid allgather", got,
           [float(n) if n != MPI.PROC_NULL else -7.0 for n in nbrs])
    if grid.neighbor_allgather(rank) != [n if n != MPI.PROC_NULL else None for n in nbrs]:
        bad.append(f"rank {rank}: neighbor_allgather objects")
    # a distributed graph with a repeated edge: i -> i+1 twice, i -> i+2 once
    dst = [(rank + 1) % size, (rank + 1) % size, (rank + 2) % size]
    src = [(rank - 1) % size, (rank - 1) % size, (rank - 2) % size]
    g = comm.Create_dist_graph_adjacent(src, dst)
    if g.Get_dist_neighbors()[:2] != (src, dst) or g.Get_dist_neighbors_count() != \
            (3, 3, False):
        bad.append(f"rank {rank}: dist graph neighbours {g.Get_dist_neighbors()}")
    sendv = np.arange(6, dtype=np.int64) + 1000 * rank
    recvv = np.zeros(6, np.int64)
    g.Neighbor_alltoallv([sendv, [1, 2, 3], [0, 1, 3], MPI.INT64_T],
                         [recvv, [1, 2, 3], [0, 1, 3], MPI.INT64_T])
    want = np.r_[1000 * src[0] + 0, 1000 * src[1] + np.arange(1, 3),
                 1000 * src[2] + np.arange(3, 6)]
    _check(bad, "dist graph alltoallv", recvv, want)
    agv = np.zeros(3, np.int64)
    g.Neighbor_allgatherv(np.array([rank], np.int64), [agv, [1, 1, 1], None, MPI.INT64_T])
    _check(bad, "dist graph allgatherv", agv, src)
    return bad


def test_neighbourhood_collectives(world_small):
    assert world_small.run(_rank_neighbors) == [[]] * world_small.size


def _rank_numpy_neighbour_lists() -> list:
    """Neighbour lists as numpy arrays, as mpipartition passes them (np.unique's result):
    one holding only rank 0 is falsy, one of two ranks has no truth value, and both must
    read as the ranks they hold."""
    import gc
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    for ranks in (np.array([0], np.int32), np.unique([(rank + 1) % size, 0])):
        g = comm.Create_dist_graph_adjacent(sources=ranks, destinations=ranks)
        if g.Get_dist_neighbors()[:2] != (ranks.tolist(), ranks.tolist()):
            bad.append(f"rank {rank}: neighbours {g.Get_dist_neighbors()} from {ranks!r}")
        g.Free()
    # the edges are symmetric only where every rank names the same ones: exchange over a
    # graph in which every rank receives from and sends to rank 0 alone
    src = np.array([0]) if rank else np.arange(1, size)
    g = comm.Create_dist_graph_adjacent(sources=src, destinations=src)
    got = np.full(len(src), -1, np.int64)
    g.Neighbor_allgather(np.array([rank], np.int64), got)
    _check(bad, "allgather over a graph given as numpy arrays", got, src)
    g.Free()

    # a topology freed by a finalizer while the garbage collector takes the communicator
    # and its handle together (mpipartition's Partition.__del__): the weak entry of the
    # topology is gone by then, and Free must still free
    class Holder:
        def __init__(self):
            self.cart = comm.Create_cart([size], periods=[True])
            self.graph = self.cart.Create_dist_graph_adjacent([0], [0])
            self.me = self                      # a cycle: only the collector frees it

        def __del__(self):
            try:
                self.graph.Free()
                self.cart.Free()
            except BaseException as exc:        # (a finalizer's error is only printed)
                bad.append(f"rank {rank}: Free in a finalizer: {exc!r}")
    Holder()
    gc.collect()
    return bad


def test_neighbour_lists_as_numpy_arrays_and_free_in_a_finalizer(world_small):
    assert world_small.run(_rank_numpy_neighbour_lists) == [[]] * world_small.size


def _rank_alltoallw_subarrays() -> list:
    """A pencil transpose as mpi4py-fft does it: Alltoallw of subarray datatypes turns
    rows split over the ranks into columns split over them; then an indexed type (no
    constant stride), IN_PLACE and Ialltoallw. Sizes reach past the scratch pool's 128 KiB
    and are not divisible by every world size."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    n0, n1, n2 = 2 * size + 1, 3 * size + 2, 600      # each rank: 144 KiB or more
    full = np.arange(n0 * n1 * n2, dtype=np.complex128).reshape(n0, n1, n2) * (1 + 1j)

    def cut(n, i):
        return n * i // size, n * (i + 1) // size
    a0, b0 = cut(n0, rank)
    a1, b1 = cut(n1, rank)
    rows = np.ascontiguousarray(full[a0:b0])            # my rows, all columns
    cols = np.zeros((n0, b1 - a1, n2), np.complex128)   # all rows, my columns
    ctype = MPI.DOUBLE_COMPLEX
    stypes = [ctype.Create_subarray(rows.shape, [b0 - a0, cut(n1, j)[1] - cut(n1, j)[0], n2],
                                    [0, cut(n1, j)[0], 0]).Commit() for j in range(size)]
    rtypes = [ctype.Create_subarray(cols.shape, [cut(n0, i)[1] - cut(n0, i)[0], b1 - a1, n2],
                                    [cut(n0, i)[0], 0, 0]).Commit() for i in range(size)]
    one, zero = [1] * size, [0] * size
    for rep in range(2):                                # (the second reuses the scratch)
        cols[...] = 0
        comm.Alltoallw([rows, (one, zero), stypes], [cols, (one, zero), rtypes])
        _check(bad, f"subarray transpose {rep}", cols, full[:, a1:b1])
    back = np.zeros_like(rows)
    req = comm.Ialltoallw([cols, (one, zero), rtypes], [back, (one, zero), stypes])
    req.Wait()
    _check(bad, "Ialltoallw back", back, rows)
    for t in stypes + rtypes:
        t.Free()

    # an indexed type without a constant stride (ints 0, 3 and 4 of each block of ten),
    # sent IN_PLACE
    itype = MPI.INT.Create_indexed_block(1, [0, 3, 4]).Commit()
    buf = np.arange(10 * size, dtype=np.int32) + 1000 * rank
    comm.Alltoallw(MPI.IN_PLACE, [buf, ([1] * size, [40 * j for j in range(size)]),
                                  [itype] * size])
    want = np.arange(10 * size, dtype=np.int32) + 1000 * rank
    for j in range(size):
        for k in (0, 3, 4):
            want[10 * j + k] = 1000 * j + 10 * rank + k
    _check(bad, "IN_PLACE indexed", buf, want)
    itype.Free()
    return bad


def test_alltoallw_subarray_transpose(world_small):
    assert world_small.run(_rank_alltoallw_subarrays) == [[]] * world_small.size


def _rank_alltoallw_kept_layouts() -> list:
    """Alltoallw keeps each spec's block layouts (pycomm.MPI.collspec.wregions), never
    the buffer: the same spec on another array moves that array's data, a changed count
    or buffer size is parsed again, a freed datatype is refused as before, and nothing
    keeps a buffer alive."""
    import weakref
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    col = MPI.DOUBLE.Create_vector(3, 1, size).Commit()     # column j of a 3 x size matrix
    spec = ([1] * size, [8 * j for j in range(size)])
    for rep in range(3):                    # the first call parses, the others hit
        src = np.arange(3.0 * size).reshape(3, size) + 100 * rank + 1000 * rep
        dst = np.zeros((3, size))
        comm.Alltoallw([src, spec, [col] * size], [dst, spec, [col] * size])
        want = np.array([[100 * i + 1000 * rep + k * size + rank for i in range(size)]
                         for k in range(3)])
        _check(bad, f"kept layout, array {rep}", dst, want)
    # elements without a constant stride (ints 0, 3 and 4 of each block of ten): the
    # layout keeps an index
    itype = MPI.INT.Create_indexed_block(1, [0, 3, 4]).Commit()
    ispec = ([1] * size, [40 * j for j in range(size)])
    for rep in range(2):
        src = np.arange(10 * size, dtype=np.int32) + 1000 * rank + 100000 * rep
        dst = np.full(10 * size, -1, np.int32)
        comm.Alltoallw([src, ispec, [itype] * size], [dst, ispec, [itype] * size])
        want = np.full(10 * size, -1, np.int32)
        for j in range(size):
            for k in (0, 3, 4):
                want[10 * j + k] = 1000 * j + 100000 * rep + 10 * rank + k
        _check(bad, f"kept indexed layout, array {rep}", dst, want)
    itype.Free()
    # a count changed: block j carries 0 columns to every peer but the next one
    counts = [1 if j == (rank + 1) % size else 0 for j in range(size)]
    rcounts = [1 if i == (rank - 1) % size else 0 for i in range(size)]
    dst = np.full((3, size), -1.0)
    src = np.arange(3.0 * size).reshape(3, size) + 100 * rank
    comm.Alltoallw([src, (counts, spec[1]), [col] * size],
                   [dst, (rcounts, spec[1]), [col] * size])
    left = (rank - 1) % size
    want = np.full((3, size), -1.0)
    want[:, left] = [100 * left + k * size + rank for k in range(3)]
    _check(bad, "a changed count", dst, want)
    # a larger buffer (other bounds): parsed again, same blocks
    big, out = np.zeros((4, size)), np.zeros((4, size))
    big[:3] = np.arange(3.0 * size).reshape(3, size) + 100 * rank
    comm.Alltoallw([big, spec, [col] * size], [out, spec, [col] * size])
    _check(bad, "a larger buffer", out[:3], [[100 * i + k * size + rank for i in range(size)]
                                              for k in range(3)])
    gone = np.zeros((3, size))
    ref = weakref.ref(gone)
    comm.Alltoallw([np.ones((3, size)), spec, [col] * size], [gone, spec, [col] * size])
    del gone
    if ref() is not None:
        bad.append(f"rank {rank}: a receive buffer outlived the call")
    col.Free()
    try:
        comm.Alltoallw([np.ones((3, size)), spec, [col] * size],
                       [np.zeros((3, size)), spec, [col] * size])
        bad.append(f"rank {rank}: a freed datatype was taken")
    except MPI.Exception:
        pass
    if comm.allreduce(1) != size:
        bad.append(f"rank {rank}: the communicator after the refused call")
    return bad


def _rank_alltoallw_own_block_sizes() -> list:
    """Rank 0 receives 1 int from itself but sends itself 2: rank 0's call is refused
    as a truncation before anything moves, the others learn of it in that call or (when
    their part was already done) at their next one, and then every rank goes on. A spec
    too short to be one is refused with its forms named."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    out: list = []
    displs = [8 * j for j in range(size)]
    rcounts = [1 if rank == 0 and j == 0 else 2 for j in range(size)]
    try:
        comm.Alltoallw([np.arange(2 * size, dtype=np.int32), ([2] * size, displs),
                        [MPI.INT] * size],
                       [np.zeros(2 * size, np.int32), (rcounts, displs), [MPI.INT] * size])
        out.append("ok")
    except MPI.Exception as exc:
        out.append(exc.Get_error_class() == MPI.ERR_TRUNCATE if rank == 0 else
                   "failed" if "failed on rank 0" in str(exc) else str(exc))
    x = np.ones(1)
    try:
        comm.Allreduce(MPI.IN_PLACE, x)
        out.append("ok")
    except MPI.Exception as exc:
        out.append("abandoned" if "was abandoned by another rank" in str(exc) else str(exc))
    x = np.ones(1)
    comm.Allreduce(MPI.IN_PLACE, x)
    out.append(float(x[0]))
    try:
        comm.Alltoallw([], [np.zeros(1), ([0] * size, [0] * size), [MPI.INT] * size])
        out.append("short spec taken")
    except MPI.Exception as exc:
        out.append("[buf, (counts, displs), datatypes]" in str(exc))
    out.append(comm.allreduce(1))
    return out


def test_alltoallw_own_block_sizes_that_differ_are_refused(world_small):
    n = world_small.size
    got = world_small.run(_rank_alltoallw_own_block_sizes)
    assert got[0] == [True, "ok", float(n), True, n]
    for out in got[1:]:
        assert out in (["ok", "abandoned", float(n), True, n],
                       ["failed", "ok", float(n), True, n]), out


def test_alltoallw_keeps_layouts_not_buffers(world_small):
    assert world_small.run(_rank_alltoallw_kept_layouts) == [[]] * world_small.size


def _rank_more_comm_surface() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    bad: list = []
    got = np.zeros(3, np.int32)
    req = comm.Isendrecv([np.full(3, rank, np.int32), MPI.INT], right, 31, [got, MPI.INT],
                         left, 31)
    req.Wait()
    _check(bad, "Isendrecv", got, [left] * 3)
    x = np.full(2, float(rank))
    comm.Isendrecv_replace(x, right, 32, left, 32).Wait()
    _check(bad, "Isendrecv_replace", x, [float(left)] * 2)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if node.Get_size() != size:          # one host in these tests
        bad.append(f"rank {rank}: Split_type gave {node.Get_size()} ranks")
    if comm.Split_type(MPI.UNDEFINED) != MPI.COMM_NULL:
        bad.append(f"rank {rank}: Split_type(UNDEFINED) is not COMM_NULL")
    dup, req = comm.Idup()
    req.Wait()
    if dup.Compare(comm) != MPI.CONGRUENT:
        bad.append(f"rank {rank}: Idup")
    group = comm.Get_group()
    made = MPI.Intracomm.Create_from_group(group)
    if made.Get_size() != size or made.allreduce(1) != size:
        bad.append(f"rank {rank}: Create_from_group")
    # None where MPI would pass a zero count: the root's / every rank's own block stays
    blocks = np.full(2 * size, -1, np.int32)
    blocks[2 * rank:2 * rank + 2] = rank
    comm.Allgather(None, [blocks, MPI.INT])
    _check(bad, "Allgather(None)", blocks[2 * rank:2 * rank + 2], [rank, rank])
    gathered = np.full(size, -1, np.int32)
    gathered[0] = 0
    comm.Gather(None if rank == 0 else np.array([rank], np.int32),
                gathered if rank == 0 else None, root=0)
    if rank == 0:
        _check(bad, "Gather(None at root)", gathered, np.arange(size))
    rs = np.zeros(1, np.int64)
    comm.Ireduce_scatter(np.ones(size, np.int64), rs, [1] * size, MPI.SUM).Wait()
    _check(bad, "Ireduce_scatter", rs, [size])
    # Alltoallw: block j is 2 ints at byte 8*j on the send side; on the receive side the
    # block from rank i lands in column i of a 2 x size matrix (a vector type per peer)
    sendw = np.array([[100 * rank + j, -(100 * rank + j)] for j in range(size)], np.int32)
    recvw = np.zeros((2, size), np.int32)
    colw = MPI.INT.Create_vector(2, 1, size).Commit()
    comm.Alltoallw([sendw, ([2] * size, [8 * j for j in range(size)]), [MPI.INT] * size],
                   [recvw, [1] * size, [4 * i for i in range(size)], [colw] * size])
    _check(bad, "Alltoallw", recvw, [[100 * i + rank for i in range(size)],
                                     [-(100 * i + rank) for i in range(size)]])
    preq = comm.Send_init(b"", MPI.PROC_NULL, 0)
    if MPI.Prequest(preq) != preq or type(MPI.Prequest(preq)) is not MPI.Prequest:
        bad.append(f"rank {rank}: a Prequest copy is not the same request")
    preq.Start()
    if not MPI.Request.Get_status_all([preq]) or not preq:
        bad.append(f"rank {rank}: Get_status_all of a PROC_NULL send")
    preq.Wait()
    preq.Free()
    if group.Translate_ranks([0, 0], group) != [0, 0]:
        bad.append(f"rank {rank}: Translate_ranks with a repeated rank")
    out = np.zeros(size, np.int64)
    comm.Allgatherv(np.array([rank], np.int64), [out, [1] * size])
    _check(bad, "Allgatherv", out, np.arange(size))
    return bad


def test_more_communicator_surface(world_small):
    assert world_small.run(_rank_more_comm_surface) == [[]] * world_small.size
