"""Ranks forked from the fork server (pycomm/launch/forkserver.py) run their program as
``python`` runs it: each program here is run by CPython itself (``python prog.py``) and as
rank 0 of a two-rank ``launch.py`` job, and what a user sees (its stdout and stderr
without the launcher's own lines, the exit status) must be the same. Then what only a
job has: every rank its own environment, random state and stdin, the server as the
ranks' parent (and none with ``PYCOMM_FORK_SERVER=0``), and no process left after a
killed launcher."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pycomm.launch import forkclient, forkserver

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
pytestmark = pytest.mark.usefixtures("no_shared_world")

# name -> (program, arguments): python's own answers are the reference
PROGRAMS = {
    "plain": ("import sys\nprint('argv', sys.argv, 'main', __name__, 'file', __file__)\n",
              ["a", "b c"]),
    "exit code": ("import sys\nprint('out')\nsys.exit(3)\n", []),
    "exit message": ("import sys\nsys.exit('a message to stderr')\n", []),
    "exit None": ("raise SystemExit\n", []),
    "uncaught": ("def f():\n    raise ValueError('boom')\nprint('before', flush=True)\nf()\n",
                 []),
    "chained": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
                "    raise KeyError('k') from e\n", []),
    "threads and exit hooks": (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('hook', flush=True))\n"
        "def late():\n    time.sleep(0.2)\n    print('thread', flush=True)\n"
        "threading.Thread(target=late).start()\nprint('main ends')\nsys.exit(5)\n", []),
    "hook sees the exception": (
        "import atexit, sys\n"
        "atexit.register(lambda: print('last', type(getattr(sys, 'last_value', None)).__name__,"
        " flush=True))\nraise RuntimeError('x')\n", []),
    "path": ("import os, sys\nprint(sys.path[0] == os.path.dirname(os.path.realpath(__file__)),"
             " os.getcwd())\n", []),
}


def _per_rank(text: str, n: int = 2) -> list[str]:
    """Each rank's lines of a prefixed stream (``[r] line``), the launcher's own
    (``pycomm.launch: ...``) left out."""
    ranks = [""] * n
    for ln in text.splitlines(keepends=True):
        if not ln.startswith("pycomm.launch:"):
            head, _, rest = ln.partition("] ")
            ranks[int(head[1:])] += rest
    return ranks


# First line of every compared program: under launch.py, rank 1 leaves at once, so that
# rank 0's failure does not race with rank 1's (the launcher stops the others when one
# fails) and rank 0's output is whole; python runs the program with no PYCOMM_RANK.
ONLY_RANK_0 = "import os\nif os.environ.get('PYCOMM_RANK', '0') != '0': raise SystemExit\n"


def _compare_with_python(tmp_path, argv: list[str], env=None):
    """``python *argv`` and rank 0 of a two-rank ``launch.py`` job of it (forked: a job of
    one rank starts afresh): the same lines on each stream, the same exit status."""
    ref = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    got = subprocess.run([sys.executable, LAUNCH, "-n", "2", *argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == ref.returncode, (got.stderr, ref.stderr)
    assert _per_rank(got.stdout) == [ref.stdout, ""]
    assert _per_rank(got.stderr) == [ref.stderr, ""]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_forked_rank_runs_its_program_as_python_does(tmp_path, name):
    source, args = PROGRAMS[name]
    prog = tmp_path / "prog.py"
    prog.write_text(ONLY_RANK_0 + source)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}   # (as a rank's; keeps the order)
    _compare_with_python(tmp_path, ["prog.py", *args], env)


def test_module_mode_runs_as_python_m(tmp_path):
    (tmp_path / "modprog.py").write_text(
        ONLY_RANK_0 + "import sys\nprint('argv0', sys.argv[0], 'rest', sys.argv[1:], __name__)\n"
        "raise KeyError('k')\n")
    _compare_with_python(tmp_path, ["-m", "modprog", "x"])


JOB = """\
import sys
preloaded = "numpy" in sys.modules and "pycomm.comm" in sys.modules
import os, numpy as np, pycomm
comm = pycomm.init()
line = sys.stdin.readline().strip()
x = np.array([np.random.randint(1 << 30)], dtype=np.int64)
seeds = np.zeros(comm.size, dtype=np.int64)
comm.Allgather(x, seeds)
with open("/proc/self/cmdline", "rb") as fh:          # what ps shows
    cmdline = [w.decode() for w in fh.read().rstrip(b"\\0").split(b"\\0")]
print(f"RANK {comm.rank} env {os.environ['PYCOMM_RANK']} stdin {line!r} "
      f"distinct {len(set(seeds.tolist())) == comm.size} "
      f"parent {os.getppid()} launcher {os.environ['PYCOMM_LAUNCHER_PID']} "
      f"cmdline {cmdline == [sys.executable, *sys.argv]} preloaded {preloaded} "
      f"mpi4py-facade {'pycomm.MPI' in sys.modules}\\n", end="", flush=True)
"""


@pytest.mark.parametrize("forked", [True, False])
def test_each_rank_has_its_environment_random_state_and_stdin(tmp_path, forked):
    prog = tmp_path / "job.py"
    prog.write_text(JOB)
    env = {**os.environ, "PYCOMM_FORK_SERVER": "1" if forked else "0"}
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "3", "--no-prefix", str(prog)],
                          input="hello\n", env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(ln.split() for ln in proc.stdout.splitlines() if ln.startswith("RANK"))
    assert [ln[1] for ln in lines] == ["0", "1", "2"] == [ln[3] for ln in lines]
    # launch.py's stdin is rank 0's, the others read /dev/null (as under mpiexec)
    assert [ln[5] for ln in lines] == ["'hello'", "''", "''"]
    # numpy's global random state is each rank's own, as in separate interpreters
    assert all(ln[7] == "True" for ln in lines)
    parents = {ln[9] for ln in lines}
    launcher = {ln[11] for ln in lines}
    assert len(parents) == 1 and len(launcher) == 1
    assert (parents != launcher) == forked
    # ps shows each rank's own command line, forked or not
    assert all(ln[13] == "True" for ln in lines), lines
    # a forked rank finds numpy and pycomm imported; the mpi4py façade only for mpi4py
    # jobs (PYCOMM_MPI4PY)
    assert all(ln[15] == str(forked) and ln[17] == "False" for ln in lines), lines


def test_what_cannot_be_forked_is_started_afresh(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("")
    assert forkserver.servable([str(prog), "x"])
    assert forkserver.servable(["-m", "mod"]) and forkserver.servable(["-c", "pass"])
    assert not forkserver.servable(["-u", str(prog)])       # interpreter options
    assert not forkserver.servable([str(tmp_path)])         # a folder with __main__.py
    assert not forkserver.servable([str(tmp_path / "missing.py")])
    assert not forkserver.servable(["-m"]) and not forkserver.servable([])
    # RankGroup starts such a program with Popen: the launcher is the parent
    from pycomm.launch.launcher import RankGroup
    parent = tmp_path / "parent"
    prog.write_text(f"import os\nopen({str(parent)!r}, 'w').write(str(os.getppid()))\n")
    group = RankGroup(1, prefix=False)
    try:
        group.start(["-u", str(prog)])
        assert group.procs[0].wait(30) == 0
    finally:
        group.close()
    assert int(parent.read_text()) == os.getpid()


def test_a_killed_launcher_takes_the_server_and_its_ranks_along(tmp_path):
    prog = tmp_path / "sleeper.py"
    prog.write_text("import os, sys, time\n"
                    "print('PIDS', os.getpid(), os.getppid(), flush=True)\ntime.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, LAUNCH, "-n", "2", "--no-prefix", str(prog)],
                                stdout=subprocess.PIPE, text=True)
    pids = set()
    try:
        while len(pids) < 3:
            line = launcher.stdout.readline()
            assert line, "the job ended before its ranks printed"
            if line.startswith("PIDS"):
                pids.update(int(p) for p in line.split()[1:])
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(15)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], pids     # two ranks and their server


def test_a_rank_killed_by_a_signal_is_reported_so(tmp_path):
    prog = tmp_path / "kill.py"
    prog.write_text(textwrap.dedent("""\
        import os, signal, pycomm
        comm = pycomm.init()
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()
        """))
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "2", str(prog)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert "rank 1" in proc.stderr and "SIGKILL" in proc.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_a_process_reuses_its_server_for_jobs_of_one_environment(monkeypatch):
    """pycomm.spawn / Pool in one process (a notebook, a test session) pay for the server's
    imports once: jobs whose environments agree (but for pycomm's per-job variables)
    share a server; another environment gets its own."""
    import pycomm
    first = pycomm.spawn(os.getppid, 2)
    second = pycomm.spawn(os.getppid, 3)
    assert len(set(first + second)) == 1 and first[0] != os.getpid()
    monkeypatch.setenv("FORKSERVER_TEST_MARK", "1")
    third = pycomm.spawn(os.getppid, 2)
    assert len(set(third)) == 1 and third[0] not in first


def test_a_forked_child_of_the_process_gets_its_own_server(tmp_path):
    prog = tmp_path / "mp.py"
    prog.write_text(textwrap.dedent("""\
        import multiprocessing as mp, os, pycomm
        def child(q):
            q.put(pycomm.spawn(os.getppid, 2))
        if __name__ == "__main__":
            mine = pycomm.spawn(os.getppid, 2)
            q = mp.get_context("fork").Queue()
            p = mp.get_context("fork").Process(target=child, args=(q,))
            p.start()
            theirs = q.get(timeout=60)
            p.join(60)
            again = pycomm.spawn(os.getppid, 2)
            print(p.exitcode, mine == again, set(mine).isdisjoint(theirs), flush=True)
        """))
    proc = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["0", "True", "True"], proc.stdout + proc.stderr


def test_a_one_rank_job_starts_afresh(tmp_path):
    # (a new server's start-up would only delay a lone rank: launch.py -n 1 is python)
    prog = tmp_path / "one.py"
    prog.write_text("import os\nprint(os.getppid() == int(os.environ['PYCOMM_LAUNCHER_PID']))\n")
    proc = subprocess.run([sys.executable, LAUNCH, "--no-prefix", str(prog)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout == "True\n", proc.stderr


def test_a_killed_server_fails_its_jobs_ranks_and_the_next_job_gets_a_new_one(tmp_path):
    """SIGKILL the server under a running pool: its ranks die with it (their parent-death
    signal), the pool's next task fails naming a rank, and the next pool is forked from a
    new server."""
    import pycomm
    pool = pycomm.Pool(2, timeout=30)
    try:
        server = pool.run(os.getppid)[0]
        ranks = pool.pids
        os.kill(server, signal.SIGKILL)
        with pytest.raises(pycomm.CommError) as info:
            pool.run(time.sleep, 0.1)
        assert "rank" in str(info.value)
    finally:
        pool.close()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in ranks if _alive(p)]
    again = pycomm.spawn(os.getppid, 2)
    assert len(set(again)) == 1 and again[0] != server


def test_spawned_python_children_are_forked_from_the_roots_server():
    prog = ROOT / "tests" / "data" / "spawn" / "forked.py"
    proc = subprocess.run([sys.executable, LAUNCH, "--mpi4py", "--no-prefix", str(prog)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # one server for both spawns: not the root, not the launcher
    assert proc.stdout == "parents 1 root False launcher False\n", proc.stdout + proc.stderr


def test_the_least_recently_used_server_goes_past_the_limit(monkeypatch):
    """At most _MAX_SERVERS servers per process (each holds its imports' memory): one more
    environment closes the least recently used, whose process then exits."""
    monkeypatch.setattr(forkserver, "_MAX_SERVERS", 2)
    monkeypatch.setattr(forkserver, "_servers", {})     # (this test's own)
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    servers = [forkserver.shared_server({**base, "FORKSERVER_LRU": str(k)}) for k in range(2)]
    assert forkserver.shared_server({**base, "FORKSERVER_LRU": "0"}) is servers[0]  # used
    third = forkserver.shared_server({**base, "FORKSERVER_LRU": "2"})
    assert servers[1].proc.wait(10) == 0            # the least recently used: closed
    assert servers[0].alive() and third.alive()
    for server in (servers[0], third):
        server.close()


@pytest.mark.parametrize("mpi4py", [False, True], ids=["plain", "mpi4py"])
def test_the_launcher_starts_its_server_first_and_its_ranks_come_from_it(
        tmp_path, monkeypatch, mpi4py):
    """launch.py starts the server before its own imports (forkserver.prestart): the
    ranks' environments must find that server, not start a second one."""
    from pycomm.launch import cli
    monkeypatch.setattr(forkserver, "_servers", {})     # (this test's own)
    made = []

    class Counted(forkserver.ForkServer):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("wait", True))
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(forkserver, "ForkServer", Counted)
    prog = tmp_path / "ppid.py"
    out = tmp_path / "out"
    prog.write_text(f"import os\nopen({str(out)!r} + os.environ['PYCOMM_RANK'], 'w')"
                    ".write(str(os.getppid()))\n")
    try:
        code = cli.main(["-n", "2", *(["--mpi4py"] if mpi4py else []), str(prog)])
        assert code == 0
        assert made == [False], made        # one server, started without waiting
        (server,) = forkserver._servers.values()
        parents = {int((tmp_path / f"out{r}").read_text()) for r in range(2)}
        assert parents == {server.proc.pid}
    finally:
        forkserver._close_servers()


def test_a_prestarted_server_that_fails_is_not_used(tmp_path, monkeypatch):
    """A server whose start-up fails (here its msgpack import raises) is closed when the
    ranks ask for it, and the ranks start afresh (this process their parent)."""
    monkeypatch.setattr(forkserver, "_servers", {})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "msgpack.py").write_text("raise ImportError('broken on purpose')\n")
    prog = tmp_path / "p.py"
    prog.write_text("import os\nprint(os.getppid(), flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(broken)}
    forkserver.prestart([str(prog)], env)
    (server,) = forkserver._servers.values()
    forkserver.prestart(["-u", str(prog)], {**env, "OTHER": "1"})
    assert len(forkserver._servers) == 1    # (not servable: nothing started)
    procs = forkserver.start_ranks([str(prog)], [env, env], None, True,
                                   forkserver._preexec(os.getpid()))
    try:
        outs = [int(p.stdout.read()) for p in procs]
        assert [p.wait(30) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.stdout.close()
            p.stderr.close()
    assert outs == [os.getpid()] * 2
    assert server.proc.wait(10) != 0 and not forkserver._servers


def test_an_answer_that_comes_too_late_kills_its_rank_and_is_not_taken_for_the_next(
        tmp_path, monkeypatch):
    """A start whose answer comes after the wait (here: the server stopped past a wait of
    0.2 s) fails; the rank the server did start is killed when its answer comes, its exit
    is not kept, and the next start gets its own rank, not the late answer."""
    server = forkserver.ForkServer({**os.environ}, forkserver._preexec(os.getpid()))
    prog = tmp_path / "p.py"
    prog.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    try:
        monkeypatch.setattr(forkclient, "_START_S", 0.2)
        r, w = os.pipe()
        os.kill(server.proc.pid, signal.SIGSTOP)    # (the request waits in the socket)
        try:
            with pytest.raises(OSError, match="no answer"):
                server.start([str(prog)], dict(os.environ), None, None, (None, w),
                             (None, os.dup(2)))
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # The late rank holds the pipe's only write end (the start closed this one's), and
        # would sleep a minute: end of file within seconds says it was killed.
        deadline = time.monotonic() + 15
        with os.fdopen(r, "rb", 0) as out:
            while select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                if not out.read(4096):
                    break
            else:
                pytest.fail("the late rank is still running")
        monkeypatch.setattr(forkclient, "_START_S", 60.0)
        r, w = os.pipe()
        proc = server.start(["-c", "import os; print(os.getpid())"], dict(os.environ), None,
                            None, (r, w), (None, os.dup(2)))
        assert proc.wait(30) == 0 and int(proc.stdout.read()) == proc.pid   # its own
        proc.stdout.close()
        deadline = time.monotonic() + 5
        while server._orphans and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server._answered == 2 and not server._orphans and not server._early
        assert not server._abandoned and not server._answers
    finally:
        server.close()
