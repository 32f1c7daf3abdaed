"""pycomm.ray: worlds on Ray actors, on a local Ray cluster started once for the module.

Ray is in the ``test`` extra, so these run in CI; they skip only where ray cannot be
imported at all. Every result is checked against numpy on the driver.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install pycomm[ray])")

import pycomm  # noqa: E402
import pycomm.ray as pray  # noqa: E402
from pycomm.errors import ArgumentError, PeerError, RemoteError  # noqa: E402

pytestmark = pytest.mark.timeout(120)
# The actors cannot import this test module: ship its functions and classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # No usage report (no network), no dashboard, nothing streamed from the workers.
    # address="local": a cluster of its own, never one that `ray start` left running on
    # this machine (ray.init() without an address joins the latest such cluster).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def _ours_in_dev_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("pycomm-ray")}


def _collectives(comm, n):
    """Allreduce, Bcast from every root, a ring of Sendrecv, allgather of objects."""
    rank, size = comm.rank, comm.size
    x = np.arange(n, dtype=np.float64) * (rank + 1) + rank
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=pycomm.SUM)
    ints = np.full(n, rank + 2, dtype=np.int32)
    comm.Allreduce(pycomm.IN_PLACE, ints, op=pycomm.PROD)
    roots = []
    for root in range(size):
        buf = np.arange(n, dtype=np.int64) + 100 * root if rank == root else \
            np.zeros(n, np.int64)
        comm.Bcast(buf, root=root)
        roots.append(buf)
    got = np.empty(n, dtype=np.float32)
    comm.Sendrecv(np.full(n, rank, np.float32), (rank + 1) % size, recvbuf=got,
                  source=(rank - 1) % size)
    return {"rank": rank, "size": size, "total": total, "ints": ints, "roots": roots,
            "ring": got, "pids": comm.allgather(os.getpid()), "layout": comm.host_layout}


def _state(pid: int) -> str | None:
    """The process's state letter, or None once it is gone. A zombie can be reaped between
    any two looks at /proc, so the one read is the only look."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.parametrize("size", [2, 3])
def test_run_collectives_and_p2p_match_numpy(size):
    n = 1000
    before = _ours_in_dev_shm()
    out = pray.run(_collectives, size, n, timeout=60)
    assert [o["rank"] for o in out] == list(range(size))
    want = np.sum([np.arange(n, dtype=np.float64) * (r + 1) + r for r in range(size)], axis=0)
    for r, o in enumerate(out):
        assert o["size"] == size
        assert np.array_equal(o["total"], want), f"rank {r}"
        assert np.array_equal(o["ints"], np.full(n, np.prod(np.arange(2, size + 2)), np.int32))
        for root, buf in enumerate(o["roots"]):
            assert np.array_equal(buf, np.arange(n, dtype=np.int64) + 100 * root)
        assert np.array_equal(o["ring"], np.full(n, (r - 1) % size, np.float32))
        # one Ray node: one host, the actors its local ranks in rank order
        assert o["layout"].hosts == (tuple(range(size)),) and o["layout"].local_rank == r
    # Teardown: no actor process, no segment, no directory left behind.
    pids = out[0]["pids"]
    assert len(set(pids)) == size and os.getpid() not in pids
    for pid in pids:
        assert _state(pid) in (None, "Z"), pid
    assert _ours_in_dev_shm() <= before
    assert not [a for a in ray.util.list_named_actors() if a.startswith("pycomm:")]


@ray.remote(num_cpus=1)
class Worker:
    """A user's actor, written as for ray.util.collective: it calls the module's functions
    with a group name, and joins the group the driver declared on its first call."""

    def compute(self, group: str, n: int):
        rank, size = pray.get_rank(group), None
        x = np.arange(n, dtype=np.float64) + 10 * os.getpid() % 7
        pray.allreduce(x, group_name=group)            # joins here (rank was -1 above)
        rank, size = pray.get_rank(group), pray.get_collective_group_size(group)
        mine = np.arange(n, dtype=np.float64) + rank
        red = mine.copy()
        pray.reduce(red, dst_rank=1, group_name=group, op=pycomm.MAX)
        b = mine.copy()
        pray.broadcast(b, src_rank=2, group_name=group)
        gathered = [np.empty(n) for _ in range(size)]
        pray.allgather(gathered, mine, group_name=group)
        scattered = np.empty(n)
        pray.reducescatter(scattered, [mine * (k + 1) for k in range(size)], group_name=group)
        got = np.empty(n)
        if rank == 0:
            pray.send(mine * 5, 2, group_name=group)
        elif rank == 2:
            pray.recv(got, 0, group_name=group)
        pray.barrier(group_name=group)
        handle = pray.get_group_handle(group)
        return {"rank": rank, "size": size, "red": red, "b": b, "gathered": gathered,
                "scattered": scattered, "got": got, "comm_rank": handle.rank,
                "initialized": pray.is_group_initialized(group)}

    def leave(self, group: str):
        pray.destroy_collective_group(group)
        return pray.is_group_initialized(group), pray.get_rank(group)

    def join_itself(self, world_size: int, rank: int, group: str):
        comm = pray.init_collective_group(world_size, rank, group_name=group, timeout=30)
        x = np.full(4, rank + 1.0)
        comm.Allreduce(pycomm.IN_PLACE, x)
        pray.destroy_collective_group(group)
        return x

    def join_expect_error(self, world_size: int, rank: int, group: str, timeout: float):
        try:
            pray.init_collective_group(world_size, rank, group_name=group, timeout=timeout)
        except ArgumentError as exc:
            return str(exc)
        return "joined"


def test_driver_declared_group_with_ray_util_collective_calls():
    n = 64
    actors = [Worker.remote() for _ in range(3)]
    try:
        # actors[i] gets rank ranks[i]: a permutation, to see that the declared ranks hold
        pray.create_collective_group(actors, 3, [2, 0, 1], group_name="declared")
        out = ray.get([a.compute.remote("declared", n) for a in actors], timeout=90)
        assert [o["rank"] for o in out] == [2, 0, 1]
        mine = {r: np.arange(n, dtype=np.float64) + r for r in range(3)}
        for o in out:
            r = o["rank"]
            assert o["size"] == 3 and o["comm_rank"] == r and o["initialized"]
            want_red = np.max([mine[q] for q in range(3)], axis=0) if r == 1 else mine[r]
            assert np.array_equal(o["red"], want_red), r
            assert np.array_equal(o["b"], mine[2])
            for q in range(3):
                assert np.array_equal(o["gathered"][q], mine[q])
            assert np.array_equal(o["scattered"], sum(mine[q] * (r + 1) for q in range(3)))
            if r == 2:
                assert np.array_equal(o["got"], mine[0] * 5)
        assert ray.get([a.leave.remote("declared") for a in actors]) == [(False, -1)] * 3
    finally:
        pray.destroy_collective_group("declared")
        for a in actors:
            ray.kill(a)
    assert "pycomm:declared" not in ray.util.list_named_actors()


def test_members_that_initialize_the_group_themselves():
    actors = [Worker.remote() for _ in range(2)]
    try:
        out = ray.get([a.join_itself.remote(2, r, "selfmade") for r, a in
                       enumerate(actors)], timeout=90)
        for x in out:
            assert np.array_equal(x, np.full(4, 3.0))
        # the last member to leave ended the directory
        deadline = time.monotonic() + 10
        while "pycomm:selfmade" in ray.util.list_named_actors():
            assert time.monotonic() < deadline, "the directory outlived its group"
            time.sleep(0.1)
    finally:
        for a in actors:
            ray.kill(a)


def test_members_disagreeing_on_the_world_size_fail_on_every_member():
    actors = [Worker.remote() for _ in range(2)]
    try:
        # the second member starts later than the first's failure, as a slow actor would
        first = actors[0].join_expect_error.remote(2, 0, "odd", 5)
        time.sleep(1)
        second = actors[1].join_expect_error.remote(3, 1, "odd", 5)
        out = ray.get([first, second], timeout=60)
        assert all("world_size" in text for text in out), out
        # nobody destroys the failed group: its directory goes by itself after the timeout
        deadline = time.monotonic() + 20
        while "pycomm:odd" in ray.util.list_named_actors():
            assert time.monotonic() < deadline, "the failed group's directory stayed"
            time.sleep(0.2)
    finally:
        pray.destroy_collective_group("odd")
        for a in actors:
            ray.kill(a)


def _fails_on(comm, bad_rank, how):
    x = np.ones(8)
    comm.Allreduce(pycomm.IN_PLACE, x)
    if comm.rank == bad_rank:
        if how == "raise":
            raise ValueError(f"rank {comm.rank} fails on purpose")
        os._exit(3)
    comm.Allreduce(pycomm.IN_PLACE, x)      # the others wait on the failed rank here
    return x


@pytest.mark.parametrize("how,bad", [("raise", 1), ("die", 2)])
def test_a_failing_actor_is_an_error_naming_its_rank_and_nobody_hangs(how, bad):
    before = _ours_in_dev_shm()
    t0 = time.monotonic()
    want = RemoteError if how == "raise" else PeerError
    with pytest.raises(want, match=f"^rank {bad}[ :]") as info:
        pray.run(_fails_on, 3, bad, how, timeout=60)
    took = time.monotonic() - t0
    assert took < 30, f"the failure took {took:.1f} s to surface"
    if how == "raise":
        assert info.value.rank == bad and "fails on purpose" in str(info.value)
    else:
        assert info.value.peer == bad
    assert _ours_in_dev_shm() <= before
    assert not [a for a in ray.util.list_named_actors() if a.startswith("pycomm:")]


def test_bad_arguments_raise_before_any_actor_starts():
    with pytest.raises(ArgumentError, match="not callable"):
        pray.run(42, 2)
    with pytest.raises(ArgumentError, match="num_actors=0"):
        pray.run(_collectives, 0)
    with pytest.raises(ArgumentError, match="permutation"):
        pray.create_collective_group([Worker.remote(), Worker.remote()], 2, [0, 0],
                                     group_name="never")
    assert "pycomm:never" not in ray.util.list_named_actors()
    with pytest.raises(pycomm.CommError, match="inside a Ray actor"):
        pray.init_collective_group(2, 0, group_name="driver")
