"""Cartesian topologies: ``Compute_dims``, ``Intracomm.Create_cart`` and ``MPI.Cartcomm``.

A Cartesian communicator is an ordinary communicator (made with the Communicator's
``Split``) plus its grid: ``dims``, ``periods`` and row-major coordinates (rank
``r`` has coordinates ``np.unravel_index(r, dims)``, MPI-4.0 section 8.5.1). Ranks are
never reordered. Neighbour lookups are pure arithmetic on (rank, dims, periods).
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError
from pycomm.groups import UNDEFINED
from pycomm.p2p import PROC_NULL

from .coll import Intracomm
from .exceptions import mpi_error, translate_methods
from .msgspec import as_int
from .neighbor import CART, DIST_GRAPH, GRAPH, Topocomm, with_topology

__all__ = ["CART", "DIST_GRAPH", "GRAPH", "Cartcomm", "Compute_dims", "Topocomm",
           "cart_map", "create_cart"]


def Compute_dims(nnodes: int, dims) -> list[int]:
    """A balanced grid of ``nnodes`` processes: fill the zero entries of ``dims`` (or
    ``dims`` zeros when an int) with factors in non-increasing order (MPI_Dims_create).

    Raises:
        ArgumentError: ``nnodes`` is not divisible by the product of the fixed dims.
    """
    nnodes = as_int(nnodes, "nnodes", "Compute_dims")
    dims = [0] * as_int(dims, "dims", "Compute_dims") if not hasattr(dims, "__len__") \
        else [as_int(d, "dims", "Compute_dims") for d in dims]
    fixed = int(np.prod([d for d in dims if d > 0])) if any(d > 0 for d in dims) else 1
    free = [i for i, d in enumerate(dims) if d == 0]
    if any(d < 0 for d in dims) or nnodes < 0 or (fixed and nnodes % fixed):
        raise mpi_error(ArgumentError, "ERR_DIMS", f"Compute_dims: {nnodes} processes "
                        f"cannot fill dims {dims}")
    if not free:
        if fixed != nnodes:
            raise mpi_error(ArgumentError, "ERR_DIMS", f"Compute_dims: dims {dims} hold "
                            f"{fixed} processes, not {nnodes}")
        return dims
    left = nnodes // fixed
    factors, n, p = [], left, 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    sizes = [1] * len(free)
    for f in sorted(factors, reverse=True):      # largest factor to the smallest slot
        sizes[sizes.index(min(sizes))] *= f
    for i, s in zip(free, sorted(sizes, reverse=True)):
        dims[i] = s
    return dims


def _grid(dims, periods, what: str):
    dims = [as_int(d, "dims", what) for d in dims]
    if any(d <= 0 for d in dims):
        raise mpi_error(ArgumentError, "ERR_DIMS", f"{what}: dims {dims} must be positive")
    if periods is None:
        periods = [False] * len(dims)
    elif isinstance(periods, (bool, int)):
        periods = [bool(periods)] * len(dims)
    periods = [bool(p) for p in periods]
    if len(periods) != len(dims):
        raise mpi_error(ArgumentError, "ERR_DIMS", f"{what}: {len(periods)} periods for "
                        f"{len(dims)} dims")
    return dims, periods


def create_cart(comm: Intracomm, dims, periods, reorder) -> Cartcomm:
    """``comm.Create_cart``: collective; ranks beyond ``prod(dims)`` get COMM_NULL."""
    c = comm._inner("Create_cart")
    dims, periods = _grid(dims, periods, f"rank {c.rank}: Create_cart")
    n = int(np.prod(dims)) if dims else 1
    if n > c.size:
        raise mpi_error(ArgumentError, "ERR_DIMS", f"rank {c.rank}: Create_cart: dims "
                        f"{dims} need {n} processes, the communicator has {c.size}")
    inner = c.Split(0 if c.rank < n else UNDEFINED, c.rank)
    return with_topology(Cartcomm, inner, CART, dims=dims, periods=periods)


def cart_map(comm: Intracomm, dims) -> int:
    """``Cart_map``: this rank's rank in the grid (no reordering), or UNDEFINED."""
    n = int(np.prod([as_int(d, "dims", "Cart_map") for d in dims]))
    r = comm.Get_rank()
    return r if r < n else UNDEFINED


@translate_methods
class Cartcomm(Topocomm):
    """A communicator with a Cartesian grid (mpi4py's ``MPI.Cartcomm``)."""

    __slots__ = ()
    _KIND = CART
    _dims = property(lambda self: self._topo().dims)
    _periods = property(lambda self: self._topo().periods)

    def _sources(self) -> list[int]:
        """Neighbours in MPI's order: per dimension, Shift's source then its dest."""
        return [r for d in range(len(self._dims)) for r in self.Shift(d, 1)]

    _destinations = _sources

    def _tags(self) -> tuple[list[int], list[int]]:
        """A message to out-slot k lands in the receiver's slot k ^ 1 (my "+1" neighbour
        sees me as its "-1" one): tagging by the receiver's slot keeps a periodic
        dimension of size 1 or 2, where both neighbours are the same rank, right."""
        n = 2 * len(self._dims)
        return [k ^ 1 for k in range(n)], list(range(n))

    def Get_dim(self) -> int:
        return len(self._dims)

    ndim = property(Get_dim)
    dim = ndim
    dims = property(lambda self: list(self._dims))
    periods = property(lambda self: list(self._periods))
    coords = property(lambda self: self.Get_coords(self.rank))

    def Get_topo(self) -> tuple[list[int], list[bool], list[int]]:
        """``(dims, periods, coords of this rank)``."""
        return list(self._dims), list(self._periods), self.Get_coords(self.rank)

    topo = property(Get_topo)

    def Get_coords(self, rank: int) -> list[int]:
        """Row-major grid coordinates of ``rank``."""
        rank = as_int(rank, "rank", "Get_coords")
        if not 0 <= rank < self.size:
            raise mpi_error(ArgumentError, "ERR_RANK", f"Get_coords: rank={rank} is not in "
                            f"0..{self.size - 1}")
        return [int(x) for x in np.unravel_index(rank, self._dims)] if self._dims else []

    def Get_cart_rank(self, coords) -> int:
        """The rank at ``coords`` (periodic dimensions wrap; others must be in range)."""
        cs = [as_int(x, "coords", "Get_cart_rank") for x in coords]
        if len(cs) != len(self._dims):
            raise mpi_error(ArgumentError, "ERR_DIMS", f"Get_cart_rank: {len(cs)} coords "
                            f"for {len(self._dims)} dims")
        out = []
        for x, d, p in zip(cs, self._dims, self._periods):
            if p:
                x %= d
            elif not 0 <= x < d:
                raise mpi_error(ArgumentError, "ERR_ARG", f"Get_cart_rank: coordinate {x} "
                                f"outside 0..{d - 1} of a non-periodic dimension")
            out.append(x)
        return int(np.ravel_multi_index(out, self._dims)) if out else 0

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        """``(source, dest)``: the ranks ``disp`` steps before and after this one along
        ``direction`` (``PROC_NULL`` off a non-periodic edge)."""
        direction = as_int(direction, "direction", "Shift")
        disp = as_int(disp, "disp", "Shift")
        if not 0 <= direction < len(self._dims):
            raise mpi_error(ArgumentError, "ERR_DIMS", f"Shift: direction={direction} is "
                            f"not in 0..{len(self._dims) - 1}")
        me = self.Get_coords(self.rank)

        def at(step: int) -> int:
            c = list(me)
            c[direction] += step
            d = self._dims[direction]
            if not self._periods[direction] and not 0 <= c[direction] < d:
                return PROC_NULL
            return self.Get_cart_rank(c)
        return at(-disp), at(disp)

    def Sub(self, remain_dims) -> Cartcomm:
        """The sub-grid keeping the dimensions where ``remain_dims`` is true (collective)."""
        keep = [bool(k) for k in remain_dims]
        if len(keep) != len(self._dims):
            raise mpi_error(ArgumentError, "ERR_DIMS", f"Sub: {len(keep)} flags for "
                            f"{len(self._dims)} dims")
        me = self.Get_coords(self.rank)
        color = int(np.ravel_multi_index([x for x, k in zip(me, keep) if not k] or [0],
                                         [d for d, k in zip(self._dims, keep) if not k]
                                         or [1]))
        key = int(np.ravel_multi_index([x for x, k in zip(me, keep) if k] or [0],
                                       [d for d, k in zip(self._dims, keep) if k] or [1]))
        return with_topology(Cartcomm, self._inner("Sub").Split(color, key), CART,
                             dims=[d for d, k in zip(self._dims, keep) if k],
                             periods=[p for p, k in zip(self._periods, keep) if k])
