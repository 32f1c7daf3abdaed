"""The cost model's step models: every schedule written out as its sequence of steps.

:func:`pycomm.tuning.cost.cost` evaluates these (:data:`SCHEDULES`), the only executable
price of each schedule, so that each message is priced by its protocol and, when ranks
outnumber cores, each step pays for the turns of the cores it needs. With a core per rank
and one protocol each sum is the closed form its algorithm's module docstring gives
(tests/test_tune.py checks a few against Thakur et al.'s values)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from pycomm.tuning.cost_terms import (Constants, pipeline_candidates, _ring_segs,
                                         _ring_scratch, _hsegs, _pipe_scratch,
                                         _halving_scratch, _lg, _lq, _frac, _folds, _protocol)
from pycomm.collectives.topology import ceil_log2, grid_2d, pof2_floor

__all__ = ["SCHEDULES", "pipeline_segment", "twod_time"]


# ---------------------------------------------------------------------------------------
# Oversubscribed hosts: a step-by-step model.
#
# When ranks outnumber cores, the closed forms mislead: they assume every
# rank runs whenever it has work. On ``c`` cores shared by ``p`` ranks, every step needs
# ``o = p / c`` turns of the cores: the ranks with work in it, and the ranks waiting in
# the call too, which poll with ``sched_yield`` before they sleep (:mod:`pycomm.waiting`)
# and so are scheduled as well (counting only the ranks with work made a binomial tree's
# late rounds, with 2 or 4 ranks busy, too cheap). And ``m`` copies (or reductions) that would run side by side on ``m`` cores share
# ``c`` of them. So each schedule is written out below as its sequence of steps; a step
# costs
#
#     α + wake · o + b β · max(1, m / min(c, L)) + r γ · max(1, m_r / min(c, L))
#
# (``o = 1`` and no wake-up with a core per rank) for ``m`` concurrent copies of ``b``
# bytes (a shared-memory rendezvous copies once, on the receiver's core) and ``m_r``
# concurrent reductions of ``r`` bytes. ``wake`` is the measured cost of handing the core
# to a waiting rank
# (``pycomm.tuning.tune``'s token ring; the waiter yields its core, then sleeps: see
# :mod:`pycomm.waiting`). ``L``, the *lanes*, is how many copies streaming through
# working sets the size of the call's vector the memory system runs at full speed at
# once (``pycomm.tuning.tune.measure_lanes``): copies within their cores' caches run side by
# side, copies through memory share its bus (whatever the message size: a segment of a
# 64 MiB vector comes from memory as much as the whole vector does), so a
# schedule that keeps every rank copying at once (a ring, Rabenseifner, a pipelined
# chain) gains less from many cores than the cores alone suggest, and one that copies
# along a tree loses less. It applies with a core per rank too.
#
# A step in which every rank both sends and receives (a ring step, a halving or doubling
# exchange, a recursive-doubling, Bruck or dissemination step, a pipelined chain's middle
# rank) costs each rank two message calls where the ping-pong that measures α prices one:
# such a step pays ``xtra = α_x - α`` more, α_x being the measured exchange step
# (``pycomm.tuning.tune``). When ranks outnumber cores, such a step also pays ``wake_x``, the measured exchange
# wake-up, rather than ``wake`` per turn of the cores (carried in α_x by
# :func:`pycomm.tuning.cost._cores`): a waiting rank is scheduled about twice per
# exchange where a one-way hop hands the core over once.
# No fitted constant enters: α, α_x, β, γ, σ, wake, wake_x and the lanes are measured.
# Which measured ranking each term was added for: benchmarks/README.md, "Measurements
# behind design choices in the code".
# ---------------------------------------------------------------------------------------


def _share(m: float, cores: float) -> float:
    return 1.0 if m <= cores else m / cores


def _step(k: Constants, c: float, copy: float = 0.0, copies: float = 0,
          red: float = 0.0, reducers: float = 0) -> float:
    """Seconds of one synchronous step on ``c`` cores (see the comment above)."""
    alpha, beta = _protocol(k, copy)
    return (alpha + k.wake * k.turns
            + copy * beta * _share(copies, min(c, k.mem))
            + red * k.gamma * _share(reducers, min(c, k.mem)))


def _rounds(p: int) -> list[int]:
    """Concurrent transfers in each round of a binomial tree on ``p`` ranks (1, 2, 4, ...)."""
    out, k = [], 1
    while k < p:
        out.append(min(k, p - k))
        k *= 2
    return out


def _o_bcast_binomial(n, p, k, c):
    return sum(_step(k, c, n, m) for m in _rounds(p))


def _subtree_rounds(p: int) -> list[tuple[int, int]]:
    """Rounds of a binomial scatter from vrank 0, largest distance ``d`` first: ``(senders,
    blocks)``, the senders being the vranks ``v = 0 mod 2d`` with ``v + d < p``, the
    largest transfer the root's ``min(d, p - d)`` blocks (of ``p``). Along the root the
    blocks add up to ``p - 1``: the closed form's ``n(p-1)/p``."""
    out, d = [], (1 << (ceil_log2(p) - 1)) if p > 1 else 0
    while d >= 1:
        out.append((len(range(0, p - d, 2 * d)), min(d, p - d)))
        d //= 2
    return out


def _o_scatter_binomial(n, p, k, c):
    return sum(_step(k, c, n * blocks / p, m) for m, blocks in _subtree_rounds(p))


def _o_ring_steps(n, p, k, c, reduce: bool, segs: float = 1.0) -> float:
    # A step moves a chunk as ``segs`` segments: a message overhead each, but one wake-up
    # per step, since a pipelined chunk's segments arrive back to back.
    b = n / p
    return (p - 1) * (_step(k, c, b, p, b if reduce else 0.0, p if reduce else 0)
                      + (segs - 1) * k.alpha + k.xtra)


def _o_fold(n, p, k, c, reduce: bool) -> float:
    r = p - pof2_floor(p)
    if not r:
        return 0.0
    if reduce:  # the fold in: segmented, one wake-up (see _o_ring_steps)
        return _step(k, c, n, r, n, r) + (_hsegs(n) - 1) * k.alpha
    return _step(k, c, n, r)


def _o_halving(n, p, k, c) -> float:
    q, t, b = pof2_floor(p), 0.0, float(n)
    for _ in range(_lq(p)):
        b /= 2
        t += _step(k, c, b, q, b, q) + (_hsegs(b) - 1) * k.alpha + k.xtra
    return t


def _o_doubling(n, p, k, c, echo: bool = False) -> float:
    """The recursive-doubling all-gather; with ``echo`` its first step is the echo of the
    last halving step (:mod:`pycomm.collectives.halving`): a message per segment, and still
    a step of its own, since each echoed segment waits for the partner's reduction of it.
    The overlap of the two phases is not priced, as the ring's is not."""
    q, t, b = pof2_floor(p), 0.0, n / pof2_floor(p)
    for i in range(_lq(p)):
        t += _step(k, c, b, q) + k.xtra + ((_hsegs(b) - 1) * k.alpha if echo and i == 0
                                           else 0.0)
        b *= 2
    return t


def _o_pipeline_seg(n, p, k, c, seg: float) -> float:
    """The chain broadcast in segments of ``seg`` bytes: ``S = ceil(n / seg)`` segments,
    ``S + p - 2`` steps. In step ``s``, ``min(p - 1, s + 1)`` ranks receive a segment; a
    middle rank also forwards one in every step, an exchange's second message call
    (``xtra``) more than an end rank pays."""
    segs = max(1, math.ceil(n / seg))
    b = n / segs
    extra = k.xtra if p > 2 else 0.0
    ramp = sum(_step(k, c, b, s + 1) for s in range(p - 2))
    return ramp + segs * _step(k, c, b, p - 1) + (segs + p - 2) * extra


def pipeline_segment(n, p, k, c) -> int:
    """The segment (bytes) among :func:`~pycomm.tuning.cost_terms.pipeline_candidates`
    that the step model prices lowest for a chain broadcast of ``n`` bytes: larger
    segments pay fewer messages, smaller ones fill the chain sooner (the optimum of the
    closed form is ``sqrt((p - 2) n β / α)`` bytes, as in Open MPI's and MPICH's segmented
    pipelines)."""
    return min(pipeline_candidates(n), key=lambda seg: _o_pipeline_seg(n, p, k, c, seg))


def _o_pipeline(n, p, k, c):
    return _o_pipeline_seg(n, p, k, c, pipeline_segment(n, p, k, c))


def _o_reduce_binomial(n, p, k, c):
    return sum(_step(k, c, n, m, n, m) for m in reversed(_rounds(p))) + n * k.sigma


def _o_gather_steps(n, p, k, c):
    # the scatter's rounds backwards: leaves first, the root's largest subtree last
    return sum(_step(k, c, n * blocks / p, m) for m, blocks in reversed(_subtree_rounds(p)))


def _o_gather_binomial(n, p, k, c):
    return _o_gather_steps(n, p, k, c) + n * k.sigma


def _o_linear(n, p, k, c):
    # the root posts all p-1 transfers; the peers wake together, the root copies serially
    return _step(k, c) + (p - 2) * k.alpha + n * _frac(p) * k.beta


SCHEDULES: dict[tuple[str, str], Callable[[float, int, Constants, float], float]] = {
    ("barrier", "dissemination"): lambda n, p, k, c: _lg(p) * (_step(k, c) + k.xtra),
    ("barrier", "binomial"): lambda n, p, k, c: 2 * _lg(p) * _step(k, c),
    ("bcast", "binomial"): _o_bcast_binomial,
    ("bcast", "scatter_allgather"):
        lambda n, p, k, c: _o_scatter_binomial(n, p, k, c) + _o_ring_steps(n, p, k, c, False),
    ("bcast", "pipeline"): _o_pipeline,
    ("reduce", "binomial"): _o_reduce_binomial,
    ("reduce", "rabenseifner"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_halving(n, p, k, c)
                            + _o_gather_steps(n, pof2_floor(p), k, c)
                            + _halving_scratch(n, p) * k.sigma),
    ("allreduce", "ring"):
        lambda n, p, k, c: (_o_ring_steps(n, p, k, c, True, _ring_segs(n, p))
                            + _o_ring_steps(n, p, k, c, False, _ring_segs(n, p))
                            + _ring_scratch(n, p) * k.sigma),
    ("allreduce", "rabenseifner"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_fold(n, p, k, c, False)
                            + _o_halving(n, p, k, c)
                            + _o_doubling(n, p, k, c, echo=True)
                            + _halving_scratch(n, p) * k.sigma),
    ("allreduce", "recursive_doubling"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_fold(n, p, k, c, False)
                            + (n + (_pipe_scratch(n) if _folds(p) else 0.0)) * k.sigma
                            + _lq(p) * (k.xtra + _step(k, c, n, pof2_floor(p), n,
                                                        pof2_floor(p)))),
    ("allreduce", "binomial"):
        lambda n, p, k, c: _o_reduce_binomial(n, p, k, c) + _o_bcast_binomial(n, p, k, c),
    ("allgather", "ring"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("allgather", "recursive_doubling"):
        lambda n, p, k, c: sum(_step(k, c, n / p * min(2 ** i, p - 2 ** i), p)
                               + k.xtra for i in range(_lg(p))),
    ("allgather", "bruck"):
        lambda n, p, k, c: (sum(_step(k, c, n / p * min(2 ** i, p - 2 ** i), p)
                                + k.xtra for i in range(_lg(p)))
                            + n * (k.beta * _share(p, c) + k.sigma)),
    ("allgatherv", "ring"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("gather", "linear"): _o_linear,
    ("gather", "binomial"): _o_gather_binomial,
    ("scatter", "linear"): _o_linear,
    ("scatter", "binomial"): lambda n, p, k, c: _o_scatter_binomial(n, p, k, c) + n * k.sigma,
    ("alltoall", "pairwise"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("alltoall", "bruck"):
        lambda n, p, k, c: _lg(p) * (_step(k, c, n / 2, p) + k.xtra) + 2 * n * k.sigma,
    ("reduce_scatter", "ring"):
        lambda n, p, k, c: _o_ring_steps(n, p, k, c, True) + n / p * k.sigma,
    ("reduce_scatter", "pairwise"):
        lambda n, p, k, c: _o_ring_steps(n, p, k, c, True) + 2 * n / p * k.sigma,
    ("reduce_scatter", "recursive_halving"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_halving(n, p, k, c)
                            + _o_fold(n / p, p, k, c, False)
                            + (n + _halving_scratch(n, p)) * k.sigma),
    ("scan", "recursive_doubling"):
        lambda n, p, k, c: (_lg(p) * (_step(k, c, n, p, 2 * n, p) + k.xtra)
                            + 2 * n * k.sigma),
    ("exscan", "recursive_doubling"):
        lambda n, p, k, c: (_lg(p) * (_step(k, c, n, p, 2 * n, p) + k.xtra)
                            + 2 * n * k.sigma),
}
for _alg in ("ring", "pairwise", "recursive_halving"):
    SCHEDULES[("reduce_scatter_block", _alg)] = SCHEDULES[("reduce_scatter", _alg)]
# The hierarchical schedules (pycomm.collectives.hierarchical) priced as on one host, i.e.
# their local steps alone: model_time has no host layout. On a communicator spanning
# hosts choose() prices them with pycomm.tuning.cost_hosts instead.
SCHEDULES.update({
    ("allreduce", "hierarchical"):
        lambda n, p, k, c: (SCHEDULES[("reduce_scatter", "ring")](n, p, k, c)
                            + SCHEDULES[("allgatherv", "ring")](n, p, k, c)),
    ("reduce", "hierarchical"):
        lambda n, p, k, c: (SCHEDULES[("reduce_scatter", "ring")](n, p, k, c)
                            + _o_linear(n, p, k, c)),
    ("bcast", "hierarchical"): _o_bcast_binomial,
    ("allgather", "hierarchical"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("barrier", "hierarchical"): lambda n, p, k, c: 2 * (p - 1) * _step(k, c),
})


# The 2-D schedules' inner candidates (pycomm.collectives.twod, whose phases are picked
# among the same ones): every reduce-scatter; every flat all-reduce with a step model;
# every flat all-gather (recursive doubling only for a power-of-two group).
TWOD_ROW = ("ring", "pairwise", "recursive_halving")
TWOD_COLUMN = ("recursive_doubling", "rabenseifner", "ring", "binomial")
TWOD_GATHER = ("recursive_doubling", "ring", "bruck")


def twod_time(n: float, p: int, k: Constants, c: float,
              collective: str = "allreduce") -> float:
    """Seconds of a 2-D schedule on the near-square grid ``R x C`` of ``p`` ranks on ``c``
    cores, each phase at its best candidate in :data:`SCHEDULES`: a phase's ``R`` rows,
    or ``C`` columns, run at once and share the cores, ``c * C / p`` a row, ``c * R / p``
    a column, and the memory's lanes likewise, so that a step's ``p`` concurrent copies
    share them as one flat step's do.

    ``collective``: ``"allreduce"`` (the row reduce-scatter of ``n`` bytes on ``C`` ranks,
    the column all-reduce of ``n/C`` on ``R``, the row all-gather), ``"allgather"`` (the
    rows' all-gathers of ``n/R`` bytes, then the columns' of ``n``) or
    ``"reduce_scatter"``/``"reduce_scatter_block"`` (the columns' reduce-scatters of ``n``,
    then the rows' of ``n/R``; the commutative ops' grid, no copy of the vector)."""
    rows, cols = grid_2d(p)

    def best(coll: str, algs: tuple, b: float, q: int) -> float:
        if q <= 1:
            return 0.0
        if coll == "allgather" and q & (q - 1):
            algs = tuple(a for a in algs if a != "recursive_doubling")
        kq = replace(k, mem=k.mem * q / p)
        return min(SCHEDULES[(coll, a)](b, q, kq, c * q / p) for a in algs)
    if collective == "allgather":
        return (best("allgather", TWOD_GATHER, n / rows, cols)
                + best("allgather", TWOD_GATHER, n, rows))
    if collective in ("reduce_scatter", "reduce_scatter_block"):
        return (best("reduce_scatter", TWOD_ROW, n, rows)
                + best("reduce_scatter", TWOD_ROW, n / rows, cols))
    return (best("reduce_scatter", TWOD_ROW, n, cols)
            + best("allreduce", TWOD_COLUMN, n / cols, rows)
            + best("allgatherv", ("ring",), n, cols))


for _coll in ("allreduce", "allgather", "reduce_scatter", "reduce_scatter_block"):
    SCHEDULES[(_coll, "2d")] = (lambda n, p, k, c, _x=_coll: twod_time(n, p, k, c, _x))
