"""The program of a differential fuzzing case (tests/fuzzgen.py): its communicators and
each step's parameters, drawn from the program generator, which is seeded by the case
alone, so that every rank draws the same program."""

from __future__ import annotations

import numpy as np

import pycomm
from fuzzref import ALL_DTYPES, OPS_BY_KIND, PAIR_VALUES, np_dtype

KIB = 1024
# element counts around the protocol thresholds: shm slots 64 KiB/rank, eager 64 KiB,
# direct reads 16 KiB-256 KiB, and a few MiB
BYTE_MARKS = (16 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 1024 * KIB)
SMALL_COUNTS = (0, 1, 2, 3, 5, 7, 8, 13, 64, 100, 255, 1000, 1001)
REDUCING = ("allreduce", "reduce", "reduce_scatter_block", "reduce_scatter", "scan",
            "exscan")
COPYING = ("bcast", "allgather", "gather", "scatter", "alltoall", "allgatherv", "gatherv",
           "scatterv", "alltoallv")
NB_OK = ("allreduce", "reduce", "bcast", "allgather", "gather", "scatter", "alltoall",
         "reduce_scatter_block", "reduce_scatter", "scan", "exscan", "allgatherv",
         "gatherv", "scatterv", "alltoallv", "barrier")


# -- the program ----------------------------------------------------------------------------

def comm_specs(prog, size):
    """The communicators of a case: (name, members in comm-rank order per world rank)."""
    specs = [("world", {r: list(range(size)) for r in range(size)})]
    if size >= 2:
        ncolors = int(prog.integers(1, min(size, 3) + 1))
        colors = [int(prog.integers(0, ncolors)) for _ in range(size)]
        keys = [int(k) for k in prog.permutation(size)] if prog.random() < 0.7 \
            else [0] * size
        members = {}
        for r in range(size):
            group = [q for q in range(size) if colors[q] == colors[r]]
            group.sort(key=lambda q: (keys[q], q))
            members[r] = group
        specs.append(("split", members, colors, keys))
        k = int(prog.integers(max(1, size // 2), size + 1))
        sub = [int(q) for q in prog.permutation(size)[:k]]     # reordered
        specs.append(("group", {r: sub for r in sub}, sub, bool(prog.random() < 0.5)))
    return specs


def hosts_spec(hrng, size):
    """The world again, its ranks spread over 2-3 emulated hosts (an uneven, interleaved
    host map): the hierarchical and 2-D algorithms' own schedules on real transports. Drawn
    from its own generator, so that adding it left the other draws of a seed as they were."""
    nh = int(hrng.integers(2, min(size, 3) + 1))
    hostmap = [int(h) for h in hrng.integers(0, nh, size)]
    return ("hosts", {r: list(range(size)) for r in range(size)}, hostmap)


def build_comms(comm, specs):
    comms = [comm]
    for spec in specs[1:]:
        if spec[0] == "hosts":
            from pycomm.launch.bootstrap import host_layout
            c = comm.Dup()
            c.host_layout = host_layout([{"host": f"h{h}/fuzz/shm", "hostname": f"node{h}"}
                                         for h in spec[2]], c.rank)
            comms.append(c)
        elif spec[0] == "split":
            comms.append(comm.Split(spec[2][comm.rank], spec[3][comm.rank]))
        else:
            g = comm.Get_group().Incl(spec[2])
            if spec[3]:                              # Create_group: only the members call
                c = comm.Create_group(g) if comm.rank in spec[2] else pycomm.COMM_NULL
            else:                                    # Create: every rank calls
                c = comm.Create(g)
            comms.append(c)
    return comms


MAX_BYTES = [8 * 1024 * KIB]                 # per buffer; fuzz_task's max_bytes sets it


def _pick_count(prog, itemsize, nblocks):
    """Elements per block: mostly small, sometimes around a threshold, rarely MiBs."""
    r = prog.random()
    if r < 0.55:
        return int(prog.choice(SMALL_COUNTS))
    mark = int(prog.choice(BYTE_MARKS if r < 0.97 else (2 * 1024 * KIB, 3 * 1024 * KIB)))
    per = mark // max(1, nblocks if prog.random() < 0.5 else 1)
    n = per // itemsize + int(prog.choice([-1, 0, 1]))
    limit = MAX_BYTES[0] // (itemsize * max(1, nblocks))
    return max(0, min(n, limit))


def _pick_dtype_op(prog, coll):
    if coll in COPYING:
        r = prog.random()
        if r < 0.1:
            return "pair:" + str(prog.choice(PAIR_VALUES)), None
        return str(prog.choice(ALL_DTYPES)), None
    r = prog.random()
    if r < 0.12:
        return "pair:" + str(prog.choice(PAIR_VALUES)), str(prog.choice(["MAXLOC", "MINLOC"]))
    if r < 0.24:
        return "affine", "AFFINE"
    dtype = str(prog.choice(ALL_DTYPES))
    return dtype, str(prog.choice(OPS_BY_KIND[np.dtype(dtype).kind]))


def plan_step(prog, size, specs, colls):
    """One step's parameters, drawn from the program generator (same on every rank)."""
    coll = str(prog.choice(colls))
    ci = int(prog.integers(0, len(specs)))
    if coll == "p2p":
        return dict(coll=coll, ci=ci, nmsg=int(prog.integers(1, 4)),
                    shift=int(prog.integers(1, max(2, size))),
                    count=_pick_count(prog, 8, 1), dtype=str(prog.choice(ALL_DTYPES)),
                    tag=int(prog.integers(0, 3)), order=int(prog.integers(0, 3)),
                    sendrecv=bool(prog.random() < 0.3))
    if coll == "mpi":
        return dict(coll=coll, ci=0, which=str(prog.choice(
            ["Allreduce", "Reduce", "Scan", "Exscan", "Reduce_scatter_block", "Allgather"])),
            root=int(prog.integers(0, size)), count=_pick_count(prog, 16, 1))
    if coll == "objects":
        return dict(coll=coll, ci=ci, which=str(prog.choice(
            ["bcast", "allreduce", "gather", "allgather", "alltoall", "scatter", "reduce",
             "scan", "exscan"])), root=int(prog.integers(0, size)))
    dtype, opname = _pick_dtype_op(prog, coll)
    isz = np_dtype(dtype).itemsize
    nb = size if coll in ("allgather", "gather", "scatter", "alltoall",
                          "reduce_scatter_block", "allgatherv", "gatherv", "scatterv",
                          "alltoallv", "reduce_scatter") else 1
    count = _pick_count(prog, isz, nb)
    if coll == "barrier":
        algs = pycomm.algorithms("barrier")
    else:
        algs = pycomm.algorithms(coll)
    alg = None if prog.random() < 0.4 else str(prog.choice(algs))
    return dict(coll=coll, ci=ci, dtype=dtype, op=opname, count=count,
                root=int(prog.integers(0, size)), alg=alg,
                inplace=bool(prog.random() < 0.3), mode=str(prog.choice(["exact", "random"])),
                vcounts=[int(x) for x in prog.integers(0, 3, size)],
                vseed=int(prog.integers(0, 2**31)))
