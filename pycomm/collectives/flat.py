"""The flat algorithms: every schedule that runs over one communicator's point-to-point
calls as they are, with no notion of hosts or grids, and the cost model's pick among them.

The composite schedules (:mod:`pycomm.collectives.hierarchical`,
:mod:`pycomm.collectives.twod`) run flat schedules inside hosts, rows and columns and
pick them here; :mod:`pycomm.collectives` joins both into :data:`REGISTRY
<pycomm.collectives.REGISTRY>` and makes the per-call choice. So the composites import
this module and never the registry that lists them (no import cycle).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from pycomm.collectives.allgather import (allgather_bruck, allgather_recursive_doubling,
                                         allgather_ring, allgatherv_ring)
from pycomm.collectives.allreduce import (allreduce_binomial, allreduce_double_binary_tree,
                                         allreduce_rabenseifner, allreduce_recursive_doubling,
                                         allreduce_ring)
from pycomm.collectives.alltoall import alltoall_bruck, alltoall_pairwise, alltoallv_pairwise
from pycomm.collectives.barrier import barrier_binomial, barrier_dissemination
from pycomm.collectives.bcast import bcast_binomial, bcast_pipeline, bcast_scatter_allgather
from pycomm.tuning.cost import segment_bytes
# the function under another name: pycomm.tuning.cost stays the module
from pycomm.tuning.cost import cost as _cost
from pycomm.collectives.gather import gather_binomial, gather_linear, gatherv_linear
from pycomm.collectives.reduce import reduce_binomial, reduce_rabenseifner
from pycomm.collectives.reduce_scatter import (reduce_scatter_block_pairwise,
                                              reduce_scatter_block_recursive_halving,
                                              reduce_scatter_block_ring,
                                              reduce_scatter_pairwise,
                                              reduce_scatter_recursive_halving,
                                              reduce_scatter_ring)
from pycomm.collectives.scan import exscan_recursive_doubling, scan_recursive_doubling
from pycomm.collectives.scatter import scatter_binomial, scatter_linear, scatterv_linear
from pycomm.topology import is_pof2

__all__ = ["AlgorithmInfo", "FLAT", "bound", "cheapest"]


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


def _reduce_scatter_table(collective: str, ring: Callable, halving: Callable,
                          pairwise: Callable) -> dict[str, AlgorithmInfo]:
    """The three reduce-scatter schedules, per-rank counts or equal blocks alike (no
    schedule modifies ``sendbuf``: :mod:`pycomm.collectives.reduce_scatter`)."""
    return _table(
        collective,
        ("ring", ring, True, False, "ring; commutative ops"),
        ("recursive_halving", halving, False, False,
         "log2 p halving steps, rank order kept"),
        ("pairwise", pairwise, False, False, "p-1 sendrecv steps; exact rank order"),
    )


# Order breaks ties of the cost model (the first listed wins).
FLAT: dict[str, dict[str, AlgorithmInfo]] = {
    "barrier": _table(
        "barrier",
        ("dissemination", barrier_dissemination, False, False,
         "ceil(log2 p) rounds of zero-byte messages (Hensgen, Finkel & Manber 1988)"),
        ("binomial", barrier_binomial, False, False,
         "binomial gather + broadcast of zero-byte messages; 2 ceil(log2 p) rounds"),
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
    ),
    "reduce": _table(
        "reduce",
        ("binomial", reduce_binomial, False, False,
         "binomial tree; rank order kept for non-commutative ops"),
        ("rabenseifner", reduce_rabenseifner, False, False,
         "recursive-halving reduce-scatter + binomial gather; large messages"),
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
    ),
    "allgather": _table(
        "allgather",
        ("recursive_doubling", allgather_recursive_doubling, False, True,
         "log2 p doubling exchanges; power-of-two sizes"),
        ("ring", allgather_ring, False, False, "p-1 neighbour steps; any size"),
        ("bruck", allgather_bruck, False, False,
         "ceil(log2 p) steps for any size (Bruck et al. 1997); scratch n"),
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
    "reduce_scatter": _reduce_scatter_table(
        "reduce_scatter", reduce_scatter_ring, reduce_scatter_recursive_halving,
        reduce_scatter_pairwise),
    "reduce_scatter_block": _reduce_scatter_table(
        "reduce_scatter_block", reduce_scatter_block_ring,
        reduce_scatter_block_recursive_halving, reduce_scatter_block_pairwise),
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


def cheapest(collective: str, nbytes: int, size: int, commutative: bool, transport: str,
             oversubscription: float = 1.0, among=None) -> AlgorithmInfo:
    """The flat algorithm of least modelled time that can serve the call; ``among``: only
    these names (default: every flat algorithm). Ties go to the first listed (in
    ``among``, else in the table).

    Raises:
        KeyError: ``collective`` has no flat algorithms.
        ValueError: none of them can serve the call.
    """
    table = FLAT[collective]
    fit = [table[n] for n in (table if among is None else among)
           if table[n].unfit_reason(size, commutative) is None]
    return min(fit, key=lambda i: _cost(collective, i.name, nbytes, size, transport,
                                        oversubscription))


def bound(info: AlgorithmInfo, nbytes: int, size: int, transport: str,
          oversubscription: float = 1.0) -> Callable:
    """``info.fn``, with the segment size the model priced bound to it where it has one
    (:func:`pycomm.tuning.cost.segment_bytes`), so the schedule runs what was priced."""
    seg = segment_bytes(info.collective, info.name, nbytes, size, transport, oversubscription)
    return info.fn if seg is None else functools.partial(info.fn, segment_bytes=seg)
