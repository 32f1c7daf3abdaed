"""One rank of a chaos trial (run by ``benchmarks/chaos.py`` through ``launch.py``).

``python launch.py -n N benchmarks/_chaos_rank.py SPEC_JSON``: every rank runs the same
seeded schedule of buffer collectives (Allreduce, Bcast, Allgather, Reduce_scatter_block,
Alltoall), checks every completed result against numpy and prints a ``CHAOS WRONG`` line
for any wrong value. At call ``spec["call"]`` the rank ``spec["culprit"]`` injects the
fault ``spec["kind"]``:

* fatal: ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself), ``exit`` (``os._exit(3)``),
  ``raise`` (RuntimeError), ``hang`` (``time.sleep(60)``), each right before the call;
* recoverable: ``badarg`` (a strided or read-only buffer in the call) and ``mismatch``
  (different dtype, count, root or collective in the call). Every rank catches
  :class:`pycomm.CommError` in that call and the next two (a root mismatch may only be
  seen one or two calls later) and prints it as ``CHAOS CAUGHT``; the calls after that
  are not guarded, so a communicator left unusable fails the job.

Lines it prints on stdout (the harness parses them, after the launcher's ``[rank] ``):
``CHAOS START rank=R pid=P job=JOBID master_port=PORT listen=P1,P2``,
``CHAOS FAULT t=WALLTIME rank=R call=I kind=K variant=V``,
``CHAOS CAUGHT t=WALLTIME rank=R call=I type=NAME msg=ONE_LINE``,
``CHAOS SILENT rank=R call=I`` (a mismatched call that completed on this rank),
``CHAOS WRONG rank=R call=I ...`` and ``CHAOS DONE rank=R``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import numpy as np
import psutil

COLLECTIVES = ("Allreduce", "Bcast", "Allgather", "Reduce_scatter_block", "Alltoall")
FATAL = ("kill", "stop", "exit", "raise", "hang")
RECOVERABLE = ("badarg", "mismatch")
KINDS = FATAL + RECOVERABLE
COUNTS = (16, 3000, 70_000)          # float64 elements: eager, eager, rendezvous (560 KB)
GUARDED = 3                          # calls k, k+1, k+2 catch CommError in recoverable trials
AFTER = 2                            # unguarded calls after the guarded ones


def schedule(seed: int, ncalls: int, size: int) -> list[dict]:
    """The calls every rank makes: ``[{"coll", "count", "root"}, ...]`` (pure, seeded)."""
    rng = random.Random(seed)
    return [{"coll": rng.choice(COLLECTIVES), "count": rng.choice(COUNTS),
             "root": rng.randrange(size)} for _ in range(ncalls)]


def contribution(rank: int, call: int, n: int) -> np.ndarray:
    """Rank ``rank``'s data in call ``call``: small integers as float64 (sums are exact)."""
    return ((rank + 1) * 10 + call + (np.arange(n) % 7)).astype(np.float64)


def expected(call: dict, i: int, rank: int, size: int) -> np.ndarray:
    """The result rank ``rank`` must hold after call ``i`` of the schedule."""
    n, coll = call["count"], call["coll"]
    if coll == "Allreduce":
        return sum(contribution(r, i, n) for r in range(size))
    if coll == "Bcast":
        return contribution(call["root"], i, n)
    if coll == "Allgather":
        return np.concatenate([contribution(r, i, n) for r in range(size)])
    if coll == "Reduce_scatter_block":
        return sum(contribution(r, i, n * size)[rank * n:(rank + 1) * n] for r in range(size))
    # Alltoall: block j of rank r's send goes to rank j
    return np.concatenate([contribution(r, i, n * size)[rank * n:(rank + 1) * n]
                           for r in range(size)])


def _strided(a: np.ndarray) -> np.ndarray:
    s = np.zeros(2 * a.size, a.dtype)[::2]
    s[:] = a
    return s


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def run_call(comm, pycomm, call: dict, i: int, bad: str | None = None) -> np.ndarray:
    """Make call ``i`` on this rank; ``bad`` (this rank's fault variant, if any) spoils it.

    Returns the result buffer.
    """
    rank, size = comm.rank, comm.size
    coll, n, root = call["coll"], call["count"], call["root"]
    dtype = np.float64
    if bad == "mismatch-dtype":
        dtype = np.float32
    if bad == "mismatch-count":
        n += 1
    if bad == "mismatch-root":
        root = (root + 1) % size
    if bad == "mismatch-collective":
        coll = "Bcast" if coll != "Bcast" else "Allreduce"
    if coll == "Allreduce":
        send, recv = contribution(rank, i, n).astype(dtype), np.zeros(n, dtype)
        if bad == "badarg-strided":
            send = _strided(send)
        if bad == "badarg-readonly":
            recv = _readonly(recv)
        comm.Allreduce(send, recv, op=pycomm.SUM)
        return recv
    if coll == "Bcast":
        buf = contribution(rank, i, n).astype(dtype) if rank == root else np.zeros(n, dtype)
        if bad == "badarg-strided":
            buf = _strided(buf)
        if bad == "badarg-readonly":
            buf = _readonly(buf)
        comm.Bcast(buf, root=root)
        return buf
    if coll == "Allgather":
        send, recv = contribution(rank, i, n).astype(dtype), np.zeros(n * size, dtype)
    else:   # Reduce_scatter_block and Alltoall send n per rank
        send = contribution(rank, i, n * size).astype(dtype)
        recv = np.zeros(n if coll == "Reduce_scatter_block" else n * size, dtype)
    if bad == "badarg-strided":
        send = _strided(send)
    if bad == "badarg-readonly":
        recv = _readonly(recv)
    getattr(comm, coll)(send, recv)
    return recv


def badarg_variant(call: dict, culprit: int, rng: random.Random) -> str:
    """A bad argument that is an error for this call on the culprit (a Bcast root only
    reads its buffer, so a read-only one would be legal there)."""
    if call["coll"] == "Bcast" and call["root"] == culprit:
        return "badarg-strided"
    return rng.choice(("badarg-strided", "badarg-readonly"))


def mismatch_variant(call: dict, rng: random.Random) -> str:
    """A mismatch that applies to this call (a root only where the call has one)."""
    kinds = ["mismatch-dtype", "mismatch-count", "mismatch-collective"]
    if call["coll"] == "Bcast":
        kinds.append("mismatch-root")
    return rng.choice(kinds)


def _listening_ports() -> list[int]:
    """TCP ports this process listens on."""
    return sorted({c.laddr.port for c in psutil.Process().net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN})


def _say(line: str) -> None:
    print("CHAOS " + line, flush=True)


def _one_line(text: str) -> str:
    return " | ".join(text.splitlines())


def _check(out: np.ndarray, want: np.ndarray, rank: int, i: int, coll: str) -> None:
    if out.shape != want.shape or not np.array_equal(out, want):
        bad = np.flatnonzero(out != want) if out.shape == want.shape else []
        at = int(bad[0]) if len(bad) else -1
        _say(f"WRONG rank={rank} call={i} coll={coll} shape={out.shape} wrong={len(bad)} "
             f"first_at={at} got={out[at] if at >= 0 else '?'} want={want[at] if at >= 0 else '?'}")


def inject(kind: str) -> None:
    """Inject a fatal fault into this process."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)          # if ever continued, stay as stuck as before
    elif kind == "exit":
        os._exit(3)
    elif kind == "raise":
        raise RuntimeError("chaos fault injected by the test program")
    elif kind == "hang":
        time.sleep(60)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    import pycomm
    comm = pycomm.COMM_WORLD
    rank, size = comm.rank, comm.size
    _say(f"START rank={rank} pid={os.getpid()} job={os.environ.get('PYCOMM_JOB_ID')} "
         f"master_port={os.environ.get('PYCOMM_MASTER_PORT')} "
         f"listen={','.join(map(str, _listening_ports()))}")
    kind, culprit, k = spec["kind"], spec["culprit"], spec["call"]
    calls = schedule(spec["seed"], k + GUARDED + AFTER, size)
    for i, call in enumerate(calls):
        bad = None
        if i == k and rank == culprit:
            bad = spec["variant"]
            _say(f"FAULT t={time.time():.6f} rank={rank} call={i} kind={kind} variant={bad}")
            if kind in FATAL:
                inject(kind)
        guarded = kind in RECOVERABLE and k <= i < k + GUARDED
        try:
            out = run_call(comm, pycomm, call, i, bad)
        except pycomm.CommError as exc:
            if not guarded:
                raise
            _say(f"CAUGHT t={time.time():.6f} rank={rank} call={i} type={type(exc).__name__} "
                 f"msg={_one_line(str(exc))}")
            continue
        if kind == "mismatch" and i == k:
            _say(f"SILENT rank={rank} call={i}")    # the harness checks a later call raised
            continue
        _check(out, expected(call, i, rank, size), rank, i, call["coll"])
    _say(f"DONE rank={rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
