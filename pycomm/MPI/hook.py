"""``PYCOMM_MPI4PY=1`` alone: ``import mpi4py`` resolves to pycomm under any launcher.

Under ``torchrun``, ``srun`` or ``mpiexec`` nothing of pycomm's runs before the program,
so the switch is a ``.pth`` file in site-packages, ``pycomm-mpi4py.pth``: Python executes
it at start-up, and it does nothing unless ``PYCOMM_MPI4PY`` is set to a true value (``1``,
``true``, ``yes``, ``on``); then it puts pycomm's alias package (``pycomm/MPI/_alias``,
found without importing pycomm) first on ``sys.path``, so that ``import mpi4py``,
``from mpi4py import MPI`` and ``mpi4py.rc`` give :mod:`pycomm.MPI`. A real mpi4py in the
same environment is untouched while the variable is unset.

A wheel of pycomm carries the file (``setup.py`` adds it at the wheel's root, which pip
installs into site-packages). An editable install (``pip install -e .``) cannot place it,
so install it once with::

    python -m pycomm.MPI.hook install      # into this interpreter's site-packages
    python -m pycomm.MPI.hook status       # where it is, and whether it is active
    python -m pycomm.MPI.hook uninstall
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig

__all__ = ["PTH_NAME", "PTH_SOURCE", "install", "installed", "main", "uninstall"]

PTH_NAME = "pycomm-mpi4py.pth"
PTH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_NAME)


def _default_dir() -> str:
    return sysconfig.get_paths()["purelib"]


def install(directory: str | None = None) -> str:
    """Copy ``pycomm-mpi4py.pth`` into ``directory`` (a site directory; default: this
    interpreter's site-packages) and return its path.

    Raises:
        OSError: the directory cannot be written (a system Python: use a virtualenv, or
            ``directory=site.getusersitepackages()``).
    """
    target = os.path.join(directory or _default_dir(), PTH_NAME)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(PTH_SOURCE, target)
    return target


def uninstall(directory: str | None = None) -> bool:
    """Remove the file from ``directory`` (default: site-packages); whether it was there."""
    target = os.path.join(directory or _default_dir(), PTH_NAME)
    try:
        os.unlink(target)
    except FileNotFoundError:
        return False
    return True


def installed() -> list[str]:
    """The paths of ``pycomm-mpi4py.pth`` in this interpreter's site directories."""
    dirs = [*site.getsitepackages(), site.getusersitepackages(), _default_dir()]
    seen: list[str] = []
    for d in dirs:
        path = os.path.join(d, PTH_NAME)
        if os.path.exists(path) and path not in seen:
            seen.append(path)
    return seen


def main(argv: list[str] | None = None) -> int:
    """``python -m pycomm.MPI.hook (install | uninstall | status) [DIRECTORY]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("install", "uninstall", "status") or len(args) > 2:
        sys.stderr.write("usage: python -m pycomm.MPI.hook (install | uninstall | status) "
                         "[SITE_DIRECTORY]\n")
        return 2
    where = args[1] if len(args) > 1 else None
    if args[0] == "install":
        print(f"installed {install(where)}: PYCOMM_MPI4PY=1 now makes 'import mpi4py' "
              "give pycomm.MPI")
    elif args[0] == "uninstall":
        print("removed" if uninstall(where) else "not installed")
    else:
        paths = installed()
        print("\n".join(paths) if paths else "not installed")
        print(f"PYCOMM_MPI4PY={os.environ.get('PYCOMM_MPI4PY', '')!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
