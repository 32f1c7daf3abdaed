"""Nonblocking Alltoall with compute overlap, after OSU's ``osu_ialltoall``.

``osu_alltoall.py``'s spec made nonblocking by ``_collective.nonblocking`` (Pure Comm.,
Overall, Compute and Overlap columns; ``--compute sleep|busy``). Run::

    python launch.py -n 4 benchmarks/osu_ialltoall.py [--compute busy]
    mpiexec -n 4 python benchmarks/osu_ialltoall.py --mpi4py
"""

from _collective import main, nonblocking
from osu_alltoall import SPEC as BLOCKING

SPEC = nonblocking(BLOCKING)

if __name__ == "__main__":
    main(SPEC)
