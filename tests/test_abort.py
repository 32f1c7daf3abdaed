"""``Comm.Abort(code)`` ends the whole job as ``mpiexec`` does: every rank stops, the job
exits with ``code``, and the other ranks die silently (no traceback, no PeerError, no
flight recorder) instead of reporting the aborting rank as a lost peer.

mpi4py's own demo/test-run/test_run.py expects this silence (``testSysExitCode``: an
``sys.exit(7)`` under ``python -m mpi4py`` calls MPI_Abort, and no "Traceback" may appear).
Checked here under ``launch.py`` on one host (shm and tcp, the core API and mpi4py's), under
two node agents of a 2-node job on this host (a rank of either node aborting), and in a
:class:`pycomm.Pool`; with no launcher to read the note (torchrun's variables, rank 0 hosting
the store) the aborting rank exits by itself after its wait, and with no store at all (a
world of one) at once. The exit status is the code modulo 256, as a process's is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import pycomm
from pycomm.errors import CommError, PeerError
from tests.test_cluster_launch import _free_port, _node_argv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch.py")

# One rank (argv[3], default 1) aborts while the others wait on it: in a Barrier, or in a
# receive from it.
CORE_PROGRAM = """\
import sys, pycomm
import numpy as np
comm = pycomm.init()
aborting = int(sys.argv[3]) if len(sys.argv) > 3 else 1
comm.Barrier()
if comm.rank == aborting:
    comm.Abort(int(sys.argv[1]))
if sys.argv[2] == "recv":
    comm.Recv(np.empty(4), source=aborting, tag=3)
else:
    comm.Barrier()
print("not reached", flush=True)
"""

MPI4PY_PROGRAM = """\
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
aborting = int(sys.argv[3]) if len(sys.argv) > 3 else 1
comm.Barrier()
if comm.rank == aborting:
    comm.Abort(int(sys.argv[1]))
if sys.argv[2] == "recv":
    comm.recv(source=aborting, tag=3)
else:
    comm.Barrier()
print("not reached", flush=True)
"""

_QUIET = ("Traceback", "PeerError", "flight recorder", "not reached")


def _assert_silent(proc: subprocess.CompletedProcess, code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert "rank 1 called Abort(%d)" % code in proc.stderr, proc.stderr
    for word in _QUIET:
        assert word not in proc.stderr + proc.stdout, proc.stderr


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("transport,wait,api", [
    ("shm", "barrier", "core"), ("tcp", "recv", "core"),
    ("shm", "recv", "mpi4py"), ("tcp", "barrier", "mpi4py")])
def test_abort_ends_the_job_with_its_code_and_the_others_die_silently(tmp_path, transport,
                                                                      wait, api):
    prog = tmp_path / "prog.py"
    prog.write_text(CORE_PROGRAM if api == "core" else MPI4PY_PROGRAM)
    flags = ["--mpi4py"] if api == "mpi4py" else []
    t0 = time.monotonic()
    # a 60 s report grace: a rank taken for failed, not aborting, would have it waited out
    proc = subprocess.run(
        [sys.executable, LAUNCH, "-n", "3", "--transport", transport, *flags, str(prog),
         "7", wait], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYCOMM_REPORT_GRACE": "60"})
    took = time.monotonic() - t0
    _assert_silent(proc, 7)
    assert "pycomm.launch: rank 1 called Abort(7); stopping all 3 running ranks" in proc.stderr
    assert took < 30, took


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("aborting", [1, 2])         # node 0's rank 1, node 1's rank 2
def test_abort_under_node_agents_stops_every_node_with_its_code(tmp_path, aborting):
    prog = tmp_path / "prog.py"
    prog.write_text(MPI4PY_PROGRAM)
    port = _free_port()
    env = {**os.environ, "PYCOMM_REPORT_GRACE": "60", "PYCOMM_JOB_TOKEN": "abort-test"}
    nodes = [subprocess.Popen(_node_argv(k, port, (),
                                         [str(prog), "261", "barrier", str(aborting)]),
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    outs = []
    try:
        for node in nodes:
            outs.append(node.communicate(timeout=60))
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    for node, (out, err) in zip(nodes, outs):
        assert node.returncode == 261 % 256, err
        assert f"rank {aborting} called Abort(261); stopping the" in err, err
        for word in _QUIET:
            assert word not in out + err, err
    # the rank's own line comes through its node's agent
    assert f"pycomm: rank {aborting} called Abort(261)" in outs[aborting // 2][1]


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYCOMM_", "PMI_", "OMPI_", "SLURM_", "RANK", "WORLD_SIZE",
                                 "MASTER_", "LOCAL_RANK", "HYDRA_", "MPI_"))}


@pytest.mark.usefixtures("no_shared_world")
def test_abort_with_no_launcher_to_read_the_note_exits_after_its_wait(tmp_path):
    # torchrun's variables: rank 0 hosts the store and nothing reads the abort note, so
    # rank 1 exits by itself after _ABORT_WAIT_S; its peers are torchrun's to stop
    from pycomm.comm import _ABORT_WAIT_S
    prog = tmp_path / "prog.py"
    prog.write_text(CORE_PROGRAM)
    port = _free_port() - 1
    procs = []
    try:
        for r in range(2):
            env = {**_clean_env(), "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYCOMM_TIMEOUT": "60"}
            procs.append(subprocess.Popen([sys.executable, str(prog), "300", "recv"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        t0 = time.monotonic()
        _, err = procs[1].communicate(timeout=60)
        took = time.monotonic() - t0
        assert procs[1].returncode == 300 % 256, err
        assert "pycomm: rank 1 called Abort(300)" in err, err
        assert _ABORT_WAIT_S <= took < _ABORT_WAIT_S + 20, took
    finally:
        for p in procs:
            p.kill()
            p.communicate()


def test_abort_in_a_world_of_one_exits_at_once(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("import pycomm\npycomm.COMM_WORLD.Abort(300)\nprint('not reached')\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(prog)], env=_clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 300 % 256, proc.stderr
    assert proc.stderr == "pycomm: rank 0 called Abort(300)\n" and proc.stdout == ""
    assert time.monotonic() - t0 < 15


def _abort_on_rank_1(code: int) -> None:
    comm = pycomm.COMM_WORLD
    if comm.rank == 1:
        comm.Abort(code)
    comm.Barrier()


@pytest.mark.usefixtures("no_shared_world")
def test_abort_in_a_pool_raises_peer_error_naming_the_rank_and_code():
    pool = pycomm.Pool(3, transport="shm", timeout=60)
    try:
        t0 = time.monotonic()
        with pytest.raises(PeerError, match=r"rank 1 called Abort\(5\) during task "
                                            r"_abort_on_rank_1; the pool is stopped"):
            pool.run(_abort_on_rank_1, 5)
        assert time.monotonic() - t0 < 10
        with pytest.raises(CommError, match="the pool is broken"):
            pool.run(_abort_on_rank_1, 5)
    finally:
        pool.close()
