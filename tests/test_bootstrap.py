"""World bootstrap from each launcher's environment (pycomm/launch/bootstrap.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from pycomm.launch.jobenv import (_check_store_host, _first_slurm_host, _slurm_tasks_on_node,
                                  detect)
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


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("node[01-03]", "node01"), ("gpu[03-07,9],cpu1", "gpu03"),
    ("node[7,2-3]", "node7"), ("n[1-2]-ib", "n1-ib"), ("rack[2-3]-n[01-04]", "rack2-n01"),
    ("a,b[1-2]", "a"), ("10.77.0.[1-2]", "10.77.0.1")])
def test_first_host_of_a_slurm_hostlist(nodelist, first):
    assert _first_slurm_host(nodelist) == first


@pytest.mark.parametrize("spec,node,want", [("2(x3),1", 0, 2), ("2(x3),1", 2, 2),
                                            ("2(x3),1", 3, 1), ("4", 0, 4), ("1,3", 1, 3),
                                            ("2(x2)", 5, None), ("two", 0, None)])
def test_slurm_tasks_per_node(spec, node, want):
    assert _slurm_tasks_on_node(spec, node) == want


def test_local_rank_and_size_come_from_each_launcher():
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "3(x2),1",
             "SLURM_STEP_NODELIST": "node[01-03]", "SLURM_JOB_ID": "9"}
    # the step's own count wins over the allocation's
    assert (detect({**slurm, "SLURM_TASKS_PER_NODE": "4(x2)"}).local_size) == 1
    je = detect({**slurm, "SLURM_NODEID": "1", "SLURM_LOCALID": "2"})
    assert (je.local_rank, je.local_size, je.master_addr) == (2, 3, "node01")
    assert detect({**slurm, "SLURM_STEP_TASKS_PER_NODE": "", "SLURM_NTASKS_PER_NODE": "2"}
                  ).local_size == 2
    torch = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                    "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_PORT": "29500"})
    assert (torch.local_rank, torch.local_size) == (1, 2)
    hydra = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
                    "MPI_LOCALNRANKS": "2"})
    assert (hydra.local_rank, hydra.local_size, hydra.master_addr) == (1, 2, "127.0.0.1")
    ompi = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (ompi.local_rank, ompi.local_size) == (0, 4)


def test_multi_host_hydra_without_master_addr_says_what_to_set():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
           "PMI_FD": "9"}
    with pytest.raises(ArgumentError, match="more than one host.*-genv MASTER_ADDR"):
        detect(env)
    je = detect({**env, "MASTER_ADDR": "node01", "MASTER_PORT": "29500"})
    assert (je.master_addr, je.master_port, je.host_store) == ("node01", 29501, False)


def test_multi_host_open_mpi_shares_a_port_through_its_job_wide_variables():
    base = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(ArgumentError, match="-x MASTER_ADDR"):
        detect({**base, "OMPI_COMM_WORLD_RANK": "0"})
    # Open MPI 5: PMIx namespace, the same on every host (the PMIx server URI is not)
    five = [detect({**base, "OMPI_COMM_WORLD_RANK": str(r), "MASTER_ADDR": "node01",
                    "PMIX_NAMESPACE": "prterun-node01-4242@1",
                    "PMIX_SERVER_URI41": f"prterun-node01-4242@0.{r // 2};tcp4://10.0.0."
                                         f"{r // 2 + 1}:5000"}) for r in range(4)]
    assert len({(j.master_addr, j.master_port, j.token) for j in five}) == 1
    # Open MPI 4: mpirun's HNP URI names the host too
    four = detect({**base, "OMPI_COMM_WORLD_RANK": "0",
                   "OMPI_MCA_orte_hnp_uri": "77.0;tcp://10.0.0.1,172.17.0.1:4123"})
    assert (four.master_addr, four.addr_from) == ("10.0.0.1", "OMPI_MCA_orte_hnp_uri")


def test_rank0_on_a_host_other_than_the_derived_store_host_is_a_clear_error():
    # 203.0.113.9 (TEST-NET-3) is no address of this host; binding to it sends nothing
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "5",
           "SLURM_STEP_NODELIST": "203.0.113.[9-10]"}
    with pytest.raises(ArgumentError, match="203.0.113.9.*SLURM_STEP_NODELIST.*MASTER_ADDR"):
        _check_store_host(detect(env))
    _check_store_host(detect({**env, "SLURM_PROCID": "1"}))       # only rank 0 hosts it
    _check_store_host(detect({**env, "MASTER_ADDR": "203.0.113.9"}))  # given, not derived
    _check_store_host(detect({**env, "SLURM_STEP_NODELIST": "127.0.0.1"}))


def test_store_host_ranks_listen_where_the_other_hosts_reach_the_store(monkeypatch):
    # Debian's '127.0.1.1 node01' in node01's /etc/hosts: there the store's host (node01,
    # from SLURM's nodelist) resolves to loopback, elsewhere to 10.0.0.1 (its real address)
    from pycomm.launch import bootstrap
    monkeypatch.setattr(bootstrap, "_is_own_address", lambda ip: ip == "10.0.0.1")
    infos = [{"host": "a", "store_ip": "127.0.1.1"}, {"host": "a", "store_ip": "127.0.1.1"},
             {"host": "b", "store_ip": "10.0.0.1"}, {"host": "b", "store_ip": "10.0.0.1"}]
    assert bootstrap._address_others_reach(1, infos) == "10.0.0.1"
    assert bootstrap._address_others_reach(2, infos) is None     # host a's view: loopback
    assert bootstrap._address_others_reach(0, infos[:2]) is None     # one host
    elsewhere = [infos[0], {"host": "b", "store_ip": "10.0.0.7"}]    # not this host's
    assert bootstrap._address_others_reach(0, elsewhere) is None
    assert bootstrap._address_others_reach(0, [{"host": "a"}, {"host": "b"}]) is None
    assert bootstrap._store_ip("127.0.0.1") == "127.0.0.1" and bootstrap._store_ip(None) is None


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
