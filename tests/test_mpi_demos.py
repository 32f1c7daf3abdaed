"""mpi4py's own demo programs (mpi4py 4.1.2's ``demo/``, vendored unmodified in
tests/data/mpi4py_demo/ with mpi4py's license) run on pycomm with ``launch.py --mpi4py``,
and give the results mpi4py + MPICH 5.0.2 gave on this machine (benchmarks/README.md,
"mpi4py's demo programs on pycomm").

One job per world size runs the demos that need no fresh interpreter
(``run_demos.py``: each demo as ``__main__`` on every rank, outputs gathered as JSON);
the ``init-fini`` programs test what ``import mpi4py.MPI`` does, so each gets its own job.
World sizes 2 and 3 (a non-power of two: nxtval-scalable's tree and the reductions' masks
take the uneven path).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
DEMO = ROOT / "tests" / "data" / "mpi4py_demo"
HOST = __import__("socket").gethostname()
PI = 3.141592653589793
# cpi with 100 intervals, as mpi4py + MPICH printed it (cpi-cco and cpi-rma alike): the
# sum's last bits depend on the ranks' shares and the order of the reduction
PI_100 = {2: 3.1416009869231241, 3: 3.1416009869231254}
DEMOS = ["helloworld", "sequential", "cpi-cco", "cpi-rma", "mandelbrot", "nxtval-onesided",
         "nxtval-scalable", "nxtval-mpi3", "reductions", "win-semantics"]


def _launch(n: int, *args: str, env=None, timeout: float = 120.0):
    return subprocess.run([sys.executable, LAUNCH, "--mpi4py", "-n", str(n), *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=str(DEMO), env={**os.environ, **(env or {})})


_RESULTS: dict[int, dict] = {}


def _results(n: int) -> dict:
    """The demos' outputs in one job of ``n`` ranks (run once per size)."""
    if n not in _RESULTS:
        proc = _launch(n, "run_demos.py", *DEMOS)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _RESULTS[n] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _RESULTS[n]


def _pi(text: str) -> tuple[float, float]:
    m = re.search(r"pi is approximately (\d\.\d{16}), error is (\d\.\d{16})", text)
    assert m, text
    return float(m.group(1)), float(m.group(2))


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("demo", DEMOS)
def test_demo_gives_mpichs_result(demo, n):
    ranks = _results(n)[demo]
    assert len(ranks) == n
    assert [r["err"] for r in ranks] == [None] * n, ranks     # the demos' own asserts
    outs = [r["out"] for r in ranks]
    if demo in ("helloworld", "sequential"):
        assert outs == [f"Hello, World! I am process {r} of {n} on {HOST}.\n"
                        for r in range(n)]
    elif demo in ("cpi-cco", "cpi-rma"):
        prompt = "Enter the number of intervals: (0 quits) "
        assert outs[1:] == [""] * (n - 1)
        assert outs[0].startswith(prompt) and outs[0].endswith("\n" + prompt)
        pi, error = _pi(outs[0])
        assert pi == pytest.approx(PI_100[n], abs=1e-15)
        assert error == pytest.approx(abs(PI_100[n] - PI), abs=1e-15)
    elif demo == "mandelbrot":
        assert ranks[0]["image"] == ranks[0]["sequential"]      # the gathered image
        lines = outs[0].splitlines()
        assert [ln.split(":")[0] for ln in lines] == ["wall clock time"] * n + \
            ["all tasks, mean", "all tasks, min", "all tasks, max", "all tasks, sum"]
        assert [int(m) for m in re.findall(r"\(task (\d+)\)", outs[0])] == list(range(n))
    elif demo == "win-semantics":
        assert outs[0].splitlines() == [
            "model separate",
            f"fence {[10 * r for r in range(n)] + [n * (n + 1) // 2]}",
            f"pscw {[0.0] + [r + 0.5 for r in range(1, n)]}",
            f"atomics ({3 * n - 1}, {3 * n}, 1)",
            f"shared {sorted(r * r for r in range(n))}"]
    else:       # nxtval-*, reductions: silent, their checks are asserts (err is None)
        assert outs == [""] * n


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("args", [
    ("test_0.py",),                     # rc.errors "exception": ERRORS_RETURN everywhere
    ("test_0.py", "errors=fatal"),      # ERRORS_ARE_FATAL
    ("test_0.py", "thread_level=single"),
    ("test_3.py",),                     # MPI4PY_RC_* and MPI4PY_PICKLE_* environment
    ("test_5.py",),                     # mpi4py.rc deleted before import mpi4py.MPI
    ("test_6.py",),                     # the warnings for unexpected rc values
], ids=lambda a: " ".join(a))
def test_init_fini_demo(args):
    proc = _launch(2, os.path.join("init-fini", args[0]), *args[1:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize(("args", "status"), [
    ((), 0),
    (("--rank", "1", "--exception", "uncaught in rank 1"), 1),
    (("--rank", "0", "--interrupt"), 130),
], ids=["success", "exception", "interrupt"])
def test_python_m_mpi4py_runs_the_test_run_demo(args, status):
    """``python -m mpi4py script`` (mpi4py's demo/test-run/run-script.py, as its
    test_run.py runs it): an uncaught exception or a KeyboardInterrupt on one rank
    aborts the job with mpi4py's status, saying MPI_Abort."""
    script = str(DEMO / "test-run" / "run-script.py")
    proc = _launch(3, "-m", "mpi4py", "-rc", "threads=False", script, *args)
    assert proc.returncode == status, proc.stderr[-3000:]
    if status == 0:
        assert proc.stdout == "Hello, World!\n" * 3 and proc.stderr == ""
    else:
        assert "application called MPI_Abort(MPI_COMM_WORLD, " in proc.stderr
        if args[-1].startswith("uncaught"):
            assert "RuntimeError: uncaught in rank 1" in proc.stderr


@pytest.mark.usefixtures("no_shared_world")
def test_spawning_demo_gives_mpichs_result(tmp_path):
    """mpi4py's demo/spawning: cpi-master.py spawns five cpi-worker processes (an
    executable script, as its makefile builds cpi-worker-py.exe), broadcasts the number
    of intervals over the inter-communicator and reduces pi back (root=MPI.ROOT)."""
    worker = tmp_path / "cpi-worker-py.exe"
    worker.write_text(f"#!{sys.executable}\n" +
                      (DEMO / "spawning" / "cpi-worker.py").read_text())
    worker.chmod(0o755)
    proc = _launch(1, os.path.join("spawning", "cpi-master.py"), str(worker))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # as mpi4py + MPICH 5.0.2 printed it (mpiexec -n 1 python cpi-master.py ./cpi-worker-py.exe)
    assert proc.stdout.splitlines() == [f"spawning/cpi-master.py -> {worker}",
                                        "pi: 3.1416009869231245, error: 0.0000083333333314"]
