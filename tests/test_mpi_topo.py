"""pycomm.MPI graph topologies on real worlds: ``Create_graph``/``Graphcomm``,
``Graph_map``, ``Create_dist_graph`` and the neighbourhood collectives on them.

Each ``_rank_*`` function runs on every rank, computes what MPI defines from the whole
graph (which every rank can build) and returns its mismatches; sizes include 1 and
non-powers of two (``world_small``).
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _expect(bad: list, label: str, got, want) -> None:
    if got != want:
        bad.append(f"rank {MPI.COMM_WORLD.rank}: {label}: got {got!r} want {want!r}")


def _ring_graph(size: int) -> tuple[list[int], list[int], list[list[int]]]:
    """A symmetric multigraph: node i is linked to i-1 and i+1 (mod size) and to itself
    (twice on node 0), as MPI's (index, edges) and as adjacency lists."""
    adj = [[(i - 1) % size, (i + 1) % size, i] + ([0] if i == 0 else []) for i in
           range(size)]
    index = list(np.cumsum([len(a) for a in adj]))
    return [int(x) for x in index], [e for a in adj for e in a], adj


def _rank_graph() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    index, edges, adj = _ring_graph(size)
    g = comm.Create_graph(index, edges)
    _expect(bad, "type/topology", (type(g).__name__, g.Get_topology(), g.is_topo),
            ("Graphcomm", MPI.GRAPH, True))
    _expect(bad, "dims", (g.Get_dims(), g.nnodes, g.nedges),
            ((size, len(edges)), size, len(edges)))
    _expect(bad, "topo", (g.Get_topo(), g.index, g.edges), ((index, edges), index, edges))
    _expect(bad, "neighbours", [g.Get_neighbors(r) for r in range(size)], adj)
    _expect(bad, "counts", [g.Get_neighbors_count(r) for r in range(size)],
            [len(a) for a in adj])
    _expect(bad, "own", (g.neighbors, g.nneighbors, g.inedges, g.outedges),
            (adj[rank], len(adj[rank]), adj[rank], adj[rank]))
    # a leading 0 (CSR row pointer) is mpi4py's accepted alternative form
    g0 = comm.Create_graph([0] + index, edges)
    _expect(bad, "leading 0", g0.Get_topo(), (index, edges))
    g0.Free()
    # same topology through another handle, a Dup and an Intracomm view
    _expect(bad, "Graphcomm(g)", MPI.Graphcomm(g).Get_topo(), (index, edges))
    d = g.Dup()
    _expect(bad, "Dup", (type(d).__name__, d.Get_topo()), ("Graphcomm", (index, edges)))
    d.Free()
    _expect(bad, "Intracomm(g)", MPI.Intracomm(g).Get_topology(), MPI.GRAPH)
    for cls in (MPI.Cartcomm, MPI.Distgraphcomm):
        try:
            cls(g)
            bad.append(f"{cls.__name__}(graph) did not raise TypeError")
        except TypeError:
            pass
    # neighbourhood collectives: block k comes from / goes to neighbour k, in list order
    nb = adj[rank]
    got = np.full(len(nb) * 2, -1, np.int32)
    g.Neighbor_allgather(np.array([rank, 10 * rank], np.int32), got)
    _expect(bad, "Neighbor_allgather", got.tolist(),
            [v for s in nb for v in (s, 10 * s)])
    # alltoall: rank r sends 100*r + k to its k-th neighbour; the receiver's j-th block
    # from s is the j-th occurrence of rank in s's list, matched in order
    out = np.array([100 * rank + k for k in range(len(nb))], np.float64)
    got = np.zeros(len(nb))
    g.Neighbor_alltoall(out, got)
    want, seen = [], {}
    for s in nb:
        j = seen.get(s, 0)
        seen[s] = j + 1
        want.append(float(100 * s + [k for k, t in enumerate(adj[s]) if t == rank][j]))
    _expect(bad, "Neighbor_alltoall", got.tolist(), want)
    _expect(bad, "neighbor_allgather", g.neighbor_allgather(rank * 3),
            [3 * s for s in nb])
    g.Free()
    # Graph_map and ranks beyond the graph
    if size > 1:
        small = comm.Create_graph([1, 2], [1, 0])
        _expect(bad, "beyond the graph", small == MPI.COMM_NULL, rank >= 2)
        _expect(bad, "Graph_map", comm.Graph_map([1, 2], [1, 0]),
                rank if rank < 2 else MPI.UNDEFINED)
        if small != MPI.COMM_NULL:
            _expect(bad, "2-node ring", small.neighbors, [1 - rank])
            small.Free()
    return bad


def _rank_dist_graph() -> list:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    bad: list = []
    # rank r names the edges (r -> r+1), (r -> r+2) and, from rank 0, (size-1 -> 0):
    # edges a rank names need not start at it
    def named(r):
        out = [(r, (r + 1) % size, 10 * r + 1), (r, (r + 2) % size, 10 * r + 2)]
        return out + ([(size - 1, 0, 99)] if r == 0 else [])
    mine = named(rank)
    srcs = sorted({s for s, _, _ in mine}, key=[s for s, _, _ in mine].index)
    degrees = [sum(1 for s, _, _ in mine if s == x) for x in srcs]
    dests = [d for x in srcs for s, d, _ in mine if s == x]
    weights = [w for x in srcs for s, _, w in mine if s == x]
    every = [e for r in range(size) for x in
             sorted({s for s, _, _ in named(r)}, key=[s for s, _, _ in named(r)].index)
             for e in named(r) if e[0] == x]
    ins = [(s, w) for s, d, w in every if d == rank]
    outs = [(d, w) for s, d, w in every if s == rank]
    g = comm.Create_dist_graph(srcs, degrees, dests, weights)
    _expect(bad, "weighted", g.Get_dist_neighbors(),
            ([s for s, _ in ins], [d for d, _ in outs],
             ([w for _, w in ins], [w for _, w in outs])))
    _expect(bad, "count", g.Get_dist_neighbors_count(), (len(ins), len(outs), True))
    _expect(bad, "topology", g.Get_topology(), MPI.DIST_GRAPH)
    # the neighbourhood collective follows the same order
    got = np.full(len(ins), -1, np.int64)
    g.Neighbor_allgather(np.array([rank], np.int64), got)
    _expect(bad, "Neighbor_allgather", got.tolist(), [s for s, _ in ins])
    g.Free()
    u = comm.Create_dist_graph(srcs, degrees, dests, MPI.UNWEIGHTED)
    _expect(bad, "unweighted", u.Get_dist_neighbors_count(), (len(ins), len(outs), False))
    u.Free()
    e = comm.Create_dist_graph([], [], [], MPI.WEIGHTS_EMPTY)
    _expect(bad, "empty", e.Get_dist_neighbors(), ([], [], ([], [])))
    e.Free()
    return bad


def test_graph_topology(world_small):
    assert world_small.run(_rank_graph) == [[]] * world_small.size


def test_dist_graph(world_small):
    assert world_small.run(_rank_dist_graph) == [[]] * world_small.size


def _rank_errors() -> list:
    comm = MPI.COMM_WORLD
    bad: list = []
    cases = [
        (lambda: comm.Create_graph([1] * (comm.size + 1), [0] * (comm.size + 1)),
         MPI.ERR_ARG, "processes"),
        (lambda: comm.Create_graph([-1], []), MPI.ERR_ARG, "non-decreasing"),
        (lambda: comm.Create_graph([3], [0]), MPI.ERR_ARG, "edges has 1"),
        (lambda: comm.Create_graph([1], [5]), MPI.ERR_ARG, "name no node"),
        (lambda: comm.Create_dist_graph([0], [1], [comm.size]), MPI.ERR_RANK, "not in"),
    ]
    for fn, code, text in cases:
        try:
            fn()
            bad.append(f"no error ({text})")
        except MPI.Exception as exc:
            if exc.Get_error_class() != code or text not in str(exc):
                bad.append(f"{text}: got {exc.Get_error_class()} {exc}")
    for fn in (lambda: comm.Create_dist_graph([0], [1, 1], [0]),
               lambda: comm.Create_dist_graph([0], [1], [0], [1, 2])):
        try:
            fn()
            bad.append("no ValueError for a degrees/weights length")
        except ValueError:
            pass
    g = comm.Create_graph([1] * comm.size, list(range(comm.size)))
    try:
        g.Get_neighbors(comm.size)
        bad.append("Get_neighbors(size) did not raise")
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_RANK:
            bad.append(f"Get_neighbors: {exc}")
    g.Free()
    return bad


def test_graph_errors(world_small):
    assert world_small.run(_rank_errors) == [[]] * world_small.size
