"""Talking to one fork server (:mod:`pycomm.launch.zygote`): :class:`ForkServer` starts
it and asks it for ranks, :class:`ForkedProcess` is a rank's handle, answering as
:class:`subprocess.Popen` does. Which server a job uses, and when one is started, is
:mod:`pycomm.launch.forkserver`'s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack

__all__ = ["ForkServer", "ForkedProcess"]

_MAX_MESSAGE = 1 << 20      # bytes of one control message (a start request carries an env)
_START_S = 60.0             # the server's imports on a loaded machine
# bytes of the server's own command line (a last argument of spaces) that its ranks
# overwrite with theirs, so that ps shows each rank's program (pycomm.launch.zygote)
_TITLE_ROOM = 1024


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
