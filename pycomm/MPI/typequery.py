"""Datatype queries of MPI 4.1: ``Datatype.Match_size`` and ``Datatype.Get_value_index``.

Both answer with predefined types of :mod:`pycomm.MPI.predefined`: ``Match_size`` the
Fortran kind of a type class and byte size (``INTEGER4``, ``REAL8``, ``COMPLEX16``,
``LOGICAL1``...), ``Get_value_index`` the value/index pair type that MAXLOC and MINLOC
reduce (``DOUBLE_INT``...). Installed on :class:`~pycomm.MPI.datatypes.Datatype` as static
methods by :mod:`pycomm.MPI.predefined`.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError

from .datatypes import (DATATYPE_NULL, TYPECLASS_COMPLEX, TYPECLASS_INTEGER, TYPECLASS_LOGICAL,
                        TYPECLASS_REAL, Datatype)
from .exceptions import mpi_error

__all__ = ["get_value_index", "match_size"]

_KINDS = {TYPECLASS_INTEGER: "INTEGER", TYPECLASS_REAL: "REAL", TYPECLASS_COMPLEX: "COMPLEX",
          TYPECLASS_LOGICAL: "LOGICAL"}
_PAIRS = ("SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "LONG_DOUBLE")


def match_size(typeclass: int, size: int) -> Datatype:
    """The predefined Fortran type of ``typeclass`` (``TYPECLASS_INTEGER``, ``_REAL``,
    ``_COMPLEX``, ``_LOGICAL``) that is ``size`` bytes (``MPI_Type_match_size``).

    Raises:
        MPI.Exception: ``ERR_ARG`` for an unknown type class or a size with no type
            (numpy has no 16-byte integers or quad precision).
    """
    from .msgspec import as_int         # (msgspec imports predefined, which imports us)
    from .predefined import PREDEFINED
    w = "Datatype.Match_size"
    kind = _KINDS.get(as_int(typeclass, "typeclass", w))
    if kind is None:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: typeclass {typeclass!r} is not one "
                        "of TYPECLASS_INTEGER, TYPECLASS_REAL, TYPECLASS_COMPLEX, "
                        "TYPECLASS_LOGICAL")
    size = as_int(size, "size", w)
    out = PREDEFINED.get(f"{kind}{size}", DATATYPE_NULL)
    if out is DATATYPE_NULL:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: no {kind} type of {size} bytes")
    return out


def get_value_index(value: Datatype, index: Datatype) -> Datatype:
    """The pair type ``{value; index}`` (``MPI_Type_get_value_index``): ``FLOAT_INT``,
    ``DOUBLE_INT``, ``LONG_INT``, ``INT_INT``, ``SHORT_INT``, ``LONG_DOUBLE_INT`` for an
    ``INT`` index; ``DATATYPE_NULL`` for any other combination.

    Raises:
        MPI.Exception: ``ERR_TYPE`` when either argument is ``DATATYPE_NULL``.
    """
    from .predefined import PREDEFINED
    for arg, dt in (("value", value), ("index", index)):
        if not isinstance(dt, Datatype) or dt == DATATYPE_NULL:
            raise mpi_error(ArgumentError, "ERR_TYPE", f"Datatype.Get_value_index: {arg} "
                            f"must be a datatype, got {dt!r}")
    if index == PREDEFINED["INT"]:
        for name in _PAIRS:
            if value == PREDEFINED[name]:
                return PREDEFINED["INT_INT" if name == "INT" else f"{name}_INT"]
    return DATATYPE_NULL
