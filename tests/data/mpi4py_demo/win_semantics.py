"""MPI.Win semantics the demos rely on, checked against mpi4py + MPICH's answers
(pycomm's test, not an mpi4py demo): fence epochs, PSCW, passive-target locks, atomics,
shared windows. Prints one line per check on rank 0."""
from array import array

import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
out = []

# fence: every rank puts its rank at index rank of rank 0's buffer, and accumulates
buf = np.full(size + 1, -1, dtype="i")
win = MPI.Win.Create(buf if rank == 0 else None, MPI.INT.Get_size(), comm=comm)
if rank == 0:
    buf[size] = 0
win.Fence()
win.Put([np.array([rank * 10], "i"), MPI.INT], 0, [rank, 1, MPI.INT])
win.Accumulate([np.array([rank + 1], "i"), MPI.INT], 0, [size, 1, MPI.INT], MPI.SUM)
win.Fence()
got = np.zeros(size + 1, "i")
win.Get([got, MPI.INT], 0)
win.Fence()
out.append(("fence", got.tolist(), buf.tolist() if rank == 0 else None))
assert got.tolist() == [10 * r for r in range(size)] + [size * (size + 1) // 2]
model = win.Get_attr(MPI.WIN_MODEL)
win.Free()

# PSCW: rank 0 exposes to the others, each writes its slot
buf = np.zeros(size, "d")
win = MPI.Win.Create(buf, comm=comm)            # disp_unit 1: byte displacements
world = comm.Get_group()
if rank == 0:
    others = world.Excl([0])
    win.Post(others)
    win.Wait()
    assert buf.tolist() == [0.0] + [r + 0.5 for r in range(1, size)]
    others.Free()
else:
    zero = world.Incl([0])
    win.Start(zero)
    win.Put([np.array([rank + 0.5]), MPI.DOUBLE], 0, [rank * 8, 1, MPI.DOUBLE])
    win.Complete()
    zero.Free()
world.Free()
out.append(("pscw", buf.tolist()))
win.Free()

# passive target: Fetch_and_op tickets, Compare_and_swap, Get_accumulate(NO_OP)
win = MPI.Win.Allocate(2 * 8 if rank == 0 else 0, 8, comm=comm)
comm.Barrier()
tickets = []
for _ in range(3):
    res = np.zeros(1, "q")
    win.Lock(0, MPI.LOCK_SHARED)
    win.Fetch_and_op(np.ones(1, "q"), res, 0, 0, MPI.SUM)
    win.Unlock(0)
    tickets.append(int(res[0]))
old = np.zeros(1, "q")
win.Lock(0)
win.Compare_and_swap(np.array([rank + 100], "q"), np.zeros(1, "q"), old, 0, 1)
win.Unlock(0)
swapped = comm.allgather(int(old[0]))
comm.Barrier()
final = np.zeros(2, "q")
win.Lock(0, MPI.LOCK_SHARED)
win.Get_accumulate([np.zeros(2, "q"), MPI.INT64_T], final, 0, [0, 2, MPI.INT64_T],
                   MPI.NO_OP)
win.Unlock(0)
all_tickets = sorted(sum(comm.allgather(tickets), []))
assert all_tickets == list(range(3 * size)), all_tickets
assert final[0] == 3 * size and swapped.count(0) == 1 and final[1] - 100 in range(size)
assert sorted(swapped)[1:] == [int(final[1])] * (size - 1)
out.append(("atomics", all_tickets[-1], int(final[0]), swapped.count(0)))
win.Free()

# shared memory: neighbours read each other's memory directly
win = MPI.Win.Allocate_shared(4, 4, comm=comm)
mine = np.frombuffer(win.tomemory(), "i")
mine[0] = rank * rank
win.Fence()
right = (rank + 1) % size
mem, unit = win.Shared_query(right)
value = int(np.frombuffer(mem, "i")[0])
assert value == right * right and unit == 4
win.Fence()
out.append(("shared", win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED, value))
win.Free()

everyone = comm.gather(out, 0)
if rank == 0:
    print("model", "separate" if model == MPI.WIN_SEPARATE else "unified")
    print("fence", everyone[0][0][2])
    print("pscw", everyone[0][1][1])
    print("atomics", everyone[0][2][1:])
    print("shared", sorted(o[3][2] for o in everyone))
