"""Turning user buffers into flat numpy views, with the checks MPI users expect.

Accepted: any C-contiguous numpy array of a numeric or boolean dtype (or of records of
numeric fields, or of opaque fixed-size items: a plain void dtype such as
``np.dtype("V16")``, which only user ops can reduce), any object exposing the buffer
protocol (bytes, bytearray, array.array, memoryview), and mpi4py's buffer specifications
``[buf, datatype]`` / ``[buf, count, datatype]`` (the datatype is checked against the
array's dtype when it is a numpy dtype or type, ignored when it is None).
Every check runs before any byte moves and names the rank, the argument and the value.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidBufferError

__all__ = ["as_array", "byte_view", "CheckedVector", "InPlace", "IN_PLACE"]


class InPlace:
    """Marker for MPI_IN_PLACE (``pycomm.IN_PLACE``)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "pycomm.IN_PLACE"


IN_PLACE = InPlace()

_NUMERIC = frozenset("biufc?")
# the numeric dtypes in native byte order: a set lookup, where reading .kind makes a string
_NATIVE_NUMERIC = frozenset(np.dtype(c) for c in "?bBhHiIlLqQefdgFDG")


class CheckedVector(list):
    """A vector spec ``[array, counts, displs]`` its maker has checked: a 1-D array
    (writable where the call writes it), ``size`` non-negative int counts and
    displacements in elements, every block within the array. The ``v`` collectives take
    it as it is; :mod:`pycomm.MPI`, which has parsed the user's spec, hands them these,
    so that a small call is not parsed twice."""

    __slots__ = ()


def as_array(obj, rank: int, arg: str, *, writable: bool = False) -> np.ndarray:
    """Return a 1-D numpy view (no copy) of the user buffer ``obj``.

    Args:
        obj: numpy array, buffer-protocol object, or ``[buf, (count,) datatype]`` list.
        rank: this rank (for the error message).
        arg: the argument's name (for the error message).
        writable: the buffer will be written (a receive buffer).

    Returns:
        A 1-D C-contiguous ndarray sharing memory with ``obj``.

    Raises:
        InvalidBufferError: not a buffer, non-contiguous, read-only when written, a
            dtype other than numeric, bool, a record of numeric fields or a plain void
            dtype, or a count larger than the buffer.
    """
    if type(obj) is np.ndarray:                     # the common case, fast
        flags = obj.flags
        if flags.c_contiguous and (flags.writeable or not writable) and \
                (obj.dtype in _NATIVE_NUMERIC or obj.dtype.kind in _NUMERIC or
                 _opaque(obj.dtype)):
            return obj if obj.ndim == 1 else obj.reshape(-1)
    count = None
    dtype = None
    if isinstance(obj, (list, tuple)) and obj and not isinstance(obj[0], (int, float)):
        spec = list(obj)
        obj = spec[0]
        if len(spec) == 2:
            dtype = spec[1]
        elif len(spec) == 3:
            count, dtype = spec[1], spec[2]
        else:
            raise InvalidBufferError(f"rank {rank}: {arg} must be a buffer or [buf, datatype] "
                                     f"or [buf, count, datatype], got a list of {len(spec)}")
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.frombuffer(obj, dtype=np.uint8) if not isinstance(obj, memoryview) \
                or obj.format in ("B", "b", "c") else np.asarray(obj)
        except (TypeError, ValueError):
            raise InvalidBufferError(
                f"rank {rank}: {arg} must be a numpy array or support the buffer protocol, "
                f"got {type(obj).__name__}") from None
        if isinstance(obj, (bytearray, memoryview)) and not arr.flags.writeable and \
                not getattr(obj, "readonly", True):
            arr.flags.writeable = True
    if not arr.flags.c_contiguous:
        raise InvalidBufferError(
            f"rank {rank}: {arg} is not C-contiguous (shape {arr.shape}, strides "
            f"{arr.strides}); pass np.ascontiguousarray(...) or a contiguous slice")
    if arr.dtype.kind not in _NUMERIC and not _numeric_record(arr.dtype) and \
            not _opaque(arr.dtype):
        raise InvalidBufferError(f"rank {rank}: {arg} has dtype {arr.dtype}; only numeric "
                                 "and bool dtypes (and records of them, for MAXLOC/MINLOC, "
                                 "or opaque items of a plain void dtype) can be communicated "
                                 "(use the lowercase object methods for Python objects)")
    if writable and not arr.flags.writeable:
        raise InvalidBufferError(f"rank {rank}: {arg} is read-only but is written by this "
                                 "call")
    if dtype is not None:
        try:
            want = np.dtype(dtype)
        except TypeError:
            want = None
        if want is not None and want != arr.dtype:
            raise InvalidBufferError(f"rank {rank}: {arg} has dtype {arr.dtype} but the "
                                     f"buffer specification says {want}")
    flat = arr.reshape(-1)
    if count is not None:
        if not isinstance(count, (int, np.integer)) or count < 0 or count > flat.size:
            raise InvalidBufferError(f"rank {rank}: {arg} count={count!r} is invalid for a "
                                     f"buffer of {flat.size} elements")
        flat = flat[:count]
    return flat


def _numeric_record(dtype: np.dtype) -> bool:
    """A structured dtype whose fields are all numeric (MAXLOC/MINLOC value/index pairs)."""
    return dtype.fields is not None and all(
        f[0].kind in _NUMERIC and f[0].shape == () for f in dtype.fields.values())


def _opaque(dtype: np.dtype) -> bool:
    """A plain void dtype of fixed-size items (``V16``: no fields, no subarray). It moves
    as raw bytes and numpy copies it as such, where a record is copied field by field,
    several times slower: pycomm.MPI views a derived datatype's items this way so that
    the schedules split buffers only between whole items (``pycomm.MPI.collspec.item_array``)."""
    return dtype.kind == "V" and dtype.fields is None and dtype.subdtype is None and \
        dtype.itemsize > 0


_CASTABLE = frozenset("bBhHiIlLqQnNefd?")   # buffer formats memoryview.cast understands


def byte_view(arr: np.ndarray) -> memoryview:
    """Flat unsigned-byte memoryview of a 1-D contiguous array (no copy)."""
    if arr.dtype.char in _CASTABLE:
        return arr.data.cast("B")
    return arr.view(np.uint8).data
