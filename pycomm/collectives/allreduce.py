"""Allreduce: every rank ends with ``x_0 ∘ x_1 ∘ ... ∘ x_{p-1}``, in place in ``buf``.

Notation: ``p`` ranks, ``n`` bytes per vector, ``α`` latency per message, ``β`` seconds per
byte moved, ``γ`` seconds per byte reduced; ``q = pof2_floor(p)``, ``rem = p - q``.

**ring** (Patarasuk & Yuan 2009; Gloo ``allreduce_ring_chunked.h``; NCCL ring allreduce).
The vector is cut into ``p`` chunks (sizes differ by at most one element, some may be
empty), and each chunk into segments of ``s`` bytes (``PYCOMM_RING_SEGMENT_BYTES``; Gloo's
words: one chunk per rank, many segments per chunk). Reduce-scatter: in step
``t = 0..p-2`` rank ``r`` sends chunk ``r-t`` to its right neighbour, receives chunk
``r-t-1`` from its left neighbour and folds it into its own copy; afterwards rank ``r``
owns the fully reduced chunk ``r+1``. All-gather: ``p-1`` more steps pass the reduced
chunks around the ring, copied, never re-reduced, so every rank holds bit-identical
bytes. Step ``t`` forwards exactly the chunk received at step ``t-1``, so the schedule is
pipelined by segment, as NCCL's: a segment goes on to the right as soon as it has been
received and reduced, while the next one is still arriving (two receives in flight into
two scratch segments). Chunk ``c`` is reduced in ring order ``c, c+1, ..., c-1``: the op
must be commutative. Per rank ``2(p-1)`` steps of ``S = ceil(n/(ps))`` messages,
``2n(p-1)/p`` bytes sent. Time ``2(p-1)Sα + 2n(p-1)/p β + n(p-1)/p γ``; scratch two
segments.

**rabenseifner** (Thakur, Rabenseifner & Gropp 2005, section 4.3; MPICH
``allreduce_intra_reduce_scatter_allgather``). Fold to ``q`` ranks (below), then a
reduce-scatter by recursive halving over ``q`` chunks: at distance ``1, 2, ..., q/2`` the
pair splits its current chunk range in halves, the lower new rank keeps the lower half,
each sends the other half and folds in what it receives. Distance 1 first means every
fold joins two adjacent aligned blocks of ranks, so rank order is kept (non-commutative ops
are served) and ownership ends bit-reversed; the recursive-doubling all-gather retraces the
steps backwards, copying. The fold and every halving exchange go as segments of ``s``
bytes (``PYCOMM_HALVING_SEGMENT_BYTES``), each reduced as soon as it arrives, while it is
still in cache (:class:`~pycomm.collectives.halving.Pipe`). The last halving step and the
all-gather's first, which swap the same two ranges with the same partner, run as one: each
segment goes back as soon as it is reduced (the *echo* of :mod:`~pycomm.collectives.halving`,
as the ring pipelines its two phases). Time
``(Σ_i ceil(n/(2^i s)) + ceil(n/(qs)) + log2 q - 1) α + 2n(q-1)/q β + n(q-1)/q γ`` plus the
fold; scratch two segments.

**recursive_doubling** (Thakur et al. 2005, section 4.2; MPICH
``allreduce_intra_recursive_doubling``). Fold to ``q`` ranks, then ``log2 q`` exchanges of
the whole vector with ``new_rank XOR 2^k``; both partners compute
``op(lower group's partial, higher group's partial)`` from the same operands, so results
are bit-identical and rank-ordered. Time ``log2(q)(α + nβ + nγ)`` plus the fold;
latency-optimal for small vectors. Scratch ``n``.

**The fold** (non-power-of-two ``p``; :mod:`pycomm.collectives.halving`): ranks
``0..2rem-1`` pair up, each even rank sends its vector to the odd rank above, which computes
``op(even, odd)`` and plays new rank ``r // 2``; ranks ``>= 2rem`` play ``r - rem``. At the
end each odd rank sends the result back to its even partner. Cost
``(ceil(n/s) + 1)α + 2nβ + nγ`` (the fold in is segmented).

**binomial** (MPICH's fallback "reduce + bcast"; Thakur et al. 2005, section 4): a binomial
reduce to rank 0 (:func:`~pycomm.collectives.reduce.reduce_binomial`, rank order kept)
followed by a binomial broadcast. Every rank ends with rank 0's bytes. Time
``2L(α + nβ) + Lnγ`` with ``L = ceil(log2 p)``; scratch ``n`` on inner ranks.

**double_binary_tree** (NCCL's tree allreduce: Sanders, Speck & Träff 2009, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan"; NCCL ``graph/trees.cc``,
``ncclGetDtree``). Two binary trees (:func:`~pycomm.topology.double_binary_tree`:
NCCL's in-order btree rooted at 0 and its mirror image rooted at ``p-1``) each carry half
of the vector. Each half is cut into segments of ``s`` bytes (``PYCOMM_SEGMENT_BYTES``);
segment ``k`` is reduced up its tree (a rank folds ``lower child ∘ own ∘ higher child``:
subtrees are contiguous rank ranges, so rank order is kept) and, ``L + 1`` steps later,
broadcast back down from the root, so reduction and broadcast of different segments
overlap. For even ``p`` every rank is inner in one tree and a leaf in the other, so the
load is balanced. With ``S = ceil(n / 2s)`` segments per tree: ``S + L + 1`` pipeline
steps, each about ``4α + 3(n/2S)β + 2(n/2S)γ``; latency ``O(log p)`` like a tree,
bandwidth close to the ring's for large ``n``. Every step synchronises a rank with its
tree neighbours, so in Python (α of tens of µs, ranks that sleep while they wait) it pays
only where α is small against a segment's transfer time. Results come from each tree's root by
broadcast, so every rank holds the same bytes. Scratch: two segments per tree.
"""

from __future__ import annotations

import collections

import numpy as np

from pycomm import config
from pycomm.collectives.bcast import SEND_WINDOW, bcast_binomial, segment_elements
from pycomm.collectives.halving import Pipe, fold_in, fold_out, halve
from pycomm.collectives.reduce import reduce_binomial
from pycomm.collectives.scratch import give, take
from pycomm.topology import (ceil_log2, chunk_offsets, double_binary_tree,
                                        fold_real_rank, pof2_floor, ring_neighbors,
                                        segment_offsets)

# Segments of the ring's reduce-scatter in flight into scratch at once (double buffering).
RING_DEPTH = 2

__all__ = ["allreduce_ring", "allreduce_rabenseifner", "allreduce_recursive_doubling",
           "allreduce_binomial", "allreduce_double_binary_tree"]


def allreduce_ring(cc, buf: np.ndarray, op, *, segment_bytes: int | None = None) -> None:
    """Segmented ring allreduce (reduce-scatter + all-gather), in place.

    Args:
        cc: the collective context (``rank``, ``size``, ``isend``, ``irecv``, ``waitall``).
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: a commutative :class:`pycomm.ops.Op`.
        segment_bytes: bytes per segment of a chunk (default
            ``PYCOMM_RING_SEGMENT_BYTES``); the same on every rank.
    """
    size, rank = cc.size, cc.rank
    if size == 1 or buf.size == 0:
        return
    if segment_bytes is None:
        segment_bytes = config.get("PYCOMM_RING_SEGMENT_BYTES")
    seg = segment_elements(buf.itemsize, segment_bytes)
    offs = chunk_offsets(buf.size, size)
    left, right = ring_neighbors(rank, size)
    steps = 2 * (size - 1)  # reduce-scatter steps 0..p-2, all-gather steps p-1..2p-3

    def segments(c: int) -> list[tuple[tuple[int, int], np.ndarray]]:
        chunk = buf[offs[c]:offs[c + 1]]
        cut = segment_offsets(chunk.size, seg)
        return [((c, j), chunk[cut[j]:cut[j + 1]]) for j in range(len(cut) - 1)]

    # Every segment this rank receives, in the order its left neighbour sends them: at step
    # t chunk rank-t-1 (the same formula serves both halves), forwarded at step t+1.
    arrivals = [(step, key, piece) for step in range(steps)
                for key, piece in segments((rank - step - 1) % size)]
    slots = [take(min(seg, offs[1] - offs[0]), buf.dtype) for _ in range(RING_DEPTH)]
    recvs: collections.deque = collections.deque()
    # Reduce-scatter sends by segment: the all-gather later receives into those same bytes,
    # so it waits for that send before posting the receive (usually long complete: the
    # final chunk comes round only after the right neighbour has taken the partial).
    scattered: dict[tuple[int, int], object] = {}
    gathered = []

    posted = 0

    def post_receives() -> None:
        """Post receives ahead, at most RING_DEPTH in flight, in arrival order."""
        nonlocal posted
        while posted < len(arrivals) and len(recvs) < RING_DEPTH:
            step, key, piece = arrivals[posted]
            if step < size - 1:
                recvs.append(cc.irecv(slots[posted % RING_DEPTH][:piece.size], left))
            elif key in scattered:
                cc.waitall([scattered.pop(key)])
                recvs.append(cc.irecv(piece, left))
            else:  # not forwarded yet (empty chunks shorten the schedule): post it later
                return
            posted += 1

    for key, piece in segments(rank):  # step 0: this rank's own chunk
        scattered[key] = cc.isend(piece, right)
    post_receives()
    for i, (step, key, piece) in enumerate(arrivals):
        cc.waitall([recvs.popleft()])
        if step < size - 1:
            # the incoming partial covers the ranks before this one on the ring
            op.apply(slots[i % RING_DEPTH][:piece.size], piece)
        if step + 1 < size - 1:
            scattered[key] = cc.isend(piece, right)
        elif step + 1 < steps:
            gathered.append(cc.isend(piece, right))
        post_receives()  # the slot just read is free again
    cc.waitall(list(scattered.values()) + gathered)
    for s in slots:
        give(s)


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
    pipe = Pipe(buf.dtype, count if folding else offs[pof2 // 2])
    new_rank = fold_in(cc, buf, op, pipe)
    if new_rank is not None:
        # the last halving step echoes its reduced segments: the all-gather's first step
        steps = halve(cc, buf, op, offs, new_rank, pipe, echo_last=True)
        for partner, _, keep, other in reversed(steps[:-1]):  # recursive-doubling all-gather
            cc.sendrecv(buf[offs[keep[0]]:offs[keep[1]]], partner,
                        buf[offs[other[0]]:offs[other[1]]], partner)
    pipe.close()
    fold_out(cc, buf, new_rank)


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
    scratch = take(buf.size, buf.dtype)
    folded = size & (size - 1) != 0     # a power of two sets up nothing (small messages)
    if folded:
        pof2, pipe = pof2_floor(size), Pipe(buf.dtype, buf.size)  # the fold's segments
        new_rank = fold_in(cc, buf, op, pipe)
        pipe.close()
    else:
        pof2, new_rank = size, cc.rank
    if new_rank is not None:
        mask = 1
        while mask < pof2:
            partner_new = new_rank ^ mask
            partner = fold_real_rank(partner_new, size) if folded else partner_new
            cc.sendrecv(buf, partner, scratch, partner)
            if new_rank < partner_new:
                op.apply_left(buf, scratch)
            else:
                op.apply(scratch, buf)
            mask <<= 1
    give(scratch)
    if folded:
        fold_out(cc, buf, new_rank)


def allreduce_binomial(cc, buf: np.ndarray, op) -> None:
    """Binomial reduce to rank 0, then binomial broadcast, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
    """
    if cc.size == 1:
        return
    reduce_binomial(cc, buf, 0, op)
    bcast_binomial(cc, buf, 0)


def allreduce_double_binary_tree(cc, buf: np.ndarray, op, *,
                                 segment_bytes: int | None = None) -> None:
    """NCCL's double-binary-tree allreduce, pipelined by segments, in place.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array, this rank's contribution; ends with the result.
        op: any associative :class:`pycomm.ops.Op` (rank order is kept).
        segment_bytes: bytes per segment (default ``PYCOMM_SEGMENT_BYTES``); the same on
            every rank.
    """
    size = cc.size
    if size == 1 or buf.size == 0:
        return
    seg = segment_elements(buf.itemsize, segment_bytes)
    mid = (buf.size + 1) // 2
    halves = (buf[:mid], buf[mid:])
    offs = [segment_offsets(h.size, seg) for h in halves]
    nseg = len(offs[0]) - 1  # the first half is the longer one
    trees = double_binary_tree(cc.rank, size)
    scratch = [[np.empty(min(seg, mid), dtype=buf.dtype) for _ in children]
               for _, children in trees]
    up_sends: dict[tuple[int, int], object] = {}
    down_sends: collections.deque = collections.deque()
    lag = ceil_log2(size) + 1  # steps between reducing a segment and broadcasting it

    def part(t: int, k: int) -> np.ndarray:
        o = offs[t]
        return halves[t][o[k]:o[k + 1]] if k + 1 < len(o) else halves[t][:0]

    def up(t: int, k: int) -> None:
        mine = part(t, k)
        if mine.size == 0:
            return
        parent, children = trees[t]
        incoming = [s[:mine.size] for s in scratch[t]]
        cc.waitall([cc.irecv(b, c) for b, c in zip(incoming, children, strict=True)])
        for b, c in zip(incoming, children, strict=True):
            if c < cc.rank:
                op.apply(b, mine)        # lower ranks' partial on the left
            else:
                op.apply_left(mine, b)   # higher ranks' partial on the right
        if parent is not None:
            up_sends[(t, k)] = cc.isend(mine, parent)

    def down(t: int, k: int) -> None:
        mine = part(t, k)
        if mine.size == 0:
            return
        parent, children = trees[t]
        if parent is not None:
            cc.waitall([up_sends.pop((t, k))])  # matched already: parent reduced segment k
            cc.recv(mine, parent)
        for c in children:
            down_sends.append(cc.isend(mine, c))

    for step in range(nseg + lag):
        for t in (0, 1):
            if step < nseg:
                up(t, step)
        for t in (0, 1):
            if step >= lag:
                down(t, step - lag)
        while len(down_sends) > 4 * SEND_WINDOW:
            cc.waitall([down_sends.popleft()])
    cc.waitall(list(down_sends))
