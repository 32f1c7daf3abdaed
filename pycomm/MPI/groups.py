"""``MPI.Group``: mpi4py's group API over :class:`pycomm.Group` (world ranks, in order)."""

from __future__ import annotations

from pycomm.groups import UNDEFINED
from pycomm.groups import Group as _Group

from .exceptions import translate_methods
from .msgspec import as_int

__all__ = ["GROUP_EMPTY", "GROUP_NULL", "Group"]


@translate_methods
class Group:
    """An ordered set of processes (mpi4py's ``MPI.Group``); ``Group()`` is GROUP_NULL."""

    __slots__ = ("__weakref__", "_g")

    def __init__(self, group: Group | None = None):
        if group is not None and not isinstance(group, Group):
            raise TypeError(f"Group({group!r}): expected an MPI.Group or nothing")
        self._g = None if group is None else group._g

    @classmethod
    def _of(cls, inner: _Group) -> Group:
        out = cls.__new__(cls)
        out._g = inner
        return out

    def _inner(self) -> _Group:
        if self._g is None:
            from pycomm.errors import ArgumentError

            from .exceptions import mpi_error
            raise mpi_error(ArgumentError, "ERR_GROUP", "Group: GROUP_NULL cannot be used")
        return self._g

    def Get_size(self) -> int:
        return self._inner().size

    def Get_rank(self) -> int:
        """This process's rank in the group, or ``UNDEFINED``."""
        return self._inner().rank

    size = property(Get_size)
    rank = property(Get_rank)

    def Dup(self) -> Group:
        return Group._of(_Group(self._inner()._world, self._inner()._me))

    def Incl(self, ranks) -> Group:
        return Group._of(self._inner().Incl([as_int(r, "ranks", "Group.Incl")
                                             for r in ranks]))

    def Excl(self, ranks) -> Group:
        return Group._of(self._inner().Excl([as_int(r, "ranks", "Group.Excl")
                                             for r in ranks]))

    def Range_incl(self, ranges) -> Group:
        """The ranks of ``(first, last, stride)`` triplets, in order (last included)."""
        return self.Incl(_expand(ranges))

    def Range_excl(self, ranges) -> Group:
        return self.Excl(_expand(ranges))

    def Union(self, group: Group) -> Group:
        return Group._of(self._inner().Union(group._inner()))

    def Intersection(self, group: Group) -> Group:
        return Group._of(self._inner().Intersection(group._inner()))

    def Difference(self, group: Group) -> Group:
        return Group._of(self._inner().Difference(group._inner()))

    def Translate_ranks(self, ranks=None, group: Group | None = None) -> list[int]:
        """Ranks in ``group`` of ``ranks`` of this group (``UNDEFINED`` where absent)."""
        g = self._inner()
        if ranks is None:
            ranks = range(g.size)
        out = []
        for r in ranks:                    # a rank may repeat (MPI allows it)
            r = as_int(r, "ranks", "Group.Translate_ranks")
            if r == -1:                    # PROC_NULL translates to itself
                out.append(r)
                continue
            if not 0 <= r < g.size:
                from pycomm.errors import ArgumentError
                raise ArgumentError(f"Group.Translate_ranks: rank {r} is not in a group "
                                    f"of size {g.size}")
            w = g._world[r]
            out.append(w if group is None else group._inner()._index.get(w, UNDEFINED))
        return out

    def Compare(self, group: Group) -> int:
        """IDENT, SIMILAR or UNEQUAL."""
        return self._inner().Compare(group._inner())

    @classmethod
    def Create_from_session_pset(cls, session, pset_name: str) -> Group:
        """The group of a session's process set (``session.Create_group``)."""
        return session.Create_group(pset_name)

    def Free(self) -> None:
        """The handle becomes GROUP_NULL."""
        self._g = None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        if self._g is None or other._g is None:
            return self._g is other._g
        return self._g is other._g or (self._g._world == other._g._world and
                                       not self._g._world)

    def __hash__(self) -> int:
        return id(self._g)

    def __bool__(self) -> bool:
        return self._g is not None

    def __repr__(self) -> str:
        return "<MPI.GROUP_NULL>" if self._g is None else f"<MPI.Group {self._g._world}>"


def _expand(ranges) -> list[int]:
    out: list[int] = []
    for first, last, stride in ranges:
        first, last = as_int(first, "first", "Range_incl"), as_int(last, "last", "Range_incl")
        stride = as_int(stride, "stride", "Range_incl")
        if stride == 0:
            from pycomm.errors import ArgumentError
            raise ArgumentError(f"Group.Range_incl: stride 0 in {(first, last, stride)}")
        out += list(range(first, last + (1 if stride > 0 else -1), stride))
    return out


GROUP_NULL = Group()
GROUP_EMPTY = Group._of(_Group([], UNDEFINED))
