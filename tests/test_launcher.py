"""launch.py and pycomm.spawn: environment, output, failure propagation, cleanup."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import pycomm
from conftest import run_at_once
from pycomm.errors import ArgumentError, CommError, CommTimeoutError, PeerError, RemoteError
from pycomm.launch.launcher import RankExit, shm_prefix, sweep_shm

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")

# A rank program the tests drive through its arguments. Each rank prints its pid, makes a
# /dev/shm segment the way the shm transport names them, then does what argv says.
RANK_PROGRAM = """
import os, sys, time
rank = int(os.environ["PYCOMM_RANK"])
print(f"pid={os.getpid()}", flush=True)
seg = f"/dev/shm/pycomm-{os.environ['PYCOMM_JOB_ID']}-test-{rank}"
open(seg, "w").close()
print(f"shm={seg}", flush=True)
args = sys.argv[1:]
if any(a.endswith(str(rank)) for a in args):  # about to fail: let every rank report first
    prefix, n = seg[:-len(str(rank))], int(os.environ["PYCOMM_WORLD_SIZE"])
    while sum(os.path.exists(prefix + str(r)) for r in range(n)) < n:
        time.sleep(0.01)
if f"exit{rank}" in args:
    sys.exit(3)
if f"raise{rank}" in args:
    raise ValueError(f"deliberate failure on rank {rank}")
if f"kill{rank}" in args:
    os.kill(os.getpid(), 9)
if "sleep" in args:
    time.sleep(60)
"""


def run_launcher(args, cwd=None, timeout=30.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LAUNCH, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, check=False)


@pytest.fixture
def rank_script(tmp_path) -> str:
    path = tmp_path / "rank.py"
    path.write_text(RANK_PROGRAM)
    return str(path)


def pids_and_segments(output: str) -> tuple[list[int], list[str]]:
    return ([int(m) for m in re.findall(r"pid=(\d+)", output)],
            re.findall(r"shm=(\S+)", output))


def assert_all_gone(output: str, expect: int) -> None:
    pids, segments = pids_and_segments(output)
    assert len(pids) == expect and len(segments) == expect, output
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for seg in segments:
        assert not os.path.exists(seg), f"{seg} was not swept"


# -- launch.py --------------------------------------------------------------------------------

def test_environment_contract(tmp_path):
    script = tmp_path / "env.py"
    script.write_text(textwrap.dedent("""
        import os
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "JOB_TOKEN", "JOB_ID", "LAUNCHER_PID", "TRANSPORT", "TIMEOUT"]
        print(" ".join(f"{n}={os.environ['PYCOMM_' + n]}" for n in names))
        print("UNBUFFERED=" + os.environ["PYTHONUNBUFFERED"])
    """))
    proc = run_launcher(["-n", "3", "--transport", "tcp", "--timeout", "7.5", str(script)])
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        rank, rest = re.match(r"\[(\d+)\] (.*)", line).groups()
        rows.setdefault(int(rank), {}).update(kv.split("=", 1) for kv in rest.split())
    assert sorted(rows) == [0, 1, 2]
    for rank, env in rows.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert re.fullmatch(r"[0-9a-f]{64}", env["JOB_TOKEN"])
        assert env["TRANSPORT"] == "tcp" and float(env["TIMEOUT"]) == 7.5
        assert env["UNBUFFERED"] == "1"
    assert len({(e["JOB_TOKEN"], e["JOB_ID"], e["MASTER_PORT"]) for e in rows.values()}) == 1


def test_output_is_prefixed_per_stream_and_partial_lines_flushed(tmp_path):
    script = tmp_path / "out.py"
    script.write_text("import os, sys\nr = os.environ['PYCOMM_RANK']\n"
                      "print('out', r, sys.argv[1:])\nprint('err', r, file=sys.stderr)\n"
                      "print('tail', r, end='')\n")
    proc = run_launcher(["-n", "2", str(script), "a", "--b"])
    assert proc.returncode == 0, proc.stderr
    for r in (0, 1):
        assert f"[{r}] out {r} ['a', '--b']\n" in proc.stdout
        assert f"[{r}] tail {r}\n" in proc.stdout
        assert f"[{r}] err {r}\n" in proc.stderr
    plain = run_launcher(["--no-prefix", "-n", "2", str(script)])
    assert plain.returncode == 0
    assert "[0]" not in plain.stdout and "out 0 []" in plain.stdout


def test_module_mode(tmp_path):
    (tmp_path / "mymod.py").write_text("import os, sys\n"
                                       "print('module', os.environ['PYCOMM_RANK'], sys.argv[1:])\n")
    proc = run_launcher(["-n", "2", "-m", "mymod", "-x", "1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[0] module 0 ['-x', '1']" in proc.stdout
    assert "[1] module 1 ['-x', '1']" in proc.stdout


def test_success_sweeps_shm(rank_script):
    proc = run_launcher(["-n", "2", rank_script])
    assert proc.returncode == 0, proc.stderr
    assert_all_gone(proc.stdout, 2)


def test_exit_code_propagates(rank_script):
    proc = run_launcher(["-n", "3", rank_script, "exit1", "sleep"])
    assert proc.returncode == 3
    assert re.search(r"rank 1 \(pid \d+\) exited with code 3; stopping the other", proc.stderr)
    assert_all_gone(proc.stdout, 3)


def test_raising_rank_names_itself(rank_script):
    proc = run_launcher(["-n", "2", rank_script, "raise1", "sleep"])
    assert proc.returncode == 1
    assert "[1] ValueError: deliberate failure on rank 1" in proc.stderr
    assert "rank 1 (pid" in proc.stderr and "exited with code 1" in proc.stderr
    assert_all_gone(proc.stdout, 2)


def test_sigkilled_rank_stops_the_others_fast(rank_script):
    start = time.monotonic()
    proc = run_launcher(["-n", "4", rank_script, "kill2", "sleep"])
    assert time.monotonic() - start < 10.0  # the survivors sleep 60 s
    assert proc.returncode == 128 + signal.SIGKILL
    assert re.search(r"rank 2 \(pid \d+\) was killed by signal SIGKILL; stopping the other 3 "
                     r"ranks", proc.stderr), proc.stderr
    assert_all_gone(proc.stdout, 4)


def start_sleeping_job(rank_script, n=2):
    """Start a launcher whose ranks sleep; return it once every rank has reported."""
    proc = subprocess.Popen([sys.executable, LAUNCH, "-n", str(n), rank_script, "sleep"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 20
    while sum("shm=" in line for line in lines) < n and time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
    return proc, "".join(lines)


def test_ctrl_c_stops_everything(rank_script):
    proc, head = start_sleeping_job(rank_script)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130
    assert "got SIGINT" in err
    assert_all_gone(head + out, 2)


def test_sigkilled_launcher_takes_its_ranks_along(rank_script):
    proc, head = start_sleeping_job(rank_script)
    proc.kill()
    proc.communicate(timeout=15)
    pids, segments = pids_and_segments(head)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    for seg in segments:  # nobody is left to sweep: do it as the next launcher would
        os.unlink(seg)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_bad_command_lines():
    assert run_launcher(["-n", "2"]).returncode == 2
    assert run_launcher(["-n", "0", "x.py"]).returncode == 2
    assert run_launcher(["--transport", "carrier-pigeon", "x.py"]).returncode == 2


def test_shm_helpers(tmp_path):
    assert shm_prefix("abc") == "pycomm-abc-"
    (tmp_path / "pycomm-abc-1").touch()
    (tmp_path / "pycomm-abcd-1").touch()
    assert sweep_shm("abc", str(tmp_path)) == ["pycomm-abc-1"]
    assert os.listdir(tmp_path) == ["pycomm-abcd-1"]
    assert RankExit(1, 10, -9).exit_code == 137 and RankExit(1, 10, 3).exit_code == 3


# -- pycomm.spawn and Pool --------------------------------------------------------------------


def _rank() -> int:
    return int(os.environ["PYCOMM_RANK"])


def test_spawn_lambda_and_closure():
    offset = 100
    assert pycomm.spawn(lambda x: _rank() * x + offset, 3, args=(10,)) == [100, 110, 120]


def test_spawned_ranks_import_pycomm_from_its_checkout_and_nothing_else_of_it():
    # the workers' PYTHONPATH names the folder holding the pycomm package, not the package
    # itself (whose trace.py, ray/ ... would shadow top-level modules)
    def paths():
        import sys
        import pycomm as pc
        return sys.path, os.path.dirname(os.path.dirname(os.path.abspath(pc.__file__)))
    package = os.path.dirname(os.path.abspath(pycomm.__file__))
    for path, root in pycomm.spawn(paths, 2):
        assert package not in path and root in path


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_spawn_runs_a_collective(transport):
    result = pycomm.spawn(lambda: pycomm.COMM_WORLD.allreduce(pycomm.COMM_WORLD.rank + 1), 3,
                          transport=transport, timeout=30)
    assert result == [6, 6, 6]


def test_launched_script_uses_the_world(tmp_path):
    script = tmp_path / "world.py"
    script.write_text("import pycomm\ncomm = pycomm.COMM_WORLD\n"
                      "print('sum', comm.allreduce(comm.rank), 'of', comm.size)\n")
    env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "3", str(script)], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": env_path})
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[{r}] sum 3 of 3" for r in range(3)]


def test_spawn_reraises_with_rank_and_traceback():

    def fail_on_one():
        if _rank() == 1:
            raise KeyError("no such thing")
        return _rank()

    with pytest.raises(RemoteError) as info:
        pycomm.spawn(fail_on_one, 2)
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert "fail_on_one" in info.value.remote_traceback
    assert "no such thing" in str(info.value)


def test_pool_reuse_errors_and_death():
    with pycomm.Pool(3, timeout=30) as pool:
        pids = pool.run(os.getpid)
        assert pids == pool.pids
        with pytest.raises(RemoteError, match="rank 0 raised ZeroDivisionError"):
            pool.run(lambda: 1 // (_rank() - 0))
        assert pool.run(os.getpid) == pids  # same processes, still usable
        shm = f"/dev/shm/{shm_prefix(pool.job_id)}pooltest"
        pool.run(lambda: _rank() == 0 and open(shm, "w").close())
        with pytest.raises(PeerError, match="rank 2 .* killed by signal SIGKILL") as info:
            pool.run(lambda: os.kill(os.getpid(), 9) if _rank() == 2 else time.sleep(30))
        assert info.value.peer == 2
        with pytest.raises(CommError, match="broken"):
            pool.run(os.getpid)
    assert not any(_alive(pid) for pid in pids)
    assert not os.path.exists(shm)


def test_pool_task_timeout_breaks_it():
    with pycomm.Pool(2, timeout=30) as pool:
        with pytest.raises(CommTimeoutError, match=r"ranks \[1\]"):
            # 2 s: rank 0, with nothing to do, must have answered by then on a loaded machine
            pool.run(lambda: time.sleep(30 * _rank()), timeout=2.0)
        pids = pool.pids
    assert not any(_alive(pid) for pid in pids)


def test_pool_task_too_large_leaves_it_usable_and_a_failed_store_breaks_it(monkeypatch):
    monkeypatch.setenv("PYCOMM_STORE_MAX_BYTES", str(1 << 20))
    with pycomm.Pool(2, timeout=30) as pool:
        pids = pool.run(os.getpid)
        with pytest.raises(ArgumentError, match="exceed"):
            pool.run(len, b"x" * (2 << 20))     # refused before any rank sees a task
        assert pool.run(os.getpid) == pids      # the next task is the one they wait for

        def stalled(*args, **kwargs):
            raise CommTimeoutError("store at x: no answer to wait within 5 s")
        pool._client.wait = stalled
        with pytest.raises(CommError, match="store failed"):
            pool.run(os.getpid)
        with pytest.raises(CommError, match="broken"):
            pool.run(os.getpid)
    assert not any(_alive(pid) for pid in pids)


# -- who caused a failure, and the survivors' last words (issue 15) -------------------------

WORLD_PROGRAM = """
import os, signal, sys, time
import numpy as np
import pycomm
comm = pycomm.COMM_WORLD
comm.Barrier()
if comm.rank == 2:
    time.sleep(0.3)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("deliberate failure on rank 2")
if sys.argv[1] == "raise":      # ranks 0 and 1 wait for each other: a hang of their own
    comm.Recv(np.zeros(4), source=1 - comm.rank, tag=9)
comm.Allreduce(pycomm.IN_PLACE, np.ones(4))
"""


@pytest.fixture(scope="module")
def failed_jobs(tmp_path_factory) -> dict:
    """The three jobs below, started together (most of their seconds go to the report
    grace, a timeout and the launcher's stopping): name -> (CompletedProcess, seconds)."""
    folder = tmp_path_factory.mktemp("failed-jobs")
    (folder / "world.py").write_text(WORLD_PROGRAM)
    (folder / "stopped.py").write_text(STOPPED_PROGRAM)
    env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": env_path}
    world = [sys.executable, LAUNCH, "-n", "3", "--transport", "shm"]
    return run_at_once({
        "kill": ([*world, "--timeout", "30", str(folder / "world.py"), "kill"], {"env": env}),
        "raise": ([*world, "--timeout", "30", str(folder / "world.py"), "raise"],
                  {"env": env}),
        "stopped": ([*world, "--timeout", "2", str(folder / "stopped.py")],
                    {"env": {**env, "PYCOMM_KILL_GRACE": "20"}})}, folder, timeout=60)


def test_survivors_report_the_dead_peer_before_they_are_stopped(failed_jobs):
    proc, _ = failed_jobs["kill"]
    err = proc.stderr
    # every survivor's own error names rank 2 (they got a grace to say so): its own
    # PeerError, or the CollectiveError of a call the other survivor abandoned first ...
    for r in (0, 1):
        assert re.search(rf"^\[{r}\] pycomm.errors.(PeerError: rank {r}: .*rank 2|"
                         rf"CollectiveError: rank {r}: .*PeerError.*rank 2)", err, re.M), err
    # ... and the launcher names rank 2 as the cause, with the survivors' word for it
    assert re.search(r"^pycomm.launch: rank 2 caused the failure \(rank 2 \(pid \d+\) was "
                     r"killed by signal SIGKILL\); ranks \[[01, ]+\] name it in Allreduce #4 on "
                     r"pycomm.COMM_WORLD: PeerError: rank \d: Allreduce #4 on pycomm.COMM_WORLD: "
                     r".*; stopping the other 0 ranks$", err, re.M), err
    assert proc.returncode == 128 + signal.SIGKILL


def test_ranks_still_waiting_print_their_flight_recorder(failed_jobs):
    # rank 2 exits (raises) while ranks 0 and 1 wait for each other (a receive each, no
    # send: its leaving does not end their wait); after the report grace the launcher
    # has them print where they are (SIGUSR1)
    proc, _ = failed_jobs["raise"]
    err = proc.stderr
    assert proc.returncode == 1
    for r in (0, 1):
        dump = re.search(rf"^\[{r}\] pycomm flight recorder, rank {r} \(pid \d+\): SIGUSR1:"
                         rf".*?^\[{r}\] end of flight recorder$", err, re.M | re.S)
        assert dump, err
        assert re.search(r"Recv +pycomm.COMM_WORLD .* running$", dump[0], re.M), dump[0]
    summary = err.index("pycomm.launch: rank 2 (pid")
    assert re.search(r"rank 2 \(pid \d+\) exited with code 1; stopping the other 2 ranks",
                     err[summary:]), err
    assert err.index("[0] pycomm flight recorder") < summary    # last words come first


STOPPED_PROGRAM = """
import os, signal
import numpy as np
import pycomm
comm = pycomm.COMM_WORLD
comm.Barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
comm.Allreduce(pycomm.IN_PLACE, np.ones(4))
"""


def test_stopped_rank_is_named_and_the_job_ends_promptly(failed_jobs):
    # a SIGSTOPped rank answers nobody: the others time out naming it, and the launcher
    # continues it after SIGTERM instead of waiting PYCOMM_KILL_GRACE to SIGKILL it
    proc, took = failed_jobs["stopped"]
    err = proc.stderr
    # rank 1 either published its position before it stopped (its last answer is quoted)
    # or stopped before its responder thread first published one
    assert re.search(r"^pycomm.launch: rank 1 caused the failure \(it is still running: rank 1 "
                     r".*(no answer now|did not answer \(stopped)", err, re.M), err
    assert "ranks [1] have not called Allreduce #4 on pycomm.COMM_WORLD" in err
    # waiting out the 20 s kill grace would take over 22 s (the 2 s timeout before it)
    assert took < 20, f"{took:.1f} s\n{err}"


def test_the_verdict_follows_a_cascade_to_the_rank_that_failed_first():
    """Rank 2 raised and left; rank 0, waiting for it, failed and left too; rank 1, waiting
    for rank 0, names rank 0. The verdict blames rank 2, whose own diagnosis names nobody."""
    from pycomm.launch.launcher import RankExit, _culprit_line
    exits = {r: RankExit(r, 100 + r, 1) for r in range(3)}
    diags = {0: {"culprits": [2], "call": "Allreduce #7", "error": "PeerError: rank 2 left"},
             1: {"culprits": [0], "call": "Allreduce #7", "error": "PeerError: rank 0 left"}}
    line = _culprit_line(exits[2], diags, {}, exits)
    assert line.startswith("rank 2 caused the failure (rank 2 (pid 102) exited with code 1); "
                           "ranks [0] name it in Allreduce #7: PeerError: rank 2 left"), line
    # ranks that name each other (mutual timeouts) have no end: every vote counts
    loop = {0: {"culprits": [1], "error": "x"}, 1: {"culprits": [0], "error": "y"},
            2: {"culprits": [0], "error": "z"}}
    assert _culprit_line(exits[0], loop, {}, exits).startswith("rank 0 caused the failure")


# Each rank polls its siblings' state as fast as it can and says when it sees one gone.
WATCHER_PROGRAM = """
import os, sys, time
pids_file = sys.argv[1]
while not os.path.exists(pids_file):
    time.sleep(0.001)
pids = [int(p) for p in open(pids_file).read().split()]
others = [p for p in pids if p != os.getpid()]
print("watching", flush=True)
while True:
    for p in others:
        try:
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "X"
        if state in "ZX":
            print(f"saw {p} gone", flush=True)
            sys.exit(0)
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_a_freezing_stop_lets_no_rank_see_another_gone(tmp_path, monkeypatch, freeze):
    """``stop(freeze=True)`` (the launcher's answer to Abort) stops every rank before any
    gets SIGTERM, so none runs again to see a peer gone, even when the launcher is held up
    between two signals (as on a loaded machine, where a rank ran between them, saw the
    aborting rank's connection close and printed a PeerError). Here each rank polls its
    peers' state as fast as it can and exits 0 once it sees one gone, and the launcher
    sleeps 50 ms after each SIGTERM: without the freeze, the later ranks see the first
    gone (the False case shows that the test can tell)."""
    from pycomm.launch import launcher
    real_killpg = os.killpg

    def slow_killpg(pid, sig):
        real_killpg(pid, sig)
        if sig == signal.SIGTERM:
            time.sleep(0.05)
    monkeypatch.setattr(launcher.os, "killpg", slow_killpg)
    prog = tmp_path / "watch.py"
    prog.write_text(WATCHER_PROGRAM)
    pids_file = tmp_path / "pids"
    group = launcher.RankGroup(3, prefix=False)
    try:
        group.start([str(prog), str(pids_file)])
        tmp = tmp_path / "pids.tmp"
        tmp.write_text(" ".join(str(p.pid) for p in group.procs))
        tmp.rename(pids_file)
        time.sleep(0.3)                 # every rank is polling
        assert group.running() == [0, 1, 2]
        group.stop(freeze=freeze)
        assert group.running() == []
        codes = [p.returncode for p in group.procs]
    finally:
        group.close()
    if freeze:
        assert codes == [-signal.SIGTERM] * 3, codes
    else:
        assert codes[0] == -signal.SIGTERM and 0 in codes[1:], codes
