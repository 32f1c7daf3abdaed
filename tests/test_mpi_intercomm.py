"""Inter-communicators of pycomm.MPI (pycomm/MPI/intercomm.py, interlink.py, intercoll.py,
interobj.py) on real worlds of 2 to 5 ranks, with groups of unequal sizes.

Each ``_rank_*`` function runs on every rank, builds inter-communicators two ways
(``Create_intercomm`` with the leaders at the end of their groups, and
``Intercomm.Create_from_groups`` of the even and the odd world ranks), computes with
numpy what MPI defines from the data every rank can rebuild (rank r's block is
``100 * r + arange(n)``) and returns its mismatches.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def w(world):
    """The shared worlds of 2..5 ranks on shm, and 2, 3 and 5 on tcp."""
    if not 2 <= world.size <= 5 or world.transport == "rdma":
        pytest.skip("inter-communicators are checked at 2..5 ranks on shm and tcp")
    return world


def _expect(bad: list, label: str, got, want) -> None:
    if isinstance(want, np.ndarray):
        ok = isinstance(got, np.ndarray) and got.shape == want.shape and \
            np.array_equal(got, want)
    else:
        ok = got == want
    if not ok:
        bad.append(f"rank {MPI.COMM_WORLD.rank}: {label}: got {got!r} want {want!r}")


def _both():
    """``[(intercomm, local world ranks, remote world ranks), ...]``: a contiguous split
    (``max(1, (size-1)//2)`` low ranks; leaders last) and the even/odd split."""
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    nlow = max(1, (size - 1) // 2)
    low, high = list(range(nlow)), list(range(nlow, size))
    mine, theirs = (low, high) if rank < nlow else (high, low)
    intra = world.Split(0 if rank < nlow else 1, rank)
    a = intra.Create_intercomm(len(mine) - 1, world, theirs[-1], 17)
    intra.Free()
    even, odd = list(range(0, size, 2)), list(range(1, size, 2))
    emine, etheirs = (even, odd) if rank % 2 == 0 else (odd, even)
    g = world.Get_group()
    even_side = rank % 2 == 0           # the even group's leader is its first process,
    b = MPI.Intercomm.Create_from_groups(   # the odd group's its last
        g.Incl(emine), 0 if even_side else len(emine) - 1,
        g.Incl(etheirs), len(etheirs) - 1 if even_side else 0, "test")
    return [(a, mine, theirs), (b, emine, etheirs)]


def _block(r: int, n: int, dtype="i8") -> np.ndarray:
    return (100 * r + np.arange(n)).astype(dtype)


def _rank_queries_p2p() -> list:
    bad: list = []
    me = MPI.COMM_WORLD.rank
    for ic, mine, theirs in _both():
        rank = mine.index(me)
        _expect(bad, "type", (type(ic).__name__, ic.Is_inter(), ic.is_intra),
                ("Intercomm", True, False))
        _expect(bad, "sizes", (ic.rank, ic.size, ic.remote_size), (rank, len(mine),
                                                                    len(theirs)))
        world_g = MPI.COMM_WORLD.Get_group()
        _expect(bad, "groups", (world_g.Translate_ranks(None, ic.group) == [
            mine.index(r) if r in mine else MPI.UNDEFINED for r in range(world_g.size)],
            ic.remote_group.Translate_ranks(None, world_g)), (True, theirs))
        # point-to-point: every process sends its rank to every remote process
        reqs = [ic.Isend(_block(me, 3), j, 5) for j in range(ic.remote_size)]
        got = {}
        for _ in range(ic.remote_size):
            st = MPI.Status()
            ic.Probe(MPI.ANY_SOURCE, 5, st)
            buf = np.empty(3, "i8")
            ic.Recv(buf, st.source, 5)
            got[st.Get_source()] = buf
        MPI.Request.Waitall(reqs)
        _expect(bad, "Isend/Recv ANY_SOURCE", sorted(got), list(range(len(theirs))))
        for j, buf in got.items():
            _expect(bad, f"from {j}", buf, _block(theirs[j], 3))
        # matched probes: every process sends to remote rank 0, which takes them all
        req = ic.isend(("m", rank), 0, 8)
        if rank == 0:
            senders = set()
            for _ in range(len(theirs)):
                st = MPI.Status()
                msg = ic.mprobe(MPI.ANY_SOURCE, 8, st)
                obj = msg.recv()
                _expect(bad, "mprobe source", (obj, st.source), (("m", st.source),
                                                                st.source))
                senders.add(st.source)
            _expect(bad, "mprobe senders", sorted(senders), list(range(len(theirs))))
        req.wait()
        _expect(bad, "Comm handle", (MPI.Comm(ic).Is_inter(), MPI.Comm(ic).size),
                (True, len(mine)))
        peer = rank % len(theirs)
        if rank < len(theirs):          # pairs (i, i) for i < min(sizes)
            st = MPI.Status()
            obj = ic.sendrecv(("o", me), peer, 6, None, MPI.ANY_SOURCE, 6, st)
            _expect(bad, "sendrecv", (obj, st.source), (("o", theirs[peer]), peer))
        for bad_rank in (-5, len(theirs)):
            try:
                ic.send(None, bad_rank, 0)
                bad.append(f"send to {bad_rank} did not raise")
            except MPI.Exception as exc:
                _expect(bad, "ERR_RANK", exc.Get_error_class(), MPI.ERR_RANK)
        # Merge: the high=True group last; equal flags: the low group (here the one
        # holding world rank 0: its leader has the lower world rank) first
        first = (mine + theirs) if 0 in mine else (theirs + mine)
        for high in (0 not in mine, False):
            m = ic.Merge(high)
            _expect(bad, f"Merge({high})", (m.rank, m.Get_group().Translate_ranks(
                None, world_g)), (first.index(me), first))
            m.Free()
        d = ic.Dup()
        _expect(bad, "Dup", (MPI.Comm.Compare(d, ic), d.remote_size, d.rank),
                (MPI.CONGRUENT, len(theirs), rank))
        s = ic.Split(0 if rank == 0 else MPI.UNDEFINED, -rank)
        _expect(bad, "Split", (s.size, s.remote_size) if s else None,
                (1, 1) if rank == 0 else None)
        if s:
            s.Free()
        c = ic.Create(ic.group.Incl([ic.size - 1]))
        _expect(bad, "Create", (c.size, c.remote_size, c.rank) if c else None,
                (1, 1, 0) if rank == ic.size - 1 else None)
        if c:
            c.Free()
        d.Free()
        ic.Free()
    return bad


def test_queries_p2p_merge_split(w):
    assert w.run(_rank_queries_p2p) == [[]] * w.size


def _rank_buffer_collectives() -> list:
    bad: list = []
    me = MPI.COMM_WORLD.rank
    for ic, mine, theirs in _both():
        rank, L, R = mine.index(me), len(mine), len(theirs)
        for side in (0, 1):            # the group with world rank 0 roots first
            rooting = (0 in mine) == (side == 0)
            for root in range(L if rooting else R):
                n = root + 2
                if rooting:
                    r = MPI.ROOT if root == rank else MPI.PROC_NULL
                    buf = _block(me, n)
                    ic.Bcast(buf, r)
                    rb = np.full(R * n, -1, "i8") if r == MPI.ROOT else None
                    ic.Gather(None, rb, r)
                    if r == MPI.ROOT:
                        _expect(bad, "Gather", rb, np.concatenate(
                            [_block(t, n) for t in theirs]))
                    ic.Scatter(np.arange(R * n, dtype="i8") if r == MPI.ROOT else None,
                               None, r)
                    counts = [i + 1 for i in range(R)]
                    rb = np.full(sum(counts) + R, -1, "i8")
                    displs = [sum(counts[:i]) + i for i in range(R)]
                    ic.Gatherv(None, [rb, counts, displs, MPI.INT64_T] if
                               r == MPI.ROOT else None, r)
                    if r == MPI.ROOT:
                        for i in range(R):
                            _expect(bad, "Gatherv", rb[displs[i]:displs[i] + counts[i]],
                                    _block(theirs[i], counts[i]))
                    out = np.full(1, -1.0)
                    ic.Reduce(None, out if r == MPI.ROOT else None, MPI.MAX, r)
                    if r == MPI.ROOT:
                        _expect(bad, "Reduce MAX", out, np.array([float(max(theirs))]))
                else:
                    buf = np.zeros(n, "i8")
                    ic.Bcast(buf, root)
                    _expect(bad, "Bcast", buf, _block(theirs[root], n))
                    ic.Gather(_block(me, n), None, root)
                    rb = np.full(n, -1, "i8")
                    ic.Scatter(None, rb, root)
                    _expect(bad, "Scatter", rb, np.arange(rank * n, (rank + 1) * n))
                    ic.Gatherv(_block(me, rank + 1), None, root)
                    ic.Reduce(np.array([float(me)]), None, MPI.MAX, root)
        # all-to-all kinds: group sizes differ, so do the block sizes per direction
        ns, nr = 2 + (0 in mine), 2 + (0 in theirs)
        rb = np.full(R * nr, -1, "i8")
        ic.Allgather(_block(me, ns), rb)
        _expect(bad, "Allgather", rb, np.concatenate([_block(t, nr) for t in theirs]))
        sb = np.concatenate([_block(me, ns) + 10 * j for j in range(R)])
        rb = np.full(R * nr, -1, "i8")
        ic.Alltoall(sb, rb)
        _expect(bad, "Alltoall", rb, np.concatenate(
            [_block(t, nr) + 10 * rank for t in theirs]))
        rb = np.full(R * nr, -1, "i8")
        ic.Alltoallv([sb, [ns] * R, [ns * j for j in range(R)], MPI.INT64_T],
                     [rb, [nr] * R, [nr * j for j in range(R)], MPI.INT64_T])
        _expect(bad, "Alltoallv", rb, np.concatenate(
            [_block(t, nr) + 10 * rank for t in theirs]))
        # Alltoallw: contiguous blocks out at byte displacements; block j in lands on
        # every other element (a strided vector type), so it is unpacked after
        every2 = MPI.INT64_T.Create_vector(nr, 1, 2).Commit()
        rb = np.full(2 * R * nr, -1, "i8")
        ic.Alltoallw([sb, ([ns] * R, [8 * ns * j for j in range(R)]), [MPI.INT64_T] * R],
                     [rb, ([1] * R, [16 * nr * j for j in range(R)]), [every2] * R])
        _expect(bad, "Alltoallw", rb[::2], np.concatenate(
            [_block(t, nr) + 10 * rank for t in theirs]))
        _expect(bad, "Alltoallw (gaps untouched)", rb[1::2], np.full(R * nr, -1))
        every2.Free()
        counts = [theirs.index(t) + 1 for t in theirs]
        rb = np.full(sum(counts), -1, "i8")
        ic.Allgatherv(_block(me, rank + 1), [rb, counts, MPI.INT64_T])
        _expect(bad, "Allgatherv", rb, np.concatenate(
            [_block(t, c) for t, c in zip(theirs, counts)]))
        sums = np.full(4, -1.0)
        ic.Allreduce(np.arange(4.0) * me, sums, MPI.SUM)
        _expect(bad, "Allreduce", sums, np.arange(4.0) * sum(theirs))
        # reduce-scatter: the same count (6 = L x blocks) in both groups would need
        # L to divide 6 on both sides; use Reduce_scatter with recvcounts instead
        count = 6
        rc = [count // L + (i < count % L) for i in range(L)]
        rb = np.full(rc[rank], -1.0)
        ic.Reduce_scatter(np.arange(float(count)) + me, rb, rc, MPI.SUM)
        full = np.arange(float(count)) * R + sum(theirs)
        start = sum(rc[:rank])
        _expect(bad, "Reduce_scatter", rb, full[start:start + rc[rank]])
        if count % L == 0 and count % R == 0:
            rb = np.full(count // L, -1.0)
            ic.Reduce_scatter_block(np.arange(float(count)) + me, rb, MPI.SUM)
            _expect(bad, "Reduce_scatter_block", rb,
                    full[rank * (count // L):(rank + 1) * (count // L)])
        ic.Barrier()
        ic.Free()
    return bad


def test_buffer_collectives(w):
    assert w.run(_rank_buffer_collectives) == [[]] * w.size


def _rank_object_collectives() -> list:
    bad: list = []
    me = MPI.COMM_WORLD.rank
    for ic, mine, theirs in _both():
        rank, L, R = mine.index(me), len(mine), len(theirs)
        for side in (0, 1):
            rooting = (0 in mine) == (side == 0)
            for root in range(L if rooting else R):
                if rooting:
                    r = MPI.ROOT if root == rank else MPI.PROC_NULL
                    _expect(bad, "bcast", ic.bcast({"w": me}, r), None)
                    got = ic.gather(None, r)
                    _expect(bad, "gather", got, [("g", t) for t in theirs]
                            if r == MPI.ROOT else None)
                    _expect(bad, "scatter", ic.scatter(
                        [("s", i) for i in range(R)] if r == MPI.ROOT else None, r), None)
                    _expect(bad, "reduce", ic.reduce(None, MPI.SUM, r),
                            sum(theirs) if r == MPI.ROOT else None)
                else:
                    _expect(bad, "bcast", ic.bcast(None, root), {"w": theirs[root]})
                    _expect(bad, "gather", ic.gather(("g", me), root), None)
                    _expect(bad, "scatter", ic.scatter(None, root), ("s", rank))
                    _expect(bad, "reduce", ic.reduce(me, MPI.SUM, root), None)
        _expect(bad, "allgather", ic.allgather(me), theirs)
        _expect(bad, "alltoall", ic.alltoall([(me, j) for j in range(R)]),
                [(t, rank) for t in theirs])
        _expect(bad, "allreduce", ic.allreduce(me, MPI.MAX), max(theirs))
        ic.barrier()
        ic.Free()
    return bad


def test_object_collectives(w):
    assert w.run(_rank_object_collectives) == [[]] * w.size


def _code(fn) -> int | None:
    try:
        fn()
    except MPI.Exception as exc:
        return exc.Get_error_class()
    return None


def _rank_errors() -> list:
    bad: list = []
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    ic, mine, theirs = _both()[0]
    R = len(theirs)
    for root in (-7, R):
        _expect(bad, f"Bcast root={root}", _code(lambda: ic.Bcast(np.zeros(1), root)),
                MPI.ERR_ROOT)
        _expect(bad, f"reduce root={root}", _code(lambda: ic.reduce(1, MPI.SUM, root)),
                MPI.ERR_ROOT)
    _expect(bad, "IN_PLACE", _code(lambda: ic.Allreduce(MPI.IN_PLACE, np.zeros(1))),
            MPI.ERR_ARG)
    _expect(bad, "Scan", _code(lambda: ic.Scan(np.zeros(1), np.zeros(1))), MPI.ERR_COMM)
    _expect(bad, "Comm handle Bcast", _code(lambda: MPI.Comm(ic).Bcast(np.zeros(1), 0)),
            MPI.ERR_COMM)
    _expect(bad, "Create_group", _code(lambda: ic.Create_group(ic.group)), MPI.ERR_COMM)
    ic.Barrier()                    # every rank still matches after the refusals
    ic.Free()
    nlow = max(1, (size - 1) // 2)
    low = rank < nlow
    intra = world.Split(0 if low else 1, rank)
    # a local leader out of range: every rank of the group refuses, nothing is sent
    _expect(bad, "local_leader", _code(lambda: intra.Create_intercomm(
        intra.size, world, 0)), MPI.ERR_RANK)
    # the remote leader in the local group (leader only; its group hears of it)
    _expect(bad, "remote leader local", _code(lambda: intra.Create_intercomm(
        0, world, 0 if low else nlow)), MPI.ERR_RANK)
    # mismatched tags: both groups raise
    _expect(bad, "tags", _code(lambda: intra.Create_intercomm(
        0, world, nlow if low else 0, 1 if low else 2)), MPI.ERR_TAG)
    g = world.Get_group()
    _expect(bad, "overlap", _code(lambda: MPI.Intercomm.Create_from_groups(
        g.Incl([rank]), 0, g, 0)), MPI.ERR_GROUP)
    intra.Free()
    world.Barrier()
    return bad


def test_errors(w):
    assert w.run(_rank_errors) == [[]] * w.size
