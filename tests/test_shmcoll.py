"""Small collectives through shared-memory slots (pycomm.shmcoll): results, choice,
integrity and failures.

* every collective the slots serve gives numpy's answer, in rank order and with the same
  bits on every rank, for every op kind (ufunc, pair kernel, non-commutative user op),
  several dtypes and counts up to the slot's limit, on 2..8 ranks;
* the slots are taken exactly where promised: a one-host shared-memory communicator,
  per-rank data up to ``PYCOMM_SHM_COLL_BYTES``, no algorithm named; messages otherwise
  (a larger call, ``algorithm=``, ``PYCOMM_SHM_COLL_BYTES=0``, a context id past the
  area, TCP);
* a random schedule mixing slot and message calls, with ranks delayed at random, keeps
  every result right (a slot is never rewritten while a peer may read it);
* a rank whose call takes messages while the others take slots (its I-variant, or a
  count past the limit) makes them take messages too: the call completes, or fails as a
  mismatch, never hangs (failures in whole launched jobs, a dead or departed peer among
  them: ``tests/test_shmcoll_jobs.py``).
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import World
from pycomm.plan import SHARED_SLOTS, plan_call
from pycomm.shmcoll import MAX_COMMS, area_bytes

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SLOT_WORLDS = [(2, "shm"), (3, "shm"), (5, "shm"), (8, "shm")]
LIMIT = pycomm.config.VARS["PYCOMM_SHM_COLL_BYTES"].default


@pytest.fixture(scope="session", params=SLOT_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    return World(*request.param)


def _keep_left(invec, inoutvec, datatype):
    """Associative, not commutative: a op b = a (so the result is rank 0's)."""
    inoutvec[:] = invec


KEEP_LEFT = pycomm.Op.Create(_keep_left, commute=False)


def _contribution(rank: int, count: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(count).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dt)
    return rng.integers(1, 5, count).astype(dt)


def _fold(values, op):
    """Rank order, left to right: the order (and so the bits) the slots promise."""
    if op is KEEP_LEFT:
        return values[0].copy()
    fn = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "BAND": np.bitwise_and}[op.name]
    return functools.reduce(lambda a, b: fn(a, b), values[1:], values[0].copy())


def _used_slots(comm, collective, dtype, count, nbytes, op=None, root=-1) -> bool:
    plan = plan_call(comm, collective, dtype, count, nbytes, None, op, root)
    return plan[4] is not None and plan[4][1] == SHARED_SLOTS


def _every_collective(count, dtype, op_name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # e.g. numpy's on np.maximum(a, b, out)
        return _every_collective_calls(count, dtype, op_name)


def _every_collective_calls(count, dtype, op_name):
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    op = KEEP_LEFT if op_name == "KEEP_LEFT" else getattr(pycomm, op_name)
    mine = _contribution(r, count, dtype)
    every = [_contribution(k, count, dtype) for k in range(n)]
    want = _fold(every, op)
    dt = np.dtype(dtype)
    out = {}
    recv = np.empty_like(mine)
    comm.Allreduce(mine, recv, op=op)
    out["allreduce"] = recv
    inplace = mine.copy()
    comm.Allreduce(pycomm.IN_PLACE, inplace, op=op)
    out["allreduce-in-place"] = inplace
    red = np.zeros_like(mine)
    comm.Reduce(mine, red, op=op, root=n - 1)
    out["reduce"] = red if r == n - 1 else want
    root = 1 % n
    b = mine.copy()
    comm.Bcast(b, root=root)
    out["bcast"] = b
    block = min(count, max(count // n, 1))
    g = np.empty(block * n, dt)
    comm.Allgather(mine[:block], g)
    out["allgather"] = g
    rs = np.empty(block, dt)
    comm.Reduce_scatter_block(np.tile(mine[:block], n), rs, op=op)
    out["reduce_scatter_block"] = rs
    # alltoall: block j of rank r's buffer, for rank j, is the contribution of "rank"
    # 1000 + r * n + j (a different one for every pair)
    a2a_send = np.concatenate([_contribution(1000 + r * n + j, block, dtype) for j in range(n)])
    a2a = np.empty(block * n, dt)
    comm.Alltoall(a2a_send, a2a)
    out["alltoall"] = a2a
    a2a_in = a2a_send.copy()
    comm.Alltoall(pycomm.IN_PLACE, a2a_in)
    out["alltoall-in-place"] = a2a_in
    comm.Barrier()
    took = {
        "allreduce": _used_slots(comm, "allreduce", dt, count, mine.nbytes, op),
        "bcast": _used_slots(comm, "bcast", dt, count, mine.nbytes, root=root),
        "allgather": _used_slots(comm, "allgather", dt, block, block * n * dt.itemsize),
        "barrier": _used_slots(comm, "barrier", None, -1, 0),
        "alltoall": _used_slots(comm, "alltoall", dt, block, block * n * dt.itemsize),
    }
    expect = {"allreduce": want, "allreduce-in-place": want, "reduce": want,
              "bcast": every[root],
              "allgather": np.concatenate([e[:block] for e in every]),
              "reduce_scatter_block": _fold([e[:block] for e in every], op),
              "alltoall": np.concatenate([_contribution(1000 + k * n + r, block, dtype)
                                          for k in range(n)])}
    expect["alltoall-in-place"] = expect["alltoall"]
    wrong = [k for k in expect if not np.array_equal(out[k], expect[k])]
    return wrong, took, {k: v.tobytes() for k, v in out.items()}


@pytest.mark.parametrize("dtype,count,op", [
    (np.float64, 1, "SUM"), (np.float64, 1024, "SUM"), (np.float32, 7, "PROD"),
    (np.int32, 100, "MAX"), (np.int8, 33, "MIN"), (np.int64, 16, "BAND"),
    (np.complex128, 5, "SUM"), (np.float64, 64, "KEEP_LEFT"), (np.float64, 0, "SUM")])
def test_every_slot_collective_gives_numpys_answer_in_rank_order(world, dtype, count, op):
    results = world.run(_every_collective, count, dtype, op)
    for rank, (wrong, took, _) in enumerate(results):
        assert wrong == [], (rank, wrong)
        assert all(took.values()), (rank, took)      # these shapes do take the slots
    # every rank holds the same bits (rank order on every rank, not its own order)
    for key in ("allreduce", "allreduce-in-place", "bcast", "allgather"):
        assert len({res[2][key] for res in results}) == 1, key


def _pairs_maxloc():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    dt = pycomm.ops.pair_dtype(np.float64)
    x = np.zeros(3, dt)
    x["val"] = [r % 2, -r, 5.0]        # ties on the last element: the lowest index wins
    x["idx"] = r
    out = np.zeros_like(x)
    comm.Allreduce(x, out, op=pycomm.MAXLOC)
    return out["val"].tolist(), out["idx"].tolist(), \
        _used_slots(comm, "allreduce", dt, 3, x.nbytes, pycomm.MAXLOC)


def test_pair_kernel_op_through_the_slots(world):
    n = world.size
    for values, index, took in world.run(_pairs_maxloc):
        assert took
        assert values == [1.0 if n > 1 else 0.0, 0.0, 5.0]
        assert index == [1 if n > 1 else 0, 0, 0]


def _choices():
    comm = pycomm.COMM_WORLD
    f8 = np.dtype(np.float64)
    per = LIMIT // 8
    return {
        "at-limit": _used_slots(comm, "allreduce", f8, per, LIMIT, pycomm.SUM),
        "over-limit": _used_slots(comm, "allreduce", f8, per + 1, LIMIT + 8, pycomm.SUM),
        "allgather-block-at-limit": _used_slots(comm, "allgather", f8, per,
                                                per * 8 * comm.size),
        "named": plan_call(comm, "allreduce", f8, 1, 8, "ring", pycomm.SUM)[4] is not None,
        "auto": plan_call(comm, "allreduce", f8, 1, 8, "auto", pycomm.SUM)[4] is not None,
        "gather": plan_call(comm, "gather", f8, 1, 8 * comm.size, None)[4] is not None,
    }


def test_slots_are_taken_exactly_where_promised(world):
    for took in world.run(_choices):
        assert took == {"at-limit": True, "over-limit": False,
                        "allgather-block-at-limit": True, "named": False, "auto": True,
                        "gather": False}


def _override_env():
    comm = pycomm.COMM_WORLD
    os.environ["PYCOMM_ALGORITHM_ALLREDUCE"] = "recursive_doubling"
    try:
        pycomm.config.reload()
        forced = plan_call(comm, "allreduce", np.dtype(np.float64), 1, 8, None,
                           pycomm.SUM)[4] is not None
        x = np.ones(4)
        comm.Allreduce(pycomm.IN_PLACE, x)
    finally:
        del os.environ["PYCOMM_ALGORITHM_ALLREDUCE"]
        pycomm.config.reload()
    return forced, x.tolist()


def _override_auto():
    comm = pycomm.COMM_WORLD
    os.environ["PYCOMM_ALGORITHM_ALLREDUCE"] = "auto"
    try:
        pycomm.config.reload()
        return plan_call(comm, "allreduce", np.dtype(np.float64), 1, 8, None,
                         pycomm.SUM)[4] is not None
    finally:
        del os.environ["PYCOMM_ALGORITHM_ALLREDUCE"]
        pycomm.config.reload()


def test_an_override_of_auto_keeps_the_slots(world):
    assert world.run(_override_auto) == [True] * world.size


def test_a_forced_algorithm_is_honoured(world):
    for forced, x in world.run(_override_env):
        assert not forced and x == [float(world.size)] * 4


def _schedule(seed, steps):
    """The same random schedule on every rank (seeded); random delays differ per rank."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    plan = np.random.default_rng(seed)
    jitter = np.random.default_rng(seed * 100 + r)
    wrong = []
    for step in range(steps):
        kind = plan.integers(0, 6)
        big = plan.random() < 0.2                   # a call past the limit: messages
        count = 2000 if big else int(plan.integers(1, 64))
        root = int(plan.integers(0, n))
        if jitter.random() < 0.1:
            time.sleep(float(jitter.random()) * 0.003)
        vals = [np.arange(count, dtype=np.float64) * (k + 1) + step for k in range(n)]
        mine = vals[r].copy()
        if kind == 0:
            comm.Allreduce(pycomm.IN_PLACE, mine)
            ok = np.array_equal(mine, functools.reduce(np.add, vals[1:], vals[0].copy()))
        elif kind == 1:
            comm.Bcast(mine, root=root)
            ok = np.array_equal(mine, vals[root])
        elif kind == 2:
            out = np.empty(count * n)
            comm.Allgather(mine, out)
            ok = np.array_equal(out, np.concatenate(vals))
        elif kind == 3:
            out = np.zeros(count)
            comm.Reduce(mine, out, root=root)
            ok = r != root or np.array_equal(out, functools.reduce(np.add, vals[1:],
                                                                   vals[0].copy()))
        elif kind == 4:
            # alltoall: rank k's block for rank j is vals[k] + 1000 * j
            out = np.empty(count * n)
            comm.Alltoall(np.concatenate([mine + 1000 * j for j in range(n)]), out)
            ok = np.array_equal(out, np.concatenate([v + 1000 * r for v in vals]))
        else:
            comm.Barrier()
            ok = True
        if not ok:
            wrong.append((step, int(kind), count, root))
    return wrong


def test_random_schedule_with_delays_keeps_every_result_right(world):
    for rank, wrong in enumerate(world.run(_schedule, 7, 300)):
        assert wrong == [], (rank, wrong[:5])


def _sub_communicators():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    half = comm.Split(r % 2, r)
    x = np.array([float(r)])
    half.Allreduce(pycomm.IN_PLACE, x)
    dups = [comm.Dup() for _ in range(MAX_COMMS + 1)]   # more alive than the area holds
    last = dups[-1]
    y = np.array([1.0])
    last.Allreduce(pycomm.IN_PLACE, y)
    # a communicator with a block of the area has slots (pycomm.slotblocks)
    out = (x[0], (half._slots is not None) == (half._block > 0 and half.size > 1),
           last._block, last._slots is None, y[0])
    for d in dups:
        d.Free()
    half.Free()
    return out


def test_sub_communicators_use_their_own_slots_and_those_past_the_area_messages(world):
    n = world.size
    for r, (x, half_slots, block, last_messages, y) in enumerate(world.run(_sub_communicators)):
        assert x == sum(k for k in range(n) if k % 2 == r % 2)
        assert half_slots
        assert block == -1 and last_messages
        assert y == n


def _slots_against_messages():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    per = LIMIT // 8
    t0 = time.monotonic()
    try:
        # rank 0 is one element past the limit (messages), the others at it (slots)
        comm.Allreduce(pycomm.IN_PLACE, np.ones(per + 1 if r == 0 else per))
        first = "ok"
    except pycomm.CommError as exc:
        first = f"{type(exc).__name__}: {exc}"
    after = []
    for _ in range(3):
        try:
            x = np.ones(4)
            comm.Allreduce(pycomm.IN_PLACE, x)
            after.append(x[0])
        except pycomm.CommError as exc:
            after.append(type(exc).__name__)
    return first, after, time.monotonic() - t0


def test_a_count_past_the_limit_on_one_rank_is_a_mismatch_not_a_hang(world):
    for rank, (first, after, took) in enumerate(world.run(_slots_against_messages)):
        assert first.startswith("Collective"), (rank, first)
        assert after[-1] == world.size, (rank, after)    # usable again
        assert took < 5.0, (rank, took)                  # no rank waited for a timeout
    texts = " ".join(res[0] for res in world.run(_slots_against_messages))
    assert "by messages" in texts or f"float64x{LIMIT // 8 + 1}" in texts, texts


def _blocking_against_nonblocking():
    """pycomm lets a blocking call match its I-variant (MPI does not promise it): the
    ranks in the slots see the nonblocking rank's arrival and take messages too."""
    from pycomm import trace
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    paths = {}                          # blocking call -> its path in the flight recorder

    def blocking(name, call, *args, **kw):
        call(*args, **kw)
        paths[name] = trace.last_completed()[0][4]
    x = np.full(8, float(r + 1))
    if r == 0:
        comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
    else:
        blocking("Allreduce", comm.Allreduce, pycomm.IN_PLACE, x)
    y = np.full(4, 5.0 if r == n - 1 else 0.0)
    if r == 1 % n:
        comm.Ibcast(y, root=n - 1).Wait()
    else:
        blocking("Bcast", comm.Bcast, y, root=n - 1)
    comm.Ibarrier().Wait() if r == 0 else blocking("Barrier", comm.Barrier)
    a = np.zeros(2 * n)
    send = np.arange(2 * n, dtype=np.float64) + 100 * r     # block j: 2j, 2j+1 (+ 100 r)
    comm.Ialltoall(send, a).Wait() if r == n - 1 else blocking("Alltoall", comm.Alltoall,
                                                                 send, a)
    z = np.ones(2)
    blocking("Allreduce again", comm.Allreduce, pycomm.IN_PLACE, z)   # the slots again
    return x.tolist(), y.tolist(), z.tolist(), a.tolist(), r, paths


def test_a_blocking_call_matches_its_nonblocking_twin(world):
    """... and the flight recorder shows that the blocking calls ran by messages (each
    begun as a call through the slots), then the next one through the slots."""
    n = world.size
    for x, y, z, a, r, paths in world.run(_blocking_against_nonblocking):
        assert x == [n * (n + 1) / 2] * 8 and y == [5.0] * 4 and z == [float(n)] * 2
        assert a == [v for k in range(n) for v in (2 * r + 100 * k, 2 * r + 1 + 100 * k)]
        if n > 1:
            assert paths.pop("Allreduce again") == SHARED_SLOTS, (r, paths)
            assert paths and set(paths.values()) == {"messages"}, (r, paths)


def _beside_a_nonblocking_collective(rounds):
    """Slot calls in this thread while the progress thread runs a large Iallreduce on the
    same communicator (posted first, as MPI orders collectives) and on a duplicate."""
    comm = pycomm.COMM_WORLD
    dup = comm.Dup()
    r, n = comm.rank, comm.size
    bad = []
    for i in range(rounds):
        big = np.full(200_000, float(r + i))
        other = np.full(50_000, 1.0)
        reqs = [comm.Iallreduce(pycomm.IN_PLACE, big), dup.Iallreduce(pycomm.IN_PLACE, other)]
        for j in range(5):
            x = np.full(3, float(r * j + i))
            comm.Allreduce(pycomm.IN_PLACE, x)
            y = np.array([float(r)])
            dup.Bcast(y, root=j % n)
            if x[0] != sum(k * j + i for k in range(n)) or y[0] != j % n:
                bad.append((i, j, x[0], y[0]))
        pycomm.Request.Waitall(reqs)
        if big[0] != sum(k + i for k in range(n)) or other[0] != n:
            bad.append((i, "big", big[0], other[0]))
    dup.Free()
    return bad


def test_slot_calls_beside_a_nonblocking_collective_in_flight(world):
    # 40 rounds: the caller's thread and the progress thread once both carried out one-sided
    # reads of the engine's outbox at the same time (a false "withdrawn by its sender" on 3
    # shm ranks); 4 rounds met it about once in a suite run, 40 in 4 of 6 runs
    for rank, bad in enumerate(world.run(_beside_a_nonblocking_collective, 40)):
        assert bad == [], (rank, bad[:4])


def _tcp_choices():
    comm = pycomm.COMM_WORLD
    return (comm._slots, comm.chosen_algorithm("allreduce", 8),
            comm.chosen_algorithm("barrier", 0))


def test_a_tcp_world_has_no_slots():
    for slots, allreduce, barrier in World(3, "tcp").run(_tcp_choices):
        assert slots is None and "shared_slots" not in (allreduce, barrier)


def test_ranks_of_a_host_that_disagree_on_the_area_size_fail_at_connect():
    import threading
    import uuid

    from test_transports import DictStore
    from transports import TransportError
    from transports.shm import ShmTransport
    store, job = DictStore(), "t" + uuid.uuid4().hex[:8]
    sizes = [area_bytes(LIMIT), area_bytes(2 * LIMIT)]
    ts = [ShmTransport(r, 2, job, b"k" * 32, None, coll_bytes=sizes[r]) for r in range(2)]
    errors: list = [None, None]

    def connect(r):
        try:
            ts[r].connect(store, [1 - r], 10.0)
        except Exception as exc:
            errors[r] = exc

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    try:
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        for t in ts:
            t.close()
    assert all(isinstance(e, TransportError) and "PYCOMM_SHM_COLL_BYTES differs" in str(e)
               for e in errors), errors
    assert not [f for f in os.listdir("/dev/shm") if job in f]     # nothing left behind


def _blocks_of_made_and_freed_communicators():
    """80 rounds of a communicator made by Dup, Split (the even and the odd ranks) or
    Create_group (the even ranks), one Allreduce on it, and Free: pycomm.slotblocks
    gives each a block again once its predecessors are freed on every member."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    wrong, without = [], 0
    evens = comm.group.Incl(list(range(0, n, 2)))
    for i in range(80):
        how = ("Dup", "Split", "Create_group")[i % 3]
        if how == "Dup":
            d = comm.Dup()
        elif how == "Split":
            d = comm.Split(r % 2, r)
        else:
            d = comm.Create_group(evens, tag=i) if r % 2 == 0 else None
        if d is None:
            continue
        x = np.array([float(i + r)])
        d.Allreduce(pycomm.IN_PLACE, x)
        members = [k for k in range(n) if how == "Dup" or k % 2 == r % 2]
        if x[0] != sum(i + k for k in members):
            wrong.append((how, i, x[0]))
        without += d.size > 1 and (d._block < 0 or d._slots is None)
        d.Free()
    return wrong, without


def test_communicators_made_and_freed_in_turn_keep_their_blocks(world):
    for wrong, without in world.run(_blocks_of_made_and_freed_communicators):
        assert wrong == [] and without == 0, (wrong[:5], without)
