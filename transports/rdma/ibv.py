"""The names and values of ``<infiniband/verbs.h>`` the emulation shares, and raw memory views.

Constants (``ibv_access_flags``, ``ibv_wr_opcode``, ``ibv_send_flags``, ``ibv_wc_status``,
``ibv_wc_opcode``, ``ibv_qp_state``), work requests and completions (``SGE``, ``SendWR``,
``RecvWR``, ``WorkCompletion``), :class:`VerbsError`, and the two address helpers
(:func:`buffer_address`: a buffer's address; :func:`address_view`: bytes at an address).
The bottom of the rdma package: the verbs objects (:mod:`transports.rdma.verbs`), the NIC
engine (:mod:`transports.rdma.nic`) and its responder (:mod:`transports.rdma.responder`)
all read them from here, so none of them needs another at import time.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from ..base import TransportError

__all__ = [
    "VerbsError", "SGE", "SendWR", "RecvWR", "WorkCompletion", "buffer_address",
    "IBV_ACCESS_LOCAL_WRITE", "IBV_ACCESS_REMOTE_WRITE", "IBV_ACCESS_REMOTE_READ",
    "IBV_WR_RDMA_WRITE", "IBV_WR_RDMA_WRITE_WITH_IMM", "IBV_WR_SEND",
    "IBV_WR_SEND_WITH_IMM", "IBV_WR_RDMA_READ", "IBV_SEND_SIGNALED", "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_SEND", "IBV_WC_RDMA_WRITE",
    "IBV_WC_RDMA_READ", "IBV_WC_RECV", "IBV_WC_RECV_RDMA_WITH_IMM", "IBV_WC_WITH_IMM",
    "IBV_QPS_RESET", "IBV_QPS_INIT", "IBV_QPS_RTR", "IBV_QPS_RTS", "IBV_QPS_ERR",
    "wc_status_str", "address_view",
]

# ibv_access_flags
IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ = 1, 2, 4
# ibv_wr_opcode
IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, \
    IBV_WR_RDMA_READ = 0, 1, 2, 3, 4
# ibv_send_flags
IBV_SEND_SIGNALED = 2
# ibv_wc_status
IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR = 0, 1, 4, 5
IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR = 9, 10, 11
IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR = 12, 13
# ibv_wc_opcode and ibv_wc_flags
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ = 0, 1, 2
IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM = 128, 129
IBV_WC_WITH_IMM = 2
# ibv_qp_state
IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR = 0, 1, 2, 3, 6

_STATUS = {0: "success", 1: "local length error", 4: "local protection error",
           5: "work request flushed", 9: "remote invalid request", 10: "remote access error",
           11: "remote operation error", 12: "transport retry counter exceeded",
           13: "RNR retry counter exceeded"}
def wc_status_str(status: int) -> str:
    """Text of an ``ibv_wc_status`` value (ibv_wc_status_str(3))."""
    return _STATUS.get(status, f"status {status}")


class VerbsError(TransportError):
    """A verb was refused synchronously (wrong QP state, queue full, CQ overrun, bad MR)."""


def buffer_address(buf) -> tuple[int, int, bool]:
    """(address, length in bytes, writable) of a contiguous buffer, without copying.

    Raises:
        VerbsError: the buffer is not C-contiguous.
    """
    view = memoryview(buf)
    if not view.c_contiguous:
        raise VerbsError("memory regions must be C-contiguous buffers")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    n = view.nbytes
    if not view.readonly:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view)) if n else 0
        return addr, n, True
    import numpy as np
    return (np.frombuffer(view, dtype=np.uint8).ctypes.data if n else 0), n, False


@dataclass(slots=True)
class SGE:
    """One scatter/gather element: ``length`` bytes at ``addr`` inside the MR of ``lkey``."""

    addr: int
    length: int
    lkey: int


@dataclass(slots=True)
class SendWR:
    """A send-queue work request (struct ibv_send_wr); ``remote_addr``/``rkey`` for RDMA."""

    wr_id: int = 0
    opcode: int = IBV_WR_SEND
    sg_list: list = field(default_factory=list)
    remote_addr: int = 0
    rkey: int = 0
    imm_data: int = 0
    send_flags: int = IBV_SEND_SIGNALED

    @property
    def num_sge(self) -> int:
        return len(self.sg_list)


@dataclass(slots=True)
class RecvWR:
    """A receive-queue work request (struct ibv_recv_wr): where an incoming SEND lands."""

    wr_id: int = 0
    sg_list: list = field(default_factory=list)


@dataclass(slots=True)
class WorkCompletion:
    """A completion (struct ibv_wc). ``byte_len`` is meaningful for receives and reads."""

    wr_id: int
    status: int
    opcode: int
    byte_len: int = 0
    imm_data: int = 0
    qp_num: int = 0
    wc_flags: int = 0


def address_view(addr: int, n: int) -> memoryview:
    """A writable byte view of ``n`` bytes at ``addr`` of this process (no copy)."""
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
