"""pycomm.ray on a real two-node Ray cluster, each node on its own emulated host (issue 16).

A module fixture builds 2 emulated hosts (benchmarks/cluster/netns.py: a network namespace,
hostname and private /dev/shm each) and a Ray cluster on them
(benchmarks/cluster/ray_nodes.py: ``ray start --head`` on host1, ``ray start --address
host1:6379`` on host2, each node with 2 CPUs, a custom resource ``host<K>``, its own PID
namespace and token authentication). Drivers (benchmarks/cluster/ray_check.py) then make
pycomm worlds of 4 actors, 2 per node, and check what the ranks report against where Ray
put them: world size, hostnames, the host layout (2 hosts x 2), the transports (shared
memory within a host, TCP across) and Allreduce/Bcast/Allgather against numpy; a rank that
raises or dies on one host is reported with its rank; and after ``ray stop`` on each
host no process of the node and no pycomm segment in the host's /dev/shm is left.

Needs ray (run it with a Python that has it, e.g. a venv: ``python -m venv
--system-site-packages /opt/ray && /opt/ray/bin/pip install ray`` then
``/opt/ray/bin/python -m pytest tests/test_ray_hosts.py``; skipped where ray is missing)
and root for the namespaces (skipped, saying why, where they cannot be made). With both,
a Ray that does not start or a pycomm that misbehaves fails the tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install pycomm[ray], or a "
                    "venv: see this module's docstring)")

from benchmarks.cluster.jobcheck import (ROOT, assert_lines, assert_none_with_env,  # noqa: E402
                                         clean_env, emulated_hosts, finish, started)
from benchmarks.cluster.ray_nodes import RayError, RayNodes  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _ray_stop_leaves_nothing(c, r) -> None:
    """``ray stop`` on each host ends every process of its node and leaves no pycomm
    segment (run by the fixture after the module's tests, whichever of them ran)."""
    for k in (2, 1):
        done = r.stop(k)
        assert done.returncode == 0, f"host {k}: ray stop: {done.stdout}{done.stderr}"
        deadline = time.monotonic() + 10
        while (left := r.processes(k)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"host {k}: left after ray stop: {left}"
        shm = [n for n in c.run(k, ["ls", "-A", "/dev/shm"]).stdout.split()
               if n.startswith("pycomm")]
        assert not shm, f"host {k}: /dev/shm still holds {shm}"


@pytest.fixture(scope="module")
def nodes():
    with emulated_hosts(2, "pry") as c:
        with started(lambda: RayNodes(c, env=clean_env()), RayError,
                     "Ray is installed but its nodes did not start here") as r:
            token, temp = r.token, r.dir
            yield c, r
            _ray_stop_leaves_nothing(c, r)
        assert not os.path.exists(temp), f"{temp} left behind"
    assert_none_with_env(f"RAY_AUTH_TOKEN={token}", "processes of the Ray cluster outlived it")


def _driver(nodes, *modes: str, host: int = 1, timeout: float = 150) -> dict[str, str]:
    """Run ray_check.py's ``modes`` from a driver on ``host``; each mode's output."""
    c, r = nodes
    p = r.driver([sys.executable, "-m", "benchmarks.cluster.ray_check", r.address, *modes],
                 k=host, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    rc, out = finish(p, timeout, "the driver", r.logs())
    assert rc == 0 and out.rstrip().endswith("DONE"), \
        f"driver exited with {rc}:\n{out}\n{r.logs()}"
    parts = re.split(r"^MODE (\w+)\n", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _no_leftovers(nodes) -> None:
    """No actor of a world alive on any node, no pycomm segment in any host's /dev/shm."""
    c, r = nodes
    deadline = time.monotonic() + 10
    while True:
        actors = {k: [p for p in r.processes(k) if re.search(r"ray::(_Rank|Member)\b", p)]
                  for k in (1, 2)}
        shm = {k: [n for n in c.run(k, ["ls", "-A", "/dev/shm"]).stdout.split()
                   if n.startswith("pycomm")] for k in (1, 2)}
        if not any(actors.values()) and not any(shm.values()) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(actors.values()), f"actors left: {actors}"
    assert not any(shm.values()), f"pycomm segments left in /dev/shm: {shm}"


def _placed(out: str) -> tuple[list[int], dict[int, set[str]]]:
    """(host number of each rank, host number -> Ray node ids) from the PLACED lines."""
    rows = re.findall(r"^PLACED rank (\d+) host host(\d+) node (\w+)$", out, flags=re.M)
    assert [int(r) for r, _, _ in rows] == list(range(len(rows))), out
    nodes: dict[int, set[str]] = {}
    for _, h, node in rows:
        nodes.setdefault(int(h), set()).add(node)
    return [int(h) for _, h, _ in rows], nodes


def _check_world(out: str, hostmap: list[int] | None = None) -> None:
    placed, node_ids = _placed(out)
    if hostmap is not None:
        assert placed == hostmap, out
    assert sorted(placed) == [1, 1, 2, 2], f"not 2 actors per node: {placed}\n{out}"
    assert all(len(ids) == 1 for ids in node_ids.values()) and \
        len(set().union(*node_ids.values())) == 2, node_ids
    # each rank: its checks passed, its host, every rank's host, shm+tcp, the layout
    assert_lines(out, placed)


def test_two_nodes_form_one_ray_cluster(nodes):
    c, r = nodes
    for k in (1, 2):
        assert r.processes(k), f"host {k}: no Ray process\n{r.logs()}"
    assert c.run(2, ["hostname"]).stdout.strip() == "host2"


@pytest.fixture(scope="module")
def on_host1(nodes) -> dict[str, str]:
    """Every mode of ray_check.py from one driver on host 1 (a driver's start-up and
    ray.init cost seconds: paid once for the tests that read these modes)."""
    return _driver(nodes, "run", "declared", "raise", "die", timeout=240)


def test_run_and_a_declared_group_span_both_nodes(nodes, on_host1):
    _check_world(on_host1["run"])                       # where Ray put them: 2 per node
    _check_world(on_host1["declared"], [1, 2, 1, 2])    # pinned cyclically by resources
    _no_leftovers(nodes)


def test_a_driver_on_the_other_node(nodes):
    _check_world(_driver(nodes, "run", host=2)["run"])
    _no_leftovers(nodes)


def test_a_rank_that_fails_on_one_node_is_named(nodes, on_host1):
    for mode, kind in (("raise", "RemoteError"), ("die", "PeerError")):
        m = re.search(r"^FAILED (\w+) rank (\d+) after ([\d.]+) s: (.*)$", on_host1[mode],
                      flags=re.M)
        assert m, on_host1[mode]
        assert (m.group(1), m.group(2)) == (kind, "3"), on_host1[mode]
        # the others learnt it from the failed rank, not from their timeout (60 s)
        assert float(m.group(3)) < 40, on_host1[mode]
    assert "fails on purpose on host" in on_host1["raise"]
    _no_leftovers(nodes)
