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
    """Return the cost model's predicted seconds for one call.

    For benchmarks, tests and the communicator's ``PYCOMM_DEBUG=1`` log (modelled vs
    measured time).

    Args:
        collective: a key of :data:`REGISTRY`.
        algorithm: one of :func:`algorithms` ``(collective)``.
        nbytes: bytes of the call, as defined in this module's docstring.
        size: number of ranks.
        transport: whose constants to use (``"shm"``, ``"tcp"``; others use ``shm``'s).

    Raises:
        ArgumentError: unknown collective or algorithm.
    """
    table = _table_for(collective)
    if algorithm not in table:
        raise ArgumentError(f"unknown {collective} algorithm {algorithm!r}; valid: "
                            f"{', '.join(table)}")
    return _cost(collective, algorithm, nbytes, size, transport, oversubscription)


def choose(collective: str, nbytes: int, size: int, *, requested: str | None = None,
           commutative: bool = True,
           transport: str = DEFAULT_TRANSPORT,
           oversubscription: float = 1.0,
           hosts: tuple[int, ...] | None = None) -> tuple[str, Callable]:
    """Pick the algorithm for one collective call.

    Every rank must call this with the same arguments so that all ranks run the same
    schedule.

    Rule: a named algorithm wins. The name comes from ``requested`` (the call's
    ``algorithm=``); when that is None, from ``PYCOMM_ALGORITHM_<COLLECTIVE>``. ``"auto"``
    (from either source; ``requested="auto"`` also overrides the environment) or nothing
    means automatic: the algorithm with the least modelled time among those that can
    serve the call (:mod:`pycomm.tuning.cost`; ties go to registry order). On a
    communicator spanning hosts (``hosts``) the ``hierarchical`` algorithms
    (:mod:`pycomm.collectives.hierarchical`) take part, priced step by step with the link
    each step crosses (:mod:`pycomm.tuning.cost_hosts`), when ``transport`` is the
    measured link between hosts (``"net"``, :mod:`pycomm.tuning.tune_links`); without that
    measurement the hierarchical algorithm is taken wherever it can serve the call (its
    link bytes are the minimum; the loopback-TCP row must not price a real link). The
    shipped table has a ``net`` entry (an assumed link, see ``tuned.json``'s
    ``source.net``), so the price is always made unless a table without it is loaded. The
    ``2d`` algorithms (:mod:`pycomm.collectives.twod`) take no part in the automatic
    choice: they run only when named (their model price: :func:`model_time`, and for the
    all-reduce on the host grid :func:`pycomm.tuning.cost_hosts.twod_hosts_time`).

    Args:
        collective: a key of :data:`REGISTRY`.
        nbytes: bytes of the call, as defined in this module's docstring.
        size: number of ranks.
        requested: an algorithm name, ``"auto"``, or None.
        commutative: whether the reduction op is commutative (True for non-reductions).
        transport: the communicator's transport (``"shm"``, ``"tcp"``); selects the
            table of measured constants (unknown names use ``shm``'s).
        hosts: ranks on each host of the communicator (its ``host_layout``), the same on
            every rank; None: unknown (treated as one host).

    Returns:
        ``(name, fn)``; for a pipelined schedule whose segment the model chooses
        (``bcast`` ``pipeline``), ``fn`` has that segment size bound.

    Raises:
        ArgumentError: unknown collective or algorithm name (the message lists the valid
            ones and says where the name came from), or a named algorithm that cannot
            serve this call (non-commutative op, non-power-of-two size): never a silent
            fallback.
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
    spans = hosts is not None and len(hosts) > 1 and hier is not None \
        and hier.unfit_reason(size, commutative) is None
    if spans and transport != NET:
        return hier.name, hier.fn
    # The 2-D schedules run only when named: the model prices the all-reduce below the
    # schedules it measures slower than, on one host (Rabenseifner) and across hosts (recursive
    # doubling, whose steps inside a host the model prices at the link's speed, as every
    # flat step across hosts is): benchmarks/README.md, issue 16.
    best = cheapest(collective, nbytes, size, commutative, transport, oversubscription)
    if spans and two_level_time(collective, nbytes, hosts,
                                _flat_time(commutative, oversubscription), PIECE_BYTES,
                                oversubscription) <= _cost(collective, best.name, nbytes, size,
                                                           transport, oversubscription):
        return hier.name, hier.fn
    return best.name, bound(best, nbytes, size, transport, oversubscription)


def _flat_time(commutative: bool,
               oversubscription: float = 1.0) -> Callable[[str, int, int, str], float]:
    """``f(collective, nbytes, size, transport)``: the best flat algorithm's modelled
    seconds (0 for one rank), for the inner steps of a two-level price."""
    def best(collective: str, nbytes: int, size: int, transport: str) -> float:
        if size <= 1:
            return 0.0
        info = cheapest(collective, nbytes, size, commutative, transport, oversubscription)
        return _cost(collective, info.name, nbytes, size, transport, oversubscription)
    return best


