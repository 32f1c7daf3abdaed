"""A launched job of named checks, for tests of pycomm.MPI that need real ranks.

A test's program is its own imports (``MPI`` among them), then :data:`HARNESS`, then its
checks (functions decorated ``@check("name")``, run at once on every rank, each followed
by a Barrier), then :data:`REPORT`. Each rank records which checks ran and which failed
(with a short traceback) and prints one JSON line; :func:`run_checks` launches the program
and asserts that every rank ran every check and none failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")

HARNESS = r'''
import json, traceback

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
ran, failed = [], {}


def check(name):
    def run(fn):
        ran.append(name)
        try:
            fn()
        except Exception:
            failed[name] = traceback.format_exc(limit=4)
        world.Barrier()
    return run


def raises(exc_class, fn):
    try:
        fn()
    except exc_class as exc:
        return exc
    raise AssertionError(f"{fn} did not raise {exc_class.__name__}")
'''

REPORT = r'''
world.Barrier()
print(json.dumps({"rank": rank, "ran": ran, "failed": failed}), flush=True)
'''


def run_checks(tmp_path: Path, program: str, n: int, checks: list[str], *,
               mpi4py: bool = True, timeout: float = 90) -> None:
    """Run ``program`` on ``n`` ranks under ``launch.py`` (``--mpi4py``: as ``mpiexec``
    would run an mpi4py program) and assert that each rank ran exactly ``checks``, in
    order, and that none failed."""
    prog = tmp_path / "checks.py"
    prog.write_text(program)
    flags = ["--mpi4py"] if mpi4py else []
    proc = subprocess.run([sys.executable, LAUNCH, *flags, "-n", str(n), str(prog)],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=str(tmp_path), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line[line.index('{"rank"'):]) for line in proc.stdout.splitlines()
               if '{"rank"' in line]             # (each line may carry a "[r] " prefix)
    assert sorted(r["rank"] for r in reports) == list(range(n)), proc.stdout[-2000:]
    for report in reports:
        assert report["ran"] == checks
        assert report["failed"] == {}, report["failed"]
