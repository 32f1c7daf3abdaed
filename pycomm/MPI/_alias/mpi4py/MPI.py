"""``mpi4py.MPI`` resolved to :mod:`pycomm.MPI` (see the package docstring).

Importing it reads ``mpi4py.rc`` and the ``MPI4PY_RC_*`` environment
(:mod:`pycomm.MPI.rcopts`) and creates the world when ``initialize`` is true, with
``Init_thread(thread_level)`` when ``threads`` is true, as mpi4py does.
"""

# ruff: noqa: N999  (the module is named after mpi4py.MPI on purpose)

import sys as _sys

import pycomm.MPI as _MPI
from pycomm.MPI import rcopts as _rcopts

_options = _rcopts.read(_rcopts.rc_of("mpi4py"))
_MPI._configure(_options)                                   # noqa: SLF001
if _options["initialize"]:
    if _options["threads"]:
        _MPI.Init_thread(getattr(_MPI, "THREAD_" + _options["thread_level"].upper()))
    else:
        _MPI.Init()
_sys.modules[__name__] = _MPI
