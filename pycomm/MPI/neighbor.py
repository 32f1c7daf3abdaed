"""Neighbourhood collectives and distributed graphs: ``MPI.Topocomm``, ``Distgraphcomm``.

The Communicator has no neighbourhood collectives, so :class:`Topocomm` runs MPI's
definition of them (MPI-4.0 section 8.6) with the Communicator's public ``Isend`` /
``Irecv``: every rank sends block j of its send buffer to its j-th out-neighbour and
receives from its i-th in-neighbour into block i of its receive buffer, all posted at once
and waited together (no deadlock, whatever the graph). The traffic runs on a private
duplicate of the communicator (made on the first neighbourhood call, collectively), so it
never matches user messages. Matching between a pair of ranks: on a Cartesian grid the tag
is the receiver's slot (a rank two steps round a periodic ring of two is both neighbours of
its peer); on a distributed graph the k-th edge from a to b meets the k-th edge into b from
a, since messages between two ranks keep their order. ``PROC_NULL`` neighbours (the edges
of a non-periodic grid) send and receive nothing, leaving their blocks untouched.

A topology belongs to the communicator, not to one handle of it: :data:`TOPOLOGIES` maps
each pycomm Communicator to its :class:`Topology`, so ``MPI.Cartcomm(cart)``,
``Comm.fromhandle`` and ``Intracomm(cart).Get_topology()`` all see the same grid.
"""

from __future__ import annotations

import weakref

import numpy as np

from pycomm.errors import ArgumentError
from pycomm.p2p import PROC_NULL

from .coll import Intracomm
from .exceptions import mpi_error, translate_methods
from .keyvals import copy_attrs
from .msgspec import as_int, message, vector_message

__all__ = ["CART", "DIST_GRAPH", "GRAPH", "TOPOLOGIES", "UNWEIGHTED", "Distgraphcomm",
           "Topocomm", "Topology", "create_dist_graph_adjacent", "with_topology"]

UNWEIGHTED = None
WEIGHTS_EMPTY = ()
CART, GRAPH, DIST_GRAPH = 1, 2, 3
_KIND_NAMES = {None: "a topology", CART: "a Cartesian", GRAPH: "a general graph",
               DIST_GRAPH: "a distributed graph"}


class Topology:
    """A communicator's topology: ``kind`` (CART, GRAPH or DIST_GRAPH) and that kind's
    fields (``dims``/``periods``; ``index``/``edges``; ``src``/``dst``/``sw``/``dw``);
    ``private`` is the duplicate the neighbourhood collectives run on, made on first use."""

    def __init__(self, kind: int, **fields):
        self.kind, self.private = kind, None
        self.__dict__.update(fields)

    def copy(self) -> Topology:
        """The same topology for a duplicate communicator (without the private one)."""
        return Topology(**{k: v for k, v in vars(self).items() if k != "private"})


# pycomm Communicator -> its Topology (weak: a freed communicator drops its entry)
TOPOLOGIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def with_topology(cls: type, inner, kind: int, **fields):
    """``cls`` wrapping ``inner`` with a new topology (COMM_NULL when ``inner`` is none)."""
    out = cls._wrap(inner)
    if out:
        TOPOLOGIES[inner] = Topology(kind, **fields)
    return out


@translate_methods
class Topocomm(Intracomm):
    """A communicator with neighbours (mpi4py's ``MPI.Topocomm``).

    ``Topocomm(comm)`` (and ``Cartcomm(comm)``...) is a new handle to ``comm``, which must
    have a topology of the class's kind (else ``TypeError``, as mpi4py); ``Topocomm()`` is
    a null communicator.
    """

    __slots__ = ()
    _KIND: int | None = None        # the topology kind this class wraps (None: any)

    def __init__(self, comm=None):
        super().__init__(comm)
        if self._c is not None:
            t = TOPOLOGIES.get(self._c)
            if t is None or self._KIND not in (None, t.kind):
                raise TypeError(f"MPI.{type(self).__name__}(comm): expecting "
                                f"{_KIND_NAMES[self._KIND]} communicator")

    def _topo(self) -> Topology:
        return TOPOLOGIES[self._inner("topology query")]

    def Get_topology(self) -> int:
        return self._topo().kind

    def Dup(self, info=None) -> Topocomm:
        """A duplicate with the same topology (collective)."""
        t = self._topo()
        inner = self._inner("Dup")
        attrs = copy_attrs(self, self._attrs, "Comm.Dup")
        out = type(self)._wrap(inner.Dup())
        TOPOLOGIES[out._c] = t.copy()
        out._errhandler = self._errhandler
        out._attrs.update(attrs)
        return out

    Clone = Dup

    def Free(self) -> None:
        """Free the communicator and the duplicate its neighbourhood collectives use."""
        t = self._topo()
        super().Free()
        if t.private is not None:
            t.private.Free()
            t.private = None

    # -- neighbours, overridden by the topologies ---------------------------------------
    def _sources(self) -> list[int]:
        raise NotImplementedError

    def _destinations(self) -> list[int]:
        raise NotImplementedError

    def _tags(self) -> tuple[list[int], list[int]]:
        """Tags of the sends (per out-neighbour) and receives (per in-neighbour)."""
        return [0] * len(self._destinations()), [0] * len(self._sources())

    is_topo = property(lambda self: True)
    indegree = property(lambda self: len(self._sources()))
    outdegree = property(lambda self: len(self._destinations()))
    inedges = property(lambda self: list(self._sources()))
    outedges = property(lambda self: list(self._destinations()))
    inoutedges = property(lambda self: (list(self._sources()), list(self._destinations())))

    def _private(self):
        t = self._topo()
        if t.private is None:
            t.private = self._inner("neighbour collective").Dup()
        return t.private

    def _exchange(self, sends, recvs) -> None:
        """Post every receive and send (lists of wire arrays, per neighbour) and wait."""
        comm = self._private()
        stags, rtags = self._tags()
        reqs = [comm.Irecv(buf, src, tag) for buf, src, tag in
                zip(recvs, self._sources(), rtags)]
        reqs += [comm.Isend(buf, dst, tag) for buf, dst, tag in
                 zip(sends, self._destinations(), stags)]
        if reqs:
            reqs[0].Waitall(reqs)

    @staticmethod
    def _split(array: np.ndarray, parts: int, what: str) -> list[np.ndarray]:
        if parts == 0:
            return []
        if array.size % parts:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"{what}: {array.size} elements do "
                            f"not split into {parts} equal blocks")
        n = array.size // parts
        return [array[i * n:(i + 1) * n] for i in range(parts)]

    def Neighbor_allgather(self, sendbuf, recvbuf) -> None:
        """Send ``sendbuf`` to every out-neighbour; block i of ``recvbuf`` comes from the
        i-th in-neighbour."""
        w = f"rank {self.rank}: Neighbor_allgather"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True, blocks=max(self.indegree, 1))
        self._exchange([s.array] * self.outdegree, self._split(r.array, self.indegree, w))
        r.finish()

    def Neighbor_alltoall(self, sendbuf, recvbuf) -> None:
        """Block j of ``sendbuf`` to the j-th out-neighbour; block i of ``recvbuf`` from
        the i-th in-neighbour."""
        w = f"rank {self.rank}: Neighbor_alltoall"
        s = message(sendbuf, w, "sendbuf", writable=False, blocks=max(self.outdegree, 1))
        r = message(recvbuf, w, "recvbuf", writable=True, blocks=max(self.indegree, 1))
        self._exchange(self._split(s.array, self.outdegree, w),
                       self._split(r.array, self.indegree, w))
        r.finish()

    def _blocks(self, spec, n, w, arg, writable):
        m, counts, displs = vector_message(spec, n, w, arg, writable=writable)
        return m, [m.array[d:d + c] for c, d in zip(counts, displs)]

    def Neighbor_allgatherv(self, sendbuf, recvbuf) -> None:
        """As :meth:`Neighbor_allgather` into the vector spec ``recvbuf`` (one block per
        in-neighbour)."""
        w = f"rank {self.rank}: Neighbor_allgatherv"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r, rblocks = self._blocks(recvbuf, self.indegree, w, "recvbuf", True)
        self._exchange([s.array] * self.outdegree, rblocks)
        r.finish()

    def Neighbor_alltoallv(self, sendbuf, recvbuf) -> None:
        """As :meth:`Neighbor_alltoall` with vector specs (one block per neighbour)."""
        w = f"rank {self.rank}: Neighbor_alltoallv"
        _, sblocks = self._blocks(sendbuf, self.outdegree, w, "sendbuf", False)
        r, rblocks = self._blocks(recvbuf, self.indegree, w, "recvbuf", True)
        self._exchange(sblocks, rblocks)
        r.finish()

    def neighbor_allgather(self, sendobj) -> list:
        """Object form: the list of the in-neighbours' objects (None for PROC_NULL)."""
        from .objects import comm_lock
        with comm_lock(self, "neighbor_allgather"):
            return self._neighbor_objects([sendobj] * self.outdegree)

    def neighbor_alltoall(self, sendobj) -> list:
        """Object form: item j of ``sendobj`` to the j-th out-neighbour; returns the list
        of what the in-neighbours sent."""
        from .objects import comm_lock
        with comm_lock(self, "neighbor_alltoall"):
            return self._neighbor_objects(sendobj)

    def _neighbor_objects(self, sendobj) -> list:
        comm = self._private()
        stags, rtags = self._tags()
        items = list(sendobj)
        if len(items) != self.outdegree:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"rank {self.rank}: "
                            f"neighbor_alltoall: {len(items)} objects for "
                            f"{self.outdegree} out-neighbours")
        reqs = [comm.irecv(None, src, tag) for src, tag in zip(self._sources(), rtags)]
        sends = [comm.isend(obj, dst, tag) for obj, dst, tag in
                 zip(items, self._destinations(), stags)]
        out = [r.wait() for r in reqs]
        for r in sends:
            r.wait()
        return out


@translate_methods
class Distgraphcomm(Topocomm):
    """A distributed-graph communicator (mpi4py's ``MPI.Distgraphcomm``)."""

    __slots__ = ()
    _KIND = DIST_GRAPH
    _src = property(lambda self: self._topo().src)
    _dst = property(lambda self: self._topo().dst)
    _sw = property(lambda self: self._topo().sw)
    _dw = property(lambda self: self._topo().dw)

    def _sources(self) -> list[int]:
        return self._src

    def _destinations(self) -> list[int]:
        return self._dst

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:
        """``(indegree, outdegree, weighted)``."""
        return len(self._src), len(self._dst), self._sw is not None

    def Get_dist_neighbors(self):
        """``(sources, destinations, (sourceweights, destweights) or None)``."""
        weights = None if self._sw is None else (list(self._sw), list(self._dw))
        return list(self._src), list(self._dst), weights


def create_dist_graph_adjacent(comm: Intracomm, sources, destinations, sourceweights,
                               destweights) -> Distgraphcomm:
    """``Intracomm.Create_dist_graph_adjacent`` (collective; ranks are not reordered).

    Raises:
        MPI.Exception (ERR_RANK / ERR_ARG): a neighbour outside the communicator, or
            weights whose length differs from the neighbour list's.
    """
    c = comm._inner("Create_dist_graph_adjacent")
    w = f"rank {c.rank}: Create_dist_graph_adjacent"
    src = [as_int(r, "sources", w) for r in sources or ()]       # None: no neighbours
    dst = [as_int(r, "destinations", w) for r in destinations or ()]
    for r in src + dst:
        if not (0 <= r < c.size or r == PROC_NULL):
            raise mpi_error(ArgumentError, "ERR_RANK", f"{w}: neighbour {r} is not a rank "
                            f"of a communicator of size {c.size}")
    weighted = sourceweights is not None or destweights is not None
    sw = list(sourceweights) if sourceweights is not None else [1] * len(src)
    dw = list(destweights) if destweights is not None else [1] * len(dst)
    if len(sw) != len(src) or len(dw) != len(dst):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: {len(sw)} source weights for "
                        f"{len(src)} sources, {len(dw)} destination weights for "
                        f"{len(dst)} destinations")
    return with_topology(Distgraphcomm, c.Dup(), DIST_GRAPH, src=src, dst=dst,
                         sw=sw if weighted else None, dw=dw if weighted else None)
