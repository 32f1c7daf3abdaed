"""A child of parent.py: answers over the link, then disconnects."""
import os
import sys

import numpy as np
from mpi4py import MPI

parent = MPI.Comm.Get_parent()
world = MPI.COMM_WORLD
x = np.empty(1000, dtype=np.float64)
parent.Bcast(x, root=0)
share = world.allreduce(x.sum())
parent.gather((world.rank, world.size, world.Get_attr(MPI.APPNUM), sys.argv[1], os.getcwd(),
               share), root=0)
psize = parent.Get_remote_size()
parent.Send(np.full(10, world.rank ** 2, dtype=np.int32), dest=world.rank % psize, tag=5)
assert parent.recv(source=world.rank % psize, tag=6) == ("thanks", world.rank)
parent.Disconnect()
assert MPI.Comm.Get_parent() == MPI.COMM_NULL
