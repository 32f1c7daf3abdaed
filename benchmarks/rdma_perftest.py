"""perftest-style microbenchmarks of the emulated RDMA device (ib_write_bw, ib_read_bw,
ib_write_lat, ib_send_lat from linux-rdma/perftest), run on two ranks::

    python launch.py -n 2 benchmarks/rdma_perftest.py write_bw [-s 65536] [-n 2000]
    python launch.py -n 2 benchmarks/rdma_perftest.py read_bw|write_lat|send_lat [--no-cma]

pycomm is used only as the out-of-band channel (exchanging device addresses, QP numbers
and rkeys, and barriers), as perftest uses its TCP side channel; every measured byte
moves through verbs. Bandwidth tests keep ``--tx-depth`` WQEs in flight from rank 0 and
signal every 16th; BW average is in MB/s (1 MB = 2^20 bytes, as perftest prints) and
MsgRate in Mpps. Latency tests ping-pong and report t_avg = round trip / 2 in µs:
write_lat polls the last byte of the destination buffer as ib_write_lat does; send_lat
polls the receive CQ.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pycomm
from transports.rdma import (
    IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE, IBV_WR_SEND, CompletionQueue, Context, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWR, SendWR, SGE,
)


def _setup(comm, nbytes: int, depth: int, cma: bool):
    ctx = Context(b"perftest", cma=cma)
    pd = ProtectionDomain(ctx)
    cq = CompletionQueue(ctx, 4 * depth + 16)
    qp = QueuePair(pd, cq, cq, max_send_wr=depth + 16, max_recv_wr=depth + 16)
    buf = np.zeros(max(nbytes, 1), np.uint8)
    mr = MemoryRegion(pd, buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                      IBV_ACCESS_REMOTE_READ)
    qp.to_init()
    peer = comm.allgather((ctx.address, qp.qp_num, mr.addr, mr.rkey))[1 - comm.rank]
    qp.to_rtr(peer[0], peer[1])
    qp.to_rts()
    comm.Barrier()
    return ctx, cq, qp, buf, mr, peer[2], peer[3]


def _poll(cq, n: int, timeout: float = 60.0) -> list:
    got, end = [], time.monotonic() + timeout
    while len(got) < n:
        wcs = cq.poll(n - len(got))
        if not wcs:
            if time.monotonic() > end:
                raise TimeoutError(f"{len(got)} of {n} completions")
            cq.wait(0.01)
        for w in wcs:
            if w.status:
                raise RuntimeError(f"completion error {w}")
        got += wcs
    return got


def bw(comm, args, opcode) -> tuple[int, float]:
    n, iters, depth = args.size, args.iters, args.tx_depth
    ctx, cq, qp, buf, mr, raddr, rkey = _setup(comm, n, depth, args.cma)
    try:
        if comm.rank == 0:
            sge = [SGE(mr.addr, n, mr.lkey)]
            posted = done = 0
            t0 = time.perf_counter()
            while done < iters:
                while posted < iters and posted - done < depth:
                    k = min(16, iters - posted, depth - (posted - done))
                    qp.post_send([SendWR(posted + i, opcode, sge, raddr, rkey,
                                         send_flags=2 if i == k - 1 else 0)
                                  for i in range(k)])
                    posted += k
                wcs = _poll(cq, 1)
                done = wcs[-1].wr_id + 1
            dt = time.perf_counter() - t0
        comm.Barrier()
        return (iters, dt) if comm.rank == 0 else (iters, 0.0)
    finally:
        ctx.close()


def write_lat(comm, args) -> tuple[int, float]:
    n, iters = max(args.size, 1), args.iters
    # first half: what this rank writes from; second half: where the peer writes to
    ctx, cq, qp, buf, mr, raddr, rkey = _setup(comm, 2 * n, 16, args.cma)
    try:
        sge = [SGE(mr.addr, n, mr.lkey)]
        raddr += n
        t0 = time.perf_counter()
        for it in range(iters):
            tag = (it % 250) + 1
            if comm.rank == 0:
                buf[n - 1] = tag
                qp.post_send(SendWR(it, IBV_WR_RDMA_WRITE, sge, raddr, rkey, send_flags=0))
            while buf[2 * n - 1] != tag:             # ib_write_lat polls memory
                time.sleep(0)                        # let this process's NIC thread run
            if comm.rank == 1:
                buf[n - 1] = tag
                qp.post_send(SendWR(it, IBV_WR_RDMA_WRITE, sge, raddr, rkey, send_flags=0))
        dt = time.perf_counter() - t0
        comm.Barrier()
        return iters, dt
    finally:
        ctx.close()


def send_lat(comm, args) -> tuple[int, float]:
    n, iters = args.size, args.iters
    ctx, cq, qp, buf, mr, _, _ = _setup(comm, n, 16, args.cma)
    try:
        sge = [SGE(mr.addr, n, mr.lkey)]
        qp.post_recv([RecvWR(i, sge) for i in range(8)])
        comm.Barrier()
        t0 = time.perf_counter()
        for it in range(iters):
            if comm.rank == 0:
                qp.post_send(SendWR(it, IBV_WR_SEND, sge, send_flags=0))
            while True:                              # wait for the peer's SEND
                wcs = cq.poll(1)
                if wcs:
                    break
                time.sleep(0)
            qp.post_recv(RecvWR(it, sge))
            if comm.rank == 1:
                qp.post_send(SendWR(it, IBV_WR_SEND, sge, send_flags=0))
        dt = time.perf_counter() - t0
        comm.Barrier()
        return iters, dt
    finally:
        ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("test", choices=["write_bw", "read_bw", "write_lat", "send_lat"])
    ap.add_argument("-s", "--size", type=int, default=None,
                    help="message bytes (default: a sweep 2..8 MiB for bw, 2..64 KiB lat)")
    ap.add_argument("-n", "--iters", type=int, default=None)
    ap.add_argument("--tx-depth", type=int, default=128)
    ap.add_argument("--no-cma", dest="cma", action="store_false",
                    help="force the NIC-to-NIC link path (as between hosts)")
    args = ap.parse_args()
    comm = pycomm.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("rdma_perftest needs exactly 2 ranks (python launch.py -n 2 ...)")
    lat = args.test.endswith("lat")
    sizes = [args.size] if args.size is not None else \
        [2 ** k for k in range(1, 17 if lat else 24, 1 if lat else 2)]
    if comm.rank == 0:
        print(f"# rdma_perftest {args.test}  path={'cma' if args.cma else 'link'}  "
              f"tx_depth={args.tx_depth}")
        print(f"{'#bytes':>10} {'#iterations':>12} " +
              (f"{'t_avg[usec]':>12}" if lat else f"{'BW average[MB/sec]':>19} "
               f"{'MsgRate[Mpps]':>14}"))
    for n in sizes:
        a = argparse.Namespace(**vars(args))
        a.size = n
        a.iters = args.iters or (2000 if n <= 65536 else max(50, (64 << 20) // n))
        if args.test == "write_bw":
            it, dt = bw(comm, a, IBV_WR_RDMA_WRITE)
        elif args.test == "read_bw":
            it, dt = bw(comm, a, IBV_WR_RDMA_READ)
        elif args.test == "write_lat":
            it, dt = write_lat(comm, a)
        else:
            it, dt = send_lat(comm, a)
        if comm.rank == 0:
            if lat:
                print(f"{n:>10} {it:>12} {dt / it / 2 * 1e6:>12.2f}", flush=True)
            else:
                print(f"{n:>10} {it:>12} {n * it / dt / 2**20:>19.2f} "
                      f"{it / dt / 1e6:>14.6f}", flush=True)


if __name__ == "__main__":
    main()
