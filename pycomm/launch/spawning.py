"""Run a Python function on N fresh rank processes: :func:`spawn` and a persistent :class:`Pool`.

``pycomm.spawn(fn, 4)`` ships ``fn`` (cloudpickled: lambdas and closures work) to four
rank processes, each of which initialises the world communicator and calls ``fn(*args)``;
the per-rank return values come back in rank order. A :class:`Pool` keeps its ranks (and
their world) alive between calls, so a test suite does not pay process start-up and
connection set-up for every test.

The ranks are ``python -m pycomm.launch.worker`` processes started and supervised by a
:class:`pycomm.launch.launcher.RankGroup`, with their output prefixed ``[rank] ``. Tasks and
results travel through the job's authenticated store (protocol in :mod:`pycomm.launch.worker`):
the parent sets ``pool/task/<seq>``; each rank, when done, stores its outcome under
``pool/done/<seq>/<rank>``; the parent takes the outcomes with one store ``wait`` on all
of those keys (answered when the last one is set), in slices of a quarter second, checking
between them that no rank died. So a task costs the parent about two store round trips,
whatever the number of ranks. Only peers that proved they hold the job token can set keys,
so nothing is unpickled from a stranger.

Failure rules of :meth:`Pool.run`:

* a rank raises: once every rank has answered, the lowest such rank's exception is raised
  as :class:`~pycomm.errors.RemoteError` and the pool stays usable; if some rank has not
  answered ``error_grace`` seconds after the first exception (it is probably waiting on the
  failed one), the pool is stopped and marked broken, and the RemoteError is raised;
* a rank calls ``Comm.Abort(code)``: :class:`~pycomm.errors.PeerError` naming the rank and
  the code, within a quarter second; the pool is broken;
* a rank dies: :class:`~pycomm.errors.PeerError` naming the rank and its exit code or
  signal; the pool is broken;
* the task overruns ``timeout``: :class:`~pycomm.errors.CommTimeoutError` naming the ranks
  that did not finish and where each stands (asked through the store: the collective it
  waits in, or its last completed call; see :mod:`pycomm.stall`), its ``culprits`` the
  ranks that have not entered a collective the others wait in; the pool is broken;
* the store itself fails (no answer within its grace, a broken connection):
  :class:`~pycomm.errors.CommError` saying so; the pool is broken;
* a task too large for the store (``PYCOMM_STORE_MAX_BYTES``): ``ArgumentError`` before any
  rank sees it; the pool stays usable.

A broken or closed pool raises :class:`~pycomm.errors.CommError` from ``run``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import cloudpickle
import msgpack

from pycomm import config
from pycomm.errors import CommError, CommTimeoutError, PeerError, RemoteError
from pycomm.launch.launcher import RankGroup
from pycomm.stall import ask_positions, summarize
from pycomm.launch.store_client import StoreClient

__all__ = ["Pool", "spawn"]

_WAIT_SLICE_S = 0.25  # seconds of one store wait before checking that the ranks live
# the folder that holds the pycomm package (put on the workers' PYTHONPATH)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn(fn: Callable[..., Any], nprocs: int, args: tuple = (), *, transport: str = "auto",
          timeout: float | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` fresh ranks of a new world; return their results.

    Args:
        fn: the function; cloudpickled, so lambdas and closures work. It runs after
            ``pycomm.init()``, so ``pycomm.COMM_WORLD`` is ready in it.
        nprocs: number of ranks.
        args: positional arguments, the same for every rank (cloudpickled).
        transport: "auto", "shm", "tcp" or "rdma".
        timeout: seconds: ``PYCOMM_TIMEOUT`` of the ranks and the limit on the whole call
            (default ``PYCOMM_TIMEOUT``).

    Returns:
        The return values, in rank order.

    Raises:
        RemoteError: a rank raised; carries its rank, exception type and traceback text.
        PeerError: a rank died (names its rank and signal or exit code).
        CommTimeoutError: the ranks did not finish within ``timeout``.
    """
    with Pool(nprocs, transport=transport, timeout=timeout, error_grace=0.5) as pool:
        return pool.run(fn, *args)


def _shutdown(group: RankGroup, client: StoreClient) -> None:
    """Kill whatever is left of a pool (also run by the garbage collector and at exit)."""
    try:
        client.close()
    finally:
        group.close()


# Starting the rank processes (an interpreter, numpy, the imports) is not communication:
# a pool with a short PYCOMM_TIMEOUT, which tests of timeouts make, still gets this long to
# start on a loaded machine. The ranks' own waits during start-up keep the short limit.
STARTUP_FLOOR_S = 30.0


class Pool:
    """N long-lived rank processes that initialise one world and then run tasks.

    Args:
        nprocs: number of ranks.
        transport: "auto", "shm", "tcp" or "rdma" (``PYCOMM_TRANSPORT`` of the ranks).
        timeout: seconds: ``PYCOMM_TIMEOUT`` of the ranks and the default limit on each
            :meth:`run` (default ``PYCOMM_TIMEOUT``); start-up may take up to
            :data:`STARTUP_FLOOR_S` more if this is shorter.
        prefix: prefix the ranks' output lines with ``[rank] ``.
        error_grace: seconds to wait for the other ranks after one raised before the pool
            is declared broken.

    Raises:
        RemoteError: ``pycomm.init()`` raised on a rank.
        PeerError: a rank died during start-up.
        CommTimeoutError: the ranks did not start within ``max(timeout,
            STARTUP_FLOOR_S)``.
    """

    def __init__(self, nprocs: int, *, transport: str = "auto", timeout: float | None = None,
                 prefix: bool = True, error_grace: float = 2.0):
        self.nprocs = nprocs
        self.timeout = float(config.get("PYCOMM_TIMEOUT") if timeout is None else timeout)
        self.error_grace = error_grace
        self._lock = threading.Lock()
        self._seq = 0
        self._broken: str | None = None
        self._closed = False
        self._group = RankGroup(nprocs, transport=transport, timeout=self.timeout,
                                prefix=prefix)
        try:
            self._client = StoreClient(self._group.store.host, self._group.store.port,
                                       self._group.token, timeout=self.timeout)
        except BaseException:
            self._group.close()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._group, self._client)
        try:
            paths = [os.path.abspath(p or os.curdir) for p in sys.path]
            self._client.set("pool/syspath", msgpack.packb(paths))
            pythonpath = os.pathsep.join(filter(None, [_PACKAGE_ROOT,
                                                       os.environ.get("PYTHONPATH")]))
            self._group.start(["-m", "pycomm.launch.worker"], {"PYTHONPATH": pythonpath})
            self._collect(0, max(self.timeout, STARTUP_FLOOR_S), "start-up (pycomm.init)")
        except BaseException:
            self._closed = True
            self._finalizer()
            raise

    @property
    def job_id(self) -> str:
        """The job id of the pool's world (names its /dev/shm segments)."""
        return self._group.job_id

    @property
    def pids(self) -> list[int]:
        """The process ids of the ranks, in rank order."""
        return [p.pid for p in self._group.procs]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> list:
        """Run ``fn(*args)`` on every rank; return the results in rank order.

        Args:
            fn: the function (cloudpickled).
            *args: its positional arguments, the same for every rank.
            timeout: seconds the whole task may take (default: the pool's ``timeout``).

        Raises:
            RemoteError: a rank raised (the pool stays usable if every rank answered).
            PeerError: a rank died; the pool is broken.
            CommTimeoutError: the task overran ``timeout``; the pool is broken.
            CommError: the pool is closed or broken, or its store failed (it is then broken).
            ArgumentError: the task is larger than the store takes (the pool stays usable).
        """
        with self._lock:
            if self._closed:
                raise CommError("the pool is closed")
            if self._broken is not None:
                raise CommError(f"the pool is broken ({self._broken}); make a new one")
            self._check_alive("before the task")
            payload = b"T" + cloudpickle.dumps((fn, args))
            seq = self._seq + 1
            # no wait for the set's reply: the wait that follows is served after it. The
            # number is taken only once the task is sent (a payload past the store's limit
            # raises here, and no rank must wait for a task that never came).
            self._client.set(f"pool/task/{seq}", payload, answer=False)
            self._seq = seq
            del payload
            return self._collect(seq, self.timeout if timeout is None else timeout,
                                 f"task {getattr(fn, '__qualname__', fn)!s}")

    def _break(self, reason: str) -> None:
        self._broken = reason
        self._finalizer()

    def _check_alive(self, when: str) -> None:
        dead = self._group.poll(any_exit=True)
        if dead is not None:
            message = f"{dead.describe()} {when}; the pool is stopped"
            self._break(message)
            raise PeerError(message, peer=dead.rank)

    def _check_aborted(self, what: str) -> None:
        aborted = self._group.abort_note()
        if aborted is not None:
            message = f"rank {aborted[0]} called Abort({aborted[1]}) during {what}; the " \
                      "pool is stopped"
            self._break(message)
            raise PeerError(message, peer=aborted[0])

    def _collect(self, seq: int, timeout: float, what: str) -> list:
        """Read the outcomes of task ``seq`` from all ranks; raise as the rules above say."""
        results: list[Any] = [None] * self.nprocs
        answered: set[int] = set()
        errors: dict[int, RemoteError] = {}
        deadline = time.monotonic() + timeout
        first_error_at: float | None = None
        pending = [f"pool/done/{seq}/{rank}" for rank in range(self.nprocs)]
        while True:
            try:
                got = self._client.wait(pending, timeout=_WAIT_SLICE_S, take=True)
            except CommError as exc:
                # The store answers a slice's wait at its end whatever is set, so this is
                # the store itself failing (its thread stalled past the client's grace, or
                # a broken connection); outcomes it took may be lost: the pool cannot go on.
                self._break(f"the store failed during {what}: {exc}")
                raise CommError(f"{what}: the pool's store failed ({exc}); the pool is "
                                "stopped") from exc
            pending = [key for key in pending if key not in got]
            while got:
                rank, status, *rest = cloudpickle.loads(got.popitem()[1])
                answered.add(rank)
                if status == "ok":
                    results[rank] = rest[0]
                else:
                    errors[rank] = RemoteError(rank, *rest)
                    if first_error_at is None:
                        first_error_at = time.monotonic()
            if not pending:
                break
            self._check_aborted(what)
            self._check_alive(f"during {what}")
            now = time.monotonic()
            if first_error_at is not None and now > first_error_at + self.error_grace:
                missing = sorted(set(range(self.nprocs)) - answered)
                self._break(f"ranks {missing} did not finish {what} after rank "
                            f"{min(errors)} raised")
                raise errors[min(errors)]
            if now > deadline:
                missing = sorted(set(range(self.nprocs)) - answered)
                where, suspects = self._where(missing, bool(errors))
                if errors:
                    first = str(errors[min(errors)]).splitlines()[0]
                    where += f"; ranks {sorted(errors)} raised, the first: {first}"
                self._break(f"{what} timed out")
                err = CommTimeoutError(f"{what} did not finish within {timeout:g} s on "
                                       f"ranks {missing}{where}; the pool is stopped")
                err.culprits = suspects
                raise err
        if seq > 0:     # every rank has read the task: free it (no need to wait for that)
            self._client.delete(f"pool/task/{seq}", answer=False)
        if errors:
            if seq == 0:
                self._break("start-up failed")
            raise errors[min(errors)]
        return results

    def _where(self, ranks: list[int], others_failed: bool) -> tuple[str, list[int]]:
        """Where ``ranks`` stand (asked through the store, see :mod:`pycomm.stall`), and
        the suspects: ranks that have not entered a collective others wait in or, when
        the other ranks raised, ranks in no pycomm call at all (hung in user code)."""
        try:
            positions = ask_positions(self._client, self.job_id, ranks)
        except CommError:
            return "", []
        text, suspects = summarize(positions)
        if not suspects and others_failed:
            suspects = [r for r, p in positions.items() if p is None or not p["running"]]
        return (f": {text}" if text else ""), suspects

    def close(self, timeout: float = 10.0) -> None:
        """Tell the ranks to exit, wait up to ``timeout`` seconds, kill stragglers, clean up."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._broken is None:
                try:
                    self._client.set(f"pool/task/{self._seq + 1}", b"X")
                    self._group.wait_exit(timeout)
                except CommError:
                    pass
            self._finalizer()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
