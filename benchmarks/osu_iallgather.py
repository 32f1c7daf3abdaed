"""Nonblocking Allgather with compute overlap, after OSU's ``osu_iallgather``.

Times ``Iallgather`` on the buffers of ``osu_allgather.py`` (same sizes, same ``-c`` checks):
first post + Wait alone (Pure Comm.), then post + a compute of that duration + Wait
(Overall, Compute), and reports OSU's Overlap = 100 (1 - (Overall - Compute) / Pure Comm.).
``--compute sleep`` (default) leaves the CPU as an accelerator would; ``--compute busy`` is
OSU's CPU-bound loop. See _collective.py and README.md for the method and the choice.

Run::

    python launch.py -n 4 benchmarks/osu_iallgather.py [--compute busy]
    mpiexec -n 4 python benchmarks/osu_iallgather.py --mpi4py
"""

from dataclasses import replace

from _collective import main
from osu_allgather import SPEC as BLOCKING

SPEC = replace(BLOCKING, name="iallgather", method="Iallgather", nonblocking=True,
               title=BLOCKING.title.replace("MPI ", "MPI Non-blocking "),
               iters=(1000, 100, 100, 10) if BLOCKING.sizes else (1000, 100, 1000, 100))

if __name__ == "__main__":
    main(SPEC)
