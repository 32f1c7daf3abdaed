"""Large all-reduces, reduce-scatters, all-gathers and broadcasts of one host's ranks by
direct reads of (and, for a two-rank broadcast, writes into) each other's buffers.

On a communicator whose ranks all share one host's shared-memory transport, and where
every rank can read every peer's memory by cross-memory attach (Linux
``process_vm_readv``, probed when the transport connects), a blocking ``Allreduce`` past
what the slots hold and of at least its threshold (:func:`pycomm.plan.direct_threshold`:
256 KiB for an all-reduce; below, a message algorithm's steps cost no more:
benchmarks/README.md, "Large collectives by direct reads", "Where direct reads start")
with a commutative numpy op skips the message layer:

1. Every rank publishes the addresses of its send and receive buffers in its
   shared-memory slot (:mod:`pycomm.shmcoll`: the slot header carries the call's
   signature, so a mismatched call is found here, before anything is read).
2. Reduce-scatter: rank ``i`` owns slice ``i`` of the buffer (``p`` near-equal slices of
   whole elements). It reads slice ``i`` of every peer's send buffer straight out of that
   peer's address space, one copy per peer, in chunks that stay in cache, and reduces
   each chunk into slice ``i`` of its own receive buffer. Then it marks its slice final.
3. All-gather: once every slice is final, rank ``i`` reads slice ``j`` of rank ``j``'s
   receive buffer straight into its own, for every ``j``. Then it marks itself done.
4. No rank returns (and so reuses its buffers) before every peer is done reading them.

Each rank reads ``2 (p - 1) / p`` of the buffer from its peers, as the ring does, but in
three synchronisations instead of the ring's ``2 (p - 1)`` steps, and every byte crosses
by one kernel copy, with no message or ring buffer on the way (the reduction reads each
peer's part into a scratch buffer of at most ``CHUNK_BYTES``, one per communicator). This is the
single-copy intra-node design of Open MPI's ``coll/xhc`` (Katevenis et al., "A framework
for hierarchical single-copy MPI collectives on multicore nodes", IEEE Cluster 2022) and
of the CMA-based collectives of MVAPICH2 (Chakraborty et al., "Contention-aware kernel-
assisted MPI collectives for multi-/many-core systems", IEEE Cluster 2017), reduced to
its flat form: the reduce-scatter + all-gather of Rabenseifner's all-reduce (Thakur,
Rabenseifner & Gropp 2005) with every exchange replaced by a direct read.

The slice rank ``i`` computes is ``x_i op x_{i+1} op ... op x_{p-1} op x_0 op ... op
x_{i-1}`` (its own contribution first, then the peers from the next rank on, so that the
ranks do not all read one peer at once): every rank then holds the same bits, as every
algorithm guarantees, but not necessarily the bits of another algorithm (floating-point
sums depend on their order). Non-commutative ops therefore take the message algorithms.

``Reduce_scatter_block`` is step 2 alone (rank ``i`` reduces block ``i`` of every peer's
input), ``Allgather`` step 3 alone (every rank reads every peer's block), each followed
by step 4; ``Bcast`` reads the root's slices, then every peer's, and on two ranks splits
its one copy between the two (the root writes the tail into its peer, :func:`direct_bcast`);
all under the same threshold, on the whole buffer's bytes, and the
all-gather only up to :data:`ALLGATHER_MAX_BYTES` (it moves what recursive doubling
moves, by the same single copies, so only the saved steps tell: from a few MiB on 8
ranks, the message algorithms were as fast or faster).

A rank whose call fails after it published its addresses (a timeout, a dead peer, an
interrupt) withdraws them before it returns (its progress word says so), and every read
is checked against that word after it completes: a peer that read a buffer its owner
may already have reused raises instead of returning what it read (as the rendezvous
protocol's validity words do, :meth:`transports.shm.ShmTransport.read_remote`). A write
cannot be checked after the fact, so the broadcast's root checks the word before each
chunk it writes, and a peer whose call fails waits out a write in flight before it gives
its buffer back (:meth:`_Reads.withdraw`).

Failures: a peer whose process is gone makes the read fail (``ESRCH``), a
:class:`~pycomm.errors.PeerError` naming it; every wait is the engine's, so an abandoned
call, a departed peer and ``PYCOMM_TIMEOUT`` end it as they end a message wait. A peer
that enters the call by messages (its ``Iallreduce``) is seen at step 1, before anything
is read or written, and every rank then runs the message algorithm instead.
"""

from __future__ import annotations

import time

import numpy as np

from transports import PeerLostError, TransportError

from .errors import CollectiveError, CommError, PeerError, add_note
from .shmcoll import ByMessages

__all__ = ["ALLGATHER_MAX_BYTES", "CHUNK_BYTES", "SHM_DIRECT", "direct_allgather",
           "direct_allreduce", "direct_bcast", "direct_reduce_scatter_block", "usable"]

SHM_DIRECT = "shm_direct"       # the algorithm name of a call through this module
_PATH = 1                       # the slot header's path word of a direct call (shmcoll)
ALLGATHER_MAX_BYTES = 1 << 20   # the largest all-gather (whole buffer) read directly
_WITHDRAWN = 1                  # the progress word's step of a rank whose call failed
# bytes read from one peer before they are reduced: fewer, longer reads and ufunc calls
# beat cache-sized ones here (benchmarks/README.md, "Large collectives by direct reads")
CHUNK_BYTES = 4 << 20
# how long a rank whose call failed waits for a peer's write into its buffer to end
WRITER_GRACE_S = 1.0
_perf, _sleep = time.perf_counter, time.sleep


def usable(slots) -> bool:
    """Whether every peer of ``slots``' communicator can be read by cross-memory attach
    (and a slot holds the three words a rank publishes)."""
    shm, world = slots.shm, slots.comm._world
    return slots.limit >= 24 and all(shm.can_read(world[r]) for r in slots.peers)


def _bounds(count: int, size: int) -> list[int]:
    """Element offsets of the ``size`` near-equal slices of ``count`` elements."""
    q, rem = divmod(count, size)
    out = [0]
    for r in range(size):
        out.append(out[-1] + q + (r < rem))
    return out


class _Reads:
    """What the kernels of one communicator share: the words each rank publishes in its
    slot (two addresses and its progress), the order it reads its peers in, a scratch
    buffer, reads and waits."""

    def __init__(self, slots):
        self.slots, self.shm = slots, slots.shm
        self.me, self.peers = slots.rank, slots.peers
        # the order this rank reads its peers in: from the next rank on, so that the ranks
        # do not all read one peer at once (each read locks the owner's memory map)
        self.order = [(self.me + k) % slots.size for k in range(1, slots.size)]
        self.world = slots.comm._world
        # [slot][rank] -> int64[3]: send address, receive address, progress (seq << 2 | step)
        self.words = [[d[p][:24].view(np.int64) for d in slots.data] for p in (0, 1)]
        self._mine = [w[self.me] for w in self.words]     # [slot]: this rank's words
        self._spare = np.empty(0, np.uint8)
        self.kept: list = []        # buffers a peer may still write (see withdraw)

    def scratch(self, dtype, elements: int) -> np.ndarray:
        """The reads' scratch buffer, as ``elements`` (at most a chunk) of ``dtype``; one
        per communicator, grown when a call needs more (its calls run one at a time), so
        that no call shape keeps a buffer of its own."""
        nbytes = max(1, elements) * dtype.itemsize
        if self._spare.nbytes < nbytes:
            self._spare = np.empty(nbytes, np.uint8)
        return self._spare[:nbytes].view(dtype)

    def publish(self, cc, nbytes: int, send_at: int, recv_at: int):
        """Publish this rank's addresses for call ``cc`` and wait for every peer's header
        (checking its signature); return the slot's words.

        Raises:
            ByMessages: a peer runs this call by messages (nothing has been read).
        """
        p = self.slots.exchange(cc, nbytes, self._mine,
                                np.array([send_at, recv_at, cc.tag << 2], np.int64), _PATH)
        return self.words[p]

    def withdraw(self, cc, w, writer: int | None = None, buf=None) -> bool:
        """Say that this rank's call failed: its buffers may be reused from now on.

        ``writer``: a peer that may be writing into ``buf`` (:meth:`write`, which checks
        before each chunk that this rank has not withdrawn). A write in flight is waited
        out (a chunk takes milliseconds) for at most :data:`WRITER_GRACE_S` while the
        writer's process lives. Returns False when the writer may still write a chunk
        (it was stopped or descheduled for longer): ``buf`` is then kept referenced for
        the rest of the process, so that such a write never lands in memory given to
        another object, and the caller tells the user.
        """
        w[self.me][2] = cc.tag << 2 | _WITHDRAWN
        self.slots.ring_peers()
        if writer is None:
            return True
        # the writer's word stays at step 0 while it may write; 3 or withdrawn after
        busy, peer = cc.tag << 2, self.world[writer]
        end = _perf() + WRITER_GRACE_S
        while w[writer][2] == busy and self.shm.cma.alive(peer):
            if _perf() >= end:
                self.kept.append(buf)
                return False
            _sleep(1e-4)
        return True

    def write(self, cc, w, r: int, local: int, remote: int, n: int) -> None:
        """Copy ``n`` bytes at ``local`` in this rank's memory to ``remote`` in rank ``r``'s
        (its receive buffer, published for this call), a chunk at a time, stopping at the
        first chunk after ``r`` has withdrawn its buffers (see :meth:`withdraw`).

        Raises:
            PeerError: rank ``r``'s process is gone.
            CollectiveError: ``r``'s call failed.
            CommError: the write failed otherwise.
        """
        for start in range(0, n, CHUNK_BYTES):
            self._check_withdrawn(cc, w, r)
            m = min(CHUNK_BYTES, n - start)
            self._copy(cc, w, r, "writes", m, self.shm.cma.write_live, local + start,
                       remote + start)

    def read(self, cc, w, r: int, local: int, remote: int, n: int) -> None:
        """Copy ``n`` bytes at ``remote`` in rank ``r``'s memory to ``local`` in this one's,
        and check that ``r`` had not withdrawn its buffers when the copy ended.

        Raises:
            PeerError: rank ``r``'s process is gone.
            CollectiveError: ``r``'s call failed (what was read may be stale).
            CommError: the read failed otherwise.
        """
        self._copy(cc, w, r, "reads", n, self.shm.cma.read_live, remote, local)
        self._check_withdrawn(cc, w, r)

    def _copy(self, cc, w, r: int, verb: str, n: int, copy, first: int, second: int) -> None:
        """``copy(rank r, first, second, n)`` (a read or a write of rank ``r``'s buffer),
        its failures as the errors :meth:`read` and :meth:`write` list."""
        try:
            copy(self.world[r], first, second, n)
        except PeerLostError as exc:
            raise PeerError(f"rank {self.me}: rank {r}'s process is gone while this rank "
                            f"{verb} its buffer ({exc})", self.world[r]) from None
        except TransportError as exc:
            self._check_withdrawn(cc, w, r)
            raise CommError(f"rank {self.me}: {n} bytes of rank {r}'s buffer: this rank's "
                            f"{verb[:-1]} failed: {exc}") from None

    def _check_withdrawn(self, cc, w, r: int) -> None:
        if w[r][2] == cc.tag << 2 | _WITHDRAWN:
            raise CollectiveError(f"rank {self.me}: call #{cc.tag} failed on rank {r}, "
                                  "which withdrew its buffers while this rank read them")

    def step(self, cc, w, step: int, last: int = 3) -> None:
        """Say that this rank has finished ``step`` of call ``cc`` and wait until every
        peer has (a peer's word may already show a later step, up to ``last``; it stays
        at ``last`` until the call after next reuses the slot, which waits for this
        rank)."""
        seq = cc.tag
        value = seq << 2 | step
        w[self.me][2] = value
        self.slots.ring_peers()
        done = {seq << 2 | s for s in range(step, last + 1)} | {seq << 2 | _WITHDRAWN}
        for r in self.peers:
            word = w[r]
            if word[2] not in done:
                self.slots._wait(cc, r, lambda word=word: word[2] in done)
            self._check_withdrawn(cc, w, r)


def _reads(slots) -> _Reads:
    """The :class:`_Reads` of ``slots``' communicator, made once."""
    reads = getattr(slots, "direct_reads", None)
    if reads is None:
        reads = slots.direct_reads = _Reads(slots)
    return reads


def _reduce_into(reads, cc, w, out: np.ndarray, offset: int, op, scratch) -> None:
    """``out = out op (every peer's elements at its send address + offset)``, chunk by chunk
    (a chunk of every peer, each read once into ``scratch`` and reduced at once; chunks of
    :data:`CHUNK_BYTES` measured faster than cache-sized ones, benchmarks/README.md)."""
    ufunc, chunk = op._ufunc, scratch.size
    item = out.itemsize
    scratch_at = scratch.ctypes.data
    for start in range(0, out.size, chunk):
        n = min(chunk, out.size - start)
        part = out[start:start + n]
        for r in reads.order:
            reads.read(cc, w, r, scratch_at, int(w[r][0]) + offset + start * item, n * item)
            ufunc(part, scratch[:n], out=part)


def _chunk(dtype, elements: int) -> int:
    """Elements read from one peer at a time: at most ``CHUNK_BYTES``."""
    return max(1, min(CHUNK_BYTES // dtype.itemsize, elements))


def direct_allreduce(slots, dtype, count: int, op, by_messages):
    """The kernel that runs one all-reduce shape by direct reads (see the module docstring).

    Args:
        slots: the communicator's :class:`pycomm.shmcoll.SharedSlots`.
        dtype: numpy dtype of the elements.
        count: elements of the buffer.
        op: a commutative :class:`pycomm.ops.Op` with a numpy ufunc.
        by_messages: the message algorithm's function, run instead when a peer takes
            messages.

    Returns:
        ``run(cc, recv, op, send)``, called as the slot kernels are (``send`` None:
        ``IN_PLACE``).
    """
    reads = _reads(slots)
    me, order = reads.me, reads.order
    item = dtype.itemsize
    bounds = _bounds(count, slots.size)
    lo, hi = bounds[me], bounds[me + 1]
    chunk = _chunk(dtype, hi - lo)
    nbytes = count * item

    def run(cc, recv, _op, send):
        src = recv if send is None else send
        try:
            w = reads.publish(cc, nbytes, src.ctypes.data, recv.ctypes.data)
        except ByMessages:
            if send is not None:
                recv[...] = send
            return by_messages(cc, recv, op)
        try:
            # reduce-scatter: this rank's slice, its own contribution first, then the
            # peers from the next rank on
            out = recv[lo:hi]
            if send is not None:
                out[...] = send[lo:hi]
            _reduce_into(reads, cc, w, out, lo * item, op, reads.scratch(dtype, chunk))
            reads.step(cc, w, 2)
            # all-gather: every peer's final slice, straight into this rank's buffer
            base = recv.ctypes.data
            for r in order:
                a, b = bounds[r] * item, bounds[r + 1] * item
                if b > a:
                    reads.read(cc, w, r, base + a, int(w[r][1]) + a, b - a)
            reads.step(cc, w, 3)   # no peer reads this rank's buffers any more
        except BaseException:
            reads.withdraw(cc, w)
            raise
    return run


def direct_reduce_scatter_block(slots, dtype, count: int, op, by_messages):
    """The kernel of one ``Reduce_scatter_block`` shape by direct reads: rank ``i`` reduces
    block ``i`` of every peer's input (its own first, then the peers from rank ``i + 1``
    on), then waits
    until no peer reads its input any more.

    Args:
        count: elements of one rank's block (the input holds ``size`` blocks).
        slots, dtype, op, by_messages: as :func:`direct_allreduce`.

    Returns:
        ``run(cc, src, out, op)``, as the slot kernel is called (``IN_PLACE``: ``out`` is
        the start of ``src``).
    """
    reads = _reads(slots)
    me = reads.me
    item = dtype.itemsize
    chunk = _chunk(dtype, count)
    nbytes = count * slots.size * item

    def run(cc, src, out, _op):
        try:
            w = reads.publish(cc, nbytes, src.ctypes.data, 0)
        except ByMessages:              # IN_PLACE: the result lands on the input
            return by_messages(cc, src.copy() if np.shares_memory(src, out) else src,
                               out, op)
        try:
            # where out overlaps the input the peers read, the result waits in a copy
            overlap = np.shares_memory(src, out)
            if overlap:
                target = src[me * count:(me + 1) * count].copy()
            else:
                target = out
                target[...] = src[me * count:(me + 1) * count]
            _reduce_into(reads, cc, w, target, me * count * item, op,
                         reads.scratch(dtype, chunk))
            reads.step(cc, w, 3)      # no peer reads this rank's input any more
        except BaseException:
            reads.withdraw(cc, w)
            raise
        if overlap:
            out[...] = target
    return run


def direct_allgather(slots, dtype, count: int, by_messages):
    """The kernel of one ``Allgather`` shape by direct reads: every rank reads every
    peer's block straight into its receive buffer, then waits until no peer reads its
    block any more.

    Args:
        count: elements of one rank's block.
        slots, dtype, by_messages: as :func:`direct_allreduce`.

    Returns:
        ``run(cc, recv, count, src)``, as the slot kernel is called (``src`` None:
        ``IN_PLACE``, the block already in place in ``recv``).
    """
    reads = _reads(slots)
    me, order = reads.me, reads.order
    block = count * dtype.itemsize
    nbytes = block * slots.size

    def run(cc, recv, _count, src):
        mine = recv[me * count:(me + 1) * count] if src is None else src
        try:
            w = reads.publish(cc, nbytes, mine.ctypes.data, 0)
        except ByMessages:
            if src is not None:
                recv[me * count:(me + 1) * count] = src
            return by_messages(cc, recv, count)
        try:
            if src is not None:
                recv[me * count:(me + 1) * count] = src
            base = recv.ctypes.data
            for r in order:
                if block:
                    reads.read(cc, w, r, base + r * block, int(w[r][0]), block)
            reads.step(cc, w, 3)      # no peer reads this rank's block any more
        except BaseException:
            reads.withdraw(cc, w)
            raise
    return run


def direct_bcast(slots, dtype, count: int, root: int, by_messages):
    """The kernel of one ``Bcast`` shape by direct copies between the ranks' buffers.

    On two ranks both copy at once: the other rank reads the head of the root's buffer
    while the root writes the tail into the other's (``process_vm_writev``), so the two
    cores each copy half where one rank's read of the whole left the root's core idle.
    On more, van de Geijn's scatter + all-gather broadcast (Barnett et al.,
    "Interprocessor collective communication library (InterCom)", SHPCC 1994; MPICH's
    ``MPIR_Bcast_intra_scatter_ring_allgather``, Thakur, Rabenseifner & Gropp 2005) with
    every message replaced by a direct read: non-root rank ``i`` first reads slice ``i``
    of the root's buffer (``p`` near-equal slices of whole elements), then, once every
    slice has landed, slice ``j`` from rank ``j`` for every other ``j`` (the root's slice
    from the root). The root serves about ``2 (p - 1) / p`` of its buffer, not ``p - 1``
    copies of it: ranks reading one process at once contend on its memory map's lock
    (see :class:`_Reads`). No rank returns before every peer has finished with it (read
    its buffer, or written into it).

    Args:
        count: elements of the buffer.
        root: the broadcasting rank.
        slots, dtype, by_messages: as :func:`direct_allreduce`.

    Returns:
        ``run(cc, buf, root)``, as the slot kernel is called.
    """
    reads = _reads(slots)
    me, size = reads.me, slots.size
    item = dtype.itemsize
    nbytes = count * item
    bounds = _bounds(count, size)
    # the slice this rank reads from the root first, then every other slice from its
    # owner, from the next rank on (so that the ranks do not all read one peer at once)
    a, b = bounds[me] * item, bounds[me + 1] * item
    others = [(me + k) % size for k in range(1, size)]
    head = (count // 2) * item      # two ranks: read by the other rank; the rest written
    other = 1 - me

    def run(cc, buf, _root):
        at = buf.ctypes.data
        try:
            w = reads.publish(cc, nbytes, at, 0)
        except ByMessages:
            return by_messages(cc, buf, root)
        try:
            if size == 2:
                if me != root:
                    reads.read(cc, w, root, at, int(w[root][0]), head)
                elif nbytes > head:
                    reads.write(cc, w, other, at + head, int(w[other][0]) + head,
                                nbytes - head)
            elif me != root:        # (the root reads nothing: its step 3 counts as 2)
                if b > a:
                    reads.read(cc, w, root, at + a, int(w[root][0]) + a, b - a)
                reads.step(cc, w, 2)
                for r in others:
                    lo, hi = bounds[r] * item, bounds[r + 1] * item
                    if hi > lo:
                        reads.read(cc, w, r, at + lo, int(w[r][0]) + lo, hi - lo)
            reads.step(cc, w, 3)      # no peer reads (or writes) this rank's buffer now
        except BaseException as exc:
            if size == 2 and me != root:
                if not reads.withdraw(cc, w, root, buf):
                    add_note(exc, f"rank {me}: rank {root} (the root) was still writing "
                             f"into this Bcast's buffer of {nbytes} bytes {WRITER_GRACE_S} s "
                             "after the call failed, and may write one more chunk of it (at "
                             f"most {CHUNK_BYTES} bytes) when it runs again: do not reuse "
                             "this buffer")
            else:
                reads.withdraw(cc, w)
            raise
    return run
