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

**bruck** (Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms for all-to-all
communications in multiport message-passing systems"; MPICH ``allgather_intra_brucks``).
Any ``p``. Rank ``r`` keeps a scratch copy in which block ``i`` is block ``r+i``; in step
``k`` (distance ``d = 2^k``) it sends its first ``min(d, p-d)`` blocks to ``r-d`` and
appends the same number received from ``r+d``. After ``L = ceil(log2 p)`` steps it holds
all ``p`` blocks rotated by ``r`` and copies them into place. Step ``k`` moves
``min(2^k, p - 2^k)`` blocks. Time ``L α + n(p-1)/p β + nβ`` (the last term: the
rotation into place, a local copy); scratch ``n`` (none on rank 0). Beats the ring at small ``n``
and non-power-of-two ``p``.

**allgatherv ring** (Thakur et al. 2005; MPICH ``allgatherv_intra_ring``): the ring with
per-rank block sizes ``counts[r]`` at offsets ``displs[r]``; blocks of 0 elements still go
as 0-byte messages, so every step pairs up. Time ``(p-1)α + n(p-1)/p β`` for equal blocks,
in general ``(p-1)α`` plus the bytes of all blocks but one's own.
"""

from __future__ import annotations

import numpy as np

from pycomm.topology import ceil_log2, is_pof2, ring_neighbors
from pycomm.errors import ArgumentError

__all__ = ["allgather_ring", "allgather_recursive_doubling", "allgather_bruck",
           "allgatherv_ring"]


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


def allgather_bruck(cc, buf: np.ndarray, count: int) -> None:
    """Bruck allgather for any number of ranks, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array of ``size * count`` elements; own block filled.
        count: elements per rank's block.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    # rotated: block i is rank (rank + i)'s block; on rank 0 that is buf itself.
    rotated = buf if rank == 0 else np.empty_like(buf)
    if rank:
        rotated[:count] = buf[rank * count:(rank + 1) * count]
    for k in range(ceil_log2(size)):
        dist = 1 << k
        nblocks = min(dist, size - dist)
        cc.sendrecv(rotated[:nblocks * count], (rank - dist) % size,
                    rotated[dist * count:(dist + nblocks) * count], (rank + dist) % size)
    if rank:
        split = (size - rank) * count
        buf[rank * count:] = rotated[:split]
        buf[:rank * count] = rotated[split:]


def allgatherv_ring(cc, buf: np.ndarray, counts, displs) -> None:
    """Ring allgather with per-rank block sizes, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array, the whole receive buffer; this rank's block
            ``buf[displs[rank]:displs[rank] + counts[rank]]`` is filled on entry.
        counts: elements of each rank's block (``size`` ints, the same on every rank;
            zeros allowed).
        displs: element offset of each rank's block in ``buf``; blocks must not overlap.
    """
    size, rank = cc.size, cc.rank
    left, right = ring_neighbors(rank, size)

    def block(b: int) -> np.ndarray:
        b %= size
        return buf[displs[b]:displs[b] + counts[b]]

    for step in range(size - 1):
        cc.sendrecv(block(rank - step), right, block(rank - step - 1), left)
