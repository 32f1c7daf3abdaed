"""Reduce-scatter (block): rank ``r`` gets block ``r`` of ``x_0 ∘ x_1 ∘ ... ∘ x_{p-1}``.

Each ``sendbuf`` has ``size * count`` elements, each ``recvbuf`` ``count``. Notation: ``p``
ranks, ``n = p * count * itemsize`` bytes per send buffer, ``α`` latency per message, ``β``
seconds per byte, ``γ`` seconds per byte reduced.

**ring** (Patarasuk & Yuan 2009, first half of the ring allreduce; Gloo
``reduce_scatter.h``). Block ``b`` starts at rank ``b+1`` and travels right around the ring,
each rank folding in its own contribution, and arrives complete at rank ``b`` after
``p-1`` steps: in step ``s`` rank ``r`` sends its partial of block ``r-s-1`` and receives
block ``r-s-2``. Blocks are reduced in ring order, so the op must be commutative.
**sendbuf is overwritten** (partials accumulate in it). Time
``(p-1)α + n(p-1)/p β + n(p-1)/p γ``; scratch one block.

**pairwise** (MPICH ``reduce_scatter_block_intra_pairwise``). In step ``k = 1..p-1`` rank
``r`` sends block ``r+k`` of its ``sendbuf`` to rank ``r+k`` and receives rank ``r-k``'s
contribution to block ``r``. Sources arrive as ``r-1, ..., 0, p-1, ..., r+1``, so two
accumulators (one for ranks ``<= r``, one for ranks ``> r``, each grown on the left) give
exact rank order: non-commutative ops are served. ``sendbuf`` is not modified. Same time as
ring; scratch two blocks.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import ring_neighbors

__all__ = ["reduce_scatter_block_ring", "reduce_scatter_block_pairwise"]


def reduce_scatter_block_ring(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Ring reduce-scatter with equal blocks.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``size * count`` elements; **overwritten**
            (used as the accumulator; pass a copy to keep it).
        recvbuf: 1-D C-contiguous array of ``count`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        op: a commutative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    count = recvbuf.size
    left, right = ring_neighbors(rank, size)

    def block(b: int) -> np.ndarray:
        b %= size
        return sendbuf[b * count:(b + 1) * count]

    incoming = np.empty(count, dtype=sendbuf.dtype)
    for step in range(size - 1):
        cc.sendrecv(block(rank - step - 1), right, incoming, left)
        op.apply(incoming, block(rank - step - 2))  # incoming: earlier ranks on the ring
    recvbuf[:] = block(rank)


def reduce_scatter_block_pairwise(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Pairwise-exchange reduce-scatter with equal blocks, in exact rank order.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``size * count`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``count`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        op: any associative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    count = recvbuf.size

    def block(b: int) -> np.ndarray:
        return sendbuf[b * count:(b + 1) * count]

    recvbuf[:] = block(rank)
    low = recvbuf  # x_src ∘ ... ∘ x_rank for the sources seen so far (src <= rank)
    high = None    # x_src ∘ ... ∘ x_{p-1} for the sources seen so far (src > rank)
    incoming = np.empty(count, dtype=sendbuf.dtype)
    for step in range(1, size):
        dest, source = (rank + step) % size, (rank - step) % size
        cc.sendrecv(block(dest), dest, incoming, source)
        if source < rank:
            op.apply(incoming, low)
        elif high is None:
            high, incoming = incoming, np.empty(count, dtype=sendbuf.dtype)
        else:
            op.apply(incoming, high)
    if high is not None:
        op.apply_left(low, high)
