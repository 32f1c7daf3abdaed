"""Collective algorithms: one registry, one cost model, one choice.

Each algorithm is a plain function ``<collective>_<algorithm>(cc, ...)`` over the point-to-
point calls of a collective context ``cc`` (``rank``, ``size``, ``send``, ``recv``, ``isend``,
``irecv``, ``waitall``, ``sendrecv``), in one module per collective. :data:`REGISTRY` maps
collective -> algorithm -> :class:`AlgorithmInfo`; :func:`choose` picks one per call,
either the one the user named (``algorithm=`` or ``PYCOMM_ALGORITHM_<COLLECTIVE>``) or the
argmin of the α-β-γ model in :mod:`pycomm.collectives.cost`.

Bytes of a call (``nbytes`` below), which must be the same on every rank:

* allreduce, bcast, reduce, scan, exscan: the bytes of the vector;
* allgather, gather, scatter, alltoall, reduce_scatter_block: the bytes of the whole
  ``size * count`` buffer (``size * count * itemsize``);
* reduce_scatter, allgatherv: ``sum(counts) * itemsize`` (counts are known on every rank);
* gatherv, scatterv, alltoallv: 0 (their counts are known on one rank, or differ between
  ranks, so no byte count is the same everywhere; each has a single algorithm);
* barrier: 0.

Constants come from the table of the communicator's transport (``transport=``; see
:mod:`pycomm.collectives.cost`), so every rank of a communicator, which shares one
transport name, makes the same choice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from pycomm import config
from pycomm.collectives.allgather import (allgather_bruck, allgather_recursive_doubling,
                                         allgather_ring, allgatherv_ring)
from pycomm.collectives.allreduce import (allreduce_binomial, allreduce_double_binary_tree,
                                         allreduce_rabenseifner, allreduce_recursive_doubling,
                                         allreduce_ring)
from pycomm.collectives.alltoall import alltoall_bruck, alltoall_pairwise, alltoallv_pairwise
from pycomm.collectives.barrier import barrier_binomial, barrier_dissemination
from pycomm.collectives.bcast import bcast_binomial, bcast_pipeline, bcast_scatter_allgather
from pycomm.collectives.cost import DEFAULT_TRANSPORT, NET, segment_bytes
# the function under another name: pycomm.collectives.cost stays the module
from pycomm.collectives.cost import cost as _cost
from pycomm.collectives.cost_hosts import two_level_time
from pycomm.collectives.gather import gather_binomial, gather_linear, gatherv_linear
from pycomm.collectives.hierarchical import (HIERARCHICAL, PIECE_BYTES, allgather_hierarchical,
                                            allreduce_hierarchical, barrier_hierarchical,
                                            bcast_hierarchical, reduce_hierarchical)
from pycomm.collectives.reduce import reduce_binomial, reduce_rabenseifner
from pycomm.collectives.reduce_scatter import (reduce_scatter_block_pairwise,
                                              reduce_scatter_block_recursive_halving,
                                              reduce_scatter_block_ring,
                                              reduce_scatter_pairwise,
                                              reduce_scatter_recursive_halving,
                                              reduce_scatter_ring)
from pycomm.collectives.scan import exscan_recursive_doubling, scan_recursive_doubling
from pycomm.collectives.scatter import scatter_binomial, scatter_linear, scatterv_linear
from pycomm.collectives.topology import is_pof2
from pycomm.collectives.twod import (TWOD, allgather_2d, allreduce_2d, reduce_scatter_2d,
                                     reduce_scatter_block_2d)
from pycomm.errors import ArgumentError

__all__ = ["AlgorithmInfo", "REGISTRY", "AUTO", "algorithms", "choose", "model_time"]

AUTO = "auto"


@dataclass(frozen=True)
class AlgorithmInfo:
    """What the registry knows about one algorithm.

    Attributes:
        collective: e.g. ``"allreduce"``.
        name: e.g. ``"ring"``; the function is ``<collective>_<name>``.
        fn: the schedule, called as documented in its module.
        commutative_only: serves commutative ops only (reorders operands).
        pof2_only: needs a power-of-two number of ranks.
        doc: one line for ``pycomm.algorithms()`` listings and error messages.
    """

    collective: str
    name: str
    fn: Callable
    commutative_only: bool
    pof2_only: bool
    doc: str

    def unfit_reason(self, size: int, commutative: bool) -> str | None:
        """Why this algorithm cannot serve a call, or None when it can."""
        if self.commutative_only and not commutative:
            return "it needs a commutative op"
        if self.pof2_only and not is_pof2(size):
            return f"it needs a power-of-two number of ranks (size={size})"
        return None


def _table(collective: str, *entries: tuple) -> dict[str, AlgorithmInfo]:
    return {name: AlgorithmInfo(collective, name, fn, comm_only, pof2, doc)
            for name, fn, comm_only, pof2, doc in entries}


# Registry order breaks ties of the cost model (the first listed wins).
REGISTRY: dict[str, dict[str, AlgorithmInfo]] = {
    "barrier": _table(
        "barrier",
        ("dissemination", barrier_dissemination, False, False,
         "ceil(log2 p) rounds of zero-byte messages (Hensgen, Finkel & Manber 1988)"),
        ("binomial", barrier_binomial, False, False,
         "binomial gather + broadcast of zero-byte messages; 2 ceil(log2 p) rounds"),
        (HIERARCHICAL, barrier_hierarchical, False, False,
         "fan-in to each host's leader, dissemination across leaders, fan-out"),
    ),
    "bcast": _table(
        "bcast",
        ("binomial", bcast_binomial, False, False,
         "binomial tree, whole vector per edge; small messages"),
        ("scatter_allgather", bcast_scatter_allgather, False, False,
         "binomial scatter + ring allgather (van de Geijn); large messages"),
        ("pipeline", bcast_pipeline, False, False,
         "segmented chain (NCCL ring broadcast); large messages; segment chosen by the "
         "model per size unless PYCOMM_SEGMENT_BYTES is set"),
        (HIERARCHICAL, bcast_hierarchical, False, False,
         "across the hosts' leaders, then inside each host (MPICH's SMP-aware bcast)"),
    ),
    "reduce": _table(
        "reduce",
        ("binomial", reduce_binomial, False, False,
         "binomial tree; rank order kept for non-commutative ops"),
        ("rabenseifner", reduce_rabenseifner, False, False,
         "recursive-halving reduce-scatter + binomial gather; large messages"),
        (HIERARCHICAL, reduce_hierarchical, True, False,
         "inside each host to its leader, then across leaders; commutative ops"),
    ),
    "allreduce": _table(
        "allreduce",
        ("recursive_doubling", allreduce_recursive_doubling, False, False,
         "log2 p whole-vector exchanges; small messages"),
        ("rabenseifner", allreduce_rabenseifner, False, False,
         "recursive halving reduce-scatter + doubling allgather; medium messages"),
        ("ring", allreduce_ring, True, False,
         "ring reduce-scatter + allgather, pipelined in segments of "
         "PYCOMM_RING_SEGMENT_BYTES; large messages, commutative ops"),
        ("binomial", allreduce_binomial, False, False,
         "binomial reduce to rank 0 + binomial broadcast"),
        ("double_binary_tree", allreduce_double_binary_tree, False, False,
         "NCCL's two complementary binary trees, half the data each, segmented"),
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
        ("recursive_doubling", allgather_recursive_doubling, False, True,
         "log2 p doubling exchanges; power-of-two sizes"),
        ("ring", allgather_ring, False, False, "p-1 neighbour steps; any size"),
        ("bruck", allgather_bruck, False, False,
         "ceil(log2 p) steps for any size (Bruck et al. 1997); scratch n"),
        (TWOD, allgather_2d, False, False,
         "all-gather along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); across hosts each block crosses the link once"),
        (HIERARCHICAL, allgather_hierarchical, False, False,
         "gather to each host's leader, all-gather across leaders, bcast in each host"),
    ),
    "allgatherv": _table(
        "allgatherv",
        ("ring", allgatherv_ring, False, False, "p-1 neighbour steps, per-rank counts"),
    ),
    "gather": _table(
        "gather",
        ("binomial", gather_binomial, False, False, "binomial tree; many ranks, small blocks"),
        ("linear", gather_linear, False, False, "root receives from every rank; no scratch"),
    ),
    "gatherv": _table(
        "gatherv",
        ("linear", gatherv_linear, False, False,
         "root receives every rank's block; counts significant at the root only"),
    ),
    "scatter": _table(
        "scatter",
        ("binomial", scatter_binomial, False, False, "binomial tree; many ranks, small blocks"),
        ("linear", scatter_linear, False, False, "root sends to every rank; no scratch"),
    ),
    "scatterv": _table(
        "scatterv",
        ("linear", scatterv_linear, False, False,
         "root sends every rank its block; counts significant at the root only"),
    ),
    "alltoall": _table(
        "alltoall",
        ("pairwise", alltoall_pairwise, False, False, "p-1 sendrecv steps to r+k / from r-k"),
        ("bruck", alltoall_bruck, False, False,
         "ceil(log2 p) steps of n/2 bytes (Bruck et al. 1997); small blocks, many ranks"),
    ),
    "alltoallv": _table(
        "alltoallv",
        ("pairwise", alltoallv_pairwise, False, False,
         "p-1 sendrecv steps with per-peer counts; 0-byte messages where counts are 0"),
    ),
    "reduce_scatter": _table(
        "reduce_scatter",
        ("ring", reduce_scatter_ring, True, False,
         "ring; commutative ops; overwrites sendbuf"),
        ("recursive_halving", reduce_scatter_recursive_halving, False, False,
         "log2 p halving steps, rank order kept; may overwrite sendbuf"),
        ("pairwise", reduce_scatter_pairwise, False, False,
         "p-1 sendrecv steps; exact rank order; sendbuf untouched"),
        (TWOD, reduce_scatter_2d, False, False,
         "reduce-scatter along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); rank order kept; sendbuf untouched"),
    ),
    "reduce_scatter_block": _table(
        "reduce_scatter_block",
        ("ring", reduce_scatter_block_ring, True, False,
         "ring; commutative ops; overwrites sendbuf"),
        ("recursive_halving", reduce_scatter_block_recursive_halving, False, False,
         "log2 p halving steps, rank order kept; may overwrite sendbuf"),
        ("pairwise", reduce_scatter_block_pairwise, False, False,
         "p-1 sendrecv steps; exact rank order; sendbuf untouched"),
        (TWOD, reduce_scatter_block_2d, False, False,
         "reduce-scatter along one grid dimension, then the other, on the 2-D grid of the "
         "all-reduce (Chan et al. 2007); rank order kept; sendbuf untouched"),
    ),
    "scan": _table(
        "scan",
        ("recursive_doubling", scan_recursive_doubling, False, False,
         "ceil(log2 p) exchanges; rank order kept"),
    ),
    "exscan": _table(
        "exscan",
        ("recursive_doubling", exscan_recursive_doubling, False, False,
         "ceil(log2 p) exchanges; rank order kept; rank 0's recvbuf untouched"),
    ),
}


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
    serve the call (:mod:`pycomm.collectives.cost`; ties go to registry order). On a
    communicator spanning hosts (``hosts``) the ``hierarchical`` algorithms
    (:mod:`pycomm.collectives.hierarchical`) take part, priced step by step with the link
    each step crosses (:mod:`pycomm.collectives.cost_hosts`), when ``transport`` is the
    measured link between hosts (``"net"``, :mod:`pycomm.tune_links`); without that
    measurement the hierarchical algorithm is taken wherever it can serve the call (its
    link bytes are the minimum; the loopback-TCP row must not price a real link). The
    shipped table has a ``net`` entry (an assumed link, see ``tuned.json``'s
    ``source.net``), so the price is always made unless a table without it is loaded. The
    ``2d`` all-reduce (:mod:`pycomm.collectives.twod`) takes no part in the automatic
    choice: it runs only when named (its model price: :func:`model_time`, and on the host grid
    :func:`pycomm.collectives.cost_hosts.twod_hosts_time`).

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
        return info.name, _bound(info, nbytes, size, transport, oversubscription)
    hier = table.get(HIERARCHICAL)
    spans = hosts is not None and len(hosts) > 1 and hier is not None \
        and hier.unfit_reason(size, commutative) is None
    if spans and transport != NET:
        return hier.name, hier.fn
    # The 2-D all-reduce runs only when named: the model prices it below the schedules it
    # measures slower than, on one host (Rabenseifner) and across hosts (recursive
    # doubling, whose steps inside a host the model prices at the link's speed, as every
    # flat step across hosts is): benchmarks/README.md, issue 16.
    candidates = [i for i in table.values()
                  if i.name not in (HIERARCHICAL, TWOD)
                  and i.unfit_reason(size, commutative) is None]
    price = {i.name: _cost(collective, i.name, nbytes, size, transport, oversubscription)
             for i in candidates}
    best = min(candidates, key=lambda i: price[i.name])
    if spans and two_level_time(collective, nbytes, hosts,
                                _flat_time(commutative, oversubscription), PIECE_BYTES,
                                oversubscription) <= price[best.name]:
        return hier.name, hier.fn
    return best.name, _bound(best, nbytes, size, transport, oversubscription)


def _flat_time(commutative: bool,
               oversubscription: float = 1.0) -> Callable[[str, int, int, str], float]:
    """``f(collective, nbytes, size, transport)``: the best flat algorithm's modelled
    seconds (0 for one rank), for the inner steps of a two-level price."""
    def best(collective: str, nbytes: int, size: int, transport: str) -> float:
        if size <= 1:
            return 0.0
        return min(_cost(collective, i.name, nbytes, size, transport, oversubscription)
                   for i in REGISTRY[collective].values()
                   if i.name not in (HIERARCHICAL, TWOD)
                   and i.unfit_reason(size, commutative) is None)
    return best


def _bound(info: AlgorithmInfo, nbytes: int, size: int, transport: str,
           oversubscription: float) -> Callable:
    """``info.fn``, with the segment size the model priced bound to it where it has one
    (:func:`pycomm.collectives.cost.segment_bytes`), so the schedule runs what was priced."""
    seg = segment_bytes(info.collective, info.name, nbytes, size, transport, oversubscription)
    return info.fn if seg is None else functools.partial(info.fn, segment_bytes=seg)
