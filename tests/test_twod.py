"""The 2-D all-reduce (pycomm/collectives/twod.py) and the choice across hosts (issue 16).

Grids as pure functions (sizes 1..16); the schedule on fake ranks (tests/fakecomm.py) for
sizes 1..9, odd counts, several dtypes and ops, a non-commutative op in rank order, and
the host grid of a faked multi-host layout (block and cyclic placement, uneven hosts);
on real processes (the shared worlds: shm and tcp) by name, through the environment
variable, in place and with a non-commutative user op; and which algorithm the automatic
choice takes on a communicator spanning hosts with the shipped table (no measured link).
The 2-D all-gather and reduce-scatter (block and per-rank counts): test_twod_gather.py.
"""

from __future__ import annotations

import functools
import os
import sys

import cloudpickle
import numpy as np
import pytest

import pycomm
import pycomm.collectives as algs
from pycomm import ops
from pycomm.launch.bootstrap import host_layout
from pycomm.tuning.cost import model_transport
from pycomm.topology import grid_2d
from pycomm.collectives.twod import grid_rows, host_grid
from fakecomm import on_fake_hosts, run_fake  # tests/ is on sys.path under pytest
import test_algorithms_fake
from test_algorithms_fake import AFFINE, AFFINE_OP, _compose, affine_fold, affine_inputs

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(test_algorithms_fake)     # its affine op runs on ranks

PRIMES = {2, 3, 5, 7, 11, 13}


# -- the grid ------------------------------------------------------------------------------
@pytest.mark.parametrize("size", range(1, 17))
def test_near_square_grid(size):
    rows, cols = grid_2d(size)
    assert rows * cols == size and rows <= cols
    # rows is the largest divisor not above sqrt(size): no squarer grid exists
    assert all(size % d for d in range(rows + 1, int(size ** 0.5) + 1))
    if size in PRIMES:
        assert (rows, cols) == (1, size)
    grid = grid_rows(size, None, True)
    assert [r for row in grid for r in row] == list(range(size))   # rows of consecutive ranks
    assert {len(row) for row in grid} == {cols}


def test_host_grid_only_for_even_hosts_and_commutative_ops():
    cyclic = ((0, 2), (1, 3))
    assert grid_rows(4, cyclic, True) == cyclic                 # one row per host
    assert grid_rows(4, cyclic, False) == ((0, 1), (2, 3))     # rank order instead
    assert grid_rows(5, ((0, 1, 2), (3, 4)), True) == ((0, 1, 2, 3, 4),)   # uneven: 1 x 5
    assert grid_rows(6, ((0, 2, 4), (1, 3, 5)), True) == ((0, 2, 4), (1, 3, 5))
    assert host_grid((2, 2), True) and host_grid((1, 1, 1), True)
    assert not host_grid((3, 2), True) and not host_grid((2, 2), False)
    assert not host_grid((4,), True) and not host_grid(None, True)


# -- the schedule on fake ranks --------------------------------------------------------------
def _fold(op, xs):
    return functools.reduce(op.reduce_objects, [x.copy() for x in xs])


def _inputs(size, count, dtype, lo=-8, hi=9):
    rng = np.random.default_rng(size * 101 + count)
    return [rng.integers(lo, hi, count).astype(dtype) for _ in range(size)]


def _run_2d(size, xs, op, cc_hook=None):
    def body(cc):
        if cc_hook is not None:
            cc_hook(cc)
        buf = xs[cc.rank].copy()
        algs.REGISTRY["allreduce"]["2d"].fn(cc, buf, op)
        return buf
    return run_fake(size, body)


@pytest.mark.parametrize("dtype,op", [(np.int64, ops.SUM), (np.int32, ops.SUM),
                                      (np.int16, ops.PROD), (np.float64, ops.MAX),
                                      (np.float32, ops.MIN), (np.uint8, ops.BXOR)],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
@pytest.mark.parametrize("count", [0, 1, 2, 7, 13, 100])
@pytest.mark.parametrize("size", range(1, 10))
def test_fake_ranks_match_numpy(size, count, dtype, op):
    lo, hi = (-2, 3) if op is ops.PROD else (0, 9)
    xs = _inputs(size, count, dtype, lo, hi)
    with np.errstate(over="ignore"):
        expected = _fold(op, xs)
        results = _run_2d(size, xs, op)
    for rank, res in enumerate(results):
        assert res.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(res, expected, err_msg=f"rank {rank}")
        assert res.tobytes() == results[0].tobytes()


@pytest.mark.parametrize("size", [4, 6, 8, 9])
def test_fake_ranks_random_floats_close_and_bit_identical(size):
    rng = np.random.default_rng(size)
    xs = [(rng.standard_normal(37) * 10 ** rng.uniform(-3, 3, 37)) for _ in range(size)]
    results = _run_2d(size, xs, ops.SUM)
    np.testing.assert_allclose(results[0], np.sum(xs, axis=0), rtol=1e-10, atol=1e-30)
    assert all(r.tobytes() == results[0].tobytes() for r in results)


@pytest.mark.parametrize("count", [1, 5, 13])
@pytest.mark.parametrize("size", range(2, 10))
def test_fake_ranks_noncommutative_op_in_rank_order(size, count):
    xs = affine_inputs(size, count)
    with np.errstate(over="ignore"):
        expected = affine_fold(xs)
        assert not np.array_equal(expected, affine_fold(xs[::-1]))
        results = _run_2d(size, xs, AFFINE_OP)
    for rank, res in enumerate(results):
        assert np.array_equal(res, expected), f"rank {rank}"


@pytest.mark.parametrize("hostmap", [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1],
                                     [0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1]],
                         ids=["2x2", "2x2c", "2x3", "3x2c", "3+2"])
@pytest.mark.parametrize("count", [1, 7, 600])
def test_fake_hosts_host_grid(hostmap, count):
    size, nhosts = len(hostmap), len(set(hostmap))
    xs = _inputs(size, count, np.int64)

    def body(cc):
        buf = xs[cc.rank].copy()
        algs.REGISTRY["allreduce"]["2d"].fn(cc, buf, ops.SUM)
        return buf
    links = []
    for res, sent in on_fake_hosts(hostmap, body):
        np.testing.assert_array_equal(res, np.sum(xs, axis=0))
        links.append(sent)
    per_host = size // nhosts
    if size % nhosts == 0 and count % per_host == 0 and count >= size:
        # the column phase alone crosses hosts: each rank's n/L chunk, all-reduced across
        # H hosts by the model's pick (recursive doubling, Rabenseifner or a ring)
        assert sum(links) <= 2 * nhosts * count * 8 * (nhosts - 1)
        assert sum(links) < 2 * (size - 1) * count * 8     # a flat ring's link bytes


# -- real processes ---------------------------------------------------------------------------
def _rank_cases():
    comm = pycomm.COMM_WORLD
    r = comm.rank
    out = {}
    for count in (0, 1, 7, 1001):
        x = (np.arange(count, dtype=np.int64) * (r + 1) + r) % 1000
        y = np.empty_like(x)
        comm.Allreduce(x, y, algorithm="2d")
        out[("int64", count)] = y
    # IN_PLACE from here on; float32 SUM, MAX, PROD, a non-commutative user op
    f = np.linspace(-1, 1, 333, dtype=np.float32) * (r + 1)
    comm.Allreduce(pycomm.IN_PLACE, f, op=pycomm.SUM, algorithm="2d")
    out["float32"] = f
    z = np.full(9, r + 1, dtype=np.int32)
    comm.Allreduce(pycomm.IN_PLACE, z, op=pycomm.MAX, algorithm="2d")
    out["max"] = z
    d = np.full(5, 1.5, dtype=np.float64) + (r % 2)
    comm.Allreduce(pycomm.IN_PLACE, d, op=pycomm.PROD, algorithm="2d")
    out["prod"] = d
    m = np.empty(6, dtype=AFFINE)
    m["a"], m["b"] = r + 2, np.arange(6, dtype=np.uint64) + 10 * r
    op = pycomm.Op.Create(_compose, commute=False)
    with np.errstate(over="ignore"):
        comm.Allreduce(pycomm.IN_PLACE, m, op=op, algorithm="2d")
    out["affine"] = m
    os.environ["PYCOMM_ALGORITHM_ALLREDUCE"] = "2d"
    pycomm.config.reload()
    try:
        out["env"] = comm.chosen_algorithm("allreduce", 1 << 20)
        e = np.full(3, r, dtype=np.int64)
        comm.Allreduce(pycomm.IN_PLACE, e)
        out["env sum"] = e
    finally:
        del os.environ["PYCOMM_ALGORITHM_ALLREDUCE"]
        pycomm.config.reload()
    # on one host the automatic choice never takes it (it runs only when named)
    out["auto"] = {comm.chosen_algorithm("allreduce", n, algorithm="auto")
                   for n in (8, 1 << 16, 1 << 20, 1 << 24)}
    return out


def test_real_ranks_by_name_and_environment(world_small):
    p = world_small.size
    for rank, out in enumerate(world_small.run(_rank_cases)):
        for count in (0, 1, 7, 1001):
            xs = [(np.arange(count, dtype=np.int64) * (q + 1) + q) % 1000 for q in range(p)]
            np.testing.assert_array_equal(out[("int64", count)], np.sum(xs, axis=0))
        fs = [np.linspace(-1, 1, 333, dtype=np.float32) * (q + 1) for q in range(p)]
        np.testing.assert_allclose(out["float32"], np.sum(fs, axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out["max"], np.full(9, p, dtype=np.int32))
        np.testing.assert_array_equal(out["prod"], np.prod(
            [np.full(5, 1.5) + (q % 2) for q in range(p)], axis=0))
        ms = []
        for q in range(p):
            m = np.empty(6, dtype=AFFINE)
            m["a"], m["b"] = q + 2, np.arange(6, dtype=np.uint64) + 10 * q
            ms.append(m)
        with np.errstate(over="ignore"):
            assert np.array_equal(out["affine"], affine_fold(ms)), rank
        assert out["env"] == "2d"
        np.testing.assert_array_equal(out["env sum"], np.full(3, p * (p - 1) // 2))
        assert "2d" not in out["auto"]


def test_unknown_name_lists_2d():
    with pytest.raises(pycomm.ArgumentError, match="2d"):
        algs.choose("allreduce", 8, 4, requested="2-d")


# -- the choice across hosts, with the shipped table ----------------------------------------
@pytest.fixture
def shipped_table(monkeypatch):
    monkeypatch.delenv("PYCOMM_TUNE_FILE", raising=False)
    monkeypatch.delenv("PYCOMM_ALGORITHM_ALLREDUCE", raising=False)


def test_shipped_table_prices_the_link_between_hosts_slower_than_loopback(shipped_table):
    from pycomm.tuning.cost import constants
    assert model_transport("shm+tcp", 2) == "net" and model_transport("shm+tcp", 1) == "shm"
    net, tcp = constants("net"), constants("tcp")
    assert net.alpha > tcp.alpha and net.beta_rndv > tcp.beta_rndv and net.beta >= tcp.beta


@pytest.mark.parametrize("oversubscription", [1.0, 2.0])
@pytest.mark.parametrize("hosts", [(2, 2), (2, 2, 2)])
def test_auto_across_hosts_small_is_latency_optimal_large_is_hierarchical(
        hosts, oversubscription, shipped_table):
    p = sum(hosts)

    def pick(n):
        return algs.choose("allreduce", n, p, transport="net", hosts=hosts,
                           oversubscription=oversubscription)[0]
    assert pick(8) == "recursive_doubling"
    assert pick(16 << 20) == "hierarchical"
    assert "2d" not in {pick(n) for n in (8, 1 << 12, 1 << 16, 1 << 20, 16 << 20)}


def test_host_grid_price_carries_the_minimum_over_the_link(shipped_table):
    from pycomm.tuning.cost import constants
    from pycomm.tuning.cost_hosts import twod_hosts_time
    n, net = 16 << 20, constants("net")
    t = twod_hosts_time(n, (2, 2))
    # each host's link carries n (2(H-1)/H n, H = 2); a flat ring across it 1.5 n per rank
    assert n * net.beta_rndv < t < algs.model_time("allreduce", "ring", n, 4, transport="net")


def test_non_commutative_ops_across_hosts_take_a_flat_order_keeping_schedule(shipped_table):
    for n in (8, 1 << 20, 16 << 20):
        assert algs.choose("allreduce", n, 4, transport="net", hosts=(2, 2),
                           commutative=False)[0] not in ("2d", "hierarchical")


def _faked(hostmap):
    """A fresh Dup of the world whose ranks take themselves for hosts ``fake<h>``."""
    comm = pycomm.COMM_WORLD.Dup()
    infos = [{"host": f"fake{h}/boot/shm", "hostname": f"fake{h}"} for h in hostmap]
    comm.host_layout = host_layout(infos, comm.rank)
    return comm


def _rank_chosen_on_faked_hosts(hostmap):
    comm = _faked(hostmap)
    try:
        # the message algorithm (a blocking 8 B call on this one-machine world would go
        # through the shared-memory slots, which chosen_algorithm names instead)
        chosen = {n: comm._selection.choose("allreduce", n, "auto", True)[0] for n in (8, 16 << 20)}
        x = np.arange(1000, dtype=np.int64) + comm.rank
        comm.Allreduce(pycomm.IN_PLACE, x, algorithm="2d")       # the host grid
        return chosen, x
    finally:
        comm.Free()


@pytest.mark.parametrize("world", [(4, "shm")], indirect=True, ids=["n4-shm"])
def test_chosen_algorithm_on_a_faked_two_host_layout(world):
    for hostmap in ([0, 0, 1, 1], [0, 1, 0, 1]):
        for chosen, x in world.run(_rank_chosen_on_faked_hosts, hostmap):
            assert chosen[8] != "hierarchical" and chosen[16 << 20] == "hierarchical"
            np.testing.assert_array_equal(x, np.arange(1000) * 4 + 6)
