"""``MPI.Info`` (key/value hints).

An :class:`Info` is a handle to a dict of string keys and values: ``Info.Create()`` makes
one, ``Info(other)`` is a second handle to the same dict, ``INFO_NULL`` is the null
handle (false; every call on it is ``ERR_INFO``) and ``INFO_ENV`` the predefined one.
It is also a mapping (``info[key]``, ``len``, ``in``, ``items()``...), as in mpi4py.
pycomm reads no hints. (Attribute caching, with ``KEYVAL_INVALID``, is
:mod:`pycomm.MPI.keyvals`.)
"""

from __future__ import annotations

import copyreg

from pycomm.errors import ArgumentError

from .exceptions import mpi_error, translate_methods
from .keyvals import KEYVAL_INVALID

__all__ = ["INFO_ENV", "INFO_NULL", "KEYVAL_INVALID", "Info"]

@translate_methods
class Info:
    """Key/value hints (mpi4py's ``MPI.Info``); ``Info()`` is ``INFO_NULL``."""

    __slots__ = ("__weakref__", "_d")

    def __init__(self, info: Info | None = None):
        if info is not None and not isinstance(info, Info):
            raise TypeError(f"Info({info!r}): expected an MPI.Info or nothing")
        self._d = None if info is None else info._d

    @classmethod
    def Create(cls, items=None) -> Info:
        """A new info object of class ``cls``, filled from a mapping or (key, value) pairs
        if given."""
        out = cls.__new__(cls)
        out._d = {}
        if items is not None:
            out.update(items)
        return out

    @classmethod
    def Create_env(cls, args=None) -> Info:
        return cls.Create()

    def _dict(self, call: str) -> dict:
        if self._d is None:
            raise mpi_error(ArgumentError, "ERR_INFO", f"Info.{call}: INFO_NULL")
        return self._d

    def Free(self) -> None:
        """The handle becomes INFO_NULL (ERR_INFO for INFO_NULL itself)."""
        self._dict("Free")
        self._d = None

    def Dup(self) -> Info:
        """A new info object (of this one's class) with the same items."""
        return type(self).Create(self._dict("Dup"))

    def Get(self, key: str, default=None):
        """The value of ``key`` (a str), or None when absent."""
        return self._dict("Get").get(str(key), default)

    def Set(self, key: str, value: str) -> None:
        self._dict("Set")[str(key)] = str(value)

    def Delete(self, key: str) -> None:
        """Remove ``key`` (ERR_INFO_NOKEY when absent)."""
        d = self._dict("Delete")
        if str(key) not in d:
            raise mpi_error(ArgumentError, "ERR_INFO_NOKEY", f"Info.Delete: no key {key!r}")
        del d[str(key)]

    def Get_nkeys(self) -> int:
        return len(self._dict("Get_nkeys"))

    def Get_nthkey(self, n: int) -> str:
        """The ``n``-th key (in insertion order; ERR_ARG when out of range)."""
        keys = list(self._dict("Get_nthkey"))
        if not 0 <= int(n) < len(keys):
            raise mpi_error(ArgumentError, "ERR_ARG", f"Info.Get_nthkey: n={n} is not in "
                            f"0..{len(keys) - 1}")
        return keys[int(n)]

    # -- the mapping interface (mpi4py's) ---------------------------------------------
    def __len__(self) -> int:
        return 0 if self._d is None else len(self._d)

    def __contains__(self, key) -> bool:
        return self._d is not None and str(key) in self._d

    def __iter__(self):
        return iter(() if self._d is None else list(self._d))

    def _map(self, key) -> dict:
        """The dict, for the mapping methods: on INFO_NULL they raise KeyError (as a
        mapping with no keys does), as mpi4py's."""
        if self._d is None:
            raise KeyError(key)
        return self._d

    def __getitem__(self, key: str) -> str:
        return self._map(key)[str(key)]

    def __setitem__(self, key: str, value: str) -> None:
        self._map(key)[str(key)] = str(value)

    def __delitem__(self, key: str) -> None:
        del self._map(key)[str(key)]

    def get(self, key: str, default=None):
        return default if self._d is None else self._d.get(str(key), default)

    def keys(self) -> list[str]:
        return list(self)

    def values(self) -> list[str]:
        return [] if self._d is None else list(self._d.values())

    def items(self) -> list[tuple[str, str]]:
        return [] if self._d is None else list(self._d.items())

    def update(self, other=(), **kwargs) -> None:
        d = self._map("update")
        pairs = other.items() if hasattr(other, "items") else other
        for k, v in list(pairs) + list(kwargs.items()):
            d[str(k)] = str(v)

    def pop(self, key: str, *default):
        if self._d is None and default:
            return default[0]
        return self._map(key).pop(str(key), *default)

    def popitem(self) -> tuple[str, str]:
        return self._map("popitem").popitem()

    def __reduce__(self):
        """The predefined handles unpickle to themselves, a copy of one to an equal
        handle, any other info object to a new one with the same items."""
        if self is INFO_NULL or self is INFO_ENV:
            return "INFO_NULL" if self is INFO_NULL else "INFO_ENV"
        if self._d is None:
            return copyreg.__newobj__, (type(self),)
        if self._d is INFO_ENV._d:
            return copyreg.__newobj__, (type(self), INFO_ENV)
        return type(self).Create, (list(self._d.items()),)

    def copy(self) -> Info:
        """A new info object with the same items (INFO_NULL copies to a null one)."""
        return type(self).__new__(type(self)) if self._d is None else self.Dup()

    def clear(self) -> None:
        if self._d is not None:
            self._d.clear()

    def __bool__(self) -> bool:
        return self._d is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Info):
            return NotImplemented
        return self._d is other._d

    def __hash__(self) -> int:
        return id(self._d)

    def __repr__(self) -> str:
        return "<MPI.INFO_NULL>" if self._d is None else f"<MPI.Info {self._d!r}>"


INFO_NULL = Info()
INFO_ENV = Info.Create()
