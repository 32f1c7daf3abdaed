"""The emulated NIC: one engine thread per :class:`~transports.rdma.verbs.Context`.

The application thread only posts WQEs (and rings the doorbell, an eventfd) and polls
CQs; this thread executes them, in order per QP, and writes the completions.

Links. Two NICs talk over one TCP connection per direction of use (the initiator's
requests and their responses travel on the link the initiator opened), authenticated with
the job token by the HMAC handshake of :mod:`transports.handshake` before any message is
parsed; then each side sends its device address (pid, host, MR-table address). The
listener is served by a thread of its own through a :class:`~transports.connect.Gate` (every
handshake at once, without blocking, under a short deadline and a cap on pending
connections), so no connection, however slow or silent, ever holds up the engine. Every
message is a 40-byte header (kind, flags, dst/src qpn, psn, imm, rkey, length, remote
address) and, for some kinds, a payload (:mod:`transports.rdma.wire`). Requests carry a PSN; the
responder accepts only the next expected PSN, answers ACK / NAK(syndrome) / READ_RESP, and
after an RNR NAK drops later requests until the initiator retransmits from the NAKed PSN
(go-back-N, as an RC QP does).

Data paths and copies (same host = CMA probe succeeded, Linux cross-memory attach):

=================== ======================================== ============================
operation           same host                                across hosts (TCP)
=================== ======================================== ============================
RDMA_WRITE / READ   initiator NIC checks the target's MR       payload on the link; the
                    entry (read from the target process with   *target* NIC checks key,
                    process_vm_readv), then one                bounds and access, then
                    process_vm_writev/readv between the two    receives straight into the
                    registered buffers: 1 copy, target idle   region (kernel copies only)
SEND <= 8 KiB       inline on the link: kernel copies + one copy into the receive WQE
SEND > 8 KiB        target NIC pulls the sender's SGEs with   payload on the link, staged,
                    process_vm_readv into the receive WQE: 1  scattered: kernel + 1 copy
=================== ======================================== ============================

Keys: every access checks (valid, key generation, access flag, bounds) against the MR
table of the region's owner just before the copy; nothing outside a registered region is
read or written. The MR table is a ctypes array in each process, so peers read it with
process_vm_readv and nothing is created in /dev/shm.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import selectors
import socket
import threading
import time

from .. import handshake
from ..base import HandshakeError, TransportError, host_identity
from ..linux import allow_reads_by_peers as _allow_reads, copy_remote as _cma
from ..connect import Gate, dial
from . import ibv as v
from . import responder
from .ibv import address_view
from .wire import (_IOV, _MSG, F_IMM, F_PULL, M_IMM, M_READ_REQ, M_SEND, M_WRITE, NAK_RNR,
                   Wire, _exchange, _Link, address_frame, parse_address)

__all__ = ["Nic"]

_INLINE = 8192          # SENDs up to this many bytes travel in the message itself
_WINDOW = 64            # requests in flight per QP before waiting for ACKs
_ID_SPACE = 1 << 30


class _Entry(ctypes.Structure):
    _fields_ = [("key", ctypes.c_uint32), ("access", ctypes.c_uint32),
                ("pd", ctypes.c_uint32), ("valid", ctypes.c_uint32),
                ("addr", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class Nic(Wire):
    """The engine of one device context (see the module docstring)."""

    # Wire's header callback: the responder, as a method (its first argument is the NIC)
    on_header = responder.on_header

    def __init__(self, token: bytes, *, host: str, cma: bool, max_mr: int):
        self.token, self.want_cma = token, cma
        if cma:                             # before the peers probe this process
            _allow_reads()
        self.lock = threading.RLock()
        self.cap = max_mr
        self.table = (_Entry * max_mr)()
        self._free = list(range(max_mr - 1, 0, -1))
        self._gen = [0] * max_mr
        self.id = random.randrange(1, _ID_SPACE)
        self.qps: dict = {}                     # qp_num -> verbs.QueuePair
        self._next_qpn = random.randrange(0x100, 0x10000)
        self.links: dict[int, _Link] = {}       # peer id -> the link we opened
        self._all: list[_Link] = []
        self._new: list[_Link] = []
        self._ready: set = set()
        self._timers: set = set()
        self._dirty: set = set()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((host, 0))
        self.listener.listen(128)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.efd, selectors.EVENT_READ, "bell")
        self.address = {"id": self.id, "host": host_identity(), "ip": host,
                        "port": self.listener.getsockname()[1], "pid": os.getpid(),
                        "mrt": ctypes.addressof(self.table), "cap": max_mr, "cma": cma}
        greeting = address_frame(self.address)
        self.gate = Gate(self.listener,
                         lambda: handshake.Admission(token, self.id, _ID_SPACE,
                                                     greeting=greeting))
        self.running = True
        self.thread = threading.Thread(target=self._run, name="pycomm-rdma-nic", daemon=True)
        self.thread.start()
        self.admitter = threading.Thread(target=self._admit, name="pycomm-rdma-accept",
                                         daemon=True)
        self.admitter.start()

    # -- memory regions -------------------------------------------------------------------
    def register(self, addr: int, length: int, access: int, pd: int) -> int:
        with self.lock:
            if not self._free:
                raise v.VerbsError(f"memory-region table full ({self.cap} regions)")
            idx = self._free.pop()
            self._gen[idx] = (self._gen[idx] % 255) + 1
            key = idx << 8 | self._gen[idx]
            self.table[idx] = _Entry(key, access, pd, 1, addr, length)
            return key

    def deregister(self, key: int) -> None:
        with self.lock:
            idx = key >> 8
            if 0 < idx < self.cap and self.table[idx].key == key and self.table[idx].valid:
                self.table[idx].valid = 0
                self._free.append(idx)

    def _entry_ok(self, e, key: int, addr: int, n: int, need: int) -> bool:
        return bool(e.valid and e.key == key and (e.access & need) == need
                    and e.addr <= addr and addr + n <= e.addr + e.length)

    def _local_ok(self, key: int, addr: int, n: int, need: int, pd: int | None) -> bool:
        idx = key >> 8
        if not 0 < idx < self.cap:
            return False
        e = self.table[idx]
        return self._entry_ok(e, key, addr, n, need) and (pd is None or e.pd == pd)

    def _remote_entry(self, link: _Link, key: int):
        """The target's MR entry for ``key``, read from its process; None or an errno."""
        idx = key >> 8
        cap = link.peer["cap"]
        e = _Entry()
        if not 0 < idx < cap:
            return e                     # invalid: fails the check
        err = _cma(False, link.pid, [(ctypes.addressof(e), 32)],
                   [(link.peer["mrt"] + 32 * idx, 32)])
        return err or e

    # -- queue pairs ----------------------------------------------------------------------
    def add_qp(self, qp) -> int:
        with self.lock:
            self._next_qpn += 1
            self.qps[self._next_qpn] = qp
            return self._next_qpn

    def remove_qp(self, qp) -> None:
        with self.lock:
            self.fail_qp(qp, None, "destroyed")
            self.qps.pop(qp.qp_num, None)

    def doorbell(self, qp) -> None:
        with self.lock:
            self._ready.add(qp)
        os.eventfd_write(self.efd, 1)

    def link_to(self, remote: dict, timeout: float = 10.0) -> _Link:
        """The link to the NIC at ``remote`` (opened and authenticated on first use).

        Raises:
            TransportError: it cannot be reached or fails authentication in ``timeout``.
        """
        with self.lock:
            link = self.links.get(remote["id"])
            if link is not None and not link.dead:
                return link
        deadline = time.monotonic() + timeout
        try:
            sock, peer = dial(remote["ip"], remote["port"],
                              lambda: handshake.Connector(self.token, self.id, remote["id"]),
                              deadline,
                              lambda s: _exchange(s, self.address, deadline))
        except (OSError, HandshakeError) as exc:
            raise TransportError(f"NIC link to {remote['ip']}:{remote['port']} failed: "
                                 f"{exc}") from exc
        cma = bool(self.want_cma and peer.get("cma") and peer["host"] == host_identity())
        link = _Link(sock, peer, cma)
        if cma and not isinstance(self._remote_entry(link, 1 << 8), _Entry):
            link.cma = False                 # ptrace rules forbid it: use the link
        self._adopt(link)
        with self.lock:
            self.links[remote["id"]] = link
        return link

    def _adopt(self, link: _Link) -> None:
        link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.sock.setblocking(False)
        with self.lock:
            self._new.append(link)
        os.eventfd_write(self.efd, 1)

    def _admit(self) -> None:
        """The listener's thread: authenticate incoming links, hand them to the engine."""
        while self.running:
            try:
                admitted = self.gate.poll(0.5)
            except (OSError, ValueError):   # closed under us by close()
                return
            for sock, adm in admitted:
                try:
                    peer = parse_address(adm.blob)
                except HandshakeError:
                    sock.close()
                    continue
                self._adopt(_Link(sock, peer, False))

    # -- the engine loop ------------------------------------------------------------------
    def _run(self) -> None:
        while self.running:
            wait = 0.5
            if self._timers:
                wait = max(0.0, min(q.resume_at for q in self._timers) - time.monotonic())
            try:
                events = self.sel.select(wait)
            except (OSError, ValueError):
                if not self.running:
                    return
                raise
            with self.lock:
                if not self.running:
                    return
                for link in self._new:
                    self._all.append(link)
                    self.sel.register(link.sock, selectors.EVENT_READ, link)
                self._new.clear()
                for key, mask in events:
                    data = key.data
                    if data == "bell":
                        try:
                            os.eventfd_read(self.efd)
                        except BlockingIOError:
                            pass
                    elif isinstance(data, _Link):
                        if mask & selectors.EVENT_WRITE:
                            self._dirty.add(data)
                        if mask & selectors.EVENT_READ:
                            self._read(data)
                now = time.monotonic()
                for qp in [q for q in self._timers if q.resume_at <= now]:
                    self._timers.discard(qp)
                    self._ready.add(qp)
                while self._ready:
                    self._process(self._ready.pop())
                for link in list(self._dirty):
                    self._flush(link)

    def close(self) -> None:
        with self.lock:
            self.running = False
        try:
            os.eventfd_write(self.efd, 1)
        except OSError:
            pass
        self.gate.wakeup()
        self.thread.join(timeout=5.0)
        self.admitter.join(timeout=5.0)
        with self.lock:
            for qp in list(self.qps.values()):
                self.fail_qp(qp, None, "device closed")
            for link in self._all + self._new + list(self.links.values()):
                link.dead = True
                link.sock.close()
            self._all.clear()
            self.links.clear()
            self.sel.close()
            self.gate.close()
            os.close(self.efd)

    # -- requester side -------------------------------------------------------------------
    def _process(self, qp) -> None:
        """Start the send WQEs of ``qp`` that order and the window allow."""
        if qp.state != v.IBV_QPS_RTS:
            if qp.state == v.IBV_QPS_ERR:
                self.fail_qp(qp, None, qp.error or "QP in ERR")
            return
        if qp.resume_at > time.monotonic():
            self._timers.add(qp)
            return
        link = qp.link
        while qp.sq and qp.state == v.IBV_QPS_RTS:
            wr = qp.sq[0]
            op = wr.opcode
            need = v.IBV_ACCESS_LOCAL_WRITE if op == v.IBV_WR_RDMA_READ else 0
            sges = [(s.addr, s.length) for s in wr.sg_list]
            if not all(self._local_ok(s.lkey, s.addr, s.length, need, qp.pd.handle)
                       for s in wr.sg_list):
                qp.sq.popleft()
                self._fail_with(qp, wr, v.IBV_WC_LOC_PROT_ERR, "bad local key")
                return
            if link.dead:
                qp.sq.popleft()
                self._fail_with(qp, wr, v.IBV_WC_RETRY_EXC_ERR, "link to the peer is lost")
                return
            total = sum(n for _, n in sges)
            if link.cma and op != v.IBV_WR_SEND and op != v.IBV_WR_SEND_WITH_IMM:
                if qp.inflight:
                    return               # keep order: earlier requests must be ACKed first
                status = self._cma_op(link, wr, sges, total)
                if status != v.IBV_WC_SUCCESS:
                    qp.sq.popleft()
                    self._fail_with(qp, wr, status, v.wc_status_str(status))
                    return
                if op != v.IBV_WR_RDMA_WRITE_WITH_IMM:
                    qp.sq.popleft()
                    self._complete_send(qp, wr, v.IBV_WC_SUCCESS, total)
                    continue
            if len(qp.inflight) >= _WINDOW:
                return
            qp.sq.popleft()
            psn = qp.next_psn
            qp.next_psn = (psn + 1) & 0xFFFFFFFF
            qp.inflight.append([psn, wr, total])
            self._transmit(qp, link, psn, wr, sges, total)

    def _cma_op(self, link: _Link, wr, sges: list, total: int) -> int:
        write = wr.opcode != v.IBV_WR_RDMA_READ
        e = self._remote_entry(link, wr.rkey)
        if not isinstance(e, _Entry):
            return v.IBV_WC_RETRY_EXC_ERR if e == errno.ESRCH else v.IBV_WC_REM_OP_ERR
        need = v.IBV_ACCESS_REMOTE_WRITE if write else v.IBV_ACCESS_REMOTE_READ
        if not self._entry_ok(e, wr.rkey, wr.remote_addr, total, need):
            return v.IBV_WC_REM_ACCESS_ERR
        if total:
            err = _cma(write, link.pid, sges, [(wr.remote_addr, total)])
            if err:
                return v.IBV_WC_RETRY_EXC_ERR if err == errno.ESRCH else v.IBV_WC_REM_OP_ERR
        return v.IBV_WC_SUCCESS

    def _transmit(self, qp, link: _Link, psn: int, wr, sges: list, total: int) -> None:
        op = wr.opcode
        imm = F_IMM if op in (v.IBV_WR_SEND_WITH_IMM, v.IBV_WR_RDMA_WRITE_WITH_IMM) else 0
        dst = qp.remote[1]
        views = [address_view(a, n) for a, n in sges if n]
        if op in (v.IBV_WR_SEND, v.IBV_WR_SEND_WITH_IMM):
            if link.cma and total > _INLINE:
                iovs = b"".join(_IOV.pack(a, n) for a, n in sges if n)
                self._send(link, _MSG.pack(M_SEND, imm | F_PULL, 0, dst, qp.qp_num, psn,
                                           wr.imm_data, len(iovs) // 16, total, 0), [iovs])
            else:
                self._send(link, _MSG.pack(M_SEND, imm, 0, dst, qp.qp_num, psn, wr.imm_data,
                                           0, total, 0), views)
        elif op == v.IBV_WR_RDMA_READ:
            self._send(link, _MSG.pack(M_READ_REQ, 0, 0, dst, qp.qp_num, psn, 0, wr.rkey,
                                       total, wr.remote_addr), [])
        elif link.cma:                   # WRITE_WITH_IMM: data already placed by CMA
            self._send(link, _MSG.pack(M_IMM, F_IMM, 0, dst, qp.qp_num, psn, wr.imm_data, 0,
                                       total, 0), [])
        else:
            self._send(link, _MSG.pack(M_WRITE, imm, 0, dst, qp.qp_num, psn, wr.imm_data,
                                       wr.rkey, total, wr.remote_addr), views)

    def _acked(self, qp, upto: int) -> None:
        """Complete, in order, every in-flight request with a PSN before ``upto``."""
        inf = qp.inflight
        while inf and 0 < (upto - inf[0][0]) & 0xFFFFFFFF < 0x80000000:
            _, wr, total = inf.popleft()
            self._complete_send(qp, wr, v.IBV_WC_SUCCESS, total)
            qp.rnr_left = qp.rnr_retry

    def _on_nak(self, qp, psn: int, syndrome: int) -> None:
        self._acked(qp, psn)
        if not qp.inflight or qp.inflight[0][0] != psn:
            return
        if syndrome == NAK_RNR and (qp.rnr_retry == 7 or qp.rnr_left > 0):
            qp.rnr_left -= qp.rnr_retry != 7
            qp.sq.extendleft(reversed([e[1] for e in qp.inflight]))   # go back N
            qp.inflight.clear()
            qp.next_psn = psn
            qp.resume_at = time.monotonic() + qp.min_rnr_timer
            self._timers.add(qp)
            return
        status = v.IBV_WC_RNR_RETRY_EXC_ERR if syndrome == NAK_RNR else syndrome
        _, wr, _ = qp.inflight.popleft()
        self._fail_with(qp, wr, status, v.wc_status_str(status))

    # -- completions and errors -----------------------------------------------------------
    def _complete_send(self, qp, wr, status: int, byte_len: int) -> None:
        qp.outstanding -= 1
        if status == v.IBV_WC_SUCCESS and not wr.send_flags & v.IBV_SEND_SIGNALED:
            return
        if not qp.send_cq._push(v.WorkCompletion(wr.wr_id, status, qp.wc_opcode(wr.opcode),
                                                 byte_len, 0, qp.qp_num)):
            self.fail_qp(qp, None, "send CQ overrun")

    def _complete_recv(self, qp, status: int, opcode: int, byte_len: int, imm, rwr=None):
        rwr = rwr or qp.rq.popleft()
        wc = v.WorkCompletion(rwr.wr_id, status, opcode, byte_len, imm or 0, qp.qp_num,
                              v.IBV_WC_WITH_IMM if imm is not None else 0)
        if not qp.recv_cq._push(wc):
            self.fail_qp(qp, None, "receive CQ overrun")

    def _fail_with(self, qp, wr, status: int, why: str) -> None:
        qp.outstanding -= 1
        qp.send_cq._push(v.WorkCompletion(wr.wr_id, status, qp.wc_opcode(wr.opcode), 0, 0,
                                          qp.qp_num))
        self.fail_qp(qp, None, why)

    def fail_qp(self, qp, first_status: int | None, why: str) -> None:
        """Move ``qp`` to ERR; its first outstanding WQE gets ``first_status``, the rest
        (send and receive) IBV_WC_WR_FLUSH_ERR."""
        with self.lock:
            if qp.state != v.IBV_QPS_ERR:
                qp.state, qp.error = v.IBV_QPS_ERR, why
            pending = [e[1] for e in qp.inflight] + list(qp.sq)
            qp.inflight.clear()
            qp.sq.clear()
            for i, wr in enumerate(pending):
                st = first_status if i == 0 and first_status is not None else \
                    v.IBV_WC_WR_FLUSH_ERR
                qp.outstanding -= 1
                qp.send_cq._push(v.WorkCompletion(wr.wr_id, st, qp.wc_opcode(wr.opcode), 0,
                                                  0, qp.qp_num))
            while qp.rq:
                qp.recv_cq._push(v.WorkCompletion(qp.rq.popleft().wr_id,
                                                  v.IBV_WC_WR_FLUSH_ERR, v.IBV_WC_RECV, 0, 0,
                                                  qp.qp_num))

    def _link_lost(self, link: _Link) -> None:
        if link.dead:
            return
        link.dead = True
        try:
            self.sel.unregister(link.sock)
        except (KeyError, ValueError):
            pass
        link.sock.close()
        self._dirty.discard(link)
        for qp in list(self.qps.values()):
            if qp.remote is not None and qp.remote[0]["id"] == link.peer_id and \
                    qp.state != v.IBV_QPS_ERR:
                self.fail_qp(qp, v.IBV_WC_RETRY_EXC_ERR, "peer lost")
