"""The spawning root is SIGKILLed while its children wait on it (tests/test_mpi_spawn.py):
prints the job id and the children's pids first."""
import os
import signal
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
child = comm.Spawn(sys.executable, ["-c", (
    "from mpi4py import MPI; import os; p = MPI.Comm.Get_parent(); "
    "p.send(os.getpid(), dest=0); p.recv(source=0)")], maxprocs=2, root=0)
if comm.rank == 0:
    pids = [child.recv(source=r) for r in range(2)]
    print("job", comm._inner("x")._engine.job_id, "children", *pids, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
child.recv(source=0)
