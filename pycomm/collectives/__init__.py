"""Collective algorithms: one registry, one cost model, one choice.

Each algorithm is a plain function ``<collective>_<algorithm>(cc, ...)`` over the point-to-
point calls of a collective context ``cc`` (``rank``, ``size``, ``send``, ``recv``, ``isend``,
``irecv``, ``waitall``, ``sendrecv``), in one module per collective. :data:`REGISTRY` maps
collective -> algorithm -> :class:`AlgorithmInfo`: the flat algorithms
(:mod:`pycomm.collectives.flat`) and, after them, the composite ones that run flat ones
inside hosts, rows and columns (``hierarchical``, ``2d``). :func:`choose` picks one per call,
either the one the user named (``algorithm=`` or ``PYCOMM_ALGORITHM_<COLLECTIVE>``) or the
argmin of the α-β-γ model in :mod:`pycomm.tuning.cost`.

Bytes of a call (``nbytes`` below), which must be the same on every rank:

* allreduce, bcast, reduce, scan, exscan: the bytes of the vector;
* allgather, gather, scatter, alltoall, reduce_scatter_block: the bytes of the whole
  ``size * count`` buffer (``size * count * itemsize``);
* reduce_scatter, allgatherv: ``sum(counts) * itemsize`` (counts are known on every rank);
* gatherv, scatterv, alltoallv: 0 (their counts are known on one rank, or differ between
  ranks, so no byte count is the same everywhere; each has a single algorithm);
* barrier: 0.

Constants come from the table of the communicator's transport (``transport=``; see
:mod:`pycomm.tuning.cost`), so every rank of a communicator, which shares one
transport name, makes the same choice.
"""

from __future__ import annotations

from typing import Callable

from pycomm import config
from pycomm.tuning.cost import DEFAULT_TRANSPORT, NET
# the function under another name: pycomm.tuning.cost stays the module
from pycomm.tuning.cost import cost as _cost
from pycomm.tuning.cost_hosts import two_level_time
from pycomm.collectives.flat import FLAT, AlgorithmInfo, _table, bound, cheapest
from pycomm.collectives.hierarchical import (HIERARCHICAL, PIECE_BYTES, allgather_hierarchical,
                                            allreduce_hierarchical, barrier_hierarchical,
                                            bcast_hierarchical, reduce_hierarchical)
from pycomm.collectives.twod import (TWOD, allgather_2d, allreduce_2d, reduce_scatter_2d,
                                     reduce_scatter_block_2d)
from pycomm.errors import ArgumentError

__all__ = ["AlgorithmInfo", "REGISTRY", "AUTO", "algorithms", "choose", "model_time"]

AUTO = "auto"


# The composite schedules: flat ones run inside hosts, rows and columns (they pick them
# from pycomm.collectives.flat). Listed after the flat ones; only named or host-aware
# choices take them (see choose).
_COMPOSITE: dict[str, dict[str, AlgorithmInfo]] = {
    "barrier": _table(
        "barrier",
        (HIERARCHICAL, barrier_hierarchical, False, False,
         "fan-in to each host's leader, dissemination across leaders, fan-out"),
    ),
    "bcast": _table(
        "bcast",
        (HIERARCHICAL, bcast_hierarchical, False, False,
         "across the hosts' leaders, then inside each host (MPICH's SMP-aware bcast)"),
    ),
    "reduce": _table(
        "reduce",
        (HIERARCHICAL, reduce_hierarchical, True, False,
         "inside each host to its leader, then across leaders; commutative ops"),
    ),
    "allreduce": _table(
        "allreduce",
        (TWOD, allreduce_2d, False, False,
         "reduce-scatter along rows, all-reduce along columns, all-gather along rows of "
         "a hosts x local ranks or near-square grid (Mikami et al. 2018; TPU pods' 2-D "
         "ring, Ying et al. 2018)"),
        (HIERARCHICAL, allreduce_hierarchical, True, False,
         "reduce-scatter in each host, every local rank all-reduces its slice across "
         "hosts, all-gather in each host (Horovod, NCCL); commutative ops"),
    ),
    "allgather": _table(
        "allgather",
        (TWOD, allgather_2d, False, False,
         "all-gather along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); across hosts each block crosses the link once"),
        (HIERARCHICAL, allgather_hierarchical, False, False,
         "gather to each host's leader, all-gather across leaders, bcast in each host"),
    ),
    "reduce_scatter": _table(
        "reduce_scatter",
        (TWOD, reduce_scatter_2d, False, False,
         "reduce-scatter along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); rank order kept; sendbuf untouched"),
    ),
    "reduce_scatter_block": _table(
        "reduce_scatter_block",
        (TWOD, reduce_scatter_block_2d, False, False,
         "reduce-scatter along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); rank order kept; sendbuf untouched"),
    ),
}

REGISTRY: dict[str, dict[str, AlgorithmInfo]] = {
    c: {**flat, **_COMPOSITE.get(c, {})} for c, flat in FLAT.items()}


def _table_for(collective: str) -> dict[str, AlgorithmInfo]:
    try:
        return REGISTRY[collective]
    except KeyError:
        raise ArgumentError(f"unknown collective {collective!r}; known: "
                            f"{', '.join(REGISTRY)}") from None


def algorithms(collective: str) -> list[str]:
    """Return the algorithm names available for ``collective`` (e.g. ``"allreduce"``).

    Raises:
        ArgumentError: ``collective`` is not a known collective.
    """
    return list(_table_for(collective))


def model_time(collective: str, algorithm: str, nbytes: int, size: int, *,
               transport: str = DEFAULT_TRANSPORT, oversubscription: float = 1.0) -> float:
    """The cost model's seconds for one call (:func:`pycomm.tuning.cost.cost`), for
    benchmarks, tests and the ``PYCOMM_DEBUG=1`` log; arguments as :func:`choose`'s.

    Raises:
        ArgumentError: unknown collective or algorithm.
    """
    table = _table_for(collective)
    if algorithm not in table:
        raise ArgumentError(f"unknown {collective} algorithm {algorithm!r}; valid: "
                            f"{', '.join(table)}")
    return _cost(collective, algorithm, nbytes, size, transport, oversubscription)


def choose(collective: str, nbytes: int, size: int, *, requested: str | None = None,
           commutative: bool = True, transport: str = DEFAULT_TRANSPORT,
           oversubscription: float = 1.0,
           hosts: tuple[int, ...] | None = None) -> tuple[str, Callable]:
    """Pick the algorithm of one collective call; every rank must pass the same arguments.

    A named algorithm wins: ``requested`` (the call's ``algorithm=``), else
    ``PYCOMM_ALGORITHM_<COLLECTIVE>``; ``"auto"`` (``requested="auto"`` also overrides the
    environment) or nothing means the flat algorithm of least modelled time that can serve
    the call (ties: registry order), as Open MPI's ``coll_tuned`` and NCCL's tuner pick by
    their models. On a communicator spanning hosts (``hosts``) the ``hierarchical``
    algorithm competes, priced per link (:mod:`pycomm.tuning.cost_hosts`) when
    ``transport`` is the link between hosts (``"net"``, which the shipped table has);
    without that entry it is taken wherever it can serve the call (its link bytes are the
    fewest; loopback's figures must not price a real link). The ``2d`` algorithms run only
    when named: the model prices the 2-D all-reduce below schedules it measures slower
    than (benchmarks/README.md, issue 16).

    Args:
        collective: a key of :data:`REGISTRY`.
        nbytes: bytes of the call, as this module's docstring defines them.
        size: number of ranks.
        requested: an algorithm name, ``"auto"``, or None.
        commutative: whether the reduction op is commutative (True for non-reductions).
        transport: the cost table entry (:func:`pycomm.tuning.cost.model_transport`).
        oversubscription: ranks per core on the busiest host.
        hosts: ranks on each host (the communicator's ``host_layout``); None: one host.

    Returns:
        ``(name, fn)``; for the chain broadcast ``fn`` has the model's segment bound.

    Raises:
        ArgumentError: unknown collective or algorithm name (listing the valid ones and
            where the name came from), or a named algorithm that cannot serve this call
            (non-commutative op, non-power-of-two size): never a silent fallback.
    """
    table = _table_for(collective)
    source = "algorithm="
    if requested is None:
        requested = config.algorithm_override(collective)
        source = f"environment variable {config.ALGORITHM_PREFIX}{collective.upper()}"
    if requested is not None and str(requested).strip().lower() != AUTO:
        name = str(requested).strip().lower()
        info = table.get(name)
        if info is None:
            raise ArgumentError(f"unknown {collective} algorithm {requested!r} (from "
                                f"{source}); valid: {AUTO}, {', '.join(table)}")
        reason = info.unfit_reason(size, commutative)
        if reason is not None:
            fit = [n for n, i in table.items() if i.unfit_reason(size, commutative) is None]
            raise ArgumentError(f"{collective} algorithm {name!r} (from {source}) cannot "
                                f"serve this call: {reason}; usable here: "
                                f"{AUTO}, {', '.join(fit)}")
        return info.name, bound(info, nbytes, size, transport, oversubscription)
    hier = table.get(HIERARCHICAL)
    spans = (hosts is not None and len(hosts) > 1 and hier is not None
             and hier.unfit_reason(size, commutative) is None)
    if spans and transport != NET:
        return hier.name, hier.fn
    best = cheapest(collective, nbytes, size, commutative, transport, oversubscription)
    if spans:
        def flat(coll: str, b: int, ranks: int, link: str) -> float:
            if ranks <= 1:
                return 0.0
            info = cheapest(coll, b, ranks, commutative, link, oversubscription)
            return _cost(coll, info.name, b, ranks, link, oversubscription)
        if two_level_time(collective, nbytes, hosts, flat, PIECE_BYTES, oversubscription) \
                <= _cost(collective, best.name, nbytes, size, transport, oversubscription):
            return hier.name, hier.fn
    return best.name, bound(best, nbytes, size, transport, oversubscription)
