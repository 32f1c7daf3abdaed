"""Groups on Ray actors: this process's memberships and ``ray.util.collective``'s calls
over the group's communicator (see :mod:`pycomm.ray`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from pycomm import config, ops
from pycomm.buffers import IN_PLACE
from pycomm.errors import ArgumentError, CommError
from pycomm.launch.launcher import sweep_shm

from .directory import DIRECTORY_PREFIX as _DIRECTORY_PREFIX
from .directory import Directory as _Directory

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "create_collective_group",
           "destroy_collective_group", "get_collective_group_size", "get_group_handle",
           "get_rank", "init_collective_group", "is_group_initialized", "recv", "reduce",
           "reducescatter", "send"]

_RAY_OPS = {"SUM": ops.SUM, "PRODUCT": ops.PROD, "MIN": ops.MIN, "MAX": ops.MAX}


def _timeout(timeout: float | None) -> float:
    return float(config.get("PYCOMM_TIMEOUT") if timeout is None else timeout)


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


# Directories of groups that failed to form here, held for a while (see _hold).
_failed: list = []


def _hold(directory, seconds: float) -> None:
    """Keep a handle to the directory of a group that failed to form for ``seconds``.

    Ray ends an actor when the process that created it drops its handles. The member
    whose join failed first may be that process, and a member still on its way must find
    the directory to be told why, not find a dead actor. After that the directory ends with
    the last handle, freeing the name.
    """
    _failed.append(directory)

    def drop() -> None:
        try:
            _failed.remove(directory)
        except ValueError:
            pass
    timer = threading.Timer(seconds, drop)
    timer.daemon = True
    timer.start()


def _actor_id() -> str:
    actor = ray.get_runtime_context().get_actor_id()
    if actor is None:
        raise CommError("pycomm.ray: a collective group is joined from inside a Ray actor "
                        "(the driver declares one with create_collective_group)")
    return actor


def _join(name: str, directory, world_size: int, rank: int | None, transport: str,
          timeout: float) -> _Member:
    from pycomm.launch.bootstrap import create_world
    from pycomm.launch.jobenv import JobEnv
    if _groups:
        raise CommError(f"this actor is already in pycomm group {next(iter(_groups))!r}; "
                        "an actor is in one group at a time (destroy_collective_group first)")
    node = ray.get_runtime_context().get_node_id()
    try:
        info = ray.get(directory.join.remote(world_size, rank, _actor_id(), node, timeout),
                       timeout=timeout + 10)
    except Exception:
        _hold(directory, timeout)
        raise
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
        directory = _Directory.options(name=_DIRECTORY_PREFIX + group_name,
                                       get_if_exists=True).remote(group_name, world_size, None)
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
