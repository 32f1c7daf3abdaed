"""``mpi4py.MPI`` resolved to :mod:`pycomm.MPI` (see the package docstring).

Importing it creates the world when ``mpi4py.rc.initialize`` is true, as mpi4py does.
"""

# ruff: noqa: N999  (the module is named after mpi4py.MPI on purpose)

import sys as _sys

import pycomm.MPI as _MPI

if getattr(_sys.modules.get("mpi4py"), "rc", None) is None or _sys.modules["mpi4py"].rc.initialize:
    _MPI.Init()
_sys.modules[__name__] = _MPI
