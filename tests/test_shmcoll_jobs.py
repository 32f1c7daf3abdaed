"""Small collectives through shared-memory slots (pycomm.shmcoll) in whole launched jobs:
a peer that dies or leaves during a slot wait is named, a fresh job's sub-communicators
take slots, a peer entering by messages wakes the slot waiters promptly, slot waits beside
a pending nonblocking collective wake and hear of an abandoned call, and
``PYCOMM_SHM_COLL_BYTES=0`` turns the slots off (the in-process checks are
``tests/test_shmcoll.py``'s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycomm.shmcoll import MAX_COMMS

ROOT = Path(__file__).resolve().parent.parent


def _launch_job(tmp_path, program: str, n: int = 2, env: dict | None = None):
    """``launch.py -n n`` of ``program`` written in ``tmp_path``: (argv, Popen options)."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(program))
    return ([sys.executable, str(ROOT / "launch.py"), "-n", str(n), str(prog)],
            {"cwd": str(tmp_path), "env": {**os.environ, "PYCOMM_TIMEOUT": "60", **(env or {})}})


def _launch(tmp_path, program: str, n: int = 2, env: dict | None = None):
    argv, options = _launch_job(tmp_path, program, n, env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **options)


# PYCOMM_YIELD_US: ranks that yield their core while they wait (the default where ranks
# outnumber cores), whose slot waits first poll with bare sched_yield (SharedSlots._wait)
YIELDING = {"PYCOMM_YIELD_US": "300"}


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("count,path", [(4, "shared_slots"), (1 << 18, "shm_direct")])
def test_a_peer_that_dies_during_a_slot_wait_is_named(tmp_path, count, path, yielding):
    # (1 << 18 doubles: an all-reduce by direct reads of the peers' buffers, which waits
    # in the slots too: pycomm.shmdirect)
    proc = _launch(tmp_path, f"""
        import os, time, numpy as np, pycomm
        comm = pycomm.init()
        x = np.ones({count})
        comm.Allreduce(pycomm.IN_PLACE, x)
        assert comm.chosen_algorithm("allreduce", x.nbytes) == "{path}"
        if comm.rank == 1:
            time.sleep(0.5)
            os._exit(7)
        t = time.monotonic()
        try:
            comm.Allreduce(pycomm.IN_PLACE, x)
        except pycomm.PeerError as exc:
            print("PEER-ERROR", round(time.monotonic() - t, 1), exc, flush=True)
            raise SystemExit(3)
        """, env=YIELDING if yielding else None)
    out = proc.stdout + proc.stderr
    assert "PEER-ERROR" in out and "rank 1" in out, out
    seconds = float(out.split("PEER-ERROR", 1)[1].split()[0])
    assert seconds < 10, out                        # not PYCOMM_TIMEOUT (60 s)


@pytest.mark.parametrize("yielding", [False, True])
def test_a_peer_that_left_during_a_slot_wait_is_named(tmp_path, yielding):
    proc = _launch(tmp_path, """
        import numpy as np, pycomm
        comm = pycomm.init()
        comm.Barrier()
        if comm.rank == 0:
            try:
                comm.Barrier()
            except pycomm.PeerError as exc:
                print("LEFT", exc, flush=True)
        """, env=YIELDING if yielding else None)
    out = proc.stdout + proc.stderr
    assert "LEFT" in out and "rank 1 has left" in out, out


def test_a_freed_communicators_block_is_reused_once_every_member_freed_it(tmp_path):
    """pycomm.slotblocks in a fresh 3-rank job, whose blocks are known: X = {0, 1} takes
    block 1 and Y = {0, 2} block 2. Rank 0 frees X while rank 1 has not: a Dup of Y
    must not take block 1 (rank 1 may still read rank 0's), and takes 3. Once rank 1 has
    freed X too, the next Dup of Y takes block 1 back, and its first all-reduce is right
    although rank 0 enters it late and X's last header there had the same signature and
    number: rank 0 cleared the block (without that, rank 2 read X's stale 3.0)."""
    proc = _launch(tmp_path, """
        import time, numpy as np, pycomm
        comm = pycomm.init()
        r = comm.rank
        U = pycomm.UNDEFINED
        x_comm = comm.Split(0 if r in (0, 1) else U, r)
        y_comm = comm.Split(0 if r in (0, 2) else U, r)
        out = []
        if x_comm:
            x = np.array([3.0])
            x_comm.Allreduce(pycomm.IN_PLACE, x)
            out.append(("X", x_comm._block, float(x[0])))
        if y_comm:
            out.append(("Y", y_comm._block))
        if r == 0:
            x_comm.Free()
        if y_comm:
            z = y_comm.Dup()
            out.append(("Z", z._block))
        comm.Barrier()
        if r == 1:
            x_comm.Free()
        comm.Barrier()
        if y_comm:
            w = y_comm.Dup()
            v = np.array([10.0 * (r + 1)])
            if r == 0:
                time.sleep(0.3)
            w.Allreduce(pycomm.IN_PLACE, v)
            out.append(("W", w._block, float(v[0]), w._slots is not None))
        print("RESULT", r, out, flush=True)
        """, n=3)
    assert proc.returncode == 0, proc.stderr
    results = [line[line.index("RESULT"):].split(" ", 2) for line in proc.stdout.splitlines()
               if "RESULT" in line]
    got = {rank: text for _, rank, text in results}
    assert got["0"] == "[('X', 1, 6.0), ('Y', 2), ('Z', 3), ('W', 1, 40.0, True)]", got
    assert got["1"] == "[('X', 1, 6.0)]", got
    assert got["2"] == "[('Y', 2), ('Z', 3), ('W', 1, 40.0, True)]", got


def test_a_jobs_communicators_created_and_freed_in_a_loop_keep_their_slots(tmp_path):
    """Before pycomm.slotblocks, block c was context id c's: the 64th communicator of a
    job had no slots, freed or not. 300 Dup + Allreduce + Free rounds on 3 ranks: every
    one has slots, the sums are right, and two blocks serve them all (a freed block is
    taken back at the creation after the next)."""
    proc = _launch(tmp_path, """
        import numpy as np, pycomm
        comm = pycomm.init()
        seen, wrong = set(), 0
        for i in range(300):
            d = comm.Dup()
            x = np.array([float(i + comm.rank)])
            d.Allreduce(pycomm.IN_PLACE, x)
            wrong += int(x[0] != 3 * i + 3)
            seen.add((d._block, d._slots is not None))
            d.Free()
        print("RESULT", comm.rank, d._cid, sorted(seen), wrong, flush=True)
        """, n=3)
    assert proc.returncode == 0, proc.stderr
    lines = [line[line.index("RESULT"):] for line in proc.stdout.splitlines()
             if "RESULT" in line]
    assert len(lines) == 3, proc.stdout
    for line in lines:
        _, _, cid, rest = line.split(" ", 3)
        assert int(cid) >= 300 and rest == "[(1, True), (2, True)] 0", line


def test_a_fresh_jobs_sub_communicators_take_slots(tmp_path):
    proc = _launch(tmp_path, """
        import numpy as np, pycomm
        comm = pycomm.init()
        half = comm.Split(comm.rank % 2, comm.rank)
        x = np.array([float(comm.rank)])
        half.Allreduce(pycomm.IN_PLACE, x)
        print("RESULT", half._cid, half._slots is not None, x[0], flush=True)
        """, n=4)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line.split("RESULT")[1].split() for line in proc.stdout.splitlines()
                   if "RESULT" in line)
    assert len(lines) == 4 and all(int(cid) < MAX_COMMS and took == "True"
                                   for cid, took, _ in lines), proc.stdout
    assert sorted(float(v) for *_, v in lines) == [2.0, 2.0, 4.0, 4.0], proc.stdout


# -- waits that must end as soon as their cause is there (bounds far above the fix, far
#    below the defect: a missed wake-up costs the 0.25 s liveness tick, or 50 ms slices)
def test_a_peer_entering_by_messages_wakes_the_slot_waiters(tmp_path):
    proc = _launch(tmp_path, """
        import time, numpy as np, pycomm
        comm = pycomm.init()
        buf = np.arange(4.0) if comm.rank == 0 else np.zeros(4)
        comm.Barrier()
        t = time.perf_counter()
        for i in range(8):      # rank 1 runs the I-variant: the root must fall back, at once
            if comm.rank == 1:
                time.sleep(0.005)
                comm.Ibcast(buf, root=0).Wait()
            else:
                comm.Bcast(buf, root=0)
        print("TOOK", round(time.perf_counter() - t, 3), buf.tolist(), flush=True)
        """)
    assert proc.returncode == 0, proc.stderr
    for line in [ln for ln in proc.stdout.splitlines() if "TOOK" in ln]:
        took = float(line.split("TOOK")[1].split()[0])
        assert took < 1.0, proc.stdout             # was 8 x 0.25 s
        assert "[0.0, 1.0, 2.0, 3.0]" in line


def test_slot_waits_beside_a_pending_nonblocking_collective_wake_promptly(tmp_path):
    proc = _launch(tmp_path, """
        import time, numpy as np, pycomm
        comm = pycomm.init()
        dup = comm.Dup()
        comm.Barrier()
        req = dup.Ibarrier() if comm.rank == 0 else None   # a progress thread, asleep
        time.sleep(0.1)
        t = time.perf_counter()
        for i in range(20):
            if comm.rank == 1:
                time.sleep(0.003)
            comm.Barrier()
        print("TOOK", round(time.perf_counter() - t, 3), flush=True)
        if comm.rank == 1:
            dup.Barrier()
        else:
            req.Wait()
        """)
    assert proc.returncode == 0, proc.stderr
    took = [float(ln.split("TOOK")[1]) for ln in proc.stdout.splitlines() if "TOOK" in ln]
    assert len(took) == 2 and max(took) < 0.8, proc.stdout     # was 20 x 55 ms


def test_an_abandoned_call_reaches_a_slot_waiter_beside_a_nonblocking_collective(tmp_path):
    proc = _launch(tmp_path, """
        import time, numpy as np, pycomm
        comm = pycomm.init()
        dup = comm.Dup()
        x, y = np.ones(4), np.empty(4)
        comm.Allreduce(x, y)
        req = dup.Ibarrier() if comm.rank == 1 else None   # its thread also runs the watches
        comm.Barrier()
        if comm.rank == 0:
            time.sleep(0.1)
            try:
                comm.Allreduce(x, np.empty(3))   # a bad argument: the call is abandoned
            except pycomm.CommError:
                pass
            time.sleep(4)                        # away: no message of rank 0 wakes rank 1
            dup.Barrier()
        else:
            t = time.perf_counter()
            try:
                comm.Allreduce(x, y)
            except pycomm.CollectiveError as exc:
                print("RAISED", round(time.perf_counter() - t, 3), flush=True)
            req.Wait()
        """)
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if "RAISED" in ln]
    assert line and float(line[0].split("RAISED")[1]) < 2.0, proc.stdout


def test_slots_off_by_variable(tmp_path):
    proc = _launch(tmp_path, """
        import numpy as np, pycomm
        comm = pycomm.init()
        x = np.ones(4)
        comm.Allreduce(pycomm.IN_PLACE, x)
        print("RESULT", comm._slots is None, x.tolist(), flush=True)
        """, n=3, env={"PYCOMM_SHM_COLL_BYTES": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RESULT True [3.0, 3.0, 3.0, 3.0]") == 3, proc.stdout
