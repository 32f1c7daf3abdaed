"""Pickling of communicators and groups as mpi4py does it.

The predefined handles unpickle to themselves (``COMM_NULL``, ``COMM_SELF``,
``COMM_WORLD``, ``GROUP_NULL``, ``GROUP_EMPTY``), a copy of one (``MPI.Comm(COMM_WORLD)``)
to a new equal copy; any other communicator or group names processes of this job only,
and pickling it raises ``ValueError``.
"""

from __future__ import annotations

__all__ = ["install"]

_COMMS = ("COMM_NULL", "COMM_SELF", "COMM_WORLD")
_GROUPS = ("GROUP_NULL", "GROUP_EMPTY")


def _named(name: str):
    import pycomm.MPI as mpi
    return getattr(mpi, name)


def _copy(cls, name: str):
    return cls(_named(name))


def _reduce(self, names: tuple[str, ...]):
    import pycomm.MPI as mpi
    for name in names:
        # COMM_WORLD and COMM_SELF are made on first use: one not made yet is not this one
        named = getattr(mpi, name) if name in vars(mpi) else None
        if named is None:
            continue
        if self is named:
            return _named, (name,)
        if self == named:
            return _copy, (type(self), name)
    raise ValueError(f"cannot pickle {self!r}: only {', '.join(names)} and their copies "
                     "mean the same thing in another process")


def install(comm_cls, group_cls) -> None:
    """Give ``Comm`` and ``Group`` mpi4py's ``__reduce__``."""
    comm_cls.__reduce__ = lambda self: _reduce(self, _COMMS)
    group_cls.__reduce__ = lambda self: _reduce(self, _GROUPS)
