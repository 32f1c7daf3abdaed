"""Alltoall: block ``d`` of rank ``r``'s sendbuf becomes block ``r`` of rank ``d``'s recvbuf.

Both buffers have ``size * count`` elements and must not overlap (for ``IN_PLACE`` the
communicator passes a copy as ``sendbuf``). Notation: ``p`` ranks, ``n = p * count *
itemsize`` bytes per rank's send buffer, ``α`` latency per message, ``β`` seconds per byte.

**pairwise** (Thakur et al. 2005, section 3; MPICH ``alltoall_intra_pairwise``). The own
block is copied; then in step ``k = 1..p-1`` rank ``r`` sends to ``r+k`` and receives from
``r-k`` (one ``sendrecv``), so every step is a permutation and no rank is flooded. Per rank
``p-1`` messages and ``n(p-1)/p`` bytes sent. Time ``(p-1)α + n(p-1)/p β``; no scratch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["alltoall_pairwise"]


def alltoall_pairwise(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, count: int) -> None:
    """Pairwise-exchange alltoall.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``size * count`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``size * count`` elements, not overlapping
            ``sendbuf``; fully overwritten.
        count: elements per block.
    """
    size, rank = cc.size, cc.rank

    def block(arr: np.ndarray, b: int) -> np.ndarray:
        return arr[b * count:(b + 1) * count]

    block(recvbuf, rank)[:] = block(sendbuf, rank)
    for step in range(1, size):
        dest, source = (rank + step) % size, (rank - step) % size
        cc.sendrecv(block(sendbuf, dest), dest, block(recvbuf, source), source)
