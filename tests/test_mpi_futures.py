"""mpi4py.futures and mpi4py.util.pool on pycomm: mpi4py's own pure-Python modules from the
installed mpi4py wheel, on pycomm's MPI through the alias package (``launch.py
--mpi4py``). Each job's output is compared with what the same program printed under
mpi4py 4.1.2 + MPICH 5.0.2 (``mpiexec -n N python [-m mpi4py.futures] PROGRAM``, recorded
on this machine). ``MPIPoolExecutor`` runs in the static mode (``-m mpi4py.futures``: rank
0 runs the program, the others serve) and with spawned workers (:mod:`pycomm.MPI.spawn`),
and ``MPICommExecutor`` on the ranks of a communicator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
DATA = ROOT / "tests" / "data" / "futures"

# tests/data/futures/pool_job.py under `mpiexec -n 3 python -m mpi4py.futures`
MPICH_POOL = """\
workers 2
map [0, 1, 4, 9, 16, 25, 36, 49, 64, 81, 100, 121] ranks [1, 2]
starmap [3, 7]
unordered [0, 1, 4, 9, 16, 25]
chunks [0, 1, 4, 9, 16, 25, 36]
exception ZeroDivisionError
as_completed [0, 2, 4, 6, 8]
pool.starmap [2, 4]
pool.apply 11
end
"""
# tests/data/futures/comm_executor.py under `mpiexec -n N python`, lines sorted
MPICH_COMM = {
    1: ["exception ZeroDivisionError", "map [1, 2, 3, 4, 5, 6, 7, 8] ranks root",
        "rank 0 left"],
    3: ["exception ZeroDivisionError", "map [1, 2, 3, 4, 5, 6, 7, 8] ranks [1, 2]",
        "rank 0 left", "rank 1 left", "rank 2 left"],
}


def _launch(n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LAUNCH, "-n", str(n), "--mpi4py", "--no-prefix",
                           *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=str(ROOT),
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_the_installed_mpi4py_supplies_futures_on_pycomms_mpi():
    code = ("import mpi4py, mpi4py.futures, mpi4py.util.pool as p; from mpi4py import MPI; "
            "print(MPI.__name__, mpi4py.futures.__name__, p.Pool.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYCOMM_MPI4PY": "1",
                                          "PYTHONPATH": str(ROOT / "pycomm" / "MPI" /
                                                            "_alias")}).stdout
    assert out.split() == ["pycomm.MPI", "mpi4py.futures", "mpi4py.util.pool"]


def test_pool_executor_in_static_mode_as_under_mpich():
    proc = _launch(3, "-m", "mpi4py.futures", str(DATA / "pool_job.py"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == MPICH_POOL


@pytest.mark.parametrize("n", [1, 3])
def test_comm_executor_as_under_mpich(n):
    proc = _launch(n, str(DATA / "comm_executor.py"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == MPICH_COMM[n]


# tests/data/futures/spawn_pool.py under `mpiexec -n 1 python` (its workers spawned)
MPICH_SPAWN_POOL = """\
parent world 1
workers 2
map [0, 1, 4, 9, 16, 25, 36, 49, 64, 81, 100, 121] ranks [0, 1] worlds [2] spawned True
starmap [3, 7]
exception ZeroDivisionError
as_completed [0, 2, 4, 6, 8]
second pool [1, 2, 3]
end
"""


def test_a_pool_outside_the_futures_module_spawns_its_workers_as_under_mpich():
    # mpi4py's SpawnPool calls COMM_SELF.Spawn from its pool thread; the workers'
    # COMM_WORLD is theirs alone and Get_parent() links them to the program
    proc = _launch(1, str(DATA / "spawn_pool.py"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == MPICH_SPAWN_POOL
    assert "pycomm.spawn" not in proc.stderr, proc.stderr
