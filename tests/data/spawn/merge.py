"""Merge of a spawn's link, used after the link is disconnected (tests/test_mpi_spawn.py):
the processes stay connected through the merged communicator (MPI-4.1 11.10.4). Parents
and children run this same file; each prints "<who> <rank> ok" or what differed."""
import sys

from mpi4py import MPI

parent = MPI.Comm.Get_parent()
if parent == MPI.COMM_NULL:             # a parent: spawn 2 children of this file
    link = MPI.COMM_WORLD.Spawn(sys.executable, [__file__], maxprocs=2)
    who, high = "parent", False
else:
    link, who, high = parent, "child", True
merged = link.Merge(high)               # parents first
link.Disconnect()
total = merged.allreduce(merged.Get_rank())
n = merged.Get_size()
ok = total == n * (n - 1) // 2
merged.Free()
verdict = "ok" if ok else f"sum {total} of {n}"
print(f"{who} {MPI.COMM_WORLD.Get_rank()} {verdict}\n", end="", flush=True)  # one write
