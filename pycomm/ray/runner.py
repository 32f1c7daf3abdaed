""":func:`pycomm.ray.run`: N Ray actors, one function, everything torn down (see
:mod:`pycomm.ray`)."""

from __future__ import annotations

import os
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import ray

from pycomm.errors import (ArgumentError, CollectiveError, CommTimeoutError, PeerError,
                           RemoteError)
from pycomm.launch.launcher import sweep_shm

from .group import (_declared, _end_directory, _timeout, create_collective_group,
                    destroy_collective_group, get_group_handle)

__all__ = ["run"]


# -- run: N actors, one function ---------------------------------------------------------------
@ray.remote
class _Rank:
    """An actor of :func:`run`: joins the group, runs the function, leaves."""

    def pid(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, group_name: str, fn: Callable, args: tuple, transport: str,
            timeout: float) -> tuple:
        rank = None
        try:
            comm = get_group_handle(group_name, transport=transport, timeout=timeout)
            rank = comm.rank
            return ("ok", fn(comm, *args))
        except BaseException as exc:  # noqa: BLE001 - the driver raises it, naming the rank
            # A peer's failure seen here (it left, it died, it abandoned a collective) is a
            # consequence; the driver names the member whose error is not one.
            follows = isinstance(exc, (PeerError, CollectiveError))
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return ("err", rank, type(exc).__qualname__, str(exc), tb, follows)
        finally:
            # Leaving at once makes the peers that wait on this member fail now (a departed
            # peer), not at their timeout.
            destroy_collective_group(group_name)


def run(fn: Callable[..., Any], num_actors: int, *args: Any, transport: str = "auto",
        timeout: float | None = None, num_cpus: float | None = None,
        resources: dict | None = None,
        actor_options: dict | None = None, error_grace: float = 15.0) -> list[Any]:
    """Start ``num_actors`` Ray actors, run ``fn(comm, *args)`` on each, tear them down.

    ``comm`` is the group's :class:`pycomm.Communicator` (rank ``i`` on the i-th actor).
    Ray must be initialized (``ray.init``), or Ray starts a local cluster.

    Args:
        fn: the function (pickled by Ray: lambdas and closures work).
        num_actors: the world size, >= 1.
        *args: positional arguments after ``comm``, the same for every rank.
        transport: "auto", "shm", "tcp" or "rdma".
        timeout: seconds the whole call may take, start-up included; also the world's
            default wait (default ``PYCOMM_TIMEOUT``).
        num_cpus, resources: each actor's Ray resource request (default Ray's for an
            actor: a CPU to be placed, none held while it runs, so N actors fit on fewer
            CPUs).
        actor_options: more of Ray's ``.options()`` for every actor (e.g.
            ``scheduling_strategy="SPREAD"``).
        error_grace: seconds the other ranks get to finish after one failed.

    Returns:
        The return values, in rank order.

    Raises:
        ArgumentError: bad arguments (before any actor starts).
        RemoteError: a rank raised; names it (the first whose error was not caused by
            another rank's failure), with its traceback text.
        PeerError: an actor died; names its rank.
        CommTimeoutError: the ranks did not finish within ``timeout``; names them.

    Every actor is killed, the group's directory and store ended and the job's /dev/shm
    segments swept before it returns or raises.
    """
    if not callable(fn):
        raise ArgumentError(f"fn={fn!r} is not callable")
    if not isinstance(num_actors, int) or num_actors < 1:
        raise ArgumentError(f"num_actors={num_actors!r}: a positive int is required")
    limit = _timeout(timeout)
    options = {**({"num_cpus": num_cpus} if num_cpus is not None else {}),
               **({"resources": resources} if resources else {}), **(actor_options or {})}
    group = f"run-{uuid.uuid4().hex[:12]}"
    actors = [_Rank.options(**options).remote() for _ in range(num_actors)]
    places: list[tuple[int, str]] = []
    directory = job_id = None
    try:
        try:                    # the actors' processes, once started (for the teardown)
            places = ray.get([a.pid.remote() for a in actors], timeout=limit)
        except ray.exceptions.GetTimeoutError:
            raise CommTimeoutError(f"pycomm.ray.run: {num_actors} actors did not start "
                                   f"within {limit:g} s (not enough Ray resources for "
                                   f"{options}?)") from None
        create_collective_group(actors, num_actors, group_name=group, timeout=limit)
        directory = _declared.pop(group)
        job_id = ray.get(directory.job.remote(), timeout=limit)
        refs = [a.run.remote(group, fn, args, transport, limit) for a in actors]
        return _collect(refs, limit, error_grace)
    finally:
        _teardown(actors, places, directory, job_id)


def _collect(refs: list, limit: float, error_grace: float) -> list:
    deadline = time.monotonic() + limit
    index = {ref: r for r, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    errors: dict[int, Exception] = {}
    follows: set[int] = set()
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1,
                                 timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            break
        r = index[done[0]]
        try:
            outcome = ray.get(done[0])
        except ray.exceptions.RayActorError as exc:
            errors[r] = PeerError(f"rank {r}: its Ray actor died: {exc}", peer=r)
            deadline = min(deadline, time.monotonic() + error_grace)
            continue
        if outcome[0] == "ok":
            results[r] = outcome[1]
            continue
        _, _, exc_type, message, tb, follow = outcome
        errors[r] = RemoteError(r, exc_type, message, tb)
        if follow:
            follows.add(r)
        deadline = min(deadline, time.monotonic() + error_grace)
    if errors:
        first = min(set(errors) - follows, default=min(errors))
        raise errors[first]
    if pending:
        missing = sorted(index[ref] for ref in pending)
        raise CommTimeoutError(f"pycomm.ray.run: ranks {missing} did not finish within "
                               f"{limit:g} s")
    return results


def _teardown(actors: list, places: list[tuple[int, str]], directory,
              job_id: str | None) -> None:
    """Kill the actors and the directory, wait for this node's actor processes to go, and
    sweep the job's /dev/shm segments on every node that ran a member."""
    here = ray.get_runtime_context().get_node_id()
    for a in actors:
        ray.kill(a, no_restart=True)
    if directory is not None:
        _end_directory(directory)
    deadline = time.monotonic() + 10
    for pid, node in places:
        while node == here and time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)
    if job_id is None:
        return
    sweep_shm(job_id)
    others = sorted({node for _, node in places} - {here})
    if others:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        sweeps = [_sweep.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote(job_id) for node in others]
        ray.wait(sweeps, num_returns=len(sweeps), timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                        # a zombie has exited (its parent reaps it later)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@ray.remote(num_cpus=0)
def _sweep(job_id: str) -> list[str]:
    return sweep_shm(job_id)
