"""The collectives through shared-memory slots: for each collective, a builder that
makes, once per call shape, the function running a call through the communicator's
:class:`pycomm.shmcoll.SharedSlots` (:func:`kernel`; :mod:`pycomm.plan` keeps it).

A call's function copies this rank's contribution into its slot and publishes its header
(:meth:`~pycomm.shmcoll.SharedSlots.exchange`, which also waits for every peer's header and
checks their signatures), then computes its result from the peers' slots in place. Where a
peer runs the call by messages (:class:`~pycomm.shmcoll.ByMessages`) it runs the call's
message algorithm instead, from the same inputs. The slot protocol (layout, safety,
integrity) is :mod:`pycomm.shmcoll`'s; the designs are MPICH's CH4 POSIX collectives and
Open MPI's ``coll/sm`` (see there).
"""

from __future__ import annotations

import numpy as np

from . import shmcoll
from .errors import TruncationError
from .signature import describe

__all__ = ["alltoallv", "kernel"]


def kernel(slots, collective: str, dtype, count: int, root: int, op, by_messages):
    """The function that runs one call shape through the slots, with the algorithm
    function's arguments (:mod:`pycomm.collectives`); views of every slot made once.

    Args:
        collective: ``barrier``, ``bcast``, ``allreduce``, ``reduce``, ``allgather``,
            ``reduce_scatter_block`` or ``alltoall``.
        dtype, count, root, op: the call's shape as :func:`pycomm.plan.plan_call`
            has it (``count``: the elements of one rank's block for allgather,
            reduce_scatter_block and alltoall).
        by_messages: the message algorithm's function, run instead when a peer takes
            messages (:class:`pycomm.shmcoll.ByMessages`).
    """
    return _KERNELS[collective](slots, dtype, count, root, op, by_messages)


def _views(slots, dtype, lo: int, n: int) -> list[list[np.ndarray]]:
    """``[slot][rank]`` arrays of ``n`` ``dtype`` elements from element ``lo``."""
    b0, b1 = lo * dtype.itemsize, (lo + n) * dtype.itemsize
    return [[d[p][b0:b1].view(dtype) for d in slots.data] for p in (0, 1)]


def _reducer(slots, op):
    """``fold(views, out)``: ``out = x_0 op x_1 op ... op x_{n-1}`` in rank order, in
    the same steps on every rank (so every rank's result has the same bits). A numpy
    ufunc reads the peers' slots in place; other ops get copies (they may write their
    input)."""
    ufunc = op._ufunc

    if ufunc is not None and slots.size == 2:
        def fold(v, out):
            ufunc(v[0], v[1], out=out)
    elif ufunc is not None:
        def fold(v, out):
            ufunc(v[0], v[1], out=out)
            for i in range(2, len(v)):
                ufunc(out, v[i], out=out)
    else:
        def fold(v, out):
            out[...] = v[0]
            for x in v[1:]:
                op.apply_left(out, x.copy())
    return fold


def _barrier(slots, dtype, count, root, op, by_messages):
    def run(cc):
        try:
            slots.exchange(cc, 0)
        except shmcoll.ByMessages:
            by_messages(cc)
    return run


def _bcast(slots, dtype, count, root, op, by_messages):
    views = [v[root] for v in _views(slots, dtype, 0, count)]
    nb, me = count * dtype.itemsize, slots.rank

    def run(cc, buf, _root):
        try:
            p = slots.exchange(cc, nb, views, buf if me == root else None)
        except shmcoll.ByMessages:
            return by_messages(cc, buf, root)
        if me != root:
            buf[...] = views[p]
    return run


def _allreduce(slots, dtype, count, root, op, by_messages, to_all=True):
    """Flat: every rank folds every slot in rank order. Split (an all-reduce of
    :data:`pycomm.shmcoll.SPLIT_MIN_BYTES` or more on
    :data:`pycomm.shmcoll.SPLIT_MIN_RANKS` or more, a core each): rank ``i`` folds slice
    ``i`` of every slot, writes it over slice ``i`` of its own slot (read by no other rank
    in this call), flags it (``reduced``), then copies every slice from its owner:
    Rabenseifner's reduce-scatter + all-gather (Thakur, Rabenseifner & Gropp 2005) over
    shared memory. Same bits everywhere, either way."""
    views = _views(slots, dtype, 0, count)
    mine_all = [v[slots.rank] for v in views]               # [slot]: this rank's
    nb, me, fold = count * dtype.itemsize, slots.rank, _reducer(slots, op)
    split = to_all and slots.size >= shmcoll.SPLIT_MIN_RANKS and \
        nb >= shmcoll.SPLIT_MIN_BYTES and count >= slots.size and \
        slots.comm._selection.oversubscription() <= shmcoll.SPLIT_MAX_OVERSUBSCRIPTION
    if split:
        q, rem = divmod(count, slots.size)
        bounds = [r * q + min(r, rem) for r in range(slots.size + 1)]
        lo, hi = bounds[me], bounds[me + 1]
        mine = [[x[lo:hi] for x in v] for v in views]       # [slot][rank]: slice me
        theirs = [[(bounds[r], bounds[r + 1], v[r][bounds[r]:bounds[r + 1]]) for r in
                   slots.peers] for v in views]    # [slot]: every owner's slice

    def run(cc, buf, *rest):
        # (cc, recv, op, send) for allreduce, (cc, work, root, op, send) for reduce;
        # send None: IN_PLACE (recv holds the contribution)
        src = rest[-1]
        try:
            p = slots.exchange(cc, nb, mine_all, buf if src is None else src)
        except shmcoll.ByMessages:
            if src is not None:
                buf[...] = src
            elif not to_all and me != root:
                buf = buf.copy()    # a non-root's sendbuf: the algorithms reduce into it
            return by_messages(cc, buf, *rest[:-1])
        v = views[p]
        if split:
            out = buf[lo:hi]
            fold(mine[p], out)
            v[me][lo:hi] = out      # only this rank reads slice me of its slot
            slots.await_reduced(cc, p)
            for a, b, part in theirs[p]:
                buf[a:b] = part
        elif to_all or me == root:
            fold(v, buf)
    return run


def _reduce(slots, dtype, count, root, op, by_messages):
    return _allreduce(slots, dtype, count, root, op, by_messages, to_all=False)


def _allgather(slots, dtype, count, root, op, by_messages):
    views = _views(slots, dtype, 0, count)
    nb, me, peers = count * dtype.itemsize, slots.rank, slots.peers
    mine = [v[me] for v in views]
    lo, hi = me * count, (me + 1) * count

    def run(cc, recv, _count, src):
        try:
            p = slots.exchange(cc, nb, mine, recv[lo:hi] if src is None else src)
        except shmcoll.ByMessages:
            if src is not None:
                recv[lo:hi] = src
            return by_messages(cc, recv, count)
        if src is not None:
            recv[lo:hi] = src
        v = views[p]
        for r in peers:
            recv[r * count:(r + 1) * count] = v[r]
    return run


def _alltoall(slots, dtype, count, root, op, by_messages):
    """Every rank writes its whole send buffer; rank ``r`` then copies block ``r`` of
    every peer's slot (MPICH's and Open MPI's shared-memory all-to-all read the same
    way: the peers' blocks in place, one copy each)."""
    size, me = slots.size, slots.rank
    views = _views(slots, dtype, 0, count * size)           # [slot][rank]: whole buffers
    mine = [v[me] for v in views]
    nb, lo, hi = count * size * dtype.itemsize, me * count, (me + 1) * count
    theirs = [[(r * count, (r + 1) * count, v[r][lo:hi]) for r in slots.peers]
              for v in views]                               # [slot]: block me of each peer

    def run(cc, send, recv, _count):
        try:
            p = slots.exchange(cc, nb, mine, send)
        except shmcoll.ByMessages:
            return by_messages(cc, send, recv, count)
        recv[lo:hi] = send[lo:hi]
        for a, b, block in theirs[p]:
            recv[a:b] = block
    return run


def _reduce_scatter_block(slots, dtype, count, root, op, by_messages):
    me, n = slots.rank, slots.size
    whole = [v[me] for v in _views(slots, dtype, 0, count * n)]
    blocks = _views(slots, dtype, me * count, count)
    nb, fold = count * n * dtype.itemsize, _reducer(slots, op)

    def run(cc, src, out, _op):
        try:
            p = slots.exchange(cc, nb, whole, src)
        except shmcoll.ByMessages:              # IN_PLACE: the result lands on the input
            return by_messages(cc, src.copy() if np.shares_memory(src, out) else src,
                               out, op)
        fold(blocks[p], out)
    return run


def alltoallv(slots):
    """The function running an ``Alltoallv`` through the slots, whatever its counts:
    ``run(cc, send, scounts, sdispls, recv, rcounts, rdispls, by_messages)`` (elements,
    as :func:`pycomm.collectives.alltoall.alltoallv_pairwise` takes them, which
    ``by_messages`` is).

    Each rank writes a table of ``(byte offset, bytes)`` per destination, then its blocks
    for the others back to back; rank ``r`` reads entry ``r`` of each peer's table and
    copies that block. A block's size is checked against the receive count, as a message
    receive checks it, and its datatype against this rank's where bytes move: as for
    messages, a pair that moves nothing may name different datatypes (MPI 4.1, section
    3.3.1), so the headers' check leaves the datatype to this one (they carry 0 bytes).

    Raises (from ``run``):
        TruncationError: a peer's block for this rank differs from ``rcounts``.
        CollectiveMismatchError: a peer's non-empty block is of another datatype.
    """
    size, me, peers, data, headers = slots.size, slots.rank, slots.peers, slots.data, \
        slots.headers
    head = 16 * size                        # the table: int64 offsets, then int64 sizes
    tables = [[d[p][:head].view(np.int64) for d in data] for p in (0, 1)]
    # The layout of the last counts seen, kept with copies of them (a caller may change
    # its lists in place between calls): a program passes the same ones call after call.
    last = [None, None]

    def layout(isz, scounts, sdispls, rcounts, rdispls):
        """(this rank's block copies into its slot as (slot lo, hi, send lo, hi), its
        table, its own block's (send lo, recv lo, bytes), and per peer (rank, bytes
        expected, recv lo))."""
        copies, offsets, sizes, at = [], [], [], head
        for j in range(size):
            n = scounts[j] * isz if j != me else 0
            offsets.append(at)
            sizes.append(n)
            if n:
                lo = sdispls[j] * isz
                copies.append((at, at + n, lo, lo + n))
                at += n
        return (copies, np.array(offsets + sizes, np.int64),
                (sdispls[me] * isz, rdispls[me] * isz, scounts[me] * isz),
                [(s, rcounts[s] * isz, rdispls[s] * isz) for s in peers])

    def run(cc, send, scounts, sdispls, recv, rcounts, rdispls, by_messages):
        isz = send.itemsize
        key = (isz, scounts, sdispls, rcounts, rdispls)
        if last[0] != key:
            last[0] = (isz, list(scounts), list(sdispls), list(rcounts), list(rdispls))
            last[1] = layout(*key)
        copies, table, (own_lo, own_at, own), receives = last[1]
        sb, rb = send.view(np.uint8), recv.view(np.uint8)

        def fill(p):
            area = data[me][p]
            for a, b, lo, hi in copies:
                area[a:b] = sb[lo:hi]
            tables[p][me][:] = table
        try:
            p = slots.exchange(cc, 0, fill=fill)
        except shmcoll.ByMessages:
            return by_messages(cc, send, scounts, sdispls, recv, rcounts, rdispls)
        code = cc.sig[0]
        for s, want, lo in receives:
            entry = tables[p][s]
            n = int(entry[size + me])
            if n and headers[s][p][1] != code:
                slots.mismatch(cc, s, describe((int(headers[s][p][1]),
                                                 int(headers[s][p][2]))))
            if n != want:
                raise TruncationError(
                    f"rank {me}: Alltoallv #{cc.tag}: rank {s} sends this rank {n} bytes, "
                    f"recvcounts[{s}] is {rcounts[s]} elements ({want} bytes); the ranks' "
                    "counts disagree")
            if n:
                at = int(entry[me])
                rb[lo:lo + n] = data[s][p][at:at + n]
        if own:     # (Alltoallv checked that this rank's block to itself fits)
            rb[own_at:own_at + own] = sb[own_lo:own_lo + own]
    return run


_KERNELS = {"barrier": _barrier, "bcast": _bcast, "allreduce": _allreduce,
            "reduce": _reduce, "allgather": _allgather,
            "reduce_scatter_block": _reduce_scatter_block, "alltoall": _alltoall}
