"""OSU-style micro-benchmarks of pycomm (runnable on mpi4py for reference); see README.md.

The scripts run as plain files under a launcher (``python launch.py -n 2
benchmarks/osu_latency.py``), so they import their shared modules by plain name
(``from _common import ...``); importing this package puts the folder on ``sys.path`` so
that ``python -m benchmarks`` and ``python -m benchmarks.compare`` find them too.
"""

from __future__ import annotations

import ast
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

#: Benchmark groups, in the order ``--list`` shows them.
GROUPS = {
    "point-to-point": ["latency", "bw", "bibw", "multi_lat"],
    "collectives": ["barrier", "bcast", "reduce", "allreduce", "gather", "scatter",
                    "allgather", "alltoall", "reduce_scatter", "gatherv", "scatterv",
                    "allgatherv", "alltoallv", "scan"],
    "nonblocking collectives": ["ibarrier", "ibcast", "iallreduce", "iallgather",
                                "ialltoall"],
    "ceiling": ["reference"],
}


def script_path(name: str) -> str:
    """Return the file of benchmark ``name`` (``"allreduce"``, ``"osu_allreduce"``...)."""
    base = name.removesuffix(".py")
    if base != "reference" and not base.startswith("osu_"):
        base = "osu_" + base
    return os.path.join(HERE, base + ".py")


def summary(name: str) -> str:
    """Return the first line of a benchmark script's docstring (read, not imported)."""
    with open(script_path(name)) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.splitlines()[0] if doc else ""


def names() -> list[str]:
    """Every benchmark name, in ``GROUPS`` order."""
    return [n for group in GROUPS.values() for n in group]
