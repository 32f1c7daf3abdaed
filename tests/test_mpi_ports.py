"""Ports, names and Join on pycomm (pycomm.MPI.ports): two separate ``launch.py
--mpi4py`` jobs meet through a published port (tests/data/ports); errors of bad, closed
and unknown ports and names; ``Comm.Join`` over a socket. mpi4py's own test_dynproc
runs through ``python -m pycomm.MPI.conformance -m test_dynproc``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = str(ROOT / "launch.py")
DATA = ROOT / "tests" / "data" / "ports"


def _job(n: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, LAUNCH, "-n", str(n), "--mpi4py",
                             "--no-prefix", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_two_jobs_meet_through_a_published_port():
    # a 3-rank server job accepts a 2-rank client job: inter-communicator Allreduce,
    # Send/Recv and objects both ways, Disconnect; then the client's error cases
    service = f"pycomm-test-{uuid.uuid4().hex[:8]}"
    server = _job(3, str(DATA / "server.py"), service)
    client = _job(2, str(DATA / "client.py"), service)
    out_c, err_c = client.communicate(timeout=120)
    out_s, err_s = server.communicate(timeout=120)
    assert server.returncode == 0 and client.returncode == 0, err_s + err_c
    assert sorted(out_s.splitlines()) == ["published"] + [f"server rank {r} ok"
                                                          for r in range(3)], out_s + err_s
    assert sorted(out_c.splitlines()) == [f"client rank {r} ok" for r in range(2)], \
        out_c + err_c
    names = Path(f"/tmp/pycomm-names-{os.getuid()}")
    assert not (names / service).exists()


def test_join_over_a_socket():
    proc = _job(2, str(DATA / "join.py"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert sorted(out.splitlines()) == ["join rank 0 ok", "join rank 1 ok"], out + err


def test_a_published_name_is_withdrawn_when_its_process_exits():
    service = f"pycomm-test-{uuid.uuid4().hex[:8]}"
    code = ("import sys; from mpi4py import MPI; MPI.Publish_name(sys.argv[1], "
            "MPI.Open_port()); print(MPI.Lookup_name(sys.argv[1])[:12])")
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "1", "--mpi4py", "--no-prefix",
                           sys.executable, "-c", code, service], capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 0 and proc.stdout == "pycomm-port:\n", proc.stderr
    assert not Path(f"/tmp/pycomm-names-{os.getuid()}/{service}").exists()


def test_join_refuses_what_is_not_a_socket(tmp_path):
    from pycomm.MPI import ERR_ARG
    from pycomm.MPI import Exception as MPIException
    from pycomm.MPI.ports import join
    with open(tmp_path / "not-a-socket", "w") as f:
        with pytest.raises(MPIException, match="is not a socket") as info:
            join(f.fileno())
    assert info.value.Get_error_class() == ERR_ARG


def test_an_accept_that_times_out_leaves_the_port_usable():
    proc = subprocess.run([sys.executable, LAUNCH, "-n", "2", "--mpi4py", "--no-prefix",
                           str(DATA / "accept_timeout.py")], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT),
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        "rank 0: MPI_ERR_PORT: Accept: no client connected to the port within 2 s "
        "(PYCOMM_TIMEOUT)", "rank 1: second accept"], proc.stdout + proc.stderr
