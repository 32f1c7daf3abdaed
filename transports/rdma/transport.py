"""The "rdma" transport: pycomm frames over emulated RC queue pairs.

Set-up (as ibv_rc_pingpong): one device context, PD and CQ per rank, one RC QP per peer;
``(ctx.address, qp_num per peer)`` is exchanged through the rendezvous store, then every
QP goes INIT -> RTR -> RTS, and a store barrier makes sure every peer is ready.

Eager path. Each QP has ``recv_slots`` pre-posted receive buffers of ``slot_bytes``. A
frame (12-byte prefix, header, payload) is copied into send slots and leaves as one or
more SEND_WITH_IMM work requests; the receiver parses the first chunk's prefix and header,
asks the sink for the destination and copies the chunks there, then re-posts the slot.
Copies: sender -> send slot (1), NIC: slot -> peer's receive slot (1, CMA pull; inline
sends <= 8 KiB go through the NIC link socket), receive slot -> destination (1).

Flow control by credits (no RNR in steady state): a sender may post a SEND only while it
holds a credit, i.e. a receive slot the peer has re-posted; the ``imm_data`` of every SEND
returns the slots this side re-posted since its last report, and a zero-length
credit-only SEND goes out when half a window is owed and no data is flowing. Data SENDs
keep the last credit in reserve for credit-only messages, and a rank whose queued data
waits behind that reserve spends it on returning what it owes, so two ranks sending to
each other cannot both run out. RNR retry (rnr_retry=7) remains as the safety net.

Rendezvous (large messages): zero-copy RDMA READ by the receiver. ``expose`` registers the
send buffer (through a registration cache) and a validity word (``ExposureFlags``, in
regions registered once) and returns ``[addr, rkey, nbytes, word, word_rkey, token]``; the
engine puts it in its RTS frame; the receiver's ``read_remote`` registers the destination
and posts three ordered RDMA_READs (word, buffer, word), waiting on the CQ for the last,
then the engine sends FIN. A withdrawn send clears its word, so a read that overlapped
the withdrawal is detected and fails that message alone; deregistering the buffer instead
would fail the READ with a remote access error, which takes the whole queue pair to the
error state, as on real hardware. One copy
(process_vm_readv between the two buffers on one host), the sender's CPU idle, and one
control frame fewer than the alternative (the receiver exposing its buffer in a CTS and the
sender RDMA-WRITEing into it, then FIN), which the engine does not have a hook for and
which measured no faster (benchmarks/README.md, "RDMA emulation").

Registration cache: MRs are kept by (address, length, access), up to 128 regions and
512 MiB; an MR holds a reference to its buffer, so a cached address can never be reused
by another object while registered. Least recently used idle regions are evicted.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict, deque
from typing import Any

import msgpack
import numpy as np

from ..base import ExposureFlags, PeerLostError, RemoteAccessError, Transport, TransportError
from ..frames import FrameDecoder, frame_prefix
from . import verbs as v

__all__ = ["RdmaTransport"]

_RECV, _SEND, _CREDIT, _READ = 1 << 40, 2 << 40, 3 << 40, 4 << 40
_KIND = 0xFF << 40
_CACHE_REGIONS, _CACHE_BYTES = 128, 512 << 20
_BYE = 1 << 31          # imm_data flag of the last message a closing rank sends
_DRAIN_S = 5.0          # how long close() lets queued sends reach live peers
_DRAIN_ON_ERROR_S = 0.3  # the same when the process is leaving through an exception


class _Peer:
    __slots__ = ("rank", "index", "qp", "credits", "owed", "queue", "decoder", "bye")

    def __init__(self, rank: int, index: int, qp, credits: int, decoder: FrameDecoder):
        self.rank, self.index, self.qp = rank, index, qp
        self.credits, self.owed = credits, 0
        self.queue: deque = deque()     # [prefix+header, payload, payload offset, started, token]
        self.decoder = decoder          # receives may end mid-frame: it keeps the state
        self.bye = False                # the peer closed its transport normally


class RdmaTransport(Transport):
    """Frames over emulated RDMA queue pairs; rendezvous by RDMA READ.

    Options:
        slot_bytes: bytes per bounce buffer (default 68 KiB: one eager 64 KiB message).
        recv_slots: receive buffers pre-posted per peer (default 16).
        send_slots: send bounce buffers shared by all peers (default 32).
        cma: allow cross-memory attach inside a host (default True).
        host: address the NIC listens on (default loopback).
        read_timeout: seconds a one-sided read waits for its completions (default 300;
            the job passes its ``PYCOMM_TIMEOUT``).
    """

    name = "rdma"
    background_thread = True     # the NIC engine thread moves the bytes
    one_sided_read = True

    def __init__(self, rank, size, job_id, token, sink, *, slot_bytes: int = 69632,
                 recv_slots: int = 16, send_slots: int = 32, cma: bool = True,
                 host: str | None = None, read_timeout: float = 300.0, **options: Any):
        super().__init__(rank, size, job_id, token, sink)
        if slot_bytes < 1024 or recv_slots < 2 or send_slots < 1:
            raise ValueError("rdma: slot_bytes >= 1024, recv_slots >= 2, send_slots >= 1")
        self.slot, self.nrecv, self.nsend = slot_bytes, recv_slots, send_slots
        self.cma, self.host = cma, host or "127.0.0.1"
        self.read_timeout = float(read_timeout)
        self.ctx = None
        self._peers: dict[int, _Peer] = {}
        self._by_qpn: dict[int, _Peer] = {}
        self._wcs: deque = deque()
        self._free: list[int] = []
        self._sent_tokens: list = []
        self._pending: set = set()
        self._cache: OrderedDict = OrderedDict()
        self._cache_bytes = 0
        self._reads = 0
        self._lost: dict[int, str] = {}
        self._closed = False

    @staticmethod
    def can_connect(mine: dict, theirs: dict) -> bool:
        return True

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, store, peers: list[int], timeout: float) -> None:
        self.peers = sorted(peers)
        ctx = self.ctx = v.Context(self.token, host=self.host, cma=self.cma)
        self.pd = v.ProtectionDomain(ctx)
        n = max(1, len(self.peers))
        self.cq = v.CompletionQueue(ctx, n * (self.nrecv + self.nsend + 8) + 64)
        self._rbuf = np.zeros(n * self.nrecv * self.slot, np.uint8)
        self._sbuf = np.zeros(self.nsend * self.slot, np.uint8)
        self._rmr = v.MemoryRegion(self.pd, self._rbuf, v.IBV_ACCESS_LOCAL_WRITE)
        self._flag_mrs: list = []
        self._flags = ExposureFlags(on_block=lambda arr: self._flag_mrs.append(
            v.MemoryRegion(self.pd, arr, v.IBV_ACCESS_REMOTE_READ)))
        self._words = np.zeros(2, np.int64)       # the two copies of a read's validity word
        self._words_mr = v.MemoryRegion(self.pd, self._words, v.IBV_ACCESS_LOCAL_WRITE)
        self._smr = v.MemoryRegion(self.pd, self._sbuf, 0)
        self._free = list(range(self.nsend))
        qpns = [0] * self.size
        for i, peer in enumerate(self.peers):
            qp = v.QueuePair(self.pd, self.cq, self.cq, max_send_wr=2 * self.nrecv + 8,
                             max_recv_wr=self.nrecv)
            qp.to_init()
            p = _Peer(peer, i, qp, self.nrecv, FrameDecoder(peer, self.sink))
            self._peers[peer], self._by_qpn[qp.qp_num] = p, p
            for k in range(self.nrecv):
                self._post_recv(p, k)
            qpns[peer] = qp.qp_num
        key = f"rdma/{self.job_id}/"
        store.set(key + str(self.rank), msgpack.packb([ctx.address, qpns]))
        for peer in self.peers:
            addr, theirs = msgpack.unpackb(store.get(key + str(peer), timeout=timeout))
            qp = self._peers[peer].qp
            qp.to_rtr(addr, theirs[self.rank])
            qp.to_rts(rnr_retry=7, min_rnr_timer=0.001)
        store.set(key + f"{self.rank}/rts", b"1")
        for peer in self.peers:
            store.get(key + f"{peer}/rts", timeout=timeout)

    def _post_recv(self, p: _Peer, k: int) -> None:
        base = (p.index * self.nrecv + k) * self.slot
        p.qp.post_recv(v.RecvWR(_RECV | p.index << 16 | k,
                                [v.SGE(self._rmr.addr + base, self.slot, self._rmr.lkey)]))

    # -- sending --------------------------------------------------------------------------
    def send(self, peer: int, header: bytes, payload, token: Any) -> bool:
        p = self._peers[peer]
        if p.rank in self._lost:
            raise PeerLostError(peer, self._lost[p.rank])
        n = len(payload) if payload is not None else 0
        item = [frame_prefix(header, n), payload, 0, False, token]
        p.queue.append(item)
        self._pump(p)
        if p.queue and p.queue[-1] is item:
            self._pending.add(p)
            return False
        if self._sent_tokens and self._sent_tokens[-1] is token and token is not None:
            self._sent_tokens.pop()     # finished inside this call: the caller is told now
        return True

    def _pump(self, p: _Peer) -> None:
        """Copy queued frames of ``p`` into send slots and post them, as credits allow."""
        q, slot, sbuf = p.queue, self.slot, self._sbuf
        while q and p.credits > 1 and self._free:
            item = q[0]
            hb, payload, off = item[0], item[1], item[2]
            s = self._free.pop()
            base = s * slot
            used = 0
            if not item[3]:
                used = len(hb)
                sbuf[base:base + used] = np.frombuffer(hb, np.uint8)
                item[3] = True
            if payload is not None:
                take = min(len(payload) - off, slot - used)
                if take:
                    sbuf[base + used:base + used + take] = np.frombuffer(
                        payload[off:off + take], np.uint8)
                    used += take
                    off = item[2] = off + take
            self._post_send(p, _SEND | s, [v.SGE(self._smr.addr + base, used,
                                                 self._smr.lkey)])
            if payload is None or off == len(payload):
                q.popleft()
                if item[4] is not None:
                    self._sent_tokens.append(item[4])

    def _post_send(self, p: _Peer, wr_id: int, sges: list, flag: int = 0) -> None:
        p.credits -= 1
        imm, p.owed = p.owed | flag, 0
        p.qp.post_send(v.SendWR(wr_id, v.IBV_WR_SEND_WITH_IMM, sges, imm_data=imm))

    # -- progress -------------------------------------------------------------------------
    def progress(self) -> bool:
        busy = False
        wcs = self._wcs
        wcs.extend(self.cq.poll(64))
        while wcs:
            self._complete(wcs.popleft())
            busy = True
        if self._pending:
            for p in list(self._pending):
                self._pump(p)
                if not p.queue:
                    self._pending.discard(p)
        if self._sent_tokens:
            tokens, self._sent_tokens = self._sent_tokens, []
            for t in tokens:
                self.sink.on_sent(t)
            busy = True
        for p in self._peers.values():
            if self._credit_return_due(p):
                self._post_send(p, _CREDIT, [])
        return busy

    def _credit_return_due(self, p: _Peer) -> bool:
        """Whether a credit-only SEND should go to ``p`` now: half a window is owed and no
        data SEND will carry it, or data is stuck behind the reserved last credit (then
        that credit returns what is owed: two ranks that both hold one credit and queued
        data would otherwise wait for each other's credits forever)."""
        return bool(p.owed) and p.credits >= 1 and (
            (p.owed >= self.nrecv // 2 and not p.queue) or (bool(p.queue) and p.credits == 1))

    def _complete(self, wc) -> None:
        p = self._by_qpn.get(wc.qp_num)
        kind = wc.wr_id & _KIND
        if wc.status != v.IBV_WC_SUCCESS:
            if p is not None and p.bye:
                return                  # flushed after the peer's normal close
            why = f"{v.wc_status_str(wc.status)} on its queue pair"
            if p is not None:
                self._lost.setdefault(p.rank, why)
                raise PeerLostError(p.rank, why)
            raise TransportError(why)
        if kind == _SEND:
            self._free.append(wc.wr_id & 0xFFFF)
        elif kind == _RECV:
            if wc.imm_data & _BYE:
                p.bye = True
                return
            p.credits += wc.imm_data
            k = wc.wr_id & 0xFFFF
            if wc.byte_len:
                base = (p.index * self.nrecv + k) * self.slot
                p.decoder.feed(memoryview(self._rbuf)[base:base + wc.byte_len])
            self._post_recv(p, k)
            p.owed += 1
            if p.queue:
                self._pending.add(p)

    # -- waiting and liveness -------------------------------------------------------------
    def has_backlog(self) -> bool:
        return any(p.queue for p in self._peers.values())

    def block(self, timeout: float) -> None:
        if self._wcs or self._sent_tokens:
            return
        self.cq.wait(max(timeout, 0.0))

    def wakeup(self) -> None:
        """Wake a thread sleeping in :meth:`block` (the CQ's completion channel)."""
        if self.ctx is not None:
            self.cq.notify()

    def closed_peers(self) -> set[int]:
        return {p.rank for p in self._peers.values() if p.bye}

    def check_peers(self) -> None:
        for p in self._peers.values():
            if p.bye:
                continue
            if p.rank in self._lost:
                raise PeerLostError(p.rank, self._lost[p.rank])
            if p.qp.state == v.IBV_QPS_ERR:
                raise PeerLostError(p.rank, p.qp.error or "queue pair in error")

    # -- one-sided: registration cache and RDMA READ --------------------------------------
    def _register(self, view: memoryview, access: int) -> v.MemoryRegion:
        addr, n, _ = v.buffer_address(view)
        key = (addr, n, access)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            hit[1] += 1
            return hit[0]
        mr = v.MemoryRegion(self.pd, view, access)
        self._cache[key] = [mr, 1]
        self._cache_bytes += n
        if len(self._cache) > _CACHE_REGIONS or self._cache_bytes > _CACHE_BYTES:
            for k, (old, refs) in list(self._cache.items()):
                if refs == 0:
                    old.dereg()
                    del self._cache[k]
                    self._cache_bytes -= k[1]
                    if len(self._cache) <= _CACHE_REGIONS // 2:
                        break
        return mr

    def _unref(self, key) -> None:
        hit = self._cache.get(key)
        if hit is not None and hit[1] > 0:
            hit[1] -= 1

    def expose(self, view: memoryview):
        """Register ``view`` for remote reads; the descriptor is ``[addr, rkey, nbytes,
        word, word_rkey, token]`` (the validity word: :class:`ExposureFlags`)."""
        if not len(view):
            return None
        mr = self._register(view, v.IBV_ACCESS_REMOTE_READ)
        word, token = self._flags.acquire()
        fmr = next(m for m in self._flag_mrs if m.addr <= word < m.addr + m.length)
        return [v.buffer_address(view)[0], mr.rkey, len(view), word, fmr.rkey, token]

    def release(self, desc, revoke: bool = False) -> None:
        """Clear the validity word (a READ that overlaps fails the check), then drop the
        registration's reference; the region stays registered in the cache."""
        self._flags.retire(desc[3])
        self._unref((desc[0], desc[2], v.IBV_ACCESS_REMOTE_READ))

    def can_read(self, peer: int) -> bool:
        return peer in self._peers and peer not in self._lost

    def read_remote(self, peer: int, desc, nbytes: int, dest: memoryview,
                    timeout: float | None = None) -> None:
        """RDMA READ ``nbytes`` of the buffer ``desc`` (from ``expose``) into ``dest``.

        Three READs in order on the peer's queue pair: the validity word, the buffer, the
        word again; both copies of the word must hold the exposure's token. Waits for the
        last READ's completion on the CQ; other completions met meanwhile are kept, in
        order, for the next ``progress()``.

        Raises:
            RemoteAccessError: the buffer was withdrawn before or during the read.
            PeerLostError: a READ completed in error (peer lost, access refused).
            TransportError: no completion within ``timeout`` seconds (None: the
                transport's ``read_timeout``).
        """
        if not nbytes:
            return
        p = self._peers[peer]
        mr = self._register(dest, v.IBV_ACCESS_LOCAL_WRITE)
        addr = v.buffer_address(dest)[0]
        words, wk = self._words.ctypes.data, self._words_mr.lkey
        self._words[:] = 0
        for sge, raddr, rkey in ((v.SGE(words, 8, wk), desc[3], desc[4]),
                                 (v.SGE(addr, nbytes, mr.lkey), desc[0], desc[1]),
                                 (v.SGE(words + 8, 8, wk), desc[3], desc[4])):
            self._reads += 1
            wr_id = _READ | self._reads
            p.qp.post_send(v.SendWR(wr_id, v.IBV_WR_RDMA_READ, [sge], remote_addr=raddr,
                                    rkey=rkey))
        first = wr_id - 2
        try:
            if timeout is None:
                timeout = self.read_timeout
            deadline = time.monotonic() + timeout
            wcs = self._wcs
            while True:
                wcs.extend(self.cq.poll(64))
                for wc in [wc for wc in wcs if first <= wc.wr_id <= wr_id]:
                    wcs.remove(wc)
                    if wc.status != v.IBV_WC_SUCCESS:
                        why = f"RDMA READ failed: {v.wc_status_str(wc.status)}"
                        self._lost.setdefault(peer, why)
                        raise PeerLostError(peer, why)
                    if wc.wr_id == wr_id:
                        if not self._words[0] == self._words[1] == desc[5]:
                            raise RemoteAccessError(
                                f"rank {peer} withdrew its buffer of {nbytes} bytes before "
                                "or while it was read")
                        return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"RDMA READ from rank {peer} did not complete "
                                         f"within {timeout:g} s")
                self.cq.wait(min(left, 0.05))
        finally:
            self._unref((addr, len(dest), v.IBV_ACCESS_LOCAL_WRITE))

    def _drain(self, limit: float) -> None:
        """Let queued and posted sends reach live peers before the NIC stops (a send the
        engine considers done may still sit in a send slot). Arriving data is dropped."""
        deadline = time.monotonic() + limit
        live = [p for p in self._peers.values() if p.rank not in self._lost and not p.bye]
        said_bye: set = set()
        while time.monotonic() < deadline:
            live = [p for p in live if p.qp.state == v.IBV_QPS_RTS]
            for p in live:
                if p.rank not in said_bye and not p.queue and p.credits >= 1:
                    self._post_send(p, _CREDIT, [], _BYE)   # tells the peer: not a loss
                    said_bye.add(p.rank)
            if not any(p.queue or p.qp.outstanding or p.rank not in said_bye for p in live):
                return
            try:
                wcs = list(self._wcs) + self.cq.poll(64)
            except v.VerbsError:
                return
            self._wcs.clear()
            for wc in wcs:
                kind = wc.wr_id & _KIND
                if kind == _SEND:
                    self._free.append(wc.wr_id & 0xFFFF)
                elif kind == _RECV and wc.status == v.IBV_WC_SUCCESS:
                    p = self._by_qpn[wc.qp_num]
                    if wc.imm_data & _BYE:
                        p.bye = True
                        continue
                    p.credits += wc.imm_data
                    self._post_recv(p, wc.wr_id & 0xFFFF)
                    p.owed += 1
            for p in live:
                self._pump(p)
                if p.rank not in said_bye and self._credit_return_due(p):
                    self._post_send(p, _CREDIT, [])
            self.cq.wait(0.01)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.ctx is not None:
            # A process leaving through an uncaught exception (sys.last_value is set
            # before atexit runs) takes its job down: a peer that is stopped or hung would
            # hold a full drain for its whole limit, and nobody waits for the data.
            self._drain(_DRAIN_ON_ERROR_S if getattr(sys, "last_value", None) is not None
                        else _DRAIN_S)
            self.ctx.close()
        for mr, _ in self._cache.values():
            mr.dereg()
        self._cache.clear()
