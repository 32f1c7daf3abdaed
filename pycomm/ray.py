"""pycomm worlds on Ray actors, in the shape of ``ray.util.collective``.

Install with ``pip install pycomm[ray]``. Two ways in, as in ``ray.util.collective``:

* **From the driver**: :func:`create_collective_group` declares a list of actors a group
  (rank ``ranks[i]`` for ``actors[i]``); each actor joins when it first asks for the group
  (:func:`get_group_handle`, or any collective of this module with that ``group_name``),
  so every member must ask, as every member of a ``ray.util.collective`` group must call
  a collective.
* **Inside the actors**: every member calls :func:`init_collective_group` with the same
  ``world_size`` and ``group_name`` and its own ``rank``.

Either way the group's communicator is a plain :class:`pycomm.Communicator` (the whole
mpi4py-shaped API); :func:`allreduce`, :func:`broadcast`, :func:`send` and the others are
``ray.util.collective``'s names over it, for code that moves from there.
:func:`run` does the whole cycle: it starts N actors, runs ``fn(comm, *args)`` on each,
returns the results in rank order and tears everything down.

How a group forms. A small directory actor, named ``pycomm:<group_name>`` in the job's Ray
namespace, collects each member's rank and Ray node; once all ``world_size`` have come it
starts the group's rendezvous store (:class:`pycomm.store.StoreServer`, authenticated with
a random job secret that only the members receive, through Ray) and hands every member the
store's address: loopback when every member runs on the directory's node, else the
directory's Ray node address. From there the world forms as under any launcher
(:func:`pycomm.bootstrap.create_world`): each rank listens on the interface that routes to
the store's host, shared memory links the ranks of a node and TCP the nodes. The directory
plays the launcher's part, so it lives as long as the group: the last member to leave, or
the driver's :func:`destroy_collective_group`, ends it; a group that fails to form (members
that disagree, or one that never comes) ends its directory ``timeout`` seconds later.

Limits: an actor is in at most one pycomm group at a time (destroy it to join another),
as with ``ray.experimental.collective``; pycomm must be importable on every node.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray

from . import config, ops
from .buffers import IN_PLACE
from .errors import (ArgumentError, CollectiveError, CommError, CommTimeoutError, PeerError,
                     RemoteError)
from .launcher import sweep_shm

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "create_collective_group",
           "destroy_collective_group", "get_collective_group_size", "get_group_handle",
           "get_rank", "init_collective_group", "is_group_initialized", "recv", "reduce",
           "reducescatter", "run", "send"]

_DIRECTORY_PREFIX = "pycomm:"
_RAY_OPS = {"SUM": ops.SUM, "PRODUCT": ops.PROD, "MIN": ops.MIN, "MAX": ops.MAX}


def _timeout(timeout: float | None) -> float:
    return float(config.get("PYCOMM_TIMEOUT") if timeout is None else timeout)


# -- the directory: one per group, the group's launcher --------------------------------------
@ray.remote(num_cpus=0, max_concurrency=1024)
class _Directory:
    """Collects the members of one group, then hosts its store (see the module docstring).

    Threaded (``max_concurrency``): every member's :meth:`join` blocks here until all have
    come, each in its own thread.
    """

    def __init__(self, group_name: str, world_size: int, ranks: dict[str, int] | None):
        self.group_name, self.world_size = group_name, world_size
        self.declared = ranks                 # actor id (hex) -> rank, from the driver
        self.job_id = f"ray{uuid.uuid4().hex[:12]}"
        self.token = secrets.token_hex(32)
        self.members: dict[int, tuple[str, str]] = {}   # rank -> (actor id, node id)
        self.left: set[int] = set()
        self.cond = threading.Condition()
        self.server = None
        self.failure: str | None = None
        self.expiry: threading.Timer | None = None

    def job(self) -> str:
        return self.job_id

    def join(self, world_size: int, rank: int | None, actor_id: str, node_id: str,
             timeout: float) -> dict:
        """Register a member; once all have, return what it needs to form the world.

        Raises:
            ArgumentError: the member's view of the group disagrees with the group's.
            CommTimeoutError: not every member came within ``timeout`` seconds.
        """
        with self.cond:
            if self.failure is None:
                self.failure = self._admit(world_size, rank, actor_id, node_id)
                if self.failure is None:
                    rank = rank if rank is not None else self.declared[actor_id]
                    self.members[rank] = (actor_id, node_id)
                    if len(self.members) == self.world_size:
                        self._start_store()
                self.cond.notify_all()
            self.cond.wait_for(lambda: self.failure is not None or self.server is not None,
                               timeout)
            if self.failure is not None:
                self._expire(timeout)
                raise ArgumentError(self.failure)
            if self.server is None:
                missing = sorted(set(range(self.world_size)) - set(self.members))
                self.failure = (f"group {self.group_name!r}: ranks {missing} did not join "
                                f"within {timeout:g} s")
                self.cond.notify_all()
                self._expire(timeout)
                raise CommTimeoutError(self.failure)
            nodes = [self.members[r][1] for r in range(self.world_size)]
            local = [r for r in range(self.world_size) if nodes[r] == node_id]
            return {"rank": rank, "size": self.world_size, "addr": self.server.host,
                    "port": self.server.port, "token": self.token, "job_id": self.job_id,
                    "local_rank": local.index(rank), "local_size": len(local)}

    def _admit(self, world_size: int, rank: int | None, actor_id: str,
               node_id: str) -> str | None:
        """Why this member cannot join, or None."""
        where = f"group {self.group_name!r}"
        if world_size not in (-1, self.world_size):     # -1: as the driver declared
            return (f"{where}: a member says world_size={world_size}, the group was made "
                    f"with {self.world_size}")
        if self.server is not None:
            return f"{where} has already formed; destroy it before forming it again"
        if rank is None:
            if self.declared is None or actor_id not in self.declared:
                return f"{where}: actor {actor_id} is not one of the declared actors"
            rank = self.declared[actor_id]
        elif self.declared is not None and self.declared.get(actor_id) not in (None, rank):
            return (f"{where}: actor {actor_id} asks for rank {rank}, the driver declared "
                    f"it rank {self.declared[actor_id]}")
        if not 0 <= rank < self.world_size:
            return f"{where}: rank {rank} is out of range for world_size {self.world_size}"
        if rank in self.members and self.members[rank][0] != actor_id:
            return f"{where}: rank {rank} was claimed by two actors"
        return None

    def _expire(self, linger: float) -> None:
        """End this directory ``linger`` seconds after the group failed to form.

        A directory made by the members themselves is detached (it must outlive whichever
        member happened to create it), so nobody else ends it when forming fails. It
        stays that long so that a member still on its way is told why rather than finding
        no directory, then goes, freeing the name for a new try.
        """
        if self.expiry is None:
            me = ray.get_runtime_context().current_actor
            self.expiry = threading.Timer(linger, ray.kill, (me,), {"no_restart": True})
            self.expiry.daemon = True
            self.expiry.start()

    def _start_store(self) -> None:
        from pycomm.store import StoreServer
        here = ray.get_runtime_context().get_node_id()
        one_node = all(node == here for _, node in self.members.values())
        self.server = StoreServer(self.token, host="127.0.0.1" if one_node
                                  else ray.util.get_node_ip_address())

    def leave(self, rank: int) -> bool:
        """Note that ``rank`` left; return True when it was the last one."""
        with self.cond:
            self.left.add(rank)
            return self.left >= set(self.members)

    def close(self) -> None:
        with self.cond:
            if self.server is not None:
                self.server.close()
                self.server = None
            self.failure = self.failure or f"group {self.group_name!r} was destroyed"
            self.cond.notify_all()


# -- this process's membership ----------------------------------------------------------------
class _Member:
    def __init__(self, name: str, comm, closer, directory, job_id: str):
        self.name, self.comm, self.closer = name, comm, closer
        self.directory, self.job_id = directory, job_id


_groups: dict[str, _Member] = {}
_lock = threading.Lock()
# The driver keeps the handles of the directories it declared: Ray ends an actor (named or
# not) once its creator holds no handle to it.
_declared: dict[str, Any] = {}


def _actor_id() -> str:
    actor = ray.get_runtime_context().get_actor_id()
    if actor is None:
        raise CommError("pycomm.ray: a collective group is joined from inside a Ray actor "
                        "(the driver declares one with create_collective_group)")
    return actor


def _join(name: str, directory, world_size: int, rank: int | None, transport: str,
          timeout: float) -> _Member:
    from .bootstrap import JobEnv, create_world
    if _groups:
        raise CommError(f"this actor is already in pycomm group {next(iter(_groups))!r}; "
                        "an actor is in one group at a time (destroy_collective_group first)")
    node = ray.get_runtime_context().get_node_id()
    info = ray.get(directory.join.remote(world_size, rank, _actor_id(), node, timeout),
                   timeout=timeout + 10)
    job = JobEnv(info["rank"], info["size"], info["addr"], info["port"], info["token"].encode(),
                 info["job_id"], "ray", local_rank=info["local_rank"],
                 local_size=info["local_size"])
    comm, closer = create_world(job, transport=transport, timeout=timeout)
    member = _groups[name] = _Member(name, comm, closer, directory, info["job_id"])
    return member


def init_collective_group(world_size: int, rank: int, group_name: str = "default", *,
                          transport: str = "auto", timeout: float | None = None):
    """Join a group from inside an actor; every member calls this (``ray.util.collective``).

    Args:
        world_size: number of members (>= 1).
        rank: this member's rank, ``0 <= rank < world_size``; each rank exactly once.
        group_name: the group's name, unique among the live groups of the Ray job.
        transport: "auto" (shared memory within a node, TCP across), "shm", "tcp" or "rdma".
        timeout: seconds for the others to join and the default for every wait of the
            world (default ``PYCOMM_TIMEOUT``).

    Returns:
        The group's :class:`pycomm.Communicator`.

    Raises:
        ArgumentError: bad arguments, or members that disagree (world size, two actors
            with one rank) -- on every member.
        CommTimeoutError: not every member joined within ``timeout``.
        CommError: not inside an actor, or this actor is already in a group.
    """
    if not isinstance(group_name, str) or not group_name:
        raise ArgumentError(f"group_name={group_name!r}: a non-empty string is required")
    if not isinstance(world_size, int) or world_size < 1:
        raise ArgumentError(f"world_size={world_size!r}: a positive int is required")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ArgumentError(f"rank={rank!r} is out of range for world_size {world_size}")
    _actor_id()
    with _lock:
        if group_name in _groups:
            raise CommError(f"group {group_name!r} is already initialized in this actor")
        # Detached: Ray ends a non-detached actor with the member that created it, and that
        # member may fail, or leave, before the others are done with the directory.
        directory = _Directory.options(name=_DIRECTORY_PREFIX + group_name, get_if_exists=True,
                                       lifetime="detached").remote(group_name, world_size, None)
        return _join(group_name, directory, world_size, rank, transport,
                     _timeout(timeout)).comm


def create_collective_group(actors: Sequence[Any], world_size: int | None = None,
                            ranks: Sequence[int] | None = None, group_name: str = "default",
                            *, timeout: float | None = None) -> None:
    """Declare ``actors`` a group, from the driver (``ray.util.collective``'s call).

    Nothing connects yet: each actor joins when it first asks for the group
    (:func:`get_group_handle` or a collective of this module), with the rank declared here.

    Args:
        actors: Ray actor handles, each its own process.
        world_size: number of members; must equal ``len(actors)`` (default).
        ranks: ``ranks[i]`` is ``actors[i]``'s rank, a permutation of
            ``range(world_size)`` (default ``0, 1, ...`` in list order).
        group_name: the group's name, unique among the live groups of the Ray job.
        timeout: seconds to create the directory.

    Raises:
        ArgumentError: the sizes or ranks are inconsistent, or the name is taken.
    """
    actors = list(actors)
    n = len(actors) if world_size is None else world_size
    ranks = list(range(n)) if ranks is None else list(ranks)
    if n < 1 or len(actors) != n or len(ranks) != n:
        raise ArgumentError(f"create_collective_group: {len(actors)} actors, world_size={n}, "
                            f"{len(ranks)} ranks; all three must be equal and >= 1")
    if sorted(ranks) != list(range(n)):
        raise ArgumentError(f"ranks={ranks} must be a permutation of 0..{n - 1}")
    ids = [a._actor_id.hex() for a in actors]
    if len(set(ids)) != n:
        raise ArgumentError("create_collective_group: an actor is listed twice")
    try:
        ray.get_actor(_DIRECTORY_PREFIX + group_name)
    except ValueError:
        pass
    else:
        raise ArgumentError(f"a pycomm group named {group_name!r} exists; destroy it first "
                            "or choose another group_name")
    directory = _Directory.options(name=_DIRECTORY_PREFIX + group_name).remote(
        group_name, n, dict(zip(ids, ranks)))
    ray.get(directory.job.remote(), timeout=_timeout(timeout))
    _declared[group_name] = directory


def get_group_handle(group_name: str = "default", *, transport: str = "auto",
                     timeout: float | None = None):
    """Return this actor's communicator of the group, joining a driver-declared group on
    first use (every member must ask).

    Raises:
        CommError: no such group (neither initialized here nor declared by the driver),
            or not inside an actor. Joining raises as :func:`init_collective_group`.
    """
    with _lock:
        member = _groups.get(group_name)
        if member is not None:
            return member.comm
        _actor_id()
        try:
            directory = ray.get_actor(_DIRECTORY_PREFIX + group_name)
        except ValueError:
            raise CommError(f"the collective group {group_name!r} is not initialized in this "
                            "process nor declared by the driver") from None
        return _join(group_name, directory, -1, None, transport, _timeout(timeout)).comm


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave the group (inside an actor: close this member's world), or from the driver
    end it (its directory and store) -- the members' worlds are theirs to close.

    Unknown names are ignored, as in ``ray.util.collective``.
    """
    if ray.get_runtime_context().get_actor_id() is None:
        directory = _declared.pop(group_name, None)
        if directory is None:
            try:
                directory = ray.get_actor(_DIRECTORY_PREFIX + group_name)
            except ValueError:
                return
        _end_directory(directory)
        return
    with _lock:
        member = _groups.pop(group_name, None)
    if member is None:
        return
    try:
        member.closer()
    finally:
        sweep_shm(member.job_id)
        try:
            last = ray.get(member.directory.leave.remote(member.comm.rank), timeout=10)
        except Exception:  # noqa: BLE001 - the directory is gone: nothing left to end
            last = False
        if last:
            _end_directory(member.directory)


def _end_directory(directory) -> None:
    try:
        ray.get(directory.close.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - already dead: killing it is what is left
        pass
    ray.kill(directory, no_restart=True)


def is_group_initialized(group_name: str = "default") -> bool:
    """Whether this process is a member of ``group_name``."""
    return group_name in _groups


def get_rank(group_name: str = "default") -> int:
    """This process's rank in the group, -1 when it is not a member."""
    member = _groups.get(group_name)
    return -1 if member is None else member.comm.rank


def get_collective_group_size(group_name: str = "default") -> int:
    """The group's size, -1 when this process is not a member."""
    member = _groups.get(group_name)
    return -1 if member is None else member.comm.size


# -- ray.util.collective's calls over the communicator ---------------------------------------
def _op(op) -> ops.Op:
    if isinstance(op, ops.Op):
        return op
    name = getattr(op, "name", op)
    if name in _RAY_OPS:
        return _RAY_OPS[name]
    raise ArgumentError(f"op={op!r}: use a pycomm op or ray's ReduceOp SUM, PRODUCT, MIN, MAX")


def allreduce(tensor: np.ndarray, group_name: str = "default", op=ops.SUM) -> None:
    """Reduce ``tensor`` over the group in place (every member gets the result)."""
    get_group_handle(group_name).Allreduce(IN_PLACE, tensor, op=_op(op))


def reduce(tensor: np.ndarray, dst_rank: int = 0, group_name: str = "default",
           op=ops.SUM) -> None:
    """Reduce ``tensor`` over the group in place on ``dst_rank`` (others' are unchanged)."""
    comm = get_group_handle(group_name)
    if comm.rank == dst_rank:
        comm.Reduce(IN_PLACE, tensor, op=_op(op), root=dst_rank)
    else:
        comm.Reduce(tensor, None, op=_op(op), root=dst_rank)


def broadcast(tensor: np.ndarray, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``src_rank``'s ``tensor`` into every member's ``tensor``."""
    get_group_handle(group_name).Bcast(tensor, root=src_rank)


def _with_list(call: str, tensor: np.ndarray, tensor_list: list, group_name: str):
    """The group's communicator, once ``tensor_list`` holds one array shaped and typed as
    ``tensor`` per member (else ArgumentError, before any byte moves)."""
    comm = get_group_handle(group_name)
    if len(tensor_list) != comm.size or any(
            t.shape != tensor.shape or t.dtype != tensor.dtype for t in tensor_list):
        raise ArgumentError(f"{call}: tensor_list needs {comm.size} arrays of shape "
                            f"{tensor.shape} and dtype {tensor.dtype}")
    return comm


def allgather(tensor_list: list, tensor: np.ndarray, group_name: str = "default") -> None:
    """Fill ``tensor_list[r]`` (world_size arrays shaped and typed as ``tensor``) with
    rank r's ``tensor``.

    Raises:
        ArgumentError: ``tensor_list`` does not hold world_size such arrays.
    """
    comm = _with_list("allgather", tensor, tensor_list, group_name)
    out = np.empty((comm.size,) + tensor.shape, tensor.dtype)
    comm.Allgather(np.ascontiguousarray(tensor), out)
    for r, t in enumerate(tensor_list):
        t[...] = out[r]


def reducescatter(tensor: np.ndarray, tensor_list: list, group_name: str = "default",
                  op=ops.SUM) -> None:
    """Set ``tensor`` to the reduction over the group of every member's
    ``tensor_list[rank]`` (world_size arrays shaped and typed as ``tensor``).

    Raises:
        ArgumentError: ``tensor_list`` does not hold world_size such arrays.
    """
    comm = _with_list("reducescatter", tensor, tensor_list, group_name)
    comm.Reduce_scatter_block(np.concatenate([np.ravel(t) for t in tensor_list]), tensor,
                              op=_op(op))


def barrier(group_name: str = "default") -> None:
    """Wait until every member has called it."""
    get_group_handle(group_name).Barrier()


def send(tensor: np.ndarray, dst_rank: int, group_name: str = "default") -> None:
    """Send ``tensor`` to ``dst_rank`` of the group."""
    get_group_handle(group_name).Send(tensor, dst_rank)


def recv(tensor: np.ndarray, src_rank: int, group_name: str = "default") -> None:
    """Receive into ``tensor`` from ``src_rank`` of the group."""
    get_group_handle(group_name).Recv(tensor, src_rank)


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
