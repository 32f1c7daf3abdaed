"""The split all-reduce through shared-memory slots (pycomm.shmcoll: at least
``SPLIT_MIN_BYTES`` on at least ``SPLIT_MIN_RANKS`` ranks with a core each, each rank
reduces one slice of every slot, then copies every other slice from its owner). The tests
force it where ranks outnumber cores (as on a 2-core machine) and count that it ran.

* it is chosen with a core per rank only (``SPLIT_MAX_OVERSUBSCRIPTION``);

* its result is the rank-order fold of every contribution, bit for bit (numpy's answer
  computed in rank order), for counts that do not divide among the ranks, in place and
  not, built-in ops, a user-defined op and several dtypes; and the same bits as the flat
  kernel (every rank folding every slot);
* a random schedule of split, flat and message all-reduces with ranks delayed at random
  keeps every result right (no slot is rewritten while a peer still copies from it);
* a rank that fails between the two steps abandons the call on every rank (none waits
  for its slice), and the communicator is usable after.
"""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import World
from pycomm import shmcoll

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPLIT_WORLDS = [(4, "shm"), (5, "shm")]
_NUMPY = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "BXOR": np.bitwise_xor}


@pytest.fixture(scope="session", params=SPLIT_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    return World(*request.param)


class _split:
    """In this rank: the split kernel whatever the cores (plans made again on entry and
    exit), counting the calls that took it (``.count``)."""

    def __init__(self, forced: bool = True):
        self.forced, self.count = forced, 0

    def __enter__(self):
        self.saved = (shmcoll.SPLIT_MAX_OVERSUBSCRIPTION, shmcoll.SharedSlots.await_reduced)
        if self.forced:
            shmcoll.SPLIT_MAX_OVERSUBSCRIPTION = float("inf")
        wait = self.saved[1]

        def counted(slots, cc, p):
            self.count += 1
            return wait(slots, cc, p)
        shmcoll.SharedSlots.await_reduced = counted
        pycomm.config.reload()
        return self

    def __exit__(self, *exc):
        shmcoll.SPLIT_MAX_OVERSUBSCRIPTION, shmcoll.SharedSlots.await_reduced = self.saved
        pycomm.config.reload()


def _inputs(rank: int, count: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + count)
    if np.dtype(dtype).kind == "f":
        return (rng.random(count) * 3 - 1).astype(dtype)
    return rng.integers(1, 50, count).astype(dtype)


def _path(comm, count, dtype, op) -> str:
    plan = pycomm.plan.plan_call(comm, "allreduce", np.dtype(dtype), count,
                                 count * np.dtype(dtype).itemsize, None, op)
    return plan[4][1] if plan[4] is not None else plan[1]


def _cases():
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    user = pycomm.Op.Create(lambda a, b, dt: np.add(a, b, out=b), commute=True)
    bad, paths = [], set()
    limit = pycomm.config.get("PYCOMM_SHM_COLL_BYTES")
    with _split() as split:
        calls = _fold_cases(comm, r, n, user, limit, bad, paths)
    user.Free()
    return bad, sorted(paths), split.count == calls > 0


def _fold_cases(comm, r, n, user, limit, bad, paths) -> int:
    calls = 0
    for dtype in (np.float32, np.float64, np.int32):
        item = np.dtype(dtype).itemsize
        for count in (shmcoll.SPLIT_MIN_BYTES // item, shmcoll.SPLIT_MIN_BYTES // item + 7,
                      limit // item - 1, limit // item):
            for name in ("SUM", "PROD", "MAX", "MIN", "BXOR", "user"):
                if name == "BXOR" and np.dtype(dtype).kind == "f":
                    continue
                op = user if name == "user" else getattr(pycomm, name)
                fn = np.add if name == "user" else _NUMPY[name]
                every = [_inputs(k, count, dtype) for k in range(n)]
                want = every[0].copy()
                for x in every[1:]:
                    want = fn(want, x)
                got = np.full(count, 7, dtype)
                comm.Allreduce(every[r], got, op=op)
                inplace = every[r].copy()
                comm.Allreduce(pycomm.IN_PLACE, inplace, op=op)
                calls += 2
                paths.add(_path(comm, count, dtype, op))
                if not (got.tobytes() == want.tobytes() == inplace.tobytes()):
                    bad.append((np.dtype(dtype).str, count, name))
    return calls


def test_the_split_gives_the_rank_order_fold_bit_for_bit(world):
    for rank, (bad, paths, every_call_split) in enumerate(world.run(_cases)):
        assert bad == [], (rank, bad[:5])
        assert paths == ["shared_slots"], (rank, paths)
        assert every_call_split, rank


def _default_choice():
    comm = pycomm.COMM_WORLD
    with _split(forced=False) as split:
        x = np.ones(8192)
        comm.Allreduce(pycomm.IN_PLACE, x)
    return comm._selection.oversubscription(), split.count, float(x[0])


def test_the_split_is_chosen_with_a_core_per_rank_only(world):
    for over, count, first in world.run(_default_choice):
        assert count == (1 if over <= shmcoll.SPLIT_MAX_OVERSUBSCRIPTION else 0), over
        assert first == world.size


def _split_against_flat():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    out = {}
    counts = {}
    for label, forced in (("split", True), ("flat", False)):
        saved = shmcoll.SPLIT_MIN_BYTES
        if not forced:
            shmcoll.SPLIT_MIN_BYTES = 1 << 40
        try:
            with _split(forced) as split:
                x = _inputs(r, 12345, np.float32)
                comm.Allreduce(pycomm.IN_PLACE, x)
        finally:
            shmcoll.SPLIT_MIN_BYTES = saved
        out[label], counts[label] = x.tobytes(), split.count
    return out["split"] == out["flat"], len(out["split"]), counts


def test_the_split_and_the_flat_kernel_give_the_same_bits(world):
    want = (True, 12345 * 4, {"split": 1, "flat": 0})
    assert world.run(_split_against_flat) == [want] * world.size


def _random_schedule(seed, rounds):
    """Split, flat and message all-reduces mixed, each rank sleeping at random before it
    enters, results rewritten as soon as the call returns."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    rng = np.random.default_rng(seed)        # the same schedule on every rank
    mine = np.random.default_rng(seed + 97 * r)
    bad = []
    with _split():
        _schedule(comm, r, n, rng, mine, rounds, bad)
    return bad


def _schedule(comm, r, n, rng, mine, rounds, bad) -> None:
    for i in range(rounds):
        count = int(rng.choice([3, 700, 4096, 5000, 8192, 12000]))
        alg = rng.choice(["none", "none", "none", "ring"])
        x = np.full(count, float(r + i))
        if mine.random() < 0.3:
            time.sleep(mine.random() * 0.003)
        comm.Allreduce(pycomm.IN_PLACE, x, algorithm=None if alg == "none" else str(alg))
        want = sum(k + i for k in range(n))
        if not (x == want).all():
            bad.append((i, count, str(alg), float(x.min()), float(x.max()), want))
        x[...] = -1.0


def test_random_schedule_with_delays_keeps_every_result_right(world):
    for rank, bad in enumerate(world.run(_random_schedule, 3, 80)):
        assert bad == [], (rank, bad[:3])


def _failure_between_the_steps(folder: str):
    """Rank 1's user op raises while it reduces its slice: the others wait for its slice
    in the second step and must learn that the call is abandoned. Each peer leaves a file
    in ``folder`` as it enters the second step; rank 1's op raises once all are there (on
    a loaded machine a peer still in the exchange would learn of the abort there, and the
    test would not show what it is for)."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    files = [os.path.join(folder, f"second-step-{k}") for k in range(n) if k != 1]

    def add(a, b, dt):
        if comm.rank == 1:
            deadline = time.monotonic() + 8.0
            while not all(map(os.path.exists, files)) and time.monotonic() < deadline:
                time.sleep(0.005)
            raise ValueError("rank 1's op refuses")
        np.add(a, b, out=b)

    def entered(slots, cc, p):      # (rank 1 never gets here: its op raised)
        open(os.path.join(folder, f"second-step-{r}"), "w").close()
        return counted(slots, cc, p)

    op = pycomm.Op.Create(add, commute=True)
    x = np.ones(8192)                        # 64 KiB: the split kernel on 4-5 ranks
    t = time.monotonic()
    with _split() as split:
        counted = shmcoll.SharedSlots.await_reduced
        shmcoll.SharedSlots.await_reduced = entered     # (_split's exit restores it)
        try:
            comm.Allreduce(pycomm.IN_PLACE, x, op=op)
            first = "completed"
        except Exception as exc:             # noqa: BLE001 (rank 1: ValueError)
            first = type(exc).__name__
            if r != 1:      # the peers' error says where rank 1's op raised
                assert "(ValueError: rank 1: rank 1's op refuses at " in str(exc) and \
                    " in add)" in str(exc), str(exc)
    took = time.monotonic() - t
    if r != 1:
        assert split.count == 1             # the others waited in the split's second step
    op.Free()
    after = []
    for _ in range(3):      # the call after an abandoned one may be abandoned too, by design
        y = np.full(8192, float(r))
        try:
            comm.Allreduce(pycomm.IN_PLACE, y)
            after.append(float(y[0]))
        except pycomm.CommError as exc:
            after.append(type(exc).__name__)
    return first, took, after


def test_a_rank_that_fails_between_the_steps_never_leaves_a_peer_waiting(world, tmp_path):
    n = world.size
    results = world.run(_failure_between_the_steps, str(tmp_path))
    for rank, (first, took, after) in enumerate(results):
        assert first == ("ValueError" if rank == 1 else "CollectiveError"), (rank, first)
        assert took < 10.0, (rank, took)                 # no rank waited for a timeout
        assert after[-1] == n * (n - 1) / 2, (rank, after)
