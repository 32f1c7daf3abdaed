"""``MPI.Status``: where a received message came from, in MPICH's memory layout.

The fields live in five C ints laid out as MPICH's ``MPI_Status`` (count low bits, count
high bits with the cancelled flag, source, tag, error), so that :meth:`Status.tomemory`
is a writable view of them, as mpi4py's.
"""

from __future__ import annotations

import array
import copyreg

from pycomm.status import Status as _Status

from .exceptions import translate_methods
from .predefined import PREDEFINED, to_datatype

__all__ = ["UNDEFINED", "Status"]

UNDEFINED = -32766


def _field(i: int, doc: str) -> property:
    def get(self) -> int:
        return self._mem[i]

    def put(self, value) -> None:
        self._mem[i] = int(value)
    return property(get, put, doc=doc)


def _unsigned32(v: int) -> int:
    return v & 0xFFFFFFFF


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


@translate_methods
class Status(_Status):
    """Where a received message came from (mpi4py's ``MPI.Status``).

    Attributes: ``source``, ``tag``, ``error``, ``cancelled``; ``count`` is in bytes.
    ``Status(other)`` copies ``other``. The fields live in five C ints laid out as
    MPICH's ``MPI_Status`` (count low bits, count high bits with the cancelled flag,
    source, tag, error); :meth:`tomemory` is a writable view of them.
    """

    __slots__ = ("__weakref__", "_mem")

    source = _field(2, "The sender's rank.")
    tag = _field(3, "The message's tag.")
    error = _field(4, "The error code (0: MPI_SUCCESS).")

    @property
    def count(self) -> int:
        """Bytes received."""
        return _unsigned32(self._mem[0]) | (_unsigned32(self._mem[1]) >> 1) << 32

    @count.setter
    def count(self, value: int) -> None:
        value = int(value)
        self._mem[0] = _signed32(value & 0xFFFFFFFF)
        self._mem[1] = _signed32(((value >> 32) << 1) & 0xFFFFFFFF | (self._mem[1] & 1))

    @property
    def cancelled(self) -> bool:
        return bool(self._mem[1] & 1)

    @cancelled.setter
    def cancelled(self, flag: bool) -> None:
        self._mem[1] = (self._mem[1] & ~1) | bool(flag)

    def tomemory(self) -> memoryview:
        """A writable memoryview (format ``'i'``) of the status's five C ints."""
        return memoryview(self._mem)

    def __reduce__(self):
        """mpi4py's: a new status of the same class (a subclass's too) with the same
        fields."""
        return copyreg.__newobj__, (type(self),), self.__getstate__()

    def __getstate__(self) -> dict:
        return {"source": self.source, "tag": self.tag, "error": self.error,
                "count": self.count, "cancelled": self.cancelled}

    def __setstate__(self, state: dict) -> None:
        self.source, self.tag, self.error = state["source"], state["tag"], state["error"]
        self.count, self.cancelled = state.get("count", 0), state.get("cancelled", False)

    def __init__(self, status: _Status | None = None):
        self._mem = array.array("i", bytes(20))
        super().__init__()
        if status is not None and not isinstance(status, _Status):
            raise TypeError(f"Status({status!r}): expected a Status or nothing")
        if status is not None:
            self.source, self.tag, self.count = status.source, status.tag, status.count
            self.error, self.cancelled = status.error, status.cancelled

    def Get_count(self, datatype=None) -> int:
        """Items of ``datatype`` received (default ``BYTE``); ``UNDEFINED`` when the bytes
        are not a whole number of items."""
        size = to_datatype(PREDEFINED["BYTE"] if datatype is None else datatype,
                           "Status.Get_count").Get_size()
        if size == 0:
            return 0
        return self.count // size if self.count % size == 0 else UNDEFINED

    def Get_elements(self, datatype) -> int:
        """Basic elements of ``datatype`` received (equal to the count for basic types)."""
        dt = to_datatype(datatype, "Status.Get_elements")
        if dt.Get_size() == 0:
            return 0
        per = dt.Get_size() / max(dt._nitems, 1)
        return int(self.count // per) if dt.homogeneous else self.Get_count(dt)

    def Set_elements(self, datatype, count: int) -> None:
        """Record ``count`` items of ``datatype`` as received."""
        self.count = int(count) * to_datatype(datatype, "Status.Set_elements").Get_size()

    def Set_source(self, source: int) -> None:
        self.source = int(source)

    def Set_tag(self, tag: int) -> None:
        self.tag = int(tag)

    def Set_error(self, error: int) -> None:
        self.error = int(error)

    def Set_cancelled(self, flag: bool) -> None:
        self.cancelled = bool(flag)

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error

    def Is_cancelled(self) -> bool:
        return self.cancelled

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Status):
            return NotImplemented
        return (self.source, self.tag, self.count, self.error, self.cancelled) == \
            (other.source, other.tag, other.count, other.error, other.cancelled)

    __hash__ = None
