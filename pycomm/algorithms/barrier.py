"""Barrier: no rank leaves before every rank has entered.

Notation: ``p`` ranks, ``α`` latency per message, ``L = ceil(log2 p)``.

**dissemination** (Hensgen, Finkel & Manber 1988, "Two algorithms for barrier
synchronization"; MPICH ``barrier_intra_dissemination``). In round ``k = 0..L-1`` rank
``r`` sends a zero-byte message to ``r + 2^k`` and waits for one from ``r - 2^k`` (mod
``p``). After round ``k`` a rank has heard, directly or transitively, from the ``2^(k+1) - 1``
ranks before it, so after ``L`` rounds from all of them. ``L`` messages per rank, no
payload, no scratch, any ``p``. Time ``L α``.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import dissemination_peers

__all__ = ["barrier_dissemination"]


def barrier_dissemination(cc) -> None:
    """Dissemination barrier.

    Args:
        cc: the collective context.
    """
    token = np.empty(0, dtype=np.uint8)
    signal = np.empty(0, dtype=np.uint8)
    for send_to, recv_from in dissemination_peers(cc.rank, cc.size):
        cc.sendrecv(token, send_to, signal, recv_from)
