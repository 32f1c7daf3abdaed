"""``MPI.Comm`` / ``MPI.Intracomm``: mpi4py's communicator methods over a pycomm Communicator.

Each method turns its mpi4py arguments into what :class:`pycomm.comm.Communicator` takes
(message specs become typed contiguous arrays, :mod:`pycomm.MPI.msgspec`; integral-float
ranks and tags become ints) and calls the Communicator's public method of the same name;
no collective logic lives here. A receive into a non-contiguous datatype is unpacked when
the call (or its request) completes. Errors leave as ``MPI.Exception`` subclasses that
keep their pycomm class (:mod:`pycomm.MPI.exceptions`).

Topologies (``Create_cart``, :class:`Cartcomm`) live in :mod:`pycomm.MPI.topo`.
"""

from __future__ import annotations

from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError, CommError
from pycomm.groups import COMM_NULL as _COMM_NULL, UNDEFINED
from pycomm.ops import SUM
from pycomm.p2p import ANY_SOURCE, ANY_TAG

from .exceptions import ERRORS, mpi_error, translate_methods
from .msgspec import Msg, as_int, message, vector_message
from .request import Prequest, Request, Status

__all__ = ["Comm", "Intracomm", "BufferPool", "BSEND"]

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
KEYVAL_TAG_UB, KEYVAL_HOST, KEYVAL_IO, KEYVAL_WTIME_IS_GLOBAL = 0, 1, 2, 3
KEYVAL_UNIVERSE_SIZE, KEYVAL_APPNUM, KEYVAL_LASTUSEDCODE = 4, 5, 6


class BufferPool:
    """The buffer attached for ``Bsend`` (``MPI.Attach_buffer``): pending buffered sends
    hold private copies of their data; ``Detach_buffer`` waits for them."""

    def __init__(self) -> None:
        self.buffer = None
        self.pending: list = []

    def add(self, request) -> None:
        self.pending = [r for r in self.pending if not r.done]
        self.pending.append(request)

    def drain(self) -> None:
        if self.pending:
            self.pending[0].engine.wait_all(self.pending)
        self.pending = []


BSEND = BufferPool()


def _fin(*msgs: Msg):
    """The completion action of a call whose receive side was packed (None if none)."""
    todo = [m for m in msgs if m is not None and m._unpack is not None]
    if not todo:
        return None
    return lambda: [m.finish() for m in todo] and None


@translate_methods
class Comm:
    """A communicator (mpi4py's ``MPI.Comm``), wrapping a :class:`pycomm.Communicator`.

    ``Comm()`` is ``COMM_NULL``. Uppercase methods move buffers, lowercase ones objects,
    with mpi4py's signatures; ``comm.rank``/``comm.size`` as in mpi4py.
    """

    __slots__ = ("_c", "_name", "_attrs", "_errhandler", "__weakref__")

    def __init__(self, comm: "Comm | None" = None):
        self._c = comm._c if isinstance(comm, Comm) else None
        self._name = None
        self._attrs: dict = {}
        self._errhandler = None

    @classmethod
    def _wrap(cls, inner) -> "Comm":
        if inner is None or inner is _COMM_NULL:
            from . import COMM_NULL
            return COMM_NULL
        out = cls.__new__(cls)
        out._c, out._name, out._attrs, out._errhandler = inner, None, {}, None
        return out

    def _inner(self, call: str):
        c = self._c
        if c is None:
            raise mpi_error(CommError, "ERR_COMM", f"{call}: the communicator is COMM_NULL")
        return c

    def __eq__(self, other) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self._c is other._c

    def __hash__(self) -> int:
        return id(self._c)

    def __bool__(self) -> bool:
        return self._c is not None

    def __repr__(self) -> str:
        if self._c is None:
            return "<MPI.COMM_NULL>"
        return f"<MPI.{type(self).__name__} {self.Get_name()}: rank {self.rank} of {self.size}>"

    # -- basics ---------------------------------------------------------------------------
    def Get_rank(self) -> int:
        """This process's rank (0..size-1)."""
        return self._inner("Get_rank").rank

    def Get_size(self) -> int:
        """Number of processes."""
        return self._inner("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self) -> str:
        """The communicator's name (``"MPI_COMM_WORLD"``, ...)."""
        if self._name is not None:
            return self._name
        return self._inner("Get_name").name

    def Set_name(self, name: str) -> None:
        self._name = str(name)

    name = property(Get_name, Set_name)

    def Get_group(self):
        """The group of the communicator (``MPI.Group``)."""
        from .groups import Group
        return Group._of(self._inner("Get_group").Get_group())

    group = property(Get_group)

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self) -> int:
        """``UNDEFINED`` (no topology); ``CART`` for a :class:`Cartcomm`."""
        return UNDEFINED

    topology = property(lambda self: self.Get_topology())

    def Compare(self, comm: "Comm") -> int:
        """IDENT (same handle), CONGRUENT (same group, other context), SIMILAR, UNEQUAL."""
        if self._c is comm._c:
            return IDENT
        return self._inner("Compare").Compare(comm._inner("Compare"))

    def Get_attr(self, keyval: int):
        """Predefined attributes: ``TAG_UB``, ``HOST``, ``IO``, ``WTIME_IS_GLOBAL``,
        ``UNIVERSE_SIZE``, ``APPNUM``, ``LASTUSEDCODE``; user keys set by Set_attr."""
        from pycomm.comm import TAG_UB
        fixed = {KEYVAL_TAG_UB: TAG_UB, KEYVAL_HOST: -1, KEYVAL_IO: ANY_SOURCE,
                 KEYVAL_WTIME_IS_GLOBAL: False, KEYVAL_APPNUM: None,
                 KEYVAL_LASTUSEDCODE: ERRORS["ERR_LASTCODE"]}
        if keyval == KEYVAL_UNIVERSE_SIZE:
            return self.Get_size()
        if keyval in fixed:
            return fixed[keyval]
        return self._attrs.get(keyval)

    def Set_attr(self, keyval: int, attrval) -> None:
        self._attrs[keyval] = attrval

    def Delete_attr(self, keyval: int) -> None:
        self._attrs.pop(keyval, None)

    def Get_errhandler(self):
        from . import ERRORS_ARE_FATAL
        return self._errhandler or ERRORS_ARE_FATAL

    def Set_errhandler(self, errhandler) -> None:
        """Errors are always raised as ``MPI.Exception`` (mpi4py's default handler)."""
        self._errhandler = errhandler

    def Abort(self, errorcode: int = 0) -> None:
        """Terminate this process with ``errorcode``; the launcher stops the others."""
        self._inner("Abort").Abort(as_int(errorcode, "errorcode", "Abort"))

    # -- communicator management ----------------------------------------------------------
    def Dup(self, info=None) -> "Comm":
        """A new communicator with the same group and a fresh context (collective)."""
        return type(self)._wrap(self._inner("Dup").Dup())

    Clone = Dup

    def Dup_with_info(self, info) -> "Comm":
        return self.Dup()

    def Free(self) -> None:
        """Release the communicator; the handle becomes ``COMM_NULL``."""
        self._inner("Free").Free()
        self._c = None

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        """Partition by ``color`` (``UNDEFINED``: get COMM_NULL), order by ``key``."""
        w = f"rank {self.rank}: Split"
        return Intracomm._wrap(self._inner("Split").Split(as_int(color, "color", w),
                                                          as_int(key, "key", w)))

    def Create(self, group) -> "Comm":
        """The communicator of ``group`` (collective over this one; others get NULL)."""
        return Intracomm._wrap(self._inner("Create").Create(group._g))

    def Create_group(self, group, tag: int = 0) -> "Comm":
        """The communicator of ``group``, collective over the group's members only."""
        return Intracomm._wrap(self._inner("Create_group").Create_group(
            group._g, as_int(tag, "tag", "Create_group")))

    # -- point-to-point, buffers ----------------------------------------------------------
    def _where(self, call: str) -> str:
        return f"rank {self.rank}: {call}"

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking standard send of the message ``buf`` (any mpi4py message spec)."""
        c = self._inner("Send")
        m = message(buf, f"rank {c.rank}: Send", "buf", writable=False)
        c.Send(m.array, as_int(dest, "dest", "Send"), as_int(tag, "tag", "Send"))

    Ssend = Send
    Rsend = Send

    def Bsend(self, buf, dest: int, tag: int = 0) -> None:
        """Buffered send: returns at once; a private copy of the data travels."""
        self.Ibsend(buf, dest, tag)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> None:
        """Blocking receive into the message ``buf``; fills ``status``."""
        c = self._inner("Recv")
        m = message(buf, f"rank {c.rank}: Recv", "buf", writable=True)
        c.Recv(m.array, as_int(source, "source", "Recv"), as_int(tag, "tag", "Recv"),
               status)
        m.finish()

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a standard send; ``buf`` must stay untouched until the request completes."""
        c = self._inner("Isend")
        m = message(buf, f"rank {c.rank}: Isend", "buf", writable=False)
        return Request._wrap(c.Isend(m.array, as_int(dest, "dest", "Isend"),
                                     as_int(tag, "tag", "Isend")))

    Issend = Isend
    Irsend = Isend

    def Ibsend(self, buf, dest: int, tag: int = 0) -> Request:
        """Buffered nonblocking send of a private copy (complete at once for the caller)."""
        c = self._inner("Ibsend")
        m = message(buf, f"rank {c.rank}: Ibsend", "buf", writable=False)
        inner = c.Isend(m.array.copy(), as_int(dest, "dest", "Ibsend"),
                        as_int(tag, "tag", "Ibsend"))
        BSEND.add(inner)
        return Request()

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive into ``buf``; valid after the request completes."""
        c = self._inner("Irecv")
        m = message(buf, f"rank {c.rank}: Irecv", "buf", writable=True)
        return Request._wrap(c.Irecv(m.array, as_int(source, "source", "Irecv"),
                                     as_int(tag, "tag", "Irecv")), _fin(m))

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving into ``recvbuf`` from ``source``."""
        c = self._inner("Sendrecv")
        w = f"rank {c.rank}: Sendrecv"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True)
        c.Sendrecv(s.array, as_int(dest, "dest", w), as_int(sendtag, "sendtag", w),
                   r.array, as_int(source, "source", w), as_int(recvtag, "recvtag", w),
                   status)
        r.finish()

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0,
                         source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                         status: Status | None = None) -> None:
        """Send ``buf`` and receive into it (the outgoing data is copied first)."""
        c = self._inner("Sendrecv_replace")
        w = f"rank {c.rank}: Sendrecv_replace"
        r = message(buf, w, "buf", writable=True)
        c.Sendrecv(r.array.copy(), as_int(dest, "dest", w), as_int(sendtag, "sendtag", w),
                   r.array, as_int(source, "source", w), as_int(recvtag, "recvtag", w),
                   status)
        r.finish()

    def Send_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each ``Start()`` sends ``buf``'s current contents."""
        return self._persistent("Send_init", self.Isend, buf, dest, tag)

    Ssend_init = Send_init
    Bsend_init = Send_init
    Rsend_init = Send_init

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """A persistent receive into ``buf``."""
        return self._persistent("Recv_init", self.Irecv, buf, source, tag)

    def _persistent(self, call, post, buf, peer, tag) -> Prequest:
        w = f"rank {self._inner(call).rank}: {call}"
        message(buf, w, "buf", writable=post == self.Irecv)     # checked now, once
        peer, tag = as_int(peer, "peer", w), as_int(tag, "tag", w)

        def start():
            r = post(buf, peer, tag)
            return r._r, r._finish
        return Prequest._persistent(start)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None) -> bool:
        """Block until a matching message is there; fills ``status``. Returns True."""
        return self._inner("Probe").Probe(as_int(source, "source", "Probe"),
                                          as_int(tag, "tag", "Probe"), status)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> bool:
        """Whether a matching message is there (fills ``status`` if so)."""
        return self._inner("Iprobe").Iprobe(as_int(source, "source", "Iprobe"),
                                            as_int(tag, "tag", "Iprobe"), status)

    # -- point-to-point, objects ----------------------------------------------------------
    def send(self, obj, dest: int, tag: int = 0) -> None:
        """Send a picklable object."""
        self._inner("send").send(obj, as_int(dest, "dest", "send"), as_int(tag, "tag", "send"))

    ssend = send
    bsend = send

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Receive and return an object."""
        return self._inner("recv").recv(buf, as_int(source, "source", "recv"),
                                        as_int(tag, "tag", "recv"), status)

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        """Start sending an object; ``wait()`` returns None."""
        return Request._wrap(self._inner("isend").isend(obj, as_int(dest, "dest", "isend"),
                                                        as_int(tag, "tag", "isend")))

    issend = isend
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
        return self._inner("bcast").bcast(obj, as_int(root, "root", "bcast"))

    def gather(self, sendobj, root: int = 0):
        return self._inner("gather").gather(sendobj, as_int(root, "root", "gather"))

    def scatter(self, sendobj=None, root: int = 0):
        return self._inner("scatter").scatter(sendobj, as_int(root, "root", "scatter"))

    def allgather(self, sendobj):
        return self._inner("allgather").allgather(sendobj)

    def alltoall(self, sendobj):
        return self._inner("alltoall").alltoall(sendobj)

    def reduce(self, sendobj, op=SUM, root: int = 0):
        return self._inner("reduce").reduce(sendobj, op, as_int(root, "root", "reduce"))

    def allreduce(self, sendobj, op=SUM):
        return self._inner("allreduce").allreduce(sendobj, op)

    def scan(self, sendobj, op=SUM):
        return self._inner("scan").scan(sendobj, op)

    def exscan(self, sendobj, op=SUM):
        return self._inner("exscan").exscan(sendobj, op)


def _reducible(where: str, op, *msgs) -> None:
    """Reject a reduction over a mixed-type datatype (it travels as bytes)."""
    for m in msgs:
        if isinstance(m, Msg) and not m.reducible:
            raise mpi_error(ArgumentError, "ERR_TYPE", f"{where}: a datatype of mixed "
                            f"basic types cannot be reduced with {op}")


@translate_methods
class Intracomm(Comm):
    """An intra-communicator (mpi4py's ``MPI.Intracomm``): the buffer collectives."""

    __slots__ = ()

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
        return c, w, s, r

    @staticmethod
    def _a(m):
        return m if m is IN_PLACE or m is None else m.array

    def Barrier(self) -> None:
        """Block until every rank has entered."""
        self._inner("Barrier").Barrier()

    def Bcast(self, buf, root: int = 0) -> None:
        """Broadcast root's message ``buf`` to every rank's ``buf``."""
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
        return self._reduce("Reduce", sendbuf, recvbuf, op, root)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> Request:
        return self._reduce("Ireduce", sendbuf, recvbuf, op, root)

    def _reduce(self, call, sendbuf, recvbuf, op, root):
        c = self._inner(call)
        root = as_int(root, "root", f"rank {c.rank}: {call}")
        at_root = c.rank == root
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf, recv=at_root)
        _reducible(w, op, s, r)
        fn = c.Ireduce if call[0] == "I" else c.Reduce
        return self._done(call[0] == "I", fn(self._a(s), self._a(r), op, root), r)

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """Combine every rank's ``sendbuf`` with ``op``; every ``recvbuf`` gets it."""
        return self._reduce_all("Allreduce", sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iallreduce", sendbuf, recvbuf, op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> None:
        """Reduce ``size*n`` items; rank i gets block i (``n`` items)."""
        return self._reduce_all("Reduce_scatter_block", sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Ireduce_scatter_block", sendbuf, recvbuf, op)

    def Scan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Inclusive prefix reduction in rank order."""
        return self._reduce_all("Scan", sendbuf, recvbuf, op)

    def Iscan(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iscan", sendbuf, recvbuf, op)

    def Exscan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Exclusive prefix reduction; rank 0's ``recvbuf`` is left untouched."""
        return self._reduce_all("Exscan", sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf, recvbuf, op=SUM) -> Request:
        return self._reduce_all("Iexscan", sendbuf, recvbuf, op)

    def _reduce_all(self, call, sendbuf, recvbuf, op):
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf)
        _reducible(w, op, s, r)
        out = getattr(c, call)(self._a(s), self._a(r), op)
        return self._done(call[0] == "I", out, r)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> None:
        """Reduce ``sum(recvcounts)`` items; rank i gets ``recvcounts[i]`` of them."""
        c, w, s, r = self._send_recv("Reduce_scatter", sendbuf, recvbuf)
        _reducible(w, op, s, r)
        counts = recvcounts
        if recvcounts is not None:
            per = r.per if isinstance(r, Msg) else 1
            counts = [as_int(x, "recvcounts", w) * per for x in recvcounts]
        c.Reduce_scatter(self._a(s), self._a(r), counts, op)
        if isinstance(r, Msg):
            r.finish()

    # gathers and scatters
    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather every rank's message into root's ``recvbuf`` in rank order."""
        return self._rooted("Gather", sendbuf, recvbuf, root, root_recv=True)

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rooted("Igather", sendbuf, recvbuf, root, root_recv=True)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Send block i of root's ``sendbuf`` to rank i's ``recvbuf``."""
        return self._rooted("Scatter", sendbuf, recvbuf, root, root_recv=False)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        return self._rooted("Iscatter", sendbuf, recvbuf, root, root_recv=False)

    def _rooted(self, call, sendbuf, recvbuf, root, *, root_recv):
        c = self._inner(call)
        root = as_int(root, "root", f"rank {c.rank}: {call}")
        at_root = c.rank == root
        n = c.size
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf,
                                     send=at_root or root_recv, recv=at_root or not root_recv,
                                     sblocks=1 if root_recv else n, rblocks=n if root_recv else 1)
        return self._done(call[0] == "I", getattr(c, call)(self._a(s), self._a(r), root), r)

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every rank gets every rank's message, in rank order."""
        return self._all("Allgather", sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return self._all("Iallgather", sendbuf, recvbuf)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block j of ``sendbuf`` goes to rank j; block i of ``recvbuf`` comes from i."""
        return self._all("Alltoall", sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        return self._all("Ialltoall", sendbuf, recvbuf)

    def _all(self, call, sendbuf, recvbuf):
        n = self._inner(call).size
        c, w, s, r = self._send_recv(call, sendbuf, recvbuf, rblocks=n,
                                     sblocks=n if "lltoall" in call else 1)
        return self._done(call[0] == "I", getattr(c, call)(self._a(s), self._a(r)), r)

    # vector variants
    def _v(self, c, w, spec, arg, writable):
        if spec is IN_PLACE:
            return IN_PLACE, None
        m, counts, displs = vector_message(spec, c.size, w, arg, writable=writable)
        return m, [m.array, counts, displs]

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
        if gather:
            s = IN_PLACE if sendbuf is IN_PLACE else message(sendbuf, w, "sendbuf",
                                                              writable=False)
            r, rspec = self._v(c, w, recvbuf, "recvbuf", True) if at_root else (None, None)
            out = getattr(c, call)(self._a(s), rspec, root)
        else:
            s, sspec = self._v(c, w, sendbuf, "sendbuf", False) if at_root else (None, None)
            r = IN_PLACE if recvbuf is IN_PLACE else message(recvbuf, w, "recvbuf",
                                                              writable=True)
            out = getattr(c, call)(sspec if at_root else None, self._a(r), root)
        return self._done(call[0] == "I", out, r)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        """Every rank gets every rank's variable-size message in its vector spec."""
        return self._allv("Allgatherv", sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        return self._allv("Iallgatherv", sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """Vector-spec block j of ``sendbuf`` goes to rank j."""
        return self._allv("Alltoallv", sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        return self._allv("Ialltoallv", sendbuf, recvbuf)

    def _allv(self, call, sendbuf, recvbuf):
        c = self._inner(call)
        w = f"rank {c.rank}: {call}"
        r, rspec = self._v(c, w, recvbuf, "recvbuf", True)
        if "gather" in call:
            s = IN_PLACE if sendbuf is IN_PLACE else message(sendbuf, w, "sendbuf",
                                                              writable=False)
            out = getattr(c, call)(self._a(s), rspec)
        else:
            s, sspec = self._v(c, w, sendbuf, "sendbuf", False)
            out = getattr(c, call)(IN_PLACE if s is IN_PLACE else sspec, rspec)
        return self._done(call[0] == "I", out, r)

    def Ibarrier(self) -> Request:
        return Request._wrap(self._inner("Ibarrier").Ibarrier())

    # topologies
    def Create_cart(self, dims, periods=None, reorder: bool = False):
        """A Cartesian communicator over the first ``prod(dims)`` ranks (others: NULL)."""
        from .topo import create_cart
        return create_cart(self, dims, periods, reorder)

    def Cart_map(self, dims, periods=None) -> int:
        from .topo import cart_map
        return cart_map(self, dims)

    def Spawn(self, *args, **kwargs):
        raise NotImplementedError("Intracomm.Spawn: pycomm offers no dynamic process "
                                  "management (MPI_Comm_spawn)")

    def Accept(self, *args, **kwargs):
        raise NotImplementedError("Intracomm.Accept: pycomm offers no ports")

    Connect = Accept

