"""Chaos trials (issue 15's proof, benchmarks/chaos.py): one fixed trial per fault kind on
shm, 3 ranks through launch.py, four trials at a time (a module fixture; each test checks
one trial).

Every trial must give no wrong result, leave nothing behind (processes, /dev/shm
segments, listening ports), name the culprit rank (the launcher's verdict for a fatal
fault; every rank's error for a recoverable one), and end within its bound:

* fatal faults (kill, stop, exit, raise, hang): the launcher exits non-zero with its
  verdict line within PYCOMM_TIMEOUT (3 s) + PYCOMM_REPORT_GRACE + PYCOMM_KILL_GRACE + 3 s
  of the fault: the time the launcher allows itself when a rank ignores SIGTERM (a stopped
  one does), plus slack for a loaded machine. Issue 15's tighter 5 s target is what
  ``python -m benchmarks.chaos`` tabulates (benchmarks/README.md has the figures and the
  kinds that miss it);
* recoverable faults (a bad argument, a mismatched call): every rank raises a CommError
  within 5 s of the fault, and the job then runs to its end with exit code 0.

The last two tests check that the harness's detectors are not vacuous: a wrong value is
reported, and a leaked process and /dev/shm segment are found (and removed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from benchmarks import _chaos_rank as rankmod
from benchmarks import chaos
from pycomm import config

pytestmark = pytest.mark.usefixtures("no_shared_world")

FATAL_BOUND = (chaos.JOB_TIMEOUT + float(config.get("PYCOMM_REPORT_GRACE"))
               + float(config.get("PYCOMM_KILL_GRACE")) + 3.0)

# (kind, transport, culprit, call, schedule seed): fixed, so the same calls and faults
# every run; a stopped peer on rdma once held every survivor's exit for its drain limit
CASES = [("kill", "shm", 1, 2, 101), ("stop", "shm", 2, 1, 102), ("exit", "shm", 0, 2, 103),
         ("raise", "shm", 1, 1, 104), ("hang", "shm", 2, 2, 105),
         ("badarg", "shm", 0, 1, 106), ("mismatch", "shm", 1, 2, 107),
         ("stop", "rdma", 1, 2, 108)]


AT_ONCE = 4        # trials run together: most of a trial's seconds go to waiting


@pytest.fixture(scope="module")
def trials() -> dict:
    """Every trial of CASES, AT_ONCE at a time (each its own job, leaks looked for by its
    job id, process groups and ports): case -> the measured chaos.Trial."""
    from conftest import _CACHE
    _CACHE.close()              # fresh jobs, nothing shared beside them
    with ThreadPoolExecutor(AT_ONCE) as pool:
        done = pool.map(lambda c: chaos.run_trial(chaos.make_trial(0, c[0], c[1], 3, *c[2:])),
                        CASES)
        return dict(zip(CASES, done))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,transport,culprit,call,seed", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_one_fault_no_wrong_result_no_leak_ends_in_bound(trials, kind, transport, culprit,
                                                         call, seed):
    t = trials[kind, transport, culprit, call, seed]
    report = f"{chaos.describe(t)}: {chaos.misses(t)}\n{t.verdict}\n{t.evidence}"
    assert not t.timed_out, report
    assert t.wrong == 0, report
    assert t.leaks == [], report
    assert t.end_s is not None, report          # the culprit reported its fault
    assert t.names_culprit, report              # the verdict / every rank's error names it
    assert t.names_call, report                 # ... and the call (the culprit's own too)
    if kind in rankmod.FATAL:
        assert t.exit_code not in (0, None), report
        assert t.verdict.startswith("pycomm.launch: "), report
        assert t.end_s <= FATAL_BOUND, report
    else:
        assert t.exit_code == 0, report
        assert t.ended, report                  # every rank raised within 5 s, then went on
        assert len(t.caught) >= 2 and t.culprit in t.caught, report


def test_a_wrong_value_is_reported(capsys):
    want = rankmod.expected({"coll": "Allreduce", "count": 5, "root": 0}, 3, 0, 4)
    assert np.array_equal(want, sum(rankmod.contribution(r, 3, 5) for r in range(4)))
    rankmod._check(want.copy(), want, 0, 3, "Allreduce")
    assert capsys.readouterr().out == ""
    got = want.copy()
    got[2] += 1
    rankmod._check(got, want, 0, 3, "Allreduce")
    out = capsys.readouterr().out
    assert out.startswith("CHAOS WRONG rank=0 call=3 coll=Allreduce ") and "first_at=2" in out


def test_leaks_are_found_and_removed():
    job = "chaostest" + uuid.uuid4().hex[:8]
    seg = f"/dev/shm/pycomm-{job}-0"
    with open(seg, "wb") as f:
        f.write(b"x")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env={**os.environ, "PYCOMM_JOB_ID": job})
    try:
        time.sleep(0.2)
        leaks = chaos._leaks(job, set(), set())
        assert f"process {proc.pid} (state S)" in leaks or \
            any(x.startswith(f"process {proc.pid} ") for x in leaks), leaks
        assert seg in leaks, leaks
        assert proc.wait(timeout=5) == -9               # killed by the sweep
        assert not os.path.exists(seg)
        assert chaos._leaks(job, set(), set()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if os.path.exists(seg):
            os.unlink(seg)
