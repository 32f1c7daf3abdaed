"""mpi4py's handle conversions on pycomm.MPI's objects: ``handle``/``fromhandle``,
``toint``/``fromint`` and ``py2f``/``f2py``, and ``Status.py2f``/``f2py``.

pycomm has no C or Fortran handles, so a handle's integer is **process-local**: it names
what the object refers to (its communicator, group, datatype, op, request...) in this
process, and ``Class.fromint(obj.toint())`` gives a new object equal to ``obj``, as
MPICH's integers do. ``handle``, ``toint()`` and ``py2f()`` are the same integer (as
they are under MPICH), and ``fromhandle``, ``fromint`` and ``f2py`` take it back. The
integers are laid out as MPICH's, non-negative and below 2**31 (so a C ``int`` or a
Fortran ``INTEGER`` holds them): bits 26-29 the object's kind (MPICH's codes: 1
communicator, 2 group, 3 datatype...), then

* a null handle: the kind alone (``COMM_NULL`` is 0x04000000, as MPICH's); ``FILE_NULL``
  is 0;
* a predefined object (``MPI.INT``, ``COMM_WORLD``...): bit 30 and an index, the same in
  every process of a job (the constants' names, sorted);
* any other object: an index given the first time its integer is asked for. This process
  remembers the :data:`KEEP` objects of each class whose integer was asked for last;
  an older one's integer (or one never given) is refused with ``MPI.Exception``.

Such an integer means nothing to another process or to C/Fortran code: an mpi4py program
hands its integers to compiled code only through a real MPI library.
"""

from __future__ import annotations

from collections import OrderedDict

from pycomm.errors import ArgumentError

from .exceptions import mpi_error
from .objmodel import constants, kind_of

__all__ = ["KEEP", "install"]

KEEP = 4096                     # remembered non-predefined objects per class
_CODE = {"Comm": 0x1, "Group": 0x2, "Datatype": 0x3, "File": 0x4, "Errhandler": 0x5,
         "Op": 0x6, "Info": 0x7, "Win": 0x8, "Request": 0xB, "Message": 0xB,
         "Session": 0xE}
_ERR = {"Comm": "ERR_COMM", "Group": "ERR_GROUP", "Datatype": "ERR_TYPE",
        "File": "ERR_FILE", "Errhandler": "ERR_ERRHANDLER", "Op": "ERR_OP",
        "Info": "ERR_INFO", "Win": "ERR_WIN", "Request": "ERR_REQUEST",
        "Message": "ERR_REQUEST", "Session": "ERR_SESSION"}
_BUILTIN, _INDEX = 0x40000000, (1 << 26) - 1
_LAZY_NAMES = {"Comm": ("COMM_SELF", "COMM_WORLD")}     # made on first use
_NOPROC = object()              # what MESSAGE_NO_PROC (and its copies) refers to
_EMPTY = object()               # what every empty group refers to (they are all equal)
_classes: dict[str, type] = {}          # kind -> class (and "Intracomm")
_names: dict[str, list[str]] = {}      # kind -> its constants' names, sorted
_user_int: dict[str, OrderedDict] = {}   # kind -> id(referent) -> integer (LRU order)
_user_obj: dict[str, dict] = {}          # kind -> integer -> (copy, class)
_next: dict[str, int] = {}
_predefined: dict[str, dict] = {}        # kind -> id(referent) -> integer, as found


def _referent(obj, kind: str):
    """What ``obj`` refers to (the identity its copies share), or None for a null one."""
    if not obj:
        return None
    if kind == "Comm":
        return obj._c
    if kind == "Group":
        return obj._g if obj._g._world else _EMPTY
    if kind == "Datatype":
        return obj._data
    if kind == "Request":
        return obj._ident()
    if kind == "Message":
        return _NOPROC if obj._data is None else obj._data
    if kind == "Info":
        return obj._d
    if kind in ("Op", "Errhandler"):
        return obj.__dict__.get("_handle", obj)
    return obj._s                                      # Session, Win, File


def _null_int(kind: str) -> int:
    return 0 if kind == "File" else _CODE[kind] << 26


def _predefined_int(kind: str, ref) -> int | None:
    """The integer of the predefined object ``ref`` (a module constant's referent)."""
    n = _predefined[kind].get(id(ref))
    if n is not None:
        return n
    mod = vars(__import__("pycomm.MPI", fromlist=["MPI"]))
    for c in constants(kind):
        if c and _referent(c, kind) is ref:
            for i, name in enumerate(_names[kind]):
                if mod.get(name) is c:       # constants live for good: ids stay theirs
                    n = _predefined[kind][id(ref)] = _BUILTIN | _CODE[kind] << 26 | i
                    return n
    return None


def _handle(self) -> int:
    kind = kind_of(self)
    ref = _referent(self, kind)
    if ref is None:
        return _null_int(kind)
    table = _user_int[kind]
    n = table.get(id(ref))
    if n is not None:
        table.move_to_end(id(ref))
        return n
    n = _predefined_int(kind, ref)
    if n is not None:
        return n
    objs = _user_obj[kind]
    n = _next[kind]
    while n in objs:                         # after a wrap-around: skip live integers
        n = n % _INDEX + 1
    _next[kind] = n % _INDEX + 1
    n |= _CODE[kind] << 26
    cls = next(k for k in type(self).__mro__ if k.__module__.startswith("pycomm."))
    if cls is _classes["Comm"]:
        cls = _classes["Intracomm"]          # pycomm's communicators are all intra
    copy = cls(self)                         # keeps the referent (and its id) alive
    table[id(ref)], objs[n] = n, (copy, id(ref))
    if len(table) > KEEP:
        _, old = table.popitem(last=False)
        del objs[old]
    return n


def _fromhandle(cls, handle: int):
    """A new handle object for the integer ``handle`` (``handle``/``toint()``/
    ``py2f()`` of an object of this class, in this process).

    Args:
        handle: the integer; 0 also names the null handle.

    Returns:
        A new object equal to the one the integer was taken from: of that object's
        pycomm.MPI class for a communicator (``Intracomm``, ``Cartcomm``...), of
        ``Prequest``/``Grequest`` when called on those, else of the handle class.

    Raises:
        TypeError: ``handle`` is not an integer.
        MPI.Exception: no object of this class has that integer in this process (it
            was never given, or is older than the last ``KEEP`` asked for): class
            ``ERR_COMM``, ``ERR_TYPE``... for the handle's kind.
    """
    if not isinstance(handle, int) or isinstance(handle, bool):
        try:
            handle = handle.__index__()
        except AttributeError:
            raise TypeError(f"{cls.__name__}.fromhandle: an integer is required, got "
                            f"{handle!r}") from None
    kind = kind_of(cls)
    base = _classes[kind]
    make = cls if kind == "Request" and cls is not base else base
    if handle in (0, _null_int(kind)):
        return make()
    if handle & _BUILTIN and (handle >> 26) & 0xF == _CODE[kind]:
        i = handle & _INDEX
        if i < len(_names[kind]):
            mod = __import__("pycomm.MPI", fromlist=["MPI"])
            c = getattr(mod, _names[kind][i])
            return (type(c) if kind == "Comm" else make)(c)
    hit = _user_obj[kind].get(handle)
    if hit is None:
        raise mpi_error(ArgumentError, _ERR[kind],
                        f"{cls.__name__}.fromhandle({handle:#x}): no {base.__name__} has "
                        "that handle in this process (handles are process-local; this "
                        f"process remembers the last {KEEP} it gave out per class)")
    copy, key = hit
    _user_int[kind].move_to_end(key)
    out = (type(copy) if kind == "Comm" else make)(copy)
    if kind == "Op":                 # as mpi4py's: knows the kernel, not the function
        out.__dict__.pop("_user", None)
    return out


def _status_py2f(self) -> list[int]:
    """The status as Fortran's ``INTEGER STATUS(MPI_F_STATUS_SIZE)`` (MPICH's layout:
    count low bits, count high bits and cancelled flag, source, tag, error).

    Returns:
        list[int]: ``F_STATUS_SIZE`` (5) integers; ``[F_SOURCE]`` is the source...
    """
    return list(self._mem)


def _status_f2py(cls, arg) -> object:
    """A status from the list :meth:`py2f` gives.

    Args:
        arg: a sequence of ``F_STATUS_SIZE`` (5) integers.

    Returns:
        Status: of class ``cls``.

    Raises:
        ValueError: ``arg`` does not hold 5 integers.
    """
    fields = [int(x) for x in arg]
    if len(fields) != len(cls()._mem):
        raise ValueError(f"{cls.__name__}.f2py: expecting {len(cls()._mem)} integers "
                         f"(F_STATUS_SIZE), got {len(fields)}")
    out = cls()
    out._mem[:] = type(out._mem)("i", fields)
    return out


def install(ns: dict) -> None:
    """Give the handle classes of the ``pycomm.MPI`` namespace ``ns`` the conversions."""
    _classes["Intracomm"] = ns["Intracomm"]
    for kind in _CODE:
        cls = _classes[kind] = ns[kind]
        names = {n for n, v in ns.items()
                 if not isinstance(v, type) and kind_of(v) == kind and v and n.isupper()}
        _names[kind] = sorted(names | set(_LAZY_NAMES.get(kind, ())))
        _user_int[kind], _user_obj[kind], _next[kind] = OrderedDict(), {}, 1
        _predefined[kind] = {}
        cls.handle = property(_handle, doc="The object's process-local integer handle "
                              "(see :mod:`pycomm.MPI.handles`).")
        cls.fromhandle = cls.fromint = cls.f2py = classmethod(_fromhandle)
        cls.toint = cls.py2f = _handle
    ns["Status"].py2f = _status_py2f
    ns["Status"].f2py = classmethod(_status_f2py)
