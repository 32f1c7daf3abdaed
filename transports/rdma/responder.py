"""What a NIC does with an incoming message: the responder half of RC, and the responses.

:func:`on_header` runs in the NIC thread (lock held) when a message header has arrived.
It validates everything that can be validated before a byte lands (QP state, PSN, receive
WQE, key, bounds, access) and returns ``(dest, nbytes, finish)``: the payload's
``nbytes`` land in ``dest`` (a view of registered memory or a staging buffer; None drops
them) and ``finish()`` then completes the operation and answers the initiator. Responses
(ACK, NAK, READ_RESP) go back on the link the request came in on, so per QP they reach
the initiator in order.
"""

from __future__ import annotations

from . import ibv as v
from ..linux import copy_remote as _cma
from .ibv import address_view
from .wire import (_IOV, _MSG, F_IMM, F_PULL, M_ACK, M_IMM, M_NAK, M_READ_REQ, M_READ_RESP,
                   M_SEND, M_WRITE, NAK_RNR)

__all__ = ["on_header"]


def _scatter(src, sges: list) -> None:
    off = 0
    for a, n in sges:
        address_view(a, n)[:] = src[off:off + n]
        off += n


def _clip(sges: list, n: int) -> list:
    out = []
    for a, ln in sges:
        if n <= 0:
            break
        out.append((a, min(ln, n)))
        n -= ln
    return out


def on_header(nic, link, msg):
    kind, flags, _, dst, src, psn, imm, rkey, length, raddr = msg
    qp = nic.qps.get(dst)
    if kind == M_ACK:
        if qp is not None:
            nic._acked(qp, (psn + 1) & 0xFFFFFFFF)
            nic._ready.add(qp)
        return None, 0, None
    if kind == M_NAK:
        if qp is not None:
            nic._on_nak(qp, psn, imm)
            nic._ready.add(qp)
        return None, 0, None
    if kind == M_READ_RESP:
        return _read_response(nic, qp, psn, length)

    wire = 16 * rkey if kind == M_SEND and flags & F_PULL else \
        length if kind in (M_SEND, M_WRITE) else 0

    def answer(kind_, syndrome=0, payload=()):
        nic._send(link, _MSG.pack(kind_, 0, 0, src, dst, psn, syndrome, 0, length, 0),
                  list(payload))

    def nak(syndrome):
        return None, wire, lambda: answer(M_NAK, syndrome)

    if qp is None:
        return nak(v.IBV_WC_REM_INV_REQ_ERR)
    if qp.state == v.IBV_QPS_ERR:
        return nak(v.IBV_WC_REM_OP_ERR)
    if qp.remote is None:               # not yet RTR: the initiator retries, as for RNR
        return nak(NAK_RNR)
    if psn != qp.epsn:                  # after a NAK: dropped until the retransmission
        return None, wire, None
    imm_v = imm if flags & F_IMM else None

    if kind == M_READ_REQ:
        if not nic._local_ok(rkey, raddr, length, v.IBV_ACCESS_REMOTE_READ, None):
            return nak(v.IBV_WC_REM_ACCESS_ERR)
        qp.epsn = (psn + 1) & 0xFFFFFFFF
        answer(M_READ_RESP, 0, [address_view(raddr, length)] if length else [])
        return None, 0, None

    if kind == M_WRITE and not nic._local_ok(rkey, raddr, length,
                                              v.IBV_ACCESS_REMOTE_WRITE, None):
        return nak(v.IBV_WC_REM_ACCESS_ERR)
    needs_wqe = kind in (M_SEND, M_IMM) or imm_v is not None
    rwr = None
    if needs_wqe:
        if not qp.rq:
            return nak(NAK_RNR)
        rwr = qp.rq.popleft()
        sges = [(s.addr, s.length) for s in rwr.sg_list]
        if not all(nic._local_ok(s.lkey, s.addr, s.length, v.IBV_ACCESS_LOCAL_WRITE,
                                 qp.pd.handle) for s in rwr.sg_list):
            return _recv_error(nic, qp, rwr, v.IBV_WC_LOC_PROT_ERR, wire, answer)
        if kind == M_SEND and length > sum(n for _, n in sges):
            return _recv_error(nic, qp, rwr, v.IBV_WC_LOC_LEN_ERR, wire, answer)

    def complete(status=v.IBV_WC_SUCCESS):
        qp.epsn = (psn + 1) & 0xFFFFFFFF
        if rwr is not None:
            if qp.state == v.IBV_QPS_ERR:
                status = v.IBV_WC_WR_FLUSH_ERR
            op = v.IBV_WC_RECV if kind == M_SEND else v.IBV_WC_RECV_RDMA_WITH_IMM
            nic._complete_recv(qp, status, op, length, imm_v, rwr)
        if status == v.IBV_WC_SUCCESS:
            answer(M_ACK)
        else:
            answer(M_NAK, v.IBV_WC_REM_OP_ERR)
            nic.fail_qp(qp, None, v.wc_status_str(status))

    if kind == M_IMM:
        complete()
        return None, 0, None
    if kind == M_WRITE:
        return (address_view(raddr, length) if length else None), length, complete
    sges = _clip(sges, length)
    if flags & F_PULL:
        buf = bytearray(wire)

        def pull():
            iovs = [_IOV.unpack_from(buf, i) for i in range(0, wire, 16)]
            err = _cma(False, link.pid, sges, iovs) if length else 0
            complete(v.IBV_WC_REM_OP_ERR if err else v.IBV_WC_SUCCESS)
        return memoryview(buf), wire, pull
    if len(sges) == 1:
        return address_view(*sges[0]), length, complete
    buf = bytearray(length)

    def scatter():
        _scatter(buf, sges)
        complete()
    return memoryview(buf), length, scatter


def _recv_error(nic, qp, rwr, status, wire, answer):
    def finish():
        nic._complete_recv(qp, status, v.IBV_WC_RECV, 0, None, rwr)
        answer(M_NAK, v.IBV_WC_REM_INV_REQ_ERR if status == v.IBV_WC_LOC_LEN_ERR
               else v.IBV_WC_REM_OP_ERR)
        nic.fail_qp(qp, None, v.wc_status_str(status))
    return None, wire, finish


def _read_response(nic, qp, psn, length):
    if qp is None:
        return None, length, None
    nic._acked(qp, psn)                 # a read response acknowledges what precedes it
    if not qp.inflight or qp.inflight[0][0] != psn:
        return None, length, None
    wr = qp.inflight[0][1]
    sges = _clip([(s.addr, s.length) for s in wr.sg_list], length)

    def finish(buf=None):
        if buf is not None:
            _scatter(buf, sges)
        if qp.inflight and qp.inflight[0][0] == psn:
            qp.inflight.popleft()
            nic._complete_send(qp, wr, v.IBV_WC_SUCCESS, length)
            nic._ready.add(qp)
    if len(sges) <= 1:
        return (address_view(*sges[0]) if sges else None), length, finish
    buf = bytearray(length)
    return memoryview(buf), length, lambda: finish(buf)
