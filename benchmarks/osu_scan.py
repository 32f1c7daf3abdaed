"""Scan latency, after OSU's ``osu_scan``: inclusive prefix ``Scan(sendbuf, recvbuf, SUM)``.

Rank r must end with the sum of ranks 0..r's patterns (``-c``). algbw = size / t; nccl-tests
has no scan, so there is no busbw.

Run::

    python launch.py -n 4 benchmarks/osu_scan.py
    mpiexec -n 4 python benchmarks/osu_scan.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Rank r's result is the sum of ranks 0..r."""
    send, recv = ctx.empty(count), ctx.empty(count)

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        recv[...] = 0

    def check(it: int):
        return mismatch(recv, ctx.pattern.total(range(ctx.rank + 1), it, count), "recvbuf")

    return Case((send, recv), {"op": ctx.c.mod.SUM}, fill, check)


SPEC = Collective("scan", "Scan", "OSU MPI Scan Latency Test", setup, registry="scan",
                  sizes=(4, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
