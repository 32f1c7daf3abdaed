"""Hierarchical collectives and link-aware selection (issue 16): the two-level schedules
on fake hosts, on real single-host ranks with a faked host layout and across emulated
hosts (benchmarks/cluster/netns.py), the cost model's links between hosts, and
tune_links measuring one between emulated hosts. Jobs across emulated hosts need root and
iproute2; where namespaces cannot be made they FAIL with the reason (see
tests/test_cluster.py).
"""

from __future__ import annotations

import importlib
import json
import os

import cloudpickle
import numpy as np
import pytest

import pycomm
from benchmarks.cluster import hier_check
from benchmarks.cluster.jobcheck import ROOT, emulated_hosts, finish_all, launch_nodes
from fakecomm import on_fake_hosts  # tests/ is on sys.path under pytest
from pycomm import ops
from pycomm.collectives import hierarchical as hier

HIER_APP = str(ROOT / "benchmarks" / "cluster" / "hier_check.py")
cloudpickle.register_pickle_by_value(hier_check)   # shipped to single-host pool ranks


@pytest.fixture(scope="module")
def cluster():
    with emulated_hosts(3, "pch", pytest.fail, "cannot build the emulated cluster") as c:
        yield c

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


@pytest.mark.parametrize("nnodes,nproc,placement,shapes", [
    (2, 3, "block", "2x3 2x3c 3+2 2x2 2x2c"),
    (3, 2, "cyclic", "3x2c 3x2 2+2+1c 2x2 2x2c")])
def test_hierarchical_collectives_across_emulated_hosts(cluster, nnodes, nproc, placement,
                                                        shapes):
    # each job checks its world and sub-communicators of the other placement, uneven
    # hosts and 2 x 2 (block and cyclic): every shape of the issue in two jobs
    port = 29600 + os.getpid() % 50 + (50 if nnodes == 3 else 0)
    results = finish_all(launch_nodes(cluster, nnodes, nproc, port, [HIER_APP], placement), 120)
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
    procs = launch_nodes(cluster, 2, 2, port, ["pycomm/tuning/tune_links.py", "--quick",
                                               "--out", str(out)], PYCOMM_TIMEOUT="60")
    for k, (rc, text) in enumerate(finish_all(procs, 120)):
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

