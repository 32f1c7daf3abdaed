"""Allreduce: every rank ends with ``x_0 ∘ x_1 ∘ ... ∘ x_{p-1}``, in place in ``buf``.

Notation: ``p`` ranks, ``n`` bytes per vector, ``α`` latency per message, ``β`` seconds per
byte moved, ``γ`` seconds per byte reduced; ``q = pof2_floor(p)``, ``rem = p - q``.

**ring** (Patarasuk & Yuan 2009; Gloo ``allreduce_ring.h``; NCCL ring allreduce).
The vector is cut into ``p`` chunks (sizes differ by at most one element, some may be
empty). Reduce-scatter: in step ``s = 0..p-2`` rank ``r`` sends chunk ``r-s`` to its right
neighbour, receives chunk ``r-s-1`` from its left neighbour and folds it into its own
copy; afterwards rank ``r`` owns the fully reduced chunk ``r+1``. All-gather: ``p-1`` more
steps pass the reduced chunks around the ring, copied, never re-reduced, so every rank
holds bit-identical bytes. Chunk ``c`` is reduced in ring order ``c, c+1, ..., c-1``: the
op must be commutative. Per rank ``2(p-1)`` messages, ``2n(p-1)/p`` bytes sent.
Time ``2(p-1)α + 2n(p-1)/p β + n(p-1)/p γ``; scratch one chunk.

**rabenseifner** (Thakur, Rabenseifner & Gropp 2005, section 4.3; MPICH
``allreduce_intra_reduce_scatter_allgather``). Fold to ``q`` ranks (below), then a
reduce-scatter by recursive halving over ``q`` chunks: at distance ``1, 2, ..., q/2`` the
pair splits its current chunk range in halves, the lower new rank keeps the lower half,
each sends the other half and folds in what it receives. Distance 1 first means every
fold joins two adjacent aligned blocks of ranks, so rank order is kept (non-commutative ops
are served) and ownership ends bit-reversed; the recursive-doubling all-gather retraces the
steps backwards, copying. Time ``2 log2(q) α + 2n(q-1)/q β + n(q-1)/q γ`` plus the fold;
scratch ``n/2`` (``n`` with a fold).

**recursive_doubling** (Thakur et al. 2005, section 4.2; MPICH
``allreduce_intra_recursive_doubling``). Fold to ``q`` ranks, then ``log2 q`` exchanges of
the whole vector with ``new_rank XOR 2^k``; both partners compute
``op(lower group's partial, higher group's partial)`` from the same operands, so results
are bit-identical and rank-ordered. Time ``log2(q)(α + nβ + nγ)`` plus the fold;
latency-optimal for small vectors. Scratch ``n``.

**The fold** (non-power-of-two ``p``): ranks ``0..2rem-1`` pair up, each even rank sends its
vector to the odd rank above, which computes ``op(even, odd)`` and plays new rank
``r // 2``; ranks ``>= 2rem`` play ``r - rem``. At the end each odd rank sends the result
back to its even partner. Cost ``2α + 2nβ + nγ``.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import (chunk_offsets, fold_new_rank, fold_real_rank,
                                        pof2_floor, ring_neighbors)

__all__ = ["allreduce_ring", "allreduce_rabenseifner", "allreduce_recursive_doubling"]


def allreduce_ring(cc, buf: np.ndarray, op) -> None:
    """Ring allreduce (reduce-scatter + all-gather), in place.

    Args:
        cc: the collective context (``rank``, ``size``, ``sendrecv``).
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: a commutative :class:`pycomm.ops.Op`.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    offs = chunk_offsets(buf.size, size)
    left, right = ring_neighbors(rank, size)
    scratch = np.empty(offs[1] - offs[0], dtype=buf.dtype)  # chunk 0 is a largest chunk

    def chunk(c: int) -> np.ndarray:
        c %= size
        return buf[offs[c]:offs[c + 1]]

    for step in range(size - 1):  # reduce-scatter
        mine = chunk(rank - step - 1)
        incoming = scratch[:mine.size]
        cc.sendrecv(chunk(rank - step), right, incoming, left)
        op.apply(incoming, mine)  # incoming is the partial of the ranks before us on the ring
    for step in range(size - 1):  # all-gather: rank owns chunk rank+1
        cc.sendrecv(chunk(rank + 1 - step), right, chunk(rank - step), left)


def _fold_in(cc, buf: np.ndarray, op, scratch: np.ndarray | None) -> int | None:
    """Non-power-of-two fold: return this rank's new rank, None if it sits out."""
    rank, size = cc.rank, cc.size
    new_rank = fold_new_rank(rank, size)
    if rank < 2 * (size - pof2_floor(size)):
        if new_rank is None:
            cc.send(buf, rank + 1)
        else:
            incoming = scratch[:buf.size]
            cc.recv(incoming, rank - 1)
            op.apply(incoming, buf)  # op(even, odd): the even rank is lower
    return new_rank


def _fold_out(cc, buf: np.ndarray, new_rank: int | None) -> None:
    """Return the result to the ranks that sat out of the power-of-two group."""
    rank, size = cc.rank, cc.size
    if rank < 2 * (size - pof2_floor(size)):
        if new_rank is None:
            cc.recv(buf, rank + 1)
        else:
            cc.send(buf, rank - 1)


def allreduce_rabenseifner(cc, buf: np.ndarray, op) -> None:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    size = cc.size
    if size == 1:
        return
    pof2 = pof2_floor(size)
    count = buf.size
    folding = pof2 != size
    offs = chunk_offsets(count, pof2)
    # The fold receives a whole vector; halving receives at most the first half.
    scratch = np.empty(count if folding else offs[pof2 // 2], dtype=buf.dtype)
    new_rank = _fold_in(cc, buf, op, scratch)
    if new_rank is not None:
        lo, hi = 0, pof2  # chunk range this rank is responsible for
        steps = []  # (partner, kept range, given range), retraced by the all-gather
        mask = 1
        while mask < pof2:
            partner_new = new_rank ^ mask
            partner = fold_real_rank(partner_new, size)
            mid = (lo + hi) // 2
            lower = new_rank < partner_new
            keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
            kept = buf[offs[keep[0]]:offs[keep[1]]]
            incoming = scratch[:kept.size]
            cc.sendrecv(buf[offs[give[0]]:offs[give[1]]], partner, incoming, partner)
            if lower:
                op.apply_left(kept, incoming)
            else:
                op.apply(incoming, kept)
            steps.append((partner, keep, give))
            lo, hi = keep
            mask <<= 1
        for partner, keep, give in reversed(steps):
            cc.sendrecv(buf[offs[keep[0]]:offs[keep[1]]], partner,
                        buf[offs[give[0]]:offs[give[1]]], partner)
    _fold_out(cc, buf, new_rank)


def allreduce_recursive_doubling(cc, buf: np.ndarray, op) -> None:
    """Recursive-doubling allreduce (whole-vector exchanges), in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    size = cc.size
    if size == 1:
        return
    pof2 = pof2_floor(size)
    scratch = np.empty_like(buf)
    new_rank = _fold_in(cc, buf, op, scratch)
    if new_rank is not None:
        mask = 1
        while mask < pof2:
            partner_new = new_rank ^ mask
            partner = fold_real_rank(partner_new, size)
            cc.sendrecv(buf, partner, scratch, partner)
            if new_rank < partner_new:
                op.apply_left(buf, scratch)
            else:
                op.apply(scratch, buf)
            mask <<= 1
    _fold_out(cc, buf, new_rank)
