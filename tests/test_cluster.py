"""Many hosts (issue 16): zero-configuration addresses, port ranges, and jobs across
emulated hosts (benchmarks/cluster/netns.py: network namespaces joined by a bridge, each
with its own hostname and /dev/shm).

Jobs started the way srun, a multi-host Hydra mpiexec and Open MPI's mpirun start them
are emulated: no slurmd, Hydra proxy or ssh runs between the emulated hosts here, so each
rank gets exactly the variables the engine would give it (SLURM_*, PMI_*/MPI_LOCAL*,
OMPI_COMM_WORLD_*) and nothing else. A real multi-host Hydra mpiexec across the emulated
hosts is tested in tests/test_hydra_hosts.py; a real srun is not tested.

The cluster tests need root and iproute2; where namespaces cannot be made they FAIL with
the reason (a silent skip would hide that the multi-host paths went untested).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import pycomm
from benchmarks.cluster import hier_check
from benchmarks.cluster.netns import Cluster, ClusterError, check_support
from fakecomm import on_fake_hosts  # tests/ is on sys.path under pytest
from pycomm import config, ops
from pycomm.collectives import hierarchical as hier
from pycomm.launch.bootstrap import host_layout
from pycomm.launch.jobenv import _hnp_host, detect, listen_address
from pycomm.errors import CommError
from pycomm.launch.nodes import global_rank
from transports import TransportError
from transports.tcp import bind_listener

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "benchmarks" / "cluster" / "check_app.py")
HIER_APP = str(ROOT / "benchmarks" / "cluster" / "hier_check.py")
cloudpickle.register_pickle_by_value(hier_check)   # shipped to single-host pool ranks


# -- address choice and port ranges (no namespaces) -----------------------------------------
@pytest.mark.parametrize("master", [None, "127.0.0.1", "localhost", "127.0.1.1"])
def test_listen_address_is_loopback_for_a_single_host_job(master):
    assert listen_address(master, 29500) == "127.0.0.1"


def test_listen_address_names_an_unresolvable_store_host():
    with pytest.raises(CommError, match="no-such-host.invalid"):
        listen_address("no-such-host.invalid", 29500)


@pytest.mark.parametrize("text,want", [("29500-29599", (29500, 29599)), ("40000", (40000, 40000)),
                                       (" 1-65535 ", (1, 65535))])
def test_port_range_parses(text, want):
    assert config.get("PYCOMM_PORT_RANGE", {"PYCOMM_PORT_RANGE": text}) == want


@pytest.mark.parametrize("text", ["a-b", "200-100", "0-10", "10-70000", "1-2-3"])
def test_port_range_rejects_nonsense_naming_the_variable(text):
    with pytest.raises(ValueError, match="PYCOMM_PORT_RANGE"):
        config.get("PYCOMM_PORT_RANGE", {"PYCOMM_PORT_RANGE": text})


def test_bind_listener_takes_a_port_of_the_range_and_reports_a_full_one():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = bind_listener("127.0.0.1", (port, port))
    try:
        assert first.getsockname()[1] == port
        first.listen(1)
        with pytest.raises(TransportError, match=f"{port}-{port}"):
            bind_listener("127.0.0.1", (port, port))
    finally:
        first.close()


@pytest.mark.parametrize("nnodes,nproc", [(1, 1), (2, 2), (3, 2), (2, 3), (4, 1)])
@pytest.mark.parametrize("placement", ["block", "cyclic"])
def test_placements_cover_the_world_once(nnodes, nproc, placement):
    ranks = [global_rank(k, i, nnodes, nproc, placement)
             for k in range(nnodes) for i in range(nproc)]
    assert sorted(ranks) == list(range(nnodes * nproc))
    if placement == "block":
        assert [global_rank(1 % nnodes, i, nnodes, nproc, placement) for i in range(nproc)] == \
            [(1 % nnodes) * nproc + i for i in range(nproc)]
    else:
        assert [global_rank(0, i, nnodes, nproc, placement) for i in range(nproc)] == \
            [i * nnodes for i in range(nproc)]


def test_host_layout_groups_ranks_by_host_in_rank_order():
    infos = [{"host": f"h{r % 2}/boot/shm", "hostname": f"node{r % 2}"} for r in range(5)]
    lay = host_layout(infos, 3)
    assert lay.hosts == ((0, 2, 4), (1, 3)) and lay.names == ("node0", "node1")
    assert (lay.host, lay.local_rank, lay.local_size, lay.nhosts) == (1, 1, 2, 2)
    solo = host_layout([{"host": "x/b/s"}], 0)
    assert solo.hosts == ((0,),) and solo.names == ("x",) and solo.local_size == 1


def test_layout_restrict_renumbers_the_hosts_of_a_sub_communicator():
    # 2 hosts x 3 ranks, cyclic: host 0 holds 0, 2, 4
    infos = [{"host": f"h{r % 2}/boot/shm", "hostname": f"node{r % 2}"} for r in range(6)]
    world = host_layout(infos, 0)
    # Split(key) order 5, 1, 0, 4 (world ranks): new rank 0 is on node1
    sub = world.restrict([5, 1, 0, 4], 2)
    assert sub.hosts == ((0, 1), (2, 3)) and sub.names == ("node1", "node0")
    assert (sub.host, sub.local_rank, sub.local_size, sub.nhosts) == (1, 0, 2, 2)
    one = world.restrict([3, 1], 1)
    assert one.hosts == ((0, 1),) and one.names == ("node1",) and one.local_rank == 1
    with pytest.raises(ValueError, match="rank 9"):
        world.restrict([0, 9], 0)


def test_open_mpi_store_host_comes_from_the_hnp_uri():
    assert _hnp_host("123.0;tcp://10.0.0.5,172.17.0.1:4123") == "10.0.0.5"
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_PORT": "29500",
           "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.5:4123"}
    assert detect(env).master_addr == "10.0.0.5"


# -- jobs across emulated hosts ---------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    try:
        check_support()
        with Cluster(3, prefix=f"pct{os.getpid() % 10000}") as c:
            yield c
    except ClusterError as exc:
        pytest.fail(f"cannot build the emulated cluster: {exc}")


def _rank_env(c: Cluster, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOMM_", "MASTER_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYCOMM_TIMEOUT": "20", **extra})
    return env


def _wait_all(procs, timeout: float) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=timeout)
        out.append((p.returncode, text))
    return out


def test_torchrun_style_2x2_job_needs_no_pycomm_host(cluster):
    port = str(29400 + os.getpid() % 500)
    procs = [cluster.popen(1 + r // 2, [sys.executable, APP], cwd=str(ROOT),
                           env=_rank_env(cluster, RANK=str(r), WORLD_SIZE="4",
                                         LOCAL_RANK=str(r % 2), MASTER_ADDR=cluster.addr(1),
                                         MASTER_PORT=port),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    results = _wait_all(procs, 60)
    for r, (rc, text) in enumerate(results):
        assert rc == 0, f"rank {r}: {text}"
        assert f"OK rank {r}/4 host host{1 + r // 2} hosts host1,host1,host2,host2" in text
        assert "transport shm+tcp" in text        # shm inside a host, tcp across


def test_a_peer_listening_on_loopback_is_a_comm_error_naming_it_on_every_rank(cluster):
    port = str(29900 + os.getpid() % 90)
    t0 = time.monotonic()
    procs = [cluster.popen(1 + r // 2, [sys.executable, APP], cwd=str(ROOT),
                           env=_rank_env(cluster, RANK=str(r), WORLD_SIZE="4",
                                         MASTER_ADDR=cluster.addr(1), MASTER_PORT=port,
                                         PYCOMM_HOST="127.0.0.1"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    results = _wait_all(procs, 60)
    assert time.monotonic() - t0 < 10, "the ranks waited for connections until the timeout"
    for r, (rc, text) in enumerate(results):
        assert rc != 0 and "pycomm.errors.CommError" in text, f"rank {r}: {text}"
        assert "ConnectionRefusedError" not in text.splitlines()[-1]
        if r >= 2:          # the ranks that dialed name the peer, its host and address
            assert "cannot reach rank 0 on host host1 at 127.0.0.1:" in text, text
        else:               # the waiting ones hear it through the store, or lose the store
            # with rank 0 (it hosts it under torchrun): either way they stop at once.
            assert "ranks [2, 3] cannot connect: " in text, f"rank {r}: {text}"


def test_listen_address_is_the_interface_routing_to_the_store(cluster):
    code = ("from pycomm.launch.jobenv import listen_address; "
            f"print(listen_address({cluster.addr(1)!r}, 29500), listen_address('127.0.0.1'))")
    for k in (1, 2):        # host 1 holds the store: its own address routes to itself
        done = cluster.run(k, [sys.executable, "-c", code], cwd=str(ROOT), env=_rank_env(cluster))
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [cluster.addr(k), "127.0.0.1"]


# -- ranks started the way srun and a multi-host mpiexec start them ----------------------------
# Real SLURM and multi-host Hydra / Open MPI cannot run here (no slurmd, no ssh between the
# emulated hosts): each rank gets exactly the variables the engine gives a task on that
# host, and nothing of pycomm's or torchrun's; that emulation is what these tests check.
_ENGINE_PREFIXES = ("PYCOMM_", "MASTER_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "MPI_", "HYDI_",
                    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _engine_job(c: Cluster, hostmap: list[int], env_of, timeout: float = 60):
    """Start rank r of ``len(hostmap)`` on host ``hostmap[r]`` with ``env_of(r)`` as its only
    launcher variables; return [(exit code, output)] in rank order."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_ENGINE_PREFIXES)}
    base.update({"PYTHONPATH": str(ROOT), "PYCOMM_TIMEOUT": "20"})
    procs = [c.popen(hostmap[r], [sys.executable, APP], cwd=str(ROOT),
                     env={**base, **env_of(r)}, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
             for r in range(len(hostmap))]
    return _wait_all(procs, timeout)


def _hostlist(hosts: list[int]) -> str:
    return f"host[{min(hosts)}-{max(hosts)}]"


def _check_engine_job(results, hostmap: list[int], local_of):
    size, nodes = len(hostmap), sorted(set(hostmap))
    names = ",".join(f"host{h}" for h in hostmap)
    layout = "|".join(",".join(str(r) for r in range(size) if hostmap[r] == h)
                      for h in sorted(nodes, key=hostmap.index))
    for r, (rc, text) in enumerate(results):
        assert rc == 0, f"rank {r}: {text}"
        local_size = hostmap.count(hostmap[r])
        links = "shm+tcp" if local_size > 1 else "tcp"      # a host's lone rank has no shm
        assert f"OK rank {r}/{size} host host{hostmap[r]} hosts {names} transport {links} " \
            f"layout {layout} " in text and f" local {local_of(r)}/{local_size}" in text, \
            f"rank {r}: {text}"


# host of each rank: srun -N2 -n4 (block), --distribution=cyclic, and -N3 -n5 (2, 2, 1)
SRUN_PLACEMENTS = {"block": [1, 1, 2, 2], "cyclic": [1, 2, 1, 2], "uneven": [1, 1, 2, 2, 3]}


@pytest.mark.parametrize("placement", sorted(SRUN_PLACEMENTS))
def test_srun_style_job_across_hosts_derives_everything_from_slurm_variables(cluster,
                                                                            placement):
    hostmap = SRUN_PLACEMENTS[placement]
    size, nodes = len(hostmap), sorted(set(hostmap))
    per_node = ",".join(str(hostmap.count(h)) for h in nodes)
    job = str(700000 + os.getpid() % 10000 + 10 * sorted(SRUN_PLACEMENTS).index(placement))

    def env_of(r):
        mine = [q for q in range(size) if hostmap[q] == hostmap[r]]
        return {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(size),
                "SLURM_LOCALID": str(mine.index(r)), "SLURM_NODEID": str(hostmap[r] - 1),
                "SLURM_STEP_NODELIST": _hostlist(nodes), "SLURM_NODELIST": _hostlist(nodes),
                "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node,
                "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": f"host{hostmap[r]}"}
    _check_engine_job(_engine_job(cluster, hostmap, env_of), hostmap,
                      lambda r: int(env_of(r)["SLURM_LOCALID"]))


def _hydra_env(hostmap: list[int], r: int) -> dict[str, str]:
    mine = [q for q in range(len(hostmap)) if hostmap[q] == hostmap[r]]
    # what Hydra's proxy gives a process (MPICH 5.0's mpiexec -n 1 env shows these; PMI_FD
    # is the proxy's socket, useless to anyone but an MPI library)
    return {"PMI_RANK": str(r), "PMI_SIZE": str(len(hostmap)), "PMI_FD": "9",
            "MPI_LOCALRANKID": str(mine.index(r)), "MPI_LOCALNRANKS": str(len(mine)),
            "PMI_HOSTNAME": f"host{hostmap[r]}", "HYDI_CONTROL_FD": "7"}


def test_hydra_style_job_across_hosts_with_master_addr_from_genv(cluster):
    # mpiexec -hosts host1,host2 -ppn 2 -genv MASTER_ADDR host1 -genv MASTER_PORT P app.py
    hostmap, port = [1, 1, 2, 2], str(28800 + os.getpid() % 100)
    results = _engine_job(cluster, hostmap, lambda r: {
        **_hydra_env(hostmap, r), "MASTER_ADDR": "host1", "MASTER_PORT": port})
    _check_engine_job(results, hostmap, lambda r: r % 2)


def test_hydra_style_job_across_hosts_without_master_addr_says_so_at_once(cluster):
    t0 = time.monotonic()
    results = _engine_job(cluster, [1, 1, 2, 2], lambda r: _hydra_env([1, 1, 2, 2], r))
    assert time.monotonic() - t0 < 10, "the ranks waited instead of failing"
    for r, (rc, text) in enumerate(results):
        assert rc != 0, f"rank {r}: {text}"
        assert "pycomm.errors.ArgumentError: mpiexec (Hydra) started 4 ranks on more than " \
            "one host (2 on this one)" in text and "-genv MASTER_ADDR" in text, text


def test_open_mpi_style_job_across_hosts_finds_mpirun_through_its_hnp_uri(cluster):
    # mpirun -H host1:2,host2:2 app.py (Open MPI 4): no MASTER_ADDR, rank 0 on mpirun's host
    hostmap = [1, 2, 1, 2]          # --map-by node
    hnp = f"{os.getpid()}.0;tcp://{cluster.addr(1)}:41{os.getpid() % 1000:03d}"

    def env_of(r):
        mine = [q for q in range(4) if hostmap[q] == hostmap[r]]
        return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": str(mine.index(r)),
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": str(
                    mine.index(r)), "OMPI_MCA_orte_hnp_uri": hnp}
    _check_engine_job(_engine_job(cluster, hostmap, env_of), hostmap, lambda r: r // 2)


def _launch_nodes(c: Cluster, placement: str, port: int, **extra: str):
    return [c.popen(k + 1, [sys.executable, "launch.py", "--nnodes", "2", "--node-rank", str(k),
                            "--master-addr", c.addr(1), "--master-port", str(port),
                            "--nproc-per-node", "2", "--placement", placement, APP],
                    cwd=str(ROOT), env=_rank_env(c, PYCOMM_TIMEOUT="30", **extra),
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in range(2)]


@pytest.mark.parametrize("placement,hosts,layout", [
    ("block", "host1,host1,host2,host2", "0,1|2,3"),
    ("cyclic", "host1,host2,host1,host2", "0,2|1,3")])
def test_two_nodes_two_ranks_each_with_the_multi_node_launcher(cluster, placement, hosts,
                                                               layout):
    port = 29300 + os.getpid() % 50 + (50 if placement == "cyclic" else 0)
    results = _wait_all(_launch_nodes(cluster, placement, port), 60)
    for k, (rc, text) in enumerate(results):
        assert rc == 0, f"node {k}: {text}"
        mine = [r for r in range(4) if hosts.split(",")[r] == f"host{k + 1}"]
        for r in mine:
            local = layout.split("|")[k].split(",").index(str(r))
            assert f"[{r}] OK rank {r}/4 host host{k + 1} hosts {hosts} transport shm+tcp " \
                f"layout {layout} names host1,host2 local {local}/2" in text, \
                f"node {k}: {text}"


@pytest.mark.parametrize("early", [False, True], ids=["mid-job", "before-init"])
def test_a_rank_failing_on_host2_stops_every_node_naming_host_and_rank(cluster, early):
    port = 29200 + os.getpid() % 50 + (50 if early else 0)
    extra = {"CHECK_FAIL_RANK": "3", **({"CHECK_FAIL_EARLY": "1"} if early else {})}
    t0 = time.monotonic()
    results = _wait_all(_launch_nodes(cluster, "block", port, **extra), 60)
    took = time.monotonic() - t0
    # PYCOMM_TIMEOUT is 30 s: before init, only the launcher can stop host 1's ranks sooner.
    assert took < 10, f"the job took {took:.1f} s to stop"
    verdict = "job failed: rank 3 on host host2 (node 1) failed: rank 3"
    for k, (rc, text) in enumerate(results):
        assert rc != 0, f"node {k}: {text}"
        assert f"pycomm.launch[host{k + 1}]: {verdict}" in text, f"node {k}: {text}"
        assert "exited with code 1" in text


def test_pulling_a_hosts_cable_is_a_peer_error_naming_it_within_the_peer_timeout():
    try:
        check_support()
        c = Cluster(2, prefix=f"pcu{os.getpid() % 10000}")
    except ClusterError as exc:
        pytest.fail(f"cannot build the emulated cluster: {exc}")
    with c:
        port = str(29100 + os.getpid() % 90)
        procs = [c.popen(1 + r // 2, [sys.executable, APP], cwd=str(ROOT),
                         env=_rank_env(c, RANK=str(r), WORLD_SIZE="4", MASTER_ADDR=c.addr(1),
                                       MASTER_PORT=port, PYCOMM_TIMEOUT="60",
                                       PYCOMM_PEER_TIMEOUT="3", CHECK_LOOP_S="40",
                                       PYTHONFAULTHANDLER="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(4)]
        assert procs[0].stdout.readline().startswith("LOOPING rank 0")
        time.sleep(0.5)
        t0 = time.monotonic()
        c.unplug(2)
        for r in (0, 1):
            try:
                text, _ = procs[r].communicate(timeout=20)
            except subprocess.TimeoutExpired:
                # nsenter execs the rank: ask it for its flight recorder (pycomm prints it
                # on SIGUSR1), then fail with it.
                os.kill(procs[r].pid, signal.SIGUSR1)
                time.sleep(1)
                os.kill(procs[r].pid, signal.SIGABRT)     # faulthandler: every thread's stack
                time.sleep(1)
                procs[r].kill()
                text, _ = procs[r].communicate(timeout=10)
                pytest.fail(f"rank {r} still ran 20 s after the cable was pulled:\n{text}")
            took = time.monotonic() - t0
            assert procs[r].returncode != 0, text
            assert took < 8, f"rank {r} noticed the pulled cable after {took:.1f} s"
            last = text.strip().splitlines()[-1]
            assert last.startswith(f"pycomm.errors.PeerError: rank {r}: "), text
            assert "no answer for 3 s (PYCOMM_PEER_TIMEOUT)" in last, text
            assert "(host host2 at 10.77.0.2:" in last, text


# -- hierarchical collectives -----------------------------------------------------------------
# host of each rank: block and cyclic placements of 2x2, 3x2 and 2x3, uneven and irregular
PLACEMENTS = {"2x2": [0, 0, 1, 1], "2x2c": [0, 1, 0, 1], "3x2": [0, 0, 1, 1, 2, 2],
              "3x2c": [0, 1, 2, 0, 1, 2], "2x3": [0, 0, 0, 1, 1, 1], "2x3c": [0, 1, 0, 1, 0, 1],
              "3+2": [0, 0, 0, 1, 1], "3+2c": [0, 1, 0, 1, 0], "2+2+1": [0, 1, 1, 0, 2]}


@pytest.mark.parametrize("count,piece", [(0, None), (1, None), (5, None), (1000, None),
                                         (1000, 136), (37, 24)])
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_hierarchical_allreduce_matches_numpy_and_every_local_rank_drives_the_link(
        placement, count, piece):
    hostmap = PLACEMENTS[placement]
    size, nhosts = len(hostmap), len(set(hostmap))
    vecs = [np.arange(count, dtype=np.float64) * (r + 1) + r for r in range(size)]

    def fn(cc):
        buf = vecs[cc.rank].copy()
        hier.allreduce_hierarchical(cc, buf, ops.SUM, piece_bytes=piece)  # None: PIECE_BYTES
        return buf
    out = on_fake_hosts(hostmap, fn)
    want = np.sum(vecs, axis=0)
    for r, (buf, _) in enumerate(out):
        assert buf.tobytes() == want.tobytes(), f"rank {r}"
    if count < 100:
        return
    slices = min(hostmap.count(h) for h in set(hostmap))
    for r, (_, sent) in enumerate(out):
        local = [q for q in range(size) if hostmap[q] == hostmap[r]].index(r)
        assert (sent > 0) == (local < slices), f"rank {r} (local {local}) sent {sent} B"
    if nhosts == 2:     # each host sends its n bytes once: 2 (H-1)/H n, the minimum
        for h in (0, 1):
            assert sum(s for (_, s), q in zip(out, hostmap) if q == h) == count * 8


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_hierarchical_bcast_reduce_allgather_barrier_match_numpy(placement):
    hostmap = PLACEMENTS[placement]
    size = len(hostmap)
    for count in (1, 300):
        base = np.arange(count, dtype=np.float64)
        for root in range(size):
            def fn(cc, root=root):
                buf = base + 10 * root if cc.rank == root else np.zeros(count)
                hier.bcast_hierarchical(cc, buf, root)
                red = base * 3 + cc.rank
                hier.reduce_hierarchical(cc, red, root, ops.SUM)
                many = base * 3 + cc.rank               # many pieces of 3 elements
                hier.reduce_hierarchical(cc, many, root, ops.SUM, piece_bytes=24)
                return buf, red, many
            out = on_fake_hosts(hostmap, fn)
            for r, ((buf, _, _), _) in enumerate(out):
                assert np.array_equal(buf, base + 10 * root), f"bcast root {root} rank {r}"
            for got in out[root][0][1:]:
                assert np.array_equal(got, base * 3 * size + size * (size - 1) // 2)

        for piece in (None, 40):        # one piece; many (several per block)
            def gather(cc, piece=piece):
                buf = np.full(size * count, -1, dtype=np.int64)
                buf[cc.rank * count:(cc.rank + 1) * count] = np.arange(count) + 1000 * cc.rank
                hier.allgather_hierarchical(cc, buf, count, piece_bytes=piece)
                hier.barrier_hierarchical(cc)
                return buf
            want = np.concatenate([np.arange(count) + 1000 * r for r in range(size)])
            out = on_fake_hosts(hostmap, gather)
            for r, (buf, _) in enumerate(out):
                assert np.array_equal(buf, want), f"allgather rank {r}: {buf}"
            # each host sends its blocks once to each other host (8 B elements)
            for x in set(hostmap):
                sent = sum(b for (_, b), q in zip(out, hostmap) if q == x)
                assert sent == hostmap.count(x) * count * 8 * (len(set(hostmap)) - 1)


def test_hierarchical_plans_are_built_once_per_layout():
    hostmap = PLACEMENTS["3+2c"]
    plans = on_fake_hosts(hostmap, lambda cc: (hier.plan_of(cc), hier.plan_of(cc)))
    for r, ((a, b), _) in enumerate(plans):
        assert a is b                                       # cached, not rebuilt per call
    p0 = plans[0][0][0]                                     # rank 0: host 0 = ranks 0, 2, 4
    assert (p0.local, p0.slices, p0.cross, p0.leaders, p0.block) == \
        ((0, 2, 4), 2, (0, 1), (0, 1), False)
    assert plans[4][0][0].cross is None                     # local rank 2 owns no slice


def test_auto_chooses_hierarchical_only_when_hosts_are_spanned():
    algs = importlib.import_module("pycomm.collectives")
    assert algs.choose("allreduce", 1 << 24, 4, hosts=(2, 2))[0] == "hierarchical"
    assert algs.choose("barrier", 0, 5, hosts=(3, 2))[0] == "hierarchical"
    assert algs.choose("allreduce", 1 << 24, 4, hosts=(4,))[0] != "hierarchical"
    assert algs.choose("allreduce", 1 << 24, 4)[0] != "hierarchical"
    # a non-commutative op cannot be combined host by host
    assert algs.choose("allreduce", 1 << 24, 4, hosts=(2, 2), commutative=False)[0] != \
        "hierarchical"
    with pytest.raises(pycomm.ArgumentError, match="commutative"):
        algs.choose("reduce", 8, 4, requested="hierarchical", commutative=False)


def _fake_layout_task(hostmap: list[int]):
    from pycomm.launch.bootstrap import host_layout as layout_of
    world = pycomm.COMM_WORLD
    comm = world.Dup()          # a fresh communicator: no call has been planned on it yet
    infos = [{"host": f"fake{h}/boot/shm", "hostname": f"fake{h}"} for h in hostmap]
    comm.host_layout = layout_of(infos, comm.rank)
    try:
        return hier_check.check_all(comm, host_of=lambda c: f"fake{hostmap[world.rank]}")
    finally:
        comm.Free()


def test_hierarchical_collectives_on_real_ranks_with_a_faked_host_layout():
    # one host, 5 ranks over shared memory: the communicator machinery (auto choice,
    # Split's derived layouts, the nonblocking twin) with hosts the namespaces need not make
    with pycomm.Pool(5, transport="shm", timeout=60) as pool:
        for hostmap, shapes in (([0, 0, 0, 1, 1], "3+2 3+2c 3+1 2x2 2x2c"),
                                ([0, 1, 0, 1, 0], "3+2c 3+2 2x2c 2x2 2x2c"),
                                ([0, 1, 1, 0, 2], "2+2+1c 2+2+1 2x2c 2x2 2x2c")):
            seen = set()
            for checks, got in pool.run(_fake_layout_task, hostmap):
                assert got[0] == shapes.split()[0] and checks > 200
                seen.update(got)
            assert seen == set(shapes.split())


def _launch_job(c: Cluster, nnodes: int, nproc: int, placement: str, port: int, app: str,
                **extra: str):
    return [c.popen(k + 1, [sys.executable, "launch.py", "--nnodes", str(nnodes),
                            "--node-rank", str(k), "--master-addr", c.addr(1),
                            "--master-port", str(port), "--nproc-per-node", str(nproc),
                            "--placement", placement, app],
                    cwd=str(ROOT), env=_rank_env(c, PYCOMM_TIMEOUT="30", **extra),
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in range(nnodes)]


@pytest.mark.parametrize("nnodes,nproc,placement,shapes", [
    (2, 3, "block", "2x3 2x3c 3+2 2x2 2x2c"),
    (3, 2, "cyclic", "3x2c 3x2 2+2+1c 2x2 2x2c")])
def test_hierarchical_collectives_across_emulated_hosts(cluster, nnodes, nproc, placement,
                                                        shapes):
    # each job checks its world and sub-communicators of the other placement, uneven
    # hosts and 2 x 2 (block and cyclic): every shape of the issue in two jobs
    port = 29600 + os.getpid() % 50 + (50 if nnodes == 3 else 0)
    results = _wait_all(_launch_job(cluster, nnodes, nproc, placement, port, HIER_APP), 120)
    seen = set()
    for k, (rc, text) in enumerate(results):
        assert rc == 0, f"node {k}: {text}"
        lines = [ln for ln in text.splitlines() if "HIER OK rank" in ln]
        assert len(lines) == nproc, f"node {k}: {text}"
        for line in lines:      # a rank checks the world and the communicators it is in
            got = line.split("shapes ")[1].split(";")
            assert f"/{nnodes * nproc} checks " in line and got[0] == shapes.split()[0], line
            seen.update(got)
    assert seen == set(shapes.split())


# -- link-aware selection ---------------------------------------------------------------------
def _table_with_net(tmp_path, **net) -> str:
    from pycomm.tuning.cost import SHIPPED_TABLE
    with open(SHIPPED_TABLE, encoding="utf-8") as fh:
        table = json.load(fh)
    table["net"] = {**table["shm"], **net}
    path = tmp_path / "links.json"
    path.write_text(json.dumps(table))
    return str(path)


def test_model_transport_prices_each_communicator_by_the_links_it_crosses(tmp_path,
                                                                         monkeypatch):
    from pycomm.tuning.cost import model_transport
    monkeypatch.delenv("PYCOMM_TUNE_FILE", raising=False)
    assert model_transport("shm+tcp", 1) == "shm"       # a host's part of a multi-host job
    assert model_transport("tcp", 1) == "tcp"           # --transport tcp on one host
    # no measured link between hosts: the shipped table's assumed one, not loopback's
    assert model_transport("shm+tcp", 2) == "net"
    assert model_transport("shm+tcp") == "tcp"
    monkeypatch.setenv("PYCOMM_TUNE_FILE", _table_with_net(tmp_path, alpha=50e-6))
    assert model_transport("shm+tcp", 2) == "net" and model_transport("shm+tcp", 1) == "shm"


def test_a_measured_slow_link_makes_the_model_weigh_hierarchical_against_flat(tmp_path,
                                                                             monkeypatch):
    # a 2 Gbit/s link with 50 us latency between hosts
    monkeypatch.setenv("PYCOMM_TUNE_FILE", _table_with_net(
        tmp_path, alpha=50e-6, alpha_x=60e-6, alpha_rndv=100e-6, beta=4e-9, beta_rndv=4e-9))
    algs = importlib.import_module("pycomm.collectives")
    big = 16 << 20
    assert algs.choose("allreduce", big, 4, transport="net", hosts=(2, 2))[0] == \
        "hierarchical"
    # flat schedules are priced at the link's speed, not at loopback's: a ring moves
    # 1.5 n per rank, so it cannot be modelled below 1.5 n beta_net
    assert algs.model_time("allreduce", "ring", big, 4, transport="net") > 1.5 * big * 4e-9
    # a tiny all-reduce: two latency-bound flat steps beat three two-level stages
    small = algs.choose("allreduce", 8, 4, transport="net", hosts=(2, 2))[0]
    assert small != "hierarchical"
    # without the measurement (a table with no net entry), hierarchical is taken by structure
    assert algs.choose("allreduce", 8, 4, transport="tcp", hosts=(2, 2))[0] == "hierarchical"


def test_tune_links_measures_the_link_between_emulated_hosts(cluster, tmp_path, monkeypatch):
    out = tmp_path / "links.json"
    port = 29650 + os.getpid() % 40
    procs = [cluster.popen(k + 1, [sys.executable, "launch.py", "--nnodes", "2",
                                   "--node-rank", str(k), "--master-addr", cluster.addr(1),
                                   "--master-port", str(port), "--nproc-per-node", "2",
                                   "pycomm/tuning/tune_links.py", "--quick", "--out", str(out)],
                           cwd=str(ROOT), env=_rank_env(cluster, PYCOMM_TIMEOUT="60"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in range(2)]
    for k, (rc, text) in enumerate(_wait_all(procs, 120)):
        assert rc == 0, f"node {k}: {text}"
    net = json.loads(out.read_text())["net"]
    assert net["measured"]["pair"] == [0, 2] and net["measured"]["names"] == ["host1", "host2"]
    for entry in (net, net["measured"]["local"]):
        for key in ("alpha", "beta", "alpha_rndv", "beta_rndv", "alpha_x"):
            assert 0 < entry[key] < 1, (key, entry)
    from pycomm.tuning.cost import load_table, model_transport
    monkeypatch.setenv("PYCOMM_TUNE_FILE", str(out))
    assert load_table()["net"].beta_rndv == net["beta_rndv"]
    assert model_transport("shm+tcp", 2) == "net"


# -- stdin of a multi-node job (two agents on this host, no namespaces) ----------------------
STDIN_APP = """\
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
reader = int(sys.argv[1])
if comm.rank == reader:
    lines = [line.rstrip("\\n") for line in sys.stdin]
    sys.stdout.write("rank %d read %d lines: %r\\n" % (comm.rank, len(lines), lines))
else:
    t0 = time.monotonic()
    data = sys.stdin.read()
    # one write per line: the ranks of a node share its unprefixed output, and print()
    # under PYTHONUNBUFFERED writes the text and its newline apart
    sys.stdout.write("rank %d read %r in %.1f s\\n" % (comm.rank, data, time.monotonic() - t0))
sys.stdout.flush()
comm.Barrier()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_argv(k: int, port: int, opts: tuple[str, ...], program: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "launch.py"), "--nnodes", "2", "--node-rank", str(k),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "2",
            "--mpi4py", *opts, *program]


def _local_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOMM_", "MASTER_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYCOMM_TIMEOUT": "20"})
    return env


def _wait_for_lines(paths: list[Path], needles: list[str], procs, timeout: float) -> None:
    """Wait until every needle is in one of the files (fail early if a node exits)."""
    deadline = time.monotonic() + timeout
    while True:
        text = "".join(p.read_text() for p in paths)
        if all(n in text for n in needles):
            return
        gone = [p.returncode for p in procs if p.poll() is not None]
        assert not gone and time.monotonic() < deadline, \
            f"waiting for {needles} (nodes exited: {gone}):\n{text}"
        time.sleep(0.05)


@pytest.mark.usefixtures("no_shared_world")
@pytest.mark.parametrize("opts,reader,node", [
    ((), 0, 0),                                     # the default: node 0's stdin, rank 0
    (("--stdin", "3"), 3, 1),                       # block: rank 3 is on node 1
    (("--placement", "cyclic", "--stdin", "1"), 1, 1),    # cyclic: rank 1 is on node 1
    (("--stdin", "none"), None, None)],
    ids=["default", "rank3-block", "rank1-cyclic", "none"])
def test_stdin_of_the_node_hosting_the_stdin_rank_reaches_it(tmp_path, opts, reader, node):
    """Both launch.py get a pipe that the test holds open: the ranks that are not --stdin's
    read EOF at once (no hang on a terminal-like stdin), the other node's launch.py does not
    hold its pipe (a write is EPIPE), and the lines written to the hosting node's launch.py
    all reach the --stdin rank, which reads to EOF."""
    app = tmp_path / "stdin_app.py"
    app.write_text(STDIN_APP)
    port = _free_port()
    outs = [tmp_path / f"node{k}.out" for k in range(2)]
    procs = []
    try:
        for k in range(2):
            with open(outs[k], "wb") as out:
                procs.append(subprocess.Popen(
                    _node_argv(k, port, opts, [str(app), "-1" if reader is None else str(reader)]),
                    cwd=str(ROOT), env=_local_env(), stdin=subprocess.PIPE, stdout=out,
                    stderr=subprocess.STDOUT, bufsize=0))
        others = [r for r in range(4) if r != reader]
        _wait_for_lines(outs, [f"rank {r} read '' in " for r in others], procs, 30)
        for k, proc in enumerate(procs):
            if k != node:           # that agent let go of its stdin before starting ranks
                with pytest.raises(BrokenPipeError):
                    proc.stdin.write(b"nobody reads this\n")
        if node is not None:
            procs[node].stdin.write(b"alpha\nbeta\ngamma\n")
            procs[node].stdin.close()
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    texts = [p.read_text() for p in outs]
    for k, proc in enumerate(procs):
        assert proc.returncode == 0, f"node {k}:\n{texts[k]}"
    for r in others:
        took = re.search(rf"rank {r} read '' in ([0-9.]+) s", "".join(texts))
        assert took is not None and float(took.group(1)) < 5.0, texts
    if node is not None:
        assert f"rank {reader} read 3 lines: ['alpha', 'beta', 'gamma']" in texts[node], \
            texts
    assert "nobody reads this" not in "".join(texts)


def test_stdin_rank_outside_the_multi_node_world_is_a_usage_error(tmp_path):
    marker = tmp_path / "ran"
    app = tmp_path / "app.py"
    app.write_text(f"open({str(marker)!r}, 'w').close()\n")
    port = _free_port()
    proc = subprocess.run(_node_argv(0, port, ("--stdin", "7"), [str(app)]), cwd=str(ROOT),
                          env=_local_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--stdin must be a rank in 0..3 or 'none', got '7' (the world of --nnodes 2 x " \
        "--nproc-per-node 2)" in proc.stderr
    assert proc.stdout == "" and not marker.exists()
    with socket.socket() as s:      # node 0's store never bound its port
        s.bind(("0.0.0.0", port))


@pytest.mark.parametrize("opts,message", [
    (["--nnodes", "0"], "--nnodes must be at least 1, got 0"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be in 0..1, got 2"),
    (["--nnodes", "2", "--nproc-per-node", "0"], "--nproc-per-node must be at least 1, got 0"),
    (["--nnodes", "2", "--stdin", "-1"], "--stdin must be a rank in 0..1 or 'none', got '-1'")])
def test_multi_node_shape_errors_are_usage_errors(opts, message, capsys):
    from pycomm.launch.cli import main
    with pytest.raises(SystemExit) as exc:
        main([*opts, "app.py"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
