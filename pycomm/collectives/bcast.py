"""Broadcast: ``buf`` on ``root`` is copied into ``buf`` on every rank.

Notation: ``p`` ranks, ``n`` bytes, ``α`` latency per message, ``β`` seconds per byte,
``L = ceil(log2 p)``.

**binomial** (MPICH ``bcast_intra_binomial``; Thakur et al. 2005, section 3). Ranks are
renumbered so the root is vrank 0 (see :func:`~pycomm.topology.binomial_parent`).
A rank receives the whole vector from its parent, then sends it to its children, largest
subtree first. ``L`` rounds; each non-root receives ``n`` bytes once. Time ``L(α + nβ)``;
no scratch. Best for small vectors.

**scatter_allgather** (van de Geijn; MPICH ``bcast_intra_scatter_ring_allgather``; Thakur
et al. 2005, section 3). The vector is cut into ``p`` chunks indexed by vrank. A binomial
scatter gives vrank ``v`` its chunk (each rank receives the contiguous chunk range of its
subtree straight into ``buf``, zero copy), then a ring all-gather circulates the chunks.
Per rank about ``n(p-1)/p`` bytes in each phase. Time ``(L + p - 1)α + 2n(p-1)/p β``; no
scratch. Beats binomial once ``n`` is large enough that bandwidth dominates.

**pipeline** (segmented chain; NCCL's ring broadcast, MPICH ``bcast`` pipelined chain, Gloo
``broadcast`` with segments). Ranks form a chain in vrank order ``root -> root+1 -> ... ->
root-1``; the vector is cut into ``S = ceil(n / s)`` segments of ``s`` bytes, the same on
every rank. A rank receives segment ``k`` from its predecessor, posts the receive of
segment ``k+1`` and forwards segment ``k``, so all links carry different segments at once.
``p - 2 + S`` pipeline steps of one segment each; a middle rank receives and sends in every
step, as in an exchange (``α_x``, :mod:`pycomm.tuning.tune`): time ``(p - 2 + S)(α_x + (n/S)β)``,
close to ``nβ`` for large ``n``, whatever ``p``; no scratch. The segment trades messages
against the time to fill the chain: ``s`` is ``PYCOMM_SEGMENT_BYTES`` when set, else the
power of two (4 KiB and up) that the cost model prices lowest for this ``n`` and ``p``
(about ``sqrt((p-2) n β / α)``; Open MPI's tuned decision rules and MPICH likewise pick
the pipeline's segment by message size). Large segments go by rendezvous: a single-copy
read each, which the forwarding rank's successor makes while it reads the next (64 KiB
segments against the model's, measured: benchmarks/README.md, "Measurements behind design
choices in the code").
"""

from __future__ import annotations

import collections

import numpy as np

from pycomm.tuning.cost import TREE_SEGMENT_BYTES, forced_segment
from pycomm.tuning.cost import segment_bytes as model_segment
from pycomm.topology import (binomial_children, binomial_parent,
                                        binomial_subtree_size, chunk_offsets, ring_neighbors,
                                        segment_offsets)

__all__ = ["bcast_binomial", "bcast_scatter_allgather", "bcast_pipeline", "segment_elements"]

# Sends a pipelined schedule may have in flight before it waits for the oldest one.
SEND_WINDOW = 2


def segment_elements(itemsize: int, segment_bytes: int | None = None) -> int:
    """Elements per segment of a pipelined schedule (at least one).

    Args:
        itemsize: bytes per element.
        segment_bytes: bytes per segment; None reads ``PYCOMM_SEGMENT_BYTES`` (0, the
            default, or negative: the double binary tree's 64 KiB, as the model prices
            it). Every rank must use the same value, or the ranks' segments (and
            messages) disagree.
    """
    if segment_bytes is None:
        segment_bytes = forced_segment() or TREE_SEGMENT_BYTES  # what the model prices
    return max(1, int(segment_bytes) // max(1, itemsize))


def bcast_binomial(cc, buf: np.ndarray, root: int) -> None:
    """Binomial-tree broadcast.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array; the data on ``root``, overwritten elsewhere.
        root: the broadcasting rank.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    parent = binomial_parent(rank, size, root)
    if parent is not None:
        cc.recv(buf, parent)
    children = binomial_children(rank, size, root)
    cc.waitall([cc.isend(buf, child) for child in reversed(children)])


def bcast_scatter_allgather(cc, buf: np.ndarray, root: int) -> None:
    """Binomial scatter of ``p`` chunks followed by a ring all-gather.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array; the data on ``root``, overwritten elsewhere.
        root: the broadcasting rank.
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    offs = chunk_offsets(buf.size, size)  # chunk v belongs to vrank v
    vrank = (rank - root) % size

    def chunks(first: int, last: int) -> np.ndarray:
        return buf[offs[first]:offs[last]]

    parent = binomial_parent(rank, size, root)
    if parent is not None:
        cc.recv(chunks(vrank, vrank + binomial_subtree_size(rank, size, root)), parent)
    reqs = []
    for child in reversed(binomial_children(rank, size, root)):
        cv = (child - root) % size
        reqs.append(cc.isend(chunks(cv, cv + binomial_subtree_size(child, size, root)), child))
    cc.waitall(reqs)

    left, right = ring_neighbors(rank, size)  # vrank neighbours too: the shift is uniform
    for step in range(size - 1):
        send_c, recv_c = (vrank - step) % size, (vrank - step - 1) % size
        cc.sendrecv(chunks(send_c, send_c + 1), right, chunks(recv_c, recv_c + 1), left)


def bcast_pipeline(cc, buf: np.ndarray, root: int, *, segment_bytes: int | None = None) -> None:
    """Segmented chain broadcast.

    Args:
        cc: the collective context.
        buf: 1-D C-contiguous array; the data on ``root``, overwritten elsewhere.
        root: the broadcasting rank.
        segment_bytes: bytes per segment, the same on every rank; None:
            ``PYCOMM_SEGMENT_BYTES`` when set, else the cost model's choice for this size
            with the shared-memory constants and a core per rank (a communicator's
            collective passes the choice for its own transport and cores).
    """
    size, rank = cc.size, cc.rank
    if size == 1:
        return
    if segment_bytes is None:
        segment_bytes = model_segment("bcast", "pipeline", buf.nbytes, size)
    offs = segment_offsets(buf.size, segment_elements(buf.itemsize, segment_bytes))
    vrank = (rank - root) % size
    prev = (rank - 1) % size if vrank > 0 else None
    nxt = (rank + 1) % size if vrank < size - 1 else None
    nseg = len(offs) - 1
    sends: collections.deque = collections.deque()
    pending = cc.irecv(buf[offs[0]:offs[1]], prev) if prev is not None and nseg else None
    for k in range(nseg):
        if pending is not None:
            cc.waitall([pending])
            pending = cc.irecv(buf[offs[k + 1]:offs[k + 2]], prev) if k + 1 < nseg else None
        if nxt is not None:
            sends.append(cc.isend(buf[offs[k]:offs[k + 1]], nxt))
            if len(sends) > SEND_WINDOW:
                cc.waitall([sends.popleft()])
    cc.waitall(list(sends))
