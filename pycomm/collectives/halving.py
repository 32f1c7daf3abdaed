"""Building blocks shared by the recursive-halving schedules: the fold and the halving.

Used by allreduce ``rabenseifner``, reduce ``rabenseifner`` and reduce_scatter
``recursive_halving``. Words as in :mod:`pycomm.topology`: ``q = pof2_floor(p)``,
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

**Segmented exchanges** (:class:`Pipe`; the pipelining of Gloo's chunked ring and NCCL's
primitives, applied to each exchange): every reducing exchange above, the fold's
included, moves its range as segments of ``PYCOMM_HALVING_SEGMENT_BYTES`` and folds each
segment into the kept range as soon as it has arrived, while the next one is arriving
(two receives in flight into two scratch segments). A segment is reduced while it is still
in cache, where an unsegmented exchange copies the whole half out of cache and reads it
back to reduce it (segmented against whole, measured: benchmarks/README.md, "Measurements
behind design choices in the code"). Scratch is two segments instead of ``n/2``. ``S = ceil(b / s)`` messages for ``b`` bytes.

**The echo** (all-reduce only: the last halving step fused with the first doubling step,
as the segmented ring runs its reduce-scatter into its all-gather, Patarasuk & Yuan 2009).
The recursive-doubling all-gather retraces the halving backwards, so its first exchange
is with the last halving step's partner and swaps exactly the two ranges that step just
reduced. With ``echo`` the last exchange sends each segment back to the partner as soon as
it is fully reduced, and receives the partner's reduced segments into the range it gave
away, instead of a separate whole-range exchange afterwards: the echoed segment leaves
while it is still in cache, and the two phases overlap. Messages between the pair keep
their order (the partner's given segments first, then its echoed ones), and a received
echo overwrites a given segment only after that segment's send has completed (with and
without the echo, measured: ibid.).
"""

from __future__ import annotations

import collections

import numpy as np

from pycomm import config
from pycomm.collectives.bcast import segment_elements
from pycomm.collectives.scratch import give, take
from pycomm.topology import (fold_new_rank, fold_real_rank, pof2_floor,
                                        segment_offsets)

__all__ = ["Pipe", "fold_in", "fold_out", "halve", "Step", "DEPTH"]

# Segments in flight into scratch at once (double buffering).
DEPTH = 2

# One halving step: (partner real rank, partner new rank, kept positions, given positions).
Step = tuple[int, int, tuple[int, int], tuple[int, int]]


class Pipe:
    """Segmented, double-buffered exchanges that reduce what they receive.

    Args:
        dtype: element type of the vectors (a ``numpy.dtype``).
        largest: elements of the largest range this pipe will receive (sizes its scratch).
        segment_bytes: bytes per segment (default ``PYCOMM_HALVING_SEGMENT_BYTES``); the
            same on every rank, since both partners cut a range into the same segments.

    Call :meth:`close` when done (gives the scratch back).
    """

    __slots__ = ("seg", "slots", "_dtype", "_slot_size")

    def __init__(self, dtype, largest: int, segment_bytes: int | None = None):
        if segment_bytes is None:
            segment_bytes = config.get("PYCOMM_HALVING_SEGMENT_BYTES")
        self._dtype = dtype
        self.seg = segment_elements(dtype.itemsize, segment_bytes)
        self._slot_size = max(0, min(self.seg, int(largest)))
        self.slots: list[np.ndarray] = []  # taken at the first exchange: a rank that
        # only sends (or a schedule that never folds) takes no scratch

    def close(self) -> None:
        """Give the scratch segments back (after every exchange has completed)."""
        for s in self.slots:
            give(s)
        self.slots = []

    def send(self, cc, view: np.ndarray, dest: int) -> list:
        """Post ``view`` to ``dest`` as segments; return the send requests."""
        cut = segment_offsets(view.size, self.seg)
        return [cc.isend(view[a:b], dest) for a, b in zip(cut, cut[1:])]

    def exchange(self, cc, give_view: np.ndarray | None, kept: np.ndarray, peer: int, op,
                 incoming_left: bool, echo: bool = False) -> None:
        """Send ``give_view`` to ``peer`` (if any) and fold ``peer``'s segments into ``kept``.

        ``peer`` sends a range of ``kept.size`` elements cut the same way. Each arriving
        segment ``x`` becomes ``op(x, kept_seg)`` when ``incoming_left`` (``peer`` stands
        for lower ranks), else ``op(kept_seg, x)``. With ``echo`` (both partners must pass
        it, and ``give_view``), each reduced segment of ``kept`` goes back to ``peer`` at
        once, and ``give_view`` ends holding ``peer``'s reduced segments (see the module
        docstring). Returns when every segment is reduced and every send has completed.
        """
        cut = segment_offsets(kept.size, self.seg)
        nseg = len(cut) - 1
        while len(self.slots) < min(DEPTH, nseg):  # one slot when one segment will do
            self.slots.append(take(self._slot_size, self._dtype))
        recvs: collections.deque = collections.deque()
        posted = 0

        def post() -> None:
            nonlocal posted
            while posted < nseg and len(recvs) < DEPTH:
                n = cut[posted + 1] - cut[posted]
                recvs.append(cc.irecv(self.slots[posted % DEPTH][:n], peer))
                posted += 1

        post()  # receives first: eager segments land in place, not in the unexpected queue
        sends = self.send(cc, give_view, peer) if give_view is not None else []
        echoed = []
        for j in range(nseg):
            cc.waitall([recvs.popleft()])
            piece = kept[cut[j]:cut[j + 1]]
            incoming = self.slots[j % DEPTH][:piece.size]
            if incoming_left:
                op.apply(incoming, piece)
            else:
                op.apply_left(piece, incoming)
            if echo:
                echoed.append(cc.isend(piece, peer))  # final bytes, still in cache
            post()  # the slot just read is free again
        if echo:
            # peer's echoes follow all its given segments, whose receives are all posted
            # by now; each lands on a given segment once that segment has left
            gcut = segment_offsets(give_view.size, self.seg)
            for j, (a, b) in enumerate(zip(gcut, gcut[1:])):
                cc.waitall([sends[j]])
                echoed.append(cc.irecv(give_view[a:b], peer))
            sends = []  # all waited for
        cc.waitall(sends + echoed)


def fold_in(cc, buf: np.ndarray, op, pipe: Pipe | None) -> int | None:
    """Fold a non-power-of-two group into ``q`` ranks; return this rank's new rank.

    Args:
        cc: the collective context.
        buf: this rank's whole vector; on kept odd ranks ``< 2rem`` it ends as
            ``op(even's vector, own vector)``.
        op: the reduction op.
        pipe: the segmented exchanges (sized for at least ``buf.size`` elements); None
            when ``p`` is a power of two (no fold).

    Returns:
        The new rank, or None when this rank sits out (it sent its vector away).
    """
    rank, size = cc.rank, cc.size
    new_rank = fold_new_rank(rank, size)
    if rank < 2 * (size - pof2_floor(size)):
        if new_rank is None:
            cc.waitall(pipe.send(cc, buf, rank + 1))
        else:
            pipe.exchange(cc, None, buf, rank - 1, op, True)  # op(even, odd): even is lower
    return new_rank


def fold_out(cc, buf: np.ndarray, new_rank: int | None) -> None:
    """Hand ``buf`` back from each kept odd rank to the even rank that sat out."""
    rank, size = cc.rank, cc.size
    if rank < 2 * (size - pof2_floor(size)):
        if new_rank is None:
            cc.recv(buf, rank + 1)
        else:
            cc.send(buf, rank - 1)


def halve(cc, buf: np.ndarray, op, offs: list[int], new_rank: int, pipe: Pipe, *,
          echo_last: bool = False) -> list[Step]:
    """Recursive-halving reduce-scatter over the ``q`` chunk positions of ``buf``, in place.

    Args:
        cc: the collective context.
        buf: the vector; position ``i`` is ``buf[offs[i]:offs[i + 1]]``.
        op: any associative op (rank order is kept).
        offs: ``q + 1`` non-decreasing element offsets; positions may be empty.
        new_rank: this rank's new rank (not None).
        pipe: the segmented exchanges.
        echo_last: fuse the last step with the all-gather's first (see the module
            docstring): ``buf``'s last two kept positions then both hold the reduction.

    Returns:
        The steps taken, in order; position ``bit_reverse(new_rank)`` of ``buf`` then
        holds the reduction over every rank. Retrace them backwards to gather (with
        ``echo_last``, all but the last step).
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
        keep, give_ = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        pipe.exchange(cc, buf[offs[give_[0]]:offs[give_[1]]], buf[offs[keep[0]]:offs[keep[1]]],
                      partner, op, not lower, echo=echo_last and 2 * mask == pof2)
        steps.append((partner, partner_new, keep, give_))
        lo, hi = keep
        mask <<= 1
    return steps
