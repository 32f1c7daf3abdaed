"""pycomm.MPI's nonblocking (``Ineighbor_*``), persistent (``Neighbor_*_init``) and
per-neighbour-datatype (``Neighbor_alltoallw``) neighbourhood collectives on real worlds.

Each ``_rank_*`` function runs on every rank, builds one topology (a periodic ring, a
non-periodic 2-D grid whose edges are PROC_NULL, a general graph with repeated edges and
self-loops, a distributed graph with unequal in- and out-degrees), computes with numpy
what MPI-4.1 section 7.6 defines every block to be, and returns its mismatches. Worlds of
1 to 4 ranks on shared memory and 3 on TCP (non-powers of two included).
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLDS = [(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"), (3, "tcp")]
KINDS = ["ring", "grid", "graph", "dist"]
pytestmark = pytest.mark.parametrize("world", WORLDS, indirect=True,
                                     ids=[f"n{n}-{t}" for n, t in WORLDS])


def _model(kind: str, size: int):
    """``(make, ins, outs, match)``: ``make(comm)`` builds the topology, ``ins[r]`` /
    ``outs[r]`` are rank r's in- and out-neighbours, ``match(r, i)`` the (sender, its
    block) that rank r's i-th in-neighbour block is, or None for PROC_NULL."""
    if kind in ("ring", "grid"):
        dims = [size] if kind == "ring" else MPI.Compute_dims(size, 2)
        periods = [kind == "ring"] * len(dims)

        def shift(r, d, k):
            c = list(np.unravel_index(r, dims))
            c[d] += k
            if not 0 <= c[d] < dims[d]:
                if not periods[d]:
                    return MPI.PROC_NULL
                c[d] %= dims[d]
            return int(np.ravel_multi_index(c, dims))
        ins = [[shift(r, d, k) for d in range(len(dims)) for k in (-1, 1)]
               for r in range(size)]
        # the block from the -1 neighbour is the one it sent to its +1 neighbour
        return (lambda comm: comm.Create_cart(dims, periods), ins, ins,
                lambda r, i: None if ins[r][i] == MPI.PROC_NULL else (ins[r][i], i ^ 1))
    if kind == "graph":
        adj = [[(i - 1) % size, (i + 1) % size, i] + ([0] if i == 0 else [])
               for i in range(size)]
        index = [int(x) for x in np.cumsum([len(a) for a in adj])]
        make = lambda comm: comm.Create_graph(index, [e for a in adj for e in a])  # noqa
        ins = outs = adj
    else:
        outs = [[(r + 1) % size, (r + 2) % size] + ([0] * 2 if r == size - 1 else [])
                for r in range(size)]
        ins = [[s for s in range(size) for d in outs[s] if d == r] for r in range(size)]
        make = lambda comm: comm.Create_dist_graph_adjacent(  # noqa: E731
            ins[comm.rank], outs[comm.rank])

    def match(r, i):        # the k-th edge s -> r meets the k-th occurrence of s
        s = ins[r][i]
        k = ins[r][:i].count(s)
        return s, [j for j, d in enumerate(outs[s]) if d == r][k]
    return make, ins, outs, match


def _payload(s: int, j: int, n: int, round_: int = 0) -> np.ndarray:
    return (np.arange(n) + 1000 * s + 100 * j + 7 * round_).astype(np.int32)


def _count(s: int, j: int) -> int:
    return (s + 2 * j) % 3        # 0, 1 or 2 items: empty blocks included


def _expect(bad: list, label: str, got, want) -> None:
    got, want = np.asarray(got).tolist(), np.asarray(want).tolist()
    if got != want:
        bad.append(f"rank {MPI.COMM_WORLD.rank}: {label}: got {got} want {want}")


def _rank_nonblocking(kind: str) -> list:
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    make, ins, outs, match = _model(kind, size)
    comm = make(world)
    bad: list = []
    nin, nout, n = len(ins[rank]), len(outs[rank]), 3
    sources = [match(rank, i) for i in range(nin)]
    # Ineighbor_allgather and Ineighbor_alltoall posted together, then waited
    got_ag = np.full((nin, n), -1, np.int32)
    got_a2a = np.full((nin, n), -1, np.int32)
    send_a2a = np.concatenate([_payload(rank, j, n) for j in range(nout)] or [[]])
    reqs = [comm.Ineighbor_allgather(_payload(rank, 0, n), got_ag),
            comm.Ineighbor_alltoall(send_a2a.astype(np.int32), got_a2a)]
    MPI.Request.Waitall(reqs)
    _expect(bad, "Ineighbor_allgather", got_ag,
            [_payload(m[0], 0, n) if m else [-1] * n for m in sources])
    _expect(bad, "Ineighbor_alltoall", got_a2a,
            [_payload(*m, n) if m else [-1] * n for m in sources])
    _expect(bad, "requests null", [r == MPI.REQUEST_NULL for r in reqs], [True, True])
    # Ineighbor_allgatherv: every sender's own count, at displacements with gaps
    rc = [_count(m[0], 0) if m else 0 for m in sources]
    rd = [int(x) for x in np.cumsum([0] + [c + 1 for c in rc])[:-1]]
    got = np.full(sum(rc) + nin, -1, np.int32)
    req = comm.Ineighbor_allgatherv(_payload(rank, 0, _count(rank, 0)), [got, (rc, rd)])
    while not req.Test():
        pass
    want = np.full_like(got, -1)
    for m, c, d in zip(sources, rc, rd):
        if m:
            want[d:d + c] = _payload(m[0], 0, c)
    _expect(bad, "Ineighbor_allgatherv", got, want)
    # Ineighbor_alltoallv: block j of count _count(rank, j)
    sc = [_count(rank, j) for j in range(nout)]
    send = np.concatenate([_payload(rank, j, c) for j, c in enumerate(sc)] or [[]])
    rc = [_count(*m) if m else 0 for m in sources]
    rd = [int(x) for x in np.cumsum([0] + rc)[:-1]]
    got = np.full(sum(rc), -1, np.int32)
    comm.Ineighbor_alltoallv([send.astype(np.int32), sc], [got, (rc, rd)]).Wait()
    _expect(bad, "Ineighbor_alltoallv", got,
            np.concatenate([_payload(*m, _count(*m)) for m in sources if m] or [[]]))
    comm.Free()
    return bad


def _alltoallw_case(comm, rank, ins, outs, sources, round_, call):
    """Send block j as MPI.INT items at byte displacements; receive block i through a
    strided vector type (every other int), so the receive side is unpacked."""
    nin, nout = len(ins[rank]), len(outs[rank])
    sc = [_count(rank, j) for j in range(nout)]
    sd = [4 * int(x) for x in np.cumsum([0] + sc)[:-1]]
    send = np.concatenate([_payload(rank, j, c, round_) for j, c in enumerate(sc)] or [[]])
    rc = [_count(*m) if m else 0 for m in sources]
    vec = [MPI.INT.Create_vector(c, 1, 2).Commit() for c in rc]
    rd = [4 * 2 * int(x) for x in np.cumsum([0] + [max(c, 1) for c in rc])[:-1]]
    got = np.full(2 * sum(max(c, 1) for c in rc), -1, np.int32)
    smsg = [send.astype(np.int32), (sc, sd), [MPI.INT] * nout]
    rmsg = [got, ([1] * nin, rd), vec]
    return call(smsg, rmsg), got, rd, rc, vec


def _rank_alltoallw(kind: str) -> list:
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    make, ins, outs, match = _model(kind, size)
    comm = make(world)
    bad: list = []
    sources = [match(rank, i) for i in range(len(ins[rank]))]
    for label in ("Neighbor_alltoallw", "Ineighbor_alltoallw"):
        out, got, rd, rc, vec = _alltoallw_case(comm, rank, ins, outs, sources, 0,
                                                getattr(comm, label))
        if out is not None:
            out.Wait()
        want = np.full_like(got, -1)
        for m, d, c in zip(sources, rd, rc):
            if m:
                want[d // 4:d // 4 + 2 * c:2] = _payload(*m, c)
        _expect(bad, label, got, want)
        for t in vec:
            t.Free()
    comm.Free()
    return bad


def _rank_persistent(kind: str) -> list:
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    make, ins, outs, match = _model(kind, size)
    comm = make(world)
    bad: list = []
    nin, nout, n = len(ins[rank]), len(outs[rank]), 2
    sources = [match(rank, i) for i in range(nin)]
    send = np.zeros(max(nout, 1) * n, np.int32)[:nout * n]
    got = np.full(nin * n, -1, np.int32)
    sendg = np.zeros(n, np.int32)
    gotg = np.full(nin * n, -1, np.int32)
    rc = [n] * nin
    gotv = np.full(nin * n, -1, np.int32)
    reqs = [comm.Neighbor_alltoall_init(send, got),
            comm.Neighbor_allgather_init(sendg, gotg),
            comm.Neighbor_allgatherv_init(sendg, [gotv, rc]),
            comm.Neighbor_alltoallv_init([send, [n] * nout], [gotv.copy(), rc])]
    for round_ in range(3):         # each Start sends the buffers' contents now
        send[:] = np.concatenate([_payload(rank, j, n, round_) for j in range(nout)]
                                 or [np.empty(0, np.int32)])
        sendg[:] = _payload(rank, 0, n, round_)
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        _expect(bad, f"Neighbor_alltoall_init round {round_}", got.reshape(nin, n),
                [_payload(*m, n, round_) if m else [-1] * n for m in sources])
        _expect(bad, f"Neighbor_allgather(v)_init round {round_}",
                [gotg.reshape(nin, n), gotv.reshape(nin, n)],
                [[_payload(m[0], 0, n, round_) if m else [-1] * n for m in sources]] * 2)
    _expect(bad, "inactive, not null", [r != MPI.REQUEST_NULL for r in reqs], [True] * 4)
    for r in reqs:
        r.Free()
    w = comm.Neighbor_alltoallw_init(*_alltoallw_case(comm, rank, ins, outs, sources, 0,
                                                      lambda s, r: (s, r))[0])
    w.Start()
    w.Wait()
    w.Free()
    comm.Free()
    return bad


def _rank_errors() -> list:
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    ring = world.Create_cart([size], [True])
    bad: list = []
    cases = {
        "recvbuf not in 2 blocks": (lambda: ring.Ineighbor_allgather(
            np.zeros(2, np.int32), np.zeros(3, np.int32)), MPI.ERR_COUNT),
        "one datatype for 2 neighbours": (lambda: ring.Ineighbor_alltoallw(
            [np.zeros(2, np.int32), ([1, 1], [0, 4]), [MPI.INT]],
            [np.zeros(2, np.int32), ([1, 1], [0, 4]), [MPI.INT] * 2]), MPI.ERR_ARG),
        "read-only recvbuf": (lambda: ring.Neighbor_alltoall_init(
            np.zeros(2, np.int32), np.frombuffer(bytes(8), np.int32)), MPI.ERR_BUFFER),
    }
    for label, (call, code) in cases.items():
        try:
            call()
            bad.append(f"{label}: no error")
        except MPI.Exception as exc:
            if exc.Get_error_class() != code:
                bad.append(f"{label}: error class {exc.Get_error_class()} not {code}")
    # nothing moved: the next collective on the ring still matches
    got = np.full(2, -1, np.int32)
    ring.Ineighbor_allgather(np.array([rank], np.int32), got).Wait()
    _expect(bad, "after the errors", got, [(rank - 1) % size, (rank + 1) % size])
    ring.Free()
    return bad


@pytest.mark.parametrize("kind", KINDS)
def test_nonblocking(world, kind):
    assert world.run(_rank_nonblocking, kind) == [[]] * world.size


@pytest.mark.parametrize("kind", KINDS)
def test_alltoallw(world, kind):
    assert world.run(_rank_alltoallw, kind) == [[]] * world.size


@pytest.mark.parametrize("kind", KINDS)
def test_persistent(world, kind):
    assert world.run(_rank_persistent, kind) == [[]] * world.size


def test_errors_before_any_byte_moves(world):
    assert world.run(_rank_errors) == [[]] * world.size
