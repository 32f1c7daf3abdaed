"""The stall inspector: a hung rank is named by the others' warnings, their timeout errors,
the launcher and pool.run, with what it last did (pycomm.stall, issue 15).

The jobs are fresh 3-rank worlds started by ``launch.py`` (or ``pycomm.spawn``): rank 2
sleeps after a Bcast while ranks 0 and 1 enter an Allreduce, with PYCOMM_STALL_WARN=1 and a
3 s timeout. The launched jobs run at the same time (they mostly wait), started by a
module fixture; each test checks one job's output. The world's own start-up runs Allreduce #1 and Barrier #2, so the program's
Bcast is #3 and its Allreduce #4 on pycomm.COMM_WORLD.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import _CACHE, run_at_once
from pycomm import stall

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")

pytestmark = pytest.mark.usefixtures("no_shared_world")

HANG = textwrap.dedent("""
    import sys, time
    import numpy as np
    import pycomm
    comm = pycomm.COMM_WORLD
    x = np.ones(1)
    comm.Bcast(x, root=0)
    if comm.rank == 2:
        time.sleep(120)
    if sys.argv[1] == "collective":
        comm.Allreduce(pycomm.IN_PLACE, x)
    elif sys.argv[1] == "nonblocking":
        comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
    elif comm.rank == 0:
        comm.Recv(x, 2, tag=7)
    else:
        # rank 0's Recv times out first, so its own report is in before rank 1's names it
        # (the launcher stops the accused at once: both timeouts at 3 s raced)
        time.sleep(0.5)
        comm.Barrier()
""")

# Each rank takes another for the Bcast's root: every rank waits to receive, no message
# crosses to show the mismatch, and only the ranks' positions prove it (pycomm.stall.mismatch).
ROOTS = textwrap.dedent("""
    import sys
    import numpy as np
    import pycomm
    comm = pycomm.COMM_WORLD
    x = np.zeros(100000)
    root = (comm.rank + 1) % comm.size
    bcast = (lambda: comm.Bcast(x, root=root)) if sys.argv[1] == "roots" else \\
        (lambda: comm.Ibcast(x, root=root).Wait())
    for what, call in (("bcast", bcast),
                       ("next", lambda: comm.Allreduce(pycomm.IN_PLACE, x)),
                       ("after", lambda: comm.allreduce(comm.rank))):
        try:
            print(f"{what}: {call()}", flush=True)
        except pycomm.CommError as exc:
            print(f"{what}: {type(exc).__name__}: {exc}", flush=True)
""")

# Every job of this module: (transport, mode, PYCOMM_STALL_WARN). Each spends its seconds
# waiting (rank 2 asleep, the others until the warning and the 3 s timeout), so the
# fixture below starts them all at once and the tests read their outcomes.
JOBS = [("shm", "collective", "1"), ("tcp", "collective", "1"), ("rdma", "collective", "1"),
        ("shm", "p2p", "1"), ("shm", "nonblocking", "1"), ("shm", "collective", "30"),
        ("tcp", "roots", "1"), ("rdma", "roots", "1"), ("tcp", "iroots", "1"),
        ("tcp", "roots", "30")]


def _job(folder: Path, transport: str, mode: str, warn: str, timeout: str = "3"):
    """``launch.py -n 3`` of HANG written in ``folder``: (argv, Popen options)."""
    script = folder / "hang.py"
    script.write_text(ROOTS if mode.endswith("roots") else HANG)
    env = {**os.environ, "PYCOMM_STALL_WARN": warn,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    return [sys.executable, LAUNCH, "-n", "3", "--transport", transport, "--timeout",
            timeout, str(script), mode], {"env": env}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job of JOBS, started together: key -> (CompletedProcess, seconds it took)."""
    _CACHE.close()          # no shared world beside them
    folder = tmp_path_factory.mktemp("hang")
    return run_at_once({key: _job(tmp_path_factory.mktemp("job"), *key) for key in JOBS},
                       folder, timeout=60)


MISSING = "ranks [2] have not called Allreduce #4 on pycomm.COMM_WORLD"
LAST = "rank 2 last completed Bcast #3 on pycomm.COMM_WORLD"


@pytest.mark.parametrize("transport", ["shm", "tcp", "rdma"])
def test_hung_rank_is_named_everywhere(jobs, transport):
    proc, took = jobs[transport, "collective", "1"]
    err = proc.stderr
    assert proc.returncode == 1, err
    # rank 2 sleeps 120 s: it was stopped, not awaited (far less, even with the other
    # jobs of the fixture beside it on a loaded machine)
    assert took < 60, err
    for r in (0, 1):
        # the warning after PYCOMM_STALL_WARN seconds
        warn = re.search(rf"^\[{r}\] pycomm: rank {r}: warning: Allreduce #4 on "
                         rf"pycomm.COMM_WORLD has waited [\d.]+ s for rank \d .*$", err, re.MULTILINE)
        assert warn and MISSING in warn[0] and LAST in warn[0], err
        assert "and is in no pycomm call" in warn[0]
        # the timeout error names the call, the missing rank and what it last did; the
        # first rank to time out abandons the call on the others, whose CollectiveError
        # quotes it
        error = re.search(rf"^\[{r}\] pycomm.errors.(CommTimeoutError: rank {r}: |"
                          rf"CollectiveError: rank {r}: Allreduce #4 on pycomm.COMM_WORLD "
                          r"failed on rank \d \(CommTimeoutError: rank \d: )"
                          r"Allreduce #4 on pycomm.COMM_WORLD: .*$", err, re.MULTILINE)
        assert error and "did not complete within 3 s" in error[0], err
        assert MISSING in error[0] and LAST in error[0], err
        # and its flight recorder went to stderr with the error
        assert re.search(rf"^\[{r}\] pycomm flight recorder, rank {r} .*: "
                         r"(CommTimeoutError|CollectiveError) left a call", err, re.MULTILINE), err
    assert "pycomm.errors.CommTimeoutError" in err
    # the launcher blames rank 2, not the first rank to exit, and got its last words
    summary = [line for line in err.splitlines() if line.startswith("pycomm.launch:")]
    assert len(summary) == 1 and summary[0].startswith(
        "pycomm.launch: rank 2 caused the failure (it is still running: " + LAST), err
    assert re.search(r"; ranks \[[01, ]+\] name it in Allreduce #4 on pycomm.COMM_WORLD: "
                     r"CommTimeoutError: rank \d: Allreduce #4", summary[0]), summary[0]
    assert re.search(r"^\[2\] pycomm flight recorder, rank 2 \(pid \d+\): SIGUSR1", err, re.MULTILINE)
    assert re.search(r"^\[2\] +\d+ +Bcast +pycomm.COMM_WORLD +3 +8 ", err, re.MULTILINE), err


@pytest.mark.parametrize("transport, mode, warn", [
    ("tcp", "roots", "1"), ("rdma", "roots", "1"), ("tcp", "iroots", "1"),
    ("tcp", "roots", "30")])
def test_a_mismatch_no_message_shows_is_found_by_asking_the_ranks(jobs, transport, mode,
                                                                  warn):
    """Bcast (``iroots``: Ibcast and Wait) with a different root on every rank: all wait
    to receive. At PYCOMM_STALL_WARN (1 s; the timeout is 3 s) the ranks' positions prove
    the mismatch, or at the timeout when the warning would come later (30 s); the call
    and the next fail on every rank as any mismatch does, and the one after works (MPI
    would hang)."""
    proc, took = jobs[transport, mode, warn]
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    for r in range(3):
        bcast = re.search(rf"^\[{r}\] bcast: (.*)$", out, re.MULTILINE)
        assert bcast and bcast[1].startswith("CollectiveMismatchError: "), out
        assert "collective mismatch in call #3 on pycomm.COMM_WORLD: rank " in bcast[1], out
        assert "(found by asking the ranks)" in bcast[1] and "root=" in bcast[1], out
        assert "did not complete within" not in bcast[1], out      # not the timeout's
        assert re.search(rf"^\[{r}\] next: CollectiveMismatchError: .*call #4 .*abandoned",
                         out, re.MULTILINE), out
        assert re.search(rf"^\[{r}\] after: 3$", out, re.MULTILINE), out


def test_point_to_point_stall_names_the_peer(jobs):
    proc, _ = jobs["shm", "p2p", "1"]
    err = proc.stderr
    warn = re.search(r"^\[0\] pycomm: rank 0: warning: Recv from rank 2 \(tag 7\) on "
                     r"pycomm.COMM_WORLD has waited [\d.]+ s for rank 2 .*: (.*)$", err, re.MULTILINE)
    assert warn and warn[1].startswith(LAST), err
    error = re.search(r"^\[0\] pycomm.errors.CommTimeoutError: rank 0: Recv from rank 2 "
                      r"\(tag 7\) on pycomm.COMM_WORLD: receive from rank 2 .*$", err, re.MULTILINE)
    assert error and LAST in error[0], err
    # rank 1 waits in a Barrier that rank 0 (in its Recv) never enters: it names rank 0
    # and rank 2, and says where rank 0 is
    warn1 = re.search(r"^\[1\] pycomm: rank 1: warning: Barrier #4 .*$", err, re.MULTILINE)
    assert warn1 and "ranks [0, 2] have not called Barrier #4" in warn1[0], err
    assert "rank 0 last completed Bcast #3 on pycomm.COMM_WORLD" in warn1[0]
    assert "and is in Recv from rank 2 (tag 7) on pycomm.COMM_WORLD" in warn1[0]
    assert "pycomm.launch: rank 2 caused the failure" in err


def test_nonblocking_collective_stall_names_the_hung_rank(jobs):
    proc, _ = jobs["shm", "nonblocking", "1"]
    err = proc.stderr
    missing = "ranks [2] have not called Iallreduce #4 on pycomm.COMM_WORLD"
    for r in (0, 1):    # the progress thread's wait warns; the Wait or the schedule times out
        warn = re.search(rf"^\[{r}\] pycomm: rank {r}: warning: Iallreduce #4 on "
                         r"pycomm.COMM_WORLD has waited .*$", err, re.MULTILINE)
        assert warn and missing in warn[0] and LAST in warn[0], err
        error = re.search(rf"^\[{r}\] pycomm.errors.\w+Error: rank {r}: .*Iallreduce #4 .*$",
                          err, re.MULTILINE)
        assert error and missing in error[0] and LAST in error[0], err
    assert re.search(r"^pycomm.launch: rank 2 caused the failure", err, re.MULTILINE), err


def test_no_warning_before_the_threshold(jobs):
    proc, _ = jobs["shm", "collective", "30"]
    assert not re.search(r"pycomm: rank \d: warning:", proc.stderr), proc.stderr
    # without a warning first, the timeout still asks and names the missing rank
    assert re.search(r"CommTimeoutError: rank \d: Allreduce #4 .*" + re.escape(MISSING),
                     proc.stderr), proc.stderr


def _hang_in_task():
    import numpy as np
    comm = pycomm.COMM_WORLD
    x = np.ones(1)
    comm.Bcast(x, root=0)
    if comm.rank == 2:
        time.sleep(30)
    comm.Allreduce(pycomm.IN_PLACE, x)


def test_spawn_timeout_names_the_hung_rank():
    with pytest.raises(pycomm.CommTimeoutError) as info:
        pycomm.spawn(_hang_in_task, 3, transport="shm", timeout=2)
    text = str(info.value)
    assert info.value.culprits == [2], text
    assert LAST in text and "and is in no pycomm call" in text, text


# -- the diagnosis itself, from made-up positions ---------------------------------------------

class _Comm:
    name, _cid, _world = "pycomm.COMM_WORLD", 0, [0, 1, 2, 3]


def _pos(rank, running=None, last=None, seq=0, waiting_for=None, answered=True):
    return {"rank": rank, "pid": 100 + rank, "round": 1, "wall": time.time(),
            "running": running, "waiting_for": waiting_for, "last": last, "failed": None,
            "comms": {0: seq}, "sigusr1": True, "answered": answered}


def test_diagnose_names_missing_and_silent_ranks():
    call = ("allreduce", _Comm(), 57, 8, "ring", -1, 0)
    positions = {
        1: _pos(1, ["allreduce", "pycomm.COMM_WORLD", 0, 57, -1, 3.0], seq=57, waiting_for=0),
        2: _pos(2, None, ["bcast", "pycomm.COMM_WORLD", 0, 56, 12.4], seq=56),
        3: None,
    }
    text, culprits = stall.diagnose(0, call, positions)
    assert culprits == [2, 3]
    assert text.startswith("ranks [2, 3] have not called Allreduce #57 on pycomm.COMM_WORLD")
    assert "rank 2 last completed Bcast #56 on pycomm.COMM_WORLD 12.4 s ago, and is in no " \
           "pycomm call" in text
    assert "rank 3 did not answer" in text
    # everyone inside: no culprit, but who waits for whom
    positions[2] = _pos(2, ["allreduce", "pycomm.COMM_WORLD", 0, 57, -1, 1.0], seq=57,
                        waiting_for=3)
    positions[3] = _pos(3, ["allreduce", "pycomm.COMM_WORLD", 0, 57, -1, 1.0], seq=57)
    text, culprits = stall.diagnose(0, call, positions)
    assert culprits == [] and text.startswith("every rank has entered Allreduce #57")
    assert "rank 2 waits for rank 3" in text


def test_describe_position_of_a_rank_that_stopped_answering():
    old = _pos(2, None, ["barrier", "pycomm.COMM_WORLD", 0, 9, 1.0], seq=9, answered=False)
    old["wall"] -= 5.0
    text = stall.describe_position(old, 2)
    assert text.startswith("rank 2 last completed Barrier #9 on pycomm.COMM_WORLD 6.0 s ago")
    assert "no answer now; this is its answer of 5.0 s ago" in text


def test_summarize_from_outside():
    positions = {0: _pos(0, ["bcast", "pycomm.COMM_WORLD", 0, 5, -1, 2.0], seq=5),
                 1: _pos(1, ["bcast", "pycomm.COMM_WORLD", 0, 5, -1, 2.0], seq=5),
                 2: _pos(2, None, ["barrier", "pycomm.COMM_WORLD", 0, 4, 2.5], seq=4)}
    text, suspects = stall.summarize(positions)
    assert suspects == [2]
    assert text.startswith("ranks [0, 1] are in Bcast #5 on pycomm.COMM_WORLD, which ranks "
                           "[2] have not called; rank 2 last completed Barrier #4")
    # ranks that just failed in the collective count as having entered it
    positions[1]["running"] = None
    positions[1]["failed"] = ["bcast", "pycomm.COMM_WORLD", 0, 5, 0.1, "CommTimeoutError"]
    text, suspects = stall.summarize(positions)
    assert suspects == [2]
    assert text.startswith("ranks [0] are in and ranks [1] failed in Bcast #5 on "
                           "pycomm.COMM_WORLD, which ranks [2] have not called"), text


def test_mismatch_is_proven_only_by_a_conflicting_signature_of_the_same_call():
    """What :func:`pycomm.stall.mismatch` reads as proof: a member's call of the same
    number on the same context whose collective, op, root or count differs. A datatype
    alone may differ where no bytes move, another number is another call, a
    ``Create_group`` context numbers its calls out of order: none is proof."""
    from types import SimpleNamespace
    from pycomm.signature import signature
    f64, i64 = np.dtype(np.float64), np.dtype(np.int64)
    mine = signature("Bcast", f64, 4, root=1)
    eng = SimpleNamespace(current={5: (57, mine, [0, 1, 2])}, unordered=set())
    comm = SimpleNamespace(name="pycomm.COMM_WORLD", _engine=eng, _cctx=5, _world=[0, 1, 2],
                           _from_world={0: 0, 1: 1, 2: 2}, rank=0)
    call = ("bcast", comm, 57, 32, "binomial", -1, 0)

    def with_sig(seq, sig, ctx=5):
        return {"sigs": {ctx: [seq, *sig]}}
    same = {1: with_sig(57, mine), 2: None}
    assert stall.mismatch(0, call, same) is None
    other_root = signature("Bcast", f64, 4, root=2)
    found = stall.mismatch(0, call, {1: with_sig(57, mine), 2: with_sig(57, other_root)})
    assert found == ("collective mismatch in call #57 on pycomm.COMM_WORLD: rank 2 is in "
                     "Bcast(root=2, float64x4), rank 0 in Bcast(root=1, float64x4) (found "
                     "by asking the ranks)")
    other_dtype = signature("Bcast", i64, 4, root=1)
    assert other_dtype != mine and stall.mismatch(0, call, {1: with_sig(57, other_dtype)}) \
        is None
    assert stall.mismatch(0, call, {1: with_sig(58, other_root)}) is None      # its next call
    assert stall.mismatch(0, call, {1: with_sig(57, other_root, ctx=8)}) is None
    assert stall.mismatch(0, ("Recv", comm, 57, 32, None, 1, 0),
                          {1: with_sig(57, other_root)}) is None               # not collective
    eng.unordered.add(5)
    assert stall.mismatch(0, call, {1: with_sig(57, other_root)}) is None
