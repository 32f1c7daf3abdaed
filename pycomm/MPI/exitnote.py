"""Tell the launcher how this rank leaves: ``raise SystemExit(msg)`` ends the job at once.

Under ``mpiexec`` a rank of an mpi4py program that calls ``sys.exit(code)`` or raises
``SystemExit(msg)`` ends the whole job: its message is printed, the other ranks are killed
and ``mpiexec`` exits with its code (1 for a message). ``launch.py`` does the same when it
knows the exit was deliberate; otherwise a failed rank gets pycomm's diagnosis (a report
grace for the survivors, their flight recorders). :func:`arm` registers an exit hook that
runs before the world is finalized and, when the interpreter is leaving with no uncaught
exception (Python sets ``sys.last_value`` before the exit hooks only for one; not for
``SystemExit``), publishes ``exit/<rank>`` in the job's store (:mod:`pycomm.stall`). The
launcher reads it only for a rank that exited with a non-zero code.
"""

from __future__ import annotations

import atexit
import sys

import pycomm as _pycomm

__all__ = ["arm"]

_armed: list[bool] = []


def arm() -> None:
    """Register the exit hook once, after the world exists (exit hooks run last-in
    first-out, so it runs while the world's store connection is still open)."""
    if not _armed and _pycomm.is_initialized():
        _armed.append(True)
        atexit.register(_at_exit)


def _at_exit() -> None:
    if getattr(sys, "last_value", None) is not None:   # an uncaught exception
        return
    world = _pycomm._world      # noqa: SLF001  (None once finalized)
    inspector = getattr(getattr(world, "_engine", None), "_inspector", None)
    if inspector is not None:   # None: no launcher store (a world of one, a test world)
        inspector.report_exit()
