"""Gather: ``root`` collects every rank's block of ``count`` elements, in rank order.

``sendbuf`` has ``count`` elements on every rank; ``recvbuf`` (``size * count`` elements) is
used on ``root`` only and may be None elsewhere. For ``IN_PLACE`` at the root the
communicator passes ``sendbuf = recvbuf[root*count:(root+1)*count]``; the self-copy is
harmless. Notation: ``p`` ranks, ``n = p * count * itemsize`` bytes gathered, ``α`` latency
per message, ``β`` seconds per byte, ``L = ceil(log2 p)``.

**linear** (MPICH ``gather_intra_linear``-style flat tree). The root posts one receive per
rank straight into ``recvbuf`` and copies its own block; every other rank sends once.
Time at the root ``(p-1)α + n(p-1)/p β``; no scratch. Fine for few ranks or big blocks.

**binomial** (MPICH ``gather_intra_binomial``; Thakur et al. 2005, section 3). Vrank ``v``
gathers the blocks of its subtree, the contiguous vranks ``[v, v + lowbit(v))``, into a
scratch buffer in vrank order (children's ranges land at offsets ``mask * count``) and
sends it to its parent in one message. ``L`` rounds. Time ``L α + n(p-1)/p β``; scratch up to
``n/2`` on inner ranks, and ``n`` on the root when ``root != 0`` (vrank order is rotated
back into rank order with one copy).

**gatherv linear**: the flat tree with per-rank counts. ``counts`` and ``displs`` are
significant at the root only (MPI's rule), so every other rank sends its whole
``sendbuf`` (0 bytes when empty) and the root posts one receive per rank into
``recvbuf[displs[r]:displs[r] + counts[r]]``; a count that differs from the sender's size
is a truncation error from the p2p layer. No binomial variant: inner ranks of a tree would
need the counts of their subtree, which MPI does not give them without an extra exchange.
"""

from __future__ import annotations

import numpy as np

from pycomm.topology import (binomial_children, binomial_parent,
                                        binomial_subtree_size)

__all__ = ["gather_linear", "gather_binomial", "gatherv_linear"]


def gather_linear(cc, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
    """Flat-tree gather.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``count`` elements; not modified.
        recvbuf: on ``root``, 1-D C-contiguous array of ``size * count`` elements; ignored
            elsewhere.
        root: the gathering rank.
    """
    size, rank = cc.size, cc.rank
    count = sendbuf.size
    if rank != root:
        cc.send(sendbuf, root)
        return
    reqs = [cc.irecv(recvbuf[r * count:(r + 1) * count], r) for r in range(size) if r != root]
    recvbuf[root * count:(root + 1) * count] = sendbuf
    cc.waitall(reqs)


def gather_binomial(cc, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
    """Binomial-tree gather.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``count`` elements; not modified.
        recvbuf: on ``root``, 1-D C-contiguous array of ``size * count`` elements; ignored
            elsewhere.
        root: the gathering rank.
    """
    size, rank = cc.size, cc.rank
    count = sendbuf.size
    vrank = (rank - root) % size
    parent = binomial_parent(rank, size, root)
    children = binomial_children(rank, size, root)
    if not children:  # a leaf (or the only rank)
        if parent is None:
            recvbuf[root * count:(root + 1) * count] = sendbuf
        else:
            cc.send(sendbuf, parent)
        return
    subtree = binomial_subtree_size(rank, size, root)
    if rank == root == 0:
        gathered = recvbuf[:subtree * count]  # vrank order is rank order: no scratch
    else:
        gathered = np.empty(subtree * count, dtype=sendbuf.dtype)
    reqs = []
    for child in children:
        offset = (child - root) % size - vrank
        width = binomial_subtree_size(child, size, root)
        reqs.append(cc.irecv(gathered[offset * count:(offset + width) * count], child))
    gathered[:count] = sendbuf
    cc.waitall(reqs)
    if parent is not None:
        cc.send(gathered, parent)
    elif root != 0:  # rotate vrank order back to rank order
        split = (size - root) * count
        recvbuf[root * count:] = gathered[:split]
        recvbuf[:root * count] = gathered[split:]


def gatherv_linear(cc, sendbuf: np.ndarray, recvbuf: np.ndarray | None, counts, displs,
                   root: int) -> None:
    """Flat-tree gather with per-rank counts.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array, this rank's block (may be empty); not modified.
        recvbuf: on ``root``, 1-D C-contiguous array holding every block; ignored elsewhere.
        counts: on ``root``, elements of each rank's block (``size`` ints; zeros allowed);
            ignored elsewhere (may be None).
        displs: on ``root``, element offset of each rank's block in ``recvbuf``; blocks
            must not overlap. Ignored elsewhere.
        root: the gathering rank.
    """
    size, rank = cc.size, cc.rank
    if rank != root:
        cc.send(sendbuf, root)
        return
    reqs = [cc.irecv(recvbuf[displs[r]:displs[r] + counts[r]], r)
            for r in range(size) if r != root]
    recvbuf[displs[root]:displs[root] + counts[root]] = sendbuf
    cc.waitall(reqs)
