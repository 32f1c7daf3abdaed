"""What an ``MPI.Intercomm`` wraps: :class:`InterLink`, two groups joined by four ordinary
pycomm Communicators (MPI-4.1 section 7.6).

An inter-communicator joins a local group A and a disjoint remote group B; a rank names
the other group's processes, and point-to-point messages only cross between the groups.
pycomm's Communicator is an intra-communicator, so the link is built from intra ones over
the union, ordered so that each side's ranks already are what MPI promises:

* ``union``: A and B in the *canonical* order, the low group first (the group holding
  the lower world rank; MPICH's ``is_low_group`` plays the same part);
* ``flipped``: the same processes, the high group first (a Split of ``union``);
* ``local``: the local group alone (a Split of ``union``), for the local halves of the
  collectives;
* ``coll``: a Dup of ``union``, the context of the inter-communicator collectives'
  messages (:mod:`pycomm.MPI.intercoll`), apart from the user's point-to-point traffic.

A process sends on the communicator where its own group comes first (``_out``: remote
rank r is ``local size + r`` there) and receives on the one where the remote group comes
first (``_in``). One side's ``_out`` is the other's ``_in``, so a receive's source, and
the source in its status, is the remote rank itself, ``ANY_SOURCE`` can only match the
remote group (the local group never sends there), and probes and matched probes work
unchanged. An ``InterLink`` offers the Communicator's point-to-point methods (buffer and
object forms) with that mapping and checks ranks against the remote group first; the
façade (:mod:`pycomm.MPI.commp2p`, :mod:`pycomm.MPI.objects`) calls them as it calls a
Communicator's.
"""

from __future__ import annotations

import zlib

from pycomm.errors import ArgumentError, CommError
from pycomm.groups import CONGRUENT, IDENT, SIMILAR, UNEQUAL, Group
from pycomm.p2p import ANY_SOURCE, ANY_TAG, PROC_NULL

from .exceptions import mpi_error

__all__ = ["InterLink", "is_inter", "link_over_world", "setup_tag"]


# the Communicator's object collectives (a plain Comm handle would call them here)
_INTRA_OBJECT_CALLS = frozenset(["barrier", "bcast", "gather", "scatter", "allgather",
                                 "alltoall", "reduce", "allreduce", "scan", "exscan"])


def is_inter(inner) -> bool:
    """Whether ``inner`` (what a façade communicator wraps) is an inter-communicator."""
    return isinstance(inner, InterLink)


def setup_tag(*parts) -> int:
    """A ``Create_group`` tag (0..2**24-1) that the members of one construction agree on
    (a hash of what they all know), so that concurrent constructions by other processes
    use other tags (MPI asks distinct tags of concurrent ``MPI_Comm_create_group`` calls
    by overlapping groups)."""
    return zlib.crc32(repr(parts).encode()) & 0xFFFFFF


def link_over_world(low_world: list[int], high_world: list[int], low: bool, tag: int,
                    name: str) -> InterLink:
    """Join two disjoint groups (world ranks) into an :class:`InterLink`.

    Collective over both groups (``Create_group`` over COMM_WORLD, then the Splits and
    the Dup of :class:`InterLink`); ``low``: this process is in ``low_world``.
    """
    from . import COMM_WORLD
    world = COMM_WORLD._inner("Create_intercomm")
    union = world.Create_group(Group(low_world + high_world, world.rank), tag)
    return InterLink(union, len(low_world), low, name)


class InterLink:
    """Two groups joined as an inter-communicator (see the module docstring).

    Args:
        union: a Communicator of both groups, the low group's ranks first.
        nlow: the low group's size.
        low: whether this process is in the low group.
        name: the inter-communicator's name.

    Collective over ``union`` (two Splits and a Dup).
    """

    is_inter = True

    def __init__(self, union, nlow: int, low: bool, name: str):
        nhigh = union.size - nlow
        self.union, self.nlow, self.low, self.name = union, nlow, low, name
        self.size = nlow if low else nhigh
        self.remote_size = union.size - self.size
        self._base = 0 if low else nlow             # my group's first rank in union
        self._rbase = nlow if low else 0            # the remote group's
        self.rank = union.rank - self._base
        flipped = union.Split(0, union.rank + nhigh if low else union.rank - nlow)
        self._out, self._in = (union, flipped) if low else (flipped, union)
        self.local = union.Split(0 if low else 1, self.rank)
        self.coll = union.Dup()
        self._freed = False

    # -- what the façade reads --------------------------------------------------------
    @property
    def _engine(self):
        return self.union._engine

    def world_ranks(self, remote: bool = False) -> list[int]:
        """The world ranks of the local (or remote) group, in group rank order."""
        g = self.union.Get_group()._world
        lo, hi = g[:self.nlow], g[self.nlow:]
        return (hi if self.low else lo) if remote else (lo if self.low else hi)

    def Get_group(self) -> Group:
        """The local group."""
        return self.local.Get_group()

    def Get_remote_group(self) -> Group:
        """The remote group (this process is not in it: its rank is UNDEFINED)."""
        return Group(self.world_ranks(remote=True), self.union.Get_group()._world[
            self.union.rank])

    def remote_in_union(self, r: int) -> int:
        """The rank in ``union`` (and ``coll``) of remote rank ``r``."""
        return self._rbase + r

    def Compare(self, other) -> int:
        """MPI_Comm_compare of two inter-communicators: IDENT (the same), CONGRUENT
        (local and remote groups identical), SIMILAR (the same members), UNEQUAL (or
        ``other`` is an intra-communicator)."""
        if other is self:
            return IDENT
        if not isinstance(other, InterLink):
            return UNEQUAL
        worst = IDENT
        for remote in (False, True):
            mine = Group(self.world_ranks(remote), -1)
            theirs = Group(other.world_ranks(remote), -1)
            worst = max(worst, mine.Compare(theirs))
        return CONGRUENT if worst == IDENT else (SIMILAR if worst == SIMILAR else UNEQUAL)

    def Dup(self) -> InterLink:
        """A new link of the same groups (collective over both: a Dup of the union)."""
        self._check_alive("Dup")
        return InterLink(self.union.Dup(), self.nlow, self.low, self.name + ".Dup")

    def Free(self) -> None:
        """Release the four communicators (local: nothing is sent)."""
        for c in {id(c): c for c in (self.union, self._out, self._in, self.local,
                                      self.coll)}.values():
            c.Free()
        self._freed = True

    def Abort(self, errorcode: int = 1) -> None:
        self.union.Abort(errorcode)

    def __getattr__(self, name: str):
        """A Communicator call the link does not offer (an intra-communicator's, reached
        through a plain ``Comm`` handle: ``MPI.Comm(intercomm).Bcast``...): ERR_COMM
        naming it, rather than an AttributeError from inside the façade."""
        if name[:1].isupper() or name in _INTRA_OBJECT_CALLS:
            raise mpi_error(CommError, "ERR_COMM", f"{name}: not offered on an "
                            "inter-communicator (a plain MPI.Comm handle of one reaches "
                            "only the point-to-point calls and queries)")
        raise AttributeError(name)

    # -- rank checks ------------------------------------------------------------------
    def _check_alive(self, call: str) -> None:
        if self._freed:
            raise mpi_error(CommError, "ERR_COMM", f"rank {self.rank}: {call}: "
                            f"{self.name} has been freed")

    def _dest(self, dest, call: str) -> int:
        """``dest`` (a remote rank or PROC_NULL) as a rank of ``_out``."""
        self._check_alive(call)
        if dest == PROC_NULL:
            return PROC_NULL
        if not isinstance(dest, int) or not 0 <= dest < self.remote_size:
            raise mpi_error(ArgumentError, "ERR_RANK", f"rank {self.rank}: {call}: "
                            f"dest={dest!r} is not a rank of the remote group (0.."
                            f"{self.remote_size - 1}) nor PROC_NULL")
        return self.size + dest

    def _source(self, source, call: str) -> int:
        """``source`` (a remote rank, ANY_SOURCE or PROC_NULL): the same rank of ``_in``."""
        self._check_alive(call)
        if source in (ANY_SOURCE, PROC_NULL):
            return source
        if not isinstance(source, int) or not 0 <= source < self.remote_size:
            raise mpi_error(ArgumentError, "ERR_RANK", f"rank {self.rank}: {call}: "
                            f"source={source!r} is not a rank of the remote group (0.."
                            f"{self.remote_size - 1}), ANY_SOURCE nor PROC_NULL")
        return source

    # -- point-to-point, buffers ------------------------------------------------------
    def Send(self, buf, dest: int, tag: int = 0, **kw):
        return self._out.Send(buf, self._dest(dest, "Send"), tag, **kw)

    def Ssend(self, buf, dest: int, tag: int = 0, **kw):
        return self._out.Ssend(buf, self._dest(dest, "Ssend"), tag, **kw)

    def Isend(self, buf, dest: int, tag: int = 0, **kw):
        return self._out.Isend(buf, self._dest(dest, "Isend"), tag, **kw)

    def Issend(self, buf, dest: int, tag: int = 0):
        return self._out.Issend(buf, self._dest(dest, "Issend"), tag)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None, **kw):
        return self._in.Recv(buf, self._source(source, "Recv"), tag, status, **kw)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        return self._in.Irecv(buf, self._source(source, "Irecv"), tag)

    def Irecv_alloc(self, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        return self._in.Irecv_alloc(self._source(source, "Irecv_alloc"), tag)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None):
        """Post the receive (from the remote group), send, then wait for the receive."""
        req = self._in.Irecv(recvbuf, self._source(source, "Sendrecv"), recvtag)
        self._out.Send(sendbuf, self._dest(dest, "Sendrecv"), sendtag)
        req.Wait(status)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        return self._in.Probe(self._source(source, "Probe"), tag, status)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        return self._in.Iprobe(self._source(source, "Iprobe"), tag, status)

    # -- point-to-point, objects ------------------------------------------------------
    def send(self, obj, dest: int, tag: int = 0, **kw):
        return self._out.send(obj, self._dest(dest, "send"), tag, **kw)

    def ssend(self, obj, dest: int, tag: int = 0, **kw):
        return self._out.ssend(obj, self._dest(dest, "ssend"), tag, **kw)

    def isend(self, obj, dest: int, tag: int = 0, **kw):
        return self._out.isend(obj, self._dest(dest, "isend"), tag, **kw)

    def issend(self, obj, dest: int, tag: int = 0):
        return self._out.issend(obj, self._dest(dest, "issend"), tag)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None, **kw):
        return self._in.recv(buf, self._source(source, "recv"), tag, status, **kw)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        return self._in.irecv(buf, self._source(source, "irecv"), tag)

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None):
        """Post the object receive, send, then wait for and return the object."""
        req = self._in.irecv(None, self._source(source, "sendrecv"), recvtag)
        self._out.send(sendobj, self._dest(dest, "sendrecv"), sendtag)
        return req.wait(status)
