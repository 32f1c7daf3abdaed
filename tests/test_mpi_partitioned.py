"""pycomm.MPI's partitioned point-to-point communication (MPI-4.1 chapter 4):
``Psend_init``/``Precv_init``, ``Pready``/``Pready_range``/``Pready_list``, ``Parrived``.

Each ``_rank_*`` function runs on every rank and returns its mismatches against numpy.
Worlds of 1 to 4 ranks on shared memory and 3 on TCP; partition counts 1, 3 and 4 with 0,
1 and 5 items per partition. The error classes are those mpi4py 4.1.2 + MPICH 5.0.2 gave
(recorded in pycomm/MPI/partitioned.py's docstring).
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from pycomm import MPI

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLDS = [(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"), (3, "tcp")]
pytestmark = pytest.mark.parametrize("world", WORLDS, indirect=True,
                                     ids=[f"n{n}-{t}" for n, t in WORLDS])
SHAPES = [(p, k) for p in (1, 3, 4) for k in (0, 1, 5)]


def _expect(bad: list, label: str, got, want) -> None:
    got, want = np.asarray(got).tolist(), np.asarray(want).tolist()
    if got != want:
        bad.append(f"rank {MPI.COMM_WORLD.rank}: {label}: got {got} want {want}")


def _data(rank: int, n: int, round_: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64) + 1000 * rank + 10 * round_


def _rank_self() -> list:
    """Send to oneself in a shuffled order: after each Pready exactly the partitions
    marked so far have arrived (nothing else sends to this rank meanwhile)."""
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.rank
    bad: list = []
    rng = np.random.default_rng(rank)
    for p, k in SHAPES:
        send, got = np.zeros(p * k), np.full(p * k, -1.0)
        sreq = comm.Psend_init(send, p, rank, 7)
        rreq = comm.Precv_init(got, p, rank, 7)
        for round_ in range(3):
            rreq.Start()
            _expect(bad, f"{p}x{k} before Start", [rreq.Parrived(i) for i in range(p)],
                    [False] * p)
            sreq.Start()
            marked = []
            for i in rng.permutation(p):
                send[i * k:(i + 1) * k] = _data(rank, p * k, round_)[i * k:(i + 1) * k]
                sreq.Pready(int(i))         # partition i is read now, not at Start
                marked.append(int(i))
                arrived = [rreq.Parrived(j) for j in range(p)]
                _expect(bad, f"{p}x{k} round {round_} after {marked}", arrived,
                        [j in marked for j in range(p)])
            rreq.Wait()
            sreq.Wait()
            _expect(bad, f"{p}x{k} round {round_}", got, _data(rank, p * k, round_))
            _expect(bad, "inactive", [rreq.Parrived(0), sreq != MPI.REQUEST_NULL],
                    [True, True])
        sreq.Free()
        rreq.Free()
        _expect(bad, "freed", [sreq == MPI.REQUEST_NULL, rreq == MPI.REQUEST_NULL],
                [True, True])
    comm.Free()
    return bad


def _rank_ring() -> list:
    """Ring (to rank+1, from rank-1), ranges and lists, two requests at once on other
    tags, a user message with ANY_TAG in flight: the partitions never meet it."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    dest, source = (rank + 1) % size, (rank - 1) % size
    bad: list = []
    for p, k in SHAPES:
        send = [np.zeros(p * k), np.zeros(p * k)]
        got = [np.full(p * k, -1.0), np.full(p * k, -1.0)]
        sreqs = [comm.Psend_init(send[t], p, dest, t) for t in (0, 1)]
        rreqs = [comm.Precv_init(got[t], p, source, t) for t in (0, 1)]
        for round_ in range(2):
            MPI.Prequest.Startall(rreqs + sreqs)
            user = comm.irecv(source=source, tag=MPI.ANY_TAG)
            for t in (0, 1):
                send[t][:] = _data(rank, p * k, round_) + 0.5 * t
            sreqs[0].Pready_range(0, p - 1)
            sreqs[1].Pready_list(list(range(p))[::-1])
            comm.send(("user", rank), dest, tag=3)
            MPI.Request.Waitall(rreqs + sreqs)
            _expect(bad, f"user message {p}x{k}", list(user.wait()), ["user", source])
            for t in (0, 1):
                _expect(bad, f"{p}x{k} tag {t} round {round_}", got[t],
                        _data(source, p * k, round_) + 0.5 * t)
        for r in sreqs + rreqs:
            r.Free()
    return bad


def _rank_datatype() -> list:
    """A partition of ``count`` items of a strided vector type, packed when marked ready
    (the buffer changes after Psend_init and after Start); received contiguously."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    vec = MPI.INT.Create_vector(2, 1, 2).Commit()       # ints 0 and 2 of every 3
    p, count = 3, 2
    send = np.zeros(p * count * 3, np.int32)
    got = np.full(p * count * 2, -1, np.int32)
    sreq = comm.Psend_init([send, count, vec], p, (rank + 1) % size, 1)
    rreq = comm.Precv_init([got, 2 * count, MPI.INT], p, (rank - 1) % size, 1)
    rreq.Start()
    sreq.Start()
    send[:] = np.arange(send.size) + 100 * rank
    sreq.Pready_range(0, p - 1)
    MPI.Request.Waitall([rreq, sreq])
    src = (rank - 1) % size
    want = (np.arange(send.size) + 100 * src).reshape(-1, 3)[:, [0, 2]].reshape(-1)
    bad: list = []
    _expect(bad, "vector partitions", got, want)
    for r in (sreq, rreq, vec):
        r.Free()
    return bad


def _rank_errors() -> list:
    comm = MPI.COMM_WORLD
    rank = comm.rank
    buf = np.zeros(6, np.int32)
    bad: list = []
    sreq = comm.Psend_init(buf, 3, rank, 2)
    rreq = comm.Precv_init(np.zeros(6, np.int32), 3, rank, 2)
    plain = comm.Send_init(buf, rank, 2)
    cases = {
        "Pready inactive": (lambda: sreq.Pready(0), MPI.ERR_REQUEST),
        "zero partitions": (lambda: comm.Psend_init(buf, 0, rank), MPI.ERR_ARG),
        "not 4 equal parts": (lambda: comm.Psend_init(buf, 4, rank), MPI.ERR_COUNT),
        "ANY_SOURCE": (lambda: comm.Precv_init(buf, 3), MPI.ERR_RANK),
        "ANY_TAG": (lambda: comm.Precv_init(buf, 3, rank), MPI.ERR_TAG),
        "bad dest": (lambda: comm.Psend_init(buf, 3, comm.size), MPI.ERR_RANK),
        "read-only receive": (lambda: comm.Precv_init(np.frombuffer(bytes(8), np.int32),
                                                      2, rank, 2), MPI.ERR_BUFFER),
        "Pready on Send_init": (lambda: plain.Pready(0), MPI.ERR_REQUEST),
        "Parrived on a send": (lambda: sreq.Parrived(0), MPI.ERR_REQUEST),
    }

    def check(label, call, code):
        try:
            call()
            bad.append(f"{label}: no error")
        except MPI.Exception as exc:
            if exc.Get_error_class() != code:
                bad.append(f"{label}: error class {exc.Get_error_class()} not {code}")
    for label, (call, code) in cases.items():
        check(label, call, code)
    rreq.Start()
    sreq.Start()
    check("Pready 3 of 3", lambda: sreq.Pready(3), MPI.ERR_OTHER)
    check("Pready_list [-1]", lambda: sreq.Pready_list([0, -1]), MPI.ERR_OTHER)
    check("Parrived 3 of 3", lambda: rreq.Parrived(3), MPI.ERR_OTHER)
    sreq.Pready(1)
    sreq.Pready(1)                          # a second mark is nothing (MPICH)
    check("Wait before every Pready", lambda: sreq.Wait(), MPI.ERR_ARG)
    _expect(bad, "still active, nothing else sent", [rreq.Parrived(i) for i in range(3)],
            [False, True, False])
    sreq.Pready_list([0, 2])
    MPI.Request.Waitall([sreq, rreq])
    try:
        comm.Psend_init(buf, 5, rank)
    except ValueError:                      # mpi4py raises ValueError here
        pass
    for r in (sreq, rreq, plain):
        r.Free()
    return bad


def test_self_parrived_exact(world):
    assert world.run(_rank_self) == [[]] * world.size


def test_ring(world):
    assert world.run(_rank_ring) == [[]] * world.size


def test_noncontiguous_datatype(world):
    assert world.run(_rank_datatype) == [[]] * world.size


def test_errors(world):
    assert world.run(_rank_errors) == [[]] * world.size
