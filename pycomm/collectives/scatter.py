"""Scatter: ``root`` hands block ``r`` of ``sendbuf`` to rank ``r``.

``sendbuf`` (``size * count`` elements) is used on ``root`` only and may be None elsewhere;
``recvbuf`` has ``count`` elements on every rank. For ``IN_PLACE`` at the root the
communicator passes ``recvbuf = sendbuf[root*count:(root+1)*count]``; the self-copy is
harmless. Notation: ``p`` ranks, ``n = p * count * itemsize`` bytes scattered, ``α``
latency per message, ``β`` seconds per byte, ``L = ceil(log2 p)``.

**linear** (flat tree). The root sends block ``r`` to each rank ``r`` (all sends posted at
once) and copies its own. Time at the root ``(p-1)α + n(p-1)/p β``; no scratch.

**binomial** (MPICH ``scatter_intra_binomial``; Thakur et al. 2005, section 3). The mirror
image of the binomial gather: vrank ``v`` receives the blocks of its whole subtree
(vranks ``[v, v + lowbit(v))``) from its parent in one message, keeps the first and forwards
each child's contiguous range, largest subtree first. ``L`` rounds. Time
``L α + n(p-1)/p β``; scratch up to ``n/2`` on inner ranks and ``n`` on the root when
``root != 0`` (``sendbuf`` is copied into vrank order once).

**scatterv linear**: the flat tree with per-rank counts, significant at the root only
(MPI's rule). The root sends ``sendbuf[displs[r]:displs[r] + counts[r]]`` to each rank
``r`` (0 bytes when the count is 0) and every other rank receives exactly its
``recvbuf``; a mismatch is a truncation error from the p2p layer.
"""

from __future__ import annotations

import numpy as np

from pycomm.topology import (binomial_children, binomial_parent,
                                        binomial_subtree_size)

__all__ = ["scatter_linear", "scatter_binomial", "scatterv_linear"]


def scatter_linear(cc, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
    """Flat-tree scatter.

    Args:
        cc: the collective context.
        sendbuf: on ``root``, 1-D C-contiguous array of ``size * count`` elements (not
            modified); ignored elsewhere.
        recvbuf: 1-D C-contiguous array of ``count`` elements; receives this rank's block.
        root: the scattering rank.
    """
    size, rank = cc.size, cc.rank
    count = recvbuf.size
    if rank != root:
        cc.recv(recvbuf, root)
        return
    reqs = [cc.isend(sendbuf[r * count:(r + 1) * count], r) for r in range(size) if r != root]
    recvbuf[:] = sendbuf[root * count:(root + 1) * count]
    cc.waitall(reqs)


def scatter_binomial(cc, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
    """Binomial-tree scatter.

    Args:
        cc: the collective context.
        sendbuf: on ``root``, 1-D C-contiguous array of ``size * count`` elements (not
            modified); ignored elsewhere.
        recvbuf: 1-D C-contiguous array of ``count`` elements; receives this rank's block.
        root: the scattering rank.
    """
    size, rank = cc.size, cc.rank
    count = recvbuf.size
    vrank = (rank - root) % size
    parent = binomial_parent(rank, size, root)
    children = binomial_children(rank, size, root)
    if parent is None:
        if root == 0:
            blocks = sendbuf  # already in vrank order
        else:
            blocks = np.empty(size * count, dtype=sendbuf.dtype)
            split = (size - root) * count
            blocks[:split] = sendbuf[root * count:]
            blocks[split:] = sendbuf[:root * count]
    elif not children:  # a leaf receives its own block only
        cc.recv(recvbuf, parent)
        return
    else:
        blocks = np.empty(binomial_subtree_size(rank, size, root) * count, dtype=recvbuf.dtype)
        cc.recv(blocks, parent)
    reqs = []
    for child in reversed(children):
        offset = (child - root) % size - vrank
        width = binomial_subtree_size(child, size, root)
        reqs.append(cc.isend(blocks[offset * count:(offset + width) * count], child))
    recvbuf[:] = blocks[:count]
    cc.waitall(reqs)


def scatterv_linear(cc, sendbuf: np.ndarray | None, counts, displs, recvbuf: np.ndarray,
                    root: int) -> None:
    """Flat-tree scatter with per-rank counts.

    Args:
        cc: the collective context.
        sendbuf: on ``root``, 1-D C-contiguous array holding every block (not modified);
            ignored elsewhere.
        counts: on ``root``, elements of each rank's block (``size`` ints; zeros allowed);
            ignored elsewhere (may be None).
        displs: on ``root``, element offset of each rank's block in ``sendbuf``.
        recvbuf: 1-D C-contiguous array of this rank's count of elements (may be empty).
        root: the scattering rank.
    """
    size, rank = cc.size, cc.rank
    if rank != root:
        cc.recv(recvbuf, root)
        return
    reqs = [cc.isend(sendbuf[displs[r]:displs[r] + counts[r]], r)
            for r in range(size) if r != root]
    recvbuf[:] = sendbuf[displs[root]:displs[root] + counts[root]]
    cc.waitall(reqs)
