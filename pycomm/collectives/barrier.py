"""Barrier: no rank leaves before every rank has entered.

Notation: ``p`` ranks, ``α`` latency per message, ``L = ceil(log2 p)``.

**dissemination** (Hensgen, Finkel & Manber 1988, "Two algorithms for barrier
synchronization"; MPICH ``barrier_intra_dissemination``). In round ``k = 0..L-1`` rank
``r`` sends a zero-byte message to ``r + 2^k`` and waits for one from ``r - 2^k`` (mod
``p``). After round ``k`` a rank has heard, directly or transitively, from the ``2^(k+1) - 1``
ranks before it, so after ``L`` rounds from all of them. ``L`` messages per rank, no
payload, no scratch, any ``p``. Time ``L α``.

**binomial** (MPICH ``barrier`` over a binomial gather + broadcast; Thakur et al. 2005).
Zero-byte messages climb the binomial tree rooted at rank 0 (a rank reports once all its
children have), then rank 0 releases everyone down the same tree. ``2(p-1)`` messages in
all, at most ``L + 1`` per rank; ``2L`` rounds on the critical path. Time ``2L α``: twice
dissemination's depth, but a rank only talks to its tree neighbours.
"""

from __future__ import annotations

import numpy as np

from pycomm.topology import binomial_children, binomial_parent, dissemination_peers

__all__ = ["barrier_dissemination", "barrier_binomial"]


def barrier_dissemination(cc) -> None:
    """Dissemination barrier.

    Args:
        cc: the collective context.
    """
    token = np.empty(0, dtype=np.uint8)
    signal = np.empty(0, dtype=np.uint8)
    for send_to, recv_from in dissemination_peers(cc.rank, cc.size):
        cc.sendrecv(token, send_to, signal, recv_from)


def barrier_binomial(cc) -> None:
    """Binomial-tree barrier: gather zero-byte tokens to rank 0, then broadcast them.

    Args:
        cc: the collective context.
    """
    rank, size = cc.rank, cc.size
    children = binomial_children(rank, size, 0)
    parent = binomial_parent(rank, size, 0)
    tokens = [np.empty(0, dtype=np.uint8) for _ in children]
    cc.waitall([cc.irecv(t, child) for t, child in zip(tokens, children, strict=True)])
    token = np.empty(0, dtype=np.uint8)
    if parent is not None:
        cc.send(token, parent)
        cc.recv(token, parent)
    cc.waitall([cc.isend(token, child) for child in reversed(children)])
