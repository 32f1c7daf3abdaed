"""The flight recorder (pycomm.trace): the ring, its dumps, and the Chrome-trace timeline.

The ring itself is tested in this process with a stand-in communicator; the dumps and the
timeline on fresh jobs started by ``launch.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycomm import trace
from pycomm.errors import CommTimeoutError, TruncationError

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")


class _Calls:
    seq = 0


class _Comm:
    name, _cid = "pycomm.COMM_WORLD", 0

    def __init__(self):
        self._calls = _Calls()


@pytest.fixture
def ring(monkeypatch):
    """A fresh 4-slot ring (the module's globals, restored afterwards)."""
    import itertools
    monkeypatch.setattr(trace, "_cap", 4)
    monkeypatch.setattr(trace, "_calls", [None] * 4)
    monkeypatch.setattr(trace, "_ends", [0] * 4)
    monkeypatch.setattr(trace, "_errors", {})
    monkeypatch.setattr(trace, "_counter", itertools.count())
    monkeypatch.setattr(trace, "_spill", None)
    monkeypatch.setattr(trace, "begin", trace.begin)
    monkeypatch.setattr(trace, "_on_error", None)
    return trace


def test_ring_keeps_the_last_calls_and_their_states(ring, capsys):
    comm = _Comm()
    for seq in range(1, 4):
        comm._calls.seq = seq
        ring.end(ring.begin("bcast", comm, seq, 8, "binomial", -1))
    n = ring.begin("Recv", comm, 7, 16, None, 2)
    ring.fail(n, CommTimeoutError("rank 0: late"))
    comm._calls.seq = 4
    ring.begin("allreduce", comm, 4, 8, "ring", -1)          # still running
    calls = ring._snapshot()
    assert [c[0] for c in calls] == [1, 2, 3, 4]              # call 0 was overwritten
    assert [c[1][0] for c in calls] == ["bcast", "bcast", "Recv", "allreduce"]
    assert calls[2][3] == "CommTimeoutError: rank 0: late" and calls[3][2] == 0
    assert ring.current()[:3] == ("allreduce", comm, 4)
    assert ring.describe_call(ring.current()) == "Allreduce #4 on pycomm.COMM_WORLD"
    assert ring.describe_call(calls[2][1]) == "Recv from rank 2 (tag 7) on pycomm.COMM_WORLD"
    last, _t1 = ring.last_completed()
    assert last[:3] == ("bcast", comm, 3)
    assert ring.collective_progress() == {0: 4}
    # the error printed the ring, once, with every state
    err = capsys.readouterr().err
    assert err.startswith("pycomm flight recorder, rank ")
    assert "CommTimeoutError left a call: last 4 of 4 calls" in err
    rows = err.splitlines()[2:-1]
    assert [r.split()[1] for r in rows] == ["Bcast", "Bcast", "Bcast", "Recv"]
    assert rows[-1].endswith("error: CommTimeoutError: rank 0: late")
    ring.dump(file=(out := io.StringIO()))
    assert out.getvalue().splitlines()[-2].endswith("running")
    # a truncation is recorded but not printed: the caller's buffer, named in the error
    n = ring.begin("Recv", comm, 8, 16, None, 1)
    ring.fail(n, TruncationError("rank 0: message of 40 bytes is larger than 16"))
    assert capsys.readouterr().err == ""
    assert ring._snapshot()[-1][3].startswith("TruncationError: rank 0: message of 40")


def test_a_late_end_does_not_touch_a_reused_slot(ring):
    first = ring.begin("Wait", None, -1, -1, None, -1)
    for _ in range(4):
        ring.end(ring.begin("barrier", _Comm(), 1, 0, "dissemination", -1))
    ring.end(first)                                          # its slot holds call 4 now
    assert all(t1 for _n, _c, t1, _e in ring._snapshot())
    assert [n for n, *_ in ring._snapshot()] == [1, 2, 3, 4]


def test_spill_keeps_every_call_for_the_timeline(ring):
    ring._spill, ring.begin = [], ring._begin_keeping       # what PYCOMM_TRACE installs
    for seq in range(10):
        ring.end(ring.begin("allreduce", _Comm(), seq, 8, "ring", -1))
    events = [e for e in ring.chrome_events(rank=3) if e["ph"] == "X"]
    assert [e["args"]["seq"] for e in events] == list(range(10))
    assert all(e["pid"] == 3 and e["dur"] >= 0 and e["name"] == "Allreduce" for e in events)


# -- on real jobs -----------------------------------------------------------------------------

PROGRAM = textwrap.dedent("""
    import os, signal
    import numpy as np
    import pycomm
    comm = pycomm.COMM_WORLD
    x = np.ones(4)
    comm.Bcast(x, root=1)
    comm.Allreduce(pycomm.IN_PLACE, x)
    if comm.rank == 0:
        comm.Send(x, 1, tag=5)
    elif comm.rank == 1:
        comm.Recv(x, 0, tag=5)
    req = comm.Iallreduce(pycomm.IN_PLACE, x)
    req.Wait()
    comm.Barrier()
    if comm.rank == 0:
        os.kill(os.getpid(), signal.SIGUSR1)
    print("ok", x[0], flush=True)
""")


def _launch(tmp_path, env_extra):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = {**os.environ, **env_extra,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, LAUNCH, "-n", "3", "--transport", "shm",
                           "--timeout", "20", str(script)], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_sigusr1_prints_the_ring(tmp_path):
    proc = _launch(tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    dump = re.search(r"^\[0\] pycomm flight recorder, rank 0 \(pid \d+\): SIGUSR1: last "
                     r"(\d+) of \1 calls.*?\n(.*?)^\[0\] end of flight recorder$",
                     proc.stderr, re.MULTILINE | re.DOTALL)
    assert dump, proc.stderr
    rows = [line.split()[2] for line in dump[2].splitlines()[1:]]
    # start-up's Allreduce and Barrier, then the program's calls (the Barrier runs)
    assert rows[:5] == ["Allreduce", "Barrier", "Bcast", "Allreduce", "Send"], dump[0]
    # the progress thread begins the Iallreduce before or after the Wait begins
    assert sorted(rows[5:7]) == ["Iallreduce", "Wait"] and rows[7:] == ["Barrier"], dump[0]
    assert "[1] pycomm flight recorder" not in proc.stderr       # only rank 0 was signalled


def _nests(events) -> bool:
    """Events of one thread either nest or are disjoint (what a complete-event track needs)."""
    spans = sorted((e["ts"], -e["dur"], e["ts"] + e["dur"]) for e in events)
    stack: list[float] = []
    for start, _neg, stop in spans:
        while stack and stack[-1] <= start:
            stack.pop()
        if stack and stop > stack[-1] + 1e-3:
            return False
        stack.append(stop)
    return True


@pytest.mark.parametrize("ring", [None, "3"])
def test_pycomm_trace_writes_a_chrome_timeline(tmp_path, ring):
    # ring "3": the flight recorder overwrites calls, and PYCOMM_TRACE keeps them all,
    # those of the shared-memory slot calls too (recorded in CollectiveCalls.fast_runner's
    # own frame, not through trace.begin)
    path = tmp_path / "timeline.json"
    proc = _launch(tmp_path, {"PYCOMM_TRACE": str(path),
                              **({"PYCOMM_TRACE_CALLS": ring} if ring else {})})
    assert proc.returncode == 0, proc.stderr
    for r in range(3):   # every rank printed its ring at exit and wrote its file
        assert re.search(rf"^\[{r}\] pycomm flight recorder, rank {r} .*: exit "
                         rf"\(PYCOMM_TRACE=", proc.stderr, re.MULTILINE), proc.stderr
        assert (tmp_path / f"timeline.json.rank{r}.json").exists()
    merged = json.loads(path.read_text())             # merged by the launcher
    calls = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1, 2}
    for r in range(3):
        mine = sorted((e for e in calls if e["pid"] == r), key=lambda e: e["ts"])
        names = [e["name"] for e in mine if e["tid"] == 0]
        p2p = {0: ["Send"], 1: ["Recv"], 2: []}[r]
        assert names == ["Allreduce", "Barrier", "Bcast", "Allreduce", *p2p, "Wait",
                         "Barrier"], names
        nonblocking = [e for e in mine if e["tid"] == 1]
        assert [e["name"] for e in nonblocking] == ["Iallreduce"]
        assert all(e["dur"] >= 0 and e["ts"] > 0 and e["args"]["state"] == "done"
                   for e in mine)
        colls = [e for e in mine if e["cat"] == "collective"]
        assert [e["args"]["seq"] for e in colls] == [1, 2, 3, 4, 5, 6]
        assert colls[2]["args"]["bytes"] == 32 and colls[2]["args"]["algorithm"]
        for tid in (0, 1):
            assert _nests([e for e in mine if e["tid"] == tid])
        # the Wait spans the end of the Iallreduce it waits for, on the other track
        wait = next(e for e in mine if e["name"] == "Wait")
        assert wait["ts"] + wait["dur"] >= nonblocking[0]["ts"] + nonblocking[0]["dur"] - 1
    send = next(e for e in calls if e["name"] == "Send")
    assert send["args"]["peer"] == 1 and send["args"]["seq"] == 5
