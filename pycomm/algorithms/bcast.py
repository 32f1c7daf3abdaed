"""Broadcast: ``buf`` on ``root`` is copied into ``buf`` on every rank.

Notation: ``p`` ranks, ``n`` bytes, ``α`` latency per message, ``β`` seconds per byte,
``L = ceil(log2 p)``.

**binomial** (MPICH ``bcast_intra_binomial``; Thakur et al. 2005, section 3). Ranks are
renumbered so the root is vrank 0 (see :func:`~pycomm.algorithms.topology.binomial_parent`).
A rank receives the whole vector from its parent, then sends it to its children, largest
subtree first. ``L`` rounds; each non-root receives ``n`` bytes once. Time ``L(α + nβ)``;
no scratch. Best for small vectors.

**scatter_allgather** (van de Geijn; MPICH ``bcast_intra_scatter_ring_allgather``; Thakur
et al. 2005, section 3). The vector is cut into ``p`` chunks indexed by vrank. A binomial
scatter gives vrank ``v`` its chunk (each rank receives the contiguous chunk range of its
subtree straight into ``buf``, zero copy), then a ring all-gather circulates the chunks.
Per rank about ``n(p-1)/p`` bytes in each phase. Time ``(L + p - 1)α + 2n(p-1)/p β``; no
scratch. Beats binomial once ``n`` is large enough that bandwidth dominates.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import (binomial_children, binomial_parent,
                                        binomial_subtree_size, chunk_offsets, ring_neighbors)

__all__ = ["bcast_binomial", "bcast_scatter_allgather"]


def bcast_binomial(cc, buf: np.ndarray, root: int) -> None:
    """Binomial-tree broadcast.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array; the data on ``root``, overwritten elsewhere.
        root: the broadcasting rank.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    parent = binomial_parent(rank, size, root)
    if parent is not None:
        cc.recv(buf, parent)
    children = binomial_children(rank, size, root)
    cc.waitall([cc.isend(buf, child) for child in reversed(children)])


def bcast_scatter_allgather(cc, buf: np.ndarray, root: int) -> None:
    """Binomial scatter of ``p`` chunks followed by a ring all-gather.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array; the data on ``root``, overwritten elsewhere.
        root: the broadcasting rank.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    offs = chunk_offsets(buf.size, size)  # chunk v belongs to vrank v
    vrank = (rank - root) % size

    def chunks(first: int, last: int) -> np.ndarray:
        return buf[offs[first]:offs[last]]

    parent = binomial_parent(rank, size, root)
    if parent is not None:
        cc.recv(chunks(vrank, vrank + binomial_subtree_size(rank, size, root)), parent)
    reqs = []
    for child in reversed(binomial_children(rank, size, root)):
        cv = (child - root) % size
        reqs.append(cc.isend(chunks(cv, cv + binomial_subtree_size(child, size, root)), child))
    cc.waitall(reqs)

    left, right = ring_neighbors(rank, size)  # vrank neighbours too: the shift is uniform
    for step in range(size - 1):
        send_c, recv_c = (vrank - step) % size, (vrank - step - 1) % size
        cc.sendrecv(chunks(send_c, send_c + 1), right, chunks(recv_c, recv_c + 1), left)
