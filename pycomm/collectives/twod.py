"""2-D all-reduce: the ranks as a grid, reduce-scatter along rows, all-reduce along columns,
all-gather along rows.

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
  :func:`~pycomm.collectives.topology.grid_2d` over rank order, ``rows <= cols``, row ``i``
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
modelled times; :func:`pycomm.collectives.cost_hosts.twod_hosts_time` on the host grid).

**Selection**: by name only (``algorithm="2d"``, ``PYCOMM_ALGORITHM_ALLREDUCE=2d``). The
model prices it (:func:`pycomm.collectives.model_time`; on the host grid
:func:`pycomm.collectives.cost_hosts.twod_hosts_time`) but the automatic choice leaves it
out: the model puts it below schedules it measures slower than (benchmarks/README.md,
issue 16).

**Operands and results**: rows and columns keep rank order on the near-square grid (row
``i`` is a contiguous rank range, the rows are folded in row order, and the inner phases
are the model's picks among order-keeping algorithms for a non-commutative op), so
non-commutative ops are combined in rank order; the host grid is used for commutative ops
only. Each chunk is all-reduced by its column (bit-identical there) and copied along the
rows, so every rank ends with the same bytes. Scratch: one chunk (``n/C`` bytes).
"""

from __future__ import annotations

import functools

import numpy as np

from pycomm import config
from pycomm.collectives.allgather import allgatherv_ring
from pycomm.collectives.cost import DEFAULT_TRANSPORT, cost, model_transport
from pycomm.collectives.cost_steps import TWOD_COLUMN, TWOD_ROW
from pycomm.collectives.hierarchical import View
from pycomm.collectives.scratch import give, take
from pycomm.collectives.topology import chunk_offsets, grid_2d

__all__ = ["TWOD", "grid_rows", "host_grid", "allreduce_2d"]

TWOD = "2d"
# the inner phases' candidates, the ones the model prices this schedule with: never a
# two-level or 2-D schedule, and for the column all-reduce no double binary tree
_CANDIDATES = {"reduce_scatter": TWOD_ROW, "allreduce": TWOD_COLUMN}


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


def _inner(collective: str, nbytes: int, size: int, commutative: bool, transport: str,
           oversubscription: float):
    """The flat algorithm the cost model prices lowest for one phase, made again after
    :func:`pycomm.config.reload`."""
    return _inner_at(collective, nbytes, size, commutative, transport, oversubscription,
                     config.generation)


@functools.lru_cache(maxsize=1024)
def _inner_at(collective, nbytes, size, commutative, transport, oversubscription, generation):
    from pycomm.collectives import REGISTRY      # the registry imports this module
    table = REGISTRY[collective]
    fit = [table[a] for a in _CANDIDATES[collective]
           if table[a].unfit_reason(size, commutative) is None]
    return min(fit, key=lambda i: cost(collective, i.name, nbytes, size, transport,
                                       oversubscription)).fn


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
    name = getattr(comm, "transport_name", None)
    if layout is not None and host_grid(tuple(map(len, layout.hosts)), commutative):
        row_t, col_t = model_transport(name, 1), model_transport(name, 2)
    else:
        row_t = col_t = (DEFAULT_TRANSPORT if comm is None else
                         model_transport(name, None if layout is None else layout.nhosts))
    over = comm._oversubscription() if hasattr(comm, "_oversubscription") else 1.0
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
