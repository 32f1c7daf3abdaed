"""Barrier latency, after OSU's ``osu_barrier``: one row, the average µs per ``Barrier``.

No Barrier is added between iterations (the call is one). ``--algorithm all`` times each
of ``pycomm.algorithms("barrier")`` and the automatic choice.

Run::

    python launch.py -n 4 benchmarks/osu_barrier.py
    mpiexec -n 4 python benchmarks/osu_barrier.py --mpi4py
"""

from _collective import Case, Collective, Ctx, main


def setup(ctx: Ctx, count: int) -> Case:
    """Nothing to move or check."""
    return Case(())


SPEC = Collective("barrier", "Barrier", "OSU MPI Barrier Latency Test", setup,
                  registry="barrier", sizes=None, size_note="no message: size 0",
                  iters=(10000, 1000, 10000, 1000))

if __name__ == "__main__":
    main(SPEC)
