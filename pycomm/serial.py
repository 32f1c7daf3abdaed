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
        ArgumentError: neither can (the message names ``rank`` and ``call``).
    """
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        try:
            return cloudpickle.dumps(obj, protocol=5)
        except Exception as exc:
            where = f"rank {rank}: {call}: " if rank is not None else ""
            raise ArgumentError(f"{where}cannot pickle the object "
                                f"({type(obj).__name__}): {type(exc).__name__}: {exc}"
                                ) from None


def loads(data) -> Any:
    """Inverse of :func:`dumps`; a message of no bytes (a buffer send of nothing) is None,
    as in mpi4py."""
    return pickle.loads(data) if len(data) else None
