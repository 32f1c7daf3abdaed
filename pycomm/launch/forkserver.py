"""A fork server: rank processes forked from one that has already imported numpy and pycomm.

A rank started as ``python prog.py`` spends most of its start-up importing numpy and pycomm
(about 0.3 s of CPU each on a small machine; benchmarks/README.md), and a job of N ranks
pays that N times, on cores the ranks then share. The launcher (:class:`RankGroup
<pycomm.launch.launcher.RankGroup>`) instead starts one server per job, ``python -m
pycomm.launch.forkserver``, with rank 0's environment; the server imports what every rank
imports (:data:`PRELOAD`) once, then forks each rank, which runs its program as
``python`` would:

* ``PROG [args]`` (a ``.py`` file), ``-m MODULE [args]`` or ``-c CODE [args]``, with
  ``sys.argv``, ``sys.path[0]`` (the script's folder, the working directory for ``-m``,
  ``''`` for ``-c``), a fresh ``__main__`` module, the rank's own environment, working
  directory and stdin/stdout/stderr (passed as file descriptors over the control socket);
* in its own session, with ``PR_SET_PDEATHSIG=SIGKILL`` (the server has the same on the
  launcher, so a SIGKILLed launcher still takes every rank along);
* an uncaught exception prints its traceback without the server's frames and exits 1,
  ``sys.exit`` and signals end it as they end ``python``; numpy's global random state is
  seeded again from the OS (the server's seed would otherwise be every rank's; Python's
  ``random`` module does this itself at a fork).

What differs from a ``python`` started afresh: the modules of :data:`PRELOAD` are already
imported (a module of the same name in the script's folder does not shadow them), and
every rank has the server's ``PYTHONHASHSEED``-derived hash seed (set and dict orders of
strings agree between ranks). Programs started with interpreter options (``python -u
...``), other file kinds (a folder or zip with ``__main__.py``) or with
``PYCOMM_FORK_SERVER=0`` are started with :class:`subprocess.Popen` as before.

The launcher holds :class:`ForkedProcess` handles, which answer as
:class:`subprocess.Popen` does (``pid``, ``poll``, ``wait``, ``returncode``, ``stdout``,
``stderr``): only the server, the ranks' parent, can reap them, so it reports each exit
over the control socket (a ``SOCK_SEQPACKET`` pair: one msgpack message per datagram, the
rank's three descriptors beside its start request). The design is Android's zygote and
Python's own ``multiprocessing`` forkserver, which this cannot reuse: that one imports the
parent's ``__main__`` into each child and runs functions, not programs.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from importlib.machinery import SourceFileLoader

import msgpack

from pycomm import config

__all__ = ["ForkServer", "ForkedProcess", "PRELOAD", "servable", "start_ranks"]

# What every rank of a pycomm program imports (pycomm.init's world and transports; the
# mpi4py façade for launch.py --mpi4py): importing them once here is the point.
PRELOAD = ("numpy", "msgpack", "zmq", "cloudpickle", "pycomm", "pycomm.comm",
           "pycomm.launch.bootstrap", "transports.shm",
           "transports.tcp", "pycomm.MPI")
_MAX_MESSAGE = 1 << 20      # bytes of one control message (a start request carries an env)
_START_S = 60.0             # the server's imports on a loaded machine
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def servable(argv) -> bool:
    """Whether ``python *argv`` can be forked from the server: a ``.py`` file, ``-m`` or
    ``-c``, with no interpreter option before it."""
    if not argv:
        return False
    first = argv[0]
    if first in ("-m", "-c"):
        return len(argv) >= 2
    return not first.startswith("-") and first.endswith(".py") and os.path.isfile(first)


# -- the launcher's side ------------------------------------------------------------------

def start_ranks(argv, envs: list[dict], stdin_index: int | None, capture: bool,
                preexec) -> tuple[list, ForkServer | None]:
    """Start one process per environment of ``envs`` running ``python *argv``: forked
    from a new :class:`ForkServer` (returned, for the caller to close after its ranks)
    when :func:`servable` and ``PYCOMM_FORK_SERVER`` allow and it starts, else with
    :class:`subprocess.Popen`; either way in its own session with ``preexec``'s
    parent-death signal. The process at ``stdin_index`` reads this process's stdin, the
    others /dev/null; ``capture``: stdout and stderr are pipes (the handles' ``stdout``
    and ``stderr``), else this process's own. On an error, the processes started are
    killed and the server closed.

    Raises:
        OSError: a process could not be started.
    """
    server = None
    if config.get("PYCOMM_FORK_SERVER", envs[0]) and servable(argv):
        try:
            server = ForkServer(envs[0], preexec)
        except OSError:     # (its stderr said why) each rank starts afresh
            server = None
    procs: list = []
    try:
        for i, env in enumerate(envs):
            if server is not None:
                procs.append(server.start(
                    argv, env, None, os.dup(0) if i == stdin_index else None,
                    os.pipe() if capture else (None, os.dup(1)),
                    os.pipe() if capture else (None, os.dup(2))))
                continue
            pipe = subprocess.PIPE if capture else None
            procs.append(subprocess.Popen(
                [sys.executable, *argv], env=env,
                stdin=None if i == stdin_index else subprocess.DEVNULL, stdout=pipe,
                stderr=pipe, start_new_session=True, preexec_fn=preexec))  # noqa: PLW1509
    except BaseException:
        for proc in procs:
            proc.kill()
        if server is not None:
            server.close()
        raise
    return procs, server


class ForkedProcess:
    """A rank forked by the server, answering as :class:`subprocess.Popen` does.

    ``returncode`` is None while the rank runs, then its exit code, or ``-N`` for signal N.
    """

    def __init__(self, server: ForkServer, pid: int, args, stdout, stderr):
        self.pid, self.args, self.stdout, self.stderr = pid, args, stdout, stderr
        self.returncode: int | None = None
        self._server = server
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


class ForkServer:
    """One job's fork server: started with ``env`` (rank 0's environment) and ``preexec``
    (the launcher's PDEATHSIG set-up), ready when its imports are done.

    Raises:
        OSError: the server could not be started, or did not answer (its own stderr says
            why); the caller then starts its ranks with :class:`subprocess.Popen`.
    """

    def __init__(self, env: dict, preexec=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()       # one start request at a time
        self._replies: list = []
        self._reply_ready = threading.Condition()
        self._procs: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}    # exits reported before their handle was made
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pycomm.launch.forkserver", str(theirs.fileno())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True,
                preexec_fn=preexec)  # noqa: PLW1509
        finally:
            theirs.close()
        ours.settimeout(_START_S)
        try:
            first = msgpack.unpackb(ours.recv(_MAX_MESSAGE))
        except (OSError, ValueError) as exc:
            self.close()
            raise OSError(f"the fork server did not start: {exc}") from None
        if first != ["ready"]:
            self.close()
            raise OSError(f"the fork server did not start: {first!r}")
        ours.settimeout(None)
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
                reply = self._reply(_START_S)
        finally:
            for fd in fds:
                os.close(fd)
        if reply[0] != "started":
            raise OSError(f"the fork server could not start {argv!r}: {reply[1]}")
        pid = reply[1]
        proc = ForkedProcess(self, pid, [sys.executable, *argv],
                             *(None if fd is None else os.fdopen(fd, "rb", 0)
                               for fd in (stdout[0], stderr[0])))
        with self._reply_ready:
            self._procs[pid] = proc
            early = self._early.pop(pid, None)
        if early is not None:
            proc._exited(early)
        return proc

    def _reply(self, timeout: float):
        deadline = time.monotonic() + timeout
        with self._reply_ready:
            while not self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return ["failed", "no answer from the fork server"]
                self._reply_ready.wait(min(left, 0.5))
            return self._replies.pop(0)

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
                    proc = self._procs.get(msg[1])
                    if proc is None:
                        self._early[msg[1]] = msg[2]
                else:
                    self._replies.append(msg)
                    self._reply_ready.notify_all()
            if msg[0] == "exit" and proc is not None:
                proc._exited(msg[2])
        # the server is gone (killed): a rank it did not report is reported lost
        with self._reply_ready:
            lost = [p for p in self._procs.values() if p.returncode is None]
            self._reply_ready.notify_all()
        for proc in lost:
            proc._exited(-signal.SIGKILL)   # (its parent-death signal)

    def close(self, timeout: float = 5.0) -> None:
        """Close the control socket; the server exits once its ranks have."""
        try:    # (shut down first: the reader thread's recv holds the socket open)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the server's side --------------------------------------------------------------------

def _serve(sock: socket.socket) -> dict | None:
    """Fork ranks on request and report their exits; return the request in a forked child
    (which then runs its program), None in the server once the launcher has closed the
    socket and every rank has exited."""
    children: set[int] = set()
    wake_r, wake_w = os.pipe()          # SIGCHLD wakes the select (an exit is reported
    os.set_blocking(wake_w, False)      # when it happens, not at a polling tick)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server_pid = os.getpid()
    closed = False
    while not closed or children:
        ready = select.select([wake_r] if closed else [sock, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 512)
        while children:                 # reap every rank that has exited
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if not pid:
                break
            children.discard(pid)
            if not closed:
                try:
                    sock.send(msgpack.packb(["exit", pid, os.waitstatus_to_exitcode(status)]))
                except OSError:
                    closed = True
        if closed or sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            closed = True
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            sock.send(msgpack.packb(["failed", str(exc)]))
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            request = msgpack.unpackb(data)
            _become_rank(sock, fds, request, server_pid)
            return request
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(msgpack.packb(["started", pid]))
    return None


def _become_rank(sock: socket.socket, fds: list[int], request: dict, server_pid: int) -> None:
    """In a forked child: the rank's session, parent-death signal, descriptors, working
    directory and environment, as ``subprocess.Popen(start_new_session=True)`` with the
    launcher's preexec would give it."""
    os.setsid()
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server_pid:      # the server died before prctl took effect
        os._exit(1)
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    from pycomm import config
    config.reload()


def _run(request: dict) -> None:
    """Run the rank's program in a fresh ``__main__``, as ``python *argv`` does."""
    argv = request["argv"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.orig_argv = [sys.executable, *argv]
    kind = argv[0] if argv[0] in ("-m", "-c") else "file"
    sys.argv = list(argv) if kind == "file" else [kind, *argv[2:]]
    sys.path[0] = {"-m": os.getcwd(), "-c": ""}.get(
        kind, os.path.dirname(os.path.realpath(argv[0])))
    try:
        if kind == "-m":
            import runpy
            runpy._run_module_as_main(argv[1], alter_argv=True)  # noqa: SLF001 (python -m's)
        else:
            if kind == "-c":
                code = compile(argv[1], "<string>", "exec")
            else:           # (python makes the script's name absolute for __file__)
                path = os.path.abspath(argv[0])
                with open(path, "rb") as fh:
                    code = compile(fh.read(), path, "exec")
                main.__dict__.update(__file__=path, __cached__=None,
                                     __loader__=SourceFileLoader("__main__", path))
            exec(code, main.__dict__)      # noqa: S102 (the rank's program)
        status = 0
    except KeyboardInterrupt:
        raise           # (python then ends by SIGINT, after its whole finalization)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:        # as the interpreter reports an uncaught one
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        exc = exc.with_traceback(tb)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc, tb)
        status = 1
    _finalize(status)


def _exit_status(code) -> int:
    """The exit status of ``SystemExit(code)``, its message printed, as python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:   # noqa: BLE001 (python ignores a failing print here too)
        pass
    return 1


def _finalize(status: int) -> None:
    """End the rank as the interpreter's own finalization would, up to what a rank can
    observe: wait for its non-daemon threads, run its exit hooks, flush its streams; then
    leave without tearing down the modules the server imported (about 0.1 s of CPU per
    rank that would otherwise go to garbage collection alone)."""
    import atexit
    threading._shutdown()           # noqa: SLF001 (what Py_FinalizeEx calls first)
    atexit._run_exitfuncs()         # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # noqa: BLE001 (a closed or broken stream: as python)
            pass
    os._exit(status)


def _main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the launcher forwards signals
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:     # an optional part (zmq always is there; pycomm.MPI's deps)
            pass
    sock.send(msgpack.packb(["ready"]))
    request = _serve(sock)
    if request is None:
        os._exit(0)     # the server: nothing to flush, no interpreter teardown to wait for
    _run(request)


if __name__ == "__main__":
    _main()
