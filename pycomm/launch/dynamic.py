"""Processes started while a job runs: the spawning root's side of ``MPI_Comm_spawn``.

:mod:`pycomm.MPI.spawn` joins the spawning communicator's ``p`` processes (the parents)
and the ``m`` new ones (the children) in a *bridge world*: a pycomm job of ``p + m``
ranks with its own rendezvous store, secret and id, in which the parents are ranks
``0..p-1`` in their communicator's order and the children ``p..p+m-1`` in the order of
the commands. :class:`SpawnedChildren` is what the spawn's root owns of it: the store
(served from the root's process), the children's processes, and their end.

How a child is started: ``command *args`` on the root's host, in ``wdir`` if given, with
the launcher's contract for its bridge rank (:func:`pycomm.launch.launcher.contract_env`),
``PYCOMM_SPAWN_PARENTS=p``, ``PYCOMM_APPNUM`` (its command's index) and the variables that
make ``import mpi4py`` give :mod:`pycomm.MPI` (:mod:`pycomm.launch.mpi4pyenv`). Its
output goes where the root's goes. Hydra (MPICH's ``mpiexec``) starts spawned processes
the same way: on its own hosts, with a new PMI key space whose ``KVS`` name it passes down.

Lifetime (no child outlives the root's process):

* a child that is a Python program of this interpreter is forked from the root's fork
  server (:func:`pycomm.launch.forkserver.shared_server`; a spawn after the first skips
  its start-up), any other is started by one long-lived daemon thread of the root's
  process (:func:`pycomm.launch.forkserver.in_forking_thread`), which also starts the
  server; either way it gets ``PR_SET_PDEATHSIG`` through that thread, which ends at the
  process's exit at the latest. (The signal follows the thread that forked, not the
  process: a child forked by a short-lived thread, such as ``mpi4py.futures``' pool
  thread, would be killed when that thread ended.)
* :meth:`SpawnedChildren.close` (at the root's exit, from :mod:`pycomm.MPI.spawn`) waits
  up to ``PYCOMM_TIMEOUT`` seconds for the children to exit, as ``mpiexec`` waits for
  every process of its job, then stops what is left, closes the store and removes the
  bridge's /dev/shm segments;
* the bridge's job id starts with the root's own job id, so the launcher that started
  the root sweeps the bridge's segments too (:func:`pycomm.launch.launcher.sweep_shm`)
  when the root is killed before it could.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from .. import config, stall
from ..errors import CommError, CommTimeoutError
from . import forkserver
from .forkserver import _preexec, in_forking_thread
from .launcher import contract_env, sweep_shm
from .mpi4pyenv import environment as mpi4py_environment
from .store import StoreServer
from .store_client import StoreClient

__all__ = ["App", "SpawnError", "SpawnedChildren"]

_POLL_S = 0.05      # seconds between looks at the children while they join


class SpawnError(CommError):
    """A child could not be started, or exited before it joined the bridge world."""


@dataclass(frozen=True)
class App:
    """One command of a spawn: ``command *args``, ``maxprocs`` copies, in ``wdir``.

    Args:
        command: an executable's path or name (looked up on ``PATH``).
        args: its arguments.
        maxprocs: how many processes run it (>= 1).
        wdir: their working directory (None: the root's).
    """

    command: str
    args: tuple[str, ...]
    maxprocs: int
    wdir: str | None = None


def _forked(app: App, env: dict):
    """A child of ``app`` forked from the process's fork server
    (:mod:`pycomm.launch.forkserver`), when it is a Python program this interpreter runs;
    else None (it is then started as a new process)."""
    command = shutil.which(app.command) or app.command
    if not (config.get("PYCOMM_FORK_SERVER", env) and os.path.exists(command)
            and os.path.samefile(command, sys.executable)
            and forkserver.servable(app.args, app.wdir)):
        return None
    server = forkserver.shared_server(env)
    if server is None:
        return None
    try:        # (stdout and stderr this process's, as a started child's)
        return server.start(list(app.args), env, app.wdir, None, (None, os.dup(1)),
                            (None, os.dup(2)))
    except OSError:
        return None


class SpawnedChildren:
    """The children of one spawn and their bridge world's store (see the module
    docstring); made at the spawn's root.

    Args:
        parents: the spawning communicator's size ``p``.
        apps: the commands, in order (their processes are bridge ranks ``p``, ...).
        parent_job: the root's own job id (the bridge's id starts with it).
        transport: ``PYCOMM_TRANSPORT`` of the children (the parents' choice).
        timeout: seconds for the children to join, and for them to exit at :meth:`close`.
        host: the address the store binds, which every parent must reach.

    Raises:
        zmq.ZMQError: the store cannot bind a port.
    """

    def __init__(self, parents: int, apps: list[App], *, parent_job: str, transport: str,
                 timeout: float, host: str = "127.0.0.1"):
        self.parents, self.apps, self.timeout = parents, list(apps), float(timeout)
        self.size = parents + sum(a.maxprocs for a in self.apps)
        self.job_id = f"{parent_job}-s{uuid.uuid4().hex[:8]}"
        self.token = secrets.token_hex(32)
        self.transport = transport
        self.store = StoreServer(self.token, host, 0)
        self.procs: list[subprocess.Popen] = []
        self.labels: list[str] = []     # per child: "rank r (command ...)"
        self._closed = False
        self._stop_watch = threading.Event()

    def start(self) -> None:
        """Start every child (stopping those started when one cannot be).

        Raises:
            SpawnError: a command could not be started (not found, not executable).
        """
        base = {**os.environ, **mpi4py_environment()}
        rank = self.parents
        for appnum, app in enumerate(self.apps):
            for _ in range(app.maxprocs):
                env = {**base, **contract_env(rank, self.size, rank, self.size,
                                              self.store.host, self.store.port, self.token,
                                              self.job_id, self.transport, self.timeout),
                       "PYCOMM_SPAWN_PARENTS": str(self.parents),
                       "PYCOMM_APPNUM": str(appnum)}
                argv = [app.command, *app.args]
                label = f"spawned rank {rank - self.parents} ({' '.join(argv)[:200]})"
                def fork(argv=argv, env=env, wdir=app.wdir):
                    return subprocess.Popen(argv, env=env, cwd=wdir, stdin=subprocess.DEVNULL,
                                            start_new_session=True,
                                            preexec_fn=_preexec(os.getpid()))  # noqa: PLW1509
                try:
                    proc = _forked(app, env) or in_forking_thread(fork)
                except OSError as exc:
                    self.close(wait=0.0)
                    raise SpawnError(f"cannot start {label}: {exc}") from None
                self.procs.append(proc)
                self.labels.append(label)
                rank += 1

    def watch(self, on_abort) -> None:
        """Stop every child once one calls ``Comm.Abort`` (a thread; as the launcher does
        for its ranks, :meth:`pycomm.launch.launcher.RankGroup.supervise`: the aborting
        child waits, alive, to be stopped with the others), then call
        ``on_abort(spawned rank, code)`` (:mod:`pycomm.MPI.spawn` ends the root's own job
        there, as ``mpiexec`` ends the whole job of an ``MPI_Abort`` in a spawned
        process)."""
        threading.Thread(target=self._watch, args=(on_abort,), name="pycomm-spawn-watch",
                         daemon=True).start()

    def _watch(self, on_abort) -> None:
        key = stall.key(self.job_id, "abort")
        while not self._stop_watch.wait(_POLL_S):
            note = stall.parse_abort(self.store.peek(key))
            if note is not None:
                self._stop(list(self.procs))
                on_abort(note[0] - self.parents, note[1])
                return

    def _stop(self, procs: list) -> None:
        """SIGTERM, then SIGKILL after ``PYCOMM_KILL_GRACE`` seconds, to ``procs``' groups."""
        grace = float(config.get("PYCOMM_KILL_GRACE"))
        for sig, pause in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for p in procs:
                try:
                    os.killpg(p.pid, sig)
                    if sig == signal.SIGTERM:       # a stopped child acts on it now
                        os.killpg(p.pid, signal.SIGCONT)
                except (ProcessLookupError, PermissionError):
                    pass
            end = time.monotonic() + pause
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(_POLL_S)

    def wait_joined(self) -> None:
        """Wait until every child has announced itself in the bridge's store (its first
        step of :func:`pycomm.launch.bootstrap.create_world`).

        Raises:
            SpawnError: a child exited first (its exit code and command named); the
                children are stopped.
            CommTimeoutError: not all joined within ``timeout`` seconds; the children are
                stopped.
        """
        keys = [f"info/{self.job_id}/{r}" for r in range(self.parents, self.size)]
        deadline = time.monotonic() + self.timeout
        with StoreClient(self.store.host, self.store.port, self.token,
                         timeout=self.timeout) as client:
            while keys:
                for label, proc in zip(self.labels, self.procs):
                    code = proc.poll()
                    if code is not None:
                        self.close(wait=0.0)
                        raise SpawnError(f"{label} exited with code {code} before it "
                                         "joined its parents")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close(wait=0.0)
                    raise CommTimeoutError(
                        f"{len(keys)} spawned process(es) did not join their parents within "
                        f"{self.timeout:g} s (PYCOMM_TIMEOUT); stopped")
                try:
                    got = client.wait(keys, timeout=min(_POLL_S, left))
                except CommTimeoutError:    # (a busy root's store thread answered late:
                    got = {}                # the deadline above decides)
                keys = [k for k in keys if k not in got]

    def close(self, wait: float | None = None) -> list[str]:
        """Wait up to ``wait`` seconds (default: ``timeout``) for the children to exit
        (not for those stopped by a signal, which cannot), stop those left (SIGTERM, then
        SIGKILL after ``PYCOMM_KILL_GRACE``), close the store and remove the bridge's
        /dev/shm segments (idempotent).

        Returns:
            One line per child that failed (exit code or signal) or had to be stopped.
        """
        if self._closed:
            return []
        self._closed = True
        self._stop_watch.set()
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        while time.monotonic() < deadline:
            running = [p for p in self.procs if p.poll() is None]
            # (a stopped child, SIGSTOP or a debugger, cannot exit: not waited for)
            if all(_stopped(p.pid) for p in running):
                break
            time.sleep(_POLL_S)
        notes = []
        left = [p for p in self.procs if p.poll() is None]
        halted = {p.pid for p in left if _stopped(p.pid)}
        if left:
            self._stop(left)
        for label, p in zip(self.labels, self.procs):
            if p in left and wait != 0.0:
                why = " (stopped by a signal: not waited for)" if p.pid in halted else ""
                notes.append(f"{label} was still running{why}; stopped")
            elif p.returncode not in (0, None) and p not in left:
                how = (f"was killed by {signal.Signals(-p.returncode).name}"
                       if p.returncode < 0 else f"exited with code {p.returncode}")
                notes.append(f"{label} {how}")
        self.store.close()
        sweep_shm(self.job_id)
        return notes


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T or t in /proc; False where there is
    no /proc or it has gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def report(notes: list[str]) -> None:
    """Print what :meth:`SpawnedChildren.close` found, one ``pycomm.spawn:`` line each."""
    for line in notes:     # (one write a line: a child's line cannot land inside it)
        sys.stderr.write(f"pycomm.spawn: {line}\n")
        sys.stderr.flush()
