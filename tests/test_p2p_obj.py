"""Point-to-point object API on real worlds: send/recv, isend/irecv, sendrecv.

Objects travel pickled (cloudpickle for what pickle refuses); the receive buffer is sized
by the arriving message, so large objects go through rendezvous without the caller knowing.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536


def sample_objects(rank: int) -> dict:
    """The objects rank ``rank`` sends, by name (deterministic, so the parent can rebuild)."""
    return {
        "none": None,
        "dict": {"rank": rank, "nested": [1, (2, 3), {"k": "v"}], b"bytes": 1.5},
        "array": np.arange(12, dtype=np.float32).reshape(3, 4) * (rank + 1),
        "large": {"blob": bytes(range(256)) * (EAGER_LIMIT // 128), "rank": rank},
        "big_array": np.full(3 * EAGER_LIMIT, rank, dtype=np.int16),
        "string": "ünïcödé " * 3 + str(rank),
    }


def assert_same(got, want, where: str) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, dict) and any(isinstance(v, np.ndarray) for v in want.values()):
        assert got.keys() == want.keys(), where
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    else:
        assert got == want, where


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def _rank_send_recv():
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    out = {}
    for i, (name, obj) in enumerate(sample_objects(comm.rank).items()):
        st_ = pycomm.Status()
        if comm.rank % 2 == 0:         # blocking calls; see test_p2p_buf's ring exchange
            comm.send(obj, right, tag=i)
            got = comm.recv(source=left, tag=i, status=st_)
        else:
            got = comm.recv(source=left, tag=i, status=st_)
            comm.send(obj, right, tag=i)
        out[name] = (got, st_.source, st_.tag)
    return out


def test_send_recv_objects(world):
    for rank, got in enumerate(world.run(_rank_send_recv)):
        left = (rank - 1) % world.size
        for i, (name, want) in enumerate(sample_objects(left).items()):
            obj, source, tag = got[name]
            assert_same(obj, want, f"rank {rank} {name}")
            assert (source, tag) == (left, i)


def _rank_lambda():
    """Functions that plain pickle refuses travel through cloudpickle."""
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    k = comm.rank
    fn = comm.sendrecv(lambda x: x * 10 + k, right, source=left)
    return fn(1)


def test_lambda_travels_by_value(world):
    for rank, value in enumerate(world.run(_rank_lambda)):
        assert value == 10 + (rank - 1) % world.size


def _rank_isend_irecv():
    comm = pycomm.COMM_WORLD
    objs = sample_objects(comm.rank)
    rreqs = [comm.irecv(source=r, tag=50 + r) for r in range(comm.size)]
    sreqs = [comm.isend(objs["large"] if r % 2 else objs["dict"], r, 50 + comm.rank)
             for r in range(comm.size)]
    # mix the object forms: Request.waitall for half, wait(status) one by one for the rest
    half = len(rreqs) // 2
    first = pycomm.Request.waitall(rreqs[:half] + sreqs)[:half]
    rest = []
    for r in rreqs[half:]:
        st_ = pycomm.Status()
        rest.append((r.wait(st_), st_.source, st_.tag))
    return first, rest


def test_isend_irecv_wait_returns_object(world):
    for rank, (first, rest) in enumerate(world.run(_rank_isend_irecv)):
        half = world.size // 2
        for r in range(world.size):
            want = sample_objects(r)["large" if rank % 2 else "dict"]
            if r < half:
                assert_same(first[r], want, f"rank {rank} from {r}")
            else:
                obj, source, tag = rest[r - half]
                assert_same(obj, want, f"rank {rank} from {r}")
                assert (source, tag) == (r, 50 + r)


def _rank_irecv_any_source_test():
    """rank 0 polls with req.test() for ANY_SOURCE messages; sends return None on wait."""
    comm = pycomm.COMM_WORLD
    sreq = comm.isend(("hello", comm.rank), 0, tag=comm.rank)
    got = []
    if comm.rank == 0:
        for _ in range(comm.size):
            req = comm.irecv(source=pycomm.ANY_SOURCE, tag=pycomm.ANY_TAG)
            while True:
                done, obj = req.test()
                if done:
                    break
            st_ = pycomm.Status()
            req.Wait(st_)
            got.append((obj, st_.source, st_.tag))
    return got, sreq.wait()


def test_irecv_any_source_with_test(world):
    results = world.run(_rank_irecv_any_source_test)
    got = sorted(results[0][0], key=lambda g: g[1])
    assert got == [(("hello", r), r, r) for r in range(world.size)]
    assert all(sent is None for _, sent in results)


def _rank_sendrecv_ring_large():
    comm = pycomm.COMM_WORLD
    right, left = ring(comm)
    st_ = pycomm.Status()
    obj = comm.sendrecv(sample_objects(comm.rank)["big_array"], right, sendtag=4,
                        source=left, recvtag=4, status=st_)
    return obj, st_.source, st_.tag, st_.count


def test_sendrecv_ring_large_object(world):
    for rank, (obj, source, tag, count) in enumerate(world.run(_rank_sendrecv_ring_large)):
        left = (rank - 1) % world.size
        assert_same(obj, sample_objects(left)["big_array"], f"rank {rank}")
        assert (source, tag) == (left, 4) and count > 3 * EAGER_LIMIT * 2


def _rank_proc_null_objects():
    comm = pycomm.COMM_WORLD
    comm.send({"lost": True}, pycomm.PROC_NULL)
    st_ = pycomm.Status()
    got = comm.recv(source=pycomm.PROC_NULL, status=st_)
    req = comm.irecv(source=pycomm.PROC_NULL)
    return got, st_.source, req.wait()


def test_proc_null_objects(world):
    for got in world.run(_rank_proc_null_objects):
        assert got == (None, pycomm.PROC_NULL, None)


@pytest.mark.parametrize("nbytes", [0, 10, EAGER_LIMIT * 4])
def test_self_send_object(world, nbytes):
    def body(n):
        comm = pycomm.COMM_WORLD
        comm.send(b"x" * n, comm.rank, tag=1)
        return comm.recv(source=comm.rank, tag=1) == b"x" * n
    assert all(world.run(body, nbytes))
