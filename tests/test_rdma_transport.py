"""The communicator on ``transport="rdma"``: p2p and collectives against numpy references.

Worlds of 2, 3 and 4 ranks (a pair, an odd size, a power of two) through one
:class:`pycomm.Pool` each; message sizes cover empty, eager (bounce buffers, several
chunks per frame) and rendezvous (RDMA READ) messages, and the eager limit boundary.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import pycomm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

COUNTS = [0, 1, 1000, 8193, 70000, 1 << 20]     # float64 elements


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"n{n}")
def pool(request):
    with pycomm.Pool(request.param, transport="rdma", timeout=60.0) as p:
        yield p


def _transport():
    return pycomm.COMM_WORLD.transport_name


def _ring(counts):
    comm = pycomm.COMM_WORLD
    r, s = comm.rank, comm.size
    for n in counts:
        out = np.arange(n, dtype=np.float64) + r
        got = np.full(n, -1.0)
        comm.Sendrecv(out, (r + 1) % s, 3, got, (r - 1) % s, 3)
        assert (got == np.arange(n) + (r - 1) % s).all(), n
    big = np.ones(300000)                          # a burst of Isends: credits and RNR
    reqs = [comm.Isend(big[:k * 1000], (r + 1) % s, k) for k in range(40)]
    bufs = [np.zeros(k * 1000) for k in range(40)]
    reqs += [comm.Irecv(bufs[k], (r - 1) % s, k) for k in range(40)]
    pycomm.Request.Waitall(reqs)
    return all((b == 1).all() for b in bufs)


def _collectives(counts):
    comm = pycomm.COMM_WORLD
    r, s = comm.rank, comm.size
    for n in counts:
        x = np.random.default_rng((r, n)).standard_normal(n)
        ref = np.sum([np.random.default_rng((k, n)).standard_normal(n) for k in range(s)],
                     axis=0)
        y = np.empty_like(x)
        comm.Allreduce(x, y, op=pycomm.SUM)
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
        for root in range(s):
            b = np.arange(n, dtype=np.float64) * (root + 1) if r == root else np.empty(n)
            comm.Bcast(b, root=root)
            assert (b == np.arange(n) * (root + 1)).all()
        g = np.empty((s, n))
        comm.Allgather(np.full(n, float(r)), g)
        assert (g == np.arange(s)[:, None]).all()
        a = np.empty((s, max(n // s, 1)))
        comm.Alltoall(np.tile(np.arange(s, dtype=np.float64)[:, None] * 10 + r,
                              (1, a.shape[1])), a)
        assert (a == r * 10 + np.arange(s)[:, None]).all()
    comm.Barrier()
    return comm.allgather(r)


def test_world_is_on_rdma(pool):
    assert set(pool.run(_transport)) == {"rdma"}


def _read_timeouts():
    eng = pycomm.COMM_WORLD._engine
    return sorted({t.read_timeout for t in eng.route if t is not None})


def test_one_sided_reads_wait_as_long_as_the_job_timeout(pool):
    # (the pool's timeout=60: an RDMA READ whose completions never come fails after it)
    assert pool.run(_read_timeouts) == [[60.0]] * len(pool.run(_transport))


def test_p2p_sizes_and_bursts(pool):
    assert all(pool.run(_ring, COUNTS))


def test_collectives_against_numpy(pool):
    res = pool.run(_collectives, COUNTS)
    assert all(x == list(range(len(res))) for x in res)


def _both_ways_backlog(count):
    """Every rank queues ``count`` messages to its right neighbour before receiving any
    (eager ones and, every fifth, a rendezvous one whose FIN then queues behind data):
    both directions run out of send credits at once, each holding only the reserved one
    with data queued, and must still hand each other their credits back."""
    comm = pycomm.COMM_WORLD
    r, s = comm.rank, comm.size
    sizes = [10, 8300, 0, 3, 25000]                 # float64: 200 KB is a rendezvous
    out = [np.full(sizes[i % 5], float(i)) for i in range(count)]
    reqs = [comm.Isend(m, (r + 1) % s, 7) for m in out]
    ok = True
    got = np.empty(max(sizes))
    for i in range(count):
        st = pycomm.Status()
        comm.Recv(got, (r - 1) % s, 7, st, timeout=30)
        n = st.Get_count() // 8
        ok &= n == sizes[i % 5] and bool((got[:n] == i).all())
    pycomm.Request.Waitall(reqs, timeout=30)
    return ok


def test_credits_flow_back_when_both_directions_are_backlogged(pool):
    for _ in range(3):
        assert all(pool.run(_both_ways_backlog, 60))
