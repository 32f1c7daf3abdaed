"""Reduce-scatter: rank ``r`` gets block ``r`` of ``x_0 ∘ x_1 ∘ ... ∘ x_{p-1}``.

Two collectives share these schedules. ``reduce_scatter`` (MPI ``Reduce_scatter``): block
``r`` has ``counts[r]`` elements (``counts`` the same on every rank, zeros allowed), blocks
lie back to back, ``sendbuf`` has ``sum(counts)`` elements and ``recvbuf`` ``counts[rank]``.
``reduce_scatter_block``: every block has ``count = recvbuf.size`` elements. Notation:
``p`` ranks, ``n`` bytes per send buffer, ``α`` latency per message, ``β`` seconds per byte,
``γ`` seconds per byte reduced; ``q = pof2_floor(p)``.

**ring** (Patarasuk & Yuan 2009, first half of the ring allreduce; Gloo
``reduce_scatter.h``). Block ``b`` starts at rank ``b+1`` and travels right around the ring,
each rank folding in its own contribution, and arrives complete at rank ``b`` after
``p-1`` steps: in step ``s`` rank ``r`` sends its partial of block ``r-s-1`` and receives
block ``r-s-2``. Blocks are reduced in ring order, so the op must be commutative.
With a ufunc op each step reduces the incoming partial and the rank's own block into a
fresh partial (two alternating scratch blocks; the last step into ``recvbuf``), so the
send buffer is only read and never copied; other ops accumulate in a copy of it. Time
``(p-1)α + n(p-1)/p β + n(p-1)/p γ`` for equal blocks; scratch three (largest) blocks.

**pairwise** (MPICH ``reduce_scatter_intra_pairwise``). In step ``k = 1..p-1`` rank ``r``
sends block ``r+k`` of its ``sendbuf`` to rank ``r+k`` and receives rank ``r-k``'s
contribution to block ``r``. Sources arrive as ``r-1, ..., 0, p-1, ..., r+1``, so two
accumulators (one for ranks ``<= r``, one for ranks ``> r``, each grown on the left) give
exact rank order: non-commutative ops are served. ``sendbuf`` is not modified. Same time as
ring; scratch two blocks. With a ufunc op the first contribution received is combined
with the rank's own block straight into ``recvbuf`` (no copy of the block first).

**recursive_halving** (Thakur et al. 2005, section 4.1; MPICH
``reduce_scatter_intra_recursive_halving`` and its non-commutative variant). Fold to ``q``
ranks (:mod:`pycomm.collectives.halving`; new rank ``j < rem`` stands for the real ranks
``2j, 2j+1``, whose blocks are adjacent), copy the send buffer into a work buffer whose
chunk position ``i`` holds the blocks of new rank ``bit_reverse(i)``, then reduce-scatter by
recursive halving with distance 1 first: rank order is kept and new rank ``j`` ends with
position ``bit_reverse(j)``, i.e. its own blocks. Each odd rank of the fold sends its even
partner's block back. Time ``log2(q) α + n(q-1)/q (β + γ)`` plus, for non-power-of-two
``p``, ``(ceil(n/s) + 1)α + (n + n/p)β + nγ`` (the fold in, and the block sent back). The
fold and the halving exchanges go as segments of ``s = PYCOMM_HALVING_SEGMENT_BYTES`` (one
``α`` each), reduced as they arrive (:class:`~pycomm.collectives.halving.Pipe`); scratch
``n`` (the work copy) plus two segments; the odd ranks of the fold reduce into a copy of
their send buffer.

No schedule modifies ``sendbuf``.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from pycomm.collectives.halving import Pipe, fold_in, halve
from pycomm.collectives.scratch import give, take
from pycomm.topology import bit_reverse, pof2_floor, ring_neighbors

__all__ = ["reduce_scatter_ring", "reduce_scatter_pairwise", "reduce_scatter_recursive_halving",
           "reduce_scatter_block_ring", "reduce_scatter_block_pairwise",
           "reduce_scatter_block_recursive_halving"]


def _displs(counts) -> list[int]:
    """Offsets of back-to-back blocks: ``size + 1`` entries ending at ``sum(counts)``."""
    return [0, *accumulate(int(c) for c in counts)]


def reduce_scatter_ring(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, counts, op) -> None:
    """Ring reduce-scatter with per-rank block sizes.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``sum(counts)`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``counts[rank]`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        counts: elements of each rank's block (``size`` ints, the same on every rank).
        op: a commutative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    displs = _displs(counts)
    left, right = ring_neighbors(rank, size)
    ufunc = op._ufunc
    if size > 1 and ufunc is None:
        sendbuf = sendbuf.copy()        # the partials accumulate in it

    def block(b: int) -> np.ndarray:
        b %= size
        return sendbuf[displs[b]:displs[b + 1]]

    widest = max(counts)
    scratch = take(widest, sendbuf.dtype)
    partials = [take(widest, sendbuf.dtype), take(widest, sendbuf.dtype)] if ufunc else []
    outgoing = block(rank - 1)
    for step in range(size - 1):
        mine = block(rank - step - 2)
        incoming = scratch[:mine.size]
        cc.sendrecv(outgoing, right, incoming, left)
        if ufunc is None:
            op.apply(incoming, mine)    # incoming: earlier ranks on the ring
            outgoing = mine
        else:                           # out of place: sendbuf is only read
            dest = recvbuf if step == size - 2 else partials[step & 1][:mine.size]
            ufunc(incoming, mine, out=dest)
            outgoing = dest
    give(scratch)
    for buf in partials:
        give(buf)
    if size == 1 or ufunc is None:
        recvbuf[:] = block(rank)


def reduce_scatter_pairwise(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, counts, op) -> None:
    """Pairwise-exchange reduce-scatter with per-rank block sizes, in exact rank order.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``sum(counts)`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``counts[rank]`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        counts: elements of each rank's block (``size`` ints, the same on every rank).
        op: any associative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    displs = _displs(counts)
    count = recvbuf.size

    def block(b: int) -> np.ndarray:
        return sendbuf[displs[b]:displs[b + 1]]

    ufunc = op._ufunc
    mine = block(rank)
    fresh = ufunc is not None and rank > 0   # low is first made from a received block
    if not fresh:
        recvbuf[:] = mine
    low = recvbuf  # x_src ∘ ... ∘ x_rank for the sources seen so far (src <= rank)
    high = None    # x_src ∘ ... ∘ x_{p-1} for the sources seen so far (src > rank)
    pool = [take(count, sendbuf.dtype), take(count, sendbuf.dtype)]
    incoming = pool[0]
    for step in range(1, size):
        dest, source = (rank + step) % size, (rank - step) % size
        cc.sendrecv(block(dest), dest, incoming, source)
        if source < rank:
            if fresh:                   # x_{rank-1} ∘ x_rank straight into recvbuf
                ufunc(incoming, mine, out=low)
                fresh = False
            else:
                op.apply(incoming, low)
        elif high is None:
            high, incoming = incoming, pool[1]
        else:
            op.apply(incoming, high)
    if high is not None:
        op.apply_left(low, high)
    for buf in pool:
        give(buf)


def reduce_scatter_recursive_halving(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, counts,
                                     op) -> None:
    """Recursive-halving reduce-scatter with per-rank block sizes, in rank order.

    Args:
        cc: the collective context.
        sendbuf: 1-D C-contiguous array of ``sum(counts)`` elements; not modified.
        recvbuf: 1-D C-contiguous array of ``counts[rank]`` elements, not overlapping
            ``sendbuf``; receives this rank's reduced block.
        counts: elements of each rank's block (``size`` ints, the same on every rank).
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        recvbuf[:] = sendbuf
        return
    displs = _displs(counts)
    pof2 = pof2_floor(size)
    nbits = pof2.bit_length() - 1
    total = displs[-1]

    rem = size - pof2

    def span(new: int) -> tuple[int, int]:
        """Element range of sendbuf holding the blocks new rank ``new`` stands for."""
        first, last = (2 * new, 2 * new + 1) if new < rem else (new + rem, new + rem)
        return displs[first], displs[last + 1]

    owner = [bit_reverse(i, nbits) for i in range(pof2)]  # position -> new rank
    offs = [0, *accumulate(span(j)[1] - span(j)[0] for j in owner)]
    # The fold receives a whole vector; halving at most the larger half of the first step.
    half = offs[pof2 // 2]
    pipe = Pipe(sendbuf.dtype, total if rem else max(half, total - half))
    if rank < 2 * rem and rank & 1:
        sendbuf = sendbuf.copy()        # the fold's odd ranks reduce into it
    new_rank = fold_in(cc, sendbuf, op, pipe)
    if new_rank is None:  # an even rank of the fold: its block comes back from rank + 1
        pipe.close()
        cc.recv(recvbuf, rank + 1)
        return
    work = take(total, sendbuf.dtype)
    for pos, j in enumerate(owner):
        lo, hi = span(j)
        work[offs[pos]:offs[pos + 1]] = sendbuf[lo:hi]
    halve(cc, work, op, offs, new_rank, pipe)
    pipe.close()
    pos = bit_reverse(new_rank, nbits)
    mine = work[offs[pos]:offs[pos + 1]]
    if rank < 2 * rem:  # an odd rank of the fold: it holds its even partner's block too
        even = counts[rank - 1]
        cc.send(mine[:even], rank - 1)
        mine = mine[even:]
    recvbuf[:] = mine
    give(work)


def reduce_scatter_block_ring(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Ring reduce-scatter with equal blocks of ``recvbuf.size`` elements.

    Args as :func:`reduce_scatter_ring` without ``counts``.
    """
    reduce_scatter_ring(cc, sendbuf, recvbuf, [recvbuf.size] * cc.size, op)


def reduce_scatter_block_pairwise(cc, sendbuf: np.ndarray, recvbuf: np.ndarray, op) -> None:
    """Pairwise reduce-scatter with equal blocks, in exact rank order; sendbuf untouched.

    Args as :func:`reduce_scatter_pairwise` without ``counts``.
    """
    reduce_scatter_pairwise(cc, sendbuf, recvbuf, [recvbuf.size] * cc.size, op)


def reduce_scatter_block_recursive_halving(cc, sendbuf: np.ndarray, recvbuf: np.ndarray,
                                           op) -> None:
    """Recursive-halving reduce-scatter with equal blocks, in rank order.

    Args as :func:`reduce_scatter_recursive_halving` without ``counts``.
    """
    reduce_scatter_recursive_halving(cc, sendbuf, recvbuf, [recvbuf.size] * cc.size, op)
