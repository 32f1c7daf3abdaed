"""The directory of a pycomm group on Ray: one named actor per group, its launcher (see
:mod:`pycomm.ray`)."""

from __future__ import annotations

import secrets
import threading
import uuid

import ray

from pycomm.errors import ArgumentError, CommTimeoutError

__all__ = ["DIRECTORY_PREFIX", "Directory"]

DIRECTORY_PREFIX = "pycomm:"


# -- the directory: one per group, the group's launcher --------------------------------------
@ray.remote(num_cpus=0, max_concurrency=1024)
class Directory:
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
                raise ArgumentError(self.failure)
            if self.server is None:
                missing = sorted(set(range(self.world_size)) - set(self.members))
                self.failure = (f"group {self.group_name!r}: ranks {missing} did not join "
                                f"within {timeout:g} s")
                self.cond.notify_all()
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

    def _start_store(self) -> None:
        from pycomm.launch.store import StoreServer
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
