"""A spawned child stops itself (SIGSTOP) and the parent leaves without waiting on it
(tests/test_mpi_spawn.py): the root's exit does not wait PYCOMM_TIMEOUT for a child
that cannot exit."""
import sys

from mpi4py import MPI

MPI.COMM_SELF.Spawn(sys.executable, ["-c", (
    "from mpi4py import MPI; import os, signal; MPI.Comm.Get_parent(); "
    "os.kill(os.getpid(), signal.SIGSTOP)")], maxprocs=1)
print("parent leaves\n", end="", flush=True)
