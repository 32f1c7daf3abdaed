"""Allgatherv latency, after OSU's ``osu_allgatherv``: ``Allgather`` with per-rank counts.

``Allgatherv(sendbuf, [recvbuf, counts, displs])`` with every count equal to ``size``
bytes (as OSU does). algbw counts S = n x size; busbw uses allgather's (n-1)/n.

Run::

    python launch.py -n 4 benchmarks/osu_allgatherv.py
    mpiexec -n 4 python benchmarks/osu_allgatherv.py --mpi4py
"""

import numpy as np
from _collective import Case, Collective, Ctx, main
from _common import mismatch


def setup(ctx: Ctx, count: int) -> Case:
    """Block r of every rank's buffer must be rank r's pattern."""
    n = ctx.n
    send, recv = ctx.empty(count), ctx.empty(n * count)
    spec = [recv, [count] * n, [r * count for r in range(n)]]

    def fill(it: int) -> None:
        send[...] = ctx.pattern.data(ctx.rank, it, count)
        recv[...] = 0

    def check(it: int):
        want = np.concatenate([ctx.pattern.data(r, it, count) for r in range(n)])
        return mismatch(recv, want, "recvbuf")

    return Case((send, spec), {}, fill, check)


SPEC = Collective("allgatherv", "Allgatherv", "OSU MPI Allgatherv Latency Test", setup,
                  registry="allgatherv", per_rank=True,
                  size_note="size: bytes each rank contributes (equal counts)",
                  sizes=(1, 1 << 20))

if __name__ == "__main__":
    main(SPEC)
