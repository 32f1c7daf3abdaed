"""Start N rank processes, host their rendezvous store, supervise them, clean up after them.

``python launch.py -n 4 script.py [args]`` or ``python launch.py -n 4 -m module [args]``
runs N copies of a Python program as the ranks of one job. :class:`RankGroup` is the
machinery, shared with :mod:`pycomm.launch.spawning`:

* a job has a random secret (``PYCOMM_JOB_TOKEN``) and id (``PYCOMM_JOB_ID``), and a
  :class:`~pycomm.launch.store.StoreServer` on loopback that the ranks rendezvous through;
* each rank is ``sys.executable ARGV...`` in its own session (so signals and cleanup reach
  its whole process group), with ``PR_SET_PDEATHSIG=SIGKILL`` so it dies if the launcher is
  SIGKILLed, and with the environment contract of :mod:`pycomm.config`; the ranks of a
  Python program are forked from a server that has imported numpy and pycomm and lives as
  long as the launching process (:mod:`pycomm.launch.forkserver`, whose
  :func:`~pycomm.launch.forkserver.start_ranks` this launcher and the node agents share);
* every line a rank writes to stdout/stderr is prefixed ``[rank] `` (switchable off:
  then the bytes pass unchanged, as under ``mpiexec``; whole lines at a time either way,
  see :mod:`pycomm.launch.forward`); ``launch.py``'s stdin is rank 0's (``--stdin``), the other
  ranks read /dev/null, as under ``mpiexec``;
* a rank that leaves through ``sys.exit(code)`` / ``raise SystemExit(msg)`` (a non-zero
  code, no uncaught exception; :mod:`pycomm.MPI` tells the launcher so) ends the job at
  once, as ``mpiexec`` does: its message is on its stderr, the others are stopped without
  the report grace below, and the launcher exits with its code (1 for a message);
* a rank that calls ``Comm.Abort(code)`` publishes an abort note and waits; the launcher
  stops every rank at once (no report grace, no flight recorders) and exits with ``code``;
* when a rank exits non-zero or is killed by a signal, the surviving ranks that run a
  pycomm world get up to ``PYCOMM_REPORT_GRACE`` seconds to report (a peer's death or a
  timeout names its culprit) and exit on their own; the launcher then names the rank that
  caused the failure (see :meth:`RankGroup.supervise`), sends ``SIGUSR1`` to the ranks
  still running so that they print their flight recorders (:mod:`pycomm.trace`), and
  stops them: SIGTERM and, after ``PYCOMM_KILL_GRACE`` seconds, SIGKILL. It exits with the
  first failed rank's code (128 + signal number for a signal);
* SIGINT / SIGTERM to the launcher are forwarded to the ranks, escalated to SIGKILL after
  the grace period, and the launcher exits 128 + that signal (130 for Ctrl-C);
* always, at the end: stragglers killed, the store closed, ``/dev/shm/pycomm-<jobid>-*``
  swept (see :func:`shm_prefix`), and with ``PYCOMM_TRACE=path`` the ranks' timelines
  ``path.rank<k>.json`` merged into ``path``.

Caveat: ``PR_SET_PDEATHSIG`` fires when the *thread* that started the ranks exits, so
create a :class:`RankGroup` from a thread that outlives it (normally the main thread).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pycomm import config, stall, trace
from pycomm.errors import ArgumentError, CommError
from pycomm.launch import forkserver
from pycomm.launch.forkserver import _preexec
from pycomm.launch.forward import Forwarder as _Forwarder, say as _say
from pycomm.launch.rlimits import raise_open_files_limit
from pycomm.launch.store import StoreServer
from pycomm.launch.store_client import StoreClient

__all__ = ["RankExit", "RankGroup", "blame", "shm_prefix", "sweep_shm"]

TRANSPORT_CHOICES = config.TRANSPORTS
SHM_DIR = "/dev/shm"
_POLL_S = 0.02  # seconds between liveness checks while supervising


def shm_prefix(job_id: str) -> str:
    """Return the name prefix of every /dev/shm segment of job ``job_id``.

    The shm transport names its segments ``f"{shm_prefix(job_id)}..."``
    (``pycomm-<jobid>-...``) so that the launcher can sweep them after the job.
    """
    return f"pycomm-{job_id}-"


def sweep_shm(job_id: str, directory: str = SHM_DIR) -> list[str]:
    """Remove every ``pycomm-<job_id>-*`` entry of ``directory``; return the names removed."""
    prefix, removed = shm_prefix(job_id), []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def contract_env(rank: int, size: int, local_rank: int, local_size: int, master_addr: str,
                 master_port: int, token: str, job_id: str, transport: str,
                 timeout: float | None) -> dict[str, str]:
    """The environment contract of one rank (each variable is declared in
    :mod:`pycomm.config`), as this launcher and the node agents (:mod:`.nodes`) set it."""
    env = {
        "PYCOMM_RANK": str(rank), "PYCOMM_WORLD_SIZE": str(size),
        "PYCOMM_LOCAL_RANK": str(local_rank), "PYCOMM_LOCAL_SIZE": str(local_size),
        "PYCOMM_MASTER_ADDR": master_addr, "PYCOMM_MASTER_PORT": str(master_port),
        "PYCOMM_JOB_TOKEN": token, "PYCOMM_JOB_ID": job_id,
        "PYCOMM_LAUNCHER_PID": str(os.getpid()), "PYCOMM_TRANSPORT": transport,
        "PYTHONUNBUFFERED": "1",
    }
    if timeout is not None:
        env["PYCOMM_TIMEOUT"] = repr(float(timeout))
    return env


@dataclass(frozen=True)
class RankExit:
    """How one rank process ended: ``returncode`` as :class:`subprocess.Popen` reports it."""

    rank: int
    pid: int
    returncode: int

    @property
    def exit_code(self) -> int:
        """The shell-style exit status: the code, or 128 + signal number when killed."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that killed the rank (``"SIGKILL"``), or None."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """Return e.g. ``"rank 2 (pid 1234) was killed by signal SIGKILL"``."""
        how = (f"was killed by signal {self.signal_name}" if self.returncode < 0
               else f"exited with code {self.returncode}")
        return f"rank {self.rank} (pid {self.pid}) {how}"


class RankGroup:
    """One job: its token, id and store, and the N rank processes once :meth:`start` ran.

    Args:
        nprocs: number of ranks (>= 1).
        transport: ``PYCOMM_TRANSPORT`` for the ranks: "auto", "shm", "tcp" or "rdma".
        timeout: ``PYCOMM_TIMEOUT`` for the ranks, seconds (None: inherit / default).
        prefix: prefix each output line with ``[rank] `` (else pass it on unchanged).
        master_addr: address the store binds and ranks connect to (loopback by default).
        master_port: the store's port (0: any free port).
        grace: seconds between SIGTERM and SIGKILL when stopping (``PYCOMM_KILL_GRACE``).
        stdin_rank: the rank that reads this process's stdin (None: every rank reads
            /dev/null).

    Raises:
        ArgumentError: bad ``nprocs``, ``transport`` or ``timeout``.
    """

    def __init__(self, nprocs: int, *, transport: str = "auto", timeout: float | None = None,
                 prefix: bool = True, master_addr: str = "127.0.0.1", master_port: int = 0,
                 grace: float | None = None, stdin_rank: int | None = None):
        if not isinstance(nprocs, int) or nprocs < 1:
            raise ArgumentError(f"nprocs must be a positive int, got {nprocs!r}")
        if transport not in TRANSPORT_CHOICES:
            raise ArgumentError(f"transport must be one of {TRANSPORT_CHOICES}, "
                                f"got {transport!r}")
        if timeout is not None and not timeout > 0:
            raise ArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if stdin_rank is not None and not 0 <= stdin_rank < nprocs:
            raise ArgumentError(f"stdin_rank must be a rank in 0..{nprocs - 1} or None, "
                                f"got {stdin_rank!r}")
        self.stdin_rank = stdin_rank
        self.nprocs, self.transport, self.timeout, self.prefix = nprocs, transport, timeout, prefix
        self.grace = float(config.get("PYCOMM_KILL_GRACE") if grace is None else grace)
        self.job_id = uuid.uuid4().hex[:12]
        self.token = secrets.token_hex(32)
        self.store = StoreServer(self.token, master_addr, master_port)
        self.procs: list[subprocess.Popen] = []
        self.report_grace = float(config.get("PYCOMM_REPORT_GRACE"))
        self._forwarders: list[_Forwarder] = []
        self._closed = False
        self._client: StoreClient | None = None     # the launcher's own, for diagnoses
        self._trace_path: str | None = None

    def env_for(self, rank: int) -> dict[str, str]:
        """Return the environment variables of the contract for ``rank`` (only those)."""
        return contract_env(rank, self.nprocs, rank, self.nprocs, self.store.host,
                            self.store.port, self.token, self.job_id, self.transport,
                            self.timeout)

    def start(self, argv: Sequence[str], extra_env: dict[str, str] | None = None) -> None:
        """Start every rank as ``sys.executable *argv`` (stops those started on failure).

        Raises:
            OSError: a process could not be started (EMFILE: out of file descriptors, two
                pipes per rank, even with the soft limit lifted to the hard one).
        """
        raise_open_files_limit()
        self._trace_path = config.get("PYCOMM_TRACE", {**os.environ, **(extra_env or {})})
        envs = [{**os.environ, **(extra_env or {}), **self.env_for(rank)}
                for rank in range(self.nprocs)]
        try:
            self.procs = forkserver.start_ranks(argv, envs, self.stdin_rank, True,
                                                _preexec(os.getpid()))
            for rank, proc in enumerate(self.procs):
                for stream, src in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                    fwd = _Forwarder(src, rank, stream, prefix=self.prefix)
                    fwd.start()
                    self._forwarders.append(fwd)
        except BaseException:
            self.close()
            raise

    def running(self) -> list[int]:
        """Return the ranks whose process has not exited (reaping those that have)."""
        return [r for r, p in enumerate(self.procs) if p.poll() is None]

    def poll(self, any_exit: bool = False) -> RankExit | None:
        """Return the first failed rank (lowest rank among those found), or None.

        Args:
            any_exit: count an exit with code 0 as a failure too (for long-lived workers).
        """
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and (code != 0 or any_exit):
                return RankExit(rank, proc.pid, code)
        return None

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to the process group of every rank still running."""
        for rank in self.running():
            try:
                os.killpg(self.procs[rank].pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every rank to exit; return whether they did."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def stop(self, sig: int = signal.SIGTERM, grace: float | None = None, *,
             freeze: bool = False) -> None:
        """Send ``sig`` to the running ranks, then SIGKILL those left after ``grace`` seconds.

        A stopped rank (SIGSTOP, a debugger) is continued after ``sig``, so that it acts on
        it now rather than being killed after the grace. ``freeze``: SIGSTOP every rank
        first, so that all of them get ``sig`` before any runs again: with the default
        SIGTERM none then lives to see a peer's connection close (ranks are signalled one
        after another, and on a loaded machine a rank ran between two signals, saw the
        first rank gone and printed a PeerError after an ``Abort``)."""
        if freeze:
            self.signal_all(signal.SIGSTOP)
        self.signal_all(sig)
        self.signal_all(signal.SIGCONT)
        if not self.wait_exit(self.grace if grace is None else grace):
            self.signal_all(signal.SIGKILL)
            self.wait_exit(5.0)

    def supervise(self, interrupted: Callable[[], int | None] = lambda: None,
                  log: Callable[[str], None] | None = None) -> int:
        """Wait for the job to end and return the launcher's exit code.

        Args:
            interrupted: returns a signal number once the launcher got SIGINT/SIGTERM.
            log: where to say why the job is stopped (default: stderr, ``pycomm.launch:``).

        Returns:
            0 when every rank exited 0; the first failing rank's exit code; 128 + signal
            number when interrupted.

        When a rank fails, the line logged names the rank that caused the failure, which
        need not be the first to exit: the ranks' published diagnoses (a ``PeerError``
        names the dead peer, a stall timeout the ranks that never entered the call; see
        :mod:`pycomm.stall`) are counted, and the rank most of them blame is the culprit;
        with no diagnosis, the first rank found failed is.
        """
        log = log or (lambda msg: _say(f"pycomm.launch: {msg}"))
        # Connected now, not at the first failure: a rank that ends the job by SystemExit
        # leaves its peers waiting on it, and each reports its departure a quarter of a
        # second after it (pycomm.shmcoll._DEPARTED_S) unless the launcher has read the
        # exit note and stopped them first; a new connection's handshake with the store's
        # thread is time taken out of that quarter second.
        self._store_client()
        while True:
            sig = interrupted()
            if sig is not None:
                others = len(self.running())
                log(f"got {signal.Signals(sig).name}; forwarding it to {others} running ranks")
                self.stop(sig)
                return 128 + sig
            aborted = self.abort_note()
            if aborted is not None:
                # Comm.Abort: the rank waits, alive, until it is stopped with the others,
                # so no peer reports it gone; the job ends with its code (mpiexec's rule),
                # modulo 256 as a process's exit status is.
                rank, code = aborted
                log(f"rank {rank} called Abort({code}); stopping all {len(self.running())} "
                    "running ranks")
                self.stop(freeze=True)
                return code & 0xFF
            failure = self.poll()
            if failure is not None:
                why = self._blame(failure)
                others = len(self.running())
                log(f"{why}; stopping the other {others} rank{'s' if others != 1 else ''}")
                self.stop()
                return failure.exit_code
            if not self.running():
                return 0
            time.sleep(_POLL_S)

    # -- after a failure: who caused it, and the survivors' last words ---------------------
    def abort_note(self) -> tuple[int, int] | None:
        """The ``(rank, code)`` of a rank's ``Comm.Abort``, or None: read from the store's
        own table, with no round trip (:func:`pycomm.stall.parse_abort`)."""
        return stall.parse_abort(self.store.peek(stall.key(self.job_id, "abort")))

    def _store_client(self) -> StoreClient | None:
        if self._client is None:
            try:
                self._client = StoreClient(self.store.host, self.store.port, self.token,
                                           timeout=2.0)
            except CommError:
                return None
        return self._client

    def _blame(self, failure: RankExit) -> str:
        """Give the surviving pycomm ranks a grace to report, name the culprit, and have
        the ranks still running print their flight recorders; return the reason line."""
        client = self._store_client()
        if client is None:
            return failure.describe()
        try:
            if failure.returncode > 0 and stall.read_exits(client, self.job_id, [failure.rank]):
                # sys.exit(code) / SystemExit(msg): the rank meant to end the job (mpiexec)
                return f"{failure.describe()} (SystemExit)"
            ranks = range(self.nprocs)
            # ranks with a pycomm world publish a position when it starts
            worlds = set(stall.read_positions(client, self.job_id, ranks))
            deadline = time.monotonic() + self.report_grace
            while True:
                running = set(self.running()) & worlds
                diags = stall.read_diagnoses(client, self.job_id, ranks)
                named = {c for d in diags.values() for c in d.get("culprits", ())}
                if running <= named or time.monotonic() >= deadline:
                    break           # only the accused are left, or the grace is over
                time.sleep(0.05)
            still = [r for r in self.running() if r in worlds]
            positions = stall.ask_positions(client, self.job_id, still) if still else {}
        except CommError:
            return failure.describe()
        self._last_words(positions)
        return _culprit_line(failure, diags, positions, self.poll_all())

    def _last_words(self, positions: dict) -> None:
        """SIGUSR1 the ranks still running that just answered (a stopped or stuck one would
        not print) and whose pycomm prints its flight recorder on it."""
        told = 0
        for rank, pos in positions.items():
            if pos is not None and pos.get("sigusr1") and pos.get("answered", True) and \
                    self.procs[rank].poll() is None:
                try:
                    os.kill(self.procs[rank].pid, signal.SIGUSR1)
                    told += 1
                except ProcessLookupError:
                    pass
        if told:
            time.sleep(0.3)         # the dump is one write; let the forwarders pass it on

    def poll_all(self) -> dict[int, RankExit]:
        """Return every rank that has exited, with how."""
        return {r: RankExit(r, p.pid, p.returncode) for r, p in enumerate(self.procs)
                if p.poll() is not None}

    def close(self) -> None:
        """Kill what is left (whole process groups), close the store, sweep /dev/shm."""
        if self._closed:
            return
        self._closed = True
        if self.running():
            self.stop()
        for proc in self.procs:  # grandchildren left in a rank's group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 2.0
        for fwd in self._forwarders:
            fwd.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            self._client.close()
        self.store.close()
        sweep_shm(self.job_id)
        if self._trace_path:
            try:
                trace.merge_chrome_traces(self._trace_path, self.nprocs)
            except OSError as exc:
                _say(f"pycomm.launch: cannot write {self._trace_path}: {exc}")

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def blame(diags: dict) -> tuple[int, list[int]] | None:
    """The rank the published diagnoses (:func:`pycomm.stall.read_diagnoses`) blame, with
    its accusers: ``(culprit, [ranks naming it])``, or None when no diagnosis names
    another rank.

    Failures cascade: a rank that left after its own error is named by the ranks that
    waited for it, and a rank that failed because of it is named by those that waited for
    that one. An accused rank whose own diagnosis names another failed second; the votes
    go to the ranks at the ends of these chains (all of them, when the chains loop), and
    the most named wins (ties: the lowest rank).
    """
    votes: dict[int, int] = {}
    accuses: dict[int, set] = {}
    for rank, diag in diags.items():
        accuses[rank] = set(diag.get("culprits", ())) - {rank}
        for c in accuses[rank]:
            votes[c] = votes.get(c, 0) + 1
    if not votes:
        return None
    roots = {c: v for c, v in votes.items() if not accuses.get(c)}
    if roots:
        votes = roots
    culprit = min(votes, key=lambda c: (-votes[c], c))
    return culprit, sorted(r for r, d in diags.items() if culprit in d.get("culprits", ()))


def _culprit_line(failure: RankExit, diags: dict, positions: dict,
                  exits: dict[int, RankExit]) -> str:
    """The launcher's verdict: the rank the diagnoses blame (:func:`blame`),
    else the first failed rank; with what it did and who blamed it."""
    blamed = blame(diags)
    if blamed is None:
        return failure.describe()
    culprit, accusers = blamed
    if culprit in exits:
        state = exits[culprit].describe()
    else:
        state = "it is still running: " + stall.describe_position(positions.get(culprit),
                                                                  culprit)
    call = diags[accusers[0]].get("call")
    line = (f"rank {culprit} caused the failure ({state}); ranks {accusers} name it"
            f"{' in ' + call if call else ''}: "
            f"{_first_line(diags[accusers[0]].get('error', ''))}")
    if failure.rank != culprit:
        line += f"; first to exit: {failure.describe()}"
    return line


def _first_line(text: str, limit: int = 600) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit] + "..."

