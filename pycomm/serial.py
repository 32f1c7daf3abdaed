"""How the object API serialises: :mod:`pickle` (protocol 5), falling back to
:mod:`cloudpickle` for what pickle refuses (lambdas, closures, interactively defined
classes), as mpi4py programs expect of their lowercase calls.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from .errors import ArgumentError

__all__ = ["dumps", "loads"]


def dumps(obj: Any, rank: int | None = None, call: str = "") -> bytes:
    """Serialise ``obj`` with pickle, or cloudpickle when pickle cannot.

    Raises:
        ArgumentError: neither can (the message names ``rank`` and ``call``); it is also
            an instance of the exception cloudpickle raised (TypeError for a lock, say).
    """
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        try:
            return cloudpickle.dumps(obj, protocol=5)
        except Exception as exc:
            where = f"rank {rank}: {call}: " if rank is not None else ""
            raise _refusal(type(exc))(f"{where}cannot pickle the object "
                                      f"({type(obj).__name__}): {type(exc).__name__}: {exc}"
                                      ) from None


_REFUSALS: dict[type, type] = {}


def _refusal(cause: type) -> type:
    """The error for an object pickling refused with ``cause``: an ArgumentError that is
    also a ``cause`` (TypeError for a lock or a socket, pickle.PicklingError, ...), so that
    an mpi4py program's ``except TypeError`` (what mpi4py raises there: pickle's own
    error) still catches it; an ArgumentError alone where the two cannot be combined. Its
    ``mpi_error``: the MPI error class pycomm.MPI gives it (its message names the call's
    ``tag=``, which is not what is wrong)."""
    cls = _REFUSALS.get(cause)
    if cls is None:
        attrs = {"__module__": __name__, "mpi_error": "ERR_ARG"}
        # only an exception whose built-in base is laid out as BaseException is (TypeError,
        # PicklingError) combines with it, and with MPI.Exception after (OSError does not)
        builtin = next(c for c in cause.__mro__ if c.__module__ == "builtins")
        same = builtin.__basicsize__ == BaseException.__basicsize__
        cls = type("ArgumentError", (ArgumentError, cause) if same else (ArgumentError,),
                   attrs)
        _REFUSALS[cause] = cls
    return cls


def loads(data) -> Any:
    """Inverse of :func:`dumps`; a message of no bytes (a buffer send of nothing) is None,
    as in mpi4py."""
    return pickle.loads(data) if len(data) else None
