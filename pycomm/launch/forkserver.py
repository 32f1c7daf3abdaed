"""A fork server: rank processes forked from one that has already imported numpy and pycomm.

A rank started as ``python prog.py`` spends most of its start-up importing numpy and pycomm
(about 0.3 s of CPU each on a small machine; benchmarks/README.md), and a job of N ranks
pays that N times, on cores the ranks then share. Instead, a process that starts ranks
(``launch.py``, a node agent, :class:`pycomm.Pool` and ``pycomm.spawn``, the root of an
``MPI.Comm.Spawn``) starts a server, ``python -m pycomm.launch.zygote`` (the server's
side, :mod:`pycomm.launch.zygote`), which imports what every rank imports
(:data:`PRELOAD`) once, then forks each rank, which runs its program as ``python`` would:

* ``PROG [args]`` (a ``.py`` file), ``-m MODULE [args]`` or ``-c CODE [args]``, with
  ``sys.argv``, ``sys.path[0]`` (the script's folder, the working directory for ``-m``,
  ``''`` for ``-c``), a fresh ``__main__`` module, the rank's own environment, working
  directory and stdin/stdout/stderr (passed as file descriptors over the control socket),
  and its own command line in ``ps`` (:func:`pycomm.launch.zygote._retitle`);
* in its own session, with ``PR_SET_PDEATHSIG=SIGKILL`` (the server has the same on the
  process that started it, so a SIGKILLed launcher still takes every rank along);
* an uncaught exception prints its traceback without the server's frames and exits 1,
  ``sys.exit`` and signals end it as they end ``python``, after its threads and exit
  hooks; numpy's global random state is seeded again from the OS (the server's seed
  would otherwise be every rank's; Python's ``random`` module does this itself at a fork).

The server lives as long as the process that started it (:func:`shared_server`): later
jobs with the same environment (but for pycomm's per-job variables) are forked from it at
once, without its start-up.

What differs from a ``python`` started afresh: the modules of :data:`PRELOAD` (and
:data:`PRELOAD_MPI4PY` with ``PYCOMM_MPI4PY``) are already imported (a module of the same
name in the script's folder does not shadow them), every rank has the server's hash
seed (set and dict orders of strings agree between ranks), and at exit the interpreter
does not tear its modules down (objects still alive then are not finalized; exit hooks
run). Programs started with interpreter options (``python -u ...``), other file kinds
(a folder or zip with ``__main__.py``) or with ``PYCOMM_FORK_SERVER=0`` are started with
:class:`subprocess.Popen` as before.

The starting process holds :class:`ForkedProcess` handles, which answer as
:class:`subprocess.Popen` does (``pid``, ``poll``, ``wait``, ``returncode``, ``stdout``,
``stderr``): only the server, the ranks' parent, can reap them, so it reports each exit
over the control socket (a ``SOCK_SEQPACKET`` pair: one msgpack message per datagram, the
rank's three descriptors beside its start request). The design is Android's zygote and
Python's own ``multiprocessing`` forkserver, which this cannot reuse: that one imports the
parent's ``__main__`` into each child and runs functions, not programs.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future

from pycomm import config
from pycomm.launch.forkclient import ForkedProcess, ForkServer

__all__ = ["ForkServer", "ForkedProcess", "PRELOAD", "PRELOAD_MPI4PY", "in_forking_thread",
           "servable", "shared_server", "start_ranks"]

# What every rank of a pycomm program imports (pycomm.init's world and transports):
# importing them once here is the point; with PYCOMM_MPI4PY (launch.py --mpi4py, a
# spawn's children) the mpi4py façade too.
PRELOAD = ("numpy", "msgpack", "zmq", "cloudpickle", "pycomm", "pycomm.comm",
           "pycomm.launch.bootstrap", "transports.shm", "transports.tcp")
PRELOAD_MPI4PY = ("pycomm.MPI",)
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
except (OSError, AttributeError):
    _prctl = None


def servable(argv, cwd: str | None = None) -> bool:
    """Whether ``python *argv`` (run in ``cwd``, None: here) can be forked from the
    server: a ``.py`` file, ``-m`` or ``-c``, with no interpreter option before it."""
    if not argv:
        return False
    first = argv[0]
    if first in ("-m", "-c"):
        return len(argv) >= 2
    return (not first.startswith("-") and first.endswith(".py")
            and os.path.isfile(os.path.join(cwd or "", first)))


# -- the launcher's side ------------------------------------------------------------------

def _preexec(parent_pid: int):
    """A ``preexec_fn`` giving a child ``PR_SET_PDEATHSIG=SIGKILL`` (it dies with the
    thread that forked it), or exiting it if ``parent_pid`` is already gone."""
    # preexec_fn runs between fork and exec while other threads (the store, zmq) exist. It
    # only calls a prctl resolved before the fork and getppid: no locks, no allocation
    # worth the name; this is the one way to get PDEATHSIG without a wrapper process.
    def run_in_child() -> None:  # between fork and exec: nothing that takes locks
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)
    return run_in_child


# -- the thread that forks every server (and every MPI_Comm_spawn child) ------------------
# PR_SET_PDEATHSIG follows the *thread* that forked: a child forked from a thread that
# ends (a pool made in a worker thread, mpi4py.futures' spawning thread) would be killed
# with it. One long-lived daemon thread forks them all, so they die with the process only.
_forker: queue.Queue | None = None
_forker_lock = threading.Lock()


def _forker_main(jobs: queue.Queue) -> None:
    while True:
        fn, future = jobs.get()
        try:
            future.set_result(fn())
        except BaseException as exc:       # handed to the caller, which raises it
            future.set_exception(exc)


def in_forking_thread(fn):
    """Run ``fn()`` in the process's forking thread (started on first use); return its
    result or raise its exception."""
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = queue.Queue()
            threading.Thread(target=_forker_main, args=(_forker,), name="pycomm-forker",
                             daemon=True).start()
    future: Future = Future()
    _forker.put((fn, future))
    return future.result()


# -- one server per environment, for the process's lifetime ------------------------------
# A process that starts several jobs (a notebook's pycomm.spawn calls, a test session's
# pools) pays for the server's imports once: jobs whose environments agree but for
# pycomm's per-job variables share it. Closed at exit (the ranks are gone by then: their
# groups stopped them).
_servers: dict[frozenset, ForkServer] = {}    # the most recently used last
_servers_lock = threading.Lock()
_MAX_SERVERS = 4        # (each holds its imports' memory, shared with its ranks)
# pycomm variables read at import (pycomm.trace's ring size) or by the server (what it
# imports): a server per value
_READ_AT_IMPORT = ("PYCOMM_TRACE_CALLS", "PYCOMM_MPI4PY")


def _server_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if not k.startswith("PYCOMM_") or k in _READ_AT_IMPORT}


def shared_server(env: dict, start: bool = True) -> ForkServer | None:
    """The process's fork server for a rank environment like ``env`` (started on first
    use, from the forking thread, unless ``start`` is False), ready (its imports done), or
    None when there is none or none can be started."""
    server_env = _server_env(env)
    key = frozenset(server_env.items())
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is not None and not server.alive():
            server.close(wait=0.0)      # (killed: its socket and reader go too)
            server = None
        if server is None:
            if not start:
                return None
            server = _start_server(server_env)
            if server is None:
                return None
        try:
            server.wait_ready()
        except OSError:         # (its stderr said why; it is closed) the ranks start afresh
            return None
        _servers[key] = server
        return server


def prestart(argv, env: dict) -> None:
    """Start the fork server for ranks running ``python *argv`` in ``env`` without
    waiting for its imports, where :func:`start_ranks` would use one: a launcher calls
    this before its own imports and its store, which then run while the server imports
    numpy and pycomm. :func:`shared_server` waits for it later. Nothing is raised: a
    server that fails to start is not used, and the ranks start afresh."""
    if not (config.get("PYCOMM_FORK_SERVER", env) and servable(argv)):
        return
    server_env = _server_env(env)
    key = frozenset(server_env.items())
    with _servers_lock:
        if key not in _servers:
            server = _start_server(server_env, wait=False)
            if server is not None:
                _servers[key] = server


def _start_server(server_env: dict, wait: bool = True) -> ForkServer | None:
    """A new server for ``server_env``, started from the forking thread (a child's
    PDEATHSIG follows the thread that forked it), making room among the process's
    servers; None if it could not be started. Called with ``_servers_lock`` held."""
    try:
        server = in_forking_thread(
            lambda: ForkServer(server_env, _preexec(os.getpid()), wait=wait))
    except OSError:         # (its stderr said why) the ranks start afresh
        return None
    if len(_servers) >= _MAX_SERVERS:   # the least recently used goes (once its ranks
        _servers.pop(next(iter(_servers))).close(wait=0.0)      # have)
    return server


def _close_servers() -> None:
    for server in list(_servers.values()):
        server.close(wait=0.0)
    _servers.clear()


def _after_fork_in_child() -> None:
    """A process forked from this one (multiprocessing's fork) does not share its
    parent's servers (their sockets are the parent's conversations) or forking thread
    (which the child does not have)."""
    global _forker, _forker_lock, _servers_lock
    _servers.clear()        # (their sockets are closed when collected, not shut down)
    _forker = None
    _forker_lock, _servers_lock = threading.Lock(), threading.Lock()   # (maybe held)


atexit.register(_close_servers)
os.register_at_fork(after_in_child=_after_fork_in_child)


def start_ranks(argv, envs: list[dict], stdin_index: int | None, capture: bool,
                preexec) -> list:
    """Start one process per environment of ``envs`` running ``python *argv``: forked
    from the process's :func:`shared_server` when :func:`servable` and
    ``PYCOMM_FORK_SERVER`` allow, it answers, and there are several ranks or a server
    runs already; else with :class:`subprocess.Popen` and ``preexec``. Either way in its
    own session, dying with this process. The process at ``stdin_index`` reads this
    process's stdin, the others /dev/null; ``capture``: stdout and stderr are pipes (the
    handles' ``stdout`` and ``stderr``), else this process's own. On an error, the
    processes started are killed.

    Raises:
        OSError: a process could not be started.
    """
    server = None
    if config.get("PYCOMM_FORK_SERVER", envs[0]) and servable(argv):
        # (one rank is started sooner afresh than through a new server's start-up)
        server = shared_server(envs[0], start=len(envs) > 1)
    procs: list = []
    try:
        for i, env in enumerate(envs):
            if server is not None:
                out, err = ((os.pipe(), os.pipe()) if capture else
                            ((None, os.dup(1)), (None, os.dup(2))))
                try:        # (start closes what the rank gets; the read ends are ours)
                    procs.append(server.start(argv, env, None,
                                              os.dup(0) if i == stdin_index else None,
                                              out, err))
                    continue
                except OSError:
                    for fd in (out[0], err[0]):
                        if fd is not None:
                            os.close(fd)
                    if procs:       # it failed within this job: no second try
                        raise
                    server = None   # gone before this job began: start afresh
            pipe = subprocess.PIPE if capture else None
            procs.append(subprocess.Popen(
                [sys.executable, *argv], env=env,
                stdin=None if i == stdin_index else subprocess.DEVNULL, stdout=pipe,
                stderr=pipe, start_new_session=True, preexec_fn=preexec))  # noqa: PLW1509
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    return procs
