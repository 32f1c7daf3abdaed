"""Verbs-level tests of the emulated RDMA device: two contexts, one RC QP each.

Every opcode on both NIC data paths (cross-memory attach and the TCP link), scatter/gather
lists, immediate data, ordering, and each error path of an RC QP: bad rkey, out of bounds,
missing access flag, deregistered region (REM_ACCESS_ERR, QP to ERR, the rest flushed),
RNR retry exhaustion, receive too small, wrong QP state, CQ overrun, queue depth, and a
peer that is SIGKILLed mid-stream (error completions, not a hang).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from transports.rdma import (
    IBV_ACCESS_LOCAL_WRITE as LW, IBV_ACCESS_REMOTE_READ as RR, IBV_ACCESS_REMOTE_WRITE as RW,
    IBV_QPS_ERR, IBV_WC_LOC_LEN_ERR, IBV_WC_RDMA_READ, IBV_WC_RDMA_WRITE, IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND, IBV_WC_SUCCESS,
    IBV_WC_WITH_IMM, IBV_WC_WR_FLUSH_ERR, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, CompletionQueue, Context,
    MemoryRegion, ProtectionDomain, QueuePair, RecvWR, SendWR, SGE, VerbsError,
)

N = 1 << 16


class Side:
    def __init__(self, cma: bool, depth: int = 256, **qp):
        self.ctx = Context(b"k" * 32, cma=cma)
        self.pd = ProtectionDomain(self.ctx)
        self.cq = CompletionQueue(self.ctx, depth)
        self.qp = QueuePair(self.pd, self.cq, self.cq, **qp)
        self.buf = np.zeros(N, np.uint8)
        self.mr = MemoryRegion(self.pd, self.buf, LW | RW | RR)

    def sge(self, off=0, n=N):
        return SGE(self.mr.addr + off, n, self.mr.lkey)

    def wait(self, n=1, timeout=10.0):
        got, end = [], time.monotonic() + timeout
        while len(got) < n and time.monotonic() < end:
            got += self.cq.poll(n - len(got))
            if len(got) < n:
                self.cq.wait(0.05)
        assert len(got) == n, f"{len(got)} of {n} completions within {timeout} s: {got}"
        return got


def connect(a: Side, b: Side, **rts):
    a.qp.to_init()
    b.qp.to_init()
    a.qp.to_rtr(b.ctx.address, b.qp.qp_num)
    b.qp.to_rtr(a.ctx.address, a.qp.qp_num)
    a.qp.to_rts(**rts)
    b.qp.to_rts(**rts)


@pytest.fixture(params=[True, False], ids=["cma", "link"])
def pair(request):
    a, b = Side(request.param), Side(request.param)
    connect(a, b)
    a.buf[:] = np.random.default_rng(1).integers(0, 256, N, dtype=np.uint8)
    yield a, b
    a.ctx.close()
    b.ctx.close()


@pytest.mark.parametrize("n", [0, 1, 100, 9000, N])
def test_send_recv(pair, n):
    a, b = pair
    b.qp.post_recv(RecvWR(7, [b.sge()]))
    a.qp.post_send(SendWR(1, IBV_WR_SEND, [a.sge(0, n)]))
    (s,) = a.wait()
    (r,) = b.wait()
    assert (s.wr_id, s.status, s.opcode) == (1, IBV_WC_SUCCESS, IBV_WC_SEND)
    assert (r.wr_id, r.status, r.opcode, r.byte_len, r.wc_flags) == (7, 0, IBV_WC_RECV, n, 0)
    assert (b.buf[:n] == a.buf[:n]).all()


def test_send_with_imm_and_sg_lists(pair):
    a, b = pair
    b.qp.post_recv(RecvWR(7, [b.sge(100, 10), b.sge(5000, 20000)]))
    a.qp.post_send(SendWR(1, IBV_WR_SEND_WITH_IMM, [a.sge(0, 15000), a.sge(30000, 5)],
                          imm_data=0xDEADBEEF))
    a.wait()
    (r,) = b.wait()
    assert (r.imm_data, r.wc_flags, r.byte_len) == (0xDEADBEEF, IBV_WC_WITH_IMM, 15005)
    sent = np.concatenate([a.buf[:15000], a.buf[30000:30005]])
    got = np.concatenate([b.buf[100:110], b.buf[5000:5000 + 14995]])
    assert (got == sent).all()


def test_rdma_write_and_read(pair):
    a, b = pair
    a.qp.post_send(SendWR(1, IBV_WR_RDMA_WRITE, [a.sge(0, 1000), a.sge(2000, 1000)],
                          remote_addr=b.mr.addr + 10, rkey=b.mr.rkey))
    (w,) = a.wait()
    assert (w.status, w.opcode) == (IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert (b.buf[10:1010] == a.buf[:1000]).all() and (b.buf[1010:2010] == a.buf[2000:3000]).all()
    assert not b.cq.poll(1)                       # one-sided: the target sees nothing
    b.qp.post_send(SendWR(2, IBV_WR_RDMA_READ, [b.sge(40000, 3000), b.sge(50000, 100)],
                          remote_addr=a.mr.addr + 500, rkey=a.mr.rkey))
    (r,) = b.wait()
    assert (r.status, r.opcode, r.byte_len) == (IBV_WC_SUCCESS, IBV_WC_RDMA_READ, 3100)
    assert (b.buf[40000:43000] == a.buf[500:3500]).all()
    assert (b.buf[50000:50100] == a.buf[3500:3600]).all()


def test_write_with_imm_consumes_a_receive(pair):
    a, b = pair
    b.qp.post_recv(RecvWR(9, []))
    a.qp.post_send(SendWR(1, IBV_WR_RDMA_WRITE_WITH_IMM, [a.sge(0, 4096)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey, imm_data=5))
    a.wait()
    (r,) = b.wait()
    assert (r.wr_id, r.opcode, r.imm_data, r.byte_len) == (9, IBV_WC_RECV_RDMA_WITH_IMM, 5, 4096)
    assert (b.buf[:4096] == a.buf[:4096]).all()


def test_order_and_unsignaled(pair):
    a, b = pair
    b.qp.post_recv([RecvWR(i, [b.sge(i * 8, 8)]) for i in range(32)])
    wrs = []
    for i in range(32):
        a.buf[i * 8:(i + 1) * 8] = i
        flags = 2 if i % 4 == 3 else 0             # only every fourth is signaled
        wrs.append(SendWR(i, IBV_WR_SEND, [a.sge(i * 8, 8)], send_flags=flags))
    a.qp.post_send(wrs)
    assert [w.wr_id for w in a.wait(8)] == [3, 7, 11, 15, 19, 23, 27, 31]
    assert [w.wr_id for w in b.wait(32)] == list(range(32))
    assert (b.buf[:256] == np.repeat(np.arange(32, dtype=np.uint8), 8)).all()
    # a WRITE then a SEND: the SEND's arrival proves the WRITE landed first
    b.qp.post_recv(RecvWR(99, [b.sge(60000, 8)]))
    a.qp.post_send([SendWR(1, IBV_WR_RDMA_WRITE, [a.sge(1000, 5000)],
                           remote_addr=b.mr.addr + 1000, rkey=b.mr.rkey, send_flags=0),
                    SendWR(2, IBV_WR_SEND, [a.sge(0, 8)])])
    b.wait()
    assert (b.buf[1000:6000] == a.buf[1000:6000]).all()


@pytest.mark.parametrize("fault", ["bad_rkey", "out_of_bounds", "no_access", "deregistered"])
@pytest.mark.parametrize("opcode", [IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ])
def test_remote_access_errors_flush_the_queue(pair, fault, opcode):
    a, b = pair
    rkey, addr, n = b.mr.rkey, b.mr.addr, 64
    if fault == "bad_rkey":
        rkey ^= 0x5500
    elif fault == "out_of_bounds":
        addr += N - 10
    elif fault == "no_access":
        ro = MemoryRegion(b.pd, np.zeros(128, np.uint8), LW)
        rkey, addr = ro.rkey, ro.addr
    else:
        b.mr.dereg()
    a.qp.post_recv(RecvWR(50, [a.sge()]))
    a.qp.post_send([SendWR(1, opcode, [a.sge(0, n)], remote_addr=addr, rkey=rkey),
                    SendWR(2, IBV_WR_SEND, [a.sge(0, 8)], send_flags=0)])
    wcs = a.wait(3)
    st = {w.wr_id: w.status for w in wcs}
    assert st == {1: IBV_WC_REM_ACCESS_ERR, 2: IBV_WC_WR_FLUSH_ERR, 50: IBV_WC_WR_FLUSH_ERR}
    assert a.qp.state == IBV_QPS_ERR
    a.qp.post_send(SendWR(3, IBV_WR_SEND, [a.sge(0, 8)]))        # posting in ERR: flushed
    assert a.wait()[0].status == IBV_WC_WR_FLUSH_ERR


@pytest.mark.parametrize("cma", [True, False], ids=["cma", "link"])
def test_rnr_retry_exceeded(cma):
    a, b = Side(cma), Side(cma)
    try:
        connect(a, b, rnr_retry=2, min_rnr_timer=0.001)
        a.qp.post_send(SendWR(1, IBV_WR_SEND, [a.sge(0, 16)]))
        (w,) = a.wait()
        assert w.status == IBV_WC_RNR_RETRY_EXC_ERR and a.qp.state == IBV_QPS_ERR
    finally:
        a.ctx.close()
        b.ctx.close()


def test_rnr_then_receive_posted_late(pair):
    a, b = pair                                    # rnr_retry=7: retries until posted
    a.qp.post_send([SendWR(i, IBV_WR_SEND, [a.sge(i, 1)]) for i in range(3)])
    time.sleep(0.02)
    b.qp.post_recv([RecvWR(i, [b.sge(i, 1)]) for i in range(3)])
    assert [w.wr_id for w in b.wait(3)] == [0, 1, 2]
    assert all(w.status == 0 for w in a.wait(3))
    assert (b.buf[:3] == a.buf[:3]).all()


def test_receive_too_small(pair):
    a, b = pair
    b.qp.post_recv(RecvWR(1, [b.sge(0, 10)]))
    a.qp.post_send(SendWR(2, IBV_WR_SEND, [a.sge(0, 11)]))
    assert b.wait()[0].status == IBV_WC_LOC_LEN_ERR
    assert a.wait()[0].status == IBV_WC_REM_INV_REQ_ERR


def test_wrong_state_and_queue_depth():
    a, b = Side(True, max_send_wr=4, max_recv_wr=2), Side(True)
    try:
        with pytest.raises(VerbsError, match="RESET"):
            a.qp.post_recv(RecvWR(1, [a.sge()]))
        a.qp.to_init()
        with pytest.raises(VerbsError, match="needs RTS"):
            a.qp.post_send(SendWR(1, IBV_WR_SEND, [a.sge(0, 1)]))
        with pytest.raises(VerbsError):
            a.qp.to_rts()                          # INIT -> RTS skips RTR
        a.qp.post_recv([RecvWR(1, [a.sge()]), RecvWR(2, [a.sge()])])
        with pytest.raises(VerbsError, match="receive queue full"):
            a.qp.post_recv(RecvWR(3, [a.sge()]))
        b.qp.to_init()
        a.qp.to_rtr(b.ctx.address, b.qp.qp_num)
        b.qp.to_rtr(a.ctx.address, a.qp.qp_num)
        a.qp.to_rts()
        with pytest.raises(VerbsError, match="send queue full"):
            a.qp.post_send([SendWR(i, IBV_WR_RDMA_WRITE, [a.sge(0, 1)], remote_addr=b.mr.addr,
                                   rkey=b.mr.rkey) for i in range(5)])
        with pytest.raises(VerbsError, match="REMOTE_WRITE requires"):
            MemoryRegion(a.pd, np.zeros(8, np.uint8), RW)
        with pytest.raises(VerbsError, match="read-only"):
            MemoryRegion(a.pd, b"abc", LW)
    finally:
        a.ctx.close()
        b.ctx.close()


def test_cq_overrun_is_an_error():
    a, b = Side(True, depth=4), Side(True)
    try:
        connect(a, b)
        a.qp.post_send([SendWR(i, IBV_WR_RDMA_WRITE, [a.sge(0, 1)], remote_addr=b.mr.addr,
                               rkey=b.mr.rkey) for i in range(6)])
        time.sleep(0.2)
        a.cq.poll(4)
        with pytest.raises(VerbsError, match="overrun"):
            a.cq.poll(4)
        assert a.qp.state == IBV_QPS_ERR
    finally:
        a.ctx.close()
        b.ctx.close()


def _target(conn, cma):
    side = Side(cma)
    side.qp.to_init()
    conn.send((side.ctx.address, side.qp.qp_num, side.mr.addr, side.mr.rkey))
    addr, qpn = conn.recv()
    side.qp.to_rtr(addr, qpn)
    side.qp.to_rts()
    conn.send("ready")
    time.sleep(60)                                 # killed long before


@pytest.mark.parametrize("cma", [True, False], ids=["cma", "link"])
def test_peer_killed_mid_stream(cma):
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(there, cma), daemon=True)
    proc.start()
    a = Side(cma, depth=4096, max_send_wr=4096)
    try:
        assert here.poll(30)
        addr, qpn, raddr, rkey = here.recv()
        a.qp.to_init()
        here.send((a.ctx.address, a.qp.qp_num))
        a.qp.to_rtr(addr, qpn)
        a.qp.to_rts()
        assert here.recv() == "ready"
        a.qp.post_send([SendWR(i, IBV_WR_RDMA_WRITE, [a.sge()], remote_addr=raddr, rkey=rkey,
                               send_flags=0) for i in range(1000)])
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        a.qp.post_send(SendWR(5000, IBV_WR_RDMA_READ, [a.sge()], remote_addr=raddr, rkey=rkey))
        end = time.monotonic() + 10
        errors = []
        while time.monotonic() < end and a.qp.outstanding:
            errors += [w for w in a.cq.poll(4096) if w.status]
            a.cq.wait(0.05)
        errors += [w for w in a.cq.poll(4096) if w.status]
        assert a.qp.outstanding == 0, "WQEs still outstanding after the peer died"
        assert a.qp.state == IBV_QPS_ERR
        assert errors[0].status in (IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR)
        assert errors[-1].wr_id == 5000
    finally:
        a.ctx.close()
        proc.kill()
