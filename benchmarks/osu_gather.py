"""Gather latency and bus bandwidth, after OSU's ``osu_gather`` and nccl-tests.

``Gather(sendbuf, recvbuf, root)``: every rank sends ``size`` bytes, the root receives
n x size. algbw counts S = n x size; busbw = algbw (n-1)/n (nccl-tests' gather).

Run::

    python launch.py -n 4 benchmarks/osu_gather.py [--algorithm binomial|linear|all]
    mpiexec -n 4 python benchmarks/osu_gather.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block r of the root's buffer must be rank r's pattern."""
    send = ctx.empty(count)
    recv = ctx.empty(ctx.n * count) if ctx.rank == ctx.root else None

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        if recv is not None:
            recv[...] = 0

    def check(it: int):
        if recv is None:
            return None
        want = np.concatenate([ctx.pattern.data(r, it, count) for r in range(ctx.n)])
        return mismatch(recv, want, "recvbuf")

    return Case((send, recv), {"root": ctx.root}, fill, check)


SPEC = Collective("gather", "Gather", "OSU MPI Gather Latency Test", setup, registry="gather",
                  per_rank=True, size_note="size: bytes each rank sends", sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
