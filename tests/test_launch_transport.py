"""``launch.py``'s transport: ``--transport`` when given, else the environment's
``PYCOMM_TRANSPORT`` (as the ranks read every other ``PYCOMM_`` variable), else auto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LAUNCH = str(Path(__file__).resolve().parents[1] / "launch.py")


def test_transport_is_the_environment_s_unless_given(tmp_path):
    # an exported PYCOMM_TRANSPORT reaches the ranks (the default once replaced it with auto)
    script = tmp_path / "which.py"
    script.write_text("import pycomm\nprint(pycomm.COMM_WORLD.transport_name)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYCOMM_TRANSPORT"}
    for value, flags, want in (("tcp", [], "tcp"), ("tcp", ["--transport", "shm"], "shm"),
                               (None, [], "shm"), ("carrier-pigeon", [], None)):
        proc = subprocess.run([sys.executable, LAUNCH, "-n", "2", *flags, str(script)],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**env, **({"PYCOMM_TRANSPORT": value} if value else {})})
        if want is None:
            assert proc.returncode == 2 and "PYCOMM_TRANSPORT must be one of" in proc.stderr
        else:
            assert proc.returncode == 0, proc.stderr
            assert sorted(proc.stdout.split()) == ["[0]", "[1]", want, want], proc.stdout
