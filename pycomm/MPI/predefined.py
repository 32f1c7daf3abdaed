"""The predefined MPI datatypes (``MPI.DOUBLE``...), the typecode map and the conversion
of whatever mpi4py accepts as a datatype (a Datatype, a typecode, a numpy dtype).

Sizes follow C on LP64 Linux (``long`` is 8 bytes); the pair types used by MAXLOC and
MINLOC have the C struct layout (``DOUBLE_INT``: size 12, extent 16), numpy structured
dtypes that :mod:`pycomm.ops` accepts. ``TYPEDICT`` is mpi4py's ``_typedict``: numpy and
PEP 3118 codes to types, C names first (with ``TYPEDICT_C`` and ``TYPEDICT_F``, mpi4py's
``_typedict_c`` and ``_typedict_f``).
"""

from __future__ import annotations

import numpy as np

from .datatypes import DATATYPE_NULL, Datatype, _data_size
from .darray import create_darray
from .decode import record_ctors as _record_ctors
from .typequery import (
    create_f90_complex,
    create_f90_integer,
    create_f90_real,
    get_value_index,
    match_size,
)

__all__ = ["PREDEFINED", "TYPEDICT", "TYPEDICT_C", "TYPEDICT_F", "from_numpy",
           "to_datatype", "typecode"]


def _predefined(name: str) -> Datatype:
    return PREDEFINED[name]


def _copy_of(name: str, cls: type = Datatype) -> Datatype:
    """A new handle of class ``cls`` equal to predefined type ``name`` (how
    ``Datatype(MPI.INT)``, or a subclass's ``MyDatatype(MPI.INT)``, unpickles)."""
    return cls.__new__(cls, PREDEFINED[name])



def _long(code: str) -> np.dtype:
    """C ``long``'s dtype, marked with its external32 size (4 bytes, where LONG_LONG's
    dtype, equal to it here, has 8: :mod:`pycomm.MPI.external32`)."""
    return np.dtype(np.dtype(code).str, metadata={"external32": 4})


def _pair(value) -> np.dtype:
    """C layout of MPI's value/int pair types (``struct {T val; int idx;}``: padded)."""
    return np.dtype([("val", np.dtype(value)), ("idx", np.int32)], align=True)


# name -> (numpy dtype, mpi4py's type code or None): the code ``tocode()`` returns, a
# character code for C's named types and a type string for the fixed-size ones (mpi4py's
# ``DatatypeCode``, typestr.pxi)
_TABLE = {
    "BYTE": ("u1", "B"), "PACKED": ("u1", "B"), "CHAR": ("S1", "c"), "WCHAR": ("U1", "U"),
    "SIGNED_CHAR": ("i1", "b"), "UNSIGNED_CHAR": ("u1", "B"), "SHORT": ("i2", "h"),
    "UNSIGNED_SHORT": ("u2", "H"), "INT": ("i4", "i"), "UNSIGNED": ("u4", "I"),
    "LONG": (_long("l"), "l"), "UNSIGNED_LONG": (_long("L"), "L"),
    "LONG_LONG": ("i8", "q"), "UNSIGNED_LONG_LONG": ("u8", "Q"), "FLOAT": ("f4", "f"),
    "DOUBLE": ("f8", "d"), "LONG_DOUBLE": ("g", "g"), "C_BOOL": ("?", "b1"),
    "INT8_T": ("i1", "i1"), "INT16_T": ("i2", "i2"), "INT32_T": ("i4", "i4"),
    "INT64_T": ("i8", "i8"), "UINT8_T": ("u1", "u1"), "UINT16_T": ("u2", "u2"),
    "UINT32_T": ("u4", "u4"), "UINT64_T": ("u8", "u8"),
    # MPI 4.1's fixed-size floats (mpi4py 4.1 names them); numpy has no bfloat16
    "FLOAT16_T": ("f2", "e"), "FLOAT32_T": ("f4", "f"), "FLOAT64_T": ("f8", "d"),
    "C_FLOAT_COMPLEX": ("c8", "F"), "C_DOUBLE_COMPLEX": ("c16", "D"),
    "C_LONG_DOUBLE_COMPLEX": ("G", "G"), "CXX_BOOL": ("?", "?"),
    "CXX_FLOAT_COMPLEX": ("c8", "F"), "CXX_DOUBLE_COMPLEX": ("c16", "D"),
    "CXX_LONG_DOUBLE_COMPLEX": ("G", "G"),
    "AINT": ("i8", "p"), "OFFSET": ("i8", "p"), "COUNT": ("i8", "p"),
    # Fortran's basic types, as gfortran lays them out on LP64 Linux
    "CHARACTER": ("S1", "c"), "LOGICAL": ("i4", "i"), "INTEGER": ("i4", "i"),
    "REAL": ("f4", "f"), "DOUBLE_PRECISION": ("f8", "d"), "COMPLEX": ("c8", "F"),
    "DOUBLE_COMPLEX": ("c16", "D"), "INTEGER1": ("i1", "i1"), "INTEGER2": ("i2", "i2"),
    "INTEGER4": ("i4", "i4"), "INTEGER8": ("i8", "i8"), "REAL4": ("f4", "f4"),
    "REAL8": ("f8", "f8"), "COMPLEX8": ("c8", "c8"), "COMPLEX16": ("c16", "c16"),
    "LOGICAL1": ("?", "b1"), "LOGICAL2": ("i2", "i2"), "LOGICAL4": ("i4", "i4"),
    "LOGICAL8": ("i8", "i8"), "REAL2": ("f2", "f2"),
    # value/index pairs for MAXLOC and MINLOC (C struct layout, size without padding)
    "FLOAT_INT": (_pair("f4"), None), "DOUBLE_INT": (_pair("f8"), None),
    "LONG_INT": (_pair("l"), None), "2INT": (_pair("i4"), None),
    "SHORT_INT": (_pair("i2"), None), "LONG_DOUBLE_INT": (_pair("g"), None),
}

PREDEFINED: dict[str, Datatype] = {"DATATYPE_NULL": DATATYPE_NULL}
for _name, (_dt, _code) in _TABLE.items():
    PREDEFINED[_name] = Datatype._basic(f"MPI_{_name}", _dt, _code)
PREDEFINED["TWOINT"] = PREDEFINED["2INT"]
# Fortran kinds numpy cannot hold (16-byte integers, quad precision, half complex): as in
# mpi4py over an MPI that lacks them, they are DATATYPE_NULL
for _name in ("INTEGER16", "REAL16", "COMPLEX4", "COMPLEX32", "LOGICAL16", "BFLOAT16_T"):
    PREDEFINED[_name] = DATATYPE_NULL
PREDEFINED["INT_INT"] = PREDEFINED["2INT"]
# mpi4py's aliases of the same handles
for _alias, _target in {"SIGNED_SHORT": "SHORT", "SIGNED_INT": "INT", "SIGNED_LONG": "LONG",
                        "SIGNED_LONG_LONG": "LONG_LONG", "UNSIGNED_INT": "UNSIGNED",
                        "BOOL": "C_BOOL", "C_COMPLEX": "C_FLOAT_COMPLEX",
                        "F_BOOL": "LOGICAL", "F_INT": "INTEGER", "F_FLOAT": "REAL",
                        "F_DOUBLE": "DOUBLE_PRECISION", "F_COMPLEX": "COMPLEX",
                        "F_FLOAT_COMPLEX": "COMPLEX", "F_DOUBLE_COMPLEX": "DOUBLE_COMPLEX",
                        "LONG_DOUBLE_COMPLEX": "C_LONG_DOUBLE_COMPLEX"}.items():
    PREDEFINED[_alias] = PREDEFINED[_target]


# code -> predefined type: mpi4py's three maps, with its entries (typemap.pxi).
# ``TYPEDICT`` (``MPI._typedict``) takes numpy's and PEP 3118's codes, C names first;
# ``TYPEDICT_C`` (``_typedict_c``) C's types alone, ``TYPEDICT_F`` (``_typedict_f``)
# Fortran's by their ``Create_f90_*``-style letters.
def _map(pairs: str) -> dict[str, Datatype]:
    return {code: PREDEFINED[name] for code, name in (p.split("=") for p in pairs.split())}


_gdt = np.dtype("g")
TYPEDICT_C: dict[str, Datatype] = _map(
    "?=C_BOOL b=SIGNED_CHAR h=SHORT i=INT l=LONG q=LONG_LONG B=UNSIGNED_CHAR "
    "H=UNSIGNED_SHORT I=UNSIGNED L=UNSIGNED_LONG Q=UNSIGNED_LONG_LONG f=FLOAT d=DOUBLE "
    "g=LONG_DOUBLE F=C_FLOAT_COMPLEX D=C_DOUBLE_COMPLEX G=C_LONG_DOUBLE_COMPLEX b1=C_BOOL "
    "i1=INT8_T i2=INT16_T i4=INT32_T i8=INT64_T u1=UINT8_T u2=UINT16_T u4=UINT32_T "
    "u8=UINT64_T f2=FLOAT16_T f4=FLOAT c8=C_FLOAT_COMPLEX f8=DOUBLE c16=C_DOUBLE_COMPLEX "
    f"f{_gdt.itemsize}=LONG_DOUBLE c{2 * _gdt.itemsize}=C_LONG_DOUBLE_COMPLEX")
TYPEDICT: dict[str, Datatype] = {
    **TYPEDICT_C, **_map(
        "e=FLOAT16_T Zf=C_FLOAT_COMPLEX Zd=C_DOUBLE_COMPLEX Zg=C_LONG_DOUBLE_COMPLEX "
        "n=COUNT N=UNSIGNED_LONG p=AINT P=UNSIGNED_LONG c=CHAR a=CHAR S=CHAR S1=CHAR s=CHAR "
        "1s=CHAR U=WCHAR U1=WCHAR u=UINT16_T 1u=UINT16_T w=WCHAR 1w=WCHAR M=INT64_T "
        "M8=INT64_T m=INT64_T m8=INT64_T")}
TYPEDICT_F: dict[str, Datatype] = _map(
    "l=LOGICAL i=INTEGER r=REAL s=REAL d=DOUBLE_PRECISION c=COMPLEX z=DOUBLE_COMPLEX "
    "l1=LOGICAL1 l2=LOGICAL2 l4=LOGICAL4 l8=LOGICAL8 i1=INTEGER1 i2=INTEGER2 i4=INTEGER4 "
    "i8=INTEGER8 r2=REAL2 r4=REAL4 r8=REAL8 c8=COMPLEX8 c16=COMPLEX16")


def fromcode(cls, code: str) -> Datatype:
    """``Datatype.fromcode``: the predefined type of a numpy/PEP 3118 code (``"d"``,
    ``"i4"``, ``"F"``...), from :data:`TYPEDICT` (a class method: ``cls`` is unused).

    Raises:
        ValueError: no predefined type has that code.
    """
    try:
        return TYPEDICT[code]
    except (KeyError, TypeError):
        raise ValueError(f"cannot map code {code!r} to an MPI datatype") from None


def typecode(datatype: Datatype) -> str | None:
    """mpi4py's ``MPI._typecode``: :meth:`Datatype.tocode`'s code, or None where there
    is none (a derived or pair type, ``DATATYPE_NULL``)."""
    try:
        return datatype.tocode()
    except ValueError:
        return None


# the pair types report MPI's data size (no padding), e.g. DOUBLE_INT: size 12, extent 16
for _name in ("FLOAT_INT", "DOUBLE_INT", "LONG_INT", "2INT", "SHORT_INT", "LONG_DOUBLE_INT"):
    PREDEFINED[_name]._size = _data_size(PREDEFINED[_name]._dtypes[0])
PREDEFINED["2INT"]._name = "MPI_2INT"

_KEY_OF = {id(dt._disps): key for key, dt in reversed(list(PREDEFINED.items()))}
_BY_DTYPE: dict[np.dtype, Datatype] = {}


Datatype.Match_size = staticmethod(match_size)
Datatype.fromcode = classmethod(fromcode)
Datatype.Get_value_index = staticmethod(get_value_index)
_record_ctors(Datatype, {"Create_f90_integer": create_f90_integer,
                         "Create_f90_real": create_f90_real,
                         "Create_f90_complex": create_f90_complex,
                         "Create_darray": create_darray})


def from_numpy(dtype: np.dtype) -> Datatype:
    """The datatype of a buffer's own numpy dtype (its type when no datatype is given).

    Predefined types for the standard dtypes (``float64`` -> ``DOUBLE``, ...); a
    structured or other numeric dtype becomes an unnamed contiguous type of it.
    """
    hit = _BY_DTYPE.get(dtype)
    if hit is not None:
        return hit
    dt = np.dtype(dtype)
    out = None
    if dt.fields is None and dt.kind in "biufcSU":
        code = dt.char if dt.kind not in "SU" else dt.kind
        out = TYPEDICT.get(code) if dt.itemsize in (1, 4) or dt.kind not in "SU" else None
        if out is not None and out._dtypes[0].itemsize != dt.itemsize:
            out = None
        if out is None and dt.kind in "SU":
            n = dt.itemsize // (1 if dt.kind == "S" else 4)
            out = PREDEFINED["CHAR" if dt.kind == "S" else "WCHAR"].Create_contiguous(n)
    if out is None:
        out = Datatype._basic("", dt, None)
        out._predefined = False
    _BY_DTYPE[dtype] = out
    return out


def to_datatype(value, what: str) -> Datatype:
    """A Datatype from what mpi4py accepts in its place: a Datatype, a typecode string
    (``"d"``, ``"i4"``...) or a numpy dtype / scalar type.

    Raises:
        TypeError: not a datatype; KeyError: a string that is no typecode (as mpi4py's
        typecode table); ArgumentError: a freed or null datatype.
    """
    if isinstance(value, Datatype):
        value._check_usable(what)
        return value
    if isinstance(value, str):
        hit = TYPEDICT.get(value)
        if hit is not None:
            return hit
        if not (value.isprintable() and value.strip()):   # numpy reads "\0" as bool
            raise KeyError(f"{what}: {value!r} is not a typecode ('d', 'i', 'f8'...)")
    try:
        dt = np.dtype(value)
    except TypeError:
        if isinstance(value, str):
            raise KeyError(f"{what}: {value!r} is not a typecode ('d', 'i', 'f8'...)") \
                from None
        raise TypeError(f"{what}: {value!r} is not a datatype (an MPI.Datatype, a typecode "
                        "such as 'd', or a numpy dtype)") from None
    return from_numpy(dt)
