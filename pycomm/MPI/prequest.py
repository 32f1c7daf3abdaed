"""``MPI.Prequest``, the persistent request: ``Send_init``, ``Recv_init`` and their kin
(:mod:`pycomm.MPI.commp2p`), the persistent neighbour collectives
(:mod:`pycomm.MPI.neighbor`) and partitioned communication (:mod:`pycomm.MPI.partitioned`)
return one. Its ``Start`` posts the same operation again each time; it is a
:class:`pycomm.MPI.request.Request` otherwise.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError

from .exceptions import translate_methods
from .request import Request, handle_of_kind

__all__ = ["Prequest"]


@translate_methods
class Prequest(Request):
    """A persistent request (``Send_init``/``Recv_init``): ``Start`` posts the operation
    again each time; after completion it is inactive, not null, until ``Free``."""

    __slots__ = ("_freed", "_start")
    _PERSISTENT = True

    def __init__(self, request: Request | None = None):
        """``Prequest(other)``: another handle of the persistent request ``other`` (a
        null request of any class gives a null one, as mpi4py's).

        Raises:
            TypeError: ``other`` is an active non-persistent request, or no request.
        """
        request = handle_of_kind(Prequest, request, "persistent request")
        super().__init__(request)
        self._start = getattr(request, "_start", None)
        self._freed = getattr(request, "_freed", request is None)

    @classmethod
    def _persistent(cls, start) -> Prequest:
        out = object.__new__(cls)
        out._r, out._finish, out._start, out._freed = None, None, start, False
        return out

    def Start(self) -> None:
        """Post the operation (the buffer is read or written from now until completion).

        Raises:
            ArgumentError: the request is still active, or was freed.
        """
        if self._freed:
            raise ArgumentError("Prequest.Start: the request has been freed")
        if self._r is not None:
            raise ArgumentError("Prequest.Start: the request is still active; Wait first")
        self._r, self._finish = self._start()

    def Free(self) -> None:
        self._r, self._finish, self._freed = None, None, True

    def __bool__(self) -> bool:
        return not getattr(self, "_freed", False)

    def _ident(self):
        """The persistent request (its start function), None once freed."""
        return None if getattr(self, "_freed", True) else self._start
