"""Unmodified mpi4py programs on pycomm: ``launch.py --mpi4py`` and ``python -m
pycomm.MPI.alias``; a real mpi4py is not shadowed unless ``PYCOMM_MPI4PY=1`` asks.

The programs import only ``mpi4py`` (examples/mpi4py_osu.py in the style of mpi4py's
``demo/osu_latency.py`` and ``osu_allreduce.py``, and a small one written here); the
checks are on their output and exit status, as a user would see them.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycomm.MPI import hook
from pycomm.MPI.alias import ALIAS_PATH

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
OSU = str(ROOT / "examples" / "mpi4py_osu.py")

PROGRAM = """\
import sys
import mpi4py
mpi4py.rc.initialize = True
from mpi4py import MPI
import mpi4py.MPI
assert mpi4py.MPI is MPI
comm = MPI.COMM_WORLD
assert isinstance(comm, MPI.Intracomm)
buf = [bytearray(b"?" * 5), MPI.CHAR]
if comm.rank == 0:
    buf = [bytearray(sys.argv[1].encode()), MPI.CHAR]
comm.Bcast(buf, root=0)
total = comm.allreduce(comm.rank, op=MPI.SUM)
sys.stdout.write("rank %d of %d got %s sum %d initialized %s\\n"   # one write per line:
                 % (comm.rank, comm.size, bytes(buf[0]).decode(), total,  # ranks share
                    MPI.Is_initialized()))                                # stdout
"""


def _run(args, env=None, timeout=120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=str(ROOT),
                          env={**os.environ, **(env or {})})


@pytest.mark.usefixtures("no_shared_world")
def test_osu_style_program_runs_unmodified_on_three_ranks():
    proc = _run([LAUNCH, "-n", "3", "--mpi4py", "--no-prefix", OSU, "4096"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "# vendor: pycomm" in out and "MPI 4.1" in out
    assert "# ranks: 3, processor: " in out
    assert "# initialized: True" in out
    latency = re.findall(r"^(\d+) +(\d+\.\d\d)$", out.split("# MPI Allreduce Test")[0],
                         re.MULTILINE)
    assert [int(s) for s, _ in latency] == [0] + [2**i for i in range(13)]
    reduce_rows = re.findall(r"^(\d+) +\d+\.\d\d$", out.split("# MPI Allreduce Test")[1],
                             re.MULTILINE)
    assert [int(s) for s in reduce_rows] == [2**i for i in range(2, 13)]
    assert out.rstrip().endswith("CHECK ok")


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("nprocs", [1, 2])
def test_argv_and_mpi4py_imports_resolve_to_pycomm(tmp_path, nprocs):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    proc = _run([LAUNCH, "-n", str(nprocs), "--mpi4py", "--no-prefix", str(prog), "hello"])
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    total = nprocs * (nprocs - 1) // 2
    assert lines == [f"rank {r} of {nprocs} got hello sum {total} initialized True"
                     for r in range(nprocs)]


@pytest.mark.usefixtures("no_shared_world")
def test_alias_bootstrap_for_other_launchers(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    proc = _run([LAUNCH, "-n", "2", "--no-prefix", "-m", "pycomm.MPI.alias", str(prog),
                 "world"], env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        f"rank {r} of 2 got world sum 1 initialized True" for r in range(2)]


def test_real_mpi4py_is_not_shadowed_unless_asked(tmp_path):
    real = tmp_path / "site" / "mpi4py"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("__version__ = '9.9.9-real'\n")
    path = os.pathsep.join([ALIAS_PATH, str(ROOT), str(tmp_path / "site")])
    code = "import mpi4py; print(mpi4py.__version__)"
    plain = _run(["-c", code], env={"PYTHONPATH": path, "PYCOMM_MPI4PY": ""})
    assert plain.stdout.strip() == "9.9.9-real", plain.stderr
    asked = _run(["-c", code], env={"PYTHONPATH": path, "PYCOMM_MPI4PY": "1"})
    assert asked.stdout.strip() == "4.0.0+pycomm", asked.stderr


def test_without_the_flag_mpi4py_is_not_importable_from_pycomm(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("import importlib.util, sys\n"
                    "sys.exit(0 if importlib.util.find_spec('mpi4py') is None or "
                    "'+pycomm' not in __import__('mpi4py').__version__ else 3)\n")
    proc = _run([LAUNCH, "-n", "1", "--no-prefix", str(prog)],
                env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr


# -- the launcher as mpiexec: stdin, SystemExit, output ------------------------------------

STDIN_PROGRAM = """\
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
sys.stdout.write("rank %d read %r\\n" % (comm.rank, sys.stdin.read()))
"""

EXIT_PROGRAM = """\
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 1:
    arg = sys.argv[1]
    raise SystemExit(int(arg) if arg.isdigit() else arg)
comm.Barrier()          # never completes: rank 1 left
"""

OUTPUT_PROGRAM = """\
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
for i in range(3):
    print("line", i, "of rank", comm.rank)
sys.stderr.write("to stderr\\n")
sys.stdout.write("progress 50%\\rprogress 100%")
sys.stdout.flush()
if comm.rank == 0 and sys.argv[1:] == ["slow"]:
    time.sleep(1.5)
sys.stdout.write(" done")
"""


@pytest.mark.usefixtures("no_shared_world")
def test_stdin_goes_to_rank_zero_only(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(STDIN_PROGRAM)
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "2", "--mpi4py", str(prog)],
                          input="first\nsecond", capture_output=True, text=True,
                          timeout=120, check=False, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 read 'first\\nsecond'",
                                                "rank 1 read ''"]
    none = subprocess.run([sys.executable, LAUNCH, "-n", "1", "--mpi4py", "--stdin", "none",
                           str(prog)], input="ignored", capture_output=True, text=True,
                          timeout=120, check=False, cwd=str(ROOT))
    assert none.stdout == "rank 0 read ''\n", none.stderr
    bad = _run([LAUNCH, "-n", "2", "--stdin", "2", str(prog)])
    assert bad.returncode == 2 and "--stdin must be a rank in 0..1 or 'none', got '2'" \
        in bad.stderr


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize(("arg", "code"), [("input file is missing", 1), ("7", 7)])
def test_system_exit_on_one_rank_ends_the_job_with_its_message(tmp_path, arg, code):
    prog = tmp_path / "prog.py"
    prog.write_text(EXIT_PROGRAM)
    # a 60 s report grace: without the exit note the launcher would wait it out
    proc = _run([LAUNCH, "-n", "3", "--mpi4py", "--timeout", "60", str(prog), arg],
                env={"PYCOMM_REPORT_GRACE": "60"}, timeout=50)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    if code == 1:
        assert lines[0] == arg          # Python's own words for SystemExit(msg), unprefixed
    assert re.search(rf"^pycomm.launch: rank 1 \(pid \d+\) exited with code {code} "
                     r"\(SystemExit\); stopping the other 2 ranks$", proc.stderr, re.M)
    assert "flight recorder" not in proc.stderr and proc.stdout == ""


SLOW_EXIT_PROGRAM = """\
import atexit, sys, time
atexit.register(time.sleep, 1.5)  # runs after MPI's finalize (LIFO): a slow teardown
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 1:
    sys.exit(7)
comm.Barrier()          # never completes: rank 1 left
"""


@pytest.mark.usefixtures("no_shared_world")
def test_a_deliberate_exit_with_a_slow_teardown_still_ends_the_others_silently(tmp_path):
    """Rank 1 says goodbye at finalize but its process ends 1.5 s later: its peers notice
    the departure after 0.25 s and, seeing its exit note, wait for the launcher to stop
    them instead of reporting it (they printed a PeerError and their flight recorders,
    where MPICH's ``mpiexec python -m mpi4py`` ends them silently with the code)."""
    prog = tmp_path / "prog.py"
    prog.write_text(SLOW_EXIT_PROGRAM)
    proc = _run([LAUNCH, "-n", "3", "--mpi4py", "--timeout", "60", str(prog)], timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert re.search(r"^pycomm.launch: rank 1 \(pid \d+\) exited with code 7 "
                     r"\(SystemExit\); stopping the other 2 ranks$", proc.stderr, re.M)
    for word in ("Traceback", "PeerError", "flight recorder"):
        assert word not in proc.stderr, proc.stderr


EARLY_RETURN_PROGRAM = """\
from mpi4py import MPI
import numpy as np
comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Recv(np.empty(1), source=1, tag=3)     # rank 1 returns without sending
"""


@pytest.mark.usefixtures("no_shared_world")
def test_a_peer_that_returned_while_waited_on_is_reported_after_the_stop_wait(tmp_path):
    """Rank 1 leaves on purpose with code 0 (its exit note is in the store), so the
    launcher does not end the job: rank 0 waits out its 5 s for a stop, then reports that
    rank 1 has left, well before its receive's timeout (60 s)."""
    from pycomm.waiting import _STOP_WAIT_S
    prog = tmp_path / "prog.py"
    prog.write_text(EARLY_RETURN_PROGRAM)
    t0 = time.monotonic()
    proc = _run([LAUNCH, "-n", "2", "--mpi4py", "--timeout", "60", str(prog)], timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert "rank 0: Recv from rank 1 (tag 3) on pycomm.COMM_WORLD: rank 1 has left" in \
        proc.stderr, proc.stderr
    assert _STOP_WAIT_S < took < _STOP_WAIT_S + 30, took


def _run_bytes(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, timeout=120,
                          check=False, cwd=str(ROOT), env={**os.environ, **(env or {})})


@pytest.mark.usefixtures("no_shared_world")
def test_unprefixed_output_is_the_program_s_own_bytes(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(OUTPUT_PROGRAM)
    alone = _run_bytes(["-m", "pycomm.MPI.alias", str(prog)], env={"PYTHONPATH": str(ROOT)})
    assert alone.returncode == 0, alone.stderr
    for flags in ([], ["--no-prefix"]):      # --mpi4py defaults to mpiexec's plain output
        one = _run_bytes([LAUNCH, "-n", "1", "--mpi4py", *flags, str(prog)])
        assert (one.returncode, one.stdout, one.stderr) == (0, alone.stdout, alone.stderr)
    three = _run_bytes([LAUNCH, "-n", "3", "--mpi4py", str(prog)])
    assert three.returncode == 0, three.stderr
    # whole lines are never torn; each rank's partial last line is passed on as written
    # (once a rank has been silent for PARTIAL_FLUSH_S, as mpiexec passes bytes on, so under
    # load another rank's line may follow it on the same terminal line)
    for r in range(3):
        for i in range(3):
            assert three.stdout.count(f"line {i} of rank {r}\n".encode()) == 1, three.stdout
    assert len(three.stdout) == len(alone.stdout) * 3, three.stdout
    assert three.stdout.count(b"progress 50%\rprogress 100%") == 3
    assert three.stdout.count(b" done") == 3 and three.stderr == b"to stderr\n" * 3
    tagged = _run([LAUNCH, "-n", "2", "--mpi4py", "--prefix", str(prog)])
    assert "[1] line 2 of rank 1\n" in tagged.stdout and "[0] to stderr\n" in tagged.stderr


@pytest.mark.usefixtures("no_shared_world")
def test_a_partial_line_is_shown_before_its_newline(tmp_path):
    # a prompt or a progress bar must not wait for the rank's next newline
    prog = tmp_path / "prog.py"
    prog.write_text(OUTPUT_PROGRAM)
    proc = subprocess.Popen([sys.executable, LAUNCH, "-n", "1", "--mpi4py", str(prog), "slow"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(ROOT))
    try:
        seen = b""
        while not seen.endswith(b"progress 100%"):
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, seen
            seen += chunk
        assert proc.poll() is None      # rank 0 is still asleep: the bar came on its own
        assert proc.wait(60) == 0 and proc.stdout.read() == b" done"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


# -- PYCOMM_MPI4PY=1 alone, under other launchers: the .pth hook ---------------------------

def _user_site(tmp_path) -> tuple[dict[str, str], Path]:
    """An environment whose user site directory is a fresh one under tmp_path."""
    env = {"PYTHONUSERBASE": str(tmp_path / "userbase"), "PYTHONPATH": str(ROOT)}
    out = _run(["-c", "import site; print(site.getusersitepackages())"], env=env)
    return env, Path(out.stdout.strip())


def test_pth_hook_resolves_mpi4py_only_when_asked(tmp_path):
    env, usersite = _user_site(tmp_path)
    assert Path(hook.install(str(usersite))) == usersite / hook.PTH_NAME
    real = usersite / "mpi4py"
    real.mkdir()
    (real / "__init__.py").write_text("__version__ = '9.9.9-real'\n")
    # -S: only this site directory's .pth files run (not a hook installed system-wide)
    code = (f"import site; site.addsitedir({str(usersite)!r}); import mpi4py; "
            "print(mpi4py.__version__)")
    for value, expect in [("", "9.9.9-real"), ("0", "9.9.9-real"), ("1", "4.0.0+pycomm"),
                          ("yes", "4.0.0+pycomm")]:
        proc = _run(["-S", "-c", code], env={**env, "PYCOMM_MPI4PY": value})
        assert proc.stdout.strip() == expect, (value, proc.stderr)
    assert hook.uninstall(str(usersite)) and not hook.uninstall(str(usersite))
    gone = _run(["-S", "-c", code], env={**env, "PYCOMM_MPI4PY": "1"})
    assert gone.stdout.strip() == "9.9.9-real", gone.stderr


@pytest.mark.usefixtures("no_shared_world")
def test_pycomm_mpi4py_alone_under_a_torchrun_style_launch(tmp_path):
    env, usersite = _user_site(tmp_path)
    hook.install(str(usersite))
    # A virtual environment (as in CI) never reads the user site directory, so a
    # sitecustomize on PYTHONPATH makes it a site directory for these two processes only,
    # standing in for the site-packages a wheel install puts the hook in.
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(usersite)!r})\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(boot), env["PYTHONPATH"]])}
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    with socket.socket() as s:      # the store listens on MASTER_PORT + 1 (rank 0 hosts it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1] - 1
    common = {**os.environ, **env, "PYCOMM_MPI4PY": "1", "WORLD_SIZE": "2",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYCOMM_TRANSPORT": "tcp",
              "PYCOMM_TIMEOUT": "60"}
    procs = [subprocess.Popen([sys.executable, str(prog), "torch"], cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**common, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert [out for out, _ in outs] == [f"rank {r} of 2 got torch sum 1 initialized True\n"
                                        for r in range(2)]
