"""Spawn's data paths, checked by the parents (tests/test_mpi_spawn.py): two commands
(Spawn_multiple), three children; prints one line per parent, "ok <job id>" or what
differed."""
import os
import sys

import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
comm = MPI.COMM_WORLD
bad = []
if MPI.Comm.Get_parent() != MPI.COMM_NULL:
    bad.append("a launched rank has a parent")
info = MPI.Info.Create()
info.Set("wdir", HERE)
errcodes = []
child = comm.Spawn_multiple([sys.executable] * 2, [["child.py", "a"], ["child.py", "b"]],
                            [1, 2], info=info, root=0, errcodes=errcodes)
info.Free()
if errcodes != [[MPI.SUCCESS], [MPI.SUCCESS] * 2]:
    bad.append(f"errcodes {errcodes}")
if (child.Get_size(), child.Get_remote_size(), child.Get_rank()) != (comm.size, 3, comm.rank):
    bad.append(f"sizes {child.Get_size()} {child.Get_remote_size()} rank {child.Get_rank()}")
x = np.arange(1000, dtype=np.float64)
child.Bcast(x, root=MPI.ROOT if comm.rank == 0 else MPI.PROC_NULL)
# each child: its world rank, world size, appnum, argv and cwd, and its share of the sum
got = child.gather(None, root=MPI.ROOT if comm.rank == 0 else MPI.PROC_NULL)
if comm.rank == 0:
    want = [(r, 3, 0 if r == 0 else 1, "a" if r == 0 else "b", HERE, 3 * x.sum())
            for r in range(3)]
    if got != want:
        bad.append(f"children said {got}, expected {want}")
# point-to-point both ways: child r sends parent (r % size) its rank squared
for r in range(3):
    if r % comm.size == comm.rank:
        y = np.empty(10, dtype=np.int32)
        child.Recv(y, source=r, tag=5)
        if not (y == r * r).all():
            bad.append(f"from child {r}: {y}")
        child.send(("thanks", r), dest=r, tag=6)
child.Disconnect()
if child != MPI.COMM_NULL:
    bad.append("Disconnect left the handle non-null")
total = comm.allreduce(1)           # the parents' own world is untouched
if total != comm.size:
    bad.append(f"allreduce after {total}")
verdict = "ok " + MPI.COMM_WORLD._inner("x")._engine.job_id if not bad else str(bad)
print(f"rank {comm.rank}: {verdict}\n", end="", flush=True)   # one write
