"""Pickling of handles as mpi4py does it (its ``reduce_default``).

A module constant (``COMM_NULL``, ``COMM_WORLD``, ``GROUP_EMPTY``, ``REQUEST_NULL``,
``WIN_NULL``, ``FILE_NULL``, ``MESSAGE_NO_PROC``, ``ERRORS_RETURN``...) unpickles to
itself; a copy of one (``MPI.Comm(COMM_WORLD)``, or a subclass's ``MyComm(COMM_NULL)``)
to a new copy of the same class. Any other communicator, group, request, message, error
handler, session, window or file names something of this process only, and pickling it
raises ``ValueError``. (Datatypes, ops and info objects pickle by their own
``__reduce__``.)
"""

from __future__ import annotations

from .objmodel import CONSTANTS, constants, kind_of

__all__ = ["install"]

_KINDS = ("Comm", "Group", "Request", "Message", "Errhandler", "Session", "Win", "File")


def _named(name: str):
    import pycomm.MPI as mpi
    return getattr(mpi, name)


def _copy(cls, name: str):
    return cls.__new__(cls, _named(name))


def _name_of(obj) -> str:
    import pycomm.MPI as mpi
    return next(n for n, v in sorted(vars(mpi).items()) if v is obj and n.isupper())


def _reduce(self):
    if id(self) in CONSTANTS:
        return _named, (_name_of(self),)
    for c in constants(kind_of(self)):
        if c == self:
            return _copy, (type(self), _name_of(c))
    raise ValueError(f"cannot pickle {self!r}: only the predefined handles and their "
                     "copies mean the same thing in another process")


def install(ns: dict) -> None:
    """Give the handle classes above (of the ``pycomm.MPI`` namespace ``ns``) mpi4py's
    ``__reduce__``."""
    for kind in _KINDS:
        ns[kind].__reduce__ = _reduce
