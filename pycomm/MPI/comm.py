"""``MPI.Comm``: mpi4py's communicator methods over a pycomm Communicator.

Each method turns its mpi4py arguments into what :class:`pycomm.comm.Communicator` takes
(message specs become typed contiguous arrays, :mod:`pycomm.MPI.msgspec`; integral-float
ranks and tags become ints) and calls the Communicator's public method of the same name;
no collective logic lives here. A receive into a non-contiguous datatype is unpacked when
the call (or its request) completes. Errors leave as ``MPI.Exception`` subclasses that
keep their pycomm class (:mod:`pycomm.MPI.exceptions`).

The collectives (:class:`~pycomm.MPI.coll.Intracomm`) live in :mod:`pycomm.MPI.coll`,
topologies (``Create_cart``, :class:`Cartcomm`) in :mod:`pycomm.MPI.topo`.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError, CommError
from pycomm.groups import COMM_NULL as _COMM_NULL
from pycomm.groups import UNDEFINED
from pycomm.p2p import ANY_SOURCE, ANY_TAG

from .exceptions import last_used_code, mpi_error, translate_methods
from .keyvals import check_keyval, copy_attrs, delete_attr, free_attrs, set_attr, user_attr
from .membuf import BSEND
from .msgspec import Msg, as_int, message
from .objects import ObjectMethods
from .request import Prequest, Request, Status, completed

__all__ = ["BSEND", "Comm", "fin"]

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
KEYVAL_TAG_UB, KEYVAL_HOST, KEYVAL_IO, KEYVAL_WTIME_IS_GLOBAL = 0, 1, 2, 3
KEYVAL_UNIVERSE_SIZE, KEYVAL_APPNUM, KEYVAL_LASTUSEDCODE = 4, 5, 6


def fin(*msgs: Msg):
    """The completion action of a call whose receive side was packed (None if none)."""
    todo = [m for m in msgs if m is not None and m._unpack is not None]
    if not todo:
        return None
    return lambda: [m.finish() for m in todo] and None


@translate_methods
class Comm(ObjectMethods):
    """A communicator (mpi4py's ``MPI.Comm``), wrapping a :class:`pycomm.Communicator`.

    ``Comm()`` is ``COMM_NULL``. Uppercase methods move buffers, lowercase ones objects,
    with mpi4py's signatures; ``comm.rank``/``comm.size`` as in mpi4py.
    """

    __slots__ = ("__weakref__", "_attrs", "_c", "_errhandler", "_name")

    def __init__(self, comm: Comm | None = None):
        if comm is not None and not isinstance(comm, Comm):
            raise TypeError(f"Comm({comm!r}): expected a communicator or nothing")
        if comm is None:
            self._c, self._name, self._attrs, self._errhandler = None, None, {}, None
        else:                       # a new handle to the same communicator: its state too
            self._c, self._name = comm._c, comm._name
            self._attrs, self._errhandler = comm._attrs, comm._errhandler

    @classmethod
    def _wrap(cls, inner) -> Comm:
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
        if self._c is None:
            return "MPI_COMM_NULL"
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
        self._inner("Is_inter")
        return False

    def Is_intra(self) -> bool:
        self._inner("Is_intra")
        return True

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self) -> int:
        """``CART``, ``GRAPH`` or ``DIST_GRAPH``; ``UNDEFINED`` without a topology."""
        from .neighbor import TOPOLOGIES
        t = TOPOLOGIES.get(self._inner("Get_topology"))
        return UNDEFINED if t is None else t.kind

    topology = property(lambda self: self.Get_topology())
    is_topo = property(lambda self: self.Get_topology() != UNDEFINED)

    def Compare(self, comm: Comm) -> int:
        """IDENT (same handle), CONGRUENT (same group, other context), SIMILAR, UNEQUAL."""
        self._inner("Compare")
        comm._inner("Compare")
        if self._c is comm._c:
            return IDENT
        return self._inner("Compare").Compare(comm._inner("Compare"))

    def Get_attr(self, keyval: int):
        """Predefined attributes: ``TAG_UB``, ``HOST``, ``IO``, ``WTIME_IS_GLOBAL``,
        ``UNIVERSE_SIZE``, ``APPNUM``, ``LASTUSEDCODE``; user keys set by Set_attr."""
        from pycomm.comm import TAG_UB
        self._inner("Get_attr")
        check_keyval(keyval, "Comm.Get_attr")
        fixed = {KEYVAL_TAG_UB: TAG_UB, KEYVAL_HOST: -1, KEYVAL_IO: ANY_SOURCE,
                 KEYVAL_WTIME_IS_GLOBAL: False, KEYVAL_APPNUM: None,
                 KEYVAL_LASTUSEDCODE: last_used_code()}
        if keyval == KEYVAL_UNIVERSE_SIZE:
            return self.Get_size()
        if keyval in fixed:
            return fixed[keyval]
        return user_attr("Comm", self._attrs, keyval, "Comm.Get_attr")

    def Set_attr(self, keyval: int, attrval) -> None:
        """Cache ``attrval`` under ``keyval``, a key of ``Comm.Create_keyval`` (a value
        already there is deleted first: :mod:`pycomm.MPI.keyvals`).

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL), ERR_KEYVAL (a predefined, unknown or
                freed key), ERR_OTHER (the delete callback raised).
        """
        self._inner("Set_attr")
        set_attr("Comm", self, self._attrs, keyval, attrval, "Comm.Set_attr")

    def Delete_attr(self, keyval: int) -> None:
        """Remove the value cached under ``keyval`` (its key's delete callback runs).

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL), ERR_KEYVAL (a predefined or unknown key),
                ERR_OTHER (the delete callback raised).
        """
        self._inner("Delete_attr")
        delete_attr("Comm", self, self._attrs, keyval, "Comm.Delete_attr")

    def Get_errhandler(self):
        from . import default_errhandler
        self._inner("Get_errhandler")
        return self._errhandler or default_errhandler()

    def Set_errhandler(self, errhandler) -> None:
        """Errors are always raised as ``MPI.Exception`` (mpi4py's default handler);
        ``ERRHANDLER_NULL`` is ``ERR_ERRHANDLER``."""
        self._inner("Set_errhandler")
        if getattr(errhandler, "name", None) == "MPI_ERRHANDLER_NULL":
            raise mpi_error(ArgumentError, "ERR_ERRHANDLER",
                            "Set_errhandler: ERRHANDLER_NULL is not an error handler")
        self._errhandler = errhandler

    def Abort(self, errorcode: int = 0) -> None:
        """Terminate this process with ``errorcode``; the launcher stops the others.
        Says so on stderr as MPI libraries do (``application called MPI_Abort(...)``)."""
        import sys
        inner = self._inner("Abort")
        code = as_int(errorcode, "errorcode", "Abort")
        sys.stderr.write(f"application called MPI_Abort({self.Get_name()}, {code}) - "
                         f"process {inner.rank}\n")
        inner.Abort(code)

    # -- communicator management ----------------------------------------------------------
    def Dup(self, info=None) -> Comm:
        """A new communicator with the same group and a fresh context (collective), with
        the error handler and the attributes the keys' copy callbacks give it.

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL), ERR_OTHER (a copy callback raised).
        """
        inner = self._inner("Dup")
        attrs = copy_attrs(self, self._attrs, "Comm.Dup")
        out = type(self)._wrap(inner.Dup())
        out._errhandler = self._errhandler          # MPI_Comm_dup keeps the handler
        out._attrs.update(attrs)
        return out

    Clone = Dup

    def Dup_with_info(self, info) -> Comm:
        return self.Dup()

    def Idup(self, info=None) -> tuple[Comm, Request]:
        """``(Dup(), a completed request)``: pycomm duplicates at once (collective)."""
        return self.Dup(), Request()

    Idup_with_info = Idup

    def Get_info(self):
        """The communicator's info hints (pycomm reads none)."""
        from .info import Info
        return Info.Create(self._attrs.get("__info__", {}))

    def Set_info(self, info) -> None:
        self._attrs["__info__"] = dict(info.items()) if info else {}

    info = property(Get_info, Set_info)

    def Split_type(self, split_type: int, key: int = 0, info=None) -> Comm:
        """Split by hardware domain; pycomm knows one, the host (by processor name).
        Collective; ranks may pass different kinds (``UNDEFINED``: COMM_NULL).

        ``COMM_TYPE_SHARED``: the ranks of this host. ``COMM_TYPE_HW_GUIDED`` and
        ``COMM_TYPE_RESOURCE_GUIDED``: the same when ``info`` asks for
        ``mpi_hw_resource_type=mpi_shared_memory``, else COMM_NULL. ``COMM_TYPE_HW_UNGUIDED``: the host when it is a strict subset of this
        communicator (``info`` then names it), else COMM_NULL. Other kinds: COMM_NULL.
        """
        from . import Get_processor_name
        names = self._inner("Split_type").allgather(Get_processor_name())
        split_type = as_int(split_type, "split_type", "Split_type")
        host = names.index(names[self.rank])
        hint = info.Get("mpi_hw_resource_type") if info else None
        color = -32766                                  # UNDEFINED
        if split_type == 1 or (split_type in (2, 4) and hint == "mpi_shared_memory"):
            color = host
        elif split_type == 3 and len(set(names)) > 1:   # a smaller domain than this one
            color = host
            if info:
                info.Set("mpi_hw_resource_type", "mpi_shared_memory")
        return self.Split(color, key)

    def Attach_buffer(self, buf) -> None:
        """As ``MPI.Attach_buffer`` (one buffered-send pool per process)."""
        from . import Attach_buffer
        Attach_buffer(buf)

    def Detach_buffer(self):
        from . import Detach_buffer
        return Detach_buffer()

    def Flush_buffer(self) -> None:
        """Wait for the pending buffered sends."""
        BSEND.drain()

    def Iflush_buffer(self) -> Request:
        """:meth:`Flush_buffer`, complete when it returns."""
        BSEND.drain()
        return Request()

    @classmethod
    def Create_from_group(cls, group, stringtag: str = "org.mpi4py", info=None,
                          errhandler=None) -> Comm:
        """The communicator of ``group``, made by its members (over COMM_WORLD)."""
        from . import COMM_WORLD
        from .coll import Intracomm
        tag = sum(map(ord, str(stringtag))) % 32768
        return Intracomm._wrap(COMM_WORLD._inner("Create_from_group").Create_group(
            group._g, tag))

    def Free(self) -> None:
        """Release the communicator; the handle becomes ``COMM_NULL``.

        Its attributes are deleted first (their keys' delete callbacks run).

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL, COMM_WORLD or COMM_SELF), ERR_OTHER (an
                attribute callback raised; the communicator is freed all the same).
        """
        if self._name in ("MPI_COMM_WORLD", "MPI_COMM_SELF"):
            raise mpi_error(CommError, "ERR_COMM", f"Free: {self._name} cannot be freed")
        inner = self._inner("Free")
        try:
            free_attrs(self, self._attrs, "Comm.Free")
        finally:
            inner.Free()
            self._c = None

    def Split(self, color: int = 0, key: int = 0) -> Comm:
        """Partition by ``color`` (``UNDEFINED``: get COMM_NULL), order by ``key``."""
        w = f"rank {self.rank}: Split"
        from .coll import Intracomm
        return Intracomm._wrap(self._inner("Split").Split(as_int(color, "color", w),
                                                          as_int(key, "key", w)))

    def Create(self, group) -> Comm:
        """The communicator of ``group`` (collective over this one; others get NULL)."""
        from .coll import Intracomm
        return Intracomm._wrap(self._inner("Create").Create(group._g))

    def Create_group(self, group, tag: int = 0) -> Comm:
        """The communicator of ``group``, collective over the group's members only."""
        from .coll import Intracomm
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

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking synchronous send: returns once ``dest`` has started the matching
        receive (rendezvous at every size)."""
        c = self._inner("Ssend")
        m = message(buf, f"rank {c.rank}: Ssend", "buf", writable=False)
        c.Ssend(m.array, as_int(dest, "dest", "Ssend"), as_int(tag, "tag", "Ssend"))

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

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send: the request completes once ``dest`` has started the
        matching receive."""
        c = self._inner("Issend")
        m = message(buf, f"rank {c.rank}: Issend", "buf", writable=False)
        return Request._wrap(c.Issend(m.array, as_int(dest, "dest", "Issend"),
                                      as_int(tag, "tag", "Issend")))

    Irsend = Isend

    def Ibsend(self, buf, dest: int, tag: int = 0) -> Request:
        """Buffered nonblocking send of a private copy: a live request, complete at once
        (``buf`` is free again), to ``PROC_NULL`` too, as MPICH's."""
        c = self._inner("Ibsend")
        m = message(buf, f"rank {c.rank}: Ibsend", "buf", writable=False)
        inner = c.Isend(m.array.copy(), as_int(dest, "dest", "Ibsend"),
                        as_int(tag, "tag", "Ibsend"))
        BSEND.add(inner)
        return completed(c._engine)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Post a receive into ``buf``; valid after the request completes."""
        c = self._inner("Irecv")
        m = message(buf, f"rank {c.rank}: Irecv", "buf", writable=True)
        return Request._wrap(c.Irecv(m.array, as_int(source, "source", "Irecv"),
                                     as_int(tag, "tag", "Irecv")), fin(m))

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

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking :meth:`Sendrecv`: one request completing both halves."""
        c = self._inner("Isendrecv")
        w = f"rank {c.rank}: Isendrecv"
        s = message(sendbuf, w, "sendbuf", writable=False)
        r = message(recvbuf, w, "recvbuf", writable=True)
        return self._pair(c, w, s.array, dest, sendtag, r, source, recvtag)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0,
                          source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking :meth:`Sendrecv_replace` (the outgoing data is copied first)."""
        c = self._inner("Isendrecv_replace")
        w = f"rank {c.rank}: Isendrecv_replace"
        r = message(buf, w, "buf", writable=True)
        return self._pair(c, w, r.array.copy(), dest, sendtag, r, source, recvtag)

    def _pair(self, c, w, out, dest, sendtag, r, source, recvtag) -> Request:
        """Post a receive and a send; the request completes when the receive has and then
        waits for the send (its receiver posted it already, so that wait is short)."""
        rr = c.Irecv(r.array, as_int(source, "source", w), as_int(recvtag, "recvtag", w))
        sr = c.Isend(out, as_int(dest, "dest", w), as_int(sendtag, "sendtag", w))

        def finish() -> None:
            sr.Wait()
            r.finish()
        return Request._wrap(rr, finish)

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

    def Ssend_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent synchronous send: each ``Start()`` is an :meth:`Issend`."""
        return self._persistent("Ssend_init", self.Issend, buf, dest, tag)

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

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None):
        """Block until a matching message is there and take it: an ``MPI.Message``
        (``MESSAGE_NO_PROC`` for ``PROC_NULL``). See :mod:`pycomm.MPI.message`."""
        from .message import matched_probe
        return matched_probe(self._inner("Mprobe"), as_int(source, "source", "Mprobe"),
                             as_int(tag, "tag", "Mprobe"), status, True)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None):
        """Take a matching message if one is there: an ``MPI.Message``, else None."""
        from .message import matched_probe
        return matched_probe(self._inner("Improbe"), as_int(source, "source", "Improbe"),
                             as_int(tag, "tag", "Improbe"), status, False)

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Object form of Mprobe (the message's ``recv()`` returns the object)."""
        return self.Mprobe(source, tag, status)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        return self.Improbe(source, tag, status)

    @classmethod
    def Get_parent(cls) -> Comm:
        """The parent of a spawned process: a null ``Intercomm`` (pycomm does not spawn,
        so no process has a parent)."""
        from .intercomm import Intercomm
        return Intercomm()

    def Disconnect(self) -> None:
        """Wait for pending communication and free the communicator (as :meth:`Free`;
        pycomm's frees already wait for nothing outstanding)."""
        self.Free()
