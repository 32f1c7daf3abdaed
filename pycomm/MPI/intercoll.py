"""The buffer collectives of ``MPI.Intercomm`` (MPI-4.1 section 6.2.2 and each
collective's inter-communicator paragraph), in MPICH's classic constructions.

Roots: in a rooted collective the root passes ``MPI.ROOT``, the other processes of its
group ``MPI.PROC_NULL`` (they take no part), and the other group the root's rank in it;
anything else is ``ERR_ROOT`` before any byte moves. Data flows between the groups only:
a Gather fills the root with the remote group's blocks, an Allgather gives each group the
other's, an Allreduce each group the reduction of the other's data.

Every construction is a local intra-collective over the local group's communicator
(``link.local``) plus point-to-point messages between the groups on the link's own
context (``link.coll``, apart from user traffic; one tag per collective kind, so calls
that follow one another match in order: MPI orders collective calls and messages between
two processes do not overtake). ``L`` below is the local group's size, ``R`` the
remote's, ``n`` the bytes of one block:

=========================  ========================================================  =====
call                       MPICH algorithm (``src/mpi/coll/<call>/``)                cost
=========================  ========================================================  =====
Barrier                    local barrier, leaders swap a 0-byte message, local        2 barriers
                           barrier (``barrier_inter_bcast``)                          + 1 step
Bcast                      root sends to remote rank 0, which bcasts locally          1 + bcast
                           (``bcast_inter_remote_send_local_bcast``)
Gather, Scatter            local gather to rank 0, which sends all to the root;       L*n crosses
                           the root sends all to remote rank 0, which scatters        once
                           (``gather_inter_local_gather_remote_send``,
                           ``scatter_inter_remote_send_local_scatter``)
Gatherv, Scatterv          the root receives from (sends to) each remote rank         R steps
                           (``gatherv_allcomm_linear``, ``scatterv_allcomm_linear``)
Allgather                  local gather, leaders swap, local bcast                   2 crossings
                           (``allgather_inter_local_gather_remote_bcast``)
Allgatherv                 each rank sends to remote rank 0 (a Gatherv to it), local  R + bcast
                           bcast (``allgatherv_inter_remote_gather_local_bcast``)
Alltoall(v/w)              pairwise exchange over max(L, R) steps, PROC_NULL past     max(L,R)
                           the remote size (``alltoall_inter_pairwise_exchange``)     steps
Reduce                     local reduce to rank 0, which sends to the root            reduce + 1
                           (``reduce_inter_local_reduce_remote_send``)
Allreduce                  local reduce, leaders swap, local bcast                   2 + 1
                           (``allreduce_inter_reduce_exchange_bcast``)
Reduce_scatter(_block)     local reduce, leaders swap, local scatter(v) (MPICH's      reduce +
                           ``remote_reduce_local_scatter`` reduces across instead)   1 + scatter
=========================  ========================================================  =====

``IN_PLACE`` is not defined for inter-communicator collectives (MPI-4.1 6.2.2): it is
``ERR_ARG``. Nonblocking and persistent forms and the scans are not offered on
inter-communicators (``NotImplementedError``; the scans are undefined there: ERR_COMM).
"""

from __future__ import annotations

import numpy as np

from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError, CommError
from pycomm.p2p import PROC_NULL

from .collspec import item_array, match_empty, reducible, wregions
from .regions import finish_all
from .exceptions import mpi_error, translate_methods
from .interobj import InterObjects
from .msg import Msg
from .msgspec import as_int, message, vector_message
from .ops import SUM

__all__ = ["InterCollectives", "ROOT", "T_BARRIER"]

ROOT = -3                   # MPI.ROOT
# one tag per collective kind on the link's collective context (module docstring)
(T_BARRIER, T_BCAST, T_GATHER, T_GATHERV, T_SCATTER, T_SCATTERV, T_ALLGATHER,
 T_ALLGATHERV, T_ALLTOALL, T_REDUCE, T_ALLREDUCE, T_RSCATTER) = range(1, 13)


def _swap(link, send: np.ndarray, recv: np.ndarray, tag: int) -> None:
    """The leaders' exchange: send to remote rank 0 while receiving from it."""
    peer = link.remote_in_union(0)
    req = link.coll.Irecv(recv, peer, tag)
    link.coll.Send(send, peer, tag)
    req.Wait()


def _pairwise(link, sblocks: list, rblocks: list, tag: int) -> None:
    """MPICH's pairwise exchange: step i sends block (rank+i) and receives block
    (rank-i) modulo max(L, R); a partner past the remote size is PROC_NULL."""
    m = max(link.size, link.remote_size)
    for i in range(m):
        dst, src = (link.rank + i) % m, (link.rank - i) % m
        req = None
        if src < link.remote_size:
            req = link.coll.Irecv(rblocks[src], link.remote_in_union(src), tag)
        if dst < link.remote_size:
            link.coll.Send(sblocks[dst], link.remote_in_union(dst), tag)
        if req is not None:
            req.Wait()


def _blocks(a: np.ndarray, n: int) -> list[np.ndarray]:
    """``a`` cut into ``n`` equal contiguous blocks."""
    k = a.size // n if n else 0
    return [a[i * k:(i + 1) * k] for i in range(n)]


def _no_in_place(w: str, *bufs) -> None:
    if any(b is IN_PLACE for b in bufs):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: MPI.IN_PLACE is not defined on "
                        "an inter-communicator")


@translate_methods
class InterCollectives(InterObjects):
    """Mixin of ``MPI.Intercomm``: the buffer collectives (see the module docstring);
    ``self._inner(call)`` gives the :class:`~pycomm.MPI.interlink.InterLink`.

    Arguments are mpi4py's (message specs as ``Intracomm``'s; a buffer holding one block
    per process holds one per *remote* process). Every call returns None and raises
    ``MPI.Exception``: ERR_ROOT (a root neither ``ROOT``, ``PROC_NULL`` nor a remote
    rank), ERR_ARG (``IN_PLACE``), ERR_COMM (COMM_NULL, a freed communicator),
    ERR_TRUNCATE (a receive buffer smaller than what the other group sends), ERR_COUNT
    (reduce-scatter counts), besides what the Communicator's calls raise (a dead peer,
    ``PYCOMM_TIMEOUT``); the argument errors before any byte moves.
    """

    __slots__ = ()

    def _role(self, call: str, root) -> tuple:
        """``(link, where, role)``: role ``"root"`` (MPI.ROOT), None (PROC_NULL) or the
        remote root's rank.

        Raises:
            MPI.Exception: ERR_ROOT for any other ``root``.
        """
        link = self._inner(call)
        w = f"rank {link.rank}: {call}"
        root = as_int(root, "root", w)
        if root == ROOT:
            return link, w, "root"
        if root == PROC_NULL:
            return link, w, None
        if not 0 <= root < link.remote_size:
            raise mpi_error(ArgumentError, "ERR_ROOT", f"{w}: root={root} is not MPI.ROOT,"
                            f" MPI.PROC_NULL nor a rank of the remote group (0.."
                            f"{link.remote_size - 1})")
        return link, w, root

    def Barrier(self) -> None:
        """Return once every process of both groups has entered."""
        link = self._inner("Barrier")
        link.local.Barrier()
        if link.rank == 0:
            empty = np.empty(0, np.uint8)
            _swap(link, empty, np.empty(0, np.uint8), T_BARRIER)
        link.local.Barrier()

    def Bcast(self, buf, root: int = 0) -> None:
        """Broadcast the root's ``buf`` to every process of the other group."""
        link, w, role = self._role("Bcast", root)
        if role is None:
            return
        m = message(buf, w, "buf", writable=role != "root")
        if role == "root":
            link.coll.Send(m.array, link.remote_in_union(0), T_BCAST)
            return
        if link.rank == 0:
            link.coll.Recv(m.array, link.remote_in_union(role), T_BCAST)
        link.local.Bcast(m.array, 0)
        m.finish()

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """The root's ``recvbuf`` gets one block from each remote process, in rank order."""
        link, w, role = self._role("Gather", root)
        if role is None:
            return
        if role == "root":
            r = message(recvbuf, w, "recvbuf", writable=True, blocks=link.remote_size)
            link.coll.Recv(r.array, link.remote_in_union(0), T_GATHER)
            r.finish()
            return
        _no_in_place(w, sendbuf)
        s = message(sendbuf, w, "sendbuf", writable=False)
        tmp = np.empty(s.array.size * link.size, s.array.dtype) if link.rank == 0 else None
        link.local.Gather(s.array, tmp, 0)
        if link.rank == 0:
            link.coll.Send(tmp, link.remote_in_union(role), T_GATHER)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Block i of the root's ``sendbuf`` goes to remote process i."""
        link, w, role = self._role("Scatter", root)
        if role is None:
            return
        if role == "root":
            s = message(sendbuf, w, "sendbuf", writable=False, blocks=link.remote_size)
            link.coll.Send(s.array, link.remote_in_union(0), T_SCATTER)
            return
        _no_in_place(w, recvbuf)
        r = message(recvbuf, w, "recvbuf", writable=True)
        tmp = np.empty(r.array.size * link.size, r.array.dtype) if link.rank == 0 else None
        if link.rank == 0:
            link.coll.Recv(tmp, link.remote_in_union(role), T_SCATTER)
        link.local.Scatter(tmp, r.array, 0)
        r.finish()

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """The root's vector ``recvbuf`` gets block i from remote process i."""
        link, w, role = self._role("Gatherv", root)
        if role is None:
            return
        if role != "root":
            _no_in_place(w, sendbuf)
            s = message(sendbuf, w, "sendbuf", writable=False)
            link.coll.Send(s.array, link.remote_in_union(role), T_GATHERV)
            return
        r, counts, displs = vector_message(recvbuf, link.remote_size, w, "recvbuf",
                                           writable=True)
        reqs = [link.coll.Irecv(r.array[d:d + c], link.remote_in_union(i), T_GATHERV)
                for i, (c, d) in enumerate(zip(counts, displs))]
        for req in reqs:
            req.Wait()
        r.finish()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Block i of the root's vector ``sendbuf`` goes to remote process i."""
        link, w, role = self._role("Scatterv", root)
        if role is None:
            return
        if role != "root":
            _no_in_place(w, recvbuf)
            r = message(recvbuf, w, "recvbuf", writable=True)
            link.coll.Recv(r.array, link.remote_in_union(role), T_SCATTERV)
            r.finish()
            return
        s, counts, displs = vector_message(sendbuf, link.remote_size, w, "sendbuf",
                                           writable=False)
        reqs = [link.coll.Isend(s.array[d:d + c], link.remote_in_union(i), T_SCATTERV)
                for i, (c, d) in enumerate(zip(counts, displs))]
        for req in reqs:
            req.Wait()

    def _pair(self, call, sendbuf, recvbuf, *, blocks: str = "r"):
        """``(link, where, send Msg, receive Msg)``; ``blocks``: which buffers hold a
        block per remote process ("r": the receive buffer, "sr": both, "": none)."""
        link = self._inner(call)
        w = f"rank {link.rank}: {call}"
        _no_in_place(w, sendbuf, recvbuf)
        n = link.remote_size
        s = message(sendbuf, w, "sendbuf", writable=False, blocks=n if "s" in blocks else 1)
        r = message(recvbuf, w, "recvbuf", writable=True, blocks=n if "r" in blocks else 1)
        match_empty(s, r)
        return link, w, s, r

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every process gets the remote group's blocks, in their rank order."""
        link, _w, s, r = self._pair("Allgather", sendbuf, recvbuf)
        tmp = np.empty(s.array.size * link.size, s.array.dtype) if link.rank == 0 else None
        link.local.Gather(s.array, tmp, 0)
        if link.rank == 0:
            _swap(link, tmp, r.array, T_ALLGATHER)
        link.local.Bcast(r.array, 0)
        r.finish()

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        """Every process's vector ``recvbuf`` gets block i from remote process i."""
        link = self._inner("Allgatherv")
        w = f"rank {link.rank}: Allgatherv"
        _no_in_place(w, sendbuf, recvbuf)
        s = message(sendbuf, w, "sendbuf", writable=False)
        r, counts, displs = vector_message(recvbuf, link.remote_size, w, "recvbuf",
                                           writable=True)
        packed = np.empty(sum(counts), r.array.dtype)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        out = link.coll.Isend(s.array, link.remote_in_union(0), T_ALLGATHERV)
        if link.rank == 0:
            reqs = [link.coll.Irecv(packed[starts[i]:starts[i + 1]],
                                    link.remote_in_union(i), T_ALLGATHERV)
                    for i in range(link.remote_size)]
            for req in reqs:
                req.Wait()
        out.Wait()
        link.local.Bcast(packed, 0)
        for c, d, b in zip(counts, displs, starts):
            r.array[d:d + c] = packed[b:b + c]
        r.finish()

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block j of ``sendbuf`` goes to remote process j; block i of ``recvbuf`` comes
        from remote process i."""
        link, _w, s, r = self._pair("Alltoall", sendbuf, recvbuf, blocks="sr")
        _pairwise(link, _blocks(s.array, link.remote_size),
                  _blocks(r.array, link.remote_size), T_ALLTOALL)
        r.finish()

    def _pair_v(self, call, sendbuf, recvbuf):
        link = self._inner(call)
        w = f"rank {link.rank}: {call}"
        _no_in_place(w, sendbuf, recvbuf)
        n = link.remote_size
        s, sc, sd = vector_message(sendbuf, n, w, "sendbuf", writable=False)
        r, rc, rd = vector_message(recvbuf, n, w, "recvbuf", writable=True)
        return (link, [s.array[d:d + c] for c, d in zip(sc, sd)],
                [r.array[d:d + c] for c, d in zip(rc, rd)], r)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """Vector block j of ``sendbuf`` goes to remote process j."""
        link, sb, rb, r = self._pair_v("Alltoallv", sendbuf, recvbuf)
        _pairwise(link, sb, rb, T_ALLTOALL)
        r.finish()

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        """All-to-all with a datatype, count and byte displacement per remote process
        (specs as ``Intracomm.Alltoallw``)."""
        link = self._inner("Alltoallw")
        w = f"rank {link.rank}: Alltoallw"
        _no_in_place(w, sendbuf, recvbuf)
        recvs = [b.incoming() for b in wregions(recvbuf, link.remote_size, w, "recvbuf",
                                                True)]
        sends = [b.outgoing() for b in wregions(sendbuf, link.remote_size, w, "sendbuf",
                                                False)]
        _pairwise(link, sends, [data for data, _ in recvs], T_ALLTOALL)
        finish_all(recvs)

    def Reduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> None:
        """The root's ``recvbuf`` gets the reduction (``op``) of the remote group's
        ``sendbuf``s."""
        link, w, role = self._role("Reduce", root)
        if role is None:
            return
        if role == "root":
            r = message(recvbuf, w, "recvbuf", writable=True)
            reducible(w, op, r)
            link.coll.Recv(r.array, link.remote_in_union(0), T_REDUCE)
            r.finish()
            return
        _no_in_place(w, sendbuf)
        s = message(sendbuf, w, "sendbuf", writable=False)
        tmp = self._reduce_local(link, w, s, op)
        if link.rank == 0:
            link.coll.Send(tmp, link.remote_in_union(role), T_REDUCE)

    @staticmethod
    def _reduce_local(link, w, s: Msg, op, r: Msg | None = None) -> np.ndarray | None:
        """Reduce the local group's ``s`` to local rank 0: the result there, else None."""
        op, per = reducible(w, op, s, *([r] if r is not None else []))
        tmp = np.empty_like(s.array) if link.rank == 0 else None
        out = Msg(tmp) if tmp is not None else None
        link.local.Reduce(item_array(s, per), item_array(out, per), op, 0)
        return tmp

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """Every process gets the reduction of the remote group's ``sendbuf``s."""
        link, w, s, r = self._pair("Allreduce", sendbuf, recvbuf, blocks="")
        tmp = self._reduce_local(link, w, s, op, r)
        if link.rank == 0:
            _swap(link, tmp, r.array, T_ALLREDUCE)
        link.local.Bcast(r.array, 0)
        r.finish()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> None:
        """The reduction of the remote group's ``sendbuf``s (``L*n`` items each, the
        same count in both groups) is scattered: local process i gets block i."""
        link, w, s, r = self._pair("Reduce_scatter_block", sendbuf, recvbuf, blocks="")
        if s.array.size != r.array.size * link.size:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"{w}: sendbuf has {s.array.size}"
                            f" items, not local size {link.size} x recvbuf's "
                            f"{r.array.size}")
        got = self._reduce_swap(link, w, s, r, op)
        link.local.Scatter(got, r.array, 0)
        r.finish()

    def _reduce_swap(self, link, w, s, r, op):
        tmp = self._reduce_local(link, w, s, op, r)
        got = np.empty_like(s.array) if link.rank == 0 else None
        if link.rank == 0:
            _swap(link, tmp, got, T_RSCATTER)
        return got

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> None:
        """The reduction of the remote group's ``sendbuf``s (``sum(recvcounts)`` items,
        the same count in both groups) is scattered: local process i gets
        ``recvcounts[i]`` items (None: each process's ``recvbuf`` count)."""
        link, w, s, r = self._pair("Reduce_scatter", sendbuf, recvbuf, blocks="")
        if recvcounts is None:
            counts = link.local.allgather(int(r.array.size))
        else:
            counts = [as_int(x, "recvcounts", w) * r.per for x in recvcounts]
        if len(counts) != link.size or sum(counts) != s.array.size:
            raise mpi_error(ArgumentError, "ERR_COUNT", f"{w}: recvcounts {counts} must "
                            f"be {link.size} counts summing to sendbuf's {s.array.size}")
        got = self._reduce_swap(link, w, s, r, op)
        displs = [int(x) for x in np.concatenate([[0], np.cumsum(counts)[:-1]])]
        link.local.Scatterv([got, counts, displs] if link.rank == 0 else None, r.array, 0)
        r.finish()

    def _undefined(self, call: str):
        self._inner(call)
        raise mpi_error(CommError, "ERR_COMM", f"{call} is not defined on an "
                        "inter-communicator (MPI-4.1 6.11)")

    def Scan(self, sendbuf, recvbuf, op=SUM) -> None:
        self._undefined("Scan")

    def Exscan(self, sendbuf, recvbuf, op=SUM) -> None:
        self._undefined("Exscan")
