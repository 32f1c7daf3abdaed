"""pycomm.MPI send modes and ranks that move nothing, on real worlds.

* Synchronous mode: ``Ssend``/``Issend``/``Ssend_init``/``ssend``/``issend`` complete only
  once the matching receive has started (the rendezvous at every size, even 0 bytes),
  where a standard send of the same 8 bytes completes before any receive is posted.
* A rank whose count is 0 in the v-collectives (``None``, an empty array, a zero count)
  gets mpi4py's semantics.

Each ``_rank_*`` function runs on the ranks and returns a list of what was wrong.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import numpy as np
import pytest

import pycomm
from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOLD_S = 0.3        # seconds a late rank holds back the nonblocking v-collectives
# seconds the receiver keeps a synchronous send waiting: the pending checks only get
# shorter (a send that completes early still completes at once, well inside it), and the
# blocking forms measure from before a "go" that the receiver waits for, so their lower
# bound holds on a loaded machine however short this is
SYNC_HOLD_S = 0.1


def _pending_for(req, seconds: float, lower: bool = False) -> bool:
    """Whether ``req`` stays incomplete for ``seconds`` of repeated tests."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if (req.test()[0] if lower else req.Test()):
            return False
        time.sleep(0.01)
    return True


def _rank_synchronous() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    bad: list = []
    # to itself: pending until its own receive takes it (or cancelled)
    s = comm.Issend(np.array([1.0, 2.0]), rank, 5)
    if not _pending_for(s, 0.05):
        bad.append("an Issend to itself completed before its receive")
    got = np.zeros(2)
    comm.Recv(got, rank, 5)
    s.Wait()
    if got.tolist() != [1.0, 2.0]:
        bad.append(f"self Issend got {got.tolist()}")
    s = comm.Issend(np.array([3.0]), rank, 6)
    s.Cancel()
    st = MPI.Status()
    s.Wait(st)
    if not st.Is_cancelled() or comm.Iprobe(rank, 6):
        bad.append("a cancelled Issend to itself was not withdrawn")
    r = comm.Irecv(got, rank, 7)            # a receive already posted: complete at once
    if not comm.Issend(np.array([4.0, 5.0]), rank, 7).Test() or not r.Test():
        bad.append("an Issend to itself with its receive posted did not complete")
    if size == 1:
        return bad
    if rank > 1:
        comm.Barrier()
        return bad
    msg = np.arange(2, dtype=np.int32) + 7       # 8 bytes: eager for a standard send
    starts = {
        "Issend": lambda: comm.Issend(msg, 1, 11),
        "Issend 0 bytes": lambda: comm.Issend([np.empty(0), MPI.DOUBLE], 1, 11),
        "Ssend_init": lambda: _started(comm.Ssend_init(msg, 1, 11)),
        "issend": lambda: comm.issend({"x": 1}, 1, 11),
    }
    for name, start in starts.items():
        if rank == 0:
            req = start()
            if not _pending_for(req, SYNC_HOLD_S, lower=name == "issend"):
                bad.append(f"{name} completed before the receive was posted")
            comm.send("go", 1, 12)
            req.Wait()
        else:
            comm.recv(source=0, tag=12)
            if name == "issend":
                if comm.recv(source=0, tag=11) != {"x": 1}:
                    bad.append("issend delivered the wrong object")
            else:
                got = np.zeros(2, dtype=np.int32)
                st = MPI.Status()
                comm.Recv(got, MPI.ANY_SOURCE, 11, st)
                want = [0, 0] if "0 bytes" in name else [7, 8]
                if got.tolist() != want or st.Get_count(MPI.BYTE) != 8 * (want[0] != 0):
                    bad.append(f"{name}: got {got.tolist()}, {st.Get_count(MPI.BYTE)} B")
    # the contrast: a standard send of the same bytes is out before any receive
    if rank == 0:
        req = comm.Isend(msg, 1, 13)
        if _pending_for(req, HOLD_S):       # returns at once when the send completes
            bad.append("a standard Isend of 8 bytes waited for the receive")
        comm.send("go", 1, 12)
    else:
        comm.recv(source=0, tag=12)
        comm.Recv(np.zeros(2, dtype=np.int32), 0, 13)
    # blocking forms return only after the receiver's late receive
    for name in ("Ssend", "ssend", "core Ssend"):
        if rank == 0:
            t0 = time.monotonic()
            comm.send("go", 1, 16)           # rank 1 starts its hold only after t0
            if name == "Ssend":
                comm.Ssend([msg, MPI.INT], 1, 14)
            elif name == "ssend":
                comm.ssend([1, 2], 1, 14)
            else:
                pycomm.COMM_WORLD.Ssend(msg, 1, 14)
            if time.monotonic() - t0 < SYNC_HOLD_S:
                bad.append(f"{name} returned after {time.monotonic() - t0:.3f} s, before "
                           f"the receive posted {SYNC_HOLD_S} s late")
        else:
            comm.recv(source=0, tag=16)
            time.sleep(SYNC_HOLD_S)
            if name == "ssend":
                comm.recv(source=0, tag=14)
            else:
                comm.Recv(np.zeros(2, dtype=np.int32), 0, 14)
    # a synchronous send nobody receives can be cancelled
    if rank == 0:
        req = comm.Issend(msg, 1, 15)
        req.Cancel()
        st = MPI.Status()
        req.Wait(st)
        if not st.Is_cancelled():
            bad.append("a cancelled Issend is not cancelled")
    comm.Barrier()
    return bad


def _started(preq):
    preq.Start()
    return preq


# Only ranks 0 and 1 exchange anything (ranks above 1 wait in a Barrier): one rank (the
# self sends), a pair, and a pair beside an idle rank cover it on each transport, the
# emulated rdma one included; larger worlds only add idle ranks. One rank runs no
# transport (conftest's docstring): its self sends run once, on shm.
SYNC_WORLDS = ([(1, "shm")] + [(n, t) for t in ("shm", "tcp") for n in (2, 3)]
               + [(2, "rdma"), (3, "rdma")])


@pytest.mark.parametrize("world", SYNC_WORLDS, indirect=True,
                         ids=[f"n{n}-{t}" for n, t in SYNC_WORLDS])
def test_synchronous_sends_complete_after_the_receive_started(world):
    assert world.run(_rank_synchronous) == [[]] * world.size


# -- Ireduce_scatter and Ialltoallw return before the collective is done --------------------

def _rank_nonblocking_v() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    bad: list = []
    late = size - 1 if size > 1 else None
    counts = [i + 1 for i in range(size)]
    total = sum(counts)
    send = np.arange(total, dtype=np.float64) * (rank + 1)
    want_rs = (np.arange(total) * sum(range(1, size + 1)))[sum(counts[:rank]):][:rank + 1]
    # Alltoallw: block j of INTs to rank j (j + 1 of them), received through a stride-2
    # vector type (unpacked when the request completes)
    sdispl = [4 * sum(counts[:j]) for j in range(size)]
    out = np.concatenate([np.full(j + 1, rank * 100 + j, dtype=np.int32) for j in range(size)])
    vec = MPI.INT.Create_vector(rank + 1, 1, 2).Commit()
    got = np.full(2 * (rank + 1) * size, -1, dtype=np.int32)
    rdispl = [4 * 2 * (rank + 1) * i for i in range(size)]
    if rank == late:
        time.sleep(HOLD_S)
    res = np.zeros(rank + 1)
    t0 = time.monotonic()
    reqs = [comm.Ireduce_scatter([send, MPI.DOUBLE], [res, MPI.DOUBLE], counts, op=MPI.SUM),
            comm.Ialltoallw([out, counts, sdispl, [MPI.INT] * size],
                            [got, [1] * size, rdispl, [vec] * size])]
    posted = time.monotonic() - t0
    if late is not None and rank != late and posted > HOLD_S / 2:
        bad.append(f"posting took {posted:.3f} s: it waited for the late rank")
    MPI.Request.Waitall(reqs)
    if not np.array_equal(res, want_rs):
        bad.append(f"Ireduce_scatter got {res.tolist()} want {want_rs.tolist()}")
    blocks = got.reshape(size, 2 * (rank + 1))
    if not (np.array_equal(blocks[:, 0::2], np.add.outer(np.arange(size) * 100, [rank] *
                                                         (rank + 1)))
            and (blocks[:, 1::2] == -1).all()):
        bad.append(f"Ialltoallw got {blocks.tolist()}")
    # recvcounts None: the counts are each rank's recvbuf size, agreed first (as mpi4py)
    res2 = np.zeros(rank + 1)
    comm.Ireduce_scatter(send, res2, None, op=MPI.SUM).Wait()
    if not np.array_equal(res2, want_rs):
        bad.append(f"Ireduce_scatter(recvcounts=None) got {res2.tolist()}")
    vec.Free()
    return bad


def test_ireduce_scatter_and_ialltoallw_are_nonblocking(world_small):
    assert world_small.run(_rank_nonblocking_v) == [[]] * world_small.size


# -- a rank whose count is 0 in the v-collectives -------------------------------------------

def _nothing(kind: str):
    """What a rank that moves nothing passes, as mpi4py programs write it."""
    return {"None": None, "empty int8": np.empty(0, np.int8),
            "zero count": [np.empty(0), 0, MPI.DOUBLE]}[kind]


def _rank_zero_counts(kind: str) -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    bad: list = []

    def check(label, got, want):
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            bad.append(f"{kind} {label}: got {np.asarray(got).tolist()} want "
                       f"{np.asarray(want).tolist()}")
    for root in sorted({0, size - 1}):
        for zero in sorted({0, size // 2, size - 1}):     # the rank with nothing to move
            counts = [0 if i == zero else i + 1 for i in range(size)]
            displs = [sum(counts[:i]) for i in range(size)]
            tot = sum(counts)
            everyone = np.concatenate([np.full(c, float(i)) for i, c in enumerate(counts)]
                                      or [np.empty(0)])
            mine = _nothing(kind) if rank == zero else np.full(counts[rank], float(rank))
            at = f"root {root}, rank {zero} moves nothing"
            # Gatherv / Igatherv
            for blocking in (True, False):
                rb = np.full(tot, -1.0) if rank == root else None
                spec = [rb, counts, displs, MPI.DOUBLE] if rank == root else None
                if blocking:
                    comm.Gatherv(mine, spec, root=root)
                else:
                    comm.Igatherv(mine, spec, root=root).Wait()
                if rank == root:
                    check(f"Gatherv ({at}, blocking={blocking})", rb, everyone)
            # Scatterv / Iscatterv
            for blocking in (True, False):
                sb = np.arange(tot, dtype=np.float64) if rank == root else None
                spec = [sb, counts, displs, MPI.DOUBLE] if rank == root else None
                rb = _nothing(kind) if rank == zero else np.zeros(counts[rank])
                if blocking:
                    comm.Scatterv(spec, rb, root=root)
                else:
                    comm.Iscatterv(spec, rb, root=root).Wait()
                if rank != zero:
                    check(f"Scatterv ({at})", rb,
                          np.arange(displs[rank], displs[rank] + counts[rank]))
            # Allgatherv
            rb = np.full(tot, -1.0)
            comm.Allgatherv(mine, [rb, counts, displs, MPI.DOUBLE])
            check(f"Allgatherv ({at})", rb, everyone)
            # Alltoallv: the zero rank sends and receives nothing, in its own dtypes
            sc = [0 if zero in (rank, j) else 1 for j in range(size)]
            if rank == zero:
                send = [np.empty(0, np.int64), sc, None, MPI.LONG]
                recv = [np.empty(0, np.int16), sc, None, MPI.SHORT]
            else:
                send = [np.full(sum(sc), float(rank)), sc, None, MPI.DOUBLE]
                recv = [np.full(sum(sc), -1.0), sc, None, MPI.DOUBLE]
            comm.Alltoallv(send, recv)
            if rank != zero:
                check(f"Alltoallv ({at})", recv[0], [i for i in range(size) if i != zero])
            # Reduce_scatter: the zero rank gets nothing
            rb = np.zeros(counts[rank])
            comm.Reduce_scatter(np.ones(tot), rb, counts, op=MPI.SUM)
            check(f"Reduce_scatter ({at})", rb, np.full(counts[rank], float(size)))
    return bad


@pytest.mark.parametrize("kind", ["None", "empty int8", "zero count"])
def test_a_rank_with_count_zero_in_v_collectives(world_small, kind):
    assert world_small.run(_rank_zero_counts, kind) == [[]] * world_small.size


# -- object receives as mpi4py 4 -------------------------------------------------------

def _rank_object_receives() -> list:
    import warnings
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    bad: list = []
    # an empty buffer message received as an object is None
    s = comm.Isend([None, 0, "B"], rank, 3)
    if comm.recv(None, rank, 3) is not None:
        bad.append("an empty message was not received as None")
    s.Wait()
    # recv(buf): deprecated in mpi4py, a UserWarning, the buffer ignored
    req = comm.isend([42], rank, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = comm.recv(bytearray(1), rank, 4)
    req.wait()
    if got != [42] or not any(issubclass(w.category, UserWarning) for w in seen):
        bad.append(f"recv(buf) got {got!r}, warnings {[str(w.message) for w in seen]}")
    # waitsome/testsome grow the statuses list to the requests completed
    reqs = [comm.irecv(source=rank, tag=10 + i) for i in range(3)]
    comm.send("x", rank, 11)
    statuses: list = []
    idxs, objs = MPI.Request.waitsome(reqs, statuses)
    if idxs != [1] or objs != ["x"] or [s.Get_tag() for s in statuses] != [11]:
        bad.append(f"waitsome: {idxs}, {objs}, {len(statuses)} statuses")
    for i in (0, 2):
        comm.send(i, rank, 10 + i)
    MPI.Request.waitall(reqs)
    return bad


def test_object_receives_as_mpi4py(world_small):
    assert world_small.run(_rank_object_receives) == [[]] * world_small.size


def _rank_split_type() -> list:
    comm = MPI.COMM_WORLD
    bad: list = []
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if shared.Get_size() != comm.Get_size():        # one host
        bad.append(f"COMM_TYPE_SHARED has {shared.Get_size()} ranks")
    info = MPI.Info.Create()
    if comm.Split_type(MPI.COMM_TYPE_HW_GUIDED, info=info) != MPI.COMM_NULL:
        bad.append("HW_GUIDED without a resource type is not COMM_NULL")
    info.Set("mpi_hw_resource_type", "mpi_shared_memory")
    guided = comm.Split_type(MPI.COMM_TYPE_HW_GUIDED, info=info)
    if guided == MPI.COMM_NULL or guided.Get_size() != comm.Get_size():
        bad.append("HW_GUIDED for mpi_shared_memory is not the host")
    # one host: no hardware domain smaller than the world
    if comm.Split_type(MPI.COMM_TYPE_HW_UNGUIDED, info=MPI.Info.Create()) != MPI.COMM_NULL:
        bad.append("HW_UNGUIDED on one host is not COMM_NULL")
    return bad


def test_split_type_kinds(world_small):
    assert world_small.run(_rank_split_type) == [[]] * world_small.size


# -- MPI.BOTTOM: datatypes of absolute addresses ------------------------------------------

def _rank_bottom() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    bad: list = []
    # two arrays of different dtypes moved as one message through their addresses
    a, b = np.arange(5, dtype=np.float64) + rank, np.arange(3, dtype=np.int32) * 10 + rank
    ra, rb = np.zeros(5), np.zeros(3, np.int32)
    out = MPI.Datatype.Create_struct([5, 3], [MPI.Get_address(a), MPI.Get_address(b)],
                                     [MPI.DOUBLE, MPI.INT]).Commit()
    into = MPI.Datatype.Create_struct([5, 3], [MPI.Get_address(ra), MPI.Get_address(rb)],
                                      [MPI.DOUBLE, MPI.INT]).Commit()
    comm.Sendrecv([MPI.BOTTOM, 1, out], right, 4, [MPI.BOTTOM, 1, into], left, 4)
    if ra.tolist() != (np.arange(5) + left).tolist() or \
            rb.tolist() != (np.arange(3) * 10 + left).tolist():
        bad.append(f"Sendrecv from BOTTOM: {ra.tolist()} {rb.tolist()}")
    # Alltoallw with BOTTOM: block j of a (size, 2) array to rank j, by address
    s = np.arange(2 * size, dtype=np.int64).reshape(size, 2) + 100 * rank
    r = np.full((size, 2), -1, dtype=np.int64)
    stypes = [MPI.Datatype.Create_struct([2], [MPI.Get_address(s[j])], [MPI.INT64_T]).Commit()
              for j in range(size)]
    rtypes = [MPI.Datatype.Create_struct([2], [MPI.Get_address(r[j])], [MPI.INT64_T]).Commit()
              for j in range(size)]
    comm.Alltoallw((MPI.BOTTOM, ([1] * size, [0] * size), stypes),
                   (MPI.BOTTOM, ([1] * size, [0] * size), rtypes))
    want = np.array([[2 * rank, 2 * rank + 1] for _ in range(size)]) + \
        100 * np.arange(size)[:, None]
    if not np.array_equal(r, want):
        bad.append(f"Alltoallw from BOTTOM got {r.tolist()}")
    # a vector spec from BOTTOM: a one-double type at dest's address, blocks by displs
    dest = np.full(2 * size, -1.0)
    at = MPI.Datatype.Create_struct([1], [MPI.Get_address(dest)], [MPI.DOUBLE]).Commit()
    comm.Allgatherv(np.array([rank, rank + 0.5]),
                    [MPI.BOTTOM, [2] * size, [2 * i for i in range(size)], at])
    if dest.tolist() != [x for r in range(size) for x in (r, r + 0.5)]:
        bad.append(f"Allgatherv into BOTTOM got {dest.tolist()}")
    for t in (out, into, at, *stypes, *rtypes):
        t.Free()
    return bad


def test_bottom_with_absolute_addresses(world_small):
    assert world_small.run(_rank_bottom) == [[]] * world_small.size
