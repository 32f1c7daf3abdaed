"""The fork server's own process (``python -m pycomm.launch.zygote FD PADDING``): import
what every rank imports, then fork each rank on request, report the exits, and run the
program in each forked child as ``python`` would. What it promises and why it exists:
:mod:`pycomm.launch.forkserver`, which starts it (its control socket is descriptor ``FD``;
``PADDING``, spaces, is room for the ranks' command lines, :func:`_retitle`).
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import os
import select
import signal
import socket
import sys
import threading
import types
from importlib.machinery import SourceFileLoader

import msgpack

from pycomm.launch.forkclient import _MAX_MESSAGE, _TITLE_ROOM
from pycomm.launch.forkserver import PRELOAD, PRELOAD_MPI4PY, _preexec

__all__: list[str] = []


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
    gc.enable()
    _preexec(server_pid)()      # PDEATHSIG, as the server's own Popen children get it
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


def _retitle(words: list[str]) -> None:
    """Make ``ps`` and ``/proc/<pid>/cmdline`` show ``words`` for this forked rank (else
    they show the server's command line), as setproctitle does: the kernel reads a
    process's command line from the memory its argv strings occupy (``arg_start`` ..
    ``arg_end`` in ``/proc/self/stat``), which is writable; the server's last argument
    made room. Best effort: a command line longer than the room is cut."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])      # (stat fields 48 and 49)
    except (OSError, ValueError, IndexError):
        return
    room = end - start
    if not 0 < room <= _TITLE_ROOM + 4096:      # not the layout the server made
        return
    title = b"\0".join(os.fsencode(w) for w in words)[:room - 1]
    ctypes.memmove(start, title + b"\0" * (room - len(title)), room)


def _run(request: dict) -> None:
    """Run the rank's program in a fresh ``__main__``, as ``python *argv`` does."""
    argv = request["argv"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.orig_argv = [sys.executable, *argv]
    _retitle(sys.orig_argv)
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
    # The imports' objects go to the collector's permanent generation (gc.freeze, as its
    # documentation advises before fork without exec): a rank's collections then neither
    # traverse them nor write their headers, which would copy the shared pages.
    gc.disable()
    from pycomm import config
    for name in PRELOAD + (PRELOAD_MPI4PY if config.get("PYCOMM_MPI4PY") else ()):
        try:
            __import__(name)
        except ImportError:     # an optional part (zmq always is there; pycomm.MPI's deps)
            pass
    gc.freeze()
    sock.send(msgpack.packb(["ready"]))
    request = _serve(sock)
    if request is None:
        os._exit(0)     # the server: nothing to flush, no interpreter teardown to wait for
    _run(request)


if __name__ == "__main__":
    _main()
