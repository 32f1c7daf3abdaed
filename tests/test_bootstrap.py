"""World bootstrap from each launcher's environment (pycomm/bootstrap.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from pycomm.bootstrap import _first_slurm_host, detect
from pycomm.errors import ArgumentError

SCRIPT = textwrap.dedent("""
    import numpy as np, pycomm
    c = pycomm.COMM_WORLD
    x = np.array([c.rank + 1], np.int64)
    c.Allreduce(pycomm.IN_PLACE, x)
    print("OK", c.rank, c.size, int(x[0]), flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_launcher_is_a_world_of_one():
    je = detect({})
    assert (je.rank, je.size, je.launcher) == (0, 1, "none")


def test_pycomm_launcher_variables():
    je = detect({"PYCOMM_RANK": "2", "PYCOMM_WORLD_SIZE": "4", "PYCOMM_MASTER_ADDR": "h",
                 "PYCOMM_MASTER_PORT": "1234", "PYCOMM_JOB_TOKEN": "ab" * 32,
                 "PYCOMM_JOB_ID": "j1"})
    assert (je.rank, je.size, je.master_addr, je.master_port, je.launcher) == \
        (2, 4, "h", 1234, "pycomm")
    assert je.token == bytes.fromhex("ab" * 32) and not je.host_store


def test_torchrun_variables_use_master_port_plus_one_and_rank0_hosts():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}
    je = detect(env)
    assert (je.master_addr, je.master_port, je.launcher, je.host_store) == \
        ("10.1.2.3", 29501, "torchrun", True)
    assert not detect({**env, "RANK": "1"}).host_store


def test_slurm_variables_and_nodelist():
    je = detect({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "77",
                 "SLURM_STEP_NODELIST": "gpu[03-07,9],cpu1"})
    assert (je.rank, je.size, je.master_addr, je.launcher) == (3, 8, "gpu03", "slurm")
    assert 20000 <= je.master_port < 40000
    assert _first_slurm_host("node1") == "node1"


@pytest.mark.parametrize("env", [{"PMI_RANK": "1", "PMI_SIZE": "2"},
                                 {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}])
def test_mpiexec_variables(env):
    je = detect(env)
    assert (je.rank, je.size, je.launcher) == (1, 2, "mpiexec")


def test_out_of_range_rank_is_an_error():
    with pytest.raises(ArgumentError, match="rank 5 of 2"):
        detect({"RANK": "5", "WORLD_SIZE": "2", "MASTER_PORT": "1"})


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOMM_", "PMI_", "OMPI_", "SLURM_", "RANK", "WORLD_SIZE",
                                "MASTER_", "LOCAL_RANK", "HYDRA_", "MPI_"))}
    env["PYCOMM_TIMEOUT"] = "60"
    return env


def test_world_forms_under_torchrun_style_environment(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = _free_port() - 1
    procs = []
    for r in range(3):
        env = {**_clean_env(), "RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted(o.split()[1] for o in outs) == ["0", "1", "2"]
    assert all(o.split()[3] == "6" for o in outs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec on PATH")
def test_world_forms_under_mpiexec(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(script)],
                         env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("OK") == 2 and " 3\n" in out.stdout
