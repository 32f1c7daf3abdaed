"""Datatype queries of MPI 4.1: ``Datatype.Match_size`` and ``Datatype.Get_value_index``,
and the Fortran 90 parameterized types ``Create_f90_integer``/``_real``/``_complex``.

All answer with predefined types of :mod:`pycomm.MPI.predefined`: ``Match_size`` the
Fortran kind of a type class and byte size (``INTEGER4``, ``REAL8``, ``COMPLEX16``,
``LOGICAL1``...), ``Get_value_index`` the value/index pair type that MAXLOC and MINLOC
reduce (``DOUBLE_INT``...), the F90 constructors a new handle to the smallest kind that
holds the asked decimal range ``r`` (and precision ``p``) as Fortran's
``selected_int_kind``/``selected_real_kind`` choose (MPI-4.0 section 19.1.9): predefined,
not named, with combiner ``COMBINER_F90_*``. Installed on
:class:`~pycomm.MPI.datatypes.Datatype` by :mod:`pycomm.MPI.predefined` (the F90
constructors as class methods, hence their ``cls`` argument).
"""

from __future__ import annotations

from pycomm.errors import ArgumentError

from .datatypes import (DATATYPE_NULL, TYPECLASS_COMPLEX, TYPECLASS_INTEGER, TYPECLASS_LOGICAL,
                        TYPECLASS_REAL, Datatype)
from .exceptions import mpi_error

__all__ = ["create_f90_complex", "typealign", "create_f90_integer", "create_f90_real",
           "get_value_index", "match_size"]

_KINDS = {TYPECLASS_INTEGER: "INTEGER", TYPECLASS_REAL: "REAL", TYPECLASS_COMPLEX: "COMPLEX",
          TYPECLASS_LOGICAL: "LOGICAL"}
_PAIRS = ("SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "LONG_DOUBLE")


def typealign(datatype: Datatype) -> int | None:
    """The alignment in bytes of a predefined datatype as the C compiler lays it out (the
    strictest member's for a value/index pair such as ``DOUBLE_INT``), or None for a
    derived type, ``DATATYPE_NULL`` or a predefined type with no numpy equivalent
    (mpi4py's private ``MPI._typealign``, which ``mpi4py.util.dtlib`` calls). A ``Dup``
    of a basic type has the basic type's alignment, as in mpi4py on MPICH."""
    basic = datatype.typechar not in ("", "V")
    if not (basic or datatype.is_predefined) or len(datatype._dtypes) != 1:
        return None
    return datatype._dtypes[0].alignment


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


# (bytes, largest decimal exponent range, decimal precision) of each kind numpy has
_INT_RANGE = ((1, 2), (2, 4), (4, 9), (8, 18))
_REAL_RANGE = ((4, 37, 6), (8, 307, 15))
_UNDEFINED = -32766


def _f90(kind: str, size: int) -> Datatype:
    from .predefined import PREDEFINED
    out = Datatype(PREDEFINED[f"{kind}{size}"])     # a new handle of the Fortran kind
    return out


def create_f90_integer(cls, r: int) -> Datatype:
    """An integer type of at least ``r`` decimal digits (``INTEGER1`` ... ``INTEGER8``).

    Raises:
        MPI.Exception (ERR_ARG): no integer kind holds 10**r (r > 18).
    """
    from .msgspec import as_int
    r = as_int(r, "r", "Datatype.Create_f90_integer")
    for size, digits in _INT_RANGE:
        if r <= digits:
            return _f90("INTEGER", size)
    raise mpi_error(ArgumentError, "ERR_ARG", f"Datatype.Create_f90_integer: no integer "
                    f"kind has a range of 10**{r}")


def _real_size(p: int, r: int, call: str) -> int:
    from .msgspec import as_int
    p, r = as_int(p, "p", call), as_int(r, "r", call)
    if p == _UNDEFINED and r == _UNDEFINED:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{call}: p and r are both UNDEFINED")
    for size, exp, digits in _REAL_RANGE:
        if (p == _UNDEFINED or p <= digits) and (r == _UNDEFINED or r <= exp):
            return size
    raise mpi_error(ArgumentError, "ERR_ARG", f"{call}: no real kind has precision {p} "
                    f"and range 10**{r} (numpy's widest portable one is REAL8)")


def create_f90_real(cls, p: int, r: int) -> Datatype:
    """A real type of at least ``p`` decimal digits and exponent range ``r``
    (``UNDEFINED``: any); ``REAL4`` or ``REAL8``.

    Raises:
        MPI.Exception (ERR_ARG): no such kind.
    """
    return _f90("REAL", _real_size(p, r, "Datatype.Create_f90_real"))


def create_f90_complex(cls, p: int, r: int) -> Datatype:
    """A complex type whose parts are as :func:`create_f90_real` chooses (``COMPLEX8``
    or ``COMPLEX16``)."""
    return _f90("COMPLEX", 2 * _real_size(p, r, "Datatype.Create_f90_complex"))
