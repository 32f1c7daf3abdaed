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
name in the script's folder does not shadow them), every rank has the server's hash seed (set and dict orders of strings agree between ranks), and
at exit the interpreter does not tear its modules down (objects still alive then are not
finalized; exit hooks run). Programs started with interpreter options (``python -u
...``), other file kinds (a folder or zip with ``__main__.py``) or with
``PYCOMM_FORK_SERVER=0`` are started with :class:`subprocess.Popen` as before.

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
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import msgpack

from pycomm import config

__all__ = ["ForkServer", "ForkedProcess", "PRELOAD", "PRELOAD_MPI4PY", "in_forking_thread",
           "servable", "shared_server", "start_ranks"]

# What every rank of a pycomm program imports (pycomm.init's world and transports):
# importing them once here is the point; with PYCOMM_MPI4PY (launch.py --mpi4py, a
# spawn's children) the mpi4py façade too.
PRELOAD = ("numpy", "msgpack", "zmq", "cloudpickle", "pycomm", "pycomm.comm",
           "pycomm.launch.bootstrap", "transports.shm", "transports.tcp")
PRELOAD_MPI4PY = ("pycomm.MPI",)
_MAX_MESSAGE = 1 << 20      # bytes of one control message (a start request carries an env)
_START_S = 60.0             # the server's imports on a loaded machine
_PR_SET_PDEATHSIG = 1
# bytes of the server's own command line (a last argument of spaces) that its ranks
# overwrite with theirs, so that ps shows each rank's program (pycomm.launch.zygote)
_TITLE_ROOM = 1024
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


class ForkedProcess:
    """A rank forked by the server, answering as :class:`subprocess.Popen` does.

    ``returncode`` is None while the rank runs, then its exit code, or ``-N`` for signal N.
    """

    def __init__(self, pid: int, args, stdout, stderr):
        self.pid, self.args, self.stdout, self.stderr = pid, args, stdout, stderr
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit (``TimeoutExpired`` after ``timeout`` seconds)."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()


def _kill_session(pid: int) -> None:
    """SIGKILL the session a forked rank leads (it and what it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class ForkServer:
    """A fork server process (:mod:`pycomm.launch.zygote`): started with ``env`` (its
    ranks' environment less their per-job variables) and ``preexec`` (the PDEATHSIG
    set-up), ready when its imports are done.

    Raises:
        OSError: the server could not be started, or did not answer (its own stderr says
            why); the caller then starts its ranks with :class:`subprocess.Popen`.
    """

    def __init__(self, env: dict, preexec=None, wait: bool = True):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._reader: threading.Thread | None = None   # (started once the server is ready)
        self._ready_lock = threading.Lock()
        self._lock = threading.Lock()       # one start request at a time
        # The server answers requests in order: answer k is request k's. A request whose
        # answer came too late is abandoned: the rank it started is killed when the
        # answer comes, and its exit is not kept.
        self._sent = self._answered = 0
        self._answers: dict[int, list] = {}     # request number -> answer, unclaimed
        self._abandoned: set[int] = set()       # request numbers no caller waits for
        self._orphans: set[int] = set()         # pids of their ranks, killed, unreported
        self._reply_ready = threading.Condition()
        self._procs: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}    # exits reported before their handle was made
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pycomm.launch.zygote", str(theirs.fileno()),
                 " " * _TITLE_ROOM],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True,
                preexec_fn=preexec)  # noqa: PLW1509
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait for the server's imports (its first message), once; then its reports are
        read by a thread of this process.

        Raises:
            OSError: the server did not answer ready; it is closed.
        """
        with self._ready_lock:
            if self._reader is not None:
                return
            sock = self._sock
            try:
                sock.settimeout(_START_S)
                first = msgpack.unpackb(sock.recv(_MAX_MESSAGE))
            except (OSError, ValueError) as exc:
                self.close()
                raise OSError(f"the fork server did not start: {exc}") from None
            if first != ["ready"]:
                self.close()
                raise OSError(f"the fork server did not start: {first!r}")
            sock.settimeout(None)
            self._reader = threading.Thread(target=self._read, name="pycomm-forkserver",
                                            daemon=True)
            self._reader.start()

    def start(self, argv, env: dict, cwd: str | None, stdin, stdout, stderr) -> ForkedProcess:
        """Fork a rank running ``python *argv`` (:func:`servable` must hold) with these
        descriptors (``stdin`` None: /dev/null; ``stdout``, ``stderr``: ``(read end for
        the handle or None, descriptor for the rank)``), each closed here.

        Raises:
            OSError: the server is gone or could not fork.
        """
        fds = [stdin if stdin is not None else os.open(os.devnull, os.O_RDONLY),
               stdout[1], stderr[1]]
        request = msgpack.packb({"argv": list(argv), "env": env, "cwd": cwd or os.getcwd()})
        try:
            with self._lock:
                socket.send_fds(self._sock, [request], fds)
                self._sent += 1
                reply = self._reply(self._sent - 1, _START_S)
        finally:
            for fd in fds:
                os.close(fd)
        if reply[0] != "started":
            raise OSError(f"the fork server could not start {argv!r}: {reply[1]}")
        pid = reply[1]
        proc = ForkedProcess(pid, [sys.executable, *argv],
                             *(None if fd is None else os.fdopen(fd, "rb", 0)
                               for fd in (stdout[0], stderr[0])))
        with self._reply_ready:
            self._procs[pid] = proc
            early = self._early.pop(pid, None)
        if early is not None:
            proc._exited(early)
        return proc

    def _reply(self, number: int, timeout: float):
        """Request ``number``'s answer, or a failure after ``timeout`` seconds (the
        request is then abandoned: see ``_read``)."""
        deadline = time.monotonic() + timeout
        with self._reply_ready:
            while number not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    self._abandoned.add(number)
                    return ["failed", "the fork server is gone" if left > 0 else
                            f"no answer from the fork server in {timeout:g} s"]
                self._reply_ready.wait(min(left, 0.5))
            return self._answers.pop(number)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = msgpack.unpackb(data)
            with self._reply_ready:
                if msg[0] == "exit":
                    proc = self._procs.pop(msg[1], None)
                    if proc is None and msg[1] in self._orphans:
                        self._orphans.discard(msg[1])
                    elif proc is None:
                        self._early[msg[1]] = msg[2]
                else:
                    number = self._answered
                    self._answered += 1
                    if number not in self._abandoned:
                        self._answers[number] = msg
                        self._reply_ready.notify_all()
                    else:
                        self._abandoned.discard(number)
                        if msg[0] == "started":     # a rank no launcher knows of
                            self._orphans.add(msg[1])
                            _kill_session(msg[1])
            if msg[0] == "exit" and proc is not None:
                proc._exited(msg[2])
        # the server is gone (killed): a rank it did not report is reported lost
        with self._reply_ready:
            lost = list(self._procs.values())
            self._procs.clear()
            self._reply_ready.notify_all()
        for proc in lost:
            proc._exited(-signal.SIGKILL)   # (its parent-death signal)

    def alive(self) -> bool:
        """Whether the server still serves (its process and the socket's reader run)."""
        return self.proc.poll() is None and (self._reader is None or
                                             self._reader.is_alive())

    def close(self, wait: float = 5.0) -> None:
        """Close the control socket; the server exits once its ranks have. Waits up to
        ``wait`` seconds for that (0: not at all), then kills it."""
        try:    # (shut down first: the reader thread's recv holds the socket open)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        if wait <= 0:
            return
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
