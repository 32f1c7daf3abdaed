"""Reduction operations: the predefined ``SUM``, ``PROD``, ``MIN``, ``MAX`` and user ops.

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

__all__ = ["Op", "SUM", "PROD", "MIN", "MAX"]

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
                 kinds: str | None = None, pyfunc: Callable[[Any, Any], Any] | None = None):
        self.name = name
        self.commutative = bool(commutative)
        self._ufunc = ufunc
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
        """Return whether the op is commutative."""
        return self.commutative

    @property
    def is_commutative(self) -> bool:
        """Whether the op is commutative (mpi4py property)."""
        return self.commutative

    @property
    def is_predefined(self) -> bool:
        """True for SUM/PROD/MIN/MAX."""
        return self._ufunc is not None

    def Free(self) -> None:  # noqa: N802 (mpi4py name)
        """Do nothing: kept for mpi4py compatibility, ops hold no resources."""

    def __repr__(self) -> str:
        return f"<pycomm.Op {self.name}>"

    # -- validation ---------------------------------------------------------------------
    def check(self, dtype: Any) -> None:
        """Check that this op is defined on ``dtype``; called before any byte moves.

        SUM and PROD take integer, unsigned, floating and complex dtypes; MIN and MAX take
        integer, unsigned and floating ones (complex numbers have no order). User ops
        accept any dtype.

        Raises:
            ArgumentError: the op is not defined on ``dtype``; the message says which
                kinds it accepts.
        """
        if self._kinds is None:
            return
        dt = np.dtype(dtype)
        if dt.kind not in self._kinds:
            accepted = ", ".join(_KIND_NAMES[k] for k in self._kinds)
            raise ArgumentError(f"op {self.name} is not defined for dtype {dt} "
                                f"({_KIND_NAMES.get(dt.kind, dt.kind)}); it accepts "
                                f"{accepted} dtypes")

    # -- buffers ------------------------------------------------------------------------
    def apply(self, inbuf: np.ndarray, inoutbuf: np.ndarray) -> None:
        """Compute ``inoutbuf[:] = inbuf ∘ inoutbuf`` in place.

        Args:
            inbuf: the left operand (lower ranks' partial); not modified.
            inoutbuf: the right operand; receives the result. Same shape and dtype.
        """
        if self._ufunc is not None:
            self._ufunc(inbuf, inoutbuf, out=inoutbuf)
        else:
            self._call_user(inbuf, inoutbuf)

    def apply_left(self, inoutbuf: np.ndarray, inbuf: np.ndarray) -> None:
        """Compute ``inoutbuf[:] = inoutbuf ∘ inbuf``: here ``inoutbuf`` is the left operand.

        Used when the local partial belongs to lower ranks than the received one.

        Args:
            inoutbuf: the left operand; receives the result.
            inbuf: the right operand; treated as scratch (a user op writes into it).
        """
        if self._ufunc is not None:
            self._ufunc(inoutbuf, inbuf, out=inoutbuf)
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
        """Combine two Python objects, ``a`` from lower ranks: ``a + b``, ``a * b``, min, max.

        For a user op the function is called as ``function(a, b[, None])``; its return
        value is the result, or ``b`` when it returns None (it updated ``b`` in place).
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
