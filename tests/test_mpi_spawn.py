"""MPI_Comm_spawn on pycomm (pycomm.MPI.spawn): jobs under ``launch.py --mpi4py`` whose
programs (tests/data/spawn) spawn children and check what crosses the link; failures
name what failed on every parent and leave the world usable; no child, no /dev/shm
segment outlives a job. mpi4py's own test_spawn (44 tests) runs through
``python -m pycomm.MPI.conformance -m test_spawn`` (benchmarks/README.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
DATA = ROOT / "tests" / "data" / "spawn"


def _launch(n: int, program: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LAUNCH, "-n", str(n), "--mpi4py", "--no-prefix",
                           str(DATA / program)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=str(ROOT),
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def _segments(job_id: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"pycomm-{job_id}")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for this purpose (its parent, the killed root, is gone too)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("transport", ["shm", "tcp", "rdma"])
def test_spawned_children_exchange_data_with_their_parents(transport):
    # Spawn_multiple of two commands (1 + 2 children) from 2 parents, info wdir: Bcast,
    # gather and point-to-point both ways over the link, the children's own COMM_WORLD
    # (allreduce), APPNUM, argv, errcodes, Disconnect; then the parents' world again
    proc = _launch(2, "parent.py", PYCOMM_TRANSPORT=transport)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert [ln.split()[:3] for ln in lines] == [["rank", "0:", "ok"], ["rank", "1:", "ok"]], \
        proc.stdout + proc.stderr
    assert "pycomm.spawn" not in proc.stderr, proc.stderr
    assert _segments(lines[0].split()[3]) == []


def test_spawn_failures_are_errors_on_every_parent_and_the_world_goes_on():
    proc = _launch(2, "failures.py")
    sleepers = subprocess.run(["pgrep", "-f", "time.sleep(60)"], capture_output=True,
                              text=True).stdout.split()
    assert sleepers == [], f"a child that never joined is still running: {sleepers}"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        head, _, rest = line.partition(": ")
        out[head] = rest
    spawn_error = "CommError[MPI_ERR_SPAWN: spawn error]"
    for r in (0, 1):
        assert out[f"rank {r} no such command"].startswith(
            f"{spawn_error}: rank {r}: Spawn: cannot start spawned rank 0 "
            "(/nonexistent/pycomm-child): [Errno 2]"), out
        text = out[f"rank {r} exits before joining"]
        # (either child may be seen first)
        assert re.match(rf"{re.escape(spawn_error)}: rank {r}: Spawn: spawned rank [01] ",
                        text) and \
            text.endswith("exited with code 3 before it joined its parents"), text
        # a child that died after joining: a PeerError naming it, on the link's bridge
        text = out[f"rank {r} a child dies"]
        assert text.startswith("PeerError[") and "lost connection to rank 2" in text and \
            "MPI_Comm_spawn bridge [parents 0..1, spawned 2..2]" in text, text
        assert f"rank {r} done" in proc.stdout
    # the root's own argument error is its ValueError (as mpi4py's conversion), and
    # ERR_SPAWN naming it on the others
    assert out["rank 0 root's bad maxprocs"] == \
        "ValueError: Spawn: maxprocs must be at least 1, got 0"
    assert out["rank 1 root's bad maxprocs"] == (
        f"{spawn_error}: rank 1: Spawn: the root's arguments: Spawn: maxprocs must be at "
        "least 1, got 0")
    assert out["rank 1 root's bad args"] == "ValueError: expecting 1 items, got 2"
    assert out["rank 0 root's bad args"].startswith(
        f"{spawn_error}: rank 0: Spawn_multiple: the root's arguments: expecting 1 items")
    # an error at the root that is not pycomm's (the store's bind): raised there, and
    # ERR_SPAWN naming it on the others, who do not wait for the root
    assert out["rank 0 the root's store cannot bind"].startswith("ZMQError: ")
    assert out["rank 1 the root's store cannot bind"].startswith(
        f"{spawn_error}: rank 1: Spawn: ZMQError: "), out
    # a child that never joins: ERR_SPAWN on every parent after PYCOMM_TIMEOUT, and the
    # child is stopped (no sleeper is left: the launched job's own check below)
    for r in (0, 1):
        assert out[f"rank {r} a child never joins"] == (
            f"{spawn_error}: rank {r}: Spawn: 1 spawned process(es) did not join their "
            "parents within 2 s (PYCOMM_TIMEOUT); stopped"), out
    # the root reports the child that failed when it exits
    assert "pycomm.spawn: spawned rank 0 " in proc.stderr and \
        "os._exit(7)) exited with code 7" in proc.stderr, proc.stderr


def test_a_childs_abort_ends_the_whole_job_as_under_mpiexec():
    # MPICH's mpiexec ends every process of the job, parents included, when a spawned
    # process calls MPI_Abort (its exit status then 9, a SIGKILL, on this machine's
    # MPICH 5.0.2); pycomm's root stops the spawn's children, then aborts its own job with
    # the child's code. (mpi4py.futures relies on it: an MPIPoolExecutor in a script
    # without the main guard otherwise waited for its futures forever.)
    start = time.monotonic()
    proc = _launch(2, "child_aborts.py")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 spawned", "rank 1 spawned"], \
        proc.stdout
    assert "pycomm.spawn: spawned rank 0 called Abort(3); every spawned process of its " \
        "spawn was stopped; ending this job too" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 30
    left = subprocess.run(["pgrep", "-f", "CHILD_ABORTS_MARKER"], capture_output=True,
                          text=True).stdout.split()
    assert left == [], f"a spawned process is still running: {left}"


def test_a_killed_root_takes_its_children_and_their_segments_with_it():
    start = time.monotonic()
    proc = _launch(2, "killed_root.py")
    assert proc.returncode == 137, proc.stdout + proc.stderr
    assert "rank 0 (pid" in proc.stderr and "killed by signal SIGKILL" in proc.stderr
    words = proc.stdout.split()
    job, pids = words[1], [int(p) for p in words[3:]]
    deadline = time.monotonic() + 5.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "spawned processes outlived their root"
    assert _segments(job) == []
    assert time.monotonic() - start < 60


def test_parents_that_leave_without_disconnecting_fail_their_waiting_child():
    proc = _launch(2, "parent_leaves.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["parents leave"] * 2
    assert "PeerError: rank 2: Recv from rank 0 on MPI_Comm_spawn bridge [parents 0..1, " \
        "spawned 2..2].Dup: rank 0 has left" in proc.stderr, proc.stderr
    assert "pycomm.spawn: spawned rank 0 " in proc.stderr and \
        "exited with code 1" in proc.stderr, proc.stderr


def test_the_roots_arguments_convert_as_mpi4py_converts_them(tmp_path):
    # no process is started: the conversion at the root (pycomm.MPI.spawn._app & co.)
    import numpy as np

    from pycomm.MPI import Info
    from pycomm.MPI.spawn import _app, _argv_lists, _infos, _procs_list
    app = _app(Path(sys.executable), "-V", np.int64(2), None, "Spawn")
    assert (app.command, app.args, app.maxprocs, app.wdir) == (sys.executable, ("-V",), 2,
                                                               None)
    assert _app("x", None, 1, Info(), "Spawn").args == ()      # a null Info: no keys
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    info = Info.Create({"path": str(tmp_path), "wdir": "/tmp", "soft": "1:4"})
    assert (_app("tool", [], 1, info, "Spawn").command,
            _app("tool", [], 1, info, "Spawn").wdir) == (str(tool), "/tmp")
    with pytest.raises(ValueError, match="root's host"):
        _app("x", [], 1, Info.Create({"host": "elsewhere.invalid"}), "Spawn")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="maxprocs must be at least 1"):
            _app("x", [], bad, None, "Spawn")
    with pytest.raises(TypeError, match="maxprocs must be an int"):
        _app("x", [], 1.5, None, "Spawn")
    with pytest.raises(TypeError, match="command"):
        _app(3, [], 1, None, "Spawn")
    assert _procs_list(None, 2) == [1, 1] and _procs_list(np.int32(3), 2) == [3, 3]
    assert _argv_lists("a", 2) == ["a", "a"] and _infos(None, 2) == [None, None]
    for fn, arg in ((_procs_list, [1, 2, 3]), (_argv_lists, [[]]), (_infos, [None] * 3)):
        with pytest.raises(ValueError, match="expecting 2 items"):
            fn(arg, 2)


def test_a_merged_link_outlives_the_disconnect():
    # Merge, Disconnect the link, then an allreduce over parents and children on the
    # merged communicator: the bridge stays open while something made from it lives
    proc = _launch(2, "merge.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split("\n")) == sorted(
        ["", "parent 0 ok", "parent 1 ok", "child 0 ok", "child 1 ok"]), proc.stdout


def test_the_roots_exit_does_not_wait_for_a_stopped_child():
    start = time.monotonic()
    proc = _launch(1, "stopped_child.py", PYCOMM_TIMEOUT="60")
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "parent leaves\n"
    assert "was still running (stopped by a signal: not waited for); stopped" in \
        proc.stderr, proc.stderr
    assert took < 20, f"the job took {took:.1f} s (PYCOMM_TIMEOUT 60)"
