"""mpi4py's object model on pycomm.MPI's handle classes.

What every handle class (``Comm``, ``Datatype``, ``Request``... and ``Status``) shares
with mpi4py's Cython classes, installed by :mod:`pycomm.MPI` once they all exist:

* **construction in** ``__new__``: ``Class(other)`` copies ``other`` in ``__new__``, as
  mpi4py's ``__cinit__``; ``__init__`` then does nothing. A subclass whose ``__new__``
  passes something else up (``super().__new__(cls, comm.Create_cart(dims))``) gets that
  object, not the argument it was called with, and the class's check (a Cartcomm needs a
  Cartesian communicator) applies to what ``__new__`` was given. The classes' own
  ``__init__`` methods stay the copy-and-check code; they run only from ``__new__``.
* **unhashable**, as mpi4py's handles (``hash(MPI.COMM_WORLD)`` is a ``TypeError``),
  except ``Op``: an ``MPI.Op`` is a :class:`pycomm.ops.Op`, and pycomm's collectives
  cache each call's signature by its op. Every handle takes weak references.
* ``free()``: nothing for a module constant (``MPI.INT``, ``MPI.COMM_WORLD``...) or a
  null handle; a copy of a predefined object (``MPI.Datatype(MPI.INT)``) only becomes
  null; any other handle is freed (``Free``, ``Close`` for a file, ``Finalize`` for a
  session).
* ``MPI._sizeof``, ``MPI._addressof``, ``MPI._handleof`` (see each).
"""

from __future__ import annotations

import functools
import threading

__all__ = ["CONSTANTS", "add_constant", "addressof", "constants", "handleof", "install",
           "is_named", "kind_of", "sizeof"]

# MPICH's sizeof(MPI_<Class>) (bytes): its handles are C ints, MPI_File a pointer, and
# MPI_Status five ints (mpi4py 4.1.2 + MPICH 5.0.2: MPI._sizeof)
_SIZES = {"Status": 20, "File": 8}
_KINDS = ("Status", "Datatype", "Request", "Message", "Op", "Group", "Info", "Errhandler",
          "Session", "Comm", "Win", "File")
_building = threading.local()      # .obj: the object a __new__ is building on this thread
_CLASSES: dict[str, type] = {}     # kind name -> pycomm.MPI's class
CONSTANTS: dict[int, object] = {}  # id -> a module constant (kept alive, never freed)
_BY_KIND: dict[str, list] = {}     # kind name -> its module constants


def _guarded(init):
    """``init`` run only for the object a ``__new__`` of this thread is building."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if getattr(_building, "obj", None) is self:
            init(self, *args, **kwargs)
    __init__._pycomm_init = init
    return __init__


def _pycomm_init(cls):
    """The (guarded) ``__init__`` of the nearest pycomm.MPI class in ``cls``'s MRO."""
    for k in cls.__mro__:
        f = vars(k).get("__init__")
        if f is not None and hasattr(f, "_pycomm_init"):
            return f
    raise TypeError(f"{cls.__name__}: not a pycomm.MPI handle class")


def _new(cls, *args, **kwargs):
    """``Class.__new__(cls, other=None)``: a new handle of ``cls``, a copy of ``other``.

    Raises:
        TypeError: ``other`` is not of the class's kind (or not a handle at all).
    """
    obj = object.__new__(cls)
    outer = getattr(_building, "obj", None)
    _building.obj = obj
    try:
        _pycomm_init(cls)(obj, *args, **kwargs)
    finally:
        _building.obj = outer
    return obj


def _nullify(obj) -> None:
    """Make ``obj`` its class's null handle (a handle's ``__new__`` with no argument)."""
    outer = getattr(_building, "obj", None)
    _building.obj = obj
    try:
        _pycomm_init(type(obj))(obj)
    finally:
        _building.obj = outer


def _kind(obj) -> str | None:
    """``obj``'s kind: the name of the handle class it is an instance (or, for a class,
    a subclass) of."""
    test = issubclass if isinstance(obj, type) else isinstance
    for name in _KINDS:
        cls = _CLASSES.get(name)
        if cls is not None and test(obj, cls):
            return name
    return None


def is_named(obj) -> bool:
    """Whether ``obj`` is a handle to a predefined object (``MPI.INT``, a
    ``Datatype(MPI.INT)`` copy, ``COMM_WORLD``...; null handles included)."""
    if not obj:
        return True
    return any(c == obj for c in _BY_KIND.get(_kind(obj), ()))


def _free(self) -> None:
    """Free this handle unless it is null or a module constant; a copy of a predefined
    object becomes null (mpi4py's ``free()``)."""
    if id(self) in CONSTANTS or not self:
        return
    if _kind(self) != "Errhandler" and is_named(self):
        _nullify(self)
        return
    for method in ("Free", "Close", "Finalize"):
        if hasattr(self, method):
            getattr(self, method)()
            return


def sizeof(arg) -> int:
    """Size in bytes of the MPI handle of a handle class or instance (MPICH's).

    Args:
        arg: an ``MPI.Comm``/``Datatype``/... class or instance, or ``MPI.Status``.

    Returns:
        int: 4 for handles, 8 for ``File``, 20 for ``Status`` (MPICH's ABI).

    Raises:
        TypeError: ``arg`` is neither an MPI class nor an instance of one.
    """
    for name in _KINDS:
        cls = _CLASSES[name]
        if (issubclass(arg, cls) if isinstance(arg, type) else isinstance(arg, cls)):
            return _SIZES.get(name, 4)
    raise TypeError(f"MPI._sizeof: expecting an MPI type or instance, got {arg!r}")


def addressof(arg) -> int:
    """The memory address of a handle object's state.

    pycomm has no C handles: a ``Status``'s address is that of its five C ints (what
    ``tomemory()`` views); any other handle's is the Python object's own address.

    Args:
        arg: an MPI handle instance.

    Returns:
        int: a non-zero address.

    Raises:
        TypeError: ``arg`` is not an MPI instance.
    """
    kind = _kind(arg)
    if kind is None:
        raise TypeError(f"MPI._addressof: expecting an MPI instance, got {arg!r}")
    if kind == "Status":
        return arg._mem.buffer_info()[0]
    return id(arg)


def handleof(arg) -> int:
    """The integer of a handle (``arg.handle``); a ``Status``'s is its address.

    Args:
        arg: an MPI handle instance.

    Returns:
        int: a non-negative integer.

    Raises:
        TypeError: ``arg`` is not an MPI instance.
    """
    kind = _kind(arg)
    if kind is None:
        raise TypeError(f"MPI._handleof: expecting an MPI instance, got {arg!r}")
    return addressof(arg) if kind == "Status" else arg.handle


def install(ns: dict) -> None:
    """Give the classes of the ``pycomm.MPI`` namespace ``ns`` the model above, and
    record its module constants."""
    for name in _KINDS:
        _CLASSES[name] = ns[name]
    seen, todo = set(), [ns[name] for name in _KINDS]
    while todo:                                  # every pycomm.MPI class of each kind
        cls = todo.pop()
        if cls in seen or not cls.__module__.startswith("pycomm."):
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        init = vars(cls).get("__init__")
        if init is not None and not hasattr(init, "_pycomm_init"):
            cls.__init__ = _guarded(init)
    for name in _KINDS:
        cls = _CLASSES[name]
        cls.__new__ = staticmethod(_new)
        if name != "Op":                # pycomm's call signatures are cached by op
            cls.__hash__ = None
        if name != "Status":
            cls.free = _free
    for value in list(ns.values()):
        if not isinstance(value, type) and _kind(value) not in (None, "Status"):
            add_constant(value)


def kind_of(obj) -> str | None:
    """The name of ``obj``'s handle class (``"Comm"``, ``"Datatype"``...; ``obj`` may be
    the class itself or a subclass), or None."""
    return _kind(obj)


def constants(kind: str) -> list:
    """The module constants of one handle class (``"Comm"``...)."""
    return _BY_KIND.get(kind, [])


def add_constant(obj) -> None:
    """Record a module constant (``COMM_WORLD`` is made on first use, after install)."""
    if id(obj) not in CONSTANTS:
        CONSTANTS[id(obj)] = obj
        _BY_KIND.setdefault(_kind(obj), []).append(obj)

