"""Open MPI's real ``mpirun`` (issue 16): one host, and 2-3 emulated hosts.

Open MPI 4 (Debian 12: ``apt-get install openmpi-bin``) is called by its own path,
``/usr/bin/mpirun.openmpi`` (or ``PYCOMM_TEST_OMPI_MPIRUN``, or an ``mpirun`` on PATH whose
``--version`` says Open MPI), so that ``mpiexec``/``mpirun`` on PATH can stay MPICH's. The
multi-host jobs run ``mpirun -H host1:2,host2:2 --mca plm_rsh_agent STAND_IN ...`` on
emulated host 1 (benchmarks/cluster/netns.py): Open MPI's rsh launcher starts its ``orted``
daemon on the other hosts through the ssh stand-in, so mpirun, orted, their wiring and the
ranks are all real. pycomm reads OMPI_COMM_WORLD_* and, with no MASTER_ADDR, takes rank 0's
store host from OMPI_MCA_orte_hnp_uri (mpirun's address). The tests skip, saying why, where
no Open MPI is installed or network namespaces cannot be made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from benchmarks.cluster.jobcheck import (APP, ROOT, assert_lines, assert_none_with_env,
                                         clean_env, emulated_hosts, finish,
                                         hosts_left_clean, launcher, missing_lines)

_MARK = "PYCOMM_OMPI_TEST"


def _open_mpi() -> tuple[str, tuple[int, ...]]:
    """Open MPI's mpirun and its version, or skip saying what was looked for."""
    path, m = launcher(
        "open-mpi", [os.environ.get("PYCOMM_TEST_OMPI_MPIRUN"), "/usr/bin/mpirun.openmpi",
                     shutil.which("mpirun.openmpi"), shutil.which("mpirun")],
        r"\((?:Open MPI|OpenRTE)\) (\d+)\.(\d+)",
        "no Open MPI mpirun (Debian: apt-get install openmpi-bin; looked for "
        "$PYCOMM_TEST_OMPI_MPIRUN, /usr/bin/mpirun.openmpi and an mpirun whose "
        "--version names Open MPI)")
    return path, (int(m.group(1)), int(m.group(2)))


def _env(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _assert_none_left(mark: str) -> None:
    assert_none_with_env(f"{_MARK}={mark}", "processes of the job left")


JOB = """
import os, numpy as np, pycomm
from pycomm.launch.jobenv import detect
c = pycomm.COMM_WORLD
x = np.arange(5, dtype=np.float64) * (c.rank + 1)
c.Allreduce(pycomm.IN_PLACE, x)
ok = np.array_equal(x, np.arange(5, dtype=np.float64) * (c.size * (c.size + 1) // 2))
lay = c.host_layout
print(f"RANK {c.rank} {c.size} {ok} {lay.nhosts} {lay.local_rank}/{lay.local_size} "
      f"{c.transport_name} {detect().job_id}", flush=True)
"""


def test_real_open_mpi_on_one_host_forms_the_world(tmp_path):
    mpirun, _ = _open_mpi()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    mark = uuid.uuid4().hex
    done = subprocess.run([mpirun, "--oversubscribe", "-n", "3", sys.executable, str(script)],
                          env=_env(**{_MARK: mark}), capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))
    _assert_none_left(mark)
    _assert_one_world(done)


def _assert_one_world(done: subprocess.CompletedProcess) -> None:
    """JOB's lines of 3 ranks on one host: one world (not three of one) over shared memory
    whose Allreduce matched, and none of its /dev/shm segments left."""
    assert done.returncode == 0, done.stdout + done.stderr
    # mpirun forwards each write as it comes: ranks' lines may run into each other
    got = sorted(re.findall(r"RANK (\d+) (\d+) (True|False) (\d+) (\d+/\d+) ([a-z+]+) "
                            r"(m\d+)", done.stdout))
    assert [list(g[:6]) for g in got] == \
        [[str(r), "3", "True", "1", f"{r}/3", "shm"] for r in range(3)], done.stdout
    job = {g[6] for g in got}
    assert len(job) == 1, got               # one world, not three worlds of one
    prefix = f"pycomm-{job.pop()}-"
    left = [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]
    assert not left, f"/dev/shm still holds {left}"


# -- 2 and 3 emulated hosts ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ompi_cluster():
    mpirun, version = _open_mpi()
    with emulated_hosts(3, "pom") as c:
        yield c, mpirun, version, c.ssh_stand_in()


def _mpirun(oc, hosts: str, n: int, *args: str, timeout: float = 60) -> tuple[int, str]:
    """``mpirun -H hosts -n n args... python check_app.py`` on host 1; (status, output)."""
    c, mpirun, _, ssh = oc
    argv = [mpirun, "--mca", "plm_rsh_agent", ssh, "-H", hosts, "-n", str(n), *args,
            sys.executable, APP]
    p = c.popen(1, argv, cwd=str(ROOT), env=_env(), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
    return finish(p, timeout, "mpirun")


def _assert_nothing_left(oc) -> None:
    """No process but the host's holder in any emulated host (orted, ranks), no /dev/shm
    segment, no Open MPI session directory of an emulated host."""
    c = oc[0]
    hosts_left_clean(c)
    for k in range(1, c.n + 1):
        sessions = [f for f in os.listdir("/tmp") if f.startswith(f"ompi.host{k}.")]
        assert not sessions, f"host {k}: Open MPI left /tmp/{sessions}"


@pytest.mark.parametrize("hosts,n,args,hostmap", [
    ("host1:2,host2:2", 4, (), [1, 1, 2, 2]),
    ("host1:2,host2:2", 4, ("--map-by", "node"), [1, 2, 1, 2]),       # cyclic placement
    ("host1:2,host2:2,host3:1", 5, (), [1, 1, 2, 2, 3])])             # a rank alone: tcp
def test_real_open_mpi_across_hosts_needs_no_master_addr(ompi_cluster, hosts, n, args,
                                                         hostmap):
    if ompi_cluster[2] >= (5, 0):
        pytest.skip("Open MPI 5 has no OMPI_MCA_orte_hnp_uri: its rendezvous goes through "
                    "PMIx, tested in tests/test_ompi5_hosts.py")
    rc, out = _mpirun(ompi_cluster, hosts, n, *args)
    assert rc == 0, out
    assert_lines(out, hostmap)
    _assert_nothing_left(ompi_cluster)


def test_real_open_mpi_across_hosts_with_master_addr(ompi_cluster):
    # MASTER_ADDR alone: the port still comes from the HNP URI (Open MPI 4); with
    # MASTER_PORT too: the last test
    rc, out = _mpirun(ompi_cluster, "host1:2,host2:2", 4, "-x", "MASTER_ADDR=host1")
    assert rc == 0, out
    assert_lines(out, [1, 1, 2, 2])
    _assert_nothing_left(ompi_cluster)


def test_real_open_mpi_from_a_host_without_ranks_says_to_set_master_addr(ompi_cluster):
    # mpirun on host 1 (a login node), ranks on hosts 2 and 3: mpirun's host is no store;
    # rank 0 says so at once and mpirun stops the others. MASTER_ADDR then works.
    if ompi_cluster[2] >= (5, 0):
        pytest.skip("Open MPI 5 has no OMPI_MCA_orte_hnp_uri: its rendezvous goes through "
                    "PMIx, tested in tests/test_ompi5_hosts.py")
    t0 = time.monotonic()
    rc, out = _mpirun(ompi_cluster, "host2:2,host3:2", 4)
    took = time.monotonic() - t0
    assert rc != 0, out
    assert took < 25, f"the ranks waited {took:.0f} s instead of stopping:\n{out}"
    assert re.search(r"rank 0 hosts the rendezvous store at 10\.77\.0\.1, the host "
                     r"OMPI_MCA_orte_hnp_uri names, but that is not an address of this host "
                     r"\(host2\).*set MASTER_ADDR to rank 0's host", out), out
    _assert_nothing_left(ompi_cluster)
    rc, out = _mpirun(ompi_cluster, "host2:2,host3:2", 4, "-x", "MASTER_ADDR=host2", "-x",
                      f"MASTER_PORT={29500 + os.getpid() % 400}")
    assert rc == 0, out
    assert_lines(out, [2, 2, 3, 3])
    _assert_nothing_left(ompi_cluster)


def test_expected_lines_of_the_checks():
    # the helper the real runs are judged by (runs everywhere)
    from benchmarks.cluster.jobcheck import expected_line
    assert expected_line(2, [1, 2, 1, 2]) == (
        "OK rank 2/4 host host1 hosts host1,host2,host1,host2 transport shm+tcp layout "
        "0,2|1,3 names host1,host2 local 1/2")
    assert expected_line(4, [1, 1, 2, 2, 3]).endswith("transport tcp layout 0,1|2,3|4 "
                                                      "names host1,host2,host3 local 0/1")
    assert expected_line(0, [1, 1, 1]).split(" transport ")[1].startswith("shm layout")
    out = expected_line(0, [1, 1]) + expected_line(1, [1, 1]) + "\n"
    assert missing_lines(out, [1, 1]) == [] and missing_lines(out, [1, 2]) != []
