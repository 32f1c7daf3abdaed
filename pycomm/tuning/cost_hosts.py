"""Modelled time of the hierarchical algorithms on a communicator that spans hosts.

A hierarchical schedule (:mod:`pycomm.collectives.hierarchical`) runs some steps inside
hosts and some across them; each is priced with the link it crosses, as NCCL's tuner
prices intra- and inter-node steps with separate bandwidths (``graph/tuning.cc``): steps
inside a host with ``shm``'s constants, steps across hosts with those of the measured
link between hosts (the :data:`~pycomm.tuning.cost.NET` entry, written by
:mod:`pycomm.tuning.tune_links`). A flat algorithm on the same communicator is priced with
``NET``'s constants for every step, since nearly every step has a pair of ranks on
different hosts (the slowest link a step crosses sets its time).

Notation: ``n`` bytes, ``H`` hosts, ``L`` the most ranks on a host, ``m`` the fewest,
``P = ceil(n / PIECE_BYTES)`` pieces; ``flat(c, b, p, t)`` the best flat algorithm's
modelled time for collective ``c`` on ``b`` bytes and ``p`` ranks with table ``t``.

* allreduce (pipelined): local = the ring reduce-scatter and all-gather on ``L`` ranks
  (``shm``); cross = ``2(H-1)/H n β_net`` (each host's link carries that, shared by its
  ``m`` senders) ``+ 2(H-1) α_net`` (one piece's messages; the others' overlap the
  transfer); time ``max(local, cross) + (local + cross) / P`` (the pipeline's fill).
* allgather (pipelined): local = the ring all-gather of ``n`` on ``L`` ranks (``shm``);
  cross = ``(H-1)/H n β_net + (H-1) α_net``; combined as the all-reduce's.
* reduce (pipelined): local = the ring reduce-scatter on ``L`` ranks; cross as the
  all-reduce's (its reduce-scatter, then the sub-chunks to the root).
* bcast: ``flat(bcast, n, H, net) + flat(bcast, n, L, shm)``.
* barrier: ``2(L-1) α_shm + flat(barrier, 0, H, net)``.
* 2-D all-reduce on the host grid (``H`` hosts of ``L`` ranks each,
  :mod:`pycomm.collectives.twod`): the row reduce-scatter of ``n`` on ``L`` ranks (``shm``)
  + the column all-reduce of ``n/L`` on ``H`` ranks (``net``; the ``L`` columns share each
  host's link, so priced as one all-reduce of ``n``) + the row all-gather of ``n`` on ``L``
  ranks (``shm``), each at its best inner algorithm; the phases do not overlap.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pycomm.tuning.cost import DEFAULT_TRANSPORT, NET, constants, cost, pricing
from pycomm.tuning.cost_steps import TWOD_COLUMN, TWOD_ROW

__all__ = ["two_level_time", "twod_hosts_time"]

Flat = Callable[[str, int, int, str], float]


def two_level_time(collective: str, nbytes: int, hosts: tuple[int, ...], flat: Flat,
                   piece_bytes: int, oversubscription: float = 1.0) -> float:
    """Modelled seconds of ``collective``'s hierarchical algorithm.

    Args:
        collective: ``allreduce``, ``bcast``, ``reduce``, ``allgather`` or ``barrier``.
        nbytes: bytes of the call (as :func:`pycomm.collectives.choose` defines them).
        hosts: ranks on each host (at least two hosts).
        flat: ``flat(collective, nbytes, ranks, transport)``, the best flat algorithm's
            modelled seconds (0 for one rank).
        piece_bytes: the all-reduce's pipeline piece.
        oversubscription: ranks per core on the busiest host (> 1: the local steps are
            priced as :func:`~pycomm.tuning.cost.cost` prices them then, and every
            cross-host message pays a wake-up per turn of the cores, as a step of
            :mod:`pycomm.tuning.cost_steps` does), as the flat algorithms it is
            weighed against are.

    Raises:
        KeyError: a collective without a hierarchical algorithm.
    """
    big, few, nh = max(hosts), min(hosts), len(hosts)
    shm, net = DEFAULT_TRANSPORT, NET
    if collective in ("allreduce", "allgather", "reduce"):
        twice = 1 if collective == "allgather" else 2   # two passes over the link
        local = 0.0
        if big > 1 and collective != "reduce":
            local += cost("allgather", "ring", nbytes, big, shm, oversubscription)
        if big > 1 and collective != "allgather":
            local += cost("reduce_scatter", "ring", nbytes, big, shm, oversubscription)
        link = pricing(net, nbytes, nh, oversubscription)
        pieces = max(1, math.ceil(nbytes / piece_bytes))
        alpha, beta = link.protocol(nbytes / pieces / few / nh)
        alpha += link.wake * link.turns   # 0 with a core per rank
        cross = twice * (nh - 1) * (nbytes / nh * beta + alpha)
        return max(local, cross) + (local + cross) / pieces
    if collective == "bcast":
        return flat("bcast", nbytes, nh, net) + flat("bcast", nbytes, big, shm)
    if collective == "barrier":
        return 2 * (big - 1) * constants(shm).alpha + flat("barrier", 0, nh, net)
    raise KeyError(collective)


def twod_hosts_time(nbytes: int, hosts: tuple[int, ...], oversubscription: float = 1.0) -> float:
    """Modelled seconds of the 2-D all-reduce on the host grid (one row per host).

    Args:
        nbytes: bytes of the vector.
        hosts: ranks on each host (two or more hosts, the same number of ranks each).
        oversubscription: ranks per core on the busiest host.
    """
    local, nh = hosts[0], len(hosts)

    def best(coll: str, algs: tuple, b: float, q: int, table: str) -> float:
        return 0.0 if q <= 1 else min(cost(coll, a, b, q, table, oversubscription)
                                      for a in algs)
    # the L columns, n/L bytes each, run at once through each host's one link: priced as
    # one all-reduce of n bytes across the hosts (the link's bytes and the messages on the
    # critical path are a column's times L and a column's)
    return (best("reduce_scatter", TWOD_ROW, nbytes, local, DEFAULT_TRANSPORT)
            + best("allreduce", TWOD_COLUMN, nbytes, nh, NET)
            + best("allgatherv", ("ring",), nbytes, local, DEFAULT_TRANSPORT))
