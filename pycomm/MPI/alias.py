"""Run a program with ``mpi4py`` resolved to pycomm: ``python -m pycomm.MPI.alias app.py``.

The bootstrap for launchers other than ``launch.py --mpi4py`` (``torchrun``, ``srun``,
``mpiexec``): it sets ``PYCOMM_MPI4PY=1``, puts pycomm's alias package first on
``sys.path`` (so ``from mpi4py import MPI`` gives :mod:`pycomm.MPI`, see
``pycomm/MPI/_alias/mpi4py``), then runs ``app.py [args]`` (or ``-m module [args]``) as
``__main__`` with ``sys.argv`` as the program expects. With the start-up hook installed
(:mod:`pycomm.MPI.hook`; a wheel install carries it), ``PYCOMM_MPI4PY=1`` alone does the
same with no wrapper: ``PYCOMM_MPI4PY=1 torchrun --nproc-per-node 4 app.py``.
"""

from __future__ import annotations

import os
import runpy
import sys

# (kept in pycomm.launch: the launcher needs them without importing pycomm.MPI)
from pycomm.launch.mpi4pyenv import ALIAS_PATH, PYCOMM_ROOT, environment

__all__ = ["ALIAS_PATH", "PYCOMM_ROOT", "environment", "install", "main"]


def install() -> None:
    """Make ``import mpi4py`` in this process resolve to pycomm (before it is imported).

    Raises:
        RuntimeError: a real mpi4py was imported already.
    """
    mod = sys.modules.get("mpi4py")
    if mod is not None and not getattr(mod, "__version__", "").endswith("+pycomm"):
        raise RuntimeError("pycomm.MPI.alias.install: the real mpi4py is already imported")
    os.environ["PYCOMM_MPI4PY"] = "1"
    if ALIAS_PATH not in sys.path:
        sys.path.insert(0, ALIAS_PATH)


def main(argv: list[str] | None = None) -> int:
    """``python -m pycomm.MPI.alias (script.py | -m module) [args...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] == "-m" and len(args) < 2):
        sys.stderr.write("usage: python -m pycomm.MPI.alias (script.py | -m module) "
                         "[args...]\n")
        return 2
    install()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path[1:1] = [os.path.dirname(os.path.abspath(args[0]))]
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
