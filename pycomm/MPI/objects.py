"""mpi4py's lowercase (object) methods of ``MPI.Comm``, delegating to the Communicator's
own object API (:mod:`pycomm.objects`: pickle, cloudpickle as fallback) after turning
integral-float ranks and tags into ints.

As mpi4py, the object collectives hold a per-communicator lock named by the call
(``"bcast"``, ``"gather"``, ...) while they run, so that threads sharing a communicator
do not interleave them; ``MPI._comm_lock(comm, key)`` and ``MPI._comm_lock_table(comm)``
give the locks (mpi4py's internal API, which its test suite and some libraries use).
"""

from __future__ import annotations

import threading
import warnings
import weakref

from pycomm.p2p import ANY_SOURCE, ANY_TAG

from .exceptions import translate_methods
from .msgspec import as_int
from .ops import SUM
from .request import Request

__all__ = ["ObjectMethods", "comm_lock", "comm_lock_table"]

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # Communicator -> dict
_LOCKS_LOCK = threading.Lock()


def comm_lock_table(comm) -> dict:
    """The communicator's lock table: call name -> ``threading.Lock`` (made on first
    use of each call). Raises ``MPI.Exception`` (ERR_COMM) for COMM_NULL."""
    inner = comm._inner("_comm_lock_table")
    table = _LOCKS.get(inner)       # (a get is atomic: the lock only guards making one)
    if table is None:
        with _LOCKS_LOCK:
            table = _LOCKS.setdefault(inner, {})
    return table


def comm_lock(comm, key=None) -> threading.Lock:
    """The lock named ``key`` of the communicator (made on first use)."""
    table = comm_lock_table(comm)
    lock = table.get(key)
    if lock is None:
        with _LOCKS_LOCK:
            lock = table.setdefault(key, threading.Lock())
    return lock


@translate_methods
class ObjectMethods:
    """Mixin of :class:`pycomm.MPI.comm.Comm`: ``send``, ``recv``, ``bcast``, ..."""

    __slots__ = ()

    # -- point-to-point, objects ----------------------------------------------------------
    def send(self, obj, dest: int, tag: int = 0) -> None:
        """Send a picklable object."""
        self._inner("send").send(obj, as_int(dest, "dest", "send"), as_int(tag, "tag", "send"))

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        """Send a picklable object synchronously: returns once ``dest`` has started the
        matching receive."""
        self._inner("ssend").ssend(obj, as_int(dest, "dest", "ssend"),
                                   as_int(tag, "tag", "ssend"))

    bsend = send

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Receive and return an object. ``buf`` is deprecated in mpi4py (a UserWarning)
        and ignored: the receive is sized to the message."""
        if buf is not None:
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=3)
        return self._inner("recv").recv(buf, as_int(source, "source", "recv"),
                                        as_int(tag, "tag", "recv"), status)

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        """Start sending an object; ``wait()`` returns None."""
        return Request._wrap(self._inner("isend").isend(obj, as_int(dest, "dest", "isend"),
                                                        as_int(tag, "tag", "isend")))

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        """Start a synchronous object send; completes once the receive has started."""
        return Request._wrap(self._inner("issend").issend(obj, as_int(dest, "dest", "issend"),
                                                          as_int(tag, "tag", "issend")))

    ibsend = isend

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post an object receive; ``wait()`` returns the object."""
        return Request._wrap(self._inner("irecv").irecv(
            buf, as_int(source, "source", "irecv"), as_int(tag, "tag", "irecv")))

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None):
        """Send an object and receive one; returns the received object."""
        w = "sendrecv"
        return self._inner(w).sendrecv(sendobj, as_int(dest, "dest", w),
                                       as_int(sendtag, "sendtag", w), recvbuf,
                                       as_int(source, "source", w),
                                       as_int(recvtag, "recvtag", w), status)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        return self.Iprobe(source, tag, status)

    # -- collectives, objects -------------------------------------------------------------
    def barrier(self) -> None:
        self._inner("barrier").barrier()

    def bcast(self, obj=None, root: int = 0):
        with comm_lock(self, "bcast"):
            return self._inner("bcast").bcast(obj, as_int(root, "root", "bcast"))

    def gather(self, sendobj, root: int = 0):
        with comm_lock(self, "gather"):
            return self._inner("gather").gather(sendobj, as_int(root, "root", "gather"))

    def scatter(self, sendobj=None, root: int = 0):
        """Scatter the items of ``sendobj`` (a sequence of ``size`` objects, or None:
        ``size`` Nones, as in mpi4py) from ``root``; returns this rank's item."""
        c, root = self._inner("scatter"), as_int(root, "root", "scatter")
        if sendobj is None and c.rank == root:
            sendobj = [None] * c.size
        with comm_lock(self, "scatter"):
            return c.scatter(sendobj, root)

    def allgather(self, sendobj):
        with comm_lock(self, "allgather"):
            return self._inner("allgather").allgather(sendobj)

    def alltoall(self, sendobj):
        """Send item i of ``sendobj`` (``size`` objects, or None: ``size`` Nones, as in
        mpi4py) to rank i; returns the list of the items received."""
        c = self._inner("alltoall")
        with comm_lock(self, "alltoall"):
            return c.alltoall([None] * c.size if sendobj is None else sendobj)

    def reduce(self, sendobj, op=SUM, root: int = 0):
        return self._inner("reduce").reduce(sendobj, op, as_int(root, "root", "reduce"))

    def allreduce(self, sendobj, op=SUM):
        return self._inner("allreduce").allreduce(sendobj, op)

    def scan(self, sendobj, op=SUM):
        return self._inner("scan").scan(sendobj, op)

    def exscan(self, sendobj, op=SUM):
        return self._inner("exscan").exscan(sendobj, op)
