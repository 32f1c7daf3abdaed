"""``MPI.Op``: pycomm's reduction ops with mpi4py's ``Op.Create`` and ``Reduce_local``.

The predefined ops are pycomm's own, as ``MPI.Op`` instances (``MPI.SUM`` reduces as
``pycomm.SUM`` does and has ``Reduce_local``), plus ``REPLACE`` (keep
the incoming operand, ``REPLACE(a, b) == b``), ``NO_OP`` (keep the target,
``NO_OP(a, b) == a``) and ``OP_NULL``. ``isinstance(op, MPI.Op)`` holds for every pycomm
op. ``MPI.Op.Create(function, commute)`` takes mpi4py's user function
``function(inbuf, inoutbuf, datatype)``: the buffers are numpy arrays of the message's
type (they support the buffer protocol, so ``np.frombuffer(inbuf, ...)`` keeps working)
and ``datatype`` is the ``MPI.Datatype`` of their dtype (``MPI.DOUBLE``...).

At most :data:`MAX_USER_OP` (32) user ops made by ``MPI.Op.Create`` are alive at a time,
as in mpi4py, whose C trampolines have that many slots: the next ``Create`` raises
``RuntimeError`` until one is freed (``Free``) or garbage-collected. pycomm needs no such
slots, but a program that runs under mpi4py must meet the same limit here, and one tested
against it (mpi4py's test_op does) must see it. ``pycomm.Op.Create`` has no limit.
"""

from __future__ import annotations

import copyreg
import threading
import weakref

import numpy as np

from pycomm import ops as _ops
from pycomm.ops import Op as _Op
from pycomm.ops import _arity

from .exceptions import translate_methods
from .msgspec import message
from .predefined import from_numpy

__all__ = [
    "BAND",
    "BOR",
    "BXOR",
    "LAND",
    "LOR",
    "LXOR",
    "MAX",
    "MAXLOC",
    "MIN",
    "MINLOC",
    "NO_OP",
    "OP_NULL",
    "PROD",
    "REPLACE",
    "SUM",
    "MAX_USER_OP",
    "Op",
    "with_datatype",
    "whole_items",
]


MAX_USER_OP = 32
_user_slots: list = [None] * MAX_USER_OP     # weak references to the live user ops
_slots_lock = threading.Lock()


def _take_slot(op) -> int:
    with _slots_lock:
        for i, ref in enumerate(_user_slots):
            if ref is None or ref() is None:
                _user_slots[i] = weakref.ref(op)
                return i
    raise RuntimeError(f"Op.Create: cannot create more than {MAX_USER_OP} user-defined "
                       "reduction operations at a time (mpi4py's limit); Free() one first")


class _OpType(type):
    """Every pycomm op is an ``MPI.Op`` (``isinstance(MPI.SUM, MPI.Op)``)."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _Op)


@translate_methods
class Op(_Op, metaclass=_OpType):
    """A reduction operation (mpi4py's ``MPI.Op``); see the module docstring."""

    def __init__(self, op: _Op | None = None):
        """``Op(other)``: the same op (a new handle to it); ``Op()``: ``OP_NULL``."""
        src = OP_NULL if op is None else op
        if not isinstance(src, _Op):
            raise TypeError(f"Op({op!r}): expected an MPI.Op")
        self.__dict__.update(src.__dict__)

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Op):
            return NotImplemented
        return self is other or self.__dict__.get("_handle", self) is \
            other.__dict__.get("_handle", other)

    def __hash__(self) -> int:
        return id(self.__dict__.get("_handle", self))

    def __bool__(self) -> bool:
        return self.name != "OP_NULL"

    def __reduce__(self):
        if self.name in _PREDEFINED and self is _PREDEFINED[self.name]:
            return _predefined, (self.name,)
        if self.name in _PREDEFINED:                # a copy: of the same class
            return copyreg.__newobj__, (type(self), _PREDEFINED[self.name])
        user = self.__dict__.get("_user")
        if user is None:
            raise ValueError(f"cannot pickle {self!r}: a user-defined op made from an "
                             "integer handle has no function to send (as in mpi4py)")
        return Op.Create, user

    @classmethod
    def Create(cls, function, commute: bool = False) -> Op:
        """A user op from ``function(inbuf, inoutbuf[, datatype])`` leaving
        ``inbuf ∘ inoutbuf`` in ``inoutbuf``; ``commute``: the op is commutative."""
        op = _Op.Create(function, commute)
        if callable(function) and _arity(function) == 3:
            def call(invec, inoutvec, dtype, _f=function):
                return _f(invec, inoutvec, from_numpy(np.dtype(dtype)) if dtype is not None
                          else None)
            call.__name__ = getattr(function, "__name__", "user")
            op = _Op.Create(call, commute)
            op._nargs = 3
        out = cls.__new__(cls)
        out.__dict__.update(op.__dict__)
        out._handle, out._user = object(), (function, bool(commute))
        out._slot = _take_slot(out)
        return out

    def Free(self) -> None:
        """Release a user op: this handle becomes ``OP_NULL`` (as mpi4py's on MPICH);
        predefined ops cannot be freed.

        Raises:
            MPI.Exception (ERR_OP): a predefined op.
        """
        if self.is_predefined:
            from pycomm.errors import ArgumentError

            from .exceptions import mpi_error
            raise mpi_error(ArgumentError, "ERR_OP", f"Op.Free: {self.name} is predefined")
        slot = self.__dict__.pop("_slot", None)
        if slot is not None:
            with _slots_lock:
                held = _user_slots[slot]() if _user_slots[slot] is not None else None
                if held is not None and held == self:   # this op or a copy (one handle)
                    _user_slots[slot] = None
        self.__dict__.clear()
        self.__dict__.update(OP_NULL.__dict__)

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """``inoutbuf = inbuf ∘ inoutbuf`` on this process (message specs of one type)."""
        a = message(inbuf, "Op.Reduce_local", "inbuf", writable=False)
        b = message(inoutbuf, "Op.Reduce_local", "inoutbuf", writable=True)
        _reduce_local(self, a, b)


def with_datatype(op: _Op, datatype) -> _Op:
    """``op``, or for a user op of mpi4py's form ``function(inbuf, inoutbuf, datatype)``
    a copy that hands ``function`` the predefined ``datatype`` the message named.

    A uint8 buffer sent as ``MPI.BYTE`` must reach the function as ``MPI.BYTE`` (mpi4py
    passes the call's datatype), not as the ``UNSIGNED_CHAR`` its numpy dtype maps to.
    """
    user = op.__dict__.get("_user")
    if user is None or datatype is None or getattr(op, "_nargs", 2) != 3:
        return op
    # one copy per datatype, kept on the op: calls are signed by op (a new op per call
    # would fill the signature cache)
    bound = op.__dict__.setdefault("_bound", {})
    key = id(datatype._data)            # handles are unhashable; the bound op keeps it
    hit = bound.get(key)
    if hit is None:
        hit = bound[key] = _bind(op, user, datatype)
    return hit


def whole_items(op: _Op, basic: np.dtype) -> _Op:
    """A copy of the user op ``op`` for buffers viewed as one opaque item per datatype
    item (:func:`pycomm.MPI.collspec.item_array`), of basic elements of dtype ``basic``.

    The Communicator's schedules then split buffers only between items, and the copy's
    function gets the flat ``basic`` elements of whole items, as without the view (a 1-D
    view of the same memory: no per-item work). One copy per basic dtype, kept on the op
    (calls are signed by the op's name, so each call must not make a new op); the copy
    holds the function, not the op (no cycle: a dropped op is freed at once).

    Args:
        op: a user op (one with a Python function, from ``Op.Create`` or
            :func:`with_datatype`).
        basic: the numpy dtype of the datatype's basic elements.

    Returns:
        The op to hand the Communicator, named as ``op``.

    Raises:
        Nothing here; a call of the copy raises what ``op``'s function raises, and
        ValueError (numpy's) for buffers whose bytes are not whole ``basic`` elements.
    """
    cache = op.__dict__.setdefault("_whole", {})
    hit = cache.get(basic)
    if hit is None:
        function, nargs = op._function, op._nargs

        def call(invec, inoutvec):
            a, b = invec.view(basic).reshape(-1), inoutvec.view(basic).reshape(-1)
            result = function(a, b, basic) if nargs == 3 else function(a, b)
            if result is not None and result is not b:
                b[...] = result
        call.__name__ = getattr(function, "__name__", "user")
        hit = _Op.Create(call, op.commutative)
        hit.name = op.name
        cache[basic] = hit
    return hit


def _bind(op: _Op, user: tuple, datatype) -> _Op:
    function, commute = user
    wire = datatype.wire_dtype()

    def call(invec, inoutvec, dtype, _f=function):
        if dtype is None:                               # objects: no datatype
            return _f(invec, inoutvec, None)
        named = datatype if np.dtype(dtype) == wire else from_numpy(np.dtype(dtype))
        return _f(invec, inoutvec, named)
    call.__name__ = getattr(function, "__name__", "user")
    out = _Op.Create(call, commute)
    out._nargs = 3
    out.name = op.name      # calls are matched by the op's name on every rank
    return out


def _reduce_local(op: _Op, a, b) -> None:
    from pycomm.errors import InvalidBufferError

    from .exceptions import mpi_error
    if a.array.dtype != b.array.dtype or a.array.size != b.array.size:
        raise mpi_error(InvalidBufferError, "ERR_BUFFER", f"Op.Reduce_local: inbuf has "
                        f"{a.array.size} x {a.array.dtype}, inoutbuf {b.array.size} x "
                        f"{b.array.dtype}")
    op = with_datatype(op, b.datatype)
    op.check(b.array.dtype)
    op.apply(a.array, b.array)
    b.finish()


def _facade(op: _Op) -> Op:
    """The same op as an ``MPI.Op`` (same name and kernels, so ranks mixing ``MPI.SUM``
    and ``pycomm.SUM`` agree: calls are matched by the op's name)."""
    out = Op.__new__(Op)
    out.__dict__.update(op.__dict__)
    out._handle = object()
    return out


def _predefined(name: str) -> Op:
    return _PREDEFINED[name]


def _op_null(*args):
    raise ValueError("OP_NULL is not an operation")


SUM, PROD, MIN, MAX = (_facade(o) for o in (_ops.SUM, _ops.PROD, _ops.MIN, _ops.MAX))
LAND, LOR, LXOR = (_facade(o) for o in (_ops.LAND, _ops.LOR, _ops.LXOR))
BAND, BOR, BXOR = (_facade(o) for o in (_ops.BAND, _ops.BOR, _ops.BXOR))
MAXLOC, MINLOC = _facade(_ops.MAXLOC), _facade(_ops.MINLOC)
REPLACE = _facade(_Op("REPLACE", kernel=lambda inbuf, inoutbuf: None,
                      pyfunc=lambda a, b: b))
NO_OP = _facade(_Op("NO_OP", kernel=lambda inbuf, inoutbuf: inoutbuf.__setitem__(..., inbuf),
                    pyfunc=lambda a, b: a))
OP_NULL = _facade(_Op("OP_NULL", kernel=lambda inbuf, inoutbuf: _op_null(),
                      pyfunc=_op_null))
_PREDEFINED = {op.name: op for op in (SUM, PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR,
                                      MAXLOC, MINLOC, REPLACE, NO_OP, OP_NULL)}
