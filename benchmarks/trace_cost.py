"""What the flight recorder (pycomm.trace) costs a call: the same run with and without it.

Every rank runs blocks of ``--iters`` 8-byte ``Allreduce`` calls (and of 8-byte ping-pong
``Send``/``Recv`` between ranks 0 and 1), alternating between the shipped code, which
records each call, and a copy of the hook points without the recorder
(``AlgorithmSelection._run``'s fast path as it was before the recorder,
``Communicator._wait_posted`` waiting directly). Alternating blocks within one run keeps
both variants under the same load, which on a shared machine moves far more than the
recorder does; the best, the 10th-percentile and the median block of each variant are
reported (many short blocks: the best ones ran with both ranks on a core), with the
recorder's own begin/end pair timed alone.

Run::

    python launch.py -n 2 --transport shm benchmarks/trace_cost.py [--blocks 400] [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import pycomm
from pycomm import trace
from pycomm.comm import Communicator
from pycomm.errors import CommTimeoutError
from pycomm.tuning.selection import AlgorithmSelection

RECORDED_RUN = AlgorithmSelection.run
RECORDED_WAIT = Communicator._wait_posted


def unrecorded_run(self, collective, nbytes, algorithm, op, call, *, log_bytes=None,
                   plan=None):
    """``AlgorithmSelection.run`` without the recorder on the fast path (the code before
    it)."""
    comm = self.comm
    if plan is not None:
        fn = plan[2]
    else:
        commutative = op.commutative if op is not None else True
        fn = self.choose(collective, nbytes, algorithm, commutative)[1]
    if not comm._debug and comm._defer is None:
        return call(fn)
    return RECORDED_RUN(self, collective, nbytes, algorithm, op, call, log_bytes=log_bytes,
                        plan=plan)


def unrecorded_wait(self, reqs, timeout):
    """``_wait_posted`` waiting directly (the code before the recorder)."""
    try:
        if len(reqs) == 1:
            self._engine.wait(reqs[0], timeout)
        else:
            self._engine.wait_all(reqs, timeout)
    except CommTimeoutError:
        for r in reqs:
            self._engine.cancel(r)
        raise


def _use(recorded: bool) -> None:
    AlgorithmSelection.run = RECORDED_RUN if recorded else unrecorded_run
    Communicator._wait_posted = RECORDED_WAIT if recorded else unrecorded_wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=400, help="blocks per call kind")
    parser.add_argument("--iters", type=int, default=200, help="calls per block")
    args = parser.parse_args()
    comm = pycomm.COMM_WORLD
    x = np.ones(2, dtype=np.float32)                    # 8 bytes
    y = np.empty_like(x)
    peer = 1 - comm.rank if comm.rank < 2 else None
    times: dict = {(k, v): [] for k in ("allreduce", "pingpong") for v in ("on", "off")}
    for block in range(2 * args.blocks):
        kind = "allreduce" if block % 4 < 2 else "pingpong"
        variant = "on" if block % 2 == 0 else "off"
        _use(variant == "on")
        comm.Barrier()
        t0 = time.perf_counter()
        if kind == "allreduce":
            for _ in range(args.iters):
                comm.Allreduce(x, y)
        elif peer is not None:
            for _ in range(args.iters):
                if comm.rank == 0:
                    comm.Send(x, peer, 1)
                    comm.Recv(x, peer, 1)
                else:
                    comm.Recv(x, peer, 1)
                    comm.Send(x, peer, 1)
        times[kind, variant].append((time.perf_counter() - t0) / args.iters * 1e6)
    _use(True)
    pair = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(20000):
            trace.end(trace.begin("allreduce", comm, 1, 8, "recursive_doubling", -1))
        pair.append((time.perf_counter_ns() - t0) / 20000)
    if comm.rank == 0:
        print(f"{comm.size} ranks, {comm.transport_name}, {args.blocks // 2} blocks x "
              f"{args.iters} calls per variant; us per call (ping-pong: per round trip)")
        for kind in ("allreduce", "pingpong"):
            on, off = times[kind, "on"], times[kind, "off"]
            p10_on, p10_off = (statistics.quantiles(v, n=10)[0] for v in (on, off))
            print(f"{kind:10} with recorder: best {min(on):7.2f} p10 {p10_on:7.2f} median "
                  f"{statistics.median(on):7.2f} | without: best {min(off):7.2f} p10 "
                  f"{p10_off:7.2f} median {statistics.median(off):7.2f} | diff: best "
                  f"{min(on) - min(off):+.2f} p10 {p10_on - p10_off:+.2f}")
        print(f"begin+end pair alone: best {min(pair):.0f} ns, median "
              f"{statistics.median(pair):.0f} ns")


if __name__ == "__main__":
    main()
