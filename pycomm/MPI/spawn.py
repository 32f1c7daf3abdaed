"""Process creation (MPI-4.1 section 11.8): ``Intracomm.Spawn``, ``Spawn_multiple`` and
``Comm.Get_parent`` in mpi4py's API.

``comm.Spawn(command, args, maxprocs, info, root, errcodes)`` is collective over
``comm``; the arguments count at ``root`` only. The root starts the children on its host
(:class:`pycomm.launch.dynamic.SpawnedChildren`), and every parent and every child joins
one bridge world (:mod:`pycomm.MPI.bridge`): the ``p`` parents are its ranks
``0..p-1``, in ``comm``'s order, the ``m`` children ``p..p+m-1``, in command order. A
child's ``COMM_WORLD`` is its group's Split of it, and the link over it is what
``Spawn`` returns to the parents (its remote group the children) and
``Comm.Get_parent()`` to the children. Spawn returns once every child has joined (its
``import mpi4py``'s MPI init): as ``MPI_Comm_spawn``, which returns after the children's
``MPI_Init``.

``Disconnect`` of the link is collective over both groups (:mod:`pycomm.MPI.bridge`); a
child's ``Get_parent()`` is ``COMM_NULL`` afterwards. A child that exits without
disconnecting is a ``PeerError`` for a parent still waiting on it; a parent that exits
closes its bridges first, so its children waiting on it fail the same way, and the root
then waits up to ``PYCOMM_TIMEOUT`` seconds for its children to exit before stopping
them (:meth:`~pycomm.launch.dynamic.SpawnedChildren.close`), reporting any that failed.
A child's ``Comm.Abort(code)`` stops every child of its spawn at once (the root watches
for it as a launcher does for its ranks), then ends the root's own job with ``code``, as
``mpiexec`` ends every process of a job in which a spawned process aborts.

``info`` keys understood: ``wdir`` (the children's working directory), ``path``
(directories searched for ``command``, ``:``-separated), ``host`` (only the root's own
host, ``localhost`` or its name: children start there), ``soft`` (accepted; every
requested process is started). Others are ignored, as MPICH ignores keys it does not know.

Errors: a bad argument at the root raises its ``ValueError``/``TypeError`` at the root
(as mpi4py's conversions do) and ``MPI.Exception`` ``ERR_SPAWN`` naming it on the other
ranks; a command that cannot be started, or a child that exits before it joins, raises
``ERR_SPAWN`` on every parent, naming the child and its exit code; nothing is left
running.

"""

from __future__ import annotations

import operator
import os
import shutil
import socket
import threading

import pycomm as _pycomm
from pycomm import config

from .bridge import (BridgeLink, bridge_job, bridge_name, check_root, decided_at_root,
                     join_bridge, own, reachable_address, transport_of)

__all__ = ["Spawn", "Spawn_multiple", "get_parent", "join_parents", "spawn"]

_lock = threading.Lock()
_parent: BridgeLink | None = None      # a child's link to its parents, until Disconnect


# -- arguments, as mpi4py converts them at the root -----------------------------------
def _is_text(x) -> bool:
    return isinstance(x, (str, bytes))


def _text(x, what: str) -> str:
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, str):
        return x
    if hasattr(x, "__fspath__"):
        return _text(os.fspath(x), what)
    raise TypeError(f"{what}: expecting a str, bytes or path-like, got {type(x).__name__}")


def _argv(args, what: str) -> tuple[str, ...]:
    if args is None:
        return ()
    if _is_text(args):
        return (_text(args, what),)
    return tuple(_text(a, what) for a in args)


def _one_each(values, count: int) -> list:
    """``values`` as a list of one item per command (``ValueError`` otherwise, as
    mpi4py's conversion says it)."""
    values = list(values)
    if len(values) != count:
        raise ValueError(f"expecting {count} items, got {len(values)}")
    return values


def _argv_lists(args, count: int) -> list:
    return [args] * count if args is None or _is_text(args) else _one_each(args, count)


def _procs_list(maxprocs, count: int) -> list:
    if maxprocs is None:
        return [1] * count
    return [maxprocs] * count if hasattr(maxprocs, "__index__") else \
        _one_each(maxprocs, count)


def _infos(info, count: int) -> list:
    from .info import Info
    if info is None or isinstance(info, Info):
        return [info] * count
    info = _one_each(info, count)
    for i in info:
        if i is not None and not isinstance(i, Info):
            raise TypeError(f"info: expecting MPI.Info, got {type(i).__name__}")
    return info


def _app(command, args, maxprocs, info, w: str):
    """One :class:`~pycomm.launch.dynamic.App` from mpi4py's arguments and ``info``."""
    from pycomm.launch.dynamic import App
    cmd = _text(command, f"{w}: command")
    try:
        maxprocs = operator.index(maxprocs)
    except TypeError:
        raise TypeError(f"{w}: maxprocs must be an int, got {maxprocs!r}") from None
    if maxprocs < 1:
        raise ValueError(f"{w}: maxprocs must be at least 1, got {maxprocs}")
    get = (getattr(info, "_d", None) or {}).get         # (INFO_NULL: no keys)
    host = get("host")
    if host is not None and host not in ("localhost", socket.gethostname()) and \
            not host.startswith("127."):
        raise ValueError(f"{w}: info host={host!r}: pycomm starts spawned processes on the "
                         f"root's host ({socket.gethostname()}) only")
    path = get("path")
    if path and os.sep not in cmd:
        found = shutil.which(cmd, path=path)
        cmd = found or cmd
    return App(cmd, _argv(args, f"{w}: args"), maxprocs, get("wdir"))


# -- the parents' side ------------------------------------------------------------------
def _abort_job(spawned_rank: int, code: int) -> None:
    """A spawned process called ``Comm.Abort(code)``: its spawn's children are stopped
    (:meth:`pycomm.launch.dynamic.SpawnedChildren.watch`); end this root's job too, with
    that code. ``mpiexec`` ends the whole job, spawned processes and parents alike, and
    ``mpi4py.futures`` relies on it: its pool's manager thread dies of the lost link and
    the program would otherwise wait for its futures forever."""
    import sys
    sys.stderr.write(f"pycomm.spawn: spawned rank {spawned_rank} called Abort({code}); "
                     "every spawned process of its spawn was stopped; ending this job "
                     "too, as mpiexec does\n")
    _pycomm.init().Abort(code)


def spawn(comm, apps_at_root, root, errcodes, w: str, multiple: bool):
    """Run ``comm.Spawn`` / ``comm.Spawn_multiple`` (see the module docstring).

    Args:
        comm: the façade intra-communicator.
        apps_at_root: a function returning the list of
            :class:`~pycomm.launch.dynamic.App` (called at ``root`` only; its
            ``ValueError``/``TypeError`` is the root's argument error).
        root: the root rank.
        errcodes: None or a list to fill with ``MPI.SUCCESS`` per child (per command,
            a list per command, with ``multiple``).
        w: the call's name, for messages.

    Returns:
        Intercomm: the link to the children (its remote group).
    """
    from pycomm.launch.dynamic import SpawnedChildren, report
    from .intercomm import Intercomm
    inner = comm._inner(w)
    root = check_root(inner, root, w)
    world = _pycomm.init()
    transport = transport_of(inner)
    started = []

    def at_root():
        apps = apps_at_root()
        children = SpawnedChildren(inner.size, apps, parent_job=world._engine.job_id,
                                   transport=transport,
                                   timeout=float(config.get("PYCOMM_TIMEOUT")),
                                   host=reachable_address(inner))
        try:
            children.start()
            children.wait_joined()
            children.watch(on_abort=_abort_job)
        except BaseException:
            children.close(wait=0.0)    # (idempotent: a failed start closed them already)
            raise
        started.append(children)
        return (children.store.host, children.store.port, children.token,
                children.job_id, children.size, [a.maxprocs for a in apps])
    host, port, token, job_id, size, counts = decided_at_root(inner, root, at_root, w,
                                                              "ERR_SPAWN")
    for children in started:
        own(lambda children=children: report(children.close()))
    job = bridge_job(inner.rank, size, host, port, token, job_id)
    link = join_bridge(job, inner.size, f"{comm.Get_name()}.{w}",
                       bridge_name("MPI_Comm_spawn", inner.size, size, "parents", "spawned"),
                       transport)
    if errcodes is not None:
        from . import SUCCESS
        if multiple:
            errcodes[:] = [[SUCCESS] * n for n in counts]
        else:
            errcodes[:] = [SUCCESS] * sum(counts)
    return Intercomm._wrap(link)


# -- the methods of MPI.Intracomm --------------------------------------------------------
def Spawn(self, command, args=None, maxprocs: int = 1, info=None, root: int = 0,
          errcodes: list | None = None):
    """Start ``maxprocs`` processes of ``command *args`` (MPI_Comm_spawn; collective,
    the arguments count at ``root`` only); see :mod:`pycomm.MPI.spawn`.

    Args:
        command: the executable (str, bytes or path-like), e.g. ``sys.executable``.
        args: its arguments (a sequence of str; a single str is one argument).
        maxprocs: how many processes (>= 1).
        info: ``MPI.Info`` with ``wdir``, ``path``, ``host``, ``soft``, or INFO_NULL.
        root: the rank whose arguments count.
        errcodes: a list, filled with one ``MPI.SUCCESS`` per process.

    Returns:
        MPI.Intercomm: this group local, the new processes remote (their
        ``COMM_WORLD`` ranks).

    Raises:
        ValueError, TypeError: (at ``root``) a bad argument.
        MPI.Exception: ERR_SPAWN (a process could not start, or exited before it
            joined; on the other ranks, the root's argument error), ERR_ROOT.
    """
    return spawn(self, lambda: [_app(command, args, maxprocs, _infos(info, 1)[0],
                                     "Spawn")], root, errcodes, "Spawn", False)


def Spawn_multiple(self, command, args=None, maxprocs=None, info=None, root: int = 0,
                   errcodes: list | None = None):
    """Start the processes of several commands in one ``COMM_WORLD``
    (MPI_Comm_spawn_multiple); as :meth:`Spawn`, per command.

    Args:
        command: a sequence of executables (a single str is a ``ValueError``).
        args: None, or one argument sequence per command (a str: the same single
            argument for each).
        maxprocs: None (1 each), an int (that many each), or one int per command.
        info: an ``MPI.Info`` for every command, or one per command.
        root, errcodes: as :meth:`Spawn` (``errcodes`` gets one list per command).

    Returns:
        MPI.Intercomm: the new processes remote, in command order.

    Raises:
        ValueError: (at ``root``) sequences of different lengths, a single command.
        TypeError, MPI.Exception: as :meth:`Spawn`.
    """
    def apps():
        if isinstance(command, (str, bytes)) or hasattr(command, "__fspath__"):
            raise ValueError("expecting a sequence of path-like")
        cmds = list(command)
        argvs = _argv_lists(args, len(cmds))
        counts = _procs_list(maxprocs, len(cmds))
        infos = _infos(info, len(cmds))
        return [_app(c, a, n, i, "Spawn_multiple")
                for c, a, n, i in zip(cmds, argvs, counts, infos)]
    return spawn(self, apps, root, errcodes, "Spawn_multiple", True)


# -- the children's side ----------------------------------------------------------------
def join_parents(bridge):
    """In a spawned process, at its world's creation: make the link to the parents and
    return this process's ``COMM_WORLD`` (the children alone), in the steps the parents
    take (:func:`pycomm.MPI.bridge.join_bridge`)."""
    global _parent
    parents = int(config.get("PYCOMM_SPAWN_PARENTS"))
    bridge.name = bridge_name("MPI_Comm_spawn", parents, bridge.size, "parents", "spawned")
    world = bridge.Split(1, bridge.rank)
    world.name = "pycomm.COMM_WORLD"

    def forget(link):
        global _parent
        with _lock:
            if _parent is link:
                _parent = None
    link = BridgeLink(bridge.Dup(), parents, False, "MPI_Comm_get_parent", on_free=forget)
    with _lock:
        _parent = link
    return world


def get_parent():
    """A spawned process's link to its parents (None: not spawned, or disconnected)."""
    if config.get("PYCOMM_SPAWN_PARENTS") is not None:
        _pycomm.init()                  # the link is made with the world
    return _parent
