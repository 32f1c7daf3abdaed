"""``MPI.Intracomm``: the buffer collectives of mpi4py over the pycomm Communicator.

Each collective parses its message specs (:mod:`pycomm.MPI.msgspec`; in the buffers that
hold one block per rank, a count in the spec is per rank, as MPI's sendcount/recvcount),
calls the Communicator's method of the same name (the I-variants return an
``MPI.Request`` whose completion unpacks receives of non-contiguous datatypes) and holds
no collective logic itself. Buffers a rank does not use (the receive buffer of a
non-root Gather, the send buffer of a non-root Scatter) are not parsed and may be None.
"""

from __future__ import annotations

import numpy as np

from pycomm.buffers import IN_PLACE, CheckedVector
from pycomm.collectives.scratch import give, take

from .collspec import (item_array, match_empty, plain_pair, plain_to_root, reducible,
                       root_none, starts, wregions)
from . import ports as _ports
from . import spawn as _spawn
from .comm import Comm
from .comm import fin as _fin
from .exceptions import translate_methods
from .msg import plain, plain_vector
from .msgspec import Msg, as_int, message, vector_message
from .ops import SUM
from .request import Request

__all__ = ["Intracomm"]


@translate_methods
class Intracomm(Comm):
    """An intra-communicator (mpi4py's ``MPI.Intracomm``): the buffer collectives."""

    __slots__ = ()

    def __init__(self, comm: Comm | None = None):
        super().__init__(comm)
        from .interlink import is_inter
        if is_inter(self._c):
            raise TypeError("MPI.Intracomm(comm): expecting an intracommunicator")

    def _send_recv(self, call, sendbuf, recvbuf, *, send=True, recv=True, sblocks=1,
                   rblocks=1):
        """(inner, where, send Msg or IN_PLACE/None, recv Msg or None); ``*blocks``: the
        buffer holds one block per rank (a count in its spec is per block)."""
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        s = IN_PLACE if sendbuf is IN_PLACE else (
            message(sendbuf, w, "sendbuf", writable=False, blocks=sblocks) if send else None)
        r = IN_PLACE if recvbuf is IN_PLACE else (
            message(recvbuf, w, "recvbuf", writable=True, blocks=rblocks) if recv else None)
        match_empty(s, r)
        return c, w, s, r

    @staticmethod
    def _a(m):
        return m if m is IN_PLACE or m is None else m.array

    def Barrier(self) -> None:
        """Block until every rank has entered."""
        self._inner("Barrier").Barrier()

    def Bcast(self, buf, root: int = 0) -> None:
        """Broadcast root's message ``buf`` to every rank's ``buf``."""
        c = self._c
        if c is not None and type(root) is int:
            array = plain(buf, c.rank != root)
            if array is not None:               # nothing to parse, nothing to unpack
                return c.Bcast(array, root)
        self._bcast(buf, root, False)

    def Ibcast(self, buf, root: int = 0) -> Request:
        return self._bcast(buf, root, True)

    def _bcast(self, buf, root, nb):
        call = "Ibcast" if nb else "Bcast"
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        root = as_int(root, "root", w)
        m = message(buf, w, "buf", writable=c.rank != root)
        fin = _fin(m) if c.rank != root else None
        if nb:
            return Request._wrap(c.Ibcast(m.array, root), fin)
        c.Bcast(m.array, root)
        if fin:
            fin()

    def _done(self, nb, inner_req, *msgs):
        fin = _fin(*[m for m in msgs if isinstance(m, Msg)])
        if nb:
            return Request._wrap(inner_req, fin)
        if fin:
            fin()
        return None

    # reductions
    def Reduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> None:
        """Combine every rank's ``sendbuf`` with ``op`` into root's ``recvbuf``."""
        c = self._c
        if c is not None and type(root) is int and getattr(op, "name", None) != "OP_NULL":
            pair = plain_to_root(c.rank == root, sendbuf, recvbuf)
            if pair is not None:
                return c.Reduce(*pair, op, root)
        return self._reduce("Reduce", sendbuf, recvbuf, op, root)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> Request:
        return self._reduce("Ireduce", sendbuf, recvbuf, op, root)

    def _reduce(self, call, sendbuf, recvbuf, op, root):
        c = self._inner(call)
        root = as_int(root, "root", f"rank {c.rank}: {call}")
        at_root = c.rank == root
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf, recv=at_root)
        op, per = reducible(w, op, s, r)
        fn = c.Ireduce if call[0] == "I" else c.Reduce
        return self._done(call[0] == "I",
                          fn(item_array(s, per), item_array(r, per), op, root), r)

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """Combine every rank's ``sendbuf`` with ``op``; every ``recvbuf`` gets it."""
        c = self._c
        if c is not None and getattr(op, "name", None) != "OP_NULL":
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Allreduce(*pair, op)
        return self._reduce_all("Allreduce", sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iallreduce", sendbuf, recvbuf, op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> None:
        """Reduce ``size*n`` items; rank i gets block i (``n`` items)."""
        c = self._c
        if c is not None and getattr(op, "name", None) != "OP_NULL":
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Reduce_scatter_block(*pair, op)
        return self._reduce_all("Reduce_scatter_block", sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Ireduce_scatter_block", sendbuf, recvbuf, op)

    def Scan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Inclusive prefix reduction in rank order."""
        c = self._c
        if c is not None and getattr(op, "name", None) != "OP_NULL":
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Scan(*pair, op)
        return self._reduce_all("Scan", sendbuf, recvbuf, op)

    def Iscan(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iscan", sendbuf, recvbuf, op)

    def Exscan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Exclusive prefix reduction; rank 0's ``recvbuf`` is left untouched."""
        c = self._c
        if c is not None and getattr(op, "name", None) != "OP_NULL":
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Exscan(*pair, op)
        return self._reduce_all("Exscan", sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iexscan", sendbuf, recvbuf, op)

    def _reduce_all(self, call, sendbuf, recvbuf, op):
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf)
        op, per = reducible(w, op, s, r)
        out = getattr(c, call)(item_array(s, per), item_array(r, per), op)
        return self._done(call[0] == "I", out, r)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> None:
        """Reduce ``sum(recvcounts)`` items; rank i gets ``recvcounts[i]`` of them
        (``recvcounts`` None: each rank's ``recvbuf`` count, agreed by an Allgather)."""
        return self._reduce_scatter("Reduce_scatter", sendbuf, recvbuf, recvcounts, op)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> Request:
        """Nonblocking :meth:`Reduce_scatter` (the reduction runs on the progress thread;
        with ``recvcounts`` None the counts are first agreed by a blocking Allgather, as
        in mpi4py)."""
        return self._reduce_scatter("Ireduce_scatter", sendbuf, recvbuf, recvcounts, op)

    def _reduce_scatter(self, call, sendbuf, recvbuf, recvcounts, op):
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf)
        op, items = reducible(w, op, s, r)
        counts = recvcounts
        if recvcounts is not None:      # in elements, or in items where they stay whole
            per = r.per if isinstance(r, Msg) and items == 1 else 1
            counts = [as_int(x, "recvcounts", w) * per for x in recvcounts]
        out = getattr(c, call)(item_array(s, items), item_array(r, items), counts, op)
        return self._done(call[0] == "I", out, r)

    # gathers and scatters
    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather every rank's message into root's ``recvbuf`` in rank order."""
        c = self._c
        if c is not None and type(root) is int:
            pair = plain_to_root(c.rank == root, sendbuf, recvbuf)
            if pair is not None:
                return c.Gather(*pair, root)
        return self._rooted("Gather", sendbuf, recvbuf, root, root_recv=True)

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rooted("Igather", sendbuf, recvbuf, root, root_recv=True)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Send block i of root's ``sendbuf`` to rank i's ``recvbuf``."""
        c = self._c
        if c is not None and type(root) is int:
            if c.rank == root:      # (IN_PLACE there is the receive buffer: general way)
                s, r = plain(sendbuf, False), plain(recvbuf, True)
                pair = None if s is None or r is None or s.dtype != r.dtype else (s, r)
            else:                   # (the send buffer is not used: not parsed)
                r = plain(recvbuf, True)
                pair = None if r is None else (None, r)
            if pair is not None:
                return c.Scatter(*pair, root)
        return self._rooted("Scatter", sendbuf, recvbuf, root, root_recv=False)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rooted("Iscatter", sendbuf, recvbuf, root, root_recv=False)

    def _rooted(self, call, sendbuf, recvbuf, root, *, root_recv):
        c = self._inner(call)
        root = as_int(root, "root", f"rank {c.rank}: {call}")
        at_root = c.rank == root
        n = c.size
        sendbuf, recvbuf = root_none(at_root, root_recv, sendbuf, recvbuf)
        c, _w, s, r = self._send_recv(call, sendbuf, recvbuf,
                                     send=at_root or root_recv, recv=at_root or not root_recv,
                                     sblocks=1 if root_recv else n, rblocks=n if root_recv else 1)
        return self._done(call[0] == "I", getattr(c, call)(self._a(s), self._a(r), root), r)

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every rank gets every rank's message, in rank order."""
        c = self._c
        if c is not None:
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Allgather(*pair)
        return self._all("Allgather", sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return self._all("Iallgather", sendbuf, recvbuf)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block j of ``sendbuf`` goes to rank j; block i of ``recvbuf`` comes from i."""
        c = self._c
        if c is not None:
            pair = plain_pair(sendbuf, recvbuf)
            if pair is not None:
                return c.Alltoall(*pair)
        return self._all("Alltoall", sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        return self._all("Ialltoall", sendbuf, recvbuf)

    def _all(self, call, sendbuf, recvbuf):
        if sendbuf is None and "gather" in call:    # zero count everywhere: blocks stay
            sendbuf = IN_PLACE
        n = self._inner(call).size
        c, _w, s, r = self._send_recv(call, sendbuf, recvbuf, rblocks=n,
                                     sblocks=n if "lltoall" in call else 1)
        return self._done(call[0] == "I", getattr(c, call)(self._a(s), self._a(r)), r)

    # vector variants
    def _v(self, c, w, spec, arg, writable):
        if spec is IN_PLACE:
            return IN_PLACE, None
        m, counts, displs = vector_message(spec, c.size, w, arg, writable=writable)
        return m, CheckedVector([m.array, counts, displs])

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather a variable-size message from each rank into root's vector spec."""
        return self._rootedv("Gatherv", sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rootedv("Igatherv", sendbuf, recvbuf, root)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Send root's vector-spec block i to rank i."""
        return self._rootedv("Scatterv", sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rootedv("Iscatterv", sendbuf, recvbuf, root)

    def _rootedv(self, call, sendbuf, recvbuf, root):
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        root = as_int(root, "root", w)
        gather = "atherv" in call
        at_root = c.rank == root
        sendbuf, recvbuf = root_none(at_root, gather, sendbuf, recvbuf)
        if gather:
            s = IN_PLACE if sendbuf is IN_PLACE else message(sendbuf, w, "sendbuf",
                                                              writable=False)
            r, rspec = self._v(c, w, recvbuf, "recvbuf", True) if at_root else (None, None)
            match_empty(s, r)
            if isinstance(r, Msg):
                rspec[0] = r.array
            out = getattr(c, call)(self._a(s), rspec, root)
        else:
            s, sspec = self._v(c, w, sendbuf, "sendbuf", False) if at_root else (None, None)
            r = IN_PLACE if recvbuf is IN_PLACE else message(recvbuf, w, "recvbuf",
                                                              writable=True)
            match_empty(r, s)
            if at_root and isinstance(s, Msg):
                sspec[0] = s.array
            out = getattr(c, call)(sspec if at_root else None, self._a(r), root)
        return self._done(call[0] == "I", out, r)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        """Every rank gets every rank's variable-size message in its vector spec."""
        return self._allv("Allgatherv", sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        return self._allv("Iallgatherv", sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """Vector-spec block j of ``sendbuf`` goes to rank j."""
        c = self._c
        if c is not None:   # two plain vector specs of one dtype: nothing to pack, unpack
            s = plain_vector(sendbuf, c.size, False)   # or retype (else the general way,
            r = plain_vector(recvbuf, c.size, True)    # which also raises what is wrong)
            if s is not None and r is not None and s[0].array.dtype == r[0].array.dtype:
                c.Alltoallv(CheckedVector([s[0].array, s[1], s[2]]),
                            CheckedVector([r[0].array, r[1], r[2]]))
                return None
        return self._allv("Alltoallv", sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        return self._allv("Ialltoallv", sendbuf, recvbuf)

    def _allv(self, call, sendbuf, recvbuf):
        if sendbuf is None and "gather" in call:    # zero count everywhere: blocks stay
            sendbuf = IN_PLACE
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        r, rspec = self._v(c, w, recvbuf, "recvbuf", True)
        if "gather" in call:
            s = IN_PLACE if sendbuf is IN_PLACE else message(sendbuf, w, "sendbuf",
                                                              writable=False)
            match_empty(s, r)
            if isinstance(r, Msg):
                rspec[0] = r.array
            out = getattr(c, call)(self._a(s), rspec)
        else:
            s, sspec = self._v(c, w, sendbuf, "sendbuf", False)
            match_empty(s, r)
            if isinstance(s, Msg):
                sspec[0] = s.array
            if isinstance(r, Msg):
                rspec[0] = r.array
            out = getattr(c, call)(IN_PLACE if s is IN_PLACE else sspec, rspec)
        return self._done(call[0] == "I", out, r)

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        """All-to-all with a datatype, count and byte displacement per peer: specs
        ``[buf, (counts, displs), datatypes]`` or ``[buf, counts, displs, datatypes]``.

        Each block is packed with its own datatype into bytes and the bytes move with the
        Communicator's ``Alltoallv``; received blocks are unpacked through theirs.

        ``MPI.BOTTOM`` as the buffer: each datatype's displacements are absolute
        addresses (:func:`pycomm.MPI.msgspec.bottom`).
        """
        return self._alltoallw("Alltoallw", sendbuf, recvbuf)

    def Ialltoallw(self, sendbuf, recvbuf) -> Request:
        """Nonblocking :meth:`Alltoallw`: the send blocks are packed now, the bytes move
        on the progress thread, and the receive blocks are unpacked at completion."""
        return self._alltoallw("Ialltoallw", sendbuf, recvbuf)

    def _alltoallw(self, call, sendbuf, recvbuf):
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        rblocks = wregions(recvbuf, c.size, w, "recvbuf", True)
        sblocks = rblocks if sendbuf is IN_PLACE else \
            wregions(sendbuf, c.size, w, "sendbuf", False)
        scounts = [b.nbytes for b in sblocks]
        rcounts = [b.nbytes for b in rblocks]
        sdispls, rdispls = starts(scounts), starts(rcounts)
        # each block packs straight into the outgoing bytes and unpacks straight from the
        # incoming ones; both are pooled scratch (a fresh megabyte faults its pages in)
        out, got = take(sum(scounts), np.uint8), take(sum(rcounts), np.uint8)
        for b, d, n in zip(sblocks, sdispls, scounts):
            b.pack_into(out[d:d + n])
        # this rank's own block unpacks from where it was packed and stays out of the
        # exchange, which would copy it once more (unless its two sizes differ: then the
        # exchange refuses the call, as for any pair)
        me = c.rank
        own = scounts[me] == rcounts[me]
        xs, xr = (scounts, rcounts) if not own else (
            [0 if r == me else n for r, n in enumerate(scounts)],
            [0 if r == me else n for r, n in enumerate(rcounts)])

        def unpack() -> None:
            for r, (b, d, n) in enumerate(zip(rblocks, rdispls, rcounts)):
                if r == me and own:
                    b.unpack_from(out[sdispls[me]:sdispls[me] + n])
                else:
                    b.unpack_from(got[d:d + n])
            give(out)
            give(got)
        fn = c.Ialltoallv if call[0] == "I" else c.Alltoallv
        inner = fn(CheckedVector([out, xs, sdispls]), CheckedVector([got, xr, rdispls]))
        if call[0] == "I":
            return Request._wrap(inner, unpack)
        unpack()
        return None

    def Ibarrier(self) -> Request:
        return Request._wrap(self._inner("Ibarrier").Ibarrier())

    # topologies
    def Create_cart(self, dims, periods=None, reorder: bool = False):
        """A Cartesian communicator over the first ``prod(dims)`` ranks (others: NULL)."""
        from .topo import create_cart
        return create_cart(self, dims, periods, reorder)

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None,
                                   destweights=None, info=None, reorder: bool = False):
        """A distributed graph: this rank receives from ``sources`` and sends to
        ``destinations`` in the neighbourhood collectives (collective; no reordering)."""
        from .neighbor import create_dist_graph_adjacent
        return create_dist_graph_adjacent(self, sources, destinations, sourceweights,
                                          destweights)

    def Cart_map(self, dims, periods=None) -> int:
        from .topo import cart_map
        return cart_map(self, dims)

    def Create_graph(self, index, edges, reorder: bool = False):
        """A general graph over the first ``len(index)`` ranks (others: COMM_NULL); see
        :mod:`pycomm.MPI.graph`."""
        from .graph import create_graph
        return create_graph(self, index, edges, reorder)

    def Graph_map(self, index, edges) -> int:
        from .graph import graph_map
        return graph_map(self, index, edges)

    def Create_dist_graph(self, sources, degrees, destinations, weights=None, info=None,
                          reorder: bool = False):
        """A distributed graph from the edges each rank names (collective)."""
        from .graph import create_dist_graph
        return create_dist_graph(self, sources, degrees, destinations, weights)

    def Create_intercomm(self, local_leader: int, peer_comm, remote_leader: int,
                         tag: int = 0):
        """MPI_Intercomm_create: the inter-communicator joining this group with the group
        of ``remote_leader`` (a rank of ``peer_comm``); see :mod:`pycomm.MPI.intercomm`."""
        from .intercomm import create_intercomm
        return create_intercomm(self, local_leader, peer_comm, remote_leader, tag)

    # dynamic processes (MPI-4.1 11.8-11.9): pycomm.MPI.spawn and pycomm.MPI.ports
    Spawn, Spawn_multiple = _spawn.Spawn, _spawn.Spawn_multiple
    Accept, Connect = _ports.Accept, _ports.Connect

