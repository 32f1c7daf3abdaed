"""Nonblocking collectives on real worlds: every I-variant against its blocking twin, several
outstanding at once, mixed with point-to-point requests, Test polling, background progress,
argument errors at post time and errors inside the schedule surfacing on Wait.

A rank runs the blocking call and its I-variant on identical inputs and returns both
results; the parent asserts they are byte-identical (the blocking collectives themselves
are checked against numpy in test_cco_buf.py and test_vcoll.py).
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import numpy as np
import pytest

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536
BIG = EAGER_LIMIT // 8 + 5          # float64 elements: past the eager limit (rendezvous)
ROOTED = ("Bcast", "Reduce", "Gather", "Scatter", "Gatherv", "Scatterv")
VARIANTS = ["Barrier", "Bcast", "Reduce", "Allreduce", "Allgather", "Alltoall",
            "Reduce_scatter_block", "Gather", "Scatter", "Gatherv", "Scatterv", "Allgatherv",
            "Alltoallv", "Scan", "Exscan"]


# -- what runs on the ranks ----------------------------------------------------------------

def inp(seed: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, rank, n]).uniform(0.5, 1.5, n)


def vcounts(size: int, n: int, shift: int) -> tuple[list, list, int]:
    """Uneven counts (some zero) and displacements with a 2-element gap before each block."""
    counts = [((r + shift) % 3) * n for r in range(size)]
    displs, at = [], 0
    for c in counts:
        displs.append(at + 2)
        at += c + 2
    return counts, displs, at


def call(comm, name: str, nonblocking: bool, n: int, root: int, seed: int) -> list:
    """Run ``name`` (or its I-variant, then Wait) on fresh inputs; return its outputs."""
    size, rank = comm.size, comm.rank
    fn = getattr(comm, "I" + name[0].lower() + name[1:] if nonblocking else name)
    out: list = []
    sentinel = -7.0

    def run(*args):
        req = fn(*args)
        if nonblocking:
            assert isinstance(req, pycomm.Request)
            req.Wait()
        else:
            assert req is None

    if name == "Barrier":
        run()
    elif name == "Bcast":
        buf = inp(seed, root, n) if rank == root else np.zeros(n)
        run(buf, root)
        out = [buf]
    elif name in ("Reduce", "Allreduce", "Scan", "Exscan"):
        recv = np.full(n, sentinel)
        if name == "Reduce":
            run(inp(seed, rank, n), recv, pycomm.SUM, root)
        else:
            run(inp(seed, rank, n), recv, pycomm.SUM)
        out = [recv]
    elif name in ("Allgather", "Alltoall", "Gather"):
        m = size * n if name == "Alltoall" else n
        recv = np.full(size * n, sentinel)
        run(inp(seed, rank, m), recv, *((root,) if name == "Gather" else ()))
        out = [recv]
    elif name == "Reduce_scatter_block":
        recv = np.full(n, sentinel)
        run(inp(seed, rank, size * n), recv, pycomm.SUM)
        out = [recv]
    elif name == "Scatter":
        recv = np.full(n, sentinel)
        run(inp(seed, root, size * n), recv, root)
        out = [recv]
    elif name in ("Gatherv", "Allgatherv"):
        counts, displs, total = vcounts(size, n, seed)
        recv = np.full(total, sentinel)
        send = inp(seed, rank, counts[rank])
        if name == "Gatherv":
            run(send, [recv, counts, displs], root)
        else:
            run(send, [recv, (counts, displs), None])
        out = [recv]
    elif name == "Scatterv":
        counts, displs, total = vcounts(size, n, seed)
        recv = np.full(counts[rank], sentinel)
        run([inp(seed, root, total), counts, displs], recv, root)
        out = [recv]
    elif name == "Alltoallv":
        # rank i sends ((i + j) % 3) * n elements to rank j
        sc = [((rank + j) % 3) * n for j in range(size)]
        rc = [((j + rank) % 3) * n for j in range(size)]
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(int).tolist()
        rd = [d + 1 for d in np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(int).tolist()]
        recv = np.full(sum(rc) + 1, sentinel)
        run([inp(seed, rank, sum(sc)), sc, sd], [recv, rc, rd])
        out = [recv]
    else:
        raise ValueError(name)
    return [a.tobytes() for a in out]


REDUCTIONS = {"Reduce": "reduce", "Allreduce": "allreduce",
              "Reduce_scatter_block": "reduce_scatter_block"}


def _rank_twins(name: str, cases: list):
    comm = pycomm.COMM_WORLD
    out = []
    for n, root, seed in cases:
        blocking = call(comm, name, False, n, root, seed)
        nonblocking = call(comm, name, True, n, root, seed)
        same = blocking == nonblocking
        if not same and name in REDUCTIONS and comm.chosen_algorithm(
                REDUCTIONS[name], 8 * n * (comm.size if name.endswith("block") else 1)) \
                in ("shared_slots", "shm_direct"):
            # the blocking call went through shared-memory slots, which add in rank order
            # x0 + x1 + ..., or read its peers' buffers directly (each slice: its owner's
            # part first, then the others in rank order); the I-variant's algorithm
            # brackets the same sum its own way: equal to the last bits only
            same = all(np.allclose(np.frombuffer(a), np.frombuffer(b), rtol=1e-13, atol=0)
                       for a, b in zip(blocking, nonblocking))
        out.append((n, root, same))
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_i_variant_matches_blocking_twin(world_small, name):
    size = world_small.size
    roots = range(size) if name in ROOTED else (0,)
    cases = [(n, root, i) for i, (n, root) in enumerate(
        [(0, 0)] + [(7, r) for r in roots] + [(BIG, size - 1)])]
    for rank, res in enumerate(world_small.run(_rank_twins, name, cases)):
        bad = [(n, root) for n, root, same in res if not same]
        assert not bad, f"rank {rank}: I{name} differs from {name} for (n, root) in {bad}"


# -- several outstanding, completed in another order ---------------------------------------

def _rank_outstanding(n: int):
    comm = pycomm.COMM_WORLD
    size, rank = comm.size, comm.rank
    a = np.full(n, float(rank))
    b = np.arange(n, dtype=np.float64) if rank == size - 1 else np.zeros(n)
    c = np.zeros(size * 2, dtype=np.int64)
    d = np.zeros(size, dtype=np.int32)
    e = np.zeros(n)
    reqs = [comm.Iallreduce(pycomm.IN_PLACE, a),
            comm.Ibcast(b, size - 1),
            comm.Iallgather(np.array([rank, -rank], dtype=np.int64), c),
            comm.Ibarrier(),
            comm.Ialltoall(np.arange(size, dtype=np.int32) + 100 * rank, d),
            comm.Ireduce(np.full(n, 2.0), e, pycomm.PROD, 0)]
    pycomm.Request.Waitall(reqs[::-1])
    # then individual Waits, in reverse posting order
    f, g = np.full(3, rank + 1.0), np.zeros(3)
    r1 = comm.Iallreduce(pycomm.IN_PLACE, f, op=pycomm.MAX)
    r2 = comm.Iscatter(np.arange(3.0 * size) if rank == 0 else None, g, 0)
    r2.Wait()
    r1.Wait()
    return dict(a=a.tolist(), b=b.tolist(), c=c.tolist(), d=d.tolist(),
                e=e.tolist() if rank == 0 else None, f=f.tolist(), g=g.tolist(),
                done=all(r.Test() for r in reqs))


@pytest.mark.parametrize("n", [5, BIG], ids=["eager", "rendezvous"])
def test_several_outstanding_completed_in_another_order(world_small, n):
    s = world_small.size
    for rank, got in enumerate(world_small.run(_rank_outstanding, n)):
        assert got["a"] == [s * (s - 1) / 2] * n
        assert got["b"] == list(np.arange(n, dtype=np.float64))
        assert got["c"] == [v for r in range(s) for v in (r, -r)]
        assert got["d"] == [100 * r + rank for r in range(s)]
        if rank == 0:
            assert got["e"] == [2.0 ** s] * n
        assert got["f"] == [float(s)] * 3
        assert got["g"] == [3.0 * rank, 3.0 * rank + 1, 3.0 * rank + 2]
        assert got["done"]


def _rank_mixed_p2p():
    comm = pycomm.COMM_WORLD
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(BIG)
    x = np.full(4, rank, dtype=np.int64)
    statuses = [pycomm.Status() for _ in range(4)]
    reqs = [comm.Irecv(got, left, tag=3),
            comm.Iallreduce(pycomm.IN_PLACE, x),
            comm.Isend(np.full(BIG, float(rank)), right, tag=3),
            comm.Ibarrier()]
    pycomm.Request.Waitall(reqs, statuses)
    return (got[0], got[-1], x.tolist(), statuses[0].source, statuses[0].tag,
            statuses[0].Get_count(np.float64))


def test_mixed_with_point_to_point_in_one_waitall(world_small):
    s = world_small.size
    for rank, got in enumerate(world_small.run(_rank_mixed_p2p)):
        left = (rank - 1) % s
        assert got == (left, left, [s * (s - 1) // 2] * 4, left, 3, BIG), f"rank {rank}"


class _CompletedMeanwhile:
    """A request that another thread's progress completes between Waitall's first look at
    it and its wait (the progress thread and the caller's thread both drive the engine)."""
    error = None

    def __init__(self, expect, reads: int = 0):
        self.expect, self.reads = expect, reads

    @property
    def done(self) -> bool:
        self.reads += 1
        return self.reads > 1


def _rank_wait_all_completed_meanwhile():
    from pycomm.waiting import OFFLOADED
    comm = pycomm.COMM_WORLD
    comm.Ibarrier().Wait()                  # the engine is threaded from here on
    # wait_all looks at the first (pending), then lists the pending ones: none by then
    reqs = [_CompletedMeanwhile(OFFLOADED), _CompletedMeanwhile(OFFLOADED, reads=1)]
    comm._engine.wait_all(reqs, timeout=5)  # an IndexError once (pending[0] of none)
    comm._engine.wait_all([_CompletedMeanwhile(None)], timeout=5)
    comm.Barrier()
    return True


def test_waitall_whose_requests_complete_meanwhile_returns(world_small):
    assert world_small.run(_rank_wait_all_completed_meanwhile) == [True] * world_small.size


def _rank_test_polling():
    comm = pycomm.COMM_WORLD
    if comm.rank == 0:
        time.sleep(0.3)         # everyone else polls while rank 0 is late
    x = np.full(10, comm.rank, dtype=np.int64)
    req = comm.Iallreduce(pycomm.IN_PLACE, x)
    polls = 0
    deadline = time.monotonic() + 60
    while not req.Test():
        polls += 1
        assert time.monotonic() < deadline, "Test never returned True"
        time.sleep(0.001)
    st = pycomm.Status()
    reqs = [comm.Ibarrier(), comm.Ibcast(x, 0)]
    while not pycomm.Request.Testall(reqs):
        pass
    return polls, x.tolist(), req.Test(st)


def test_test_polling_until_done(world_small):
    s = world_small.size
    for rank, (polls, x, again) in enumerate(world_small.run(_rank_test_polling)):
        assert x == [s * (s - 1) // 2] * 10 and again
        if s > 1 and rank > 0:
            assert polls > 0, f"rank {rank}: Test returned True before rank 0 posted"


def _rank_background_progress():
    """No pycomm call between posting and completion: the progress thread must finish."""
    comm = pycomm.COMM_WORLD
    x = np.full(BIG, 1.0)
    req = comm.Iallreduce(pycomm.IN_PLACE, x)
    t0 = time.monotonic()
    while not req.done and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    done = req.done
    req.Wait()
    return done, float(x[0])


def test_progress_without_waiting(world_small):
    for rank, (done, x0) in enumerate(world_small.run(_rank_background_progress)):
        assert done, f"rank {rank}: the collective did not progress in the background"
        assert x0 == world_small.size


# -- errors --------------------------------------------------------------------------------

def _rank_bad_args():
    comm = pycomm.COMM_WORLD
    size = comm.size
    worker = pycomm.nbc._worker_for(comm._engine)
    seq = comm._calls.seq
    f = np.zeros(4)
    attempts = {
        "Iallreduce size": lambda: comm.Iallreduce(np.zeros(3), f),
        "Iallreduce dtype": lambda: comm.Iallreduce(np.zeros(4, np.int32), f),
        "Iallreduce op": lambda: comm.Iallreduce(np.zeros(2, complex), np.zeros(2, complex),
                                                 op=pycomm.MAX),  # message: see below
        "Iallreduce op type": lambda: comm.Iallreduce(f.copy(), f, op="sum"),
        "Ibcast root": lambda: comm.Ibcast(f, size),
        "Igather root": lambda: comm.Igather(f, np.zeros(4 * size), root=-1),
        "Iallgather count": lambda: comm.Iallgather(f, np.zeros(4 * size + 1)),
        "Ialltoall count": lambda: comm.Ialltoall(np.zeros(size), np.zeros(2 * size)),
        "Ireduce_scatter_block": lambda: comm.Ireduce_scatter_block(np.zeros(size), f),
        "Igatherv counts": lambda: comm.Igatherv(f, [np.zeros(4 * size), [4] * (size + 1)],
                                                 root=comm.rank),
        "Iallgatherv overrun": lambda: comm.Iallgatherv(f, [np.zeros(4 * size),
                                                            [5] * size]),
        "Iscan size": lambda: comm.Iscan(np.zeros(3), f),
        "Iexscan non-contiguous": lambda: comm.Iexscan(np.zeros(8)[::2], f),
    }
    if size > 1:    # every rank a receiver: each names another root
        attempts["Ibcast read-only"] = lambda: comm.Ibcast(_readonly(4), (comm.rank + 1) % size)
    out = {}
    for what, fn in attempts.items():
        try:
            fn()
            out[what] = "posted"
        except pycomm.ArgumentError as exc:
            out[what] = "ok" if f"rank {comm.rank}" in str(exc) or what == "Iallreduce op" \
                else f"message: {exc}"
    out["queued"] = worker.tasks.qsize()
    # every refused call is counted, on every rank alike, so the next one matches
    out["seq moved"] = comm._calls.seq - seq - len(attempts)
    try:    # an unknown algorithm is refused at post time too (after the sequence number)
        comm.Iallreduce(pycomm.IN_PLACE, f, algorithm="no_such_algorithm")
        out["algorithm"] = "posted"
    except pycomm.ArgumentError as exc:
        out["algorithm"] = "ok" if "no_such_algorithm" in str(exc) else f"message: {exc}"
    out["queued"] += worker.tasks.qsize()
    # nothing half-posted: a valid one right after works
    x = np.full(2, 1.0)
    comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
    out["then"] = x.tolist()
    return out


def _readonly(n: int) -> np.ndarray:
    a = np.zeros(n)
    a.flags.writeable = False
    return a


def test_bad_arguments_raise_at_post_time_before_anything_is_queued(world_small):
    for rank, got in enumerate(world_small.run(_rank_bad_args)):
        then = got.pop("then")
        assert got.pop("queued") == 0 and got.pop("seq moved") == 0, f"rank {rank}"
        assert all(v == "ok" for v in got.values()), f"rank {rank}: {got}"
        assert then == [float(world_small.size)] * 2


def _rank_mismatch_in_schedule():
    comm = pycomm.COMM_WORLD
    root = comm.size - 1
    n = 4 if comm.rank == root else 2          # the root expects more than the others send
    recv = np.zeros(4 * comm.size) if comm.rank == root else None
    req = comm.Igather(np.ones(n), recv, root, algorithm="linear")
    try:        # polled with Test: the schedule's error is raised by Test, as by Wait
        deadline = time.monotonic() + 30
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
        res = "completed" if req.done else "hung"
    except pycomm.CollectiveMismatchError as exc:
        res = "mismatch" if "Gather(root=" in str(exc) else f"message: {exc}"
    # the mismatch abandons the next call on every rank (so that a rank that finished
    # its part hears of it), and the progress thread carries on after that
    x = np.ones(3)
    try:
        comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
        nxt = "completed"
    except pycomm.CollectiveMismatchError:
        nxt = "mismatch"
    x = np.ones(3)
    comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
    return res, nxt, x.tolist()


def test_error_inside_schedule_surfaces_on_wait(world_small):
    s = world_small.size
    if s == 1:
        pytest.skip("needs a peer")
    for rank, (res, nxt, x) in enumerate(world_small.run(_rank_mismatch_in_schedule)):
        # the root sees the mismatch; a leaf that only sends may have finished first
        assert res == "mismatch" or (rank != s - 1 and res == "completed"), f"rank {rank}"
        assert nxt == "mismatch", f"rank {rank}"
        assert x == [float(s)] * 3


def _rank_timeout_in_schedule():
    world = pycomm.COMM_WORLD
    d = world.Dup()
    out = None
    if world.rank == 0:
        engine = d._engine
        saved = engine.timeout
        engine.timeout = 0.3                   # the schedule's own waits use this limit
        try:
            req = d.Ibarrier()                 # nobody else joins
            t0 = time.monotonic()
            try:
                req.Wait(timeout=30)
                out = "completed"
            except pycomm.CommTimeoutError:
                out = ("CommTimeoutError", time.monotonic() - t0 < 10)
        finally:
            engine.timeout = saved
    d.Free()
    world.Barrier()
    return out


def test_timeout_inside_schedule_surfaces_on_wait(world_small):
    if world_small.size == 1:
        pytest.skip("needs a peer")
    assert world_small.run(_rank_timeout_in_schedule)[0] == ("CommTimeoutError", True)


def _rank_wait_timeout_then_complete():
    world = pycomm.COMM_WORLD
    d = world.Dup()
    out = None
    if world.rank == 0:
        req = d.Ibarrier()                     # the others join only after a world barrier
        t0 = time.monotonic()
        try:
            req.Wait(timeout=0.3)              # the caller's own limit, not the schedule's
            out = ["completed early"]
        except pycomm.CommTimeoutError as exc:
            out = ["CommTimeoutError", time.monotonic() - t0 < 5, "rank 0" in str(exc)]
        world.Barrier()
        pycomm.Request.Waitall([req], timeout=30)  # still pending; completes now
        out.append(req.Test())
    else:
        world.Barrier()
        d.Ibarrier().Wait(timeout=30)
    d.Free()
    return out


def test_wait_timeout_on_a_pending_collective_leaves_it_pending(world_small):
    """Wait(timeout=) on a nonblocking collective gives up after the caller's limit; the
    collective goes on and completes once the other ranks post theirs."""
    if world_small.size == 1:
        pytest.skip("needs a peer")
    assert world_small.run(_rank_wait_timeout_then_complete)[0] == [
        "CommTimeoutError", True, True, True]


def _rank_op_message():
    comm = pycomm.COMM_WORLD
    try:
        comm.Iallreduce(np.zeros(2, complex), np.zeros(2, complex), op=pycomm.MAX)
    except pycomm.ArgumentError as exc:
        return str(exc)
    return "posted"


def test_op_dtype_error_names_the_rank(world_small):
    for rank, msg in enumerate(world_small.run(_rank_op_message)):
        assert f"rank {rank}" in msg and "op" in msg, msg


def _rank_wake_latency(rounds: int):
    comm = pycomm.COMM_WORLD
    comm.Ibarrier().Wait()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        comm.Ibarrier().Wait()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def test_wait_wakes_up_when_the_schedule_completes(world_small, request):
    """A waiter must not sleep out its whole wait slice after the collective completed."""
    if world_small.size != 2:
        pytest.skip("one pair is enough")
    medians = world_small.run(_rank_wake_latency, 20)
    assert max(medians) < 0.02, f"median Ibarrier+Wait {max(medians) * 1e3:.1f} ms"
