"""Reduction operations: MPI's predefined ops and user ops.

Predefined: ``SUM``, ``PROD``, ``MIN``, ``MAX``; the logical ``LAND``, ``LOR``, ``LXOR``
(any non-zero is true; the result is 0 or 1 in the input dtype, MPI-4.0 section 6.9.2);
the bitwise ``BAND``, ``BOR``, ``BXOR`` (integers and bool); and ``MAXLOC``, ``MINLOC`` on
value/index pairs: a numpy structured dtype with two fields, the value first and an
integer index second (:data:`DOUBLE_INT`, :data:`FLOAT_INT`, :data:`LONG_INT`,
:data:`INT_INT`, or any such dtype from :func:`pair_dtype`). MAXLOC keeps the larger value
and, on a tie, the lower index (MINLOC: the smaller value), so the result does not depend
on the order of operands.

An :class:`Op` combines two operands elementwise. MPI's convention is kept throughout:
``apply(inbuf, inoutbuf)`` computes ``inoutbuf = inbuf ∘ inoutbuf`` where ``inbuf`` holds
the partial result of *lower* ranks, so a non-commutative op sees its operands in rank
order (MPI-4.0 section 6.9.5; mpi4py ``Op.Create``). Predefined ops wrap numpy ufuncs and
work in place with ``ufunc(a, b, out=...)``: no temporary arrays.

Collective algorithms call :meth:`Op.apply` and :meth:`Op.apply_left`; the communicator
calls :meth:`Op.check` on the buffer dtype before any byte moves; the object API calls
:meth:`Op.reduce_objects` (also reachable as ``op(a, b)``, as in mpi4py).
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import numpy as np

from pycomm.errors import ArgumentError

__all__ = ["Op", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
           "MAXLOC", "MINLOC", "DOUBLE_INT", "FLOAT_INT", "LONG_INT", "INT_INT", "SHORT_INT",
           "TWOINT", "pair_dtype"]

_KIND_NAMES = {"b": "boolean", "i": "signed integer", "u": "unsigned integer",
               "f": "floating point", "c": "complex", "V": "structured/void",
               "O": "object", "S": "bytes", "U": "str", "M": "datetime", "m": "timedelta"}


def _obj_min(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return b if b < a else a


def _obj_max(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return b if b > a else a


def pair_dtype(value: Any, index: Any = np.int32) -> np.dtype:
    """Return the MAXLOC/MINLOC pair dtype ``[("val", value), ("idx", index)]`` (packed).

    Args:
        value: a numeric (integer or floating) numpy dtype for the value.
        index: an integer numpy dtype for the index (default int32, as MPI's ``*_INT``).
    """
    return np.dtype([("val", np.dtype(value)), ("idx", np.dtype(index))])


# mpi4py's pair datatypes, as numpy structured dtypes (value first, index second). Packed:
# no padding bytes, so equal pairs are equal bytes; any two-field layout is accepted too.
DOUBLE_INT = pair_dtype(np.float64)
FLOAT_INT = pair_dtype(np.float32)
LONG_INT = pair_dtype(np.int64)      # C long on LP64 Linux
INT_INT = pair_dtype(np.int32)
TWOINT = INT_INT                     # MPI's name for the int/int pair
SHORT_INT = pair_dtype(np.int16)


def _pair_fields(dt: np.dtype) -> tuple[str, str] | None:
    """Return (value field, index field) when ``dt`` is a value/index pair dtype."""
    names = dt.names
    if names is None or len(names) != 2:
        return None
    val, idx = (dt.fields[n][0] for n in names)
    if val.kind not in "iuf" or idx.kind not in "iu" or val.shape or idx.shape:
        return None
    return names[0], names[1]


def _loc(better: Callable) -> Callable[[np.ndarray, np.ndarray], None]:
    """Build MAXLOC/MINLOC's in-place kernel: ``inout = in ∘ inout`` on pair arrays."""
    def kernel(inbuf: np.ndarray, inoutbuf: np.ndarray) -> None:
        fv, fi = inoutbuf.dtype.names
        a_val, b_val = inbuf[fv], inoutbuf[fv]
        take = better(a_val, b_val) | ((a_val == b_val) & (inbuf[fi] < inoutbuf[fi]))
        np.copyto(inoutbuf, inbuf, where=take)
    return kernel


def _obj_loc(better: Callable) -> Callable[[Any, Any], Any]:
    """MAXLOC/MINLOC on Python ``(value, index)`` pairs (mpi4py's object semantics)."""
    def pick(a: Any, b: Any) -> Any:
        (u, i), (v, j) = a, b
        if better(u, v):
            return a
        if better(v, u):
            return b
        return a if i <= j else b
    return pick


def _obj_logical(fn: Callable, ufunc: np.ufunc) -> Callable[[Any, Any], Any]:
    def combine(a: Any, b: Any) -> Any:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return ufunc(a, b)
        return fn(a, b)
    return combine


def _arity(fn: Callable) -> int:
    """Return 3 when ``fn`` takes mpi4py's ``(invec, inoutvec, datatype)``, else 2."""
    if isinstance(fn, np.ufunc):
        return 2  # a third positional argument would be taken as ``out``
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 3  # builtins without a signature: assume mpi4py's form
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        raise ArgumentError(f"Op.Create: function {fn!r} must accept (invec, inoutvec) or "
                            f"(invec, inoutvec, datatype); it takes {len(positional)} "
                            "positional argument(s)")
    return 3 if len(positional) >= 3 else 2


class Op:
    """A reduction operation.

    Attributes:
        name: ``"SUM"``, ``"PROD"``, ``"MIN"``, ``"MAX"`` or ``"user:<function name>"``.
        commutative: whether ``a ∘ b == b ∘ a``; algorithms that reorder operands (ring)
            serve only commutative ops. Every op must be associative (MPI's rule).
    """

    def __init__(self, name: str, *, ufunc: np.ufunc | None = None,
                 function: Callable | None = None, commutative: bool = True,
                 kinds: str | None = None, pyfunc: Callable[[Any, Any], Any] | None = None,
                 kernel: Callable[[np.ndarray, np.ndarray], None] | None = None):
        self.name = name
        self.commutative = bool(commutative)
        self._ufunc = ufunc
        self._kernel = kernel  # predefined non-ufunc ops (MAXLOC, MINLOC): inout = in ∘ inout
        self._function = function
        self._nargs = _arity(function) if function is not None else 2
        self._kinds = kinds
        self._pyfunc = pyfunc

    # -- construction -------------------------------------------------------------------
    @classmethod
    def Create(cls, function: Callable, commute: bool = False) -> "Op":  # noqa: N802 (mpi4py)
        """Create a user op from ``function(invec, inoutvec[, datatype])``.

        The function must leave ``invec ∘ inoutvec`` in ``inoutvec`` (numpy arrays of the
        buffer's dtype, same shape; ``invec`` holds the lower ranks' partial). Returning an
        array instead is accepted too: a non-None return value is copied into ``inoutvec``.
        The third argument, when taken, is the numpy dtype (pycomm has no MPI datatypes).

        ``commute`` defaults to False as in mpi4py (the safe choice: a non-commutative op
        declared commutative would silently get the wrong answer from ring algorithms).

        Args:
            function: a callable taking 2 or 3 positional arguments.
            commute: True when the op is commutative.

        Returns:
            The new :class:`Op`.

        Raises:
            ArgumentError: ``function`` is not callable or takes fewer than 2 arguments.
        """
        if not callable(function):
            raise ArgumentError(f"Op.Create: function must be callable, got {function!r}")
        name = getattr(function, "__name__", type(function).__name__)
        return cls(f"user:{name}", function=function, commutative=commute)

    # -- mpi4py-style accessors ---------------------------------------------------------
    def Is_commutative(self) -> bool:  # noqa: N802 (mpi4py name)
        """Return whether the op is commutative (MPI_Op_commutative).

        Returns:
            bool: True when ``a ∘ b == b ∘ a``.

        Raises:
            Nothing.
        """
        return self.commutative

    @property
    def is_commutative(self) -> bool:
        """Whether the op is commutative (mpi4py's property).

        Returns:
            bool: True when ``a ∘ b == b ∘ a``.

        Raises:
            Nothing.
        """
        return self.commutative

    @property
    def is_predefined(self) -> bool:
        """Whether this is one of MPI's predefined ops (SUM ... MINLOC) rather than a user op.

        Returns:
            bool: True for predefined ops, False for ops from :meth:`Create`.

        Raises:
            Nothing.
        """
        return self._ufunc is not None or self._kernel is not None

    def Free(self) -> None:  # noqa: N802 (mpi4py name)
        """Do nothing: kept for mpi4py compatibility, ops hold no resources.

        Returns:
            None.

        Raises:
            Nothing.
        """

    def __repr__(self) -> str:
        return f"<pycomm.Op {self.name}>"

    # -- validation ---------------------------------------------------------------------
    def check(self, dtype: Any) -> None:
        """Check that this op is defined on ``dtype``; called before any byte moves.

        SUM and PROD take integer, unsigned, floating and complex dtypes; MIN and MAX take
        integer, unsigned and floating ones (complex numbers have no order); LAND, LOR and
        LXOR take bool, integer, unsigned and floating ones; BAND, BOR and BXOR bool,
        integer and unsigned ones; MAXLOC and MINLOC a structured dtype of two fields, a
        numeric value then an integer index (:func:`pair_dtype`). User ops accept any
        dtype.

        Args:
            dtype: the buffer's numpy dtype (or anything ``np.dtype`` accepts).

        Returns:
            None.

        Raises:
            ArgumentError: the op is not defined on ``dtype``; the message says which
                dtypes it accepts.
            TypeError: ``dtype`` is not a numpy dtype (predefined ops only).
        """
        if self._kinds is None:
            return
        dt = np.dtype(dtype)
        if self._kinds == "pair":
            if _pair_fields(dt) is None:
                raise ArgumentError(f"op {self.name} is not defined for dtype {dt}; it needs "
                                    "a value/index pair: a structured dtype of two fields, a "
                                    "numeric value then an integer index, e.g. "
                                    "pycomm.ops.DOUBLE_INT")
            return
        if dt.kind not in self._kinds or dt.names is not None:
            accepted = ", ".join(_KIND_NAMES[k] for k in self._kinds)
            raise ArgumentError(f"op {self.name} is not defined for dtype {dt} "
                                f"({_KIND_NAMES.get(dt.kind, dt.kind)}); it accepts "
                                f"{accepted} dtypes")

    # -- buffers ------------------------------------------------------------------------
    def apply(self, inbuf: np.ndarray, inoutbuf: np.ndarray) -> None:
        """Compute ``inoutbuf[:] = inbuf ∘ inoutbuf`` in place.

        Args:
            inbuf: the left operand (lower ranks' partial); not modified by predefined ops.
            inoutbuf: the right operand; receives the result. Same shape and dtype.

        Returns:
            None.

        Raises:
            Exception: what numpy raises for operands of different shapes (ValueError), or
                what a user op's function raises.
        """
        if self._ufunc is not None:
            self._ufunc(inbuf, inoutbuf, out=inoutbuf)
        elif self._kernel is not None:
            self._kernel(inbuf, inoutbuf)
        else:
            self._call_user(inbuf, inoutbuf)

    def apply_left(self, inoutbuf: np.ndarray, inbuf: np.ndarray) -> None:
        """Compute ``inoutbuf[:] = inoutbuf ∘ inbuf``: here ``inoutbuf`` is the left operand.

        Used when the local partial belongs to lower ranks than the received one.

        Args:
            inoutbuf: the left operand; receives the result.
            inbuf: the right operand, same shape and dtype; treated as scratch (a user op
                and MAXLOC/MINLOC write into it).

        Returns:
            None.

        Raises:
            Exception: what numpy raises for operands of different shapes (ValueError), or
                what a user op's function raises.
        """
        if self._ufunc is not None:
            self._ufunc(inoutbuf, inbuf, out=inoutbuf)
        elif self._kernel is not None:
            self._kernel(inoutbuf, inbuf)
            inoutbuf[...] = inbuf
        else:
            self._call_user(inoutbuf, inbuf)
            inoutbuf[...] = inbuf

    def _call_user(self, invec: np.ndarray, inoutvec: np.ndarray) -> None:
        if self._nargs == 3:
            result = self._function(invec, inoutvec, inoutvec.dtype)
        else:
            result = self._function(invec, inoutvec)
        if result is not None and result is not inoutvec:
            inoutvec[...] = result

    # -- Python objects -----------------------------------------------------------------
    def reduce_objects(self, a: Any, b: Any) -> Any:
        """Combine two Python objects, ``a`` from lower ranks, as mpi4py does (also ``op(a, b)``).

        ``a + b``, ``a * b``, min, max; ``a and b``, ``a or b``, ``bool(a) != bool(b)``;
        ``a & b``, ``a | b``, ``a ^ b``; MAXLOC/MINLOC on ``(value, index)`` tuples (lower
        index on ties). Numpy arrays go through the matching ufunc.

        For a user op the function is called as ``function(a, b[, None])``; its return
        value is the result, or ``b`` when it returns None (it updated ``b`` in place).

        Args:
            a: the left operand (the lower ranks' partial result).
            b: the right operand.

        Returns:
            The combined object.

        Raises:
            Exception: what the operation raises on these objects (e.g. TypeError for
                ``+`` on a str and an int), or what a user op's function raises.
        """
        if self._pyfunc is not None:
            return self._pyfunc(a, b)
        if self._nargs == 3:
            result = self._function(a, b, None)
        else:
            result = self._function(a, b)
        return b if result is None else result

    __call__ = reduce_objects


SUM = Op("SUM", ufunc=np.add, kinds="iufc", pyfunc=operator.add)
PROD = Op("PROD", ufunc=np.multiply, kinds="iufc", pyfunc=operator.mul)
MIN = Op("MIN", ufunc=np.minimum, kinds="iuf", pyfunc=_obj_min)
MAX = Op("MAX", ufunc=np.maximum, kinds="iuf", pyfunc=_obj_max)
# Logical ufuncs return bool; ``out=`` casts it to 0/1 in the buffer's own dtype.
LAND = Op("LAND", ufunc=np.logical_and, kinds="biuf",
          pyfunc=_obj_logical(lambda a, b: a and b, np.logical_and))
LOR = Op("LOR", ufunc=np.logical_or, kinds="biuf",
         pyfunc=_obj_logical(lambda a, b: a or b, np.logical_or))
LXOR = Op("LXOR", ufunc=np.logical_xor, kinds="biuf",
          pyfunc=_obj_logical(lambda a, b: (not a) != (not b), np.logical_xor))
BAND = Op("BAND", ufunc=np.bitwise_and, kinds="biu", pyfunc=operator.and_)
BOR = Op("BOR", ufunc=np.bitwise_or, kinds="biu", pyfunc=operator.or_)
BXOR = Op("BXOR", ufunc=np.bitwise_xor, kinds="biu", pyfunc=operator.xor)
MAXLOC = Op("MAXLOC", kernel=_loc(np.greater), kinds="pair", pyfunc=_obj_loc(operator.gt))
MINLOC = Op("MINLOC", kernel=_loc(np.less), kinds="pair", pyfunc=_obj_loc(operator.lt))
