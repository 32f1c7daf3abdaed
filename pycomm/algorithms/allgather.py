"""Allgather: every rank contributes a block of ``count`` elements; all end with all blocks.

The buffer is ``buf`` of ``size * count`` elements; rank ``r``'s block
``buf[r*count:(r+1)*count]`` is filled on entry (the communicator copies ``sendbuf`` there,
or it is already there for ``IN_PLACE``). Notation: ``p`` ranks, ``n = p * count * itemsize``
bytes in the whole buffer, ``α`` latency per message, ``β`` seconds per byte.

**ring** (Thakur et al. 2005, section 3; Gloo ``allgather_ring.h``). In step
``s = 0..p-2`` rank ``r`` sends block ``r-s`` to its right neighbour and receives block
``r-s-1`` from its left neighbour, directly into place. Per rank ``p-1`` messages and
``n(p-1)/p`` bytes sent. Time ``(p-1)α + n(p-1)/p β``; no scratch; any ``p``.

**recursive_doubling** (Thakur et al. 2005, section 3; MPICH
``allgather_intra_recursive_doubling``), power-of-two ``p`` only. In step ``k`` rank ``r``
holds the aligned group of ``2^k`` blocks containing its own and swaps it with partner
``r XOR 2^k``, doubling the group. Time ``log2(p) α + n(p-1)/p β``; no scratch.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import is_pof2, ring_neighbors
from pycomm.errors import ArgumentError

__all__ = ["allgather_ring", "allgather_recursive_doubling"]


def allgather_ring(cc, buf: np.ndarray, count: int) -> None:
    """Ring allgather, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array of ``size * count`` elements; own block filled.
        count: elements per rank's block.
    """
    size, rank = cc.size, cc.rank
    left, right = ring_neighbors(rank, size)

    def block(b: int) -> np.ndarray:
        b %= size
        return buf[b * count:(b + 1) * count]

    for step in range(size - 1):
        cc.sendrecv(block(rank - step), right, block(rank - step - 1), left)


def allgather_recursive_doubling(cc, buf: np.ndarray, count: int) -> None:
    """Recursive-doubling allgather for a power-of-two number of ranks, in place.

    Args:
        cc: the collective context; ``cc.size`` must be a power of two (the registry
            never selects this algorithm otherwise).
        buf: 1-D C-contiguous array of ``size * count`` elements; own block filled.
        count: elements per rank's block.

    Raises:
        ArgumentError: ``cc.size`` is not a power of two.
    """
    size, rank = cc.size, cc.rank
    if not is_pof2(size):
        raise ArgumentError(f"allgather algorithm recursive_doubling needs a power-of-two "
                            f"number of ranks, got size={size} (rank {rank}); use ring")
    mask = 1
    while mask < size:
        mine = rank & ~(mask - 1)        # first block of my group of `mask` blocks
        theirs = (rank ^ mask) & ~(mask - 1)
        cc.sendrecv(buf[mine * count:(mine + mask) * count], rank ^ mask,
                    buf[theirs * count:(theirs + mask) * count], rank ^ mask)
        mask <<= 1
