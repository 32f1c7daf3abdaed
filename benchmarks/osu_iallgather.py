"""Nonblocking Allgather with compute overlap, after OSU's ``osu_iallgather``.

``osu_allgather.py``'s spec made nonblocking by ``_collective.nonblocking`` (Pure Comm.,
Overall, Compute and Overlap columns; ``--compute sleep|busy``). Run::

    python launch.py -n 4 benchmarks/osu_iallgather.py [--compute busy]
    mpiexec -n 4 python benchmarks/osu_iallgather.py --mpi4py
"""

from _collective import main, nonblocking
from osu_allgather import SPEC as BLOCKING

SPEC = nonblocking(BLOCKING)

if __name__ == "__main__":
    main(SPEC)
