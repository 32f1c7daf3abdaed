"""Large all-reduces of one host's ranks by direct reads of each other's buffers.

On a communicator whose ranks all share one host's shared-memory transport, and where
every rank can read every peer's memory by cross-memory attach (Linux
``process_vm_readv``, probed when the transport connects), a blocking ``Allreduce`` of at
least ``PYCOMM_SHM_DIRECT_BYTES`` (128 KiB; below, a message algorithm's fewer, cheaper
steps win: benchmarks/README.md) with a commutative numpy op skips the message layer:

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
by one kernel copy, with no message, ring buffer or scratch on the way. This is the
single-copy intra-node design of Open MPI's ``coll/xhc`` (Katevenis et al., "A framework
for hierarchical single-copy MPI collectives on multicore nodes", IEEE Cluster 2022) and
of the CMA-based collectives of MVAPICH2 (Chakraborty et al., "Contention-aware kernel-
assisted MPI collectives for multi-/many-core systems", IEEE Cluster 2017), reduced to
its flat form: the reduce-scatter + all-gather of Rabenseifner's all-reduce (Thakur,
Rabenseifner & Gropp 2005) with every exchange replaced by a direct read.

The slice rank ``i`` computes is ``x_i op x_0 op ... op x_{p-1}`` (its own contribution
first, then the peers in rank order): every rank then holds the same bits, as every
algorithm guarantees, but not necessarily the bits of another algorithm (floating-point
sums depend on their order). Non-commutative ops therefore take the message algorithms.

Failures: a peer whose process is gone makes the read fail (``ESRCH``), a
:class:`~pycomm.errors.PeerError` naming it; every wait is the engine's, so an abandoned
call, a departed peer and ``PYCOMM_TIMEOUT`` end it as they end a message wait. A peer
that enters the call by messages (its ``Iallreduce``) is seen at step 1, before anything
is read or written, and every rank then runs the message algorithm instead.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from transports.linux import copy_remote

from .errors import CommError, PeerError
from .shmcoll import ByMessages

__all__ = ["CHUNK_BYTES", "SHM_DIRECT", "direct_allreduce", "usable"]

SHM_DIRECT = "shm_direct"       # the algorithm name of a call through this module
CHUNK_BYTES = 256 << 10         # bytes read from one peer before they are reduced


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
    me, size, peers = slots.rank, slots.size, slots.peers
    shm, world = slots.shm, slots.comm._world
    pids = {r: shm._pids[world[r]] for r in peers}
    item = dtype.itemsize
    bounds = _bounds(count, size)
    lo, hi = bounds[me], bounds[me + 1]
    ufunc = op._ufunc
    chunk = max(1, CHUNK_BYTES // item)
    scratch = np.empty(min(chunk, max(hi - lo, 1)), dtype)
    scratch_at = scratch.ctypes.data
    words = [[d[p][:24].view(np.int64) for d in slots.data] for p in (0, 1)]
    bells = slots._bells
    nbytes = count * item

    def read(r: int, local: int, remote: int, n: int) -> None:
        err = copy_remote(False, pids[r], [(local, n)], [(remote, n)])
        if err == errno.ESRCH:
            raise PeerError(f"rank {me}: rank {r}'s process is gone (process_vm_readv: "
                            "ESRCH) while this rank reads its buffer", world[r])
        if err:
            raise CommError(f"rank {me}: reading {n} bytes of rank {r}'s buffer failed "
                            f"({os.strerror(err)})")

    def mark(w, value: int) -> None:
        w[me][2] = value
        for ring in bells:
            ring()

    def wait_all(cc, w, value: int, later: int) -> None:
        """Wait until every peer's word is ``value`` (or ``later``, the next step's)."""
        for r in peers:
            word = w[r]
            v = word[2]
            if v != value and v != later:
                slots._wait(cc, r, lambda word=word: word[2] in (value, later))

    def run(cc, recv, _op, send):
        seq = cc.tag
        try:
            p = slots.reserve(cc)
            w = words[p]
            mine = w[me]
            src = recv if send is None else send
            mine[0] = src.ctypes.data
            mine[1] = recv.ctypes.data
            mine[2] = seq << 2
            slots.announce(cc, p, nbytes)
            slots.await_all(cc, p)
        except ByMessages:
            if send is not None:
                recv[...] = send
            return by_messages(cc, recv, op)
        # reduce-scatter: this rank's slice, its own contribution first, peers in rank order
        out = recv[lo:hi]
        if send is not None:
            out[...] = send[lo:hi]
        for start in range(0, hi - lo, chunk):
            n = min(chunk, hi - lo - start)
            part = out[start:start + n]
            at = (lo + start) * item
            for r in peers:
                read(r, scratch_at, int(w[r][0]) + at, n * item)
                ufunc(part, scratch[:n], out=part)
        mark(w, seq << 2 | 2)
        wait_all(cc, w, seq << 2 | 2, seq << 2 | 3)
        # all-gather: every peer's final slice, straight into this rank's buffer
        base = recv.ctypes.data
        for r in peers:
            a, b = bounds[r] * item, bounds[r + 1] * item
            if b > a:
                read(r, base + a, int(w[r][1]) + a, b - a)
        mark(w, seq << 2 | 3)
        # no peer reads this rank's buffers any more (a peer's word stays at this value
        # until the call after next reuses the slot, which waits for this rank)
        wait_all(cc, w, seq << 2 | 3, seq << 2 | 3)
    return run

