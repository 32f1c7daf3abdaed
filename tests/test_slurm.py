"""SLURM's real ``srun`` (issue 16): one node and two emulated nodes.

A module fixture builds 2 emulated hosts (benchmarks/cluster/netns.py) and a throwaway
SLURM cluster on them (benchmarks/cluster/slurm.py: munged with its own key, slurmctld on
host 1, ``slurmd -N host<K>`` on each host; Debian 12's slurm-wlm 22.05). ``srun`` on host 1
then runs benchmarks/cluster/check_app.py as a real job step: slurmctld allocates,
each host's slurmd starts a slurmstepd, and pycomm reads SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE and, with no MASTER_ADDR, takes rank 0's store host
from SLURM_STEP_NODELIST's first host ('host[1-2]' -> host1). The tests skip, saying why,
where SLURM or munge is not installed (``apt-get install slurm-wlm munge``) or network
namespaces cannot be made; a SLURM that is installed but does not start fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.cluster.jobcheck import (APP, ROOT, assert_lines, clean_env, emulated_hosts,
                                         finish, started)
from benchmarks.cluster.slurm import Slurm, SlurmError, find_tools


@pytest.fixture(scope="module")
def slurm():
    try:
        find_tools()
    except SlurmError as exc:
        pytest.skip(str(exc))
    with emulated_hosts(2, "psl") as c:
        with started(lambda: Slurm(c), SlurmError,
                     "SLURM is installed but did not start here") as s:
            marked_dir = s.dir
            yield c, s
        assert not os.path.exists(marked_dir), f"{marked_dir} left behind"


def _srun(cs, *args: str, timeout: float = 60, **extra: str) -> tuple[int, str]:
    """``srun args... python check_app.py`` on host 1; (status, output)."""
    c, s = cs
    p = c.popen(1, [s.tools["srun"], *args, sys.executable, APP], cwd=str(ROOT),
                env=s.env(clean_env(**extra)), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
    return finish(p, timeout, "srun", s.logs())


def _check(cs, rc: int, out: str, hostmap: list[int]) -> None:
    c, s = cs
    assert rc == 0, f"{out}\n{s.logs()}"
    assert_lines(out, hostmap)
    left = s.leftovers()
    assert not left, f"job step processes left: {left}"
    for k in range(1, c.n + 1):
        shm = c.run(k, ["ls", "-A", "/dev/shm"]).stdout.split()
        assert not shm, f"host {k}: /dev/shm still holds {shm}"


def test_real_srun_on_one_node_forms_the_world(slurm):
    _check(slurm, *_srun(slurm, "-N", "1", "-n", "3"), [1, 1, 1])


@pytest.mark.parametrize("args,hostmap", [
    (("-N", "2", "--ntasks-per-node", "2"), [1, 1, 2, 2]),
    (("-N", "2", "-n", "3"), [1, 1, 2]),                     # SLURM_STEP_TASKS_PER_NODE=2,1
    (("-N", "2", "--ntasks-per-node", "2", "-m", "cyclic"), [1, 2, 1, 2])])
def test_real_srun_across_nodes_needs_no_master_addr(slurm, args, hostmap):
    _check(slurm, *_srun(slurm, *args), hostmap)


def test_real_srun_across_nodes_with_master_addr(slurm):
    rc, out = _srun(slurm, "-N", "2", "--ntasks-per-node", "2", MASTER_ADDR="host1",
                    MASTER_PORT=str(29500 + os.getpid() % 400))
    _check(slurm, rc, out, [1, 1, 2, 2])


def test_real_srun_where_each_node_resolves_its_own_name_to_loopback(slurm, tmp_path):
    # Debian's /etc/hosts: '127.0.1.1 host1' on host1. The store's host is host1 by name;
    # on host1 it resolves to loopback, and its ranks once listened there, unreachable
    # from host2 ("cannot reach rank 0 ... at 127.0.0.1").
    c, s = slurm
    for k in (1, 2):
        own = tmp_path / f"hosts{k}"
        own.write_text(f"127.0.0.1 localhost\n127.0.1.1 host{k}\n" + "".join(
            f"{c.addr(j)} host{j}\n" for j in (1, 2)))
        done = c.run(k, ["mount", "--bind", str(own), "/etc/hosts"])
        assert done.returncode == 0, done.stderr
    try:
        assert c.run(1, ["getent", "hosts", "host1"]).stdout.startswith("127.0.1.1")
        rc, out = _srun(slurm, "-N", "2", "--ntasks-per-node", "2")
    finally:
        for k in (1, 2):
            c.run(k, ["umount", "/etc/hosts"])
    _check(slurm, rc, out, [1, 1, 2, 2])
