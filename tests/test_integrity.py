"""Never a silent wrong result: consistency of collective calls, abandoned calls, withdrawn
sends (issue 15's "silent wrong results" cases), on every transport.

* one rank's bad argument: it raises its own error, every other rank a
  :class:`CollectiveError` naming it, and the next correct call is right everywhere;
* mismatched calls (dtype, count, root, collective): :class:`CollectiveMismatchError`
  naming both calls, on every rank, with no hang: in that call or the next where a
  receive sees the mismatch; within two more calls where none can (two Bcast roots:
  roots receive nothing, so only a message left over after the call proves it);
* a large send withdrawn after a timeout is never received, and a one-sided read that
  overlaps the withdrawal fails instead of returning the caller's later bytes.
"""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

import pycomm
from conftest import World
from pycomm.errors import (ArgumentError, CollectiveError, CollectiveMismatchError,
                           CommError, InvalidBufferError)
from test_transports import make_pair
from transports import RemoteAccessError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

INTEGRITY_WORLDS = [(3, "shm"), (3, "tcp"), (3, "rdma"), (5, "shm"), (4, "tcp")]


@pytest.fixture(scope="session", params=INTEGRITY_WORLDS, ids=lambda p: f"n{p[0]}-{p[1]}")
def world(request) -> World:
    """A few worlds of the shared matrix: every transport, odd and even sizes."""
    return World(*request.param)


def _correct_allreduce(comm, n=1000):
    a = np.full(n, comm.rank + 1.0)
    comm.Allreduce(pycomm.IN_PLACE, a)
    return float(a[0])


def _outcome(fn):
    try:
        return ("ok", fn())
    except CommError as exc:
        return (type(exc).__name__, str(exc))


# -- one rank's bad argument ---------------------------------------------------------------
def _bad_call(kind, culprit):
    comm = pycomm.COMM_WORLD
    bad = comm.rank == culprit
    n = comm.size

    def run():
        if kind == "Allreduce-strided":
            send = np.zeros(2000)[::2] if bad else np.full(1000, 1000.0 * (comm.rank + 1))
            comm.Allreduce(send, np.zeros(1000))
        elif kind == "Allreduce-readonly":
            recv = np.zeros(1000)
            if bad:
                recv.setflags(write=False)
            comm.Allreduce(np.ones(1000), recv)
        elif kind == "Bcast-readonly":
            buf = np.zeros(8)
            if bad:
                buf.setflags(write=False)
            comm.Bcast(buf, root=(culprit + 1) % n)
        elif kind == "Allgather-size":
            comm.Allgather(np.ones(3), np.zeros(3 * n + (1 if bad else 0)))
        elif kind == "Reduce-op":
            comm.Reduce(np.ones(4, np.float64), np.zeros(4), op=pycomm.BAND if bad else
                        pycomm.SUM, root=(culprit + 1) % n)
        elif kind == "bcast-unpicklable":
            comm.bcast(threading.Lock() if bad else None, root=culprit)
        elif kind == "Iallreduce-strided":
            send = np.zeros(2000)[::2] if bad else np.ones(1000)
            comm.Iallreduce(send, np.zeros(1000)).Wait()
        return None

    first = _outcome(run)
    probes = [_outcome(lambda: _correct_allreduce(comm)) for _ in range(2)]
    after = [_correct_allreduce(comm) for _ in range(2)]
    return first, probes, after


@pytest.mark.parametrize("kind", ["Allreduce-strided", "Allreduce-readonly", "Bcast-readonly",
                                  "Allgather-size", "Reduce-op", "bcast-unpicklable",
                                  "Iallreduce-strided"])
def test_one_ranks_bad_argument_fails_the_call_everywhere_then_all_is_well(world, kind):
    culprit = world.size - 1 if kind.startswith("Bcast") else 0
    results = world.run(_bad_call, kind, culprit)
    expect = world.size * (world.size + 1) / 2
    call = kind.split("-")[0]
    for rank, (first, probes, after) in enumerate(results):
        assert after == [expect] * 2, (rank, after)      # never picks up the aborted data
        late = [p for p in probes if p[0] != "ok"]
        assert all(p == ("ok", expect) for p in probes if p[0] == "ok"), (rank, probes)
        if rank == culprit:
            assert first[0] in ("ArgumentError", "InvalidBufferError"), first
            assert f"rank {culprit}" in first[1]
            assert kind.split("-")[0] in first[1], first[1]      # and the call it was in
            assert not late, (rank, probes)
        elif first[0] == "ok" and kind in ("Bcast-readonly", "Reduce-op") and \
                not (kind == "Reduce-op" and rank == (culprit + 1) % world.size):
            # a rank that needs nothing from the bad one may finish, and learns in a
            # later call (whose results are right): the abort overtakes no message
            assert len(late) == 1, (rank, probes)
            assert "was abandoned by another rank" in late[0][1], late
            assert f"failed on rank {culprit}" in late[0][1], late
        else:
            assert not late, (rank, probes)
            assert first[0] in ("CollectiveError", "CollectiveMismatchError"), (rank, first)
            assert f"failed on rank {culprit}" in first[1] or \
                f"rank {culprit} is in" in first[1], first[1]
            assert call in first[1], first[1]


# -- mismatched calls -----------------------------------------------------------------------
def _mismatched(kind):
    comm = pycomm.COMM_WORLD
    r = comm.rank

    def call_a():
        if kind == "dtype":
            x = np.ones(2000, np.float32) if r == 0 else np.ones(1000, np.float64)
            comm.Allreduce(pycomm.IN_PLACE, x)
        elif kind == "count-eager":
            comm.Allreduce(pycomm.IN_PLACE, np.ones(1001 if r == 0 else 1000))
        elif kind == "count-rendezvous":
            comm.Allreduce(pycomm.IN_PLACE, np.ones(200_001 if r == 0 else 200_000))
        elif kind == "root":
            comm.Bcast(np.full(4, float(r)), root=0 if r == 0 else 1)
        elif kind == "collective":
            if r == 0:
                comm.Bcast(np.zeros(1000), root=0)
            else:
                comm.Allreduce(pycomm.IN_PLACE, np.ones(1000))
        elif kind == "collective-unseen":
            # no receive matches the foreign messages (rank 1 exchanges with others than
            # the Bcast's tree gives it): only their arrival shows the mismatch
            if r == 1:
                comm.Allreduce(pycomm.IN_PLACE, np.ones(16))
            else:
                comm.Bcast(np.zeros(16), root=comm.size - 1)
        elif kind == "op":
            comm.Allreduce(pycomm.IN_PLACE, np.ones(10), op=pycomm.MAX if r == 1 else
                           pycomm.SUM)
        elif kind == "nonblocking":
            x = np.ones(500 if r == 0 else 1000)
            comm.Iallreduce(pycomm.IN_PLACE, x).Wait()
        return "ok"

    t0 = time.monotonic()
    first = _outcome(call_a)
    probes = [_outcome(lambda: _correct_allreduce(comm, 10)) for _ in range(2)]
    after = [_correct_allreduce(comm, 10) for _ in range(2)]
    return first, probes, after, time.monotonic() - t0


@pytest.mark.parametrize("kind", ["dtype", "count-eager", "count-rendezvous", "root",
                                  "collective", "collective-unseen", "op", "nonblocking"])
def test_mismatched_calls_raise_on_every_rank_naming_both(world, kind):
    results = world.run(_mismatched, kind)
    expect = world.size * (world.size + 1) / 2
    for rank, (first, probes, after, took) in enumerate(results):
        calls = [first, *probes]
        raised = [o for o in calls if o[0] != "ok"]
        assert raised, (rank, calls)                  # no rank goes on unaware
        assert all(o[0] == "CollectiveMismatchError" for o in raised), (rank, raised)
        assert " is in " in raised[0][1] or " sent a message of " in raised[0][1], raised
        if kind != "root":                            # a receive saw it: one call later
            assert probes[1][0] == "ok", (rank, calls)
        assert after == [expect] * 2, (rank, after)   # the communicator is usable again
        assert took < 5.0, (rank, took)               # no rank waited for a timeout
    if kind in ("dtype", "collective"):   # both calls named, in words
        text = " ".join(o[1] for r in results for o in [r[0], *r[1]] if o[0] != "ok")
        names = {"dtype": ("float32x2000", "float64x1000"),
                 "collective": ("Bcast(root=0, float64x1000)", "Allreduce(SUM,")}[kind]
        assert all(n in text for n in names), text


def _mismatched_bcast_root():
    """Bcast root 2 (the last rank) of float64, rank 0 passes float32; then a correct
    Bcast from the same root, so the root's two calls need nothing from anyone (by a
    message algorithm, named: through the shared-memory slots or by direct reads every
    rank, the root too, checks every peer's signature before it returns)."""
    comm = pycomm.COMM_WORLD
    r, root = comm.rank, comm.size - 1

    def bcast(dtype):
        x = np.full(3000, float(r), dtype)
        comm.Bcast(x, root=root, algorithm="binomial")
        return float(x[0])

    calls = [lambda: bcast(np.float32 if r == 0 else np.float64), lambda: bcast(np.float64),
             lambda: _correct_allreduce(comm, 10), lambda: _correct_allreduce(comm, 10)]
    outcomes = [_outcome(c) for c in calls]
    after = [_correct_allreduce(comm, 10) for _ in range(2)]
    return outcomes, after


def test_the_root_of_a_mismatched_bcast_learns_of_it(world):
    """The root sends and never receives in a Bcast, so it finishes the mismatched call
    (and the next Bcast) before a peer's abort can reach it; it raises in the first call
    that brings a message from that peer, and every rank stays in step."""
    results = world.run(_mismatched_bcast_root)
    expect = world.size * (world.size + 1) / 2
    root = world.size - 1
    for rank, (outcomes, after) in enumerate(results):
        raised = [o for o in outcomes if o[0] != "ok"]
        assert raised, (rank, outcomes)                  # nobody goes on unaware
        assert "Bcast" in raised[0][1], raised[0]
        assert after == [expect] * 2, (rank, after)
    root_outcomes = results[root][0]
    assert root_outcomes[0] == ("ok", float(root))       # its own part was done
    late = [o for o in root_outcomes if o[0] != "ok"]
    assert "was abandoned by another rank" in late[0][1], late
    assert "float32x3000" in late[0][1], late            # the mismatch, in words


def _empty_contributions():
    """mpi4py programs pass ``None`` or an empty float64 array where a rank has nothing
    to give: a message of no bytes has an empty type signature, matching any dtype."""
    comm = pycomm.COMM_WORLD
    r, n = comm.rank, comm.size
    counts = [0 if k % 2 else k + 1 for k in range(n)]
    mine = np.arange(counts[r], dtype=np.int32) + 100 * r if counts[r] else np.empty(0)
    out = np.zeros(sum(counts), np.int32) if r == 0 else None
    comm.Gatherv(mine, [out, counts] if r == 0 else None, root=0)
    return None if out is None else out.tolist()


def test_a_rank_with_nothing_to_send_may_name_another_dtype(world):
    n = world.size
    got = world.run(_empty_contributions)[0]
    want = [v for k in range(n) if k % 2 == 0 for v in range(100 * k, 100 * k + k + 1)]
    assert got == want


# -- withdrawn sends -----------------------------------------------------------------------
def _withdrawn_send():
    comm = pycomm.COMM_WORLD
    n = 1 << 20                                       # rendezvous on every transport
    if comm.rank == 0:
        buf = np.full(n, 1, np.uint8)
        try:
            comm.Send(buf, dest=1, tag=5, timeout=0.3)
            sent = "sent"
        except pycomm.CommTimeoutError:
            sent = "withdrawn"
        buf[:] = 2                                    # the caller owns the buffer again
        comm.Send(np.zeros(1, np.uint8), dest=1, tag=7)   # after the withdrawal, in order
        comm.Barrier()
        comm.Send(np.full(n, 3, np.uint8), dest=1, tag=6)
        return sent
    if comm.rank == 1:
        # the Send times out meanwhile: its word on tag 7 follows the withdrawal (a pair's
        # messages keep their order), then rank 1 posts the receive it would have matched
        comm.Recv(np.zeros(1, np.uint8), source=0, tag=7)
        got = np.zeros(n, np.uint8)
        try:
            comm.Recv(got, source=0, tag=5, timeout=0.5)
            first = ("received", int(got.min()), int(got.max()))
        except CommError as exc:
            first = (type(exc).__name__,)
        comm.Barrier()
        comm.Recv(got, source=0, tag=6)
        return first, int(got.min()), int(got.max())
    comm.Barrier()
    return None


def test_withdrawn_send_is_never_read(world):
    out = world.run(_withdrawn_send)
    assert out[0] == "withdrawn"
    first, lo, hi = out[1]
    assert first[0] != "received" or first[1:] == (1, 1), first   # never the 2s
    assert first[0] in ("CommTimeoutError", "CommError"), first
    assert (lo, hi) == (3, 3)                          # the pair works afterwards


@pytest.mark.parametrize("name", ["shm", "rdma"])
def test_read_after_withdrawal_fails_and_a_racing_read_never_sees_later_bytes(name):
    engines, ts, _ = make_pair(name)
    try:
        n = 1 << 18
        dest = np.zeros(n, np.uint8)
        for trial in range(40):
            src = np.full(n, 1, np.uint8)
            desc = ts[0].expose(src.data.cast("B"))
            ts[1].read_remote(0, desc, n, dest.data.cast("B"))
            assert (dest == 1).all()
            seen, stop = [], threading.Event()

            def reader():
                while not stop.is_set():
                    try:
                        ts[1].read_remote(0, desc, n, dest.data.cast("B"))
                    except RemoteAccessError:
                        seen.append("refused")
                        return
                    seen.append((int(dest.min()), int(dest.max())))

            th = threading.Thread(target=reader)
            th.start()
            time.sleep(0.001 * (trial % 5))
            ts[0].release(desc, revoke=True)          # withdrawn, then overwritten at once
            src[:] = 2
            stop.set()
            th.join(10)
            assert seen and seen[-1] in ("refused", (1, 1)), seen
            assert all(s == "refused" or s == (1, 1) for s in seen), seen
            with pytest.raises(RemoteAccessError):
                ts[1].read_remote(0, desc, n, dest.data.cast("B"))
        # the connection survived every refused read
        engines[1].progress()
        ts[1].check_peers()
    finally:
        for t in ts:
            t.close()


@pytest.mark.parametrize("name", ["shm", "rdma"])
def test_read_of_a_withdrawn_and_freed_buffer_is_a_clean_refusal(name):
    engines, ts, _ = make_pair(name)
    try:
        n = 4 << 20                                   # past malloc's mmap threshold
        src = np.full(n, 1, np.uint8)
        desc = ts[0].expose(src.data.cast("B"))
        ts[0].release(desc, revoke=True)
        del src                                       # unmapped: the address is gone
        dest = np.zeros(n, np.uint8)
        with pytest.raises(RemoteAccessError):
            ts[1].read_remote(0, desc, n, dest.data.cast("B"))
        ts[1].check_peers()                           # not taken for a dead peer
    finally:
        for t in ts:
            t.close()


# -- errors that name the call ----------------------------------------------------------
def _unpicklable_send():
    comm = pycomm.COMM_WORLD
    if comm.rank == 0:
        try:
            comm.send(threading.Lock(), dest=1, tag=3)
        except ArgumentError as exc:
            comm.send("fine", dest=1, tag=3)
            return str(exc), isinstance(exc, TypeError)     # (pickle's own error, too)
        return "sent"
    if comm.rank == 1:
        return comm.recv(source=0, tag=3)
    return None


def test_a_refused_pickle_is_an_argument_error_and_pickle_s_own_error():
    import pickle

    from pycomm import MPI
    from pycomm.MPI.exceptions import translate
    from pycomm.serial import dumps

    class Refuses:
        """pickle's error first (which sends the object to cloudpickle), then ``error``."""

        def __init__(self, error):
            self.errors = [TypeError("pickle says no"), error]

        def __reduce__(self):
            raise self.errors.pop(0)

    for error, also in ((pickle.PicklingError("no"), pickle.PicklingError),
                        (TypeError("no"), TypeError),
                        (BlockingIOError("no"), None)):    # (no common layout with it)
        with pytest.raises(ArgumentError, match="rank 3: send.dest=1, tag=2.: cannot pickle "
                           "the object .Refuses.") as info:
            dumps(Refuses(error), 3, "send(dest=1, tag=2)")
        assert also is None or isinstance(info.value, also), type(info.value).__mro__
        # pycomm.MPI: ERR_ARG, though the message names tag= (its hints would say ERR_TAG)
        assert translate(info.value).Get_error_class() == MPI.ERR_ARG


def test_unpicklable_send_is_an_argument_error_naming_rank_and_call(world):
    out = world.run(_unpicklable_send)
    text, also_type_error = out[0]
    assert "rank 0: send(dest=1, tag=3): cannot pickle" in text and also_type_error, out[0]
    assert out[1] == "fine"


def test_errors_are_comm_errors():
    assert issubclass(CollectiveMismatchError, CollectiveError)
    assert issubclass(CollectiveError, CommError)
    assert issubclass(InvalidBufferError, CommError)
