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
starts the group's rendezvous store (:class:`pycomm.launch.store.StoreServer`, authenticated with
a random job secret that only the members receive, through Ray) and hands every member the
store's address: loopback when every member runs on the directory's node, else the
directory's Ray node address. From there the world forms as under any launcher
(:func:`pycomm.launch.bootstrap.create_world`): each rank listens on the interface that routes to
the store's host, shared memory links the ranks of a node and TCP the nodes. The directory
plays the launcher's part, so it lives as long as the group: the last member to leave, or
the driver's :func:`destroy_collective_group`, ends it; a group that fails to form (members
that disagree, or one that never comes) ends its directory ``timeout`` seconds later, or
when the actor that made it ends.

Modules: :mod:`pycomm.ray.directory` (the directory actor), :mod:`pycomm.ray.group` (this
process's memberships and the collective calls), :mod:`pycomm.ray.runner` (:func:`run`).

Limits: an actor is in at most one pycomm group at a time (destroy it to join another),
as with ``ray.experimental.collective``; pycomm must be importable on every node.
"""

from __future__ import annotations

from .group import (allgather, allreduce, barrier, broadcast, create_collective_group,
                    destroy_collective_group, get_collective_group_size, get_group_handle,
                    get_rank, init_collective_group, is_group_initialized, recv, reduce,
                    reducescatter, send)
from .runner import run

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "create_collective_group",
           "destroy_collective_group", "get_collective_group_size", "get_group_handle",
           "get_rank", "init_collective_group", "is_group_initialized", "recv", "reduce",
           "reducescatter", "run", "send"]
