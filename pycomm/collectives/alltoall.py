"""Alltoall: block ``d`` of rank ``r``'s sendbuf becomes block ``r`` of rank ``d``'s recvbuf.

Both buffers have ``size * count`` elements and must not overlap (for ``IN_PLACE`` the
communicator passes a copy as ``sendbuf``). Notation: ``p`` ranks, ``n = p * count *
itemsize`` bytes per rank's send buffer, ``α`` latency per message, ``β`` seconds per byte.

**pairwise** (Thakur et al. 2005, section 3; MPICH ``alltoall_intra_pairwise``). The own
block is copied; then in step ``k = 1..p-1`` rank ``r`` sends to ``r+k`` and receives from
``r-k`` (one ``sendrecv``), so every step is a permutation and no rank is flooded. Per rank
``p-1`` messages and ``n(p-1)/p`` bytes sent. Time ``(p-1)α + n(p-1)/p β``; no scratch.

**bruck** (Bruck et al. 1997, "Efficient algorithms for all-to-all communications in
multiport message-passing systems"; MPICH ``alltoall_intra_brucks``). A local rotation puts
the block for rank ``r+i`` at position ``i``; in step ``k`` (distance ``d = 2^k``) every
block whose position has bit ``k`` set is packed, sent to ``r+d`` and replaced by the
blocks received from ``r-d``. A block at position ``i`` thus travels ``i`` ranks in
``popcount(i)`` hops and lands on its destination; a final rotation and reversal puts the
block from rank ``s`` at ``recvbuf`` block ``s``. ``L = ceil(log2 p)`` messages of about
``n/2`` bytes each: time ``L(α + (n/2)β)``, plus the local pack and rotation copies. Wins for small
blocks on many ranks, where ``(p-1)α`` dominates the pairwise exchange.

**alltoallv pairwise** (MPICH ``alltoallv_intra_pairwise_sendrecv_replace``-style): the
pairwise schedule with per-peer counts and offsets. Every step exchanges one message each
way, of 0 bytes where the count is 0 (the sender's ``sendcounts[d]`` must equal the
receiver's ``recvcounts[s]``, as MPI requires), so both sides always pair up.
"""

from __future__ import annotations

import numpy as np

from pycomm.topology import ceil_log2

__all__ = ["alltoall_pairwise", "alltoall_bruck", "alltoallv_pairwise"]


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


def alltoall_bruck(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, count: int) -> None:
    """Bruck alltoall (``ceil(log2 p)`` messages per rank).

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``size * count`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``size * count`` elements, not overlapping
            ``sendbuf``; fully overwritten.
        count: elements per block.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        recvbuf[:] = sendbuf
        return
    src = sendbuf.reshape(size, count)
    work = np.concatenate((src[rank:], src[:rank]))  # position i: the block for rank r+i
    positions = np.arange(size)
    for k in range(ceil_log2(size)):
        dist = 1 << k
        moving = positions[(positions & dist) != 0]
        outgoing = work[moving].reshape(-1)
        incoming = np.empty_like(outgoing)
        cc.sendrecv(outgoing, (rank + dist) % size, incoming, (rank - dist) % size)
        work[moving] = incoming.reshape(moving.size, count)
    # position i now holds the block from rank r-i
    dst = recvbuf.reshape(size, count)
    dst[(rank - positions) % size] = work


def alltoallv_pairwise(cc, sendbuf: np.ndarray, sendcounts, sdispls, recvbuf: np.ndarray,
                       recvcounts, rdispls) -> None:
    """Pairwise-exchange alltoall with per-peer counts and offsets.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array; block for rank ``d`` is
            ``sendbuf[sdispls[d]:sdispls[d] + sendcounts[d]]``; not modified.
        sendcounts, sdispls: ``size`` ints each (elements), this rank's view.
        recvbuf: 1-D C-contiguous array not overlapping ``sendbuf``; block from rank
            ``s`` lands at ``recvbuf[rdispls[s]:rdispls[s] + recvcounts[s]]``.
        recvcounts, rdispls: ``size`` ints each (elements); ``recvcounts[s]`` must equal
            rank ``s``'s ``sendcounts[rank]``.
    """
    size, rank = cc.size, cc.rank

    def sblock(d: int) -> np.ndarray:
        return sendbuf[sdispls[d]:sdispls[d] + sendcounts[d]]

    def rblock(s: int) -> np.ndarray:
        return recvbuf[rdispls[s]:rdispls[s] + recvcounts[s]]

    rblock(rank)[:] = sblock(rank)
    for step in range(1, size):
        dest, source = (rank + step) % size, (rank - step) % size
        cc.sendrecv(sblock(dest), dest, rblock(source), source)
