"""``MPI.Comm``: mpi4py's communicator methods over a pycomm Communicator.

Each method turns its mpi4py arguments into what :class:`pycomm.comm.Communicator` takes
(message specs become typed contiguous arrays, :mod:`pycomm.MPI.msgspec`; integral-float
ranks and tags become ints) and calls the Communicator's public method of the same name;
no collective logic lives here. A receive into a non-contiguous datatype is unpacked when
the call (or its request) completes. Errors leave as ``MPI.Exception`` subclasses that
keep their pycomm class (:mod:`pycomm.MPI.exceptions`).

The point-to-point buffer methods live in :mod:`pycomm.MPI.commp2p`, the collectives
(:class:`~pycomm.MPI.coll.Intracomm`) in :mod:`pycomm.MPI.coll`, topologies (``Create_cart``, :class:`Cartcomm`) in :mod:`pycomm.MPI.topo`.
"""

from __future__ import annotations

from pycomm import config
from pycomm.errors import CommError
from pycomm.groups import COMM_NULL as _COMM_NULL
from pycomm.groups import UNDEFINED
from pycomm.p2p import ANY_SOURCE

from .commp2p import BufferPointToPoint, fin
from .exceptions import last_used_code, mpi_error, translate_methods
from .keyvals import check_keyval, copy_attrs, delete_attr, free_attrs, set_attr, user_attr
from .membuf import BSEND
from .msgspec import as_int
from .objects import ObjectMethods
from .request import Request, completed

__all__ = ["BSEND", "Comm", "fin"]

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
KEYVAL_TAG_UB, KEYVAL_HOST, KEYVAL_IO, KEYVAL_WTIME_IS_GLOBAL = 0, 1, 2, 3
KEYVAL_UNIVERSE_SIZE, KEYVAL_APPNUM, KEYVAL_LASTUSEDCODE = 4, 5, 6


@translate_methods
class Comm(ObjectMethods, BufferPointToPoint):
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
        """Whether this is an inter-communicator (a ``Comm`` handle of one included)."""
        return getattr(self._inner("Is_inter"), "is_inter", False)

    def Is_intra(self) -> bool:
        return not getattr(self._inner("Is_intra"), "is_inter", False)

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
                 KEYVAL_WTIME_IS_GLOBAL: False,
                 KEYVAL_APPNUM: config.get("PYCOMM_APPNUM"),     # spawned: its command
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

    def _current_errhandler(self):
        """The handler set (its shared part), or None: read by failing calls."""
        eh = self._errhandler
        return eh._handle if eh is not None else None

    def Get_errhandler(self):
        """A new handle to the error handler (``ERRORS_RETURN`` unless one was set)."""
        from . import Errhandler, default_errhandler
        self._inner("Get_errhandler")
        return Errhandler(self._errhandler or default_errhandler())

    def Set_errhandler(self, errhandler) -> None:
        """Set the error handler: a user-defined one (``Comm.Create_errhandler``) gets
        the errors of this communicator's calls instead of an exception
        (:mod:`pycomm.MPI.errhandlers`); the predefined ones raise ``MPI.Exception``.

        Raises:
            TypeError: not an Errhandler.
            MPI.Exception: ERR_COMM (COMM_NULL), ERR_ERRHANDLER (ERRHANDLER_NULL),
                ERR_ARG (a user-defined handler of another kind).
        """
        from .errhandlers import checked
        self._inner("Set_errhandler")
        self._errhandler = checked("Comm", errhandler, "Comm.Set_errhandler")

    def Call_errhandler(self, errorcode: int) -> None:
        """Run the error handler on ``errorcode``: a user-defined one is called,
        ``ERRORS_RETURN`` does nothing, ``ERRORS_ARE_FATAL``/``ERRORS_ABORT`` end the job
        with the code."""
        from . import default_errhandler
        from .errhandlers import call_errhandler
        self._inner("Call_errhandler")
        call_errhandler(self, self._errhandler or default_errhandler(), int(errorcode))

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
        """``(Dup(), a completed request)``: pycomm duplicates at once (collective); the
        request is live until waited on, as MPICH's."""
        dup = self.Dup()
        return dup, completed(self._inner("Idup")._engine)

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
        return completed(self._inner("Iflush_buffer")._engine)

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

    @classmethod
    def Get_parent(cls) -> Comm:
        """The inter-communicator to the processes that spawned this one
        (MPI_Comm_get_parent; :mod:`pycomm.MPI.spawn`), or a null ``Intercomm`` (not
        spawned, or disconnected from them)."""
        from .intercomm import Intercomm
        from .spawn import get_parent
        link = get_parent()
        return Intercomm() if link is None else Intercomm._wrap(link)

    @classmethod
    def Join(cls, fd: int) -> Comm:
        """The inter-communicator of this process and the one at the other end of the
        connected socket ``fd`` (MPI_Comm_join; see :mod:`pycomm.MPI.ports`).

        Raises:
            MPI.Exception: ERR_ARG (not a socket), ERR_OTHER (the peer failed).
        """
        from .ports import join
        return join(fd)

    def Disconnect(self) -> None:
        """Wait for pending communication and free the communicator (as :meth:`Free`;
        pycomm's frees already wait for nothing outstanding)."""
        self.Free()
