# Spawn 2 python children twice: a child is forked from the root's fork server (its parent
# is neither the root nor the launcher), the second spawn's from the same server.
import os
import sys

from mpi4py import MPI

CHILD = ["-c", "import os; from mpi4py import MPI; p = MPI.Comm.Get_parent(); "
               "p.send(os.getppid(), dest=0); p.Disconnect()"]
parents = []
for _ in range(2):
    inter = MPI.COMM_SELF.Spawn(sys.executable, CHILD, maxprocs=2)
    parents += [inter.recv(source=r) for r in range(2)]
    inter.Disconnect()
launcher = int(os.environ["PYCOMM_LAUNCHER_PID"])
print(f"parents {len(set(parents))} root {os.getpid() in parents} "
      f"launcher {launcher in parents}\n", end="", flush=True)
