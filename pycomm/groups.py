"""Groups and communicator construction: ``Dup``, ``Split``, ``Create``, ``Create_group``.

A :class:`Group` is an ordered set of processes, held as their world ranks. A new
communicator needs a context id that none of its members uses for anything else. Each
process keeps ``engine.next_cid`` (one past the largest context id it has seen); the
members of a new communicator agree on ``max(next_cid)`` with an Allgather over the
processes taking part (which gathers their free slot blocks too,
:mod:`pycomm.slotblocks`). Any two communicators that share a member therefore get
different ids, and communicators with disjoint members never see each other's traffic,
since matching is by (context, source process).

Context ids map to three engine contexts: ``3*cid`` (user point-to-point), ``3*cid + 1``
(collectives, tag = per-call sequence number) and ``3*cid + 2`` (the set-up traffic of
``Create_group``, which only the group's members take part in, tagged by the user's tag).

Every new communicator gets a ``host_layout`` (which of its ranks share a host, see
:class:`pycomm.launch.bootstrap.HostLayout`) derived from its parent's without a message: every
rank knows the parent's whole layout and the new member list.
"""

from __future__ import annotations

import numpy as np

from . import slotblocks
from .errors import ArgumentError
from .p2p import PROC_NULL

__all__ = ["Group", "UNDEFINED", "COMM_NULL", "GroupMethods", "IDENT", "CONGRUENT",
           "SIMILAR", "UNEQUAL"]

UNDEFINED = -32766
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3


class _CommNull:
    """``pycomm.COMM_NULL``: what ``Split`` returns to ranks with color UNDEFINED."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "pycomm.COMM_NULL"


COMM_NULL = _CommNull()


class Group:
    """An ordered set of processes (mpi4py's ``Group``).

    Args:
        world_ranks: the members' world ranks, in group rank order.
        my_world_rank: the calling process's world rank (its ``rank`` is derived).
    """

    def __init__(self, world_ranks, my_world_rank: int):
        self._world = [int(w) for w in world_ranks]
        if len(set(self._world)) != len(self._world):
            raise ArgumentError(f"a group cannot hold a process twice: {self._world}")
        self._me = my_world_rank
        self._index = {w: i for i, w in enumerate(self._world)}

    @property
    def size(self) -> int:
        return len(self._world)

    @property
    def rank(self) -> int:
        """This process's rank in the group, or UNDEFINED if it is not a member."""
        return self._index.get(self._me, UNDEFINED)

    def Get_size(self) -> int:
        return self.size

    def Get_rank(self) -> int:
        return self.rank

    def _check(self, ranks, what: str) -> list[int]:
        out = []
        for r in ranks:
            if not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
                raise ArgumentError(f"{what}: rank {r!r} is not in a group of size "
                                    f"{self.size}")
            out.append(int(r))
        if len(set(out)) != len(out):
            raise ArgumentError(f"{what}: ranks {out} repeat a rank")
        return out

    def Incl(self, ranks) -> "Group":
        """The group of the listed ranks of this group, in the listed order."""
        return Group([self._world[r] for r in self._check(ranks, "Group.Incl")], self._me)

    def Excl(self, ranks) -> "Group":
        """This group without the listed ranks, in the original order."""
        drop = set(self._check(ranks, "Group.Excl"))
        return Group([w for i, w in enumerate(self._world) if i not in drop], self._me)

    def Union(self, other: "Group") -> "Group":
        return Group(self._world + [w for w in other._world if w not in self._index],
                     self._me)

    def Intersection(self, other: "Group") -> "Group":
        return Group([w for w in self._world if w in other._index], self._me)

    def Difference(self, other: "Group") -> "Group":
        return Group([w for w in self._world if w not in other._index], self._me)

    def Translate_ranks(self, ranks=None, group: Group | None = None) -> list[int]:
        """Ranks in ``group`` of ``ranks`` of this group (UNDEFINED where absent).

        mpi4py 4's signature; ``Group.Translate_ranks(group1, ranks1, group2)`` (mpi4py 3's
        class form) binds the same way. ``ranks`` None: every rank of this group;
        ``group`` None: the group of COMM_WORLD (the answer is then world ranks).
        PROC_NULL translates to PROC_NULL (MPI-2 errata).
        """
        if ranks is None:
            ranks = range(self.size)
        ranks = list(ranks)
        valid = self._check([r for r in ranks if r != PROC_NULL], "Group.Translate_ranks")
        it = iter(valid)
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            w = self._world[next(it)]
            out.append(w if group is None else group._index.get(w, UNDEFINED))
        return out

    def Compare(self, other: "Group") -> int:
        """IDENT (same members, same order), SIMILAR (same members) or UNEQUAL."""
        if self._world == other._world:
            return IDENT
        return SIMILAR if set(self._world) == set(other._world) else UNEQUAL

    def Free(self) -> None:
        """Groups hold no resources; kept for mpi4py compatibility."""

    def __repr__(self) -> str:
        return f"<pycomm.Group of {self.size}: world ranks {self._world}>"


class GroupMethods:
    """Mixin giving the communicator its group and constructor methods."""

    @property
    def group(self) -> Group:
        """The communicator's group (mpi4py's ``Comm.group`` property).

        Returns:
            Group: the members as world ranks, in communicator rank order; a new object on
            each access.

        Raises:
            Nothing.
        """
        return Group(self._world, self._world[self.rank])

    def Get_group(self) -> Group:
        """Return the communicator's group (MPI_Comm_group).

        Returns:
            Group: as the :attr:`group` property.

        Raises:
            Nothing.
        """
        return self.group

    def _new_cid(self, over) -> tuple[int, dict]:
        """Agree on a fresh context id, the largest ``next_cid`` of communicator
        ``over``'s processes, with one Allgather over ``over`` that also gathers their
        masks of free slot blocks (:mod:`pycomm.slotblocks`). Returns ``(cid, world rank
        -> mask)``, for :meth:`_derive`."""
        engine = self._engine
        mine = np.array([engine.next_cid, slotblocks.free_mask(engine)], dtype=np.uint64)
        table = np.empty(2 * over.size, dtype=np.uint64)
        over.Allgather(mine, table)
        cid = int(table[0::2].max())
        engine.next_cid = cid + 1
        return cid, {w: int(table[2 * r + 1]) for r, w in enumerate(over._world)}

    def _derive(self, agreed: tuple[int, dict], world_ranks: list[int], name: str):
        """The new communicator of ``world_ranks`` (this process among them) on the
        context id ``_new_cid`` agreed, with the lowest slot block free on all of them."""
        cid, masks = agreed
        me = self._world[self.rank]
        comm = type(self)(self._engine, cid, world_ranks, world_ranks.index(me), name=name)
        comm.transport = getattr(self, "transport", None)
        comm.transport_name = getattr(self, "transport_name", None)
        self._derive_layout(comm)
        comm._block = slotblocks.choose(masks[w] for w in world_ranks)
        slotblocks.take(comm, comm._block)
        return comm

    def _derive_layout(self, comm) -> None:
        """Give ``comm`` (a communicator of some of this one's processes) its
        ``host_layout``, derived from this one's without a message (issue 16)."""
        layout = getattr(self, "host_layout", None)
        if layout is not None:
            members = [self._from_world[w] for w in comm._world]
            comm.host_layout = layout.restrict(members, comm.rank)

    def Dup(self):
        """Return a new communicator of the same group with a fresh context (MPI_Comm_dup).

        Collective over this communicator; ``Clone`` is the same method. Traffic on the copy
        never matches traffic on this one.

        Returns:
            Communicator: named ``<name>.Dup``, with this one's transports and host layout.

        Raises:
            CommError: this communicator has been freed.
            PeerError, CommTimeoutError, CollectiveMismatchError, CollectiveError: as every
                collective call (see :class:`~pycomm.comm.Communicator`): this one agrees on a
                context id with an Allgather.
        """
        self._check_alive()
        return self._derive(self._new_cid(self), list(self._world), self.name + ".Dup")

    Clone = Dup

    def Split(self, color: int = 0, key: int = 0):
        """Partition the communicator by ``color``; order each part by (``key``, rank).

        Collective over this communicator (MPI_Comm_split): an Allgather of (color, key), then
        the context id.

        Args:
            color: a non-negative int; ranks with the same color form one communicator, ranks
                passing UNDEFINED get COMM_NULL (default 0).
            key: orders the ranks of a part; ties keep this communicator's rank order
                (default 0).

        Returns:
            Communicator: named ``<name>.Split(<color>)``; COMM_NULL for color UNDEFINED.

        Raises:
            ArgumentError: ``color`` is negative (other than UNDEFINED) or not an int, or
                ``key`` is not an int.
            CommError: this communicator has been freed.
            PeerError, CommTimeoutError, CollectiveMismatchError, CollectiveError: as every
                collective call (see :class:`~pycomm.comm.Communicator`): this one agrees on a
                context id with an Allgather.
        """
        self._check_alive()
        if not isinstance(color, (int, np.integer)) or (color < 0 and color != UNDEFINED):
            raise ArgumentError(f"rank {self.rank}: Split color={color!r} must be a "
                                "non-negative int or UNDEFINED")
        if not isinstance(key, (int, np.integer)):
            raise ArgumentError(f"rank {self.rank}: Split key={key!r} must be an int")
        table = np.empty(2 * self.size, dtype=np.int64)
        self.Allgather(np.array([color, key], dtype=np.int64), table)
        cid = self._new_cid(self)
        if color == UNDEFINED:
            return COMM_NULL
        members = sorted((int(table[2 * r + 1]), r) for r in range(self.size)
                         if table[2 * r] == color)
        return self._derive(cid, [self._world[r] for _, r in members],
                            f"{self.name}.Split({color})")

    def Create(self, group: Group):
        """Return a communicator of ``group`` (a subset of this one's); collective over this one.

        Every rank of this communicator calls it with the same group (MPI_Comm_create).

        Args:
            group: a :class:`Group` of processes of this communicator.

        Returns:
            Communicator: named ``<name>.Create``; COMM_NULL on ranks outside ``group``.

        Raises:
            ArgumentError: ``group`` is not a Group, or holds processes outside this
                communicator.
            CommError: this communicator has been freed.
            PeerError, CommTimeoutError, CollectiveMismatchError, CollectiveError: as every
                collective call (see :class:`~pycomm.comm.Communicator`): this one agrees on a
                context id with an Allgather.
        """
        self._check_alive()
        self._check_subgroup(group, "Create")
        cid = self._new_cid(self)
        if group.rank == UNDEFINED:
            return COMM_NULL
        return self._derive(cid, list(group._world), f"{self.name}.Create")

    def Create_group(self, group: Group, tag: int = 0):
        """Return a communicator of ``group``; collective over the group's members only.

        Only the members call it (MPI_Comm_create_group); their set-up traffic uses a context of
        its own, so the other ranks need not take part. Concurrent calls by overlapping groups
        must use different ``tag`` values (MPI).

        Args:
            group: a :class:`Group` of processes of this communicator that includes the caller.
            tag: distinguishes concurrent calls, 0..TAG_UB (default 0).

        Returns:
            Communicator: named ``<name>.Create_group``.

        Raises:
            ArgumentError: ``group`` is not a Group, holds processes outside this communicator
                or not the caller, or ``tag`` is invalid.
            CommError: this communicator has been freed.
            PeerError, CommTimeoutError, CollectiveMismatchError, CollectiveError: as every
                collective call (see :class:`~pycomm.comm.Communicator`): this one agrees on a
                context id with an Allgather over the members.
        """
        self._check_alive()
        self._check_subgroup(group, "Create_group")
        if group.rank == UNDEFINED:
            raise ArgumentError(f"rank {self.rank}: Create_group called by a process that "
                                "is not in the group")
        tag = self._check_tag(tag, "tag")
        # A scratch communicator over the members, on this communicator's set-up context.
        me = self._world[self.rank]
        temp = type(self)(self._engine, self._cid, list(group._world),
                          group._world.index(me), name="create_group")
        temp._cctx = 3 * self._cid + 2
        self._derive_layout(temp)
        temp._calls.seq = (tag * 64) & 0x7FFFFFFF
        # The set-up context numbers its calls by tag, not in order: a later (or another
        # group's concurrent) Create_group may count lower than this one, so a message of
        # it is no leftover of a finished call (which would abandon calls on every rank).
        self._engine.unordered.add(temp._cctx)
        cid = self._new_cid(temp)
        return self._derive(cid, list(group._world), f"{self.name}.Create_group")

    def _check_subgroup(self, group: Group, what: str) -> None:
        if not isinstance(group, Group):
            raise ArgumentError(f"rank {self.rank}: {what} needs a pycomm.Group, got "
                                f"{type(group).__name__}")
        outside = [w for w in group._world if w not in self._from_world]
        if outside:
            raise ArgumentError(f"rank {self.rank}: {what}: world ranks {outside} are not "
                                f"in {self.name}")

    def Compare(self, other) -> int:
        """Compare this communicator with ``other`` (MPI_Comm_compare).

        Args:
            other: another communicator.

        Returns:
            int: IDENT (the same object), CONGRUENT (same members in the same order), SIMILAR
            (same members, another order) or UNEQUAL.

        Raises:
            AttributeError: ``other`` has no ``group`` (not a communicator).
        """
        if other is self:
            return IDENT
        g = self.group.Compare(other.group)
        return CONGRUENT if g == IDENT else g

    def Free(self) -> None:
        """Release the communicator (MPI_Comm_free); using it afterwards raises CommError.

        Local: nothing is sent. Its context id is never reused; its block of the
        shared-memory collective area is, once every member has freed it
        (:mod:`pycomm.slotblocks`).

        Returns:
            None.

        Raises:
            ArgumentError: this is COMM_WORLD, which cannot be freed.
        """
        if self._cid == 0:
            raise ArgumentError("COMM_WORLD cannot be freed")
        if not self._freed:
            self._freed = True
            slotblocks.give_back(self)
