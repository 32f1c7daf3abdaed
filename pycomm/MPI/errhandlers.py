"""Error handlers (MPI-4.1 section 9.3): ``MPI.Errhandler``, the predefined handlers and
user-defined ones (``Comm.Create_errhandler(fn)``, and ``Win``'s, ``File``'s and
``Session``'s).

An :class:`Errhandler` is a handle: ``Errhandler(other)`` and ``Get_errhandler()`` give a
new handle equal to the handler (``Free`` makes that handle ``ERRHANDLER_NULL``, not the
handler the object keeps; freeing a predefined constant leaves it valid), as in mpi4py;
pickling is :mod:`pycomm.MPI.pickling`'s, as for every handle.

What the handler of an object does with an error of a call on that object:

* ``ERRORS_RETURN`` (the default, as under mpi4py), and ``ERRORS_ARE_FATAL`` and
  ``ERRORS_ABORT`` too: the call raises ``MPI.Exception`` (pycomm never aborts on an
  error by itself; ``Call_errhandler`` with the last two does end the job, see below);
* a user-defined handler ``fn(obj, errorcode)``: it is called with the error class, and
  the call then returns None, raising nothing (MPI's semantics, which mpi4py on MPICH
  keeps: the handler has dealt with the error). An exception in the handler propagates.

``obj.Call_errhandler(errorcode)`` runs the object's handler: a user one as above,
``ERRORS_RETURN`` nothing, ``ERRORS_ARE_FATAL``/``ERRORS_ABORT`` end the job with the
code (``Comm.Abort``). At most 32 user-defined handlers of a kind are alive at once
(mpi4py's limit: ``RuntimeError`` past it); ``Free`` releases one.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from pycomm.errors import ArgumentError

from .exceptions import mpi_error

__all__ = ["ERRHANDLER_NULL", "ERRORS_ABORT", "ERRORS_ARE_FATAL", "ERRORS_RETURN",
           "Errhandler", "call_errhandler", "checked", "create_errhandler", "install",
           "user_handled"]

_MAX_USER = 32                  # live user-defined handlers per kind, as mpi4py allows
_LIVE: dict[str, int] = {}


class _Handler:
    """What handles of one error handler share: a predefined name, or a user function
    and the kind of object it serves."""

    __slots__ = ("fn", "freed", "kind", "name")

    def __init__(self, name: str, kind: str | None = None, fn: Callable | None = None):
        self.name, self.kind, self.fn, self.freed = name, kind, fn, False


class Errhandler:
    """An error handler handle (mpi4py's ``MPI.Errhandler``); ``Errhandler()`` is
    ``ERRHANDLER_NULL``, ``Errhandler(other)`` a new handle to the same handler.

    Raises:
        TypeError: ``other`` is not an Errhandler.
    """

    def __init__(self, errhandler: Errhandler | None = None):
        if errhandler is not None and not isinstance(errhandler, Errhandler):
            raise TypeError(f"Errhandler({errhandler!r}): expected an Errhandler or "
                            "nothing")
        self._handle = None if errhandler is None else errhandler._handle

    @property
    def name(self) -> str:
        """``MPI_ERRORS_RETURN``...; ``user-defined`` for a handler made by
        ``Create_errhandler``; ``MPI_ERRHANDLER_NULL`` for the null handle."""
        return "MPI_ERRHANDLER_NULL" if self._handle is None else self._handle.name

    def __eq__(self, other) -> bool:
        if not isinstance(other, Errhandler):
            return NotImplemented
        return self._handle is other._handle

    def __hash__(self) -> int:
        return id(self._handle)

    def __bool__(self) -> bool:
        return self._handle is not None

    def Free(self) -> None:
        """Free this handle: it becomes ``ERRHANDLER_NULL`` (objects keep their handler;
        a predefined constant itself stays valid, as in mpi4py).

        Raises:
            MPI.Exception (ERR_ERRHANDLER): ``ERRHANDLER_NULL``.
        """
        h = self._handle
        if h is None:
            raise mpi_error(ArgumentError, "ERR_ERRHANDLER",
                            "Errhandler.Free: ERRHANDLER_NULL cannot be freed")
        if any(self is p for p in _PREDEFINED.values()):
            return
        if h.kind is not None and not h.freed:
            h.freed = True
            _LIVE[h.kind] -= 1
        self._handle = None

    def __repr__(self) -> str:
        h = self._handle
        if h is not None and h.kind is not None:
            return f"<MPI.Errhandler user-defined for {h.kind}: {h.fn!r}>"
        return f"<MPI.Errhandler {self.name}>"


def _predefined(name: str) -> Errhandler:
    out = Errhandler()
    out._handle = _Handler(name)
    return out


ERRHANDLER_NULL = Errhandler()
ERRORS_RETURN = _predefined("MPI_ERRORS_RETURN")
ERRORS_ARE_FATAL = _predefined("MPI_ERRORS_ARE_FATAL")
ERRORS_ABORT = _predefined("MPI_ERRORS_ABORT")
_PREDEFINED = {"ERRHANDLER_NULL": ERRHANDLER_NULL, "ERRORS_RETURN": ERRORS_RETURN,
               "ERRORS_ARE_FATAL": ERRORS_ARE_FATAL, "ERRORS_ABORT": ERRORS_ABORT}


def create_errhandler(kind: str, fn) -> Errhandler:
    """A user-defined handler ``fn(obj, errorcode)`` for objects of ``kind``.

    Raises:
        TypeError: ``fn`` is not callable.
        RuntimeError: 32 user-defined handlers of ``kind`` are alive (mpi4py's limit).
    """
    if not callable(fn):
        raise TypeError(f"{kind}.Create_errhandler: errhandler_fn must be callable "
                        f"(obj, errorcode), got {fn!r}")
    if _LIVE.get(kind, 0) >= _MAX_USER:
        raise RuntimeError(f"{kind}.Create_errhandler: cannot create too many "
                           f"user-defined error handlers ({_MAX_USER} alive; Free one)")
    _LIVE[kind] = _LIVE.get(kind, 0) + 1
    out = Errhandler()
    out._handle = _Handler("user-defined", kind, fn)
    return out


def checked(kind: str, errhandler, call: str) -> Errhandler:
    """``errhandler`` if an object of ``kind`` may take it (``Set_errhandler``).

    Raises:
        TypeError: not an Errhandler.
        MPI.Exception: ERR_ERRHANDLER (``ERRHANDLER_NULL``), ERR_ARG (a user-defined
            handler of another kind, as MPICH answers).
    """
    if not isinstance(errhandler, Errhandler):
        raise TypeError(f"{call}: errhandler must be an MPI.Errhandler, got "
                        f"{type(errhandler).__name__}")
    h = errhandler._handle
    if h is None:
        raise mpi_error(ArgumentError, "ERR_ERRHANDLER",
                        f"{call}: ERRHANDLER_NULL is not an error handler")
    if h.kind is not None and h.kind != kind:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{call}: a {h.kind} error handler "
                        f"cannot serve a {kind} (make one with {kind}.Create_errhandler)")
    return Errhandler(errhandler)


def call_errhandler(obj: Any, errhandler: Errhandler, errorcode: int) -> None:
    """``obj.Call_errhandler(errorcode)``: run ``errhandler`` (the object's) on the code."""
    h = errhandler._handle
    if h is None or h.name == "MPI_ERRORS_RETURN":
        return
    if h.kind is not None:
        h.fn(obj, errorcode)
        return
    from . import COMM_WORLD, Get_error_string
    sys.stderr.write(f"pycomm.MPI: {h.name} called on {type(obj).__name__} with error "
                     f"{errorcode} ({Get_error_string(errorcode)}); ending the job\n")
    sys.stderr.flush()
    COMM_WORLD.Abort(errorcode)


def user_handled(obj: Any, error) -> bool:
    """Whether ``obj`` (the object a failing call was made on) has a user-defined
    handler: if so, it has been called with the error's class."""
    current = getattr(obj, "_current_errhandler", None)
    if current is None:
        return False
    h = current()
    if h is None or h.kind is None:
        return False
    h.fn(obj, error.Get_error_class())
    return True


def install(classes: dict) -> None:
    """Give each class of ``classes`` (``{"Comm": Comm, ...}``) ``Create_errhandler``."""
    for kind, cls in classes.items():
        def create(cls, errhandler_fn, _kind=kind) -> Errhandler:
            return create_errhandler(_kind, errhandler_fn)
        create.__doc__ = (f"A user-defined error handler ``fn({kind.lower()}, errorcode)`` "
                          f"for {kind} objects (:mod:`pycomm.MPI.errhandlers`).")
        cls.Create_errhandler = classmethod(create)
        if hasattr(cls, "_ERRH_KIND"):          # ErrhandlerMethods' objects
            cls._ERRH_KIND = kind
