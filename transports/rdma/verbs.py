"""Verbs objects after libibverbs / rdma-core's pyverbs, executed by an emulated NIC.

Names and constant values follow ``<infiniband/verbs.h>`` (``ibv_wr_opcode``,
``ibv_wc_status``, ``ibv_wc_opcode``, ``ibv_access_flags``, ``ibv_qp_state``) and the shape
of pyverbs (``Context``, ``PD``, ``MR``, ``CQ``, ``QP``, ``SGE``, ``SendWR``, ``RecvWR``,
``WC``). The application thread only *posts* work requests and *polls* completions; the
NIC thread of the :class:`Context` (:mod:`transports.rdma.nic`) does every transfer.

Connecting two queue pairs is done as ``ibv_rc_pingpong`` does it: each side creates a QP,
moves it to INIT, exchanges ``(ctx.address, qp.qp_num)`` out of band (pycomm's rendezvous
store), then calls ``to_rtr(remote_address, remote_qpn)`` and ``to_rts()``.

Semantics kept from a reliable-connected (RC) QP (see ibv_post_send(3), ibv_poll_cq(3)):

- Work requests of one QP execute and complete in order.
- SEND / SEND_WITH_IMM consume the receive WQE at the head of the peer's receive queue;
  RDMA_WRITE_WITH_IMM consumes one and reports ``imm_data`` (byte_len = bytes written).
- A remote access with a wrong or deregistered rkey, outside the region, or without the
  access flag completes with ``IBV_WC_REM_ACCESS_ERR``; the QP moves to ERR and every
  outstanding WQE (send and receive) completes with ``IBV_WC_WR_FLUSH_ERR``.
- A SEND that finds no receive WQE is NAKed "receiver not ready" and retried every
  ``min_rnr_timer`` seconds, ``rnr_retry`` times (7 = forever, as in the IB spec), then
  completes with ``IBV_WC_RNR_RETRY_EXC_ERR``.
- A lost peer (its NIC link drops, or its process is gone) completes the WQE in progress
  with ``IBV_WC_RETRY_EXC_ERR`` and flushes the rest: no wait ever hangs on a dead peer.
- Posting on a QP in the wrong state, or beyond ``max_send_wr`` / ``max_recv_wr``
  outstanding WQEs, raises :class:`VerbsError` at once (libibverbs returns EINVAL/ENOMEM).
- A completion that finds its CQ full puts the CQ in error (``IBV_EVENT_CQ_ERR``): the next
  ``poll`` raises and the QP that overran it moves to ERR. Nothing is dropped silently.

Emulation differences: lkey == rkey (as on mlx5); the responder QP stays usable after it
rejected a remote access (real HW also moves it to ERR); remote keys are checked against
the target *context*'s MR table, not the target QP's PD.
"""

from __future__ import annotations

import threading
from collections import deque

# re-exported: transports.rdma exposes the verbs.h names with the verbs objects
from .ibv import (VerbsError, SGE, SendWR, RecvWR, WorkCompletion, buffer_address,
                  IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
                  IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
                  IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, IBV_WC_SUCCESS,
                  IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR,
                  IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR,
                  IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND,
                  IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_RECV,
                  IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_WITH_IMM, IBV_QPS_RESET, IBV_QPS_INIT,
                  IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR, wc_status_str)
from .nic import Nic

__all__ = [
    "VerbsError", "Context", "ProtectionDomain", "MemoryRegion", "CompletionQueue",
    "QueuePair", "SGE", "SendWR", "RecvWR", "WorkCompletion", "buffer_address",
    "IBV_ACCESS_LOCAL_WRITE", "IBV_ACCESS_REMOTE_WRITE", "IBV_ACCESS_REMOTE_READ",
    "IBV_WR_RDMA_WRITE", "IBV_WR_RDMA_WRITE_WITH_IMM", "IBV_WR_SEND", "IBV_WR_SEND_WITH_IMM",
    "IBV_WR_RDMA_READ", "IBV_SEND_SIGNALED", "IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR", "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_SEND", "IBV_WC_RDMA_WRITE", "IBV_WC_RDMA_READ",
    "IBV_WC_RECV", "IBV_WC_RECV_RDMA_WITH_IMM", "IBV_WC_WITH_IMM", "IBV_QPS_RESET",
    "IBV_QPS_INIT", "IBV_QPS_RTR", "IBV_QPS_RTS", "IBV_QPS_ERR", "wc_status_str",
]

_WC_OF = {IBV_WR_RDMA_WRITE: IBV_WC_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM: IBV_WC_RDMA_WRITE,
          IBV_WR_SEND: IBV_WC_SEND, IBV_WR_SEND_WITH_IMM: IBV_WC_SEND,
          IBV_WR_RDMA_READ: IBV_WC_RDMA_READ}


class Context:
    """An emulated RDMA device context (ibv_open_device); owns the NIC engine thread.

    Args:
        token: secret authenticating NIC-to-NIC links (HMAC, :mod:`transports.handshake`).
        host: address the NIC listens on for links (default loopback).
        cma: allow cross-memory-attach one-sided copies towards same-host peers.
        max_mr: capacity of the memory-region table.
    """

    def __init__(self, token: bytes = b"pycomm-rdma", *, host: str = "127.0.0.1",
                 cma: bool = True, max_mr: int = 4096):
        self.nic = Nic(token, host=host, cma=cma, max_mr=max_mr)
        self.closed = False

    @property
    def address(self) -> dict:
        """This device's address for peers' ``to_rtr`` (msgpack-able; like a GID + LID)."""
        return self.nic.address

    def close(self) -> None:
        """Stop the NIC thread, drop every link; QPs move to ERR. Idempotent."""
        if not self.closed:
            self.closed = True
            self.nic.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ProtectionDomain:
    """A protection domain (ibv_alloc_pd): local keys are valid only on QPs of their PD."""

    _next = 1

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.handle = ProtectionDomain._next
        ProtectionDomain._next += 1


class MemoryRegion:
    """A registered buffer (ibv_reg_mr): what the NIC may touch, with which rights.

    Args:
        pd: the protection domain.
        buffer: any C-contiguous buffer (numpy array, bytearray, memoryview); it is kept
            alive until :meth:`dereg`. Read-only buffers may only be registered without
            write access.
        access: OR of ``IBV_ACCESS_*``. REMOTE_WRITE requires LOCAL_WRITE (ibv_reg_mr(3)).

    Attributes:
        addr, length: the region (bytes); lkey, rkey: its keys (equal here).

    Raises:
        VerbsError: bad access flags, read-only buffer with write access, table full.
    """

    def __init__(self, pd: ProtectionDomain, buffer, access: int = IBV_ACCESS_LOCAL_WRITE):
        addr, length, writable = buffer_address(buffer)
        if access & IBV_ACCESS_REMOTE_WRITE and not access & IBV_ACCESS_LOCAL_WRITE:
            raise VerbsError("IBV_ACCESS_REMOTE_WRITE requires IBV_ACCESS_LOCAL_WRITE")
        if not writable and access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE):
            raise VerbsError("a read-only buffer cannot be registered with write access")
        self.pd, self.buffer, self.access = pd, buffer, access
        self.addr, self.length = addr, length
        self.lkey = self.rkey = pd.ctx.nic.register(addr, length, access, pd.handle)
        self.valid = True

    def dereg(self) -> None:
        """Invalidate both keys (ibv_dereg_mr); later accesses fail. Idempotent."""
        if self.valid:
            self.valid = False
            self.pd.ctx.nic.deregister(self.lkey)
            self.buffer = None

    close = dereg


class CompletionQueue:
    """A completion queue (ibv_create_cq) with its completion channel.

    Args:
        ctx: the device context.
        depth: most completions it holds; one more is an overrun (the CQ enters error).
    """

    def __init__(self, ctx: Context, depth: int = 256):
        if depth < 1:
            raise VerbsError(f"CQ depth must be >= 1, got {depth}")
        self.ctx, self.depth = ctx, depth
        self._q: deque[WorkCompletion] = deque()
        self._cv = threading.Condition(threading.Lock())
        self.overrun = False

    def _push(self, wc: WorkCompletion) -> bool:
        """NIC side: add a completion; False (and error state) if the CQ is full."""
        with self._cv:
            if len(self._q) >= self.depth:
                self.overrun = True
                self._cv.notify_all()
                return False
            self._q.append(wc)
            self._cv.notify_all()
            return True

    def poll(self, num_entries: int = 1) -> list[WorkCompletion]:
        """Take up to ``num_entries`` completions, oldest first (ibv_poll_cq); never blocks.

        Raises:
            VerbsError: the CQ overran (completions were lost, as with IBV_EVENT_CQ_ERR).
        """
        q = self._q
        if not q:
            if self.overrun:
                raise VerbsError(f"completion queue overrun (depth {self.depth})")
            return []
        with self._cv:
            n = min(num_entries, len(q))
            return [q.popleft() for _ in range(n)]

    def wait(self, timeout: float) -> bool:
        """Sleep until a completion is queued or ``timeout`` seconds pass; True if one is.

        The completion channel of ibv_get_cq_event(3), without the arm/ack dance.
        """
        with self._cv:
            if not self._q and not self.overrun:
                self._cv.wait(max(timeout, 0.0))
            return bool(self._q) or self.overrun

    def notify(self) -> None:
        """Wake threads sleeping in :meth:`wait` (callable from any thread)."""
        with self._cv:
            self._cv.notify_all()

    def __len__(self) -> int:
        return len(self._q)


class QueuePair:
    """A reliable-connected queue pair (ibv_create_qp, IBV_QPT_RC).

    Args:
        pd: protection domain of the local keys it may use.
        send_cq, recv_cq: where send and receive completions go (may be the same CQ).
        max_send_wr, max_recv_wr: most outstanding (posted, not completed) WQEs.

    Attributes:
        qp_num: this QP's number (exchanged out of band); state: ``IBV_QPS_*``.
    """

    def __init__(self, pd: ProtectionDomain, send_cq: CompletionQueue,
                 recv_cq: CompletionQueue, max_send_wr: int = 128, max_recv_wr: int = 128):
        self.pd, self.send_cq, self.recv_cq = pd, send_cq, recv_cq
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.nic = pd.ctx.nic
        self.state = IBV_QPS_RESET
        self.lock = self.nic.lock     # one lock per NIC: posts and NIC work serialise
        self.sq: deque = deque()          # posted, not started (NIC pops)
        self.inflight: deque = deque()    # started, awaiting an ACK: [psn, wr, kind]
        self.rq: deque = deque()          # posted receive WQEs
        self.outstanding = 0              # send WQEs posted and not yet completed
        self.remote = None                # (remote context address, remote qpn)
        self.link = None
        self.next_psn = self.epsn = 0
        self.rnr_retry, self.min_rnr_timer, self.rnr_left = 7, 0.0005, 7
        self.resume_at = 0.0
        self.error: str | None = None
        self.qp_num = self.nic.add_qp(self)

    # -- state machine (ibv_modify_qp) ----------------------------------------------------
    def to_init(self) -> None:
        """RESET -> INIT: receive WQEs may be posted from now on."""
        self._move(IBV_QPS_RESET, IBV_QPS_INIT)

    def to_rtr(self, remote_address: dict, remote_qpn: int) -> None:
        """INIT -> RTR: connect to ``remote_qpn`` on the device at ``remote_address``.

        Raises:
            VerbsError: wrong state; TransportError: the remote NIC cannot be reached.
        """
        if self.state != IBV_QPS_INIT:
            raise VerbsError(f"QP {self.qp_num}: to_rtr needs INIT, state is {self.state}")
        self.link = self.nic.link_to(remote_address)
        self.remote = (remote_address, remote_qpn)
        self.state = IBV_QPS_RTR

    def to_rts(self, *, rnr_retry: int = 7, min_rnr_timer: float = 0.0005) -> None:
        """RTR -> RTS: send WQEs may be posted. ``rnr_retry`` 7 means retry forever."""
        self._move(IBV_QPS_RTR, IBV_QPS_RTS)
        self.rnr_retry, self.rnr_left, self.min_rnr_timer = rnr_retry, rnr_retry, min_rnr_timer

    def to_err(self) -> None:
        """Any state -> ERR: every outstanding WQE completes with IBV_WC_WR_FLUSH_ERR."""
        self.nic.fail_qp(self, None, "moved to ERR by the application")

    def _move(self, want: int, to: int) -> None:
        if self.state != want:
            raise VerbsError(f"QP {self.qp_num}: transition to {to} needs state {want}, "
                             f"state is {self.state}")
        self.state = to

    # -- posting --------------------------------------------------------------------------
    def post_send(self, wr: SendWR | list) -> None:
        """Queue send WQEs (ibv_post_send) and ring the NIC's doorbell.

        Raises:
            VerbsError: the QP is not in RTS (or ERR, where WQEs are flushed), or more than
                ``max_send_wr`` WQEs would be outstanding, or an unknown opcode.
        """
        wrs = wr if isinstance(wr, list) else [wr]
        for w in wrs:
            if w.opcode not in _WC_OF:
                raise VerbsError(f"QP {self.qp_num}: unknown opcode {w.opcode}")
        with self.lock:
            if self.state not in (IBV_QPS_RTS, IBV_QPS_ERR):
                raise VerbsError(f"QP {self.qp_num}: post_send needs RTS, state is "
                                 f"{self.state}")
            if self.outstanding + len(wrs) > self.max_send_wr:
                raise VerbsError(f"QP {self.qp_num}: send queue full ({self.max_send_wr} "
                                 "outstanding WQEs)")
            self.outstanding += len(wrs)
            self.sq.extend(wrs)
        self.nic.doorbell(self)

    def post_recv(self, wr: RecvWR | list) -> None:
        """Queue receive WQEs (ibv_post_recv).

        Raises:
            VerbsError: the QP is in RESET, or more than ``max_recv_wr`` would be posted.
        """
        wrs = wr if isinstance(wr, list) else [wr]
        with self.lock:
            if self.state == IBV_QPS_RESET:
                raise VerbsError(f"QP {self.qp_num}: post_recv in RESET")
            if len(self.rq) + len(wrs) > self.max_recv_wr:
                raise VerbsError(f"QP {self.qp_num}: receive queue full ({self.max_recv_wr} "
                                 "WQEs)")
            self.rq.extend(wrs)
        if self.state == IBV_QPS_ERR:
            self.nic.fail_qp(self, None, self.error or "QP in ERR")

    def close(self) -> None:
        """Destroy the QP (ibv_destroy_qp): it stops accepting traffic."""
        self.nic.remove_qp(self)

    @staticmethod
    def wc_opcode(wr_opcode: int) -> int:
        return _WC_OF[wr_opcode]
