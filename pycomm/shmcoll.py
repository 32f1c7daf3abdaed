"""Small collectives through shared-memory slots: one store per rank, no messages.

On a communicator whose ranks all share one host's shared-memory transport, a collective
call whose per-rank data fits a slot (``PYCOMM_SHM_COLL_BYTES``, default 64 KiB) skips
the message layer. Each rank writes its contribution, with a header naming the call, into
its own slot in its own segment (:mod:`transports.shm` reserves the area); every rank
then reads its peers' slots in place and computes its result from them. An 8-byte
all-reduce on 2 ranks becomes one copy in, one flag store, one flag load and one ufunc
reading the peer's slot directly, where the message path builds, frames, matches and
copies a message each way.

This is the flag-based shared-memory collective design of MPICH's CH4 POSIX collectives
(``src/mpid/ch4/shm/posix/release_gather``) and Open MPI's ``coll/sm`` (Graham & Shipman,
"MPI Support for Multi-core Architectures: Optimized Shared Memory Collectives",
EuroPVM/MPI 2008), reduced to its flat form: every rank reads every peer's slot in one
step, where a tree adds a step, and a wake-up, per level; the ranks of one host and at
most 64 KiB each keep those reads small (benchmarks/README.md, "Slots of 64 KiB"). A
communicator's block of every member's area is reserved in /dev/shm when its slots are set
up (:func:`slots_for`), before any rank touches it: a full /dev/shm would otherwise kill
the first rank that touched a new page, reader or writer, with SIGBUS
(:mod:`transports.shmring`, "Room"). A rank that finds no room runs the communicator's
calls by messages and marks so in its segment's control words; its peers see the mark
where they would wait for it and take messages too (:func:`_give_up`).

Layout. The area holds :data:`MAX_COMMS` communicator blocks. A communicator uses the
same block in every member's area, agreed at its creation and given back, once every
member has freed it, for a later communicator (:mod:`pycomm.slotblocks`); one created
while all are taken uses messages::

    +------------------------+----------------------------+----------------------------+
    | arrival (int64, 64 B)  | slot 0: header 64 B | data | slot 1: header 64 B | data |
    +------------------------+----------------------------+----------------------------+

``arrival`` is ``seq << 2 | 2 | slow`` of the last collective call this rank entered on
the communicator (``slow``: by messages); a slot header is ``[seq + 1, signature code,
signature count, nbytes, path, reduced]`` (``path``: 0 for these slots, 1 for
:mod:`pycomm.shmdirect`, which publishes addresses, not data, in the slot; ``reduced``:
``seq + 1`` once a split all-reduce has written its slice of the result, see
:mod:`pycomm.slotkernels`, where each collective's kernel on these slots is), the
sequence number stored last. Call ``seq`` uses slot ``(seq + 1) & 1``.

Safety. A rank overwrites its slot ``p`` only once every peer has entered call
``seq - 1`` or later (their ``arrival``): by then each has finished the earlier call that
used ``p``, so no reader is left. A header is read only after its sequence number, and a
slot is not rewritten while a reader may still need it, so the data read is whole.

Integrity (issue 15). Every rank waits for every peer's header of the call and compares
its signature with its own before it reads any data, so two ranks in different
collectives, with different counts, dtypes, roots or ops, raise
:class:`~pycomm.errors.CollectiveMismatchError` on the ranks that see it and abandon the
call on all (the root of a broadcast waits for its peers' headers too: a rank that took
itself for another root is found). Waiting drives the engine, so an abandoned call, a
dead or departed peer and the timeout end it as they end a message wait.

A peer that runs the call by messages (its nonblocking variant, which pycomm lets match
the blocking call, or a count past the limit on that rank only) never writes its header;
its ``arrival`` word shows it in this call, or past it, without one. Every rank waiting
for that header sees this and runs the call's message algorithm instead, from the same
inputs (nothing has been written yet), so the call completes or, if the ranks' arguments
differ, fails with the message path's own mismatch checks.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import numpy as np

from transports.linux import futex_wake
from transports.shmring import ShmSpaceError

from . import trace as _trace
from .errors import CollectiveMismatchError, PeerError
from .signature import describe, empty_match
from .waiting import SHARED_WAIT

__all__ = ["MAX_COMMS", "NO_SLOTS", "SPLIT_MAX_OVERSUBSCRIPTION", "SPLIT_MIN_BYTES",
           "SPLIT_MIN_RANKS", "ByMessages", "SharedSlots", "area_bytes", "block_layout",
           "clear_block", "host_shm", "slots_for"]

MAX_COMMS = 64          # communicator blocks per rank's area (pycomm.slotblocks hands them out)
# the control word (transports.shm.ShmTransport.control_words) whose bit b says that a
# rank runs the collectives of block b's communicator by messages (_give_up)
NO_SLOTS = 2
_HDR = 64               # bytes of the arrival word's line and of each slot header
_SEQ_MASK = 0x7FFFFFFF  # the communicator's sequence numbers wrap at 2**31
_HALF = 1 << 30
_SPIN = 64              # polls of a peer's header between clock reads
_perf = time.perf_counter
_sched_yield = getattr(os, "sched_yield", lambda: None)
_DEPARTED_S = 0.25      # a departed peer is reported after this (the engine's liveness tick)
SPLIT_MIN_BYTES, SPLIT_MIN_RANKS = 16 << 10, 4   # from here a split all-reduce (_allreduce)
SPLIT_MAX_OVERSUBSCRIPTION = 1.0    # ranks per core: past it, its second wait costs more


class ByMessages(Exception):
    """A peer runs this call by messages: so must this rank (caught by the kernels)."""


def _round(slot_bytes: int) -> int:
    return (max(0, int(slot_bytes)) + 63) // 64 * 64


def _block_bytes(slot_bytes: int) -> int:
    return _HDR + 2 * (_HDR + _round(slot_bytes))


def area_bytes(slot_bytes: int) -> int:
    """Bytes of one rank's area for slots of ``slot_bytes`` data bytes (0: no area)."""
    return MAX_COMMS * _block_bytes(slot_bytes) if slot_bytes > 0 else 0


def slots_for(comm):
    """The :class:`SharedSlots` of ``comm``, or None when its calls must use messages:
    not every rank on this host's shared-memory transport, no block of the area left for
    it (more than :data:`MAX_COMMS` communicators alive: :mod:`pycomm.slotblocks`), a
    world of one, or no area (``PYCOMM_SHM_COLL_BYTES=0``).

    The answer depends only on what every member agrees on (its block, its members, the
    transports chosen at start-up), so all members decide alike.

    Where /dev/shm has no room for the communicator's slots (they are reserved before any
    rank touches them: :mod:`transports.shmring`), None, and the communicator's calls go
    by messages on every rank (:func:`_give_up`).
    """
    if comm._cctx != 3 * comm._cid + 1 or comm._block < 0:
        return None
    shm = host_shm(comm)
    if shm is None:
        return None
    try:
        return SharedSlots(comm, shm)
    except ShmSpaceError as exc:
        _give_up(comm, shm, comm._world[comm.rank], exc)
        return None


def host_shm(comm):
    """The shared-memory transport that links this rank to every other member of
    ``comm``, where it has a collective area; None where there is none (a world of one,
    a member on another host or over another transport, ``PYCOMM_SHM_COLL_BYTES=0``)."""
    if comm.size < 2:
        return None
    layout = getattr(comm, "host_layout", None)
    if layout is not None and layout.nhosts > 1:    # (a test may fake several hosts)
        return None
    eng = comm._engine
    me = comm._world[comm.rank]
    shm = None
    for w in comm._world:
        if w == me:
            continue
        t = eng.route[w]
        if t is None or getattr(t, "name", None) != "shm" or (shm is not None and t is not shm):
            return None
        shm = t
    return shm if shm is not None and shm.coll_bytes else None


def block_layout(shm) -> tuple[int, int]:
    """``(slot, block)``: the data bytes of each of a block's two slots and the bytes of a
    block, in ``shm``'s collective area (:data:`MAX_COMMS` blocks)."""
    slot = (shm.coll_bytes // MAX_COMMS - 3 * _HDR) // 2 // 64 * 64
    return slot, _block_bytes(slot)


def clear_block(shm, rank: int, block: int) -> None:
    """Zero the arrival word and the slot headers of ``block`` in ``rank``'s area (this
    rank's own), so that a communicator given the block later finds it as new
    (:mod:`pycomm.slotblocks`); its data needs no clearing (a header says what is
    valid)."""
    area = shm.coll_area(rank)
    slot, nbytes = block_layout(shm)
    base = block * nbytes
    for at in (base, base + _HDR, base + 2 * _HDR + slot):
        area[at:at + _HDR] = bytes(_HDR)


_noted_no_room = [False]    # the note below is printed once per process


def _give_up(comm, shm, me: int, exc: ShmSpaceError) -> None:
    """Mark ``comm`` as run by messages on this rank, which found no room for its slots.

    The mark is a bit of this rank's control words (always reserved): a peer whose own
    reservation succeeded, waiting for this rank's header or its entry, sees it and runs
    the call by messages too (:class:`ByMessages`); a peer that found no room marks its
    own. So the members agree call by call, whatever each found. The doorbells wake a peer
    already asleep waiting. Said once per process, on stderr."""
    words = shm.control_words(me)
    words[NO_SLOTS] |= 1 << comm._block
    _ring(shm.doorbell_words([w for w in comm._world if w != me]))
    if not _noted_no_room[0]:
        _noted_no_room[0] = True
        print(f"pycomm: rank {comm.rank}: {str(exc).rstrip('.')}. {comm.name}'s collective "
              "calls go by messages instead (slower for small calls), as will those of any "
              "later communicator that finds no room.", file=sys.stderr, flush=True)


def _ring(bells: list) -> None:
    """Ring every doorbell of ``bells`` (``(words, futex)`` pairs, see
    :meth:`transports.shm.ShmTransport.doorbell_words`)."""
    for words, futex in bells:
        words[0] = (words[0] + 1) & 0xFFFFFFFF
        if words[1]:
            futex_wake(futex)


class SharedSlots:
    """One communicator's view of its members' slot blocks (see the module docstring).

    Attributes:
        limit: the most data bytes one rank may put in its slot in a call.
    """

    def __init__(self, comm, shm):
        self.comm, self.shm, self.engine = comm, shm, comm._engine
        self.size, self.rank = comm.size, comm.rank
        slot, block = block_layout(shm)
        self.limit = slot
        base = comm._block * block
        reserve = (base, block, f"the collective slots of {comm.name} (block "
                   f"{comm._block})")
        self.arrival, self.headers, self.data = [], [], []
        for w in comm._world:
            area = shm.coll_area(w, reserve)
            self.arrival.append(area[base:base + 8].cast("q"))
            hs, ds = [], []
            for p in (0, 1):
                at = base + _HDR + p * (_HDR + slot)
                hs.append(area[at:at + 48].cast("q"))
                ds.append(np.frombuffer(area, np.uint8, slot, at + _HDR))
            self.headers.append(hs)
            self.data.append(ds)
        self.peers = [r for r in range(self.size) if r != self.rank]
        # [rank]: its control words; bit ``self._bit`` of word 2: it gave up these slots
        self._control = [shm.control_words(w) for w in comm._world]
        self._bit = 1 << comm._block
        self._bell_words = shm.doorbell_words([comm._world[r] for r in self.peers])
        self._written = [False, False]
        self._synced = -1               # the last call whose every header this rank saw
        # Where ranks outnumber cores (the engine then yields while it waits), the peer a
        # rank waits for may need this very core: poll a few times, then yield at once
        # (benchmarks/README.md, "Measurements behind design choices in the code").
        self._polls = 4 if self.engine.yield_s > 0 else _SPIN

    # -- arrival ------------------------------------------------------------------------
    def enter(self, seq: int, slow: bool) -> None:
        """Say that this rank entered call ``seq`` (``slow``: by messages).

        A call by messages rings the peers' doorbells: a peer asleep waiting for this
        rank's header learns that it will not come, where it would otherwise learn only at
        the engine's next liveness check (benchmarks/README.md, "Measurements behind
        design choices in the code"). A slot call rings them when it publishes its header
        (see :meth:`exchange`)."""
        self.arrival[self.rank][0] = seq << 2 | 2 | slow
        if slow:
            self.ring_peers()

    def ring_peers(self) -> None:
        """Ring every peer's doorbell: one asleep waiting for something this rank wrote
        outside the rings wakes up."""
        _ring(self._bell_words)

    # -- the steps of every call --------------------------------------------------------
    def exchange(self, cc, nbytes: int, dst=None, src=None, path: int = 0,
                 fill=None) -> int:
        """Run call ``cc.tag``'s turn through the slots: take its slot ``p``, copy ``src``
        into ``dst[p]`` (when ``src`` is given; else call ``fill(p)``, when given, to
        write the slot), publish this rank's header and wait for every peer's, checking
        their signatures; return ``p``. ``nbytes``: the call's bytes in the header;
        ``path``: 0 for a slot call, 1 for a direct one (see the module docstring).

        Slot ``p`` is rewritten only once every peer has entered the previous call: each
        has then finished the earlier call that used it (the module docstring's Safety).
        The header's sequence number is stored last: it makes the slot valid.

        Raises:
            CollectiveMismatchError: a peer is in another call (its signature differs).
            ByMessages: a peer runs this call by messages, or by another ``path`` (slots
                against direct reads: the ranks' limits differ), which takes messages too.
            PeerError, CommTimeoutError, CollectiveError: as any wait of the engine.
        """
        seq = cc.tag
        p = (seq + 1) & 1
        peers = self.peers
        # (after an all-waiting call on seq - 1, every peer is known to have entered it)
        if self._written[p] and self._synced != (seq - 1) & _SEQ_MASK:
            need = (seq - 1) & _SEQ_MASK
            arrival = self.arrival
            for r in peers:
                a = arrival[r][0]
                if not (a & 2 and ((a >> 2) - need) & _SEQ_MASK < _HALF):
                    self._wait_entered(cc, r, need)
        self._written[p] = True
        if src is not None:
            dst[p][...] = src
        elif fill is not None:
            fill(p)
        headers = self.headers
        h = headers[self.rank][p]
        sig = cc.sig
        code, count = sig
        s1 = seq + 1
        h[1] = code
        h[2] = count
        h[3] = nbytes
        h[4] = path
        h[0] = s1
        for words, futex in self._bell_words:   # (ring_peers inline: every call rings)
            words[0] = (words[0] + 1) & 0xFFFFFFFF
            if words[1]:
                futex_wake(futex)
        for r in peers:
            h = headers[r][p]
            if h[0] != s1:
                for _ in range(self._polls):
                    if h[0] == s1:
                        break
                else:
                    self._wait_slot(cc, r, h, s1)
            if h[1] != code or h[2] != count:
                theirs = (h[1], h[2])
                if not empty_match(sig, theirs, h[3]):
                    self.mismatch(cc, r, describe(theirs))
            if h[4] != path:            # each rank sees it in the other's header
                self._by_messages(cc)
        # A peer's ABORT of an earlier call, sent before it published this header, is in
        # its ring by now: take it in, so that this call reports it as a message call
        # would (a link keeps order; the slots and the rings keep none between them).
        if self.shm.has_input():
            self.engine.progress()
        self._synced = seq
        return p

    # -- waits (the engine's: progress, liveness, aborts, timeout) ------------------------
    def _wait_slot(self, cc, r: int, h, s1: int) -> None:
        """Wait for peer ``r``'s header of this call.

        Raises:
            ByMessages: ``r`` entered this call by messages, or went past it without a
                header (see the module docstring).
        """
        arrival = self.arrival[r]
        seq = cc.tag
        control, bit = self._control[r], self._bit

        def ready():
            if h[0] == s1:
                return True
            a = arrival[0]              # in this call by messages, or past it, or never here
            return a == (seq << 2 | 3) or (a & 2 and 0 < ((a >> 2) - seq) & _SEQ_MASK
                                           < _HALF) or bool(control[NO_SLOTS] & bit)
        self._wait(cc, r, ready)
        if h[0] != s1:
            self._by_messages(cc)

    def _by_messages(self, cc) -> None:
        """Raise :class:`ByMessages`, the call recorded as run by messages in the flight
        recorder (it was begun as a call through the slots)."""
        _trace.reroute_call(self.comm, cc.tag, "messages")
        raise ByMessages

    def _wait_entered(self, cc, r: int, need: int) -> None:
        arrival = self.arrival[r]
        control, bit = self._control[r], self._bit

        def entered():              # (one that gave up the slots never reads this rank's)
            a = arrival[0]
            return bool(a & 2) and ((a >> 2) - need) & _SEQ_MASK < _HALF or \
                bool(control[NO_SLOTS] & bit)
        self._wait(cc, r, entered)

    def _wait(self, cc, r: int, ready) -> None:
        """Wait for ``ready()`` on peer ``r``'s account, as a message wait would."""
        eng, shm = self.engine, self.shm
        peer = self.comm._world[r]
        ctx, tag = cc.ctx, cc.tag
        seen = eng.abort_count
        err = eng.aborted_error(ctx, tag)   # abandoned before this rank began to wait
        if err is not None:
            raise err
        # Spin a while first (the peer is usually only just behind, and a spin answers
        # without a sleep and a wake-up), then let the engine wait: progress, liveness,
        # yielding, the kernel sleep, the timeout. Where ranks outnumber cores, yield the
        # core instead of spinning, with bare sched_yield calls for up to yield_s before
        # the engine's wait: under EEVDF a yielding rank's core goes only to a peer that
        # has had less than its share, so the CPU a waiting rank spends is taken from the
        # peers with work, and the engine's wait costs much of it (benchmarks/README.md,
        # 2026-11-27, "4 ranks on 2 cores").
        if not eng.yield_s:
            end = _perf() + eng.spin_s
            while _perf() < end:
                for _ in range(_SPIN):
                    if ready():
                        return
        elif not eng._threaded:         # (threads share the GIL: the engine's wait)
            end = _perf() + eng.yield_s
            while True:
                _sched_yield()
                if ready():
                    return
                if _perf() >= end:
                    break

        # A peer that closed pycomm is noticed after _DEPARTED_S, as the engine's liveness
        # check notices it for a message wait (a launcher that saw that rank exit is
        # meanwhile stopping this one, which then need not report a failure of its own).
        departed_from = _perf() + _DEPARTED_S

        # No state: the progress thread may evaluate this too (ShmTransport.block runs
        # the watches), and must not use up what this thread has to see; else this thread
        # learns of an abandoned call only when the failing rank next sends
        # (benchmarks/README.md, "Measurements behind design choices in the code").
        def cond():
            if ready():
                return True
            if eng.abort_count != seen and eng.aborted_error(ctx, tag) is not None:
                return True
            return bool(shm.control_words(peer)[1]) and _perf() >= departed_from
        shm.watches.append(cond)
        try:
            while not ready():
                eng.wait_until(cond, None, f"call #{tag}",
                               req=SimpleNamespace(peer=peer, tag=tag, expect=SHARED_WAIT))
                err = eng.aborted_error(ctx, tag)
                if err is not None:
                    raise err
                if not ready() and shm.control_words(peer)[1] and _perf() >= departed_from:
                    eng.await_stop_after([peer])
                    raise PeerError(f"rank {self.rank}: rank {r} has left: it closed pycomm "
                                    "(its program ended) while this rank waits for it",
                                    peer)
        finally:
            shm.watches.remove(cond)

    def mismatch(self, cc, r: int, theirs: str) -> None:
        """Raise the CollectiveMismatchError of peer ``r`` in ``theirs`` (its call in words)."""
        comm = self.comm
        raise CollectiveMismatchError(
            f"rank {self.rank}: collective mismatch in call #{cc.tag} on {comm.name}: rank "
            f"{r} is in {theirs}, rank {self.rank} in {describe(cc.sig)}")

    def await_reduced(self, cc, p: int) -> None:
        """Flag this rank's reduced slice (slot ``p``); wait for every peer's flag."""
        s1, headers = cc.tag + 1, self.headers
        headers[self.rank][p][5] = s1
        self.ring_peers()
        for r in self.peers:
            h = headers[r][p]
            if h[5] != s1:
                for _ in range(self._polls):
                    if h[5] == s1:
                        break
                else:
                    self._wait(cc, r, lambda h=h: h[5] == s1)
