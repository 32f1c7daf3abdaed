"""Graph topologies: ``Intracomm.Create_graph``, ``Graph_map``, ``MPI.Graphcomm`` and
``Intracomm.Create_dist_graph``.

A general graph (MPI-4.0 section 8.5.3) is given whole on every rank, in MPI's compressed
adjacency form: ``index[i]`` is the number of edges of nodes 0..i together and
``edges[index[i-1]:index[i]]`` are node i's neighbours (mpi4py also takes ``index`` with a
leading 0, the usual CSR row pointer). Ranks are never reordered: node i is rank i, and
ranks beyond the graph's nodes get ``COMM_NULL``. The neighbourhood collectives of a
graph send to and receive from ``Get_neighbors(rank)`` in that order (MPI requires the
adjacency to be symmetric for them; then the k-th edge from a to b meets the k-th edge
from b to a, since messages between two ranks keep their order).

``Create_dist_graph`` lets each rank name any edges (``sources[i]`` to the next
``degrees[i]`` entries of ``destinations``); one object all-gather tells every rank its
in- and out-edges, ordered by the rank that named them and then by position, as MPICH
orders them. The result is a :class:`~pycomm.MPI.neighbor.Distgraphcomm`.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError
from pycomm.groups import UNDEFINED
from pycomm.p2p import PROC_NULL

from .exceptions import mpi_error, translate_methods
from .msgspec import as_int
from .neighbor import DIST_GRAPH, GRAPH, Distgraphcomm, Topocomm, with_topology

__all__ = ["Graphcomm", "create_dist_graph", "create_graph", "graph_map"]


def _adjacency(index, edges, size: int, where: str) -> tuple[list[int], list[int]]:
    """``(index, edges)`` checked, ``index`` without mpi4py's leading 0.

    Raises:
        MPI.Exception (ERR_ARG): more nodes than ranks, a decreasing ``index``, fewer
            ``edges`` than ``index`` counts, or an edge to no node.
    """
    index = [as_int(i, "index", where) for i in index]
    edges = [as_int(e, "edges", where) for e in edges]
    if len(index) > 1 and index[0] == 0 and index[-1] == len(edges):
        index = index[1:]
    n = len(index)
    if n > size:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: a graph of {n} nodes needs "
                        f"{n} processes, the communicator has {size}")
    if any(b < a for a, b in zip([0] + index, index)):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: index={index} must be "
                        "non-decreasing and non-negative (cumulative edge counts)")
    nedges = index[-1] if index else 0
    if nedges > len(edges):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: index counts {nedges} "
                        f"edges, edges has {len(edges)}")
    edges = edges[:nedges]
    bad = [e for e in edges if not 0 <= e < n]
    if bad:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: edges {bad} name no node of "
                        f"a graph of {n} nodes")
    return index, edges


def create_graph(comm, index, edges, reorder: bool = False) -> Graphcomm:
    """``comm.Create_graph``: collective; ranks ``>= len(index)`` get COMM_NULL."""
    c = comm._inner("Create_graph")
    index, edges = _adjacency(index, edges, c.size, f"rank {c.rank}: Create_graph")
    inner = c.Split(0 if c.rank < len(index) else UNDEFINED, c.rank)
    return with_topology(Graphcomm, inner, GRAPH, index=index, edges=edges)


def graph_map(comm, index, edges) -> int:
    """``comm.Graph_map``: this rank's rank in the graph (no reordering), or UNDEFINED."""
    c = comm._inner("Graph_map")
    index, _ = _adjacency(index, edges, c.size, f"rank {c.rank}: Graph_map")
    return c.rank if c.rank < len(index) else UNDEFINED


def _weights(weights, n: int, where: str) -> list[int] | None:
    if weights is None:                              # MPI.UNWEIGHTED
        return None
    out = [as_int(w, "weights", where) for w in weights]
    if len(out) != n:
        raise ValueError(f"{where}: expecting {n} weights (one per destination), got "
                         f"{len(out)}")
    return out


def create_dist_graph(comm, sources, degrees, destinations, weights=None) -> Distgraphcomm:
    """``comm.Create_dist_graph``: a distributed graph from edges any rank names.

    Args:
        sources: ranks whose out-edges this rank names.
        degrees: how many edges each of ``sources`` gets (same length).
        destinations: the edges' targets, ``degrees[0]`` for ``sources[0]`` first.
        weights: one int per edge, or ``MPI.UNWEIGHTED``/None (``WEIGHTS_EMPTY``: a
            weighted graph where this rank names no edge).

    Raises:
        ValueError: ``degrees``/``weights`` of the wrong length.
        MPI.Exception (ERR_RANK): a source or destination outside the communicator.
    """
    c = comm._inner("Create_dist_graph")
    w = f"rank {c.rank}: Create_dist_graph"
    src = [as_int(r, "sources", w) for r in sources]
    deg = [as_int(d, "degrees", w) for d in degrees]
    if len(deg) != len(src) or any(d < 0 for d in deg):
        raise ValueError(f"{w}: expecting {len(src)} non-negative degrees (one per "
                         f"source), got {deg}")
    dst = [as_int(r, "destinations", w) for r in destinations]
    if len(dst) != sum(deg):
        raise ValueError(f"{w}: expecting {sum(deg)} destinations (the sum of degrees), "
                         f"got {len(dst)}")
    wts = _weights(weights, len(dst), w)
    for r in src + dst:
        if not (0 <= r < c.size or r == PROC_NULL):
            raise mpi_error(ArgumentError, "ERR_RANK", f"{w}: rank {r} is not in a "
                            f"communicator of size {c.size}")
    mine = []                     # (source, destination, weight) in the order named
    pos = 0
    for s, d in zip(src, deg):
        for k in range(pos, pos + d):
            mine.append((s, dst[k], 1 if wts is None else wts[k]))
        pos += d
    every = c.allgather((mine, wts is not None))
    edges = [e for named, _ in every for e in named]
    weighted = any(flag for _, flag in every)
    ins = [(s, wt) for s, d, wt in edges if d == c.rank]
    outs = [(d, wt) for s, d, wt in edges if s == c.rank]
    return with_topology(Distgraphcomm, c.Dup(), DIST_GRAPH,
                         src=[s for s, _ in ins], dst=[d for d, _ in outs],
                         sw=[wt for _, wt in ins] if weighted else None,
                         dw=[wt for _, wt in outs] if weighted else None)


@translate_methods
class Graphcomm(Topocomm):
    """A general graph communicator (mpi4py's ``MPI.Graphcomm``): every rank knows the
    whole graph, ``index`` (cumulative edge counts, one per node) and ``edges``."""

    __slots__ = ()
    _KIND = GRAPH

    def _sources(self) -> list[int]:
        return self.Get_neighbors(self.rank)

    _destinations = _sources

    def Get_dims(self) -> tuple[int, int]:
        """``(nnodes, nedges)``."""
        t = self._topo()
        return len(t.index), len(t.edges)

    dims = property(Get_dims)
    nnodes = property(lambda self: self.Get_dims()[0])
    nedges = property(lambda self: self.Get_dims()[1])

    def Get_topo(self) -> tuple[list[int], list[int]]:
        """``(index, edges)``, ``index`` without a leading 0."""
        t = self._topo()
        return list(t.index), list(t.edges)

    topo = property(Get_topo)
    index = property(lambda self: self.Get_topo()[0])
    edges = property(lambda self: self.Get_topo()[1])

    def Get_neighbors(self, rank: int) -> list[int]:
        """The neighbours of ``rank``, in the order the graph lists them.

        Raises:
            MPI.Exception (ERR_RANK): ``rank`` is not a node of the graph.
        """
        t = self._topo()
        rank = as_int(rank, "rank", "Graphcomm.Get_neighbors")
        if not 0 <= rank < len(t.index):
            raise mpi_error(ArgumentError, "ERR_RANK", f"Graphcomm.Get_neighbors: "
                            f"rank={rank} is not in 0..{len(t.index) - 1}")
        return list(t.edges[t.index[rank - 1] if rank else 0:t.index[rank]])

    def Get_neighbors_count(self, rank: int) -> int:
        """How many neighbours ``rank`` has (ERR_RANK as :meth:`Get_neighbors`)."""
        return len(self.Get_neighbors(rank))

    neighbors = property(lambda self: self.Get_neighbors(self.rank))
    nneighbors = property(lambda self: self.Get_neighbors_count(self.rank))
