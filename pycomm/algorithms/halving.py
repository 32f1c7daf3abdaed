"""Building blocks shared by the recursive-halving schedules: the fold and the halving.

Used by allreduce ``rabenseifner``, reduce ``rabenseifner`` and reduce_scatter
``recursive_halving``. Words as in :mod:`pycomm.algorithms.topology`: ``q = pof2_floor(p)``,
``rem = p - q``, *new rank*, *chunk*.

**The fold** (Thakur, Rabenseifner & Gropp 2005, section 4.3; MPICH
``MPII_Recexchalgo``-style pairing). Non-power-of-two ``p``: ranks ``0..2rem-1`` pair up,
each even rank sends its whole vector to the odd rank above, which computes
``op(even, odd)`` and plays new rank ``r // 2``; ranks ``>= 2rem`` play ``r - rem``. New-rank
order is real-rank order, so non-commutative ops keep their order. Cost ``α + nβ + nγ`` in,
and whatever the caller sends back out.

**Recursive halving** over ``q`` new ranks and ``q`` chunk positions: at distance
``1, 2, ..., q/2`` the pair ``(r, r XOR d)`` splits its current position range in halves,
the lower new rank keeps the lower half, each sends the other half and folds in what it
receives, lower group's partial on the left. Distance 1 first means every fold joins two
adjacent aligned groups of new ranks, so rank order is kept; new rank ``r`` ends owning
position ``bit_reverse(r, log2 q)``, fully reduced over all ranks. ``log2 q`` messages,
``n(q-1)/q`` bytes sent and reduced per rank.
"""

from __future__ import annotations

import numpy as np

from pycomm.algorithms.topology import fold_new_rank, fold_real_rank, pof2_floor

__all__ = ["fold_in", "fold_out", "halve", "Step"]

# One halving step: (partner real rank, partner new rank, kept positions, given positions).
Step = tuple[int, int, tuple[int, int], tuple[int, int]]


def fold_in(cc, buf: np.ndarray, op, scratch: np.ndarray) -> int | None:
    """Fold a non-power-of-two group into ``q`` ranks; return this rank's new rank.

    Args:
        cc: the collective context.
        buf: this rank's whole vector; on kept odd ranks ``< 2rem`` it ends as
            ``op(even's vector, own vector)``.
        op: the reduction op.
        scratch: at least ``buf.size`` elements of ``buf.dtype`` (used on odd ranks only).

    Returns:
        The new rank, or None when this rank sits out (it sent its vector away).
    """
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


def fold_out(cc, buf: np.ndarray, new_rank: int | None) -> None:
    """Hand ``buf`` back from each kept odd rank to the even rank that sat out."""
    rank, size = cc.rank, cc.size
    if rank < 2 * (size - pof2_floor(size)):
        if new_rank is None:
            cc.recv(buf, rank + 1)
        else:
            cc.send(buf, rank - 1)


def halve(cc, buf: np.ndarray, op, offs: list[int], new_rank: int,
          scratch: np.ndarray) -> list[Step]:
    """Recursive-halving reduce-scatter over the ``q`` chunk positions of ``buf``, in place.

    Args:
        cc: the collective context.
        buf: the vector; position ``i`` is ``buf[offs[i]:offs[i + 1]]``.
        op: any associative op (rank order is kept).
        offs: ``q + 1`` non-decreasing element offsets; positions may be empty.
        new_rank: this rank's new rank (not None).
        scratch: at least as many elements as the largest half received (``offs[q // 2]``
            when the first half is the larger one, as with :func:`chunk_offsets`).

    Returns:
        The steps taken, in order; position ``bit_reverse(new_rank)`` of ``buf`` then
        holds the reduction over every rank. Retrace them backwards to gather.
    """
    size = cc.size
    pof2 = len(offs) - 1
    lo, hi = 0, pof2
    steps: list[Step] = []
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
        steps.append((partner, partner_new, keep, give))
        lo, hi = keep
        mask <<= 1
    return steps
