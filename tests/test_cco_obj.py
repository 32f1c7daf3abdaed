"""Collective object API on real worlds: bcast, gather, scatter, allgather, alltoall,
reduce and allreduce of picklable objects, for every root.

Each test makes one ``world.run`` that loops over every root and returns what each rank got;
the expected values are rebuilt here from the same per-rank inputs.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EAGER_LIMIT = 65536


def obj_of(rank: int, root: int = 0):
    """A rank's object: mixed types, some past the eager limit for every other rank."""
    big = b"%d" % rank * (EAGER_LIMIT + 1) if rank % 2 else b""
    return {"rank": rank, "root": root, "list": list(range(rank)), "big": big,
            "array": np.arange(rank + 1, dtype=np.int64)}


def same(a, b) -> bool:
    """Deep equality that understands numpy arrays."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and \
            a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def _rank_bcast():
    comm = pycomm.COMM_WORLD
    out = []
    for root in range(comm.size):
        out.append(comm.bcast(obj_of(root, root) if comm.rank == root else None, root=root))
    out.append(comm.bcast((lambda x: x + 1) if comm.rank == 0 else None)(1))  # cloudpickle
    return out


def test_bcast_every_root(world):
    for rank, got in enumerate(world.run(_rank_bcast)):
        for root in range(world.size):
            assert same(got[root], obj_of(root, root)), f"rank {rank} root {root}"
        assert got[-1] == 2


def _rank_gather_scatter():
    comm = pycomm.COMM_WORLD
    gathered, scattered = [], []
    for root in range(comm.size):
        gathered.append(comm.gather(obj_of(comm.rank, root), root=root))
        items = [obj_of(r, root) for r in range(comm.size)] if comm.rank == root else None
        scattered.append(comm.scatter(items, root=root))
    return gathered, scattered


def test_gather_and_scatter_every_root(world):
    for rank, (gathered, scattered) in enumerate(world.run(_rank_gather_scatter)):
        for root in range(world.size):
            if rank == root:
                assert same(gathered[root], [obj_of(r, root) for r in range(world.size)])
            else:
                assert gathered[root] is None
            assert same(scattered[root], obj_of(rank, root)), f"rank {rank} root {root}"


def _rank_allgather_alltoall():
    comm = pycomm.COMM_WORLD
    allg = comm.allgather(obj_of(comm.rank))
    a2a = comm.alltoall([(comm.rank, j, b"x" * (j * 30000)) for j in range(comm.size)])
    return allg, a2a


def test_allgather_and_alltoall(world):
    for rank, (allg, a2a) in enumerate(world.run(_rank_allgather_alltoall)):
        assert same(allg, [obj_of(r) for r in range(world.size)])
        assert a2a == [(i, rank, b"x" * (rank * 30000)) for i in range(world.size)]


def _rank_reductions():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    out = {"reduce": [], "allreduce": {}}
    for root in range(comm.size):
        out["reduce"].append((comm.reduce(r + 1, root=root),                     # SUM
                              comm.reduce([r, r], op=pycomm.SUM, root=root),     # concat
                              comm.reduce((r * 7) % 5, op=pycomm.MAX, root=root),
                              comm.reduce(r - 3, op=pycomm.MIN, root=root),
                              comm.reduce(r + 1, op=pycomm.PROD, root=root)))
    out["allreduce"]["sum"] = comm.allreduce(r + 1)
    out["allreduce"]["list"] = comm.allreduce([r])
    out["allreduce"]["max"] = comm.allreduce(-r, op=pycomm.MAX)
    out["allreduce"]["array"] = comm.allreduce(np.full(3, r), op=pycomm.SUM)
    out["allreduce"]["str"] = comm.allreduce(str(r))
    return out


def test_reduce_and_allreduce(world):
    n = world.size
    fact = 1
    for i in range(1, n + 1):
        fact *= i
    want_reduce = (n * (n + 1) // 2, [r for r in range(n) for _ in range(2)],
                   max((r * 7) % 5 for r in range(n)), -3, fact)
    for rank, out in enumerate(world.run(_rank_reductions)):
        for root in range(n):
            got = out["reduce"][root]
            if rank == root:
                assert got == want_reduce, f"rank {rank} root {root}"
            else:
                assert got == (None,) * 5
        a = out["allreduce"]
        assert a["sum"] == n * (n + 1) // 2
        assert a["list"] == list(range(n)), "list concatenation must follow rank order"
        assert a["max"] == 0
        np.testing.assert_array_equal(a["array"], np.full(3, n * (n - 1) // 2))
        assert a["str"] == "".join(str(r) for r in range(n))


def _rank_mixed_with_p2p():
    """Object collectives never match user point-to-point traffic on the same ranks."""
    comm = pycomm.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    req = comm.isend("p2p", right, tag=0)
    total = comm.allreduce(1)
    got = comm.recv(source=left, tag=pycomm.ANY_TAG)
    req.wait()
    return total, got, comm.gather(comm.rank, root=0)


def test_collectives_do_not_match_user_messages(world):
    for rank, (total, got, gathered) in enumerate(world.run(_rank_mixed_with_p2p)):
        assert total == world.size and got == "p2p"
        assert gathered == (list(range(world.size)) if rank == 0 else None)


@pytest.mark.parametrize("nbytes", [0, 3 * EAGER_LIMIT])
def test_barrier_and_bcast_of_large_object(world, nbytes):
    def body(n):
        comm = pycomm.COMM_WORLD
        comm.barrier()
        return comm.bcast(b"z" * n if comm.rank == comm.size - 1 else None,
                          root=comm.size - 1)
    assert world.run(body, nbytes) == [b"z" * nbytes] * world.size


class _Unpicklable(Exception):
    """An exception that does not survive pickling (its constructor takes two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def _rank_allreduce_op_fails():
    """Objects the op cannot combine make it raise: every rank must raise at once (not wait
    out the timeout), the op's own exception where it pickles, and the communicator must
    stay usable."""
    import time
    comm = pycomm.COMM_WORLD

    def refuse(a, b):
        raise _Unpicklable(1, 2)

    out = {}
    for label, obj, op in (("type", {"rank": comm.rank} if comm.rank == comm.size - 1
                            else comm.rank, None),
                           ("unpicklable", comm.rank, pycomm.Op.Create(refuse))):
        t0 = time.perf_counter()
        try:
            comm.allreduce(obj, op=op)
            got = "no error"
        except pycomm.CollectiveError as exc:
            got = f"CollectiveError: {exc}"
        except (TypeError, _Unpicklable) as exc:
            got = f"{type(exc).__name__}: {exc} | " + " ".join(getattr(exc, "__notes__", []))
        out[label] = (got, time.perf_counter() - t0)
    slots = comm.chosen_algorithm("allreduce", 8) == "shared_slots"
    after = comm.allreduce(comm.rank + 1)          # the communicator still works
    return out, slots, after


def test_allreduce_whose_op_fails_fails_on_every_rank(world):
    # through the slots every rank folds the objects and raises the op's exception itself;
    # by messages rank 0 folds, raises, and the others raise the same exception (noted as
    # rank 0's), or CollectiveError naming it when it does not pickle
    n = world.size
    for rank, (out, slots, after) in enumerate(world.run(_rank_allreduce_op_fails)):
        assert after == n * (n + 1) // 2
        for label, (got, took) in out.items():
            assert took < 5, (rank, label, took)
            want = "TypeError" if label == "type" else "_Unpicklable"
            if n == 1:
                assert got == "no error"        # one object: the op never runs
            elif rank == 0 or slots:
                assert got.startswith(f"{want}:") and "rank 0" not in got, (label, got)
            elif label == "type":
                assert got.startswith("TypeError:") and "raised by the op on rank 0" in got, got
            else:
                assert got.startswith("CollectiveError:") and "raised on rank 0" in got and \
                    "_Unpicklable" in got, got


def _rank_allreduce_result_does_not_pickle():
    """An op whose result does not pickle, with objects too large for the slots (by
    messages: rank 0 folds and must pickle the result to broadcast it)."""
    import threading
    comm = pycomm.COMM_WORLD
    big = b"x" * (3 * EAGER_LIMIT + comm.rank)      # past PYCOMM_SHM_COLL_BYTES too
    try:
        comm.allreduce(big, op=pycomm.Op.Create(lambda a, b: threading.Lock()))
        got = "no error"
    except pycomm.CollectiveError as exc:
        got = f"CollectiveError: {exc}"
    except TypeError as exc:
        got = f"{type(exc).__name__} (TypeError, {isinstance(exc, pycomm.ArgumentError)}):" \
            f" {exc}"
    return got, comm.allreduce(comm.rank + 1)


def test_allreduce_whose_result_does_not_pickle_names_rank_0_everywhere(world_small):
    # by messages rank 0 pickles the result to broadcast it: there pickle's refusal (an
    # ArgumentError that is a TypeError, as mpi4py raises for an unpicklable object), on
    # the others a CollectiveError naming rank 0; the communicator stays usable
    n = world_small.size
    for rank, (got, after) in enumerate(world_small.run(_rank_allreduce_result_does_not_pickle)):
        assert after == n * (n + 1) // 2, (rank, after)
        if n == 1:
            assert got == "no error"            # one object: the op never runs
        elif rank == 0:
            assert got.startswith("ArgumentError (TypeError, True): rank 0: allreduce (the "
                                  "op's result): cannot pickle the object (lock)"), got
        else:
            assert got.startswith(f"CollectiveError: rank {rank}: ") and \
                "failed on rank 0" in got and "ArgumentError" in got, got


def _rank_test_cancelled_object_receive():
    comm = pycomm.COMM_WORLD
    req = comm.irecv(source=comm.rank, tag=77)
    req.Cancel()
    return req.test()


def test_object_test_of_a_cancelled_receive_returns_none(world):
    for got in world.run(_rank_test_cancelled_object_receive):
        assert tuple(got) == (True, None)
