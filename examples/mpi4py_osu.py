"""An unmodified mpi4py program in the style of mpi4py's demo ``osu_latency.py`` and
``osu_allreduce.py``: it imports ``mpi4py`` only, so it runs as is on mpi4py + MPICH and,
through ``launch.py --mpi4py``, on pycomm.

What it does: rank 0 prints the environment (vendor, MPI version, processor name, thread
level); ranks 0 and 1 ping-pong ``[buf, size, MPI.BYTE]`` messages (latency rows, skip and
loop counts that shrink past a large message size, Barrier -> timed loop -> Barrier); all
ranks run ``Allreduce`` of ``[buf, n, MPI.FLOAT]`` over complex64 buffers (the datatype,
not the buffer, says floats) and ``MPI.DOUBLE`` arrays; every result is checked against
its closed form, and the program ends with one ``CHECK ok``/``CHECK FAILED`` line and exit
status 0/1 on every rank. The largest message size is the first argument (bytes).

Run::

    mpiexec -n 3 python examples/mpi4py_osu.py 4096               # mpi4py + an MPI
    python launch.py -n 3 --mpi4py examples/mpi4py_osu.py 4096    # pycomm
"""

# ruff: noqa: UP031  (printf-style output, as mpi4py's OSU demos write it)

import sys

import numpy as np
from mpi4py import MPI


def allocate(nbytes):
    return np.zeros(nbytes, dtype=np.uint8)


def osu_latency(comm, max_size, skip=10, loop=100, skip_large=2, loop_large=10,
                large_message_size=8192):
    myid = comm.Get_rank()
    s_buf, r_buf = allocate(max_size), allocate(max_size)
    if myid == 0:
        print("# MPI Latency Test")
        print("# %-8s%20s" % ("Size [B]", "Latency [us]"))
    sizes = [0] + [2**i for i in range(30) if 2**i <= max_size]
    bad = 0
    for size in sizes:
        if size > large_message_size:
            skip, loop = skip_large, loop_large
        s_buf[:size] = (np.arange(size) + myid) % 251
        s_msg = [s_buf, size, MPI.BYTE]
        r_msg = [r_buf, size, MPI.BYTE]
        comm.Barrier()
        t_start = t_end = 0.0
        if myid == 0:
            for i in range(loop + skip):
                if i == skip:
                    t_start = MPI.Wtime()
                comm.Send(s_msg, 1, 1)
                comm.Recv(r_msg, 1, 1)
            t_end = MPI.Wtime()
        elif myid == 1:
            for i in range(loop + skip):
                comm.Recv(r_msg, 0, 1)
                comm.Send(s_msg, 0, 1)
        if myid in (0, 1) and comm.Get_size() > 1:
            peer = 1 - myid
            bad += not np.array_equal(r_buf[:size], (np.arange(size) + peer) % 251)
        comm.Barrier()
        if myid == 0:
            latency = (t_end - t_start) * 1e6 / (2 * loop)
            print("%-10d%20.2f" % (size, latency))
    return bad


def osu_allreduce(comm, max_size, skip=5, loop=20):
    myid, numprocs = comm.Get_rank(), comm.Get_size()
    if myid == 0:
        print("# MPI Allreduce Test")
        print("# %-8s%20s" % ("Size [B]", "Avg Latency [us]"))
    bad = 0
    for size in [2**i for i in range(2, 30) if 2**i <= max_size]:
        count = size // 4                           # floats
        s_buf = np.full(count // 2, myid + 1j * myid, dtype=np.complex64)
        r_buf = np.zeros(count // 2, dtype=np.complex64)
        comm.Barrier()
        t_start = 0.0
        for i in range(loop + skip):
            if i == skip:
                t_start = MPI.Wtime()
            comm.Allreduce([s_buf, 2 * (count // 2), MPI.FLOAT],
                           [r_buf, 2 * (count // 2), MPI.FLOAT], op=MPI.SUM)
        latency = (MPI.Wtime() - t_start) * 1e6 / loop
        total = numprocs * (numprocs - 1) / 2
        bad += not np.allclose(r_buf, total + 1j * total)
        avg = comm.reduce(latency, op=MPI.SUM, root=0)
        if myid == 0:
            print("%-10d%20.2f" % (size, avg / numprocs))
    x = np.arange(4, dtype="d") * (myid + 1)
    y = np.empty(4, dtype="d")
    comm.Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE], op=MPI.MAX)
    bad += not np.array_equal(y, np.arange(4) * numprocs)
    return bad


def main():
    max_size = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16
    comm = MPI.COMM_WORLD
    myid = comm.Get_rank()
    if myid == 0:
        vendor, version = MPI.get_vendor()
        print("# vendor: %s %s, MPI %d.%d" % ((vendor, ".".join(map(str, version)))
                                              + MPI.Get_version()))
        print("# ranks: %d, processor: %s" % (comm.Get_size(), MPI.Get_processor_name()))
        print("# initialized: %s, thread level: %d" % (MPI.Is_initialized(),
                                                       MPI.Query_thread()))
    bad = osu_latency(comm, max_size) + osu_allreduce(comm, max_size)
    bad = comm.allreduce(bad, op=MPI.SUM)
    if myid == 0:
        print("CHECK ok" if bad == 0 else "CHECK FAILED (%d mismatches)" % bad)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
