"""``mpi4py.rc`` read as mpi4py reads it when ``mpi4py.MPI`` is imported.

Each option comes from the environment variable ``MPI4PY_RC_<NAME>`` when it is set (an
unsigned integer for an integer option, a boolean word -- ``true``/``false``, ``yes``/
``no``, ``on``/``off``, ``1``/``0`` -- as a bool, anything else lower-cased; the value is
written back into ``rc``), else from the attribute of ``mpi4py.rc`` (mpi4py's default when
there is no ``rc``: a program may delete it). A value mpi4py does not accept gives
``RuntimeWarning("mpi4py.rc.<name>: unexpected value <repr>")`` and the default, as in
mpi4py's ``atimport.pxi``.

What pycomm does with them: ``initialize`` (create the world at import), ``threads`` and
``thread_level`` (``Init_thread(level)`` or ``Init()``; pycomm provides
``THREAD_SERIALIZED`` at most), ``errors`` (the error handler that communicators and
sessions report until one is set: ``"exception"`` ``ERRORS_RETURN``, ``"abort"``
``ERRORS_ABORT``, ``"default"`` and ``"fatal"`` ``ERRORS_ARE_FATAL``; pycomm raises
``MPI.Exception`` under every handler). ``finalize``, ``fast_reduce``, ``recv_mprobe``
and ``irecv_bufsz`` are validated and kept: pycomm always finalizes at exit, and its
reductions and receives have no such variants.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["DEFAULTS", "read"]

DEFAULTS = {"initialize": True, "threads": True, "thread_level": "multiple",
            "finalize": None, "fast_reduce": True, "recv_mprobe": True,
            "irecv_bufsz": 32768, "errors": "exception"}

_TRUE = ("true", "yes", "on", "y", "1")
_FALSE = ("false", "no", "off", "n", "0")
_LEVELS = ("single", "funneled", "serialized", "multiple")
_ERRORS = ("default", "exception", "abort", "fatal")


def _get(rc, name: str, default):
    raw = os.environ.get(f"MPI4PY_RC_{name.upper()}")
    if raw is None:
        return getattr(rc, name, default)
    word = raw.strip().lower()
    if raw.isdigit() and type(default) is int:
        value = int(raw)
    elif word in _TRUE or word in _FALSE:
        value = word in _TRUE
    else:
        value = word
    try:
        setattr(rc, name, value)
    except Exception:       # noqa: BLE001  (mpi4py ignores a failed write-back too)
        pass
    return value


def _warn(name: str, value) -> None:
    warnings.warn(f"mpi4py.rc.{name}: unexpected value {value!r}", RuntimeWarning,
                  stacklevel=4)


def _flag(opts: dict, name: str, value) -> None:
    if value in (True, "yes"):
        opts[name] = True
    elif value in (False, "no"):
        opts[name] = False
    else:
        _warn(name, value)


def read(rc=None) -> dict:
    """The options in force: ``rc`` (None: mpi4py's defaults) under the environment.

    Warns (``RuntimeWarning``) for each value mpi4py does not accept, which keeps its
    default; ``finalize`` None follows ``initialize``.
    """
    got = {name: _get(rc, name, default) for name, default in DEFAULTS.items()}
    opts = dict(DEFAULTS)
    for name in ("initialize", "threads", "fast_reduce", "recv_mprobe"):
        _flag(opts, name, got[name])
    if got["thread_level"] in _LEVELS:
        opts["thread_level"] = got["thread_level"]
    else:
        _warn("thread_level", got["thread_level"])
    finalize = got["finalize"]
    if finalize is None:
        opts["finalize"] = opts["initialize"]
    else:
        _flag(opts, "finalize", finalize)
        if opts["finalize"] is None:
            opts["finalize"] = opts["initialize"]
    bufsz = got["irecv_bufsz"]
    if type(bufsz) is int and bufsz >= 0:
        opts["irecv_bufsz"] = bufsz
    else:
        _warn("irecv_bufsz", bufsz)
    if got["errors"] in _ERRORS:
        opts["errors"] = got["errors"]
    else:
        _warn("errors", got["errors"])
    return opts


def rc_of(package: str = "mpi4py"):
    """``<package>.rc`` as the import would find it: None once a program deleted it."""
    rc = getattr(sys.modules.get(package), "rc", None)
    return rc if rc is not None else sys.modules.get(f"{package}.rc")
