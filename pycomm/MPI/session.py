"""MPI sessions (MPI-4.0 chapter 11): ``MPI.Session``, ``SESSION_NULL`` and
``Group.Create_from_session_pset``.

A pycomm session sees the two process sets MPI predefines, ``"mpi://WORLD"`` (every
rank of the job) and ``"mpi://SELF"`` (this rank); ``Create_group`` gives their group and
``Intracomm.Create_from_group`` a communicator over it. ``Session.Init`` starts the world
as ``MPI.Init`` does (pycomm has one world per process; sessions share it), and
``Finalize`` only ends the session. A session's buffered-send buffer
(``Attach_buffer``...) is kept per session, as MPI 4.1 says; buffered sends copy their
data privately, as everywhere in pycomm. Calls on ``SESSION_NULL`` are ``ERR_SESSION``.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError

from .exceptions import ErrhandlerMethods, mpi_error, translate_methods
from .info import Info
from .membuf import BSEND, BUFFER_AUTOMATIC

__all__ = ["SESSION_NULL", "Session"]

_PSETS = ("mpi://WORLD", "mpi://SELF")


@translate_methods
class Session(ErrhandlerMethods):
    """An MPI session (mpi4py's ``MPI.Session``); ``Session()`` is ``SESSION_NULL`` and
    ``Session(other)`` a second handle to ``other``."""

    __slots__ = ("_s",)

    def __init__(self, session: Session | None = None):
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"Session({session!r}): expected an MPI.Session or nothing")
        self._s = None if session is None else session._s

    def _state(self, call: str) -> dict:
        if self._s is None:
            raise mpi_error(ArgumentError, "ERR_SESSION", f"Session.{call}: SESSION_NULL")
        return self._s

    @classmethod
    def Init(cls, info=None, errhandler=None) -> Session:
        """Start a session (and the world, if this process has none yet)."""
        import pycomm
        pycomm.init()
        out = cls()
        out._s = {"info": Info.Create(dict(info.items()) if info else None),
                  "errhandler": errhandler, "buffer": None}
        return out

    def Finalize(self) -> None:
        """End the session; the handle becomes SESSION_NULL (the world stays)."""
        self._state("Finalize")
        self._s = None

    def Get_num_psets(self, info=None) -> int:
        """The number of process sets: 2 (``mpi://WORLD``, ``mpi://SELF``)."""
        self._state("Get_num_psets")
        return len(_PSETS)

    def Get_nth_pset(self, n: int, info=None) -> str:
        """The name of process set ``n`` (ERR_ARG outside 0..Get_num_psets()-1)."""
        self._state("Get_nth_pset")
        if not 0 <= int(n) < len(_PSETS):
            raise mpi_error(ArgumentError, "ERR_ARG", f"Session.Get_nth_pset: n={n} is not "
                            f"in 0..{len(_PSETS) - 1}")
        return _PSETS[int(n)]

    def Get_info(self) -> Info:
        """A copy of the info the session was started with."""
        return self._state("Get_info")["info"].Dup()

    def _pset(self, name: str, call: str) -> str:
        self._state(call)
        if name not in _PSETS:
            raise mpi_error(ArgumentError, "ERR_ARG", f"Session.{call}: no process set "
                            f"{name!r} (pycomm has {', '.join(_PSETS)})")
        return name

    def Get_pset_info(self, pset_name: str) -> Info:
        """``mpi_size`` of the process set (an info object)."""
        import pycomm
        name = self._pset(pset_name, "Get_pset_info")
        size = pycomm.init().size if name == "mpi://WORLD" else 1
        return Info.Create({"mpi_size": str(size)})

    def Create_group(self, pset_name: str):
        """The group of the process set (``MPI.Group``)."""
        import pycomm

        from .groups import Group
        name = self._pset(pset_name, "Create_group")
        world = pycomm.init()
        group = world.Get_group()
        return Group._of(group if name == "mpi://WORLD" else group.Incl([world.rank]))

    def Attach_buffer(self, buf) -> None:
        """Keep ``buf`` (None: ``BUFFER_AUTOMATIC``) for Detach_buffer (MPI 4.1)."""
        self._state("Attach_buffer")["buffer"] = BUFFER_AUTOMATIC if buf is None else buf

    def Detach_buffer(self):
        """Wait for the pending buffered sends; return the attached buffer."""
        st = self._state("Detach_buffer")
        BSEND.drain()
        buf, st["buffer"] = st["buffer"], None
        return buf

    def Flush_buffer(self) -> None:
        self._state("Flush_buffer")
        BSEND.drain()

    def Iflush_buffer(self):
        from .request import Request
        self.Flush_buffer()
        return Request()

    def __bool__(self) -> bool:
        return self._s is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Session):
            return NotImplemented
        return self._s is other._s

    def __hash__(self) -> int:
        return id(self._s)

    def __reduce__(self):
        if self._s is not None:
            raise ValueError("cannot serialize MPI.Session (a process-local handle)")
        return "SESSION_NULL"

    def __repr__(self) -> str:
        return "<MPI.SESSION_NULL>" if self._s is None else "<MPI.Session>"


SESSION_NULL = Session()
