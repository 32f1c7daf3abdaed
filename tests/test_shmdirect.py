"""Large all-reduces by direct reads of the peers' buffers (pycomm.shmdirect).

* every op with a numpy ufunc gives numpy's answer for every dtype kind, in place and
  not, for counts that do not divide among the ranks, fewer elements than ranks, and
  slices larger than one read chunk, with the same bits on every rank;
* the path is taken exactly where promised: a one-host shared-memory communicator, a
  blocking all-reduce of at least ``PYCOMM_SHM_DIRECT_BYTES`` with a commutative ufunc op
  and no algorithm named; messages otherwise;
* a random schedule of direct, slot and message calls with ranks delayed at random keeps
  every result right (no rank returns while a peer still reads its buffers);
* a peer that runs the call by messages (its Iallreduce), or with another count, makes the
  call complete by messages or fail as a mismatch, never hang; a peer that dies while the
  others wait in the call is a PeerError naming it; ranks that run Reduce_scatter_block or
  Allgather by their I-variant, beside ranks that block, make every rank take messages
  before anything is read, with numpy's answer everywhere;
* (without cross-memory attach the call sends messages; a rank whose call fails withdraws
  its buffers, and a descheduled peer that reads them after they were reused raises:
  test_shmdirect_withdrawal.py's launched jobs.)
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import World
from test_shmcoll import _contribution
from pycomm.plan import plan_call
from pycomm.shmdirect import ALLGATHER_MAX_BYTES, CHUNK_BYTES, SHM_DIRECT

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
DIRECT_WORLDS = [(2, "shm"), (3, "shm"), (5, "shm")]
_NUMPY = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "BAND": np.bitwise_and, "BXOR": np.bitwise_xor}


@pytest.fixture(scope="session", params=DIRECT_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    return World(*request.param)


class _threshold:
    """``PYCOMM_SHM_DIRECT_BYTES`` (and, with ``slots=False``, ``PYCOMM_SHM_COLL_BYTES=0``,
    so that small calls read directly too) set in this rank for a block."""

    def __init__(self, value: int, slots: bool = True):
        self.values = {"PYCOMM_SHM_DIRECT_BYTES": str(value)}
        if not slots:
            self.values["PYCOMM_SHM_COLL_BYTES"] = "0"

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)
        pycomm.config.reload()

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        pycomm.config.reload()


def _fold(values, op_name):
    """``values[0] op values[1] op ...`` by numpy."""
    fn = _NUMPY[op_name]
    out = values[0].copy()
    for v in values[1:]:
        out = fn(out, v)
    return out


def _direct(comm, dtype, count, op) -> bool:
    plan = plan_call(comm, "allreduce", np.dtype(dtype), count,
                     count * np.dtype(dtype).itemsize, None, op)
    return plan[4] is not None and plan[4][1] == SHM_DIRECT


def _allreduce_cases(cases, threshold):
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    out = []
    with _threshold(threshold, slots=False):
        for dtype, count, op_name in cases:
            op = getattr(pycomm, op_name)
            mine = _contribution(r, count, dtype)
            every = [_contribution(k, count, dtype) for k in range(n)]
            recv = np.full_like(mine, 7)
            comm.Allreduce(mine, recv, op=op)
            inplace = mine.copy()
            comm.Allreduce(pycomm.IN_PLACE, inplace, op=op)
            want = _fold(every, op_name)
            if np.dtype(dtype).kind in "fc":
                ok = np.allclose(recv, want, rtol=1e-5, atol=1e-5) and \
                    np.allclose(inplace, want, rtol=1e-5, atol=1e-5)
            else:
                ok = np.array_equal(recv, want) and np.array_equal(inplace, want)
            untouched = np.array_equal(mine, every[r])       # sendbuf is read only
            # digests of the result bits (a slice test's results are 20 MiB a rank)
            out.append((ok, untouched, _direct(comm, dtype, count, op),
                        hashlib.blake2b(recv).hexdigest(), hashlib.blake2b(inplace).hexdigest()))
    return out


CASES = [(np.float64, 1000, "SUM"), (np.float32, 999, "PROD"), (np.int32, 1001, "MAX"),
         (np.int8, 997, "MIN"), (np.int64, 129, "BAND"), (np.uint16, 300, "BXOR"),
         (np.complex128, 77, "SUM"), (np.float64, 2, "SUM"), (np.int32, 9, "SUM")]


def test_every_ufunc_op_gives_numpys_answer_with_the_same_bits_everywhere(world):
    results = world.run(_allreduce_cases, CASES, 8)
    for i, case in enumerate(CASES):
        per_rank = [res[i] for res in results]
        for rank, (ok, untouched, direct, _, _) in enumerate(per_rank):
            assert ok and untouched, (case, rank)
            assert direct, (case, rank)               # these calls did read directly
        assert len({res[3] for res in per_rank}) == 1, case     # same bits on every rank
        assert len({res[4] for res in per_rank}) == 1, case


def test_slices_larger_than_a_read_chunk(world):
    count = world.size * (CHUNK_BYTES // 8) + 3          # every slice spans two chunks
    cases = [(np.float64, count, "SUM"), (np.int64, count, "MAX")]
    for res in world.run(_allreduce_cases, cases, 1 << 16):
        assert [(ok, untouched, direct) for ok, untouched, direct, _, _ in res] == \
            [(True, True, True)] * 2


def _block_cases(cases, threshold):
    """Reduce_scatter_block and Allgather, in place and not, by direct reads."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    out = []
    with _threshold(threshold, slots=False):
        for dtype, count, op_name in cases:
            op = getattr(pycomm, op_name)
            dt = np.dtype(dtype)
            every = [_contribution(k, count * n, dtype) for k in range(n)]
            mine = every[r].copy()
            want = _fold([e[r * count:(r + 1) * count] for e in every], op_name)
            rs = np.full(count, 7, dt)
            comm.Reduce_scatter_block(mine, rs, op=op)
            inplace = mine.copy()
            comm.Reduce_scatter_block(pycomm.IN_PLACE, inplace, op=op)
            close = (lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-5)) \
                if dt.kind in "fc" else np.array_equal
            g = np.full(count * n, 7, dt)
            comm.Allgather(mine[:count], g)
            gin = np.full(count * n, 7, dt)
            gin[r * count:(r + 1) * count] = mine[:count]
            comm.Allgather(pycomm.IN_PLACE, gin)
            gwant = np.concatenate([e[:count] for e in every])
            rsb = plan_call(comm, "reduce_scatter_block", dt, count, count * n * dt.itemsize,
                            None, op)[4]
            ag = plan_call(comm, "allgather", dt, count, count * n * dt.itemsize, None)[4]
            ag_direct = count * n * dt.itemsize <= ALLGATHER_MAX_BYTES   # else messages
            out.append((close(rs, want), close(inplace[:count], want),
                        np.array_equal(g, gwant), np.array_equal(gin, gwant),
                        np.array_equal(mine, every[r]),
                        rsb is not None and rsb[1] == SHM_DIRECT,
                        (ag is not None and ag[1] == SHM_DIRECT) == ag_direct))
    return out


BLOCK_CASES = [(np.float64, 1000, "SUM"), (np.int32, 333, "MAX"), (np.float32, 1, "PROD"),
               (np.int64, CHUNK_BYTES // 8 + 5, "SUM"), (np.uint8, 0, "SUM"),
               (np.float32, 40_000, "MIN")]


def test_reduce_scatter_block_and_allgather_give_numpys_answer(world):
    for rank, res in enumerate(world.run(_block_cases, BLOCK_CASES, 8)):
        for case, got in zip(BLOCK_CASES, res):
            if case[1] == 0:            # an empty call: nothing read, still right
                assert all(got[:5]), (rank, case, got)
                continue
            assert got == (True,) * 7, (rank, case, got)


def _choices():
    comm = pycomm.COMM_WORLD
    f8 = np.dtype(np.float64)
    at = pycomm.config.VARS["PYCOMM_SHM_DIRECT_BYTES"].default
    big = at // 8
    user = pycomm.Op.Create(lambda a, b, dt: np.add(a, b, out=b), commute=True)
    out = {
        "default": comm.chosen_algorithm("allreduce", at),
        "below": comm.chosen_algorithm("allreduce", at - 8),
        "non-commutative": comm.chosen_algorithm("allreduce", at, commutative=False),
        "named": comm.chosen_algorithm("allreduce", at, algorithm="ring"),
        "auto": comm.chosen_algorithm("allreduce", at, algorithm="auto"),
        "user-op": _direct(comm, f8, big, user),
        "user-op named": comm.chosen_algorithm("allreduce", at, op=user),
        "sum named": comm.chosen_algorithm("allreduce", at, op=pycomm.SUM),
        "pair-op": _direct(comm, pycomm.ops.pair_dtype(np.float64), big, pycomm.MAXLOC),
        "reduce": plan_call(comm, "reduce", f8, big, at, None, pycomm.SUM, 0)[4] is not None,
    }
    out["reduce_scatter_block"] = comm.chosen_algorithm("reduce_scatter_block", at)
    # (each rank's block past the slots, which take a block of up to PYCOMM_SHM_COLL_BYTES)
    out["allgather"] = comm.chosen_algorithm(
        "allgather", max(at, (pycomm.config.get("PYCOMM_SHM_COLL_BYTES") + 8) * comm.size))
    out["allgather-large"] = comm.chosen_algorithm("allgather", ALLGATHER_MAX_BYTES + 8)
    out["nonblocking"] = comm.chosen_algorithm("allreduce", at, blocking=False)
    out["rsb-non-commutative"] = comm.chosen_algorithm("reduce_scatter_block", at,
                                                       commutative=False)
    with _threshold(0):
        out["off"] = comm.chosen_algorithm("allreduce", at)
    user.Free()
    return out


def test_direct_reads_are_taken_exactly_where_promised(world):
    for took in world.run(_choices):
        assert took["default"] == SHM_DIRECT and took["auto"] == SHM_DIRECT
        assert SHM_DIRECT not in (took["below"], took["non-commutative"], took["named"],
                                  took["off"])
        assert took["named"] == "ring"
        assert not took["user-op"] and not took["pair-op"] and not took["reduce"]
        # the call's own op: a commutative user-defined op sends messages, as the call does
        assert took["user-op named"] != SHM_DIRECT and took["sum named"] == SHM_DIRECT
        assert took["reduce_scatter_block"] == SHM_DIRECT == took["allgather"]
        assert took["allgather-large"] != SHM_DIRECT
        assert took["rsb-non-commutative"] != SHM_DIRECT
        assert took["nonblocking"] not in (SHM_DIRECT, "shared_slots")  # Iallreduce: messages


def test_a_tcp_world_never_reads_directly():
    def choice():
        return pycomm.COMM_WORLD.chosen_algorithm("allreduce", 16 << 20)
    assert SHM_DIRECT not in World(3, "tcp").run(choice)


def _random_schedule(seed, rounds):
    """Direct, slot and message all-reduces mixed, each rank sleeping at random between
    and inside them (by delaying its entry), buffers reused and rewritten at once."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    rng = np.random.default_rng(seed)        # the same schedule on every rank
    mine = np.random.default_rng(seed + 97 * r)
    bad = []
    with _threshold(4096):
        x = np.empty(0)
        for i in range(rounds):
            count = int(rng.choice([3, 700, 5000, 20000]))
            alg = rng.choice(["none", "none", "ring"])
            if x.size != count:
                x = np.empty(count)
            x[...] = r + i
            if mine.random() < 0.3:
                time.sleep(mine.random() * 0.003)
            comm.Allreduce(pycomm.IN_PLACE, x, algorithm=None if alg == "none" else alg)
            want = sum(k + i for k in range(n))
            if not (x == want).all():
                bad.append((i, count, str(alg), float(x[0]), want))
            x[...] = -1.0                    # a peer still reading would see this
    return bad


def test_random_schedule_with_delays_keeps_every_result_right(world):
    for rank, bad in enumerate(world.run(_random_schedule, 11, 60)):
        assert bad == [], (rank, bad[:3])


def _against_messages():
    """One rank enters by messages (Iallreduce): the others see it and take messages too.
    Then one rank passes another count: a mismatch, found before anything is read."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    with _threshold(4096):
        x = np.full(2000, float(r + 1))
        if r == n - 1:
            comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
        else:
            comm.Allreduce(pycomm.IN_PLACE, x)
        y = np.ones(2000 + (r == 0))
        t = time.monotonic()
        try:
            comm.Allreduce(pycomm.IN_PLACE, y)
            first = "completed"
        except pycomm.CommError as exc:
            first = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - t
        after = []
        for _ in range(3):          # the call after a mismatch is abandoned too, by design
            z = np.ones(2000)
            try:
                comm.Allreduce(pycomm.IN_PLACE, z)
                after.append(z[0])
            except pycomm.CommError as exc:
                after.append(type(exc).__name__)
    return x.tolist(), first, took, after


def test_a_peer_by_messages_or_with_another_count_never_hangs(world):
    n = world.size
    for rank, (x, first, took, after) in enumerate(world.run(_against_messages)):
        assert x == [n * (n + 1) / 2] * 2000, rank
        assert first.startswith("Collective"), (rank, first)
        assert took < 10.0, (rank, took)                 # no rank waited for a timeout
        assert after[-1] == n, (rank, after)             # usable again


def test_ranks_whose_limits_differ_take_messages_together(world):
    def mixed():
        comm = pycomm.COMM_WORLD
        r = comm.rank
        # rank 0: no slots (so the direct path from 4 KiB), the others: slots up to 8 KiB
        with _threshold(4096, slots=r != 0):
            x = np.full(750, r + 1.0)          # 6000 bytes
            path = comm.chosen_algorithm("allreduce", x.nbytes)
            comm.Allreduce(pycomm.IN_PLACE, x)
            y = np.full(750, 1.0)
            comm.Allreduce(pycomm.IN_PLACE, y)
        return path, x[0], x[-1], y[0]
    results = world.run(mixed)
    n = world.size
    assert results[0][0] == SHM_DIRECT and results[-1][0] == "shared_slots"
    for path, first, last, again in results:
        assert first == last == n * (n + 1) / 2 and again == n


def _twins():
    """Reduce_scatter_block and Allgather on buffers that take the direct path: blocking on
    some ranks, their I-variant (+ Wait) on the others, for several choices of those ranks,
    in place and not, each side entering first; then the same call blocking on every rank.
    Every rank counts its direct reads."""
    from pycomm import shmdirect
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    picks = {"last": {n - 1}, "first": {0}, "odd": set(range(1, n, 2)),
             "all-but-first": set(range(1, n))}
    at = pycomm.config.get("PYCOMM_SHM_DIRECT_BYTES")
    read, reads = shmdirect._Reads.read, [0]

    def counted(self, *args):
        reads[0] += 1
        return read(self, *args)

    out = []
    shmdirect._Reads.read = counted
    try:
        for dtype, op_name in TWIN_CASES:
            dt = np.dtype(dtype)
            op = getattr(pycomm, op_name)
            # just past the threshold, and each rank's block past the slots
            count = max(-(-at // (n * dt.itemsize)),
                        pycomm.config.get("PYCOMM_SHM_COLL_BYTES") // dt.itemsize) + 3
            every = [_contribution(k, count * n, dtype) for k in range(n)]
            want_rs = _fold([e[r * count:(r + 1) * count] for e in every], op_name)
            want_ag = np.concatenate([e[:count] for e in every])
            nbytes = count * n * dt.itemsize
            direct = (plan_call(comm, "reduce_scatter_block", dt, count, nbytes, None,
                                op)[4][1] == SHM_DIRECT,
                      plan_call(comm, "allgather", dt, count, nbytes, None)[4][1]
                      == SHM_DIRECT)
            for pick, inplace, late in [(p, i, side) for p in picks for i in (False, True)
                                        for side in ("blocking", "nonblocking")] + \
                    [("none", False, "nonblocking"), ("none", True, "nonblocking")]:
                nb = r in picks.get(pick, ())
                before = reads[0]
                if (late == "nonblocking") == nb:
                    time.sleep(0.002)              # this side enters second
                mine = every[r].copy()
                if inplace:
                    rs = mine.copy()
                    args = (pycomm.IN_PLACE, rs)
                else:
                    rs = np.full(count, 7, dt)
                    args = (mine, rs)
                if nb:
                    comm.Ireduce_scatter_block(*args, op=op).Wait()
                else:
                    comm.Reduce_scatter_block(*args, op=op)
                ag = np.full(count * n, 7, dt)
                if inplace:
                    ag[r * count:(r + 1) * count] = mine[:count]
                    args = (pycomm.IN_PLACE, ag)
                else:
                    args = (mine[:count], ag)
                if nb:
                    comm.Iallgather(*args).Wait()
                else:
                    comm.Allgather(*args)
                rs = rs[:count]
                if dt.kind in "fc":
                    rs_ok = np.allclose(rs, want_rs, rtol=1e-5, atol=1e-5)
                else:
                    rs_ok = np.array_equal(rs, want_rs)
                out.append((op_name, dt.name, pick, inplace, late, nb, direct, rs_ok,
                            np.array_equal(ag, want_ag), hashlib.sha1(ag).hexdigest(),
                            inplace or np.array_equal(mine, every[r]),
                            reads[0] - before))
    finally:
        shmdirect._Reads.read = read
    return out


TWIN_CASES = [(np.int64, "SUM"), (np.uint8, "BXOR"), (np.float64, "SUM")]


def test_a_peer_by_its_nonblocking_twin_makes_rsb_and_allgather_take_messages(world):
    results = world.run(_twins)
    for i, row in enumerate(results[0]):
        key = row[:5]
        gathered = set()
        for rank, res in enumerate(results):
            (_, _, pick, _, _, nb, direct, rs_ok, ag_ok, ag_digest, untouched,
             reads) = got = res[i]
            assert got[:5] == key, (rank, key)            # every rank ran the same schedule
            assert direct == (True, True), (rank, key)    # blocking on all: direct reads
            assert rs_ok and ag_ok and untouched, (rank, key, got[5:9], got[10:])
            if pick == "none":              # every rank blocking: the peers were read
                assert reads > 0, (rank, key)
            else:                           # a peer by messages: nothing was read
                assert reads == 0, (rank, key, nb, reads)
            gathered.add(ag_digest)
        assert len(gathered) == 1, key      # the same bits on every rank
