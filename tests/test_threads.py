"""Two threads of one rank in pycomm at once: pycomm provides THREAD_SERIALIZED, so the
second thread gets ThreadLevelError at once (pycomm.waiting, "Threads"), naming the rank,
both threads and both calls, instead of the job waiting out PYCOMM_TIMEOUT; the first
thread's call goes on and the communicator works afterwards.

The jobs are fresh worlds started by ``launch.py`` (2 and 3 ranks, shm and tcp) with a
PYCOMM_TIMEOUT of 60 s, all at once (they mostly wait). Each rank prints one ``RESULT``
line the tests read: what each thread got and how long the refused call took.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import _CACHE, run_at_once
from pycomm.errors import CommError, ThreadLevelError

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")

pytestmark = pytest.mark.usefixtures("no_shared_world")

# mode "p2p": on every rank a thread waits in Recv from the previous rank while the main
# thread Sends to the next (mpi4py's demo/threads): the Send is refused; the Recv, whose
# message never comes, ends at its own 3 s timeout.
# mode "barrier": on rank 0 a thread waits in Barrier (the others enter it later) while the
# main thread Sends to rank 1: the Send is refused, the Barrier completes.
# mode "second": on rank 0 the main thread waits in Recv from rank 1 while a thread enters
# Barrier: the Barrier is refused (and abandoned on every rank), the Recv completes with
# the message rank 1 sends later.
# Every mode then checks the communicator: a ring Sendrecv and an Allreduce, serially.
PROGRAM = textwrap.dedent("""
    import sys, threading, time
    import numpy as np
    import pycomm
    from pycomm.errors import CollectiveError, CommTimeoutError, ThreadLevelError
    comm = pycomm.COMM_WORLD
    rank, size, mode = comm.rank, comm.size, sys.argv[1]
    eng = comm._engine
    out = {}

    def held_by_other():
        # until the other thread waits in pycomm (holds the engine)
        end = time.monotonic() + 30
        while eng._waiter is None and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(0.05)

    def attempt(key, fn):
        t0 = time.monotonic()
        try:
            fn()
            out[key] = "ok"
        except ThreadLevelError as exc:
            out[key] = "refused"
            out[key + "_s"] = round(time.monotonic() - t0, 3)
            out[key + "_msg"] = str(exc)
        except CommTimeoutError:
            out[key] = "timeout"
        except CollectiveError:
            out[key] = "abandoned"

    nxt, prv = (rank + 1) % size, (rank - 1) % size
    buf = np.zeros(4, np.int64)
    if mode == "p2p":
        th = threading.Thread(target=attempt, name="receiver",
                              args=("thread", lambda: comm.Recv(buf, prv, 7, timeout=3)))
        th.start()
        held_by_other()
        attempt("main", lambda: comm.Send(np.full(4, rank, np.int64), nxt, 7))
        th.join()
    elif mode == "barrier":
        if rank == 0:
            th = threading.Thread(target=attempt, name="barrier",
                                  args=("thread", comm.Barrier))
            th.start()
            held_by_other()
            attempt("main", lambda: comm.Send(np.full(4, rank, np.int64), 1, 7))
            th.join()
        else:
            time.sleep(1.0)
            attempt("main", comm.Barrier)
    else:
        if rank == 0:
            def late_barrier():
                held_by_other()
                attempt("thread", comm.Barrier)
            th = threading.Thread(target=late_barrier, name="barrier")
            th.start()
            attempt("main", lambda: comm.Recv(buf, 1, 5))
            th.join()
            out["got"] = buf.tolist()
        else:
            time.sleep(1.0)
            attempt("main", comm.Barrier)      # abandoned by rank 0's refused Barrier
            if rank == 1:
                comm.Send(np.full(4, 41, np.int64), 0, 5)
    # settle the one abandoned call: a rank that finished it learns in its next call,
    # which completed everywhere (``late``); one that failed it retries
    for _ in range(3):
        try:
            comm.Barrier()
            break
        except CollectiveError as exc:
            if getattr(exc, "late", False):
                break
    # the communicator works: point-to-point on the same tag, and a collective
    comm.Sendrecv(np.full(4, rank, np.int64), nxt, 7, buf, prv, 7)
    ring = buf.tolist() == [prv] * 4
    total = np.zeros(1, np.int64)
    comm.Allreduce(np.array([rank + 1], np.int64), total)
    out["after"] = ring and int(total[0]) == size * (size + 1) // 2
    print("RESULT", repr(out), flush=True)
""")

CASES = [(transport, n, mode) for transport in ("shm", "tcp") for n in (2, 3)
         for mode in ("p2p", "barrier", "second")]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every case of CASES, started together: key -> (CompletedProcess, seconds)."""
    _CACHE.close()          # no shared world beside them
    folder = tmp_path_factory.mktemp("threads")
    script = folder / "threads.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return run_at_once(
        {key: ([sys.executable, LAUNCH, "-n", str(key[1]), "--transport", key[0],
                "--timeout", "60", str(script), key[2]], {"env": env}) for key in CASES},
        folder, timeout=150)


def _results(proc) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^\[(\d+)\] RESULT (.*)$", line)
        if m:
            found[int(m[1])] = eval(m[2])      # noqa: S307 (our own program's repr)
    return found


def _check_refused(res: dict, key: str, rank: int, caller: str, call: str, holder: str,
                   held: str) -> None:
    assert res[key] == "refused", res
    assert res[key + "_s"] < 2.0, res          # at once, not the 60 s timeout
    msg = res[key + "_msg"]
    assert msg.startswith(f"rank {rank}: thread {caller!r} called {call}"), msg
    assert f"while thread {holder!r} is waiting in {held}" in msg, msg
    assert "THREAD_SERIALIZED" in msg and "not THREAD_MULTIPLE" in msg, msg


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 3])
def test_send_beside_a_waiting_recv_is_refused(jobs, transport, n):
    proc, _ = jobs[transport, n, "p2p"]
    found = _results(proc)
    assert sorted(found) == list(range(n)), proc.stdout
    for r, res in found.items():
        _check_refused(res, "main", r, "MainThread",
                       f"Send(dest={(r + 1) % n}, tag=7) on pycomm.COMM_WORLD", "receiver",
                       f"Recv(source={(r - 1) % n}, tag=7) on pycomm.COMM_WORLD")
        assert res["thread"] == "timeout", res  # its message was the refused Send
        assert res["after"] is True, res


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 3])
def test_send_beside_a_waiting_barrier_is_refused(jobs, transport, n):
    proc, _ = jobs[transport, n, "barrier"]
    found = _results(proc)
    assert sorted(found) == list(range(n)), proc.stdout
    _check_refused(found[0], "main", 0, "MainThread", "Send(dest=1, tag=7) on "
                   "pycomm.COMM_WORLD", "barrier", "Barrier() on pycomm.COMM_WORLD")
    assert found[0]["thread"] == "ok", found    # the waiting Barrier went on
    for r, res in found.items():
        if r:
            assert res["main"] == "ok", res
        assert res["after"] is True, res


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 3])
def test_barrier_beside_a_waiting_recv_is_refused(jobs, transport, n):
    proc, _ = jobs[transport, n, "second"]
    found = _results(proc)
    assert sorted(found) == list(range(n)), proc.stdout
    _check_refused(found[0], "thread", 0, "barrier", "Barrier() on pycomm.COMM_WORLD",
                   "MainThread", "Recv(source=1, tag=5) on pycomm.COMM_WORLD")
    # the waiting Recv went on and got its message
    assert found[0]["main"] == "ok" and found[0]["got"] == [41] * 4, found
    for r, res in found.items():
        if r:       # the refused Barrier was abandoned everywhere (or completed first)
            assert res["main"] in ("abandoned", "ok"), res
        assert res["after"] is True, res


def test_error_class():
    assert issubclass(ThreadLevelError, CommError)
    from pycomm import MPI
    from pycomm.MPI.exceptions import translate
    exc = translate(ThreadLevelError("rank 0: two threads"))
    assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_OTHER
    assert MPI.Query_thread() <= MPI.THREAD_SERIALIZED
