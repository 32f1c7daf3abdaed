"""pycomm: multi-process collective communication in pure Python, with mpi4py's API.

Usage::

    import numpy as np, pycomm
    comm = pycomm.COMM_WORLD               # created on first use
    x = np.full(4, comm.rank, dtype=np.float64)
    comm.Allreduce(pycomm.IN_PLACE, x, op=pycomm.SUM)

Run N ranks with ``python launch.py -n N script.py`` or ``pycomm.spawn(fn, N)``.
"""

from __future__ import annotations

import atexit
import importlib
import threading
import time
from typing import TYPE_CHECKING

from .errors import (ArgumentError, CollectiveError, CollectiveMismatchError, CommError,
                     CommTimeoutError, InvalidBufferError, PeerError, ProtocolError,
                     RemoteError, ThreadLevelError, TruncationError)

if TYPE_CHECKING:
    from .buffers import IN_PLACE
    from .collectives import algorithms
    from .comm import TAG_UB, Communicator, Status
    from .groups import COMM_NULL, CONGRUENT, IDENT, SIMILAR, UNDEFINED, UNEQUAL, Group
    from .launch.spawning import Pool, spawn
    from .ops import (BAND, BOR, BXOR, DOUBLE_INT, FLOAT_INT, INT_INT, LAND, LONG_INT, LOR,
                      LXOR, MAX, MAXLOC, MIN, MINLOC, PROD, SUM, Op)
    from .p2p import ANY_SOURCE, ANY_TAG, PROC_NULL, Request

# The rest of the API is imported on first use (__getattr__ below): the launcher process
# (launch.py, pycomm-launch, a node agent) imports only pycomm.launch's modules, and with
# these eager it also paid numpy and the communication core (about 0.2 s of CPU per
# launched job) for nothing. A rank imports them when it creates its world.
_LAZY = {
    ".collectives": ("algorithms",),
    ".buffers": ("IN_PLACE",),
    ".comm": ("TAG_UB", "Communicator", "Status"),
    ".groups": ("COMM_NULL", "CONGRUENT", "IDENT", "SIMILAR", "UNDEFINED", "UNEQUAL",
                "Group"),
    ".ops": ("BAND", "BOR", "BXOR", "DOUBLE_INT", "FLOAT_INT", "INT_INT", "LAND",
             "LONG_INT", "LOR", "LXOR", "MAX", "MAXLOC", "MIN", "MINLOC", "PROD", "SUM",
             "Op"),
    ".p2p": ("ANY_SOURCE", "ANY_TAG", "PROC_NULL", "Request"),
    ".launch.spawning": ("Pool", "spawn"),
}
_LAZY_FROM = {name: module for module, names in _LAZY.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "init", "finalize", "is_initialized", "COMM_WORLD", "spawn", "Pool", "Wtime", "Wtick",
    "Communicator", "Status", "Request", "Op", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR",
    "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC", "DOUBLE_INT", "FLOAT_INT", "LONG_INT",
    "INT_INT", "IN_PLACE",
    "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "TAG_UB", "algorithms", "CommError",
    "ArgumentError", "InvalidBufferError", "TruncationError", "PeerError",
    "CommTimeoutError", "ProtocolError", "RemoteError", "CollectiveError",
    "CollectiveMismatchError", "ThreadLevelError", "__version__", "Group", "COMM_NULL",
    "UNDEFINED", "IDENT", "CONGRUENT", "SIMILAR", "UNEQUAL",
]

_lock = threading.Lock()
_world: Communicator | None = None
_closer = None


def init(**options) -> Communicator:
    """Create the world communicator from the environment (idempotent); return it.

    Options (keyword-only, all optional): ``transport`` ("auto", "shm", "tcp"),
    ``timeout`` (seconds), ``eager_limit`` (bytes), ``ring_bytes``, ``spin_us``, ``host``.
    See :mod:`pycomm.launch.bootstrap` for the launchers understood.

    Raises:
        ArgumentError: bad options or inconsistent launcher variables.
        CommError: a peer could not be reached in time.
    """
    global _world, _closer
    with _lock:
        if _world is None:
            from . import config
            from .launch.bootstrap import create_world
            _world, _closer = create_world(**options)
            atexit.register(finalize)
            if config.get("PYCOMM_SPAWN_PARENTS") is not None:
                # a process that MPI_Comm_spawn started: its world is the bridge to its
                # parents, and its COMM_WORLD the children alone (pycomm.MPI.spawn)
                from .MPI.spawn import join_parents
                _world = join_parents(_world)
        return _world


def is_initialized() -> bool:
    """Whether :func:`init` has created the world."""
    return _world is not None


def finalize() -> None:
    """Release the world's transports and store connection (runs at exit too)."""
    global _world, _closer
    with _lock:
        if _closer is not None:
            _closer()
        _world, _closer = None, None


def Wtime() -> float:  # noqa: N802 (MPI name)
    """Seconds since an arbitrary origin, from a monotonic high-resolution clock."""
    return time.perf_counter()


def Wtick() -> float:  # noqa: N802 (MPI name)
    """Resolution of :func:`Wtime` in seconds."""
    return time.get_clock_info("perf_counter").resolution


def __getattr__(name: str):
    if name == "COMM_WORLD":
        return init()
    module = _LAZY_FROM.get(name)
    if module is not None:      # the API above, imported on first use
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        # a submodule (pycomm.MPI, the mpi4py-shaped façade, among them), as if the
        # package had imported it: pycomm.comm, pycomm.collectives.REGISTRY, ...
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'pycomm' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
