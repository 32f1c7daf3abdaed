"""The 2-D all-reduce (pycomm/collectives/twod.py) and the choice across hosts (issue 16).

Grids as pure functions (sizes 1..16); the schedule on fake ranks (tests/fakecomm.py) for
sizes 1..9, odd counts, several dtypes and ops, a non-commutative op in rank order, and
the host grid of a faked multi-host layout (block and cyclic placement, uneven hosts);
on real processes (the shared worlds: shm and tcp) by name, through the environment
variable, in place and with a non-commutative user op; and which algorithm the automatic
choice takes on a communicator spanning hosts with the shipped table (no measured link).
The 2-D all-gather and reduce-scatter (block and per-rank counts): their groups, fake ranks
(sizes 1..9, counts 0 and uneven, a non-commutative op in rank order), fake hosts (block,
cyclic and uneven placement; the link bytes of the host grid), real processes by name and
through the environment (the flight recorder names the algorithm that ran), and on faked
host layouts; the automatic choice never takes them.
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


# -- the 2-D all-gather and reduce-scatter (issue 16) -----------------------------------------
def test_gather_grid_groups_and_layout():
    from pycomm.collectives.twod import gather_grid
    # near-square: the rows are the inner groups, rank order (no copy), for the all-gather
    # and a commutative reduce-scatter
    assert gather_grid(6, None, True, False) == (((0, 1, 2), (3, 4, 5)), True, False)
    assert gather_grid(6, None, True, True) == (((0, 1, 2), (3, 4, 5)), True, False)
    # non-commutative reduce-scatter: the columns, so the rows are folded first
    assert gather_grid(6, None, False, True) == (((0, 3), (1, 4), (2, 5)), False, True)
    assert gather_grid(5, None, False, True) == (((0,), (1,), (2,), (3,), (4,)), True, True)
    # host grid: the columns (across hosts) are the inner groups; cyclic placement keeps
    # them consecutive
    assert gather_grid(4, ((0, 1), (2, 3)), True, False) == (((0, 2), (1, 3)), False, True)
    assert gather_grid(4, ((0, 2), (1, 3)), True, True) == (((0, 1), (2, 3)), True, True)
    # a non-commutative op across hosts, or uneven hosts: the near-square grid
    assert gather_grid(4, ((0, 2), (1, 3)), False, True) == (((0, 2), (1, 3)), False, True)
    assert gather_grid(5, ((0, 1, 2), (3, 4)), True, False) == (((0, 1, 2, 3, 4),), True,
                                                                 False)


def _ag_blocks(size, count, dtype):
    return [((np.arange(count) * 7 + 31 * q + 1) % 120).astype(dtype) for q in range(size)]


def _allgather_2d(cc, xs, count, dtype):
    buf = np.full(cc.size * count, 123, dtype=dtype)
    buf[cc.rank * count:(cc.rank + 1) * count] = xs[cc.rank]
    algs.REGISTRY["allgather"]["2d"].fn(cc, buf, count)
    return buf


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.uint8],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("count", [0, 1, 5])
@pytest.mark.parametrize("size", range(1, 8))
def test_fake_ranks_allgather(size, count, dtype):
    xs = _ag_blocks(size, count, dtype)
    for res in run_fake(size, lambda cc: _allgather_2d(cc, xs, count, dtype)):
        np.testing.assert_array_equal(res, np.concatenate(xs))


def _reduce_scatter_2d(cc, xs, counts, op, block):
    out = np.full(counts[cc.rank], 99, dtype=xs[0].dtype)
    send = xs[cc.rank].copy()
    if block:
        algs.REGISTRY["reduce_scatter_block"]["2d"].fn(cc, send, out, op)
    else:
        algs.REGISTRY["reduce_scatter"]["2d"].fn(cc, send, out, counts, op)
    assert send.tobytes() == xs[cc.rank].tobytes()      # sendbuf untouched
    return out


def _check_reduce_scatter(results, expected, counts, close=False):
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    for rank, res in enumerate(results):
        want = expected[offs[rank]:offs[rank + 1]]
        assert res.dtype == want.dtype
        if close:
            np.testing.assert_allclose(res, want, rtol=1e-5, err_msg=f"rank {rank}")
        else:
            assert np.array_equal(res, want), f"rank {rank}"


def _counts(size, per):
    """``per`` elements each, or "uneven": zeros, odd sizes, not divisible by the grid."""
    return [per] * size if per != "uneven" else [(3 * q + 1) % 4 for q in range(size)]


@pytest.mark.parametrize("dtype,op", [(np.int64, ops.SUM), (np.int32, ops.MAX),
                                      (np.float64, ops.SUM), (np.int16, ops.PROD)],
                         ids=lambda v: getattr(v, "name", None) or np.dtype(v).name)
@pytest.mark.parametrize("per", [0, 1, 3, "uneven"])
@pytest.mark.parametrize("size", range(1, 8))
def test_fake_ranks_reduce_scatter(size, per, dtype, op):
    counts = _counts(size, per)
    lo, hi = (-2, 3) if op is ops.PROD else (-8, 9)
    xs = _inputs(size, sum(counts), dtype, lo, hi)
    if dtype == np.float64:
        xs = [x + np.linspace(0, 1, x.size) / 3 for x in xs]
    with np.errstate(over="ignore"):
        expected = _fold(op, xs)
        results = run_fake(size, lambda cc: _reduce_scatter_2d(cc, xs, counts, op,
                                                               per != "uneven"))
    _check_reduce_scatter(results, expected, counts, close=dtype == np.float64)


@pytest.mark.parametrize("per", [1, 3, "uneven"])
@pytest.mark.parametrize("size", range(2, 10))
def test_fake_ranks_reduce_scatter_noncommutative_in_rank_order(size, per):
    counts = _counts(size, per)
    xs = affine_inputs(size, sum(counts))
    with np.errstate(over="ignore"):
        expected = affine_fold(xs)
        results = run_fake(size, lambda cc: _reduce_scatter_2d(cc, xs, counts, AFFINE_OP,
                                                               per != "uneven"))
    _check_reduce_scatter(results, expected, counts)


HOSTMAPS = [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2],
            [0, 0, 0, 1, 1], [0, 1, 0, 1, 0], [0, 1, 2]]
HOSTMAP_IDS = ["2x2", "2x2c", "2x3", "3x2c", "3+2", "3+2c", "3x1"]


@pytest.mark.parametrize("count", [1, 6, 500])
@pytest.mark.parametrize("hostmap", HOSTMAPS, ids=HOSTMAP_IDS)
def test_fake_hosts_allgather_sends_each_block_once_per_host(hostmap, count):
    size, nhosts = len(hostmap), len(set(hostmap))
    xs = _ag_blocks(size, count, np.int64)
    links = []
    for res, sent in on_fake_hosts(hostmap, lambda cc: _allgather_2d(cc, xs, count, np.int64)):
        np.testing.assert_array_equal(res, np.concatenate(xs))
        links.append(sent)
    if size % nhosts == 0:      # the host grid: each block crosses to each other host once
        assert sum(links) == size * (nhosts - 1) * count * 8


@pytest.mark.parametrize("per", [1, 5, 300, "uneven"])
@pytest.mark.parametrize("hostmap", HOSTMAPS, ids=HOSTMAP_IDS)
def test_fake_hosts_reduce_scatter(hostmap, per):
    size, nhosts = len(hostmap), len(set(hostmap))
    counts = _counts(size, per)
    block = per != "uneven"
    xs = _inputs(size, sum(counts), np.int64)
    links = []
    for op in (ops.SUM, ops.MAX):
        found = on_fake_hosts(hostmap, lambda cc: _reduce_scatter_2d(cc, xs, counts, op, block))
        _check_reduce_scatter([r for r, _ in found], _fold(op, xs), counts)
        links.append(sum(s for _, s in found))
    if size % nhosts == 0 and block:
        # the host grid: a host's partial of each other host's blocks crosses once (the
        # model's pick inside a column may fold, as recursive halving on 3 hosts does)
        least = size * (nhosts - 1) * per * 8
        assert least <= links[0] <= 2 * least
    xs = affine_inputs(size, sum(counts))       # non-commutative: near-square, rank order
    with np.errstate(over="ignore"):
        found = on_fake_hosts(hostmap, lambda cc: _reduce_scatter_2d(cc, xs, counts,
                                                                     AFFINE_OP, block))
        _check_reduce_scatter([r for r, _ in found], affine_fold(xs), counts)


def _rs_vector(q, n, dtype=np.int64):
    return ((np.arange(n) * (q + 3) + 5 * q) % 101).astype(dtype)


def _affine_vector(q, n):
    m = np.empty(n, dtype=AFFINE)
    m["a"], m["b"] = q + 2, np.arange(n, dtype=np.uint64) + 10 * q
    return m


def _uneven(p):
    return [(3 * q + 1) % 4 for q in range(p)]


def _rank_gather_cases(comm=None):
    """Every case of the 2-D all-gather and reduce-scatter on real ranks, by name, and which
    algorithm the flight recorder says ran."""
    from pycomm import trace
    comm = pycomm.COMM_WORLD if comm is None else comm
    r, p = comm.rank, comm.size
    out, ran = {}, set()

    def done():
        ran.add(trace.last_completed()[0][4])
    for count in (0, 1, 7, 1001):
        y = np.full(p * count, -1, dtype=np.int64)
        comm.Allgather(_ag_blocks(p, count, np.int64)[r], y, algorithm="2d")
        done()
        out[("ag", count)] = y
    f = np.zeros(p * 5, dtype=np.float32)
    f[r * 5:(r + 1) * 5] = _ag_blocks(p, 5, np.float32)[r]
    comm.Allgather(pycomm.IN_PLACE, f, algorithm="2d")
    out["ag in place"] = f
    for count in (0, 1, 3):
        y = np.full(count, -1, dtype=np.int64)
        comm.Reduce_scatter_block(_rs_vector(r, p * count), y, algorithm="2d")
        done()
        out[("rsb", count)] = y
    z = _rs_vector(r, p * 4, np.int32)
    comm.Reduce_scatter_block(pycomm.IN_PLACE, z, op=pycomm.MAX, algorithm="2d")
    out["rsb max"] = z[:4]
    d = _rs_vector(r, p * 3, np.float64) / 7
    e = np.empty(3)
    comm.Reduce_scatter_block(d, e, algorithm="2d")
    out["rsb float"] = e
    op = pycomm.Op.Create(_compose, commute=False)
    m = np.empty(2, dtype=AFFINE)
    with np.errstate(over="ignore"):
        comm.Reduce_scatter_block(_affine_vector(r, p * 2), m, op=op, algorithm="2d")
        out["rsb affine"] = m
        counts = _uneven(p)
        v = np.empty(counts[r], dtype=AFFINE)
        comm.Reduce_scatter(_affine_vector(r, sum(counts)), v, counts, op=op, algorithm="2d")
        out["rs affine"] = v
    w = np.empty(counts[r], dtype=np.int64)
    comm.Reduce_scatter(_rs_vector(r, sum(counts)), w, counts, algorithm="2d")
    done()
    out["rs"] = w
    out["ran"] = ran
    # forced through the environment; the automatic choice never takes it
    names = {"allgather": 1 << 20, "reduce_scatter_block": 1 << 20, "reduce_scatter": 0}
    for coll in names:
        os.environ["PYCOMM_ALGORITHM_" + coll.upper()] = "2d"
    pycomm.config.reload()
    try:
        out["env"] = {c: comm.chosen_algorithm(c, n) for c, n in names.items()}
        g = np.zeros(p * 2, dtype=np.int64)
        g[2 * r:2 * r + 2] = r
        comm.Allgather(pycomm.IN_PLACE, g)
        out["env ag"] = (g, trace.last_completed()[0][4])
        s = np.empty(2, dtype=np.int64)
        comm.Reduce_scatter_block(np.full(2 * p, r, dtype=np.int64), s)
        out["env rsb"] = (s, trace.last_completed()[0][4])
    finally:
        for coll in names:
            del os.environ["PYCOMM_ALGORITHM_" + coll.upper()]
        pycomm.config.reload()
    out["auto"] = {comm.chosen_algorithm(c, n, algorithm="auto")
                   for c in ("allgather", "reduce_scatter_block") for n in (8, 1 << 20, 1 << 24)}
    return out


def _check_gather_cases(out, p, rank=0):
    for count in (0, 1, 7, 1001):
        np.testing.assert_array_equal(out[("ag", count)],
                                      np.concatenate(_ag_blocks(p, count, np.int64)))
    np.testing.assert_array_equal(out["ag in place"], np.concatenate(_ag_blocks(p, 5, np.float32)))
    for count in (0, 1, 3):
        total = np.sum([_rs_vector(q, p * count) for q in range(p)], axis=0)
        np.testing.assert_array_equal(out[("rsb", count)], total[rank * count:(rank + 1) * count])
    top = np.max([_rs_vector(q, p * 4, np.int32) for q in range(p)], axis=0)
    np.testing.assert_array_equal(out["rsb max"], top[rank * 4:(rank + 1) * 4])
    fl = np.sum([_rs_vector(q, p * 3, np.float64) / 7 for q in range(p)], axis=0)
    np.testing.assert_allclose(out["rsb float"], fl[rank * 3:(rank + 1) * 3], rtol=1e-12)
    counts = _uneven(p)
    lo, hi = sum(counts[:rank]), sum(counts[:rank + 1])
    with np.errstate(over="ignore"):
        am = affine_fold([_affine_vector(q, p * 2) for q in range(p)])
        assert np.array_equal(out["rsb affine"], am[rank * 2:(rank + 1) * 2]), rank
        av = affine_fold([_affine_vector(q, sum(counts)) for q in range(p)])
        assert np.array_equal(out["rs affine"], av[lo:hi]), rank
    np.testing.assert_array_equal(
        out["rs"], np.sum([_rs_vector(q, sum(counts)) for q in range(p)], axis=0)[lo:hi])


def test_real_ranks_allgather_reduce_scatter_2d(world_small):
    p = world_small.size
    for rank, out in enumerate(world_small.run(_rank_gather_cases)):
        _check_gather_cases(out, p, rank)
        assert out["ran"] == {"2d"}, out["ran"]         # the flight recorder's algorithm
        assert out["env"] == {"allgather": "2d", "reduce_scatter_block": "2d",
                              "reduce_scatter": "2d"}
        g, ran = out["env ag"]
        np.testing.assert_array_equal(g, np.repeat(np.arange(p), 2))
        assert ran == "2d"
        s, ran = out["env rsb"]
        np.testing.assert_array_equal(s, np.full(2, p * (p - 1) // 2))
        assert ran == "2d"
        assert "2d" not in out["auto"]


def _rank_gather_on_faked_hosts(hostmap):
    comm = _faked(hostmap)
    try:
        return _rank_gather_cases(comm)
    finally:
        comm.Free()


@pytest.mark.parametrize("world", [(4, "shm")], indirect=True, ids=["n4-shm"])
def test_real_ranks_gather_on_faked_host_layouts(world):
    for hostmap in ([0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]):     # block, cyclic, uneven
        for rank, out in enumerate(world.run(_rank_gather_on_faked_hosts, hostmap)):
            _check_gather_cases(out, 4, rank)
            assert out["ran"] == {"2d"}


def test_unknown_names_list_2d_and_auto_leaves_it_out(shipped_table):
    for coll in ("allgather", "reduce_scatter", "reduce_scatter_block"):
        with pytest.raises(pycomm.ArgumentError, match="2d"):
            algs.choose(coll, 8, 4, requested="2-d")
        assert algs.choose(coll, 1 << 20, 6, requested="2d")[0] == "2d"
        assert algs.choose(coll, 1 << 20, 6, requested="2d", commutative=False)[0] == "2d"
        for n in (8, 1 << 16, 1 << 24):
            for hosts in (None, (2, 2), (3, 3)):
                p = 4 if hosts is None else sum(hosts)
                assert algs.choose(coll, n, p, hosts=hosts, transport="net")[0] != "2d"
        # priced (listed by model_time) on the near-square grid
        assert 0 < algs.model_time(coll, "2d", 1 << 20, 6) < float("inf")
