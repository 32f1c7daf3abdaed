"""The object (lowercase) collectives of ``MPI.Intercomm``, as mpi4py 4.1.2 runs them on
an inter-communicator (``src/mpi4py/MPI.src/msgpickle.pxi``): the roots and the data
flow of the buffer collectives (:mod:`pycomm.MPI.intercoll`), with pickled objects.

* ``bcast``/``scatter``: the root sends the object (the list) to remote rank 0, which
  broadcasts (scatters) it over its local group (MPICH's
  ``bcast_inter_remote_send_local_bcast``);
* ``gather``: a local gather to rank 0, which sends the list to the root;
* ``reduce``: a local reduce to rank 0, which sends the result to the root (mpi4py's
  ``PyMPI_reduce_inter``);
* ``allgather``/``allreduce``: a local gather (reduce) to rank 0, the leaders swap their
  results, a local broadcast (``PyMPI_allreduce_inter``);
* ``alltoall``: item j goes straight to remote rank j (one message per pair).

The root (``MPI.ROOT``) and ``PROC_NULL`` processes get None back. As in mpi4py, each
holds the communicator's lock named by the call while it runs.
"""

from __future__ import annotations

from pycomm.errors import CommError

from .exceptions import mpi_error, translate_methods
from .objects import comm_lock
from .ops import SUM

__all__ = ["InterObjects"]

# tags of the object collectives on the link's collective context (past intercoll's)
T_OBCAST, T_OGATHER, T_OSCATTER, T_OALLGATHER, T_OALLTOALL, T_OREDUCE, T_OALLREDUCE = \
    range(21, 28)

_NONBLOCKING = ["Ibarrier", "Ibcast", "Igather", "Igatherv", "Iscatter", "Iscatterv",
                "Iallgather", "Iallgatherv", "Ialltoall", "Ialltoallv", "Ialltoallw",
                "Ireduce", "Iallreduce", "Ireduce_scatter", "Ireduce_scatter_block"]
_PERSISTENT = [f"{n[1].upper()}{n[2:]}_init" for n in _NONBLOCKING]


def _not_offered(name: str):
    def method(self, *args, **kwargs):
        self._inner(name)
        raise NotImplementedError(f"Intercomm.{name}: pycomm offers the blocking "
                                  "inter-communicator collectives only")
    method.__name__ = name
    return method


@translate_methods
class InterObjects:
    """Mixin of ``MPI.Intercomm``: the object collectives (module docstring). Needs
    ``self._role(call, root)`` (:class:`pycomm.MPI.intercoll.InterCollectives`)."""

    __slots__ = ()

    def barrier(self) -> None:
        """As ``Barrier``."""
        self.Barrier()

    def bcast(self, obj=None, root: int = 0):
        """The root's object, returned on every remote process (None in the root's
        group)."""
        link, _w, role = self._role("bcast", root)
        if role is None:
            return None
        with comm_lock(self, "bcast"):
            if role == "root":
                link.coll.send(obj, link.remote_in_union(0), T_OBCAST)
                return None
            if link.rank == 0:
                obj = link.coll.recv(None, link.remote_in_union(role), T_OBCAST)
            return link.local.bcast(obj, 0)

    def gather(self, sendobj, root: int = 0):
        """The root gets the list of the remote processes' objects; others None."""
        link, _w, role = self._role("gather", root)
        if role is None:
            return None
        with comm_lock(self, "gather"):
            if role == "root":
                return link.coll.recv(None, link.remote_in_union(0), T_OGATHER)
            objs = link.local.gather(sendobj, 0)
            if link.rank == 0:
                link.coll.send(objs, link.remote_in_union(role), T_OGATHER)
            return None

    def scatter(self, sendobj=None, root: int = 0):
        """Remote process i gets item i of the root's ``sendobj`` (None: remote-size
        Nones); the root's group gets None.

        Raises:
            ValueError: the root's ``sendobj`` does not hold remote-size items.
        """
        link, w, role = self._role("scatter", root)
        if role is None:
            return None
        with comm_lock(self, "scatter"):
            if role == "root":
                objs = [None] * link.remote_size if sendobj is None else list(sendobj)
                if len(objs) != link.remote_size:
                    raise ValueError(f"{w}: expecting {link.remote_size} items, got "
                                     f"{len(objs)}")
                link.coll.send(objs, link.remote_in_union(0), T_OSCATTER)
                return None
            objs = None
            if link.rank == 0:
                objs = link.coll.recv(None, link.remote_in_union(role), T_OSCATTER)
            return link.local.scatter(objs, 0)

    def allgather(self, sendobj):
        """The list of the remote processes' objects, on every process."""
        link = self._inner("allgather")
        with comm_lock(self, "allgather"):
            objs = link.local.gather(sendobj, 0)
            if link.rank == 0:
                objs = link.coll.sendrecv(objs, link.remote_in_union(0), T_OALLGATHER,
                                          None, link.remote_in_union(0), T_OALLGATHER)
            return link.local.bcast(objs, 0)

    def alltoall(self, sendobj):
        """Item j of ``sendobj`` (remote-size items; None: Nones) goes to remote process
        j; returns the items received, in remote rank order.

        Raises:
            ValueError: ``sendobj`` does not hold remote-size items.
        """
        link = self._inner("alltoall")
        n = link.remote_size
        objs = [None] * n if sendobj is None else list(sendobj)
        if len(objs) != n:
            raise ValueError(f"rank {link.rank}: alltoall: expecting {n} items, got "
                             f"{len(objs)}")
        with comm_lock(self, "alltoall"):
            reqs = [link.coll.isend(obj, link.remote_in_union(j), T_OALLTOALL)
                    for j, obj in enumerate(objs)]
            out = [link.coll.recv(None, link.remote_in_union(i), T_OALLTOALL)
                   for i in range(n)]
            for req in reqs:
                req.wait()
        return out

    def reduce(self, sendobj, op=SUM, root: int = 0):
        """The root gets the reduction (``op``) of the remote processes' objects."""
        link, _w, role = self._role("reduce", root)
        if role is None:
            return None
        if role == "root":
            return link.coll.recv(None, link.remote_in_union(0), T_OREDUCE)
        value = link.local.reduce(sendobj, op, 0)
        if link.rank == 0:
            link.coll.send(value, link.remote_in_union(role), T_OREDUCE)
        return None

    def allreduce(self, sendobj, op=SUM):
        """The reduction of the remote processes' objects, on every process."""
        link = self._inner("allreduce")
        value = link.local.reduce(sendobj, op, 0)
        if link.rank == 0:
            value = link.coll.sendrecv(value, link.remote_in_union(0), T_OALLREDUCE, None,
                                       link.remote_in_union(0), T_OALLREDUCE)
        return link.local.bcast(value, 0)

    def scan(self, sendobj, op=SUM):
        self._inner("scan")
        raise mpi_error(CommError, "ERR_COMM", "scan is not defined on an "
                        "inter-communicator")

    def exscan(self, sendobj, op=SUM):
        self._inner("exscan")
        raise mpi_error(CommError, "ERR_COMM", "exscan is not defined on an "
                        "inter-communicator")


for _name in _NONBLOCKING + _PERSISTENT:        # set after translate_methods: they raise
    setattr(InterObjects, _name, _not_offered(_name))   # NotImplementedError only
