"""``launch.py -n N python prog.py``: the program may start with the interpreter, as
mpiexec's does; the ranks run launch.py's own interpreter, so naming another is an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pycomm.launch import cli

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
PROGRAM = "import sys, pycomm; print('rank', pycomm.COMM_WORLD.rank, 'argv', sys.argv[1:])"


def _launch(*argv: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path + os.pathsep + env["PATH"]
    return subprocess.run([sys.executable, LAUNCH, "-n", "2", "--no-prefix", *argv],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_leading_interpreter_is_the_one_that_runs_the_ranks(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    (tmp_path / "python3").symlink_to(sys.executable)     # python3 on PATH: this one
    for first in (sys.executable, "python3"):
        out = _launch(first, str(prog), "x", path=str(tmp_path))
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.splitlines()) == ["rank 0 argv ['x']", "rank 1 argv ['x']"]


def test_another_interpreter_is_an_error_naming_both(tmp_path, capsys):
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho /usr/bin/true\n")       # says it is another program
    other.chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}{os.pathsep}{old}"
    try:
        with pytest.raises(SystemExit) as err:
            cli.main(["-n", "2", "python3.99", "prog.py"])
    finally:
        os.environ["PATH"] = old
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert sys.executable in message and "python3.99" in message


def test_the_interpreter_alone_is_an_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["-n", "2", sys.executable])
    assert "a script or -m module" in capsys.readouterr().err


def test_a_module_after_the_interpreter_runs(tmp_path):
    (tmp_path / "hello_mod.py").write_text(PROGRAM)
    out = subprocess.run([sys.executable, LAUNCH, "-n", "2", "--no-prefix", sys.executable,
                          "-m", "hello_mod", "y"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["rank 0 argv ['y']", "rank 1 argv ['y']"]
