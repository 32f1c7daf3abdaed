"""The open-files limit (pycomm/launch/rlimits.py): a launcher lifts its soft limit to the
hard one before it opens anything, so its ranks inherit it; where the hard limit is too
low for the job, the launcher says so and stops what it started."""

from __future__ import annotations

import errno
import resource
import subprocess
import sys
from pathlib import Path

from pycomm.launch.rlimits import out_of_files, raise_open_files_limit

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch.py")

PROGRAM = """
import resource, sys, pycomm
c = pycomm.init()
c.Barrier()
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], sys.argv[1], flush=True)
"""


def _limited(soft: int, hard: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return preexec


def _launch(tmp_path, n: int, soft: int, hard: int, marker: str):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    return subprocess.run([sys.executable, LAUNCH, "-n", str(n), str(prog), marker],
                          capture_output=True, text=True, timeout=120, check=False,
                          preexec_fn=_limited(soft, hard))


def test_a_low_soft_limit_is_lifted_for_the_launcher_and_its_ranks(tmp_path):
    # 32 files: the launcher's own sockets and two pipes per rank run out at 12 ranks
    # unless it lifts the limit (2edd054 failed here with OSError EMFILE)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = _launch(tmp_path, 12, 32, hard, "lifted")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "soft" in ln]
    assert len(lines) == 12, out.stdout
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert all(ln.split()[-2] == str(want) and ln.endswith("lifted") for ln in lines), lines


def test_a_hard_limit_too_low_is_a_clear_error_and_nothing_is_left(tmp_path):
    out = _launch(tmp_path, 40, 48, 48, "nothing-left-marker")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "pycomm.launch: out of file descriptors while starting 40 ranks (Too many open " \
        "files): this process may have 48 open" in out.stderr, out.stderr
    assert "ulimit -Hn" in out.stderr and "Traceback" not in out.stderr, out.stderr
    left = subprocess.run(["pgrep", "-f", "nothing-left-marker"], capture_output=True,
                          text=True, check=False).stdout.split()
    assert left == [], left


def test_raise_and_classify_in_this_process():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
            assert raise_open_files_limit() == hard
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        assert raise_open_files_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out_of_files(OSError(errno.EMFILE, "Too many open files"))
    assert out_of_files(OSError(errno.ENFILE, "Too many open files in system"))
    assert not out_of_files(OSError(errno.ENOSPC, "No space left on device"))
    assert not out_of_files(ValueError("EMFILE"))
