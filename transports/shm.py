"""Shared-memory transport: single-producer/single-consumer byte rings in /dev/shm.

Layout: :mod:`transports.shmring` (a segment per rank: a control block, one inbound
ring per peer on its host, then the collective slots).

Waiting. A rank with nothing to do spins for a while (the caller's choice), then sets its
``waiting`` flag, re-checks every ring and sleeps in ``futex(FUTEX_WAIT)`` on its doorbell.
Whoever gives it work (new data, or space freed in a ring it is blocked on) bumps the
doorbell and, if the flag is set, issues ``FUTEX_WAKE``. Sleeps are bounded, so a lost
wake-up costs one slice, never a hang.

Copies. An eager message is copied twice (sender buffer -> ring -> receiver buffer). A large
message travels by rendezvous: the receiver reads the sender's buffer directly with
``process_vm_readv`` (Linux cross-memory attach, as MPICH's and Open MPI's CMA paths do):
one copy and no ring traffic but two small control frames. Where CMA is refused (ptrace
restrictions), the payload streams through the ring, two copies, pipelined.

Collective slots. After the rings, each segment holds an area for the small-message
collectives of :mod:`pycomm.shmcoll` (``coll_bytes`` long; its layout is that module's):
one rank writes there, its peers on the host read it in place. Rings and slots are reserved
in /dev/shm before any process touches them (:mod:`transports.shmring`, "Room").

Cleanup. Every rank unlinks its segment as soon as all its peers have mapped it, so after
start-up nothing is left in /dev/shm even if the job is SIGKILLed; before that, the
launcher sweeps ``pycomm-<job>-*``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgpack

from .base import PeerLostError, Transport, TransportError, host_identity
from .cma import CrossMemory
from .frames import PREFIX, FrameDecoder, frame_prefix, whole_frame_handler
from .shmring import (HEAD, TAIL, WHOLE, WHOLE_MAX, InRing, OutRing, Segment,
                      ShmSpaceError, rings_bytes, segment_name, whole_frame)
from .linux import futex_wait as _futex_wait, futex_wake as _futex_wake
from .procwatch import process_state

_perf = time.perf_counter

__all__ = ["ShmSpaceError", "ShmTransport"]


class ShmTransport(Transport):
    """Frames through shared-memory rings; large payloads by cross-memory attach.

    Options:
        ring_bytes: bytes per ring (default 1 MiB); eager messages must be far smaller.
        cma: allow process_vm_readv single-copy reads (default True).
        coll_bytes: bytes of the collective area (:mod:`pycomm.shmcoll`; 0: none). Every
            rank of the host must use the same value.
    """

    name = "shm"
    # The p2p engine's request-free paths may call send_now(repeats=True) and
    # recv_now(alone=True) directly: they write or take a whole frame, checking the rest.
    direct_p2p = True

    def __init__(self, rank, size, job_id, token, sink, *, ring_bytes: int = 1 << 20,
                 cma: bool = True, coll_bytes: int = 0, **options: Any):
        super().__init__(rank, size, job_id, token, sink)
        self._on_frame = whole_frame_handler(sink)
        if ring_bytes < 4096 or ring_bytes % 64:
            raise ValueError(f"ring_bytes={ring_bytes} must be a multiple of 64, >= 4096")
        self.ring_bytes = ring_bytes
        self.coll_bytes = max(0, int(coll_bytes))
        self.want_cma = cma
        # callables the sleeping rank checks after raising its waiting flag (the waits of
        # pycomm.shmcoll watch a peer's slot, which no ring counter shows)
        self.watches: list = []
        self._coll_at: dict[int, tuple[Segment, int]] = {}
        self.one_sided_read = cma
        self._own: Segment | None = None
        self._path: str | None = None
        self._others: dict[int, Segment] = {}
        self._out: dict[int, OutRing] = {}
        self._in: list[InRing] = []
        self._in_from: dict[int, InRing] = {}
        self._pending: list[OutRing] = []   # out rings with a non-empty queue
        self._pids: dict[int, int] = {}
        self.cma = CrossMemory(cma)   # single copies to and from same-host peers (shmdirect too)
        # header -> (payload length, prefix + header) of the last frame sent with it
        self._heads: dict[bytes, tuple[int, bytes]] = {}
        self._closed = False

    @staticmethod
    def can_connect(mine: dict, theirs: dict) -> bool:
        return mine.get("host") == theirs.get("host") == host_identity()

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, store, peers: list[int], timeout: float) -> None:
        self.peers = sorted(peers)
        rings = rings_bytes(len(self.peers), self.ring_bytes)
        nbytes = rings + self.coll_bytes
        name = segment_name(self.job_id, self.rank)
        self._path, what = "/dev/shm/" + name, f"rank {self.rank}'s {len(self.peers)} " \
            f"inbound rings of {self.ring_bytes} bytes (PYCOMM_SHM_RING_BYTES)"
        self._own = Segment(self._path, nbytes, create=True, reserve=rings, what=what)
        self._own.ctl64[0] = os.getpid()
        self._coll_at[self.rank] = (self._own, rings)
        key = f"shm/{self.job_id}/"
        store.set(key + str(self.rank), msgpack.packb({
            "name": name, "nbytes": nbytes, "peers": self.peers, "ring": self.ring_bytes,
            "coll": self.coll_bytes, "coll_at": rings, **self.cma.published()}))
        for slot, peer in enumerate(self.peers):
            info = msgpack.unpackb(store.get(key + str(peer), timeout=timeout))
            if info["ring"] != self.ring_bytes:
                raise TransportError(f"rank {peer} uses ring_bytes={info['ring']}, "
                                     f"rank {self.rank} uses {self.ring_bytes}")
            if info["coll"] != self.coll_bytes:
                raise TransportError(
                    f"rank {peer} has a {info['coll']}-byte collective area, rank "
                    f"{self.rank} {self.coll_bytes} (PYCOMM_SHM_COLL_BYTES differs)")
            seg = Segment("/dev/shm/" + info["name"], info["nbytes"])
            self._others[peer] = seg
            self._coll_at[peer] = (seg, info["coll_at"])
            self._pids[peer] = info["pid"]
            ctl, data = seg.ring(info["peers"].index(self.rank), self.ring_bytes)
            self._out[peer] = OutRing(peer, ctl, data, seg)
            ctl, data = self._own.ring(slot, self.ring_bytes)
            self._in.append(InRing(peer, ctl, data, seg,
                                    FrameDecoder(peer, self.sink, self._on_frame)))
            self._in_from[peer] = self._in[-1]
            self.cma.admit(peer, info)
        # Unlink our segment once every peer has mapped it: from here on a crash leaks nothing.
        store.set(key + f"{self.rank}/mapped", b"1")
        for peer in self.peers:
            store.get(key + f"{peer}/mapped", timeout=timeout)
        os.unlink(self._path)
        self._path = None

    # -- the collective area (pycomm.shmcoll) ----------------------------------------------
    def coll_area(self, rank: int, reserve: tuple | None = None) -> memoryview | None:
        """The collective area in ``rank``'s segment (this rank's own or a connected
        peer's), or None when there is none. Only ``rank`` writes to it. ``reserve``:
        ``(start, nbytes, what)``, a range of it to reserve first
        (:meth:`transports.shmring.Segment.reserve`, which raises ShmSpaceError)."""
        at = self._coll_at.get(rank)
        if at is None or not self.coll_bytes:
            return None
        seg, off = at
        if reserve is not None:
            seg.reserve(off + reserve[0], *reserve[1:])
        return seg.view[off:off + self.coll_bytes]

    def doorbell_words(self, ranks: list[int]) -> list:
        """``(words, futex)`` of each peer of ``ranks``, whose doorbell a caller rings when
        it wrote outside the rings: add 1 (mod 2**32) to ``words[0]``, then, if ``words[1]``
        (it sleeps), ``transports.linux.futex_wake(futex)``, as the segment's ring does."""
        return [(self._others[r].ctl32, self._others[r].futex) for r in ranks]

    def control_words(self, rank: int) -> memoryview:
        """``rank``'s u64 ``[pid, goodbye (it closed pycomm cleanly), no slots, freed
        blocks]``: bit b of the last two, block b's communicator runs by messages there
        (pycomm.shmcoll.slots_for), it freed it (pycomm.slotblocks)."""
        return (self._own if rank == self.rank else self._others[rank]).ctl64

    # -- sending --------------------------------------------------------------------------
    def send_now(self, peer: int, header: bytes, payload, repeats: bool = False) -> bool:
        """Write a whole frame into ``peer``'s ring at once if it fits there unwrapped and
        nothing is queued before it; False (nothing written) otherwise.

        ``repeats``: the header comes back message after message (a point-to-point eager
        header: see :attr:`direct_p2p`), so the frame's prefix and header, which depend
        only on the header and the payload's length, are packed once (for the length
        last sent with that header) and kept."""
        ring = self._out[peer]
        if ring.queue:
            return False
        plen = len(payload)
        if repeats:
            head = self._heads.get(header)
            if head is None or head[0] != plen:
                head = self._frame_head(header, plen)
            fh = head[1]
        else:
            fh = frame_prefix(header, plen)
        at = ring.head
        size = ring.size
        stop = len(fh)
        end = stop + plen
        pos = at % size
        if pos + end > size:
            return False
        ctl = ring.ctl
        if end > size - (at - ring.tail):
            ring.tail = ctl[TAIL]          # the reader may have freed space since
            if end > size - (at - ring.tail):
                return False
        # The prefix and header go in with the payload: a copy into the ring costs more
        # than joining a small payload to them.
        if plen <= 256:
            ring.data[pos:pos + end] = fh + payload
        else:
            data = ring.data
            stop += pos
            data[pos:stop] = fh
            data[stop:stop + plen] = payload
        ctl[HEAD] = ring.head = at + end
        seg = ring.seg                  # ring_doorbell, inlined: this is the latency path
        c = seg.ctl32
        c[0] = (c[0] + 1) & 0xFFFFFFFF
        if c[1]:
            _futex_wake(seg.futex)
        return True

    def _frame_head(self, header: bytes, plen: int) -> tuple[int, bytes]:
        """Pack and remember the prefix and header of a frame (see :meth:`send_now`)."""
        heads = self._heads
        if len(heads) >= 4096:          # bounded: tags may be many
            heads.clear()
        head = heads[header] = (plen, frame_prefix(header, plen))
        return head

    def send(self, peer: int, header: bytes, payload, token: Any) -> bool:
        if self.send_now(peer, header, payload if payload is not None else b""):
            return True
        ring = self._out[peer]
        hb = frame_prefix(header, len(payload) if payload is not None else 0)
        if not ring.queue:
            ctl = ring.ctl
            head = ctl[HEAD]
            free = ring.size - (head - ctl[TAIL])
            n = len(hb)
            np_ = len(payload) if payload is not None else 0
            if n + np_ <= free:
                head = ring.put(hb, n, head)
                if np_:
                    head = ring.put(payload, np_, head)
                ctl[HEAD] = ring.head = head
                ring.seg.ring_doorbell()
                return True
        ring.queue.append([[memoryview(hb), payload], 0, 0, token])
        if len(ring.queue) == 1:
            self._pending.append(ring)
            self._flush(ring)
        return False

    def _flush(self, ring: OutRing) -> bool:
        """Push queued frames into ``ring`` as space allows; True if any byte moved."""
        ctl = ring.ctl
        head = ctl[HEAD]
        tail = ctl[TAIL]
        ring.seen_tail = tail
        free = ring.size - (head - tail)
        moved = False
        q = ring.queue
        while q and free:
            item = q[0]
            chunks, idx, off = item[0], item[1], item[2]
            while idx < 2 and free:
                chunk = chunks[idx]
                if chunk is None:
                    idx, off = idx + 1, 0
                    continue
                n = min(len(chunk) - off, free)
                if n:
                    head = ring.put(chunk[off:off + n], n, head)
                    free -= n
                    off += n
                    moved = True
                if off == len(chunk):
                    idx, off = idx + 1, 0
            item[1], item[2] = idx, off
            if idx < 2:
                break
            q.popleft()
            if item[3] is not None:
                ctl[HEAD] = ring.head = head
                self.sink.on_sent(item[3])
        if moved:
            ctl[HEAD] = ring.head = head
            ring.seg.ring_doorbell()
        return moved

    # -- receiving ------------------------------------------------------------------------
    def progress(self) -> bool:
        busy = False
        if self._pending:
            for ring in list(self._pending):
                if self._flush(ring):
                    busy = True
                if not ring.queue:
                    self._pending.remove(ring)
        for ring in self._in:
            ctl = ring.ctl
            head = ctl[HEAD]
            if head == ring.seen_head:
                continue
            ring.seen_head = head
            if self._drain(ring, head):
                busy = True
        return busy

    def _drain(self, ring: InRing, head: int) -> bool:
        """Hand everything written up to ``head`` to the ring's decoder, then free it."""
        ctl = ring.ctl
        tail = ctl[TAIL]
        n = head - tail
        if n <= 0:
            return False
        if ring.broken is not None:
            raise PeerLostError(ring.peer, ring.broken)
        pos = tail % ring.size
        first = ring.size - pos
        data = ring.data
        try:
            if n <= first:
                ring.decoder.feed(data[pos:pos + n])
            else:                       # wrapped: the span to the end, then the start
                ring.decoder.feed(data[pos:])
                ring.decoder.feed(data[:n - first])
        except Exception as exc:
            # Frames before the failing one were delivered: taking the span in again
            # would deliver them twice, so nothing more is read from this peer.
            ring.broken = f"a frame from it could not be taken in ({type(exc).__name__}: {exc})"
            raise PeerLostError(ring.peer, ring.broken) from exc
        ctl[TAIL] = ring.tail = head
        if ring.writer.ctl32[1]:        # the writer sleeps: it may wait for this space
            ring.writer.ring_doorbell()
        return True

    def recv_now(self, peer: int, header: bytes, dest: memoryview, spin_s: float = 0.0,
                 alone: bool = False) -> int:
        """Take the next frame from ``peer`` straight into ``dest`` if it is a whole,
        unwrapped frame whose header is exactly ``header`` and whose payload fits; return
        the payload's length, or -1 (nothing taken: the frame is left for
        :meth:`progress`) when none has arrived yet, -2 when another frame is next. A
        blocking receive that knows the one frame it waits for (its eager header) so skips
        the decoder, the sink and the request.

        ``spin_s``: while nothing has arrived from ``peer``, poll its ring's head index for
        up to this many seconds, or until another peer writes (-1 then). The poll reads
        one word per turn, so a frame is seen within a few dozen instructions of its
        arrival, where a call of this method per turn costs about a thousand.

        ``alone``: also -2 while anything else waits for this rank here (frames queued to
        a peer, or arrived from another): :meth:`has_backlog` and :meth:`has_input`
        checked in the same call (see :attr:`direct_p2p`)."""
        ring = self._in_from[peer]
        if alone:
            if self._pending:
                return -2
            for other in self._in:
                if other is not ring and other.ctl[HEAD] != other.seen_head:
                    return -2
        dec = ring.decoder
        if dec.left or dec.partial or ring.broken is not None:
            return -2
        ctl = ring.ctl
        tail = ring.tail
        size, data = ring.size, ring.data
        pos = tail % size
        n = len(dest)
        # The usual message fills ``dest``: one unpack reads its prefix and header, to
        # compare with those expected, and its payload (slicing the ring for the
        # comparison and for the copy would build two views). Found before the message
        # is waited for, so that it is not on the way once the message is there.
        whole = None
        if n <= WHOLE_MAX:
            whole = WHOLE.get(header)
            if whole is None or whole[0] != n:
                whole = whole_frame(header, n)
            if pos + whole[1] > size:
                whole = None
        avail = ctl[HEAD] - tail
        if avail < 12:
            if spin_s <= 0.0:
                return -1
            end = _perf() + spin_s
            while True:
                for _ in range(64):
                    at = ctl[HEAD]
                    if at != tail:
                        break
                else:
                    if _perf() >= end or self.has_input(besides=peer):
                        return -1
                    continue
                break
            avail = at - tail
            if avail < 12:      # (a writer publishes whole frames: cannot happen)
                return -1
        if whole is not None:
            head, body = whole[2](data, pos)    # bytes past the frame that it reads: ignored
            end = whole[1]
            if head == whole[3] and end <= avail:
                dest[:] = body
                ctl[TAIL] = ring.tail = tail + end
                if ring.writer.ctl32[1]:        # the writer sleeps: it may wait for space
                    ring.writer.ring_doorbell()
                return n
        hlen = len(header)
        if pos + 12 + hlen > size:
            return -2
        got, plen = PREFIX.unpack_from(data, pos)
        end = 12 + hlen + plen
        if got != hlen or end > avail or pos + end > size or plen > n or \
                data[pos + 12:pos + 12 + hlen] != header:
            return -2
        if plen:
            dest[:plen] = data[pos + 12 + hlen:pos + end]
        ctl[TAIL] = ring.tail = tail + end
        if ring.writer.ctl32[1]:        # the writer sleeps: it may wait for this space
            ring.writer.ring_doorbell()
        return plen

    # -- waiting --------------------------------------------------------------------------
    def has_backlog(self) -> bool:
        return bool(self._pending)

    def has_input(self, besides: int | None = None) -> bool:
        """Whether a peer (other than ``besides``) has written frames this rank has not
        taken in yet."""
        for ring in self._in:
            if ring.ctl[HEAD] != ring.seen_head and ring.peer != besides:
                return True
        return False

    def _changed(self) -> bool:
        if self.has_input():
            return True
        for ring in self._pending:
            if ring.ctl[TAIL] != ring.seen_tail:
                return True
        return False

    def block(self, timeout: float) -> None:
        own = self._own
        c = own.ctl32
        seen = c[0]
        c[1] = 1
        try:
            if not self._changed() and not any(w() for w in self.watches):
                _futex_wait(own.futex, seen, max(timeout, 0.0))
        finally:
            c[1] = 0

    def wakeup(self) -> None:
        """Bump our own doorbell: a thread of ours asleep on it wakes (FUTEX_WAKE)."""
        if self._own is not None:
            self._own.ring_doorbell()

    def closed_peers(self) -> set[int]:
        return {peer for peer in self._pids if self._others[peer].ctl64[1]}

    def check_peers(self) -> None:
        for peer, pid in self._pids.items():
            if self._others[peer].ctl64[1]:      # it closed cleanly: its exit is no failure
                continue
            state = process_state(pid)
            if state is None:
                raise PeerLostError(peer, f"process {pid} is gone")
            if state in ("Z", "X"):
                raise PeerLostError(peer, f"process {pid} has exited")

    # -- one-sided reads: cross-memory attach (transports.cma) --------------------------
    def expose(self, view: memoryview) -> list | None:
        """What a peer reads ``view`` by (:meth:`transports.cma.CrossMemory.expose`)."""
        return self.cma.expose(view)

    def release(self, desc: list, revoke: bool = False) -> None:
        self.cma.release(desc)

    def can_read(self, peer: int) -> bool:
        """Whether cross-memory attach towards ``peer`` worked when probed at connect."""
        return self.cma.can_read(peer)

    def read_remote(self, peer: int, desc: list, nbytes: int, dest: memoryview) -> None:
        """One copy of ``peer``'s exposed buffer into ``dest``
        (:meth:`transports.cma.CrossMemory.read`, which lists what it raises)."""
        self.cma.read(peer, desc, nbytes, dest)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._own is not None:
            self._own.ctl64[1] = 1              # goodbye: peers must not take our exit as a crash
        self._in.clear()
        self._out.clear()
        self._pending.clear()
        for seg in self._others.values():
            seg.close()
        self._others.clear()
        if self._own is not None:
            self._own.close()
            self._own = None
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None

