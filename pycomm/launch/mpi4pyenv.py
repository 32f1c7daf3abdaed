"""The environment that makes ``import mpi4py`` give :mod:`pycomm.MPI` in a launched rank.

``launch.py --mpi4py`` and its node agents need only these paths; they live here, not in
:mod:`pycomm.MPI.alias` (which re-exports them), because importing anything under
``pycomm.MPI`` runs that package's ``__init__``: the whole mpi4py-shaped API, about 0.15 s
of CPU per launcher for two strings.
"""

from __future__ import annotations

import os

__all__ = ["ALIAS_PATH", "PYCOMM_ROOT", "environment"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALIAS_PATH = os.path.join(_PACKAGE, "MPI", "_alias")
# the directory holding the pycomm package, so that the alias can import it
PYCOMM_ROOT = os.path.dirname(_PACKAGE)


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that make ``import mpi4py`` resolve to pycomm in a child process:
    ``PYCOMM_MPI4PY=1`` and the alias directory, then pycomm's own, first on
    ``PYTHONPATH`` (``base``: the environment to extend, default ``os.environ``)."""
    env = dict(os.environ if base is None else base)
    parts = [ALIAS_PATH, PYCOMM_ROOT] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p and p not in (ALIAS_PATH, PYCOMM_ROOT)]
    return {"PYCOMM_MPI4PY": "1", "PYTHONPATH": os.pathsep.join(parts)}
