"""Distributed-array datatypes: ``Datatype.Create_darray`` (MPI-4.0 section 5.1.4).

The type selects, from a global array of ``gsizes`` items of the old type laid out in
``order``, the items process ``rank`` owns when the array is distributed over a grid of
``psizes`` processes (the grid is row-major, whatever ``order``). Along dimension i,
coordinate c of the grid owns: for ``DISTRIBUTE_BLOCK`` with block b (default
``ceil(gsize / psize)``) the indices ``c*b .. min((c+1)*b, gsize) - 1``; for
``DISTRIBUTE_CYCLIC`` with block b (default 1) the indices whose block ``j // b`` is
``c`` modulo ``psize``; for ``DISTRIBUTE_NONE`` (``psize`` 1) all of them. The owned items
are taken in the local array's own ``order`` (C: last index fastest), so the type is an
indexed block of single items at their global positions, resized to the whole global
array (lower bound 0, extent ``prod(gsizes)`` old extents), as MPI defines it.
"""

from __future__ import annotations

import numpy as np

from pycomm.errors import ArgumentError

from .exceptions import mpi_error

__all__ = ["create_darray"]

BLOCK, CYCLIC, NONE, DFLT_DARG = 121, 122, 123, -49767
ORDER_C, ORDER_F = 0, 1


def _owned(g: int, dist: int, darg: int, p: int, c: int, where: str) -> np.ndarray:
    """The global indices of dimension size ``g`` that grid coordinate ``c`` owns."""
    if dist == NONE:
        if p != 1:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: DISTRIBUTE_NONE needs a "
                            f"process grid of 1 along that dimension, got {p}")
        return np.arange(g)
    if dist == BLOCK:
        b = -(-g // p) if darg == DFLT_DARG else darg
        if b <= 0 or b * p < g:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: block {b} x {p} processes "
                            f"do not cover {g} items")
        return np.arange(c * b, min((c + 1) * b, g))
    if dist == CYCLIC:
        b = 1 if darg == DFLT_DARG else darg
        if b <= 0:
            raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: cyclic block {b}")
        j = np.arange(g)
        return j[(j // b) % p == c]
    raise mpi_error(ArgumentError, "ERR_ARG", f"{where}: distribution {dist} is not "
                    "DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC or DISTRIBUTE_NONE")


def create_darray(self, size: int, rank: int, gsizes, distribs, dargs, psizes,
                  order: int = ORDER_C):
    """``oldtype.Create_darray(size, rank, gsizes, distribs, dargs, psizes, order)``.

    Raises:
        MPI.Exception (ERR_ARG): lists of different lengths, ``prod(psizes) != size``, a
            rank outside ``0..size-1``, or a distribution that does not cover a dimension.
    """
    from .msgspec import as_int
    w = "Datatype.Create_darray"
    size, rank = as_int(size, "size", w), as_int(rank, "rank", w)
    gs, ds, da, ps = ([as_int(x, name, w) for x in v] for name, v in
                      (("gsizes", gsizes), ("distribs", distribs), ("dargs", dargs),
                       ("psizes", psizes)))
    if not len(gs) == len(ds) == len(da) == len(ps):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: gsizes, distribs, dargs and "
                        "psizes must have one entry per dimension")
    if int(np.prod(ps)) != size or not 0 <= rank < size:
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: rank {rank} of {size} processes "
                        f"on a grid {ps}")
    if order not in (ORDER_C, ORDER_F):
        raise mpi_error(ArgumentError, "ERR_ARG", f"{w}: order {order} is not ORDER_C or "
                        "ORDER_F")
    coords = np.unravel_index(rank, ps) if ps else ()
    owned = [_owned(g, d, a, p, int(c), w) for g, d, a, p, c in zip(gs, ds, da, ps, coords)]
    f = "C" if order == ORDER_C else "F"
    if owned:
        grid = np.meshgrid(*owned, indexing="ij")
        disps = np.ravel_multi_index(grid, gs, order=f).ravel(order=f)
    else:
        disps = np.zeros(1, np.int64)           # a 0-d array: its one item
    items = self.Create_indexed_block(1, disps.astype(np.int64))
    out = items.Create_resized(0, int(np.prod(gs)) * self.extent)
    items.Free()
    return out
