"""``MPI.Intercomm``: inter-communicators (MPI-4.1 section 7.6) in mpi4py's API.

An inter-communicator joins two disjoint groups; its ``rank``/``size``/``group`` are the
local group's, ``remote_size``/``remote_group`` the other's, and point-to-point ranks
name the remote group. pycomm builds one from ordinary Communicators
(:class:`pycomm.MPI.interlink.InterLink`); the collectives with MPI's root rules are
:mod:`pycomm.MPI.intercoll`.

Construction:

* ``Intracomm.Create_intercomm(local_leader, peer_comm, remote_leader, tag)``
  (MPI_Intercomm_create): the two leaders meet on a private two-process communicator
  (``Create_group`` of the pair over COMM_WORLD, never the user's traffic on
  ``peer_comm``) and swap their tags and groups; mismatched tags, overlapping groups or a
  bad leader raise ``MPI.Exception`` on every process of the local group (the leader's
  verdict is broadcast over ``local_comm``) before the inter-communicator is built;
* ``Intercomm.Create_from_groups(local_group, local_leader, remote_group,
  remote_leader, stringtag)`` (MPI_Intercomm_create_from_groups): every process knows
  both groups, so it builds at once;
* ``Dup``, ``Split``, ``Create``, ``Split_type`` of an inter-communicator give
  inter-communicators (MPI-4.1 7.4.2, 7.4.4); ``Merge(high)`` gives the intra-communicator
  of both groups (MPI_Intercomm_merge: the ``high=False`` group first; equal flags put
  the low group, the one holding the lower world rank, first; MPICH's ``is_low_group``
  plays that part).

``Intercomm()`` is a null inter-communicator (equal to ``COMM_NULL``), which is also what
``Comm.Get_parent()`` gives (no pycomm process is spawned). ``Intercomm(intracomm)`` and
``Intracomm(intercomm)`` are ``TypeError`` as in mpi4py.
"""

from __future__ import annotations

from pycomm.errors import ArgumentError, CommError
from pycomm.groups import UNDEFINED
from pycomm.groups import Group as _Group
from pycomm.pt2pt import TAG_UB

from .comm import Comm
from .exceptions import mpi_error, translate, translate_methods
from .intercoll import InterCollectives
from .interlink import InterLink, is_inter, link_over_world, setup_tag
from .msgspec import as_int

__all__ = ["Intercomm", "create_intercomm"]


def _world_rank() -> int:
    from . import COMM_WORLD
    return COMM_WORLD._inner("Create_intercomm").rank


def _check_leader(leader, size: int, what: str, w: str) -> int:
    leader = as_int(leader, what, w)
    if not 0 <= leader < size:
        raise mpi_error(ArgumentError, "ERR_RANK", f"{w}: {what}={leader} is not a rank "
                        f"of its group (0..{size - 1})")
    return leader


def _order(mine: list[int], theirs: list[int], w: str) -> tuple[list[int], list[int], bool]:
    """``(low group, high group, whether mine is low)``: the group holding the lower world
    rank is low. Every process of both groups decides the same way from the groups
    alone, so even leaders named inconsistently cannot make the two sides build the union
    in different orders (a hang until ``PYCOMM_TIMEOUT``).

    Raises:
        MPI.Exception: ERR_GROUP (the groups share a process).
    """
    both = set(mine) & set(theirs)
    if both:
        raise mpi_error(ArgumentError, "ERR_GROUP", f"{w}: the local and remote groups "
                        f"share world ranks {sorted(both)} (they must be disjoint)")
    low = min(mine) < min(theirs)
    return (mine, theirs, True) if low else (theirs, mine, False)


def _leaders_meet(tag: int, mine: list[int], peer_world: int, w: str) -> list[int]:
    """The local leader's half of MPI_Intercomm_create: swap ``(tag, group)`` with the
    remote leader (world rank ``peer_world``) on a communicator of the two leaders alone.

    Raises:
        MPI.Exception: ERR_TAG (the leaders passed different tags).
    """
    from . import COMM_WORLD
    world = COMM_WORLD._inner("Create_intercomm")
    pair = sorted([world.rank, peer_world])
    comm = world.Create_group(_Group(pair, world.rank), setup_tag("leaders", pair))
    try:
        (tag0, g0), (tag1, g1) = comm.allgather((tag, mine))
    finally:
        comm.Free()
    theirs, their_tag = (g1, tag1) if comm.rank == 0 else (g0, tag0)
    if their_tag != tag:
        raise mpi_error(ArgumentError, "ERR_TAG", f"{w}: tag={tag} here, but the remote "
                        f"leader (world rank {peer_world}) passed tag={their_tag}")
    return theirs


def create_intercomm(local, local_leader, peer_comm, remote_leader, tag) -> Intercomm:
    """MPI_Intercomm_create, collective over ``local`` (an ``Intracomm``) and the remote
    group's local communicator; see the module docstring.

    Args:
        local: this group's intra-communicator.
        local_leader: its rank in ``local`` of this group's leader.
        peer_comm: a communicator of both leaders (significant at the leader only).
        remote_leader: the remote leader's rank in ``peer_comm`` (leader only).
        tag: must be the same at both leaders.

    Returns:
        Intercomm: local group ``local``'s, remote group the other's.

    Raises:
        MPI.Exception: ERR_RANK (a leader out of range, or both leaders the same
            process), ERR_COMM (``peer_comm`` null or an inter-communicator), ERR_TAG (a
            bad tag, or the leaders' tags differ), ERR_GROUP (the groups overlap), on
            every process of the local group; nothing is built then.
    """
    c = local._inner("Create_intercomm")
    w = f"rank {c.rank}: Create_intercomm"
    local_leader = _check_leader(local_leader, c.size, "local_leader", w)
    mine = local.Get_group()._g._world
    verdict = None
    if c.rank == local_leader:
        try:
            peer = peer_comm._inner("Create_intercomm")
            if is_inter(peer):
                raise mpi_error(CommError, "ERR_COMM", f"{w}: peer_comm must be an "
                                "intra-communicator")
            remote_leader = _check_leader(remote_leader, peer.size, "remote_leader", w)
            tag = as_int(tag, "tag", w)
            if not 0 <= tag <= TAG_UB:
                raise mpi_error(ArgumentError, "ERR_TAG", f"{w}: tag={tag} is not in "
                                f"0..{TAG_UB}")
            peer_world = peer.Get_group()._world[remote_leader]
            if peer_world in mine:
                raise mpi_error(ArgumentError, "ERR_RANK", f"{w}: remote_leader="
                                f"{remote_leader} of peer_comm is in the local group")
            theirs = _leaders_meet(tag, mine, peer_world, w)
            verdict = ("ok", theirs, tag)
        except CommError as exc:        # every MPI.Exception is a CommError
            verdict = ("error", translate(exc).Get_error_class(), str(exc))
    verdict = c.bcast(verdict, local_leader)
    if verdict[0] == "error":
        raise _reraise(verdict, c.rank)
    _, theirs, tag = verdict
    low_g, high_g, low = _order(mine, theirs, w)
    link = link_over_world(low_g, high_g, low, setup_tag("intercomm", low_g, high_g, tag),
                           f"{c.name}.Create_intercomm")
    return Intercomm._wrap(link)


def _reraise(verdict, rank: int) -> Exception:
    """The leader's error (its MPI error class and text), for every process of its
    group."""
    from .exceptions import ERRORS
    _, error_class, text = verdict
    code = next((k for k, v in ERRORS.items() if v == error_class), "ERR_OTHER")
    if not text.startswith(f"rank {rank}:"):
        text = f"rank {rank}: Create_intercomm: the local leader failed: {text}"
    return mpi_error(CommError if code == "ERR_COMM" else ArgumentError, code, text)


@translate_methods
class Intercomm(InterCollectives, Comm):
    """An inter-communicator (mpi4py's ``MPI.Intercomm``); see the module docstring."""

    __slots__ = ()

    def __init__(self, comm: Comm | None = None):
        super().__init__(comm)
        if self._c is not None and not is_inter(self._c):
            raise TypeError("MPI.Intercomm(comm): expecting an intercommunicator")

    # -- queries ----------------------------------------------------------------------
    def Is_inter(self) -> bool:
        self._inner("Is_inter")
        return True

    def Is_intra(self) -> bool:
        self._inner("Is_intra")
        return False

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_remote_group(self):
        """The remote group (MPI_Comm_remote_group).

        Returns:
            MPI.Group: the remote processes in their rank order (this process's rank in
            it is UNDEFINED).

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL).
        """
        from .groups import Group
        return Group._of(self._inner("Get_remote_group").Get_remote_group())

    def Get_remote_size(self) -> int:
        """The number of processes of the remote group (MPI_Comm_remote_size).

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL).
        """
        return self._inner("Get_remote_size").remote_size

    remote_group = property(Get_remote_group)
    remote_size = property(Get_remote_size)

    # -- construction -----------------------------------------------------------------
    @classmethod
    def Create_from_groups(cls, local_group, local_leader: int, remote_group,
                           remote_leader: int, stringtag: str = "org.mpi4py",
                           info=None, errhandler=None) -> Intercomm:
        """MPI_Intercomm_create_from_groups: the inter-communicator of two disjoint
        groups, collective over both (each process passes its own group as
        ``local_group``); ``stringtag`` tells concurrent constructions apart.

        Args:
            local_group, remote_group: ``MPI.Group``s; this process is in the first.
            local_leader, remote_leader: a rank of each group (their leaders).
            stringtag: the same string in both groups.
            info, errhandler: accepted; the new communicator gets ``errhandler`` if one
                is given.

        Returns:
            Intercomm.

        Raises:
            MPI.Exception: ERR_GROUP (a null group, the caller not in ``local_group``, or
                groups that overlap), ERR_RANK (a leader out of range).
        """
        w = f"rank {_world_rank()}: Intercomm.Create_from_groups"
        mine, theirs = local_group._inner()._world, remote_group._inner()._world
        if _world_rank() not in mine:
            raise mpi_error(ArgumentError, "ERR_GROUP", f"{w}: the calling process is "
                            "not in local_group")
        _check_leader(local_leader, len(mine), "local_leader", w)
        _check_leader(remote_leader, len(theirs), "remote_leader", w)
        low_g, high_g, low = _order(mine, theirs, w)
        link = link_over_world(low_g, high_g, low,
                               setup_tag("from_groups", low_g, high_g, str(stringtag)),
                               "Intercomm.Create_from_groups")
        out = cls._wrap(link)
        if errhandler is not None:
            out.Set_errhandler(errhandler)
        return out

    def Split(self, color: int = 0, key: int = 0) -> Intercomm:
        """MPI_Comm_split of an inter-communicator: the local processes of one ``color``,
        ordered by ``key``, joined with the remote processes of that color; COMM_NULL for
        ``UNDEFINED`` or a color the other group does not have.

        Collective over both groups (an allgather and a Split over the union).

        Returns:
            Intercomm, or COMM_NULL.

        Raises:
            MPI.Exception: ERR_ARG (a negative color other than UNDEFINED), ERR_COMM
                (COMM_NULL).
        """
        link = self._inner("Split")
        w = f"rank {link.rank}: Split"
        color, key = as_int(color, "color", w), as_int(key, "key", w)
        if color < 0 and color != UNDEFINED:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: color={color} must be "
                            "non-negative or UNDEFINED")
        table = link.union.allgather((color, key))
        return self._regroup(link, [c if c != UNDEFINED else None for c, _ in table],
                             [k for _, k in table], f"{link.name}.Split({color})")

    def Create(self, group) -> Intercomm:
        """MPI_Comm_create of an inter-communicator: each group passes a subgroup of its
        own; the result joins the two subgroups (COMM_NULL outside them, or everywhere
        when either is empty). Collective over both groups.

        Returns:
            Intercomm, or COMM_NULL.

        Raises:
            MPI.Exception: ERR_GROUP (``group`` holds processes outside the local group),
                ERR_COMM (COMM_NULL).
        """
        link = self._inner("Create")
        g = group._inner()._world
        if set(g) - set(link.world_ranks()):
            raise mpi_error(ArgumentError, "ERR_GROUP", f"rank {link.rank}: Create: the "
                            "group holds processes outside the local group")
        table = link.union.allgather(tuple(g))
        ranks = link.union.Get_group()._world
        colors = [0 if ranks[i] in table[0 if i < link.nlow else link.nlow] else None
                  for i in range(len(ranks))]
        keys = [table[0 if i < link.nlow else link.nlow].index(ranks[i])
                if colors[i] is not None else 0 for i in range(len(ranks))]
        return self._regroup(link, colors, keys, f"{link.name}.Create")

    def _regroup(self, link: InterLink, colors: list, keys: list, name: str):
        """The inter-communicators of each color (``colors``/``keys`` per union rank;
        None: no color): a Split of the union into the new canonical orders."""
        n, me = link.nlow, link.union.rank
        mine = colors[me]
        low = sorted((keys[i], i) for i in range(n) if colors[i] == mine)
        high = sorted((keys[i], i) for i in range(n, len(colors)) if colors[i] == mine)
        if mine is None or not low or not high:
            link.union.Split(UNDEFINED, 0)
            from . import COMM_NULL
            return COMM_NULL
        order = [i for _, i in low] + [i for _, i in high]
        union = link.union.Split(mine, order.index(me))
        return type(self)._wrap(InterLink(union, len(low), link.low, name))

    def Split_type(self, split_type: int, key: int = 0, info=None) -> Intercomm:
        """``COMM_TYPE_SHARED``: :meth:`Split` by host (pycomm's one hardware domain);
        any other kind (``UNDEFINED`` included): COMM_NULL. Collective over both groups.

        Returns:
            Intercomm, or COMM_NULL.
        """
        from . import Get_processor_name
        link = self._inner("Split_type")
        names = sorted(set(link.union.allgather(Get_processor_name())))
        shared = as_int(split_type, "split_type", "Split_type") == 1
        color = names.index(Get_processor_name()) if shared else UNDEFINED
        return self.Split(color, key)

    def Merge(self, high: bool = False):
        """MPI_Intercomm_merge: the intra-communicator of both groups, the group that
        passed ``high=False`` first (equal flags: the low group first, as MPICH).
        Collective over both groups.

        Returns:
            Intracomm: ``size + remote_size`` processes.

        Raises:
            MPI.Exception: ERR_COMM (COMM_NULL).
        """
        from .coll import Intracomm
        link = self._inner("Merge")
        flags = link.union.allgather(bool(high))
        low_first = flags[0] == flags[link.nlow] or not flags[0]
        me, nlow = link.union.rank, link.nlow
        nhigh = link.union.size - nlow
        key = me if low_first else (me - nlow if me >= nlow else me + nhigh)
        return Intracomm._wrap(link.union.Split(0, key))
