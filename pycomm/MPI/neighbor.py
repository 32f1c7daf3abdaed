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

from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError
from pycomm.p2p import PROC_NULL

from .coll import Intracomm
from .collspec import wregions
from .regions import finish_all
from .exceptions import mpi_error, translate_methods
from .joined import Joined
from .keyvals import copy_attrs
from .msgspec import as_int, message, vector_message
from .prequest import Prequest
from .request import Request

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
        """Free the communicator and the duplicate its neighbourhood collectives use (in a
        finalizer the garbage collector runs, the topology may already be gone: no more)."""
        t = TOPOLOGIES.get(self._inner("Free"))
        super().Free()
        if t is not None and t.private is not None:
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

    def _exchange(self, call: str, sends, recvs, finish=None, check=False):
        """Post every receive and send (lists of wire arrays, per neighbour).

        A blocking ``call`` waits for all and runs ``finish`` (the unpacking of
        receives of non-contiguous datatypes); an ``I...`` call returns one request
        (:class:`~pycomm.MPI.joined.Joined`) complete when every part is, whose
        completion runs ``finish``. ``check``: only make the private communicator (a
        persistent collective's initialization, which is collective) and post nothing.
        """
        comm = self._private()
        if check:
            return None
        stags, rtags = self._tags()
        reqs = [comm.Irecv(buf, src, tag) for buf, src, tag in
                zip(recvs, self._sources(), rtags)]
        reqs += [comm.Isend(buf, dst, tag) for buf, dst, tag in
                 zip(sends, self._destinations(), stags)]
        if call[0] == "I":
            return Request._wrap(Joined(comm._engine, reqs), finish)
        if reqs:
            reqs[0].Waitall(reqs)
        if finish is not None:
            finish()
        return None

    @staticmethod
    def _split(array: np.ndarray, parts: int, what: str) -> list[np.ndarray]:
        if parts == 0:
            return []
        if array.size % parts:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"{what}: {array.size} elements do "
                            f"not split into {parts} equal blocks")
        n = array.size // parts
        return [array[i * n:(i + 1) * n] for i in range(parts)]

    def _w(self, call: str) -> str:
        self._inner(call)               # a null or freed communicator raises here
        return f"rank {self.rank}: {call}"

    def _ngh_allgather(self, call, sendbuf, recvbuf, check=False):
        w = self._w(call)
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True, blocks=max(self.indegree, 1))
        return self._exchange(call, [s.array] * self.outdegree,
                              self._split(r.array, self.indegree, w), r.finish, check)

    def _ngh_alltoall(self, call, sendbuf, recvbuf, check=False):
        w = self._w(call)
        s = message(sendbuf, w, "sendbuf", writable=False, blocks=max(self.outdegree, 1))
        r = message(recvbuf, w, "recvbuf", writable=True, blocks=max(self.indegree, 1))
        return self._exchange(call, self._split(s.array, self.outdegree, w),
                              self._split(r.array, self.indegree, w), r.finish, check)

    def _blocks(self, spec, n, w, arg, writable):
        m, counts, displs = vector_message(spec, n, w, arg, writable=writable)
        return m, [m.array[d:d + c] for c, d in zip(counts, displs)]

    def _ngh_allgatherv(self, call, sendbuf, recvbuf, check=False):
        w = self._w(call)
        s = message(sendbuf, w, "sendbuf", writable=False)
        r, rblocks = self._blocks(recvbuf, self.indegree, w, "recvbuf", True)
        return self._exchange(call, [s.array] * self.outdegree, rblocks, r.finish, check)

    def _ngh_alltoallv(self, call, sendbuf, recvbuf, check=False):
        w = self._w(call)
        _, sblocks = self._blocks(sendbuf, self.outdegree, w, "sendbuf", False)
        r, rblocks = self._blocks(recvbuf, self.indegree, w, "recvbuf", True)
        return self._exchange(call, sblocks, rblocks, r.finish, check)

    def _ngh_alltoallw(self, call, sendbuf, recvbuf, check=False):
        w = self._w(call)
        for spec, arg in ((sendbuf, "sendbuf"), (recvbuf, "recvbuf")):
            if spec is IN_PLACE or spec is None:
                raise mpi_error(ArgumentError, "ERR_BUFFER", f"{w}: {arg} must be a "
                                "[buf, (counts, displs), datatypes] spec")
        sends = [b.outgoing() for b in wregions(sendbuf, self.outdegree, w, "sendbuf",
                                                 False)]
        recvs = [b.incoming() for b in wregions(recvbuf, self.indegree, w, "recvbuf", True)]
        return self._exchange(call, sends, [data for data, _ in recvs],
                              lambda: finish_all(recvs), check)

    # -- blocking (MPI-4.1 section 7.6), nonblocking (7.7) and persistent (7.8) ---------
    def Neighbor_allgather(self, sendbuf, recvbuf) -> None:
        """Send ``sendbuf`` to every out-neighbour; block i of ``recvbuf`` comes from the
        i-th in-neighbour (MPI-4.1 section 7.6.1).

        Args:
            sendbuf: a message spec (``buf``, ``[buf, datatype]``...).
            recvbuf: a message spec of ``indegree`` equal blocks (a count is per block).

        Raises:
            MPI.Exception (ERR_COUNT, ERR_BUFFER...): a receive buffer that does not
                split into ``indegree`` blocks, a read-only or non-buffer argument;
                raised before any byte moves.
        """
        return self._ngh_allgather("Neighbor_allgather", sendbuf, recvbuf)

    def Neighbor_alltoall(self, sendbuf, recvbuf) -> None:
        """Block j of ``sendbuf`` to the j-th out-neighbour; block i of ``recvbuf`` from
        the i-th in-neighbour (MPI-4.1 section 7.6.2).

        Raises:
            MPI.Exception (ERR_COUNT, ERR_BUFFER...): as :meth:`Neighbor_allgather`.
        """
        return self._ngh_alltoall("Neighbor_alltoall", sendbuf, recvbuf)

    def Neighbor_allgatherv(self, sendbuf, recvbuf) -> None:
        """As :meth:`Neighbor_allgather` into the vector spec ``recvbuf`` (one block per
        in-neighbour; MPI-4.1 section 7.6.1).

        Raises:
            MPI.Exception (ERR_ARG, ERR_BUFFER...): counts or displacements that are not
                one per in-neighbour or reach past the buffer.
        """
        return self._ngh_allgatherv("Neighbor_allgatherv", sendbuf, recvbuf)

    def Neighbor_alltoallv(self, sendbuf, recvbuf) -> None:
        """As :meth:`Neighbor_alltoall` with vector specs (one block per neighbour;
        MPI-4.1 section 7.6.2).

        Raises:
            MPI.Exception: as :meth:`Neighbor_allgatherv`, for both buffers.
        """
        return self._ngh_alltoallv("Neighbor_alltoallv", sendbuf, recvbuf)

    def Neighbor_alltoallw(self, sendbuf, recvbuf) -> None:
        """All-to-all with a count, byte displacement and datatype per neighbour
        (MPI-4.1 section 7.6.2): specs ``[buf, (counts, displs), datatypes]`` or
        ``[buf, counts, displs, datatypes]``, ``buf`` may be ``MPI.BOTTOM`` (the
        displacements are then addresses).

        Raises:
            MPI.Exception (ERR_ARG, ERR_BUFFER, ERR_TYPE): lists that are not one per
                neighbour, a block past the buffer, an uncommitted datatype.
        """
        return self._ngh_alltoallw("Neighbor_alltoallw", sendbuf, recvbuf)

    def Ineighbor_allgather(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Neighbor_allgather` (MPI-4.1 section 7.7.1).

        Every receive and send is posted now as point-to-point requests on the
        topology's private communicator; they progress on ``Wait``/``Test`` of the
        returned request (and on any other call that drives the engine).

        Returns:
            Request: complete when every block has moved; ``recvbuf`` must not be read
            (nor ``sendbuf`` written) before.

        Raises:
            MPI.Exception: as :meth:`Neighbor_allgather`, before anything is posted.
        """
        return self._ngh_allgather("Ineighbor_allgather", sendbuf, recvbuf)

    def Ineighbor_allgatherv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Neighbor_allgatherv` (MPI-4.1 section 7.7.1).

        Returns:
            Request: as :meth:`Ineighbor_allgather`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_allgatherv`.
        """
        return self._ngh_allgatherv("Ineighbor_allgatherv", sendbuf, recvbuf)

    def Ineighbor_alltoall(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Neighbor_alltoall` (MPI-4.1 section 7.7.2).

        Returns:
            Request: as :meth:`Ineighbor_allgather`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoall`.
        """
        return self._ngh_alltoall("Ineighbor_alltoall", sendbuf, recvbuf)

    def Ineighbor_alltoallv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Neighbor_alltoallv` (MPI-4.1 section 7.7.2).

        Returns:
            Request: as :meth:`Ineighbor_allgather`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoallv`.
        """
        return self._ngh_alltoallv("Ineighbor_alltoallv", sendbuf, recvbuf)

    def Ineighbor_alltoallw(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Neighbor_alltoallw` (MPI-4.1 section 7.7.2): non-contiguous
        send blocks are packed now, received ones unpacked at completion.

        Returns:
            Request: as :meth:`Ineighbor_allgather`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoallw`.
        """
        return self._ngh_alltoallw("Ineighbor_alltoallw", sendbuf, recvbuf)

    def _ngh_persistent(self, name: str, sendbuf, recvbuf) -> Prequest:
        """``<name>_init``: the arguments are checked now (a parse that moves nothing);
        each ``Start`` posts ``I<name>`` on the buffers' contents at that moment."""
        post = getattr(self, "_ngh_" + name[len("Neighbor_"):])
        post("I" + name[0].lower() + name[1:], sendbuf, recvbuf, check=True)

        def start():
            r = post("I" + name[0].lower() + name[1:], sendbuf, recvbuf)
            return r._r, r._finish
        return Prequest._persistent(start)

    def Neighbor_allgather_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        """Persistent :meth:`Neighbor_allgather` (MPI-4.1 section 7.8; collective).

        Args:
            sendbuf, recvbuf: as :meth:`Neighbor_allgather`, bound to the request.
            info: ignored (``INFO_NULL`` or an ``MPI.Info``).

        Returns:
            Prequest: inactive; each ``Start`` posts the exchange of the buffers'
            contents at that moment, ``Wait`` completes it, ``Free`` ends it.

        Raises:
            MPI.Exception: as :meth:`Neighbor_allgather`, here rather than at ``Start``.
        """
        return self._ngh_persistent("Neighbor_allgather", sendbuf, recvbuf)

    def Neighbor_allgatherv_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        """Persistent :meth:`Neighbor_allgatherv` (MPI-4.1 section 7.8; collective).

        Returns:
            Prequest: as :meth:`Neighbor_allgather_init`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_allgatherv`, at initialization.
        """
        return self._ngh_persistent("Neighbor_allgatherv", sendbuf, recvbuf)

    def Neighbor_alltoall_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        """Persistent :meth:`Neighbor_alltoall` (MPI-4.1 section 7.8; collective).

        Returns:
            Prequest: as :meth:`Neighbor_allgather_init`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoall`, at initialization.
        """
        return self._ngh_persistent("Neighbor_alltoall", sendbuf, recvbuf)

    def Neighbor_alltoallv_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        """Persistent :meth:`Neighbor_alltoallv` (MPI-4.1 section 7.8; collective).

        Returns:
            Prequest: as :meth:`Neighbor_allgather_init`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoallv`, at initialization.
        """
        return self._ngh_persistent("Neighbor_alltoallv", sendbuf, recvbuf)

    def Neighbor_alltoallw_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        """Persistent :meth:`Neighbor_alltoallw` (MPI-4.1 section 7.8; collective).

        Returns:
            Prequest: as :meth:`Neighbor_allgather_init`.

        Raises:
            MPI.Exception: as :meth:`Neighbor_alltoallw`, at initialization.
        """
        return self._ngh_persistent("Neighbor_alltoallw", sendbuf, recvbuf)

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
    # None: no neighbours (no truth test: a numpy array of one rank 0 is falsy)
    src, dst = ([as_int(r, arg, w) for r in (() if v is None else v)]
                for arg, v in (("sources", sources), ("destinations", destinations)))
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
