"""One rank of ``benchmarks/cluster/hier_bench.py``: time a large collective per algorithm.

Environment: ``HB_COLL`` (allreduce, the default; bcast and reduce from rank 1; allgather),
``HB_BYTES`` (the call's bytes as :mod:`pycomm.collectives` counts them, float32),
``HB_REPS`` (timed calls per algorithm), ``HB_ALGS`` (comma-separated; ``auto`` is the
automatic choice). Each rep runs
every algorithm once, in an order rotated by one per rep (alternating, so that drifts of a
shared machine fall on all algorithms alike), after one untimed warm-up call each. A call
is timed as Barrier, then the slowest rank's time from its start to its end; around it the
local rank 0 of each host reads its host's link counter (``eth0`` tx_bytes, the veth to
the bridge) after a Barrier, so the delta is the bytes that host sent for that call
(headers and the receiver's ACKs included). Rank 0 prints one JSON line per call.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import pycomm


def _tx_bytes() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes", encoding="ascii") as fh:
        return int(fh.read())


def main() -> int:
    comm = pycomm.COMM_WORLD
    lay = comm.host_layout
    coll = os.environ.get("HB_COLL", "allreduce")
    count = int(os.environ.get("HB_BYTES", str(16 << 20))) // 4 // comm.size * comm.size
    reps = int(os.environ.get("HB_REPS", "5"))
    algs = os.environ.get("HB_ALGS", "ring,recursive_doubling,rabenseifner,hierarchical,auto")
    algs = algs.split(",")
    counts_link = lay.local_rank == 0 and lay.nhosts > 1
    send = np.full(count, comm.rank + 1, dtype=np.float32)
    out = np.empty_like(send)
    part = np.full(count // comm.size, comm.rank + 1, dtype=np.float32)
    want = {"allreduce": comm.size * (comm.size + 1) // 2, "reduce": comm.size *
            (comm.size + 1) // 2, "bcast": 2, "allgather": comm.size}[coll]
    stats = np.empty(2, dtype=np.float64)
    chosen = comm.chosen_algorithm(coll, send.nbytes, algorithm="auto")

    def call(name) -> bool:
        """Run the collective; whether this rank's result is to be checked."""
        if coll == "allreduce":
            comm.Allreduce(send, out, op=pycomm.SUM, algorithm=name)
        elif coll == "reduce":
            comm.Reduce(send, out if comm.rank == 1 else None, op=pycomm.SUM, root=1,
                        algorithm=name)
            return comm.rank == 1
        elif coll == "bcast":
            out.fill(2 if comm.rank == 1 else 0)
            comm.Bcast(out, root=1, algorithm=name)
        else:
            comm.Allgather(part, out, algorithm=name)
        return True

    def once(alg: str) -> tuple[float, int]:
        name = None if alg == "auto" else alg
        comm.Barrier()
        before = _tx_bytes() if counts_link else 0
        comm.Barrier()
        t0 = time.perf_counter()
        check = call(name)
        took = time.perf_counter() - t0
        comm.Barrier()
        sent = _tx_bytes() - before if counts_link else 0
        if check and (out[0] != (1 if coll == "allgather" else want) or out[-1] != want):
            raise RuntimeError(f"rank {comm.rank}: {alg} gave {out[0]}, want {want}")
        stats[:] = (took, 0.0)
        comm.Allreduce(pycomm.IN_PLACE, stats, op=pycomm.MAX)
        link = np.array([sent], dtype=np.int64)
        comm.Allreduce(pycomm.IN_PLACE, link, op=pycomm.SUM)
        return float(stats[0]), int(link[0])

    for alg in algs:            # warm-up: connections, scratch, page faults
        once(alg)
    for rep in range(reps):
        k = rep % len(algs)
        for alg in algs[k:] + algs[:k]:
            took, link = once(alg)
            if comm.rank == 0:
                print(json.dumps({"alg": alg, "rep": rep, "s": took, "link_bytes": link,
                                  "chosen": chosen if alg == "auto" else alg,
                                  "hosts": [list(g) for g in lay.hosts],
                                  "nbytes": send.nbytes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
