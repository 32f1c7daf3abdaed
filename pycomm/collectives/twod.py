"""2-D all-reduce, all-gather and reduce-scatter: the ranks as a grid, each phase a flat
schedule along its rows or columns.

The all-reduce: reduce-scatter along rows, all-reduce along columns, all-gather along
rows. The all-gather and the reduce-scatter: see "All-gather and reduce-scatter" below.

Sources: the 2-D torus all-reduce of Mikami et al. 2018 ("Massively distributed SGD:
ImageNet/ResNet-50 training in a flash", arXiv:1811.05233: reduce-scatter in the
horizontal direction, all-reduce in the vertical, all-gather in the horizontal) and the
2-D ring all-reduce of TPU pods (Ying et al. 2018, "Image classification at supercomputer
scale", arXiv:1811.06992); the schedule is the two-dimensional case of the
mesh/torus all-reduce of Jain & Sabharwal 2010 ("Optimal bucket algorithms for large
MPI collectives on torus interconnects", ICS '10) and of Rabenseifner's reduce-scatter +
all-gather decomposition (Thakur, Rabenseifner & Gropp 2005, 4.3).

**The grid** (:func:`grid_rows`; every rank computes the same one from the same inputs):

* a communicator spanning ``H`` hosts with the same number ``L`` of ranks each, for a
  commutative op: one row per host (its ranks in rank order), so a row's phases run
  inside a host (shared memory) and a column's all-reduce, the only phase that crosses
  hosts, carries ``n/L`` bytes per rank (column ``j``: local rank ``j`` of every host);
* otherwise (one host, uneven hosts, or a non-commutative op): the near-square grid of
  :func:`~pycomm.topology.grid_2d` over rank order, ``rows <= cols``, row ``i``
  the consecutive ranks ``i*cols ..``. A size without such a factorisation (a prime) gets
  the 1-D grid ``1 x p``: the column all-reduce has one rank and the schedule is the row's
  reduce-scatter + all-gather (a ring all-reduce when the model picks the ring inside).

Example, 6 ranks on one host (2 x 3)::

    row 0:  0  1  2     reduce-scatter along rows: rank (i, j) holds row i's sum of chunk j
    row 1:  3  4  5     all-reduce along columns:  chunk j summed over the rows
                        all-gather along rows:     every rank holds every chunk

**Schedule** on an ``R x C`` grid (``n`` bytes; the vector cut into ``C`` chunks that differ
by at most one element, so any count is served; empty chunks send nothing): (1) the
reduce-scatter of the row (``C`` ranks) leaves chunk ``j`` of the row's partial result on
column ``j``; (2) the ``R`` ranks of column ``j`` all-reduce that chunk; (3) the row
all-gathers (ring) the chunks back into every rank's vector. Each phase is a flat schedule
of :mod:`pycomm.collectives` run on a :class:`~pycomm.collectives.hierarchical.View` of the
row or column (same context and tag: within the call every pair of ranks sends and receives
in the same order), its algorithm the cost model's pick for the group's size, bytes and
link (rows: the host's transport; host-grid columns: the link between hosts); the column's
all-reduce never picks the double binary tree (it has no step model, so the pick and the
price of this schedule stay the same computation).

**Cost** (α-β-γ, the inner phases at their best algorithms): with the ring inside, per rank
``2(C-1) + 2(R-1)`` messages and ``2n(C-1)/C + 2(n/C)(R-1)/R = 2n(p-1)/p`` bytes, the
ring's bytes in ``2(R+C-2)`` steps where the ring takes ``2(p-1)``; on the host grid the
link carries ``2(H-1)/H n`` per host, the all-reduce minimum, as the hierarchical
all-reduce's does, but its phases run one after another (the hierarchical schedule
overlaps them in pieces). Time ``RS(n, C) + AR(n/C, R) + AG(n, C)`` (the inner phases'
modelled times; :func:`pycomm.tuning.cost_hosts.twod_hosts_time` on the host grid).

**Selection**: by name only (``algorithm="2d"``, ``PYCOMM_ALGORITHM_ALLREDUCE=2d``). The
model prices it (:func:`pycomm.collectives.model_time`; on the host grid
:func:`pycomm.tuning.cost_hosts.twod_hosts_time`) but the automatic choice leaves it
out: the model puts it below schedules it measures slower than (benchmarks/README.md,
issue 16).

**Operands and results**: rows and columns keep rank order on the near-square grid (row
``i`` is a contiguous rank range, the rows are folded in row order, and the inner phases
are the model's picks among order-keeping algorithms for a non-commutative op), so
non-commutative ops are combined in rank order; the host grid is used for commutative ops
only. Each chunk is all-reduced by its column (bit-identical there) and copied along the
rows, so every rank ends with the same bytes. Scratch: one chunk (``n/C`` bytes).

**All-gather and reduce-scatter** (:func:`allgather_2d`, :func:`reduce_scatter_2d`,
:func:`reduce_scatter_block_2d`): the bucket algorithms of a 2-D mesh (Chan, Heimlich,
Purkayastha & van de Geijn 2007, "Collective communication: theory, practice, and
experience", CCPE 19(13): all-gather along one dimension of the mesh, then the
other; the reduce-scatter the same two phases reversed; Jain & Sabharwal 2010 for the
torus). On the grid above, seen as ``b`` *outer* groups of ``a`` *inner* ranks
(:func:`gather_grid`; ``a * b = p``), an all-gather runs (1) the inner groups' all-gathers
of their ranks' blocks, then (2) the outer groups' all-gathers of the inner groups'
``a``-block segments; a reduce-scatter runs (1) the outer groups' reduce-scatters of the
whole vector into the ``b`` segments, then (2) the inner groups' reduce-scatters of their
segment into the blocks. The phases run on a vector laid out segment by segment, inner
group ``v``'s blocks at ``v*a .. v*a+a-1`` in group order: the caller's buffer where that
is rank order, else a scratch copy (``n`` bytes; the all-gather copies its blocks out
after, the reduce-scatter its send buffer in first). The choice of groups:

* host grid (hosts even; for the reduce-scatter a commutative op): the inner groups are
  the columns, across hosts, the outer ones the hosts. The all-gather sends each rank's
  block once to each other host first and then gathers inside the host; the
  reduce-scatter reduces inside the host first and sends each block's host partial once
  over the link, so a host's link carries ``(H-1)/H`` of the whole vector either way,
  the minimum (the hierarchical all-gather's bytes; a row-first all-gather would carry
  ``L`` times that). Cyclic placement makes the columns consecutive ranks: no copy.
* near-square grid, all-gather or commutative reduce-scatter: the inner groups are the rows
  (consecutive ranks): the layout is rank order, no copy.
* near-square grid, non-commutative reduce-scatter: the inner groups are the columns, so
  the first phase folds each row (consecutive ranks, in order) and the second the rows'
  partials in row order: rank order; the send buffer is copied into column order.

The reduce-scatter serves per-rank counts (``reduce_scatter``: segments and blocks of any
sizes, zeros included) and equal blocks (``reduce_scatter_block``). Cost (α-β-γ, the ring
inside, ``n`` bytes of the whole vector): ``(a-1) + (b-1)`` messages per rank where the
ring takes ``p-1``, and ``n(p-1)/p`` bytes sent (all-gather: ``(a-1)n/p`` in (1), ``(b-1)an/p``
in (2)), plus ``n(p-1)/p γ`` for the reduce-scatter and ``nβ`` where a copy is made; on
the host grid ``(H-1)n/H`` per host over the link. Time ``AG(n/b, a) + AG(n, b)`` and
``RS(n, b) + RS(n/b, a)``, the inner phases at the model's picks for the group's size,
bytes and link (priced on the near-square grid by
:data:`pycomm.tuning.cost.SCHEDULES`). Selection: by name only, as the
all-reduce (``algorithm="2d"``, ``PYCOMM_ALGORITHM_ALLGATHER=2d``,
``PYCOMM_ALGORITHM_REDUCE_SCATTER=2d``, ``PYCOMM_ALGORITHM_REDUCE_SCATTER_BLOCK=2d``).
"""

from __future__ import annotations

import functools
from itertools import accumulate

import numpy as np

from pycomm import config
from pycomm.collectives.allgather import allgatherv_ring
from pycomm.tuning.cost import (DEFAULT_TRANSPORT, TWOD_COLUMN, TWOD_GATHER, TWOD_ROW,
                                model_transport)
from pycomm.collectives.flat import cheapest
from pycomm.collectives.hierarchical import View
from pycomm.collectives.scratch import give, take
from pycomm.topology import chunk_offsets, grid_2d

__all__ = ["TWOD", "grid_rows", "host_grid", "gather_grid", "allreduce_2d", "allgather_2d",
           "reduce_scatter_2d", "reduce_scatter_block_2d"]

TWOD = "2d"
# the inner phases' candidates, the ones the model prices these schedules with: never a
# two-level or 2-D schedule, and for the column all-reduce no double binary tree
_CANDIDATES = {"reduce_scatter": TWOD_ROW, "allreduce": TWOD_COLUMN, "allgather": TWOD_GATHER}


def host_grid(hosts: tuple[int, ...] | None, commutative: bool) -> bool:
    """Whether the 2-D schedule takes one row per host.

    Args:
        hosts: ranks on each host of the communicator (its ``host_layout``), None if
            unknown.
        commutative: whether the op commutes.

    Returns:
        True for two or more hosts with the same number of ranks each and a commutative
        op; else the near-square grid over rank order is used.
    """
    return (commutative and hosts is not None and len(hosts) > 1
            and len(set(hosts)) == 1)


@functools.lru_cache(maxsize=256)
def grid_rows(size: int, hosts: tuple[tuple[int, ...], ...] | None,
              commutative: bool) -> tuple[tuple[int, ...], ...]:
    """The rows of the 2-D grid: each a tuple of ranks, in the row's order.

    Args:
        size: ranks in the communicator (``>= 1``).
        hosts: each host's ranks in rank order, hosts ordered by lowest rank (the
            communicator's ``host_layout.hosts``), or None.
        commutative: whether the op commutes.

    Returns:
        ``R`` rows of ``C`` ranks each, ``R * C == size``; column ``j`` is the ``j``-th rank
        of every row, in row order.
    """
    if hosts is not None and host_grid(tuple(map(len, hosts)), commutative):
        return tuple(tuple(g) for g in hosts)
    rows, cols = grid_2d(size)
    return tuple(tuple(range(i * cols, (i + 1) * cols)) for i in range(rows))


def _links(comm, layout, commutative: bool) -> tuple[str, str, float]:
    """``(row transport, column transport, oversubscription)`` the phases are priced with:
    on the host grid rows stay inside a host and columns cross the link between hosts."""
    name = getattr(comm, "transport_name", None)
    if layout is not None and host_grid(tuple(map(len, layout.hosts)), commutative):
        row_t, col_t = model_transport(name, 1), model_transport(name, 2)
    else:
        row_t = col_t = (DEFAULT_TRANSPORT if comm is None else
                         model_transport(name, None if layout is None else layout.nhosts))
    selection = getattr(comm, "_selection", None)     # (a fake communicator has none)
    over = selection.oversubscription() if selection is not None else 1.0
    return row_t, col_t, over


def _inner(collective: str, nbytes: int, size: int, commutative: bool, transport: str,
           oversubscription: float):
    """The flat algorithm the cost model prices lowest for one phase, made again after
    :func:`pycomm.config.reload`."""
    return _inner_at(collective, nbytes, size, commutative, transport, oversubscription,
                     config.generation)


@functools.lru_cache(maxsize=1024)
def _inner_at(collective, nbytes, size, commutative, transport, oversubscription, generation):
    return cheapest(collective, nbytes, size, commutative, transport, oversubscription,
                    among=_CANDIDATES[collective]).fn


def allreduce_2d(cc, buf: np.ndarray, op) -> None:
    """2-D all-reduce, in place: reduce-scatter along rows, all-reduce along columns,
    all-gather along rows (grid and cost: this module's docstring).

    Args:
        cc: the collective context (``cc.comm.host_layout``, where there is one, may give
            the host grid).
        buf: 1-D C-contiguous array of ``count`` elements (any count; any dtype the op
            serves), the same count and dtype on every rank; this rank's contribution on
            entry, the result on return (bit-identical on every rank).
        op: any associative :class:`pycomm.ops.Op`; a non-commutative one is combined in
            rank order (near-square grid).
    """
    size = cc.size
    if size == 1 or buf.size == 0:
        return
    comm = getattr(cc, "comm", None)
    layout = getattr(comm, "host_layout", None)
    commutative = op.commutative
    rows = grid_rows(size, None if layout is None else layout.hosts, commutative)
    i = next(x for x, row in enumerate(rows) if cc.rank in row)
    row = rows[i]
    j = row.index(cc.rank)
    column = tuple(r[j] for r in rows)
    ncols, nrows = len(row), len(rows)
    row_t, col_t, over = _links(comm, layout, commutative)
    offs = chunk_offsets(buf.size, ncols)
    counts = [offs[c + 1] - offs[c] for c in range(ncols)]
    mine = buf[offs[j]:offs[j + 1]]
    part = mine
    if ncols > 1:
        part = take(counts[j], buf.dtype)
        rs = _inner("reduce_scatter", buf.nbytes, ncols, commutative, row_t, over)
        rs(View(cc, row), buf, part, counts, op)
    if nrows > 1 and part.size:
        ar = _inner("allreduce", part.nbytes, nrows, commutative, col_t, over)
        ar(View(cc, column), part, op)
    if ncols > 1:
        mine[:] = part
        give(part)
        allgatherv_ring(View(cc, row), buf, counts, offs[:-1])


@functools.lru_cache(maxsize=256)
def gather_grid(size: int, hosts: tuple[tuple[int, ...], ...] | None, commutative: bool,
                reduce: bool) -> tuple[tuple[tuple[int, ...], ...], bool, bool]:
    """The groups of the 2-D all-gather (``reduce=False``) or reduce-scatter.

    Args:
        size, hosts, commutative: as :func:`grid_rows` (the all-gather passes True).
        reduce: for the reduce-scatter (a non-commutative op then takes the columns as
            inner groups, so that its first phase folds consecutive ranks).

    Returns:
        ``(groups, in_order, transposed)``: ``groups`` the ``b`` inner groups of ``a``
        ranks each (outer group ``u``: the ``u``-th rank of every inner group, in order);
        ``in_order``: the inner groups, one after another, are ranks ``0..size-1`` (the
        phases run on the caller's buffer); ``transposed``: the inner groups are the
        grid's columns.
    """
    rows = grid_rows(size, hosts, commutative)
    transposed = ((hosts is not None and host_grid(tuple(map(len, hosts)), commutative))
                  or (reduce and not commutative))
    groups = tuple(zip(*rows)) if transposed else rows
    order = [r for g in groups for r in g]
    return groups, order == list(range(size)), transposed


def _groups(cc, commutative: bool, reduce: bool):
    """This rank's view of :func:`gather_grid`: ``(groups, in_order, v, u, inner group,
    outer group, inner transport, outer transport, oversubscription)``."""
    comm = getattr(cc, "comm", None)
    layout = getattr(comm, "host_layout", None)
    groups, in_order, transposed = gather_grid(
        cc.size, None if layout is None else layout.hosts, commutative, reduce)
    v = next(x for x, g in enumerate(groups) if cc.rank in g)
    u = groups[v].index(cc.rank)
    row_t, col_t, over = _links(comm, layout, commutative)
    inner_t, outer_t = (col_t, row_t) if transposed else (row_t, col_t)
    return (groups, in_order, v, u, groups[v], tuple(g[u] for g in groups), inner_t,
            outer_t, over)


def allgather_2d(cc, buf: np.ndarray, count: int) -> None:
    """2-D all-gather, in place: the inner groups' all-gathers, then the outer groups'
    (groups, order and cost: this module's docstring).

    Args:
        cc: the collective context (``cc.comm.host_layout``, where there is one, may give
            the host grid).
        buf: 1-D C-contiguous array of ``size * count`` elements; block ``rank`` filled on
            entry; on return block ``r`` holds rank ``r``'s.
        count: elements per rank's block (the same on every rank).
    """
    size = cc.size
    if size == 1 or count == 0:
        return
    groups, in_order, v, u, inner, outer, inner_t, outer_t, over = _groups(cc, True, False)
    a, b = len(inner), len(groups)
    seg = a * count
    work = buf
    if not in_order:
        work = take(size * count, buf.dtype)
        at = (v * a + u) * count
        work[at:at + count] = buf[cc.rank * count:(cc.rank + 1) * count]
    if a > 1:
        ag = _inner("allgather", seg * buf.itemsize, a, True, inner_t, over)
        ag(View(cc, inner), work[v * seg:(v + 1) * seg], count)
    if b > 1:
        ag = _inner("allgather", work.nbytes, b, True, outer_t, over)
        ag(View(cc, outer), work, seg)
    if not in_order:
        order = np.fromiter((r for g in groups for r in g), dtype=np.intp, count=size)
        buf.reshape(size, count)[order] = work.reshape(size, count)
        give(work)


def reduce_scatter_2d(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, counts, op) -> None:
    """2-D reduce-scatter with per-rank block sizes: the outer groups' reduce-scatters of
    the whole vector, then the inner groups' of their segment (groups, order and cost: this
    module's docstring).

    Args:
        cc: the collective context (``cc.comm.host_layout``, where there is one, may give
            the host grid for a commutative op).
        sendbuf: 1-D C-contiguous array of ``sum(counts)`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``counts[rank]`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        counts: elements of each rank's block (``size`` ints, the same on every rank; zeros
            allowed).
        op: any associative :class:`pycomm.ops.Op`; a non-commutative one is combined in
            rank order (near-square grid).
    """
    size = cc.size
    counts = [int(c) for c in counts]
    if size == 1:
        recvbuf[:] = sendbuf
        return
    if not sum(counts):
        return
    commutative = op.commutative
    groups, in_order, v, u, inner, outer, inner_t, outer_t, over = _groups(
        cc, commutative, True)
    a, b = len(inner), len(groups)
    work = sendbuf
    if not in_order:
        work = take(sendbuf.size, sendbuf.dtype)
        displs = [0, *accumulate(counts)]
        at = 0
        for r in (r for g in groups for r in g):
            work[at:at + counts[r]] = sendbuf[displs[r]:displs[r + 1]]
            at += counts[r]
    part = work
    if b > 1:
        segs = [sum(counts[r] for r in g) for g in groups]
        part = take(segs[v], sendbuf.dtype)
        rs = _inner("reduce_scatter", work.nbytes, b, commutative, outer_t, over)
        rs(View(cc, outer), work, part, segs, op)
        if work is not sendbuf:
            give(work)
    if a > 1:
        rs = _inner("reduce_scatter", part.nbytes, a, commutative, inner_t, over)
        rs(View(cc, inner), part, recvbuf, [counts[r] for r in inner], op)
    else:
        recvbuf[:] = part
    if part is not sendbuf:
        give(part)


def reduce_scatter_block_2d(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """2-D reduce-scatter with equal blocks of ``recvbuf.size`` elements.

    Args as :func:`reduce_scatter_2d` without ``counts``.
    """
    reduce_scatter_2d(cc, sendbuf, recvbuf, [recvbuf.size] * cc.size, op)
