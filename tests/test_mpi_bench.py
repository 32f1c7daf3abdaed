"""``python -m mpi4py.bench`` on pycomm (pycomm/MPI/_alias/mpi4py/bench.py) under
``launch.py --mpi4py``, checked against what mpi4py 4.1.2 + MPICH printed for the same
commands on the development machine (host ``vm``, ``COLUMNS=1000`` so that argparse
wraps no usage line; recorded here as literals because CI has neither).

What a user sees is compared: the commands' output lines (exactly, or their format where
they carry measured times, whose values are checked for sense), the exit status, and the
options' error messages. Launcher lines (``pycomm.launch: ...``, which mpiexec does not
print) are left out of stderr before comparing. One difference is by design: ``futures``
with its default ``-e mpi`` needs ``mpi4py.futures`` (``MPI_Comm_spawn``), which pycomm
lacks, so it stops with a usage error where mpi4py spawns workers.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
HOST = socket.gethostname()
# argparse names the program after the interpreter's file name (mpi4py's "python")
PROG = f"{Path(sys.executable).name} -m mpi4py.bench"

pytestmark = pytest.mark.usefixtures("no_shared_world")

# -- mpi4py 4.1.2 + MPICH's output (python -m mpi4py.bench ..., host "vm") ----------------

MPICH_HELLOWORLD = {            # mpiexec -n N python -m mpi4py.bench helloworld
    2: "Hello, World! I am process 0 of 2 on vm.\n"
       "Hello, World! I am process 1 of 2 on vm.\n",
    12: "Hello, World! I am process  0 of 12 on vm.\n",     # the first of 12 lines
}
MPICH_RINGTEST = [              # ringtest; ringtest -n 1024 -l 10 -s 2 (2 ranks)
    "time for 1 loops = 0.00400335 seconds (3 processes, 1 bytes)\n",
    "time for 10 loops = 0.000102782 seconds (2 processes, 1024 bytes)\n",
]
MPICH_PINGPONG = """\
# MPI PingPong Test
# Size [B]  Bandwidth [MB/s] | Time Mean [s] \u00b1 StdDev [s]  Samples
         1              0.58 | 1.7385350e-06 \u00b1 1.0037e-07      100
         2              2.10 | 9.5417000e-07 \u00b1 1.5817e-08      100
"""                             # pingpong -n 64 -l 100 -s 10 (1 rank), first rows
MPICH_PINGPONG_NO_STATS = """\
# MPI PingPong Test
# Size [B]  Bandwidth [MB/s]
         1              0.17
         2              0.10
"""                             # pingpong -n 64 -l 100 --no-stats (3 ranks), first rows
# pingpong -m 16 -n 64 -l 20 -s 2 --large-size 16 --loop-large 5 --huge-size 32
# --loop-huge 3 (2 ranks): the samples column
MPICH_SCHEDULE = [(16, 20), (32, 5), (64, 3)]
MPICH_FUTURES = """\
# ThreadPoolExecutor - 2 workers, 50 tasks/worker
# Size [B]  Tasks/s | Time Mean [s] \u00b1 StdDev [s]  Samples
         1    39793 | 2.5129840e-03 \u00b1 2.7669e-03        3
"""                             # futures -e thread -w 2 -n 16 -l 3 (1 rank), first row
MPICH_FUTURES_NO_STATS = """\
# ProcessPoolExecutor - 2 workers, 50 tasks/worker
# Size [B]  Tasks/s
         1     1284
"""                             # futures -e process -w 2 -n 4 -l 2 --no-stats, first row

MAIN_USAGE = "usage: python -m mpi4py.bench [options] <command> [args]"
USAGE = {
    "helloworld": "usage: python -m mpi4py.bench helloworld [-h] [-q]",
    "ringtest": "usage: python -m mpi4py.bench ringtest [-h] [-q] [-n SIZE] [-s SKIP] "
                "[-l LOOP]",
    "pingpong": "usage: python -m mpi4py.bench pingpong [-h] [-q] [-m MIN_SIZE] "
                "[-n MAX_SIZE] [-s SKIP] [-l LOOP] [-a {numpy,cupy,numba,none}] [-p] "
                "[--protocol PROTOCOL] [-o] [--threshold THRESHOLD] "
                "[--skip-large SKIP_LARGE] [--loop-large LOOP_LARGE] "
                "[--large-size LARGE_SIZE] [--skip-huge SKIP_HUGE] "
                "[--loop-huge LOOP_HUGE] [--huge-size HUGE_SIZE] [--no-header] "
                "[--no-stats]",
    "futures": "usage: python -m mpi4py.bench futures [-h] [-q] "
               "[-e {mpi,process,thread,interpreter}] [-w WORKERS] [-t TASKS] "
               "[-m MIN_SIZE] [-n MAX_SIZE] [-a {numpy,array,bytes}] [-c CHUNKSIZE] "
               "[-b BACKOFF] [-o] [-s SKIP] [-l LOOP] [--skip-large SKIP_LARGE] "
               "[--loop-large LOOP_LARGE] [--large-size LARGE_SIZE] "
               "[--skip-huge SKIP_HUGE] [--loop-huge LOOP_HUGE] [--huge-size HUGE_SIZE] "
               "[--no-header] [--no-stats]",
}
# the options column of each -h (the help words are pycomm's own)
MPICH_HELP_OPTIONS = {
    None: ["-h, --help", "--threads", "--no-threads", "--thread-level LEVEL"],
    "ringtest": ["-h, --help", "-q, --quiet", "-n SIZE, --size SIZE",
                 "-s SKIP, --skip SKIP", "-l LOOP, --loop LOOP"],
    "pingpong": ["-h, --help", "-q, --quiet", "-m MIN_SIZE, --min-size MIN_SIZE",
                 "-n MAX_SIZE, --max-size MAX_SIZE", "-s SKIP, --skip SKIP",
                 "-l LOOP, --loop LOOP",
                 "-a {numpy,cupy,numba,none}, --array {numpy,cupy,numba,none}",
                 "-p, --pickle", "--protocol PROTOCOL", "-o, --outband",
                 "--threshold THRESHOLD", "--skip-large SKIP_LARGE",
                 "--loop-large LOOP_LARGE", "--large-size LARGE_SIZE",
                 "--skip-huge SKIP_HUGE", "--loop-huge LOOP_HUGE",
                 "--huge-size HUGE_SIZE", "--no-header", "--no-stats"],
}
# (args, stderr lines of one rank, how many ranks print them: "all", "one" (rank 0
# only), "some" (before MPI starts: each rank that gets that far; mpiexec shows all,
# launch.py stops the others when the first exits)); every one exits with status 2
MPICH_ERRORS = [
    (["foo"], [MAIN_USAGE, "python -m mpi4py.bench: error: unknown command 'foo'"], "one"),
    ([], [MAIN_USAGE, "python -m mpi4py.bench: error: the following arguments are "
                      "required: <command>, [args]"], "some"),
    (["--bogus", "helloworld"], [MAIN_USAGE, "python -m mpi4py.bench: error: "
                                             "unrecognized arguments: --bogus"], "some"),
    (["--thread-level", "bad", "helloworld"],
     [MAIN_USAGE, "python -m mpi4py.bench: error: argument --thread-level: invalid "
                  "choice: 'bad' (choose from 'single', 'funneled', 'serialized', "
                  "'multiple')"], "some"),
    (["helloworld", "--bogus"],
     [USAGE["helloworld"], "python -m mpi4py.bench helloworld: error: unrecognized "
                           "arguments: --bogus"], "all"),
    (["helloworld", "extra"],
     [USAGE["helloworld"], "python -m mpi4py.bench helloworld: error: unrecognized "
                           "arguments: extra"], "all"),
    (["ringtest", "-n", "abc"],
     [USAGE["ringtest"], "python -m mpi4py.bench ringtest: error: argument -n/--size: "
                         "invalid int value: 'abc'"], "all"),
    (["pingpong", "-a", "foo"],
     [USAGE["pingpong"], "python -m mpi4py.bench pingpong: error: argument -a/--array: "
                         "invalid choice: 'foo' (choose from 'numpy', 'cupy', 'numba', "
                         "'none')"], "all"),
    (["pingpong", "-l"],
     [USAGE["pingpong"], "python -m mpi4py.bench pingpong: error: argument -l/--loop: "
                         "expected one argument"], "all"),
    (["futures", "-e", "foo"],
     [USAGE["futures"], "python -m mpi4py.bench futures: error: argument -e/--executor: "
                        "invalid choice: 'foo' (choose from 'mpi', 'process', 'thread', "
                        "'interpreter')"], "all"),
]

E7, E4 = r"\d\.\d{7}e[-+]\d\d", r"\d\.\d{4}e[-+]\d\d"


def _ours(text: str) -> str:
    """mpi4py's recorded text with this interpreter's program name."""
    return text.replace("python -m mpi4py.bench", PROG)


def _launch(n: int, *args: str, via_run: bool = False, timeout: float = 60.0):
    """``launch.py --mpi4py -n N python -m mpi4py.bench ARGS`` (``-m mpi4py.run -rc
    threads=False -m mpi4py.bench`` with ``via_run``, as mpi4py's test_run.py runs it):
    ``(status, stdout, stderr without the launcher's lines, seconds)``."""
    module = ["-m", "mpi4py.run", "-rc", "threads=False", "-m", "mpi4py.bench"] \
        if via_run else ["-m", "mpi4py.bench"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, LAUNCH, "--mpi4py", "-n", str(n), *module,
                           *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=str(ROOT),
                          env={**os.environ, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"})
    seconds = time.monotonic() - start
    err = "".join(line for line in proc.stderr.splitlines(keepends=True)
                  if not line.startswith("pycomm.launch: "))
    return proc.returncode, proc.stdout, err, seconds


# Every job the tests below launch, as (n, args, via_run). Each is a short job of its own
# whose seconds go mostly to starting processes one after another (the launcher, then its
# ranks), so a module fixture runs them AT_ONCE at a time and each test takes its job's
# result (_bench); a job not listed here runs when its test asks.
PING = ("pingpong", "-n", "8", "-l", "10", "-s", "1")
PINGPONG_OPTIONS = [("--no-stats",), ("-p",), ("-o", "--threshold", "2"),
                    ("-p", "--protocol", "4"), ("-o", "-a", "none", "--protocol", "3")]
JOBS = [(n, ("helloworld",), False) for n in (1, 2, 3)] + [
    (2, ("--threads", "--thread-level", "single", "helloworld", "-q"), False)] + [
    (n, ("--no-threads", "helloworld"), True) for n in (1, 2)] + [
    (n, ("ringtest", "-n", "1024", "-l", "10", "-s", "2"), False) for n in (1, 2, 3)] + [
    (3, ("ringtest",), False), (2, ("ringtest", "-q", "-l", "5"), False)] + [
    (n, ("pingpong", "-n", "64", "-l", "20", "-s", "2"), False) for n in (1, 2, 3)] + [
    (3 if a == ("--no-stats",) else 2, PING + a, False) for a in PINGPONG_OPTIONS] + [
    (1, ("pingpong", "-m", "1024", "-n", "4096", "-l", "5", "-o", "--threshold", "2048"),
     False),
    (2, ("pingpong", "-m", "16", "-n", "64", "-l", "20", "-s", "2", "--large-size", "16",
         "--loop-large", "5", "--huge-size", "32", "--loop-huge", "3"), False),
    (2, ("pingpong", "-n", "4", "-l", "5", "--no-header"), False),
    (1, ("pingpong", "-n", "4", "-l", "5", "-q"), False),
    (2, ("pingpong", "-m", "4", "-n", "2"), False)] + [
    (n, ("futures", "-e", e, "-w", "2", "-n", "4", "-l", "2"), False)
    for n, e in [(1, "thread"), (2, "thread"), (1, "process")]] + [
    (1, ("futures", "-e", "thread", "-w", "2", "-n", "2", "-l", "2", "--no-stats", "-a",
         "array"), False),
    (2, ("futures",), False)] + [
    (2, tuple(args), False) for args, _, _ in MPICH_ERRORS] + [
    (2, ("foo",), True)] + [
    (1, ("-h",) if c is None else (c, "-h"), False) for c in (None, "ringtest", "pingpong")]
AT_ONCE = 3
_LAUNCHED: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _launched_at_once():
    """Every job of JOBS, AT_ONCE at a time: (n, args, via_run) -> a Future of its result."""
    from conftest import _CACHE
    _CACHE.close()              # no shared world beside them
    with ThreadPoolExecutor(AT_ONCE) as pool:
        _LAUNCHED.update({key: pool.submit(_launch, key[0], *key[1], via_run=key[2])
                          for key in JOBS})
    yield
    _LAUNCHED.clear()


def _bench(n: int, *args: str, via_run: bool = False):
    """The result of :func:`_launch` for this job: the module fixture's, or a run now."""
    done = _LAUNCHED.get((n, args, via_run))
    return done.result() if done is not None else _launch(n, *args, via_run=via_run)


def _hello(n: int, host: str = HOST) -> str:
    width = len(str(n - 1))
    return "".join(f"Hello, World! I am process {r:{width}d} of {n} on {host}.\n"
                   for r in range(n))


def test_recorded_helloworld_format():
    """The line format the tests expect is the one MPICH's run printed."""
    assert _hello(2, "vm") == MPICH_HELLOWORLD[2]
    assert _hello(12, "vm").startswith(MPICH_HELLOWORLD[12])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_helloworld(n):
    status, out, err, _ = _bench(n, "helloworld")
    assert (status, err) == (0, ""), err
    # each rank's output reaches the launcher through its own pipe: the ranks print in
    # turn, but lines of different ranks may arrive in either order (as under mpiexec)
    assert sorted(out.splitlines(True)) == sorted(_hello(n).splitlines(True))


def test_helloworld_quiet_and_thread_options():
    status, out, err, _ = _bench(2, "--threads", "--thread-level", "single",
                                 "helloworld", "-q")
    assert (status, out, err) == (0, "", "")


@pytest.mark.parametrize("n", [1, 2])
def test_helloworld_as_mpi4py_test_run_runs_it(n):
    """mpi4py's demo/test-run/test_run.py TestRunModule.testSuccess."""
    status, out, err, _ = _bench(n, "--no-threads", "helloworld", via_run=True)
    assert (status, err) == (0, ""), err
    assert sorted(out.splitlines(True)) == sorted(_hello(n).splitlines(True))


_RING = re.compile(r"time for (\d+) loops = (\S+) seconds \((\d+) processes, "
                   r"(-?\d+) bytes\)\n")


def _ring_line(out: str):
    m = _RING.fullmatch(out)
    assert m, out
    return int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4))


def test_recorded_ringtest_format():
    assert [_ring_line(line)[::2] for line in MPICH_RINGTEST] == [(1, 3), (10, 2)]
    assert all(f"{_ring_line(line)[1]:g}" in line for line in MPICH_RINGTEST)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ringtest(n):
    status, out, err, wall = _bench(n, "ringtest", "-n", "1024", "-l", "10", "-s", "2")
    assert (status, err) == (0, ""), err
    loops, seconds, procs, nbytes = _ring_line(out)
    assert (loops, procs, nbytes) == (10, n, 1024)
    assert f"{seconds:g}" in out                # printed with %g, as mpi4py
    assert 0 < seconds < wall                   # measured inside the job


def test_ringtest_defaults_and_quiet():
    status, out, err, _ = _bench(3, "ringtest")
    assert (status, err) == (0, ""), err
    loops, _, procs, nbytes = _ring_line(out)
    assert (loops, procs, nbytes) == (1, 3, 1)
    status, out, err, _ = _bench(2, "ringtest", "-q", "-l", "5")
    assert (status, out, err) == (0, "", "")


_ROW = re.compile(rf"(?P<size>[ \d]{{10}})(?P<rate>[ \d.]{{18}})"
                  rf"(?: \| (?P<mean>{E7}) \u00b1 (?P<std>{E4}) (?P<count>[ \d]{{8}}))?")
_FROW = re.compile(rf"(?P<size>[ \d]{{10}})(?P<rate>[ \d]{{9}})"
                   rf"(?: \| (?P<mean>{E7}) \u00b1 (?P<std>{E4}) (?P<count>[ \d]{{8}}))?")


def _table(out: str, header: list[str], row: re.Pattern, stats: bool = True):
    """The rows of a pingpong/futures table: [(size, rate, mean, count)]."""
    lines = out.splitlines()
    assert lines[:len(header)] == header, out
    rows = []
    for line in lines[len(header):]:
        m = row.fullmatch(line)
        assert m and (m.group("mean") is not None) == stats, line
        rows.append((int(m.group("size")), float(m.group("rate")),
                     float(m.group("mean")) if stats else None,
                     int(m.group("count")) if stats else None))
    return rows


def test_recorded_table_formats():
    ping = MPICH_PINGPONG.splitlines()
    assert _table(MPICH_PINGPONG, ping[:2], _ROW)[0] == (1, 0.58, 1.7385350e-06, 100)
    nostats = MPICH_PINGPONG_NO_STATS.splitlines()
    assert _table(MPICH_PINGPONG_NO_STATS, nostats[:2], _ROW, stats=False)[1][:2] == \
        (2, 0.10)
    fut = MPICH_FUTURES.splitlines()
    assert _table(MPICH_FUTURES, fut[:2], _FROW)[0] == (1, 39793, 2.5129840e-03, 3)
    fut = MPICH_FUTURES_NO_STATS.splitlines()
    assert _table(MPICH_FUTURES_NO_STATS, fut[:2], _FROW, stats=False)[0][:2] == (1, 1284)


def _check_bandwidth(rows):
    for size, rate, mean, _ in rows:            # MB/s from the measured mean
        assert mean > 0
        assert rate == pytest.approx(size / mean / 1e6, rel=1e-6, abs=0.0051)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_pingpong(n):
    status, out, err, wall = _bench(n, "pingpong", "-n", "64", "-l", "20", "-s", "2")
    assert (status, err) == (0, ""), err
    rows = _table(out, MPICH_PINGPONG.splitlines()[:2], _ROW)
    assert [(r[0], r[3]) for r in rows] == [(1 << k, 20) for k in range(7)]
    _check_bandwidth(rows)
    assert all(r[2] < wall for r in rows)


@pytest.mark.parametrize("args", PINGPONG_OPTIONS, ids=" ".join)
def test_pingpong_options(args):
    n = 3 if args == ("--no-stats",) else 2
    status, out, err, _ = _bench(n, *PING, *args)
    assert (status, err) == (0, ""), err
    stats = "--no-stats" not in args
    header = (MPICH_PINGPONG if stats else MPICH_PINGPONG_NO_STATS).splitlines()[:2]
    rows = _table(out, header, _ROW, stats)
    assert [r[0] for r in rows] == [1, 2, 4, 8]
    if stats:
        _check_bandwidth(rows)


def test_pingpong_one_rank_sends_to_itself_with_pickles():
    status, out, err, _ = _bench(1, "pingpong", "-m", "1024", "-n", "4096", "-l", "5",
                                 "-o", "--threshold", "2048")
    assert (status, err) == (0, ""), err
    rows = _table(out, MPICH_PINGPONG.splitlines()[:2], _ROW)
    assert [r[0] for r in rows] == [1024, 2048, 4096]


def test_pingpong_large_and_huge_sizes_take_fewer_samples():
    status, out, err, _ = _bench(2, "pingpong", "-m", "16", "-n", "64", "-l", "20",
                                 "-s", "2", "--large-size", "16", "--loop-large", "5",
                                 "--huge-size", "32", "--loop-huge", "3")
    assert (status, err) == (0, ""), err
    rows = _table(out, MPICH_PINGPONG.splitlines()[:2], _ROW)
    assert [(r[0], r[3]) for r in rows] == MPICH_SCHEDULE


def test_pingpong_quiet_header_and_empty_range():
    status, out, err, _ = _bench(2, "pingpong", "-n", "4", "-l", "5", "--no-header")
    assert (status, err) == (0, ""), err
    assert [r[0] for r in _table(out, [], _ROW)] == [1, 2, 4]
    status, out, err, _ = _bench(1, "pingpong", "-n", "4", "-l", "5", "-q")
    assert (status, out, err) == (0, "", "")
    status, out, err, _ = _bench(2, "pingpong", "-m", "4", "-n", "2")   # no sizes
    assert (status, out, err) == (0, "", "")


@pytest.mark.parametrize(("n", "executor"), [(1, "thread"), (2, "thread"),
                                             (1, "process")])
def test_futures(n, executor):
    status, out, err, wall = _bench(n, "futures", "-e", executor, "-w", "2", "-n", "4",
                                    "-l", "2")
    assert (status, err) == (0, ""), err
    name = {"thread": "ThreadPoolExecutor", "process": "ProcessPoolExecutor"}[executor]
    header = [f"# {name} - 2 workers, 50 tasks/worker",
              MPICH_FUTURES.splitlines()[1]]
    rows = _table(out, header, _FROW)
    assert [(r[0], r[3]) for r in rows] == [(1, 2), (2, 2), (4, 2)]
    for _, rate, mean, _ in rows:                   # tasks/s from the measured mean
        assert 0 < mean < wall
        assert rate == pytest.approx(100 / mean, rel=1e-6, abs=0.51)


def test_futures_no_stats():
    status, out, err, _ = _bench(1, "futures", "-e", "thread", "-w", "2", "-n", "2",
                                 "-l", "2", "--no-stats", "-a", "array")
    assert (status, err) == (0, ""), err
    header = ["# ThreadPoolExecutor - 2 workers, 50 tasks/worker",
              MPICH_FUTURES_NO_STATS.splitlines()[1]]
    assert [r[0] for r in _table(out, header, _FROW, stats=False)] == [1, 2]


def test_futures_mpi_executor_is_not_offered():
    """pycomm's one difference: MPIPoolExecutor cannot spawn its workers, so ``-e mpi``
    (the default) is a usage error, said once."""
    status, out, err, _ = _bench(2, "futures")
    assert (status, out) == (2, "")
    assert err == _ours(USAGE["futures"]) + "\n" + PROG + " futures: error: executor " \
        "'mpi': pycomm cannot spawn MPIPoolExecutor's workers (MPI_Comm_spawn); " \
        "use -e process or -e thread\n"


@pytest.mark.parametrize(("args", "lines", "who"), MPICH_ERRORS,
                         ids=[" ".join(a) or "no-command" for a, _, _ in MPICH_ERRORS])
def test_option_errors(args, lines, who):
    n = 2
    status, out, err, _ = _bench(n, *args)
    assert (status, out) == (2, ""), err
    got = Counter(err.splitlines())
    one = Counter(_ours(line) for line in lines)
    copies = got[_ours(lines[-1])]
    if who == "some":
        # a rank the launcher stops once the first has exited may be stopped between two
        # of its lines (or within one: its output then ends in an empty line): each rank
        # printed the first lines of one copy, in order
        del got[""]
        assert set(got) <= set(one), err
        counts = [got[_ours(line)] for line in lines]
        assert counts == sorted(counts, reverse=True) and 1 <= copies <= counts[0] <= n, err
        return
    assert got == Counter({k: v * copies for k, v in one.items()}), err
    assert copies == (n if who == "all" else 1)


def test_unknown_command_under_mpi4py_run_aborts_with_2():
    status, out, err, _ = _bench(2, "foo", via_run=True)
    assert (status, out) == (2, "")
    assert err.count(f"{PROG}: error: unknown command 'foo'\n") == 1
    assert "MPI_Abort(MPI_COMM_WORLD, 2)" in err


def _help_options(text: str) -> list[str]:
    return [_short_bare(m.group(1))
            for m in re.finditer(r"^  (-\S.*?)(?:  |$)", text, re.MULTILINE)]


def _short_bare(option: str) -> str:
    """An option's help line in Python 3.13's form, ``-n, --size SIZE`` (3.11 wrote
    ``-n SIZE, --size SIZE``, and the recorded MPICH help was made on 3.11)."""
    return re.sub(r"^(-\w) \S+, ", r"\1, ", option)


@pytest.mark.parametrize("command", [None, "ringtest", "pingpong"])
def test_help(command):
    args = ["-h"] if command is None else [command, "-h"]
    status, out, err, _ = _bench(1, *args)
    assert (status, err) == (0, ""), err
    usage = MAIN_USAGE if command is None else USAGE[command]
    assert out.splitlines()[0] == _ours(usage)
    assert _help_options(out) == [_short_bare(o) for o in MPICH_HELP_OPTIONS[command]]
