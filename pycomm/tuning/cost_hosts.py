"""Modelled time of the hierarchical and 2-D schedules on a communicator spanning hosts.

Each step is priced with the link it crosses, as NCCL's tuner prices intra- and
inter-node steps with separate bandwidths (``src/graph/tuning.cc``): steps inside a host
with ``shm``'s constants, steps across hosts with the measured link's (the
:data:`~pycomm.tuning.cost.NET` entry, ``pycomm/tuning/tune_links.py``). A flat
schedule on the same communicator is priced with ``net``'s constants at every step
(nearly every step has a pair of ranks on different hosts). ``n`` bytes, ``H`` hosts,
``L`` the most ranks on a host, ``m`` the fewest, ``P = ceil(n / piece)`` pipeline pieces
(:mod:`pycomm.collectives.hierarchical`):

* allreduce, reduce, allgather (pipelined): local = the ring reduce-scatter (not for the
  all-gather) and all-gather (not for the reduce) of ``n`` on ``L`` ranks; cross =
  ``k (H-1) (n/H β_net + α_net)`` with ``k = 2`` passes over the link (1 for the
  all-gather), each piece's slice of ``n / (P m H)`` bytes priced by its protocol; time
  ``max(local, cross) + (local + cross) / P`` (the pipeline's fill and drain).
* bcast: the best flat bcast across ``H`` leaders (``net``) + inside a host of ``L`` (``shm``).
* barrier: ``2(L-1) α_shm`` + the best flat barrier across ``H`` leaders (``net``).
* 2-D all-reduce on the host grid: the row reduce-scatter of ``n`` on ``L`` ranks
  (``shm``) + the column all-reduce across ``H`` (``net``; the ``L`` columns share each
  host's link, so priced as one all-reduce of ``n``) + the row all-gather (``shm``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pycomm.tuning.cost import (DEFAULT_TRANSPORT as SHM, NET, TWOD_COLUMN, TWOD_ROW,
                                constants, cost, pricing)

__all__ = ["two_level_time", "twod_hosts_time"]


def two_level_time(collective: str, nbytes: int, hosts: tuple[int, ...],
                   flat: Callable[[str, int, int, str], float], piece_bytes: int,
                   oversubscription: float = 1.0) -> float:
    """Modelled seconds of ``collective``'s hierarchical schedule (module docstring).

    Args:
        collective: ``allreduce``, ``reduce``, ``allgather``, ``bcast`` or ``barrier``.
        nbytes: bytes of the call (as :func:`pycomm.collectives.choose` counts them).
        hosts: ranks on each host (two hosts or more).
        flat: ``flat(collective, nbytes, ranks, transport)``: the best flat schedule's
            modelled seconds (0 for one rank).
        piece_bytes: the pipeline's piece.
        oversubscription: ranks per core on the busiest host, as for the flat schedules.

    Raises:
        KeyError: a collective without a hierarchical schedule.
    """
    most, fewest, nh = max(hosts), min(hosts), len(hosts)
    if collective in ("allreduce", "reduce", "allgather"):
        local = 0.0
        if most > 1 and collective != "reduce":
            local += cost("allgather", "ring", nbytes, most, SHM, oversubscription)
        if most > 1 and collective != "allgather":
            local += cost("reduce_scatter", "ring", nbytes, most, SHM, oversubscription)
        link = pricing(NET, nbytes, nh, oversubscription)
        pieces = max(1, math.ceil(nbytes / piece_bytes))
        alpha, beta = link.protocol(nbytes / pieces / fewest / nh)
        passes = 1 if collective == "allgather" else 2
        cross = passes * (nh - 1) * (nbytes / nh * beta + alpha + link.wake * link.turns)
        return max(local, cross) + (local + cross) / pieces
    if collective == "bcast":
        return flat("bcast", nbytes, nh, NET) + flat("bcast", nbytes, most, SHM)
    if collective == "barrier":
        return 2 * (most - 1) * constants(SHM).alpha + flat("barrier", 0, nh, NET)
    raise KeyError(collective)


def twod_hosts_time(nbytes: int, hosts: tuple[int, ...], oversubscription: float = 1.0) -> float:
    """Modelled seconds of the 2-D all-reduce on the host grid (one row per host, two
    hosts or more of the same number of ranks; module docstring)."""
    local, nh = hosts[0], len(hosts)

    def best(collective, algorithms, ranks, transport):
        return 0.0 if ranks <= 1 else min(cost(collective, a, nbytes, ranks, transport,
                                               oversubscription) for a in algorithms)
    return (best("reduce_scatter", TWOD_ROW, local, SHM) + best("allreduce", TWOD_COLUMN, nh, NET)
            + best("allgatherv", ("ring",), local, SHM))
