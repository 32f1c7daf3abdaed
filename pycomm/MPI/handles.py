"""mpi4py's handle conversions on pycomm.MPI's objects: ``handle``/``fromhandle``,
``toint``/``fromint`` and ``py2f``/``f2py``.

pycomm has no C or Fortran handles, so ``handle`` is a process-local integer naming what
an object refers to (its communicator, group, request, datatype, op or message; 0 for a
null object), and ``Class.fromhandle(obj.handle)`` gives a new object equal to ``obj``
(for the 4096 handles read last; an older one is a ValueError). ``toint()`` and ``py2f()`` answer -1, mpi4py's
"no such handle" (its test suite and programs check for it); ``fromint`` and ``f2py``
raise ``NotImplementedError``: pycomm has no MPI ABI integers or Fortran handles.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["install"]

# handle -> an object with that handle (copied by fromhandle), the latest _KEEP asked for;
# the slotted classes take no weak references, so the table is bounded instead
_ALIVE: OrderedDict = OrderedDict()
_KEEP = 4096


def _referent(obj):
    """What ``obj`` refers to (the identity its copies share), or None for a null one."""
    if hasattr(obj, "_start"):                      # a persistent request: its start
        return obj._start
    for slot in ("_c", "_g", "_r", "_data", "_disps", "_d", "_s"):
        if hasattr(obj, slot):
            return getattr(obj, slot)
    return obj.__dict__.get("_handle", obj)         # an Op: Op(other) shares _handle


def _handle(self) -> int:
    ref = _referent(self)
    if ref is None:
        return 0
    key = id(ref)
    _ALIVE[key] = self
    _ALIVE.move_to_end(key)
    if len(_ALIVE) > _KEEP:
        _ALIVE.popitem(last=False)
    return key


def _fromhandle(cls, handle: int):
    """A new object with ``handle`` (0: the null object).

    Raises:
        ValueError: no object with that handle was seen lately in this process.
    """
    if handle == 0:
        return cls()
    try:
        return cls(_ALIVE[handle])
    except KeyError:
        raise ValueError(f"{cls.__name__}.fromhandle: no {cls.__name__} with handle "
                         f"{handle} was seen lately in this process") from None


def _toint(self) -> int:
    return -1


def _not_offered(what: str):
    def method(cls, value: int):
        raise NotImplementedError(f"{cls.__name__}.{what}: pycomm has no "
                                  f"{'Fortran' if what == 'f2py' else 'MPI ABI integer'} "
                                  "handles (toint() and py2f() answer -1)")
    method.__name__ = what
    return classmethod(method)


def _new(cls, *args, **kwargs):
    """``Class.__new__(cls, obj)`` as mpi4py takes it: a subclass's ``__new__`` may pass
    the object to copy (``super().__new__(cls, comm)``); ``__init__`` then copies it."""
    return object.__new__(cls)


def install(*classes) -> None:
    """Give each class the six conversions (``handle`` as a property), and a ``__new__``
    that accepts mpi4py's copy argument where the class has none of its own."""
    for cls in classes:
        if cls.__new__ is object.__new__:
            cls.__new__ = staticmethod(_new)
        cls.handle = property(_handle, doc="Process-local integer naming what this "
                              "object refers to (0 for a null object).")
        cls.fromhandle = classmethod(_fromhandle)
        cls.toint = _toint
        cls.py2f = _toint
        cls.fromint = _not_offered("fromint")
        cls.f2py = _not_offered("f2py")
