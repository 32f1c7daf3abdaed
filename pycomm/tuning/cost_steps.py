"""The cost model: a transport's measured :class:`Constants`, the :class:`Pricing` of one
call, and every schedule written out as its sequence of steps (:data:`SCHEDULES`), the
only executable price of each schedule (:func:`pycomm.tuning.cost.cost` sums them). With
a core per rank and one protocol each sum is the closed form its algorithm's module
docstring gives (tests/test_tune.py checks a few against Thakur et al.'s values). A step
costs

    α + wake · o + b β · max(1, m / min(c, L)) + r γ · max(1, m_r / min(c, L))

for ``m`` concurrent copies of ``b`` bytes (a shared-memory rendezvous copies once, on the
receiver's core) and ``m_r`` concurrent reductions of ``r`` bytes, where

* ``α`` and ``β`` are the eager or the rendezvous figures, by the message's size;
* ``c`` is the cores the call's ranks share and ``o = p / c`` the turns of the cores a
  step needs when ranks outnumber cores (``o = 1``, no wake-up, with a core per rank):
  the ranks with work in the step and those waiting in the call, which poll with
  ``sched_yield`` before they sleep (:mod:`pycomm.waiting`) and so are scheduled too.
  ``wake`` is the measured cost of handing the core to a waiting rank;
* ``L``, the *lanes*, is how many copies streaming through working sets the size of the
  call's vector the memory runs at full speed at once
  (:func:`pycomm.tuning.tune.measure_lanes`): copies within their cores' caches run side
  by side, copies through memory share its bus (a segment of a 64 MiB vector comes from
  memory as much as the whole vector does), so a schedule that keeps every rank copying
  (a ring, Rabenseifner, a pipelined chain) gains less from many cores than the cores
  alone suggest, and one that copies along a tree loses less.

A step in which every rank both sends and receives (a ring step, a halving or doubling
exchange, a recursive-doubling, Bruck or dissemination step, a pipelined chain's middle
rank) costs each rank two message calls where the ping-pong that measures α prices one:
it pays :attr:`Pricing.exchange` more, ``α_x - α`` with ``α_x`` the measured exchange
step, and when ranks outnumber cores the measured exchange wake-up ``wake_x`` rather than
``wake`` per turn of the cores (a waiting rank is scheduled about twice per exchange). No
fitted constant enters: α, α_x, β, γ, σ, wake, wake_x and the lanes are measured. Which
measured ranking each term was added for: benchmarks/README.md, "Measurements behind
design choices in the code".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from pycomm import config
from pycomm.collectives.topology import ceil_log2, grid_2d, is_pof2, pof2_floor

__all__ = ["Constants", "Pricing", "SCHEDULES", "TREE_SEGMENT_BYTES", "forced_segment",
           "pipeline_candidates", "pipeline_segment", "twod_time"]


@dataclass(frozen=True)
class Constants:
    """Cost-model constants of one transport (seconds, seconds per byte), as measured.

    ``alpha`` and ``beta`` price a message sent eagerly (up to the eager limit);
    ``alpha_rndv`` and ``beta_rndv`` one sent by the rendezvous protocol (RTS, a one-sided
    or in-place copy, FIN), whose handshake costs more than one eager message and whose
    single copy runs at another rate. None: the eager figures serve both.
    """

    alpha: float   # s per eager message (latency, incl. Python overhead per p2p call)
    beta: float    # s per byte moved between two ranks (eager; memory copies)
    gamma: float   # s per byte combined by a reduction op
    sigma: float   # s per byte of newly allocated scratch (first-touch page faults)
    wake: float = 0.0  # extra s per message when ranks outnumber cores (a waiter's turn)
    alpha_rndv: float | None = None  # s per rendezvous message (handshake included)
    beta_rndv: float | None = None   # s per byte of a rendezvous message
    # ((bytes, lanes), ...) ascending: copies of that size the memory system runs at full
    # speed at once (pycomm.tuning.tune.measure_lanes); empty: as many as there are cores
    lanes: tuple[tuple[float, float], ...] = ()
    # s per exchange step (each rank sends and receives a small message at once); None:
    # the ping-pong's alpha (tables from before it was measured)
    alpha_x: float | None = None
    # ((ranks per core, s), ...) ascending: what an exchange step pays per turn of the
    # cores when ranks outnumber them (pycomm.tuning.tune.measure_exchange_wake); empty: ``wake``
    wake_x: tuple[tuple[float, float], ...] = ()

    def exchange_wake(self, oversubscription: float) -> float:
        """Seconds an exchange step pays per turn of the cores at ``oversubscription``
        ranks per core: linear between the measured points, the end values beyond them;
        ``wake`` when none were measured."""
        return _interpolate(self.wake_x, oversubscription, self.wake, log=False)

    def streams(self, nbytes: float) -> float:
        """Concurrent copies of ``nbytes`` each that run at full speed (interpolated in
        log size between the measured sizes, the end values beyond them; inf: unknown)."""
        return _interpolate(self.lanes, nbytes, math.inf, log=True)


def _interpolate(pts: tuple[tuple[float, float], ...], x: float, empty: float, *,
                 log: bool) -> float:
    """``pts`` ((x, y), ...) ascending, read at ``x``: linear in ``x`` (``log``: in
    ``log x``) between points, the end values beyond them, ``empty`` when there are none."""
    if not pts:
        return empty
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0) if log else (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0)
    return pts[-1][1]


def crowding(concurrent: float, slots: float) -> float:
    """How much slower each of ``concurrent`` copies runs when ``slots`` (cores or lanes)
    serve them all: 1 while there are enough, else their ratio."""
    return 1.0 if concurrent <= slots else concurrent / slots


@dataclass(frozen=True)
class Pricing:
    """What one call is priced with: the transport's constants and the call's own terms."""

    k: Constants      # the transport's, as measured
    cores: float      # cores the call's ranks run on (its ranks, with a core each)
    lanes: float      # copies the memory runs at full speed at once (k.streams(nbytes))
    turns: float      # turns of the cores a step needs (ranks per core; 1: a core each)
    eager: float      # bytes: larger messages go by rendezvous (inf: no rendezvous figures)
    wake: float       # s a step pays per turn of the cores (0 with a core per rank)
    exchange: float   # s an exchange step pays over a one-way one (α_x - α, and wake_x -
    #                   wake per turn of the cores when ranks outnumber them)

    @classmethod
    def of(cls, k: Constants, nbytes: float, size: int, oversubscription: float,
           eager: float) -> "Pricing":
        """The pricing of a call of ``nbytes`` on ``size`` ranks at ``oversubscription``
        ranks per core: the lanes of a working set of ``nbytes`` (every rank streams
        through the call's vector, whatever its message sizes)."""
        over = oversubscription > 1.0
        turns = oversubscription if over else 1.0
        alpha_x = k.alpha_x
        if over and alpha_x is not None:
            alpha_x = alpha_x + max(0.0, k.exchange_wake(turns) - k.wake) * turns
        exchange = 0.0 if alpha_x is None else max(0.0, alpha_x - k.alpha)
        return cls(k, size / turns if over else float(size), k.streams(nbytes), turns,
                   eager, k.wake if over else 0.0, exchange)

    def protocol(self, nbytes: float) -> tuple[float, float]:
        """``(α, β)`` of one message of ``nbytes``: eager up to :attr:`eager`, else
        rendezvous."""
        if nbytes > self.eager:
            return self.k.alpha_rndv, self.k.beta_rndv
        return self.k.alpha, self.k.beta

    def step(self, copy: float = 0.0, copies: float = 0, red: float = 0.0,
             reducers: float = 0) -> float:
        """Seconds of one synchronous step: ``copies`` concurrent copies of ``copy``
        bytes and ``reducers`` concurrent reductions of ``red`` bytes (see above)."""
        alpha, beta = self.protocol(copy)
        slots = min(self.cores, self.lanes)
        return (alpha + self.wake * self.turns
                + copy * beta * crowding(copies, slots)
                + red * self.k.gamma * crowding(reducers, slots))

    def share(self, part: int, of: int) -> "Pricing":
        """The pricing of ``part`` of the call's ``of`` ranks running beside the others
        (a row or column of a grid): their share of the cores and lanes."""
        return replace(self, cores=self.cores * part / of, lanes=self.lanes * part / of)


# -- segments and scratch of the pipelined schedules (the variables they read) ----------

# Segment of the double binary tree when PYCOMM_SEGMENT_BYTES is 0 (automatic).
TREE_SEGMENT_BYTES = 65536

# Smallest segment the pipeline's automatic segment size considers (bytes); candidates are
# the powers of two from here up to the first that holds the whole vector.
MIN_PIPELINE_SEGMENT = 4096


def forced_segment() -> int:
    """``PYCOMM_SEGMENT_BYTES``, or 0 when the segment is left to the model (the default)."""
    return max(0, int(config.get("PYCOMM_SEGMENT_BYTES")))


def pipeline_candidates(n: float) -> list[int]:
    """Segment sizes (bytes) a pipelined chain of ``n`` bytes may use: the forced one, or
    the powers of two from :data:`MIN_PIPELINE_SEGMENT` to the first that holds ``n``."""
    forced = forced_segment()
    if forced:
        return [forced]
    out, s = [MIN_PIPELINE_SEGMENT], MIN_PIPELINE_SEGMENT
    while s < n:
        s *= 2
        out.append(s)
    return out


def _ring_segment() -> int:
    return max(1, config.get("PYCOMM_RING_SEGMENT_BYTES"))


def _halving_segment() -> int:
    return max(1, config.get("PYCOMM_HALVING_SEGMENT_BYTES"))


def halving_messages(b: float) -> float:
    """Messages of a segmented halving or fold exchange of ``b`` bytes."""
    return max(1.0, math.ceil(b / _halving_segment()))


def halving_scratch(n: float, p: int) -> float:
    """Scratch bytes of the halving schedules: two segments of the largest exchange (the
    fold receives ``n``, the first halving ``n/2``)."""
    return 2.0 * min(n if not is_pof2(p) else n / 2, _halving_segment())


def halving_steps(p: int) -> int:
    """log2 of the power-of-two group left after the fold: its halving (or doubling) steps."""
    return pof2_floor(p).bit_length() - 1


# -- the schedules' steps ---------------------------------------------------------------

def binomial_rounds(p: int) -> list[int]:
    """Concurrent transfers in each round of a binomial tree on ``p`` ranks (1, 2, 4, ...)."""
    out, k = [], 1
    while k < p:
        out.append(min(k, p - k))
        k *= 2
    return out


def binomial_scatter_rounds(p: int) -> list[tuple[int, int]]:
    """Rounds of a binomial scatter from vrank 0, largest distance ``d`` first: ``(senders,
    blocks)``, the senders being the vranks ``v = 0 mod 2d`` with ``v + d < p``, the
    largest transfer the root's ``min(d, p - d)`` blocks (of ``p``). Along the root the
    blocks add up to ``p - 1``: the closed form's ``n(p-1)/p``."""
    out, d = [], (1 << (ceil_log2(p) - 1)) if p > 1 else 0
    while d >= 1:
        out.append((len(range(0, p - d, 2 * d)), min(d, p - d)))
        d //= 2
    return out


def _bcast_binomial(n, p, s: Pricing):
    return sum(s.step(n, m) for m in binomial_rounds(p))


def _scatter_binomial(n, p, s: Pricing):
    return sum(s.step(n * blocks / p, m) for m, blocks in binomial_scatter_rounds(p))


def _gather_binomial(n, p, s: Pricing):
    # the scatter's rounds backwards: leaves first, the root's largest subtree last
    return sum(s.step(n * blocks / p, m)
               for m, blocks in reversed(binomial_scatter_rounds(p)))


def _reduce_binomial(n, p, s: Pricing):
    return sum(s.step(n, m, n, m) for m in reversed(binomial_rounds(p))) + n * s.k.sigma


def _ring_steps(n, p, s: Pricing, reduce: bool, segs: float = 1.0) -> float:
    # A step moves a chunk as ``segs`` segments: a message overhead each, but one wake-up
    # per step, since a pipelined chunk's segments arrive back to back.
    b = n / p
    return (p - 1) * (s.step(b, p, b if reduce else 0.0, p if reduce else 0)
                      + (segs - 1) * s.k.alpha + s.exchange)


def _ring_allreduce(n, p, s: Pricing):
    # chunks go as segments of PYCOMM_RING_SEGMENT_BYTES, two of them in flight (scratch)
    segs = max(1.0, math.ceil(n / p / _ring_segment()))
    return (_ring_steps(n, p, s, True, segs) + _ring_steps(n, p, s, False, segs)
            + 2.0 * min(n / p, _ring_segment()) * s.k.sigma)


def _fold(n, p, s: Pricing, reduce: bool) -> float:
    """The fold of a non-power-of-two ``p`` in (``reduce``: segmented, one wake-up, see
    :func:`_ring_steps`) or out; 0 for a power of two."""
    r = p - pof2_floor(p)
    if not r:
        return 0.0
    if reduce:
        return s.step(n, r, n, r) + (halving_messages(n) - 1) * s.k.alpha
    return s.step(n, r)


def _halving(n, p, s: Pricing) -> float:
    q, t, b = pof2_floor(p), 0.0, float(n)
    for _ in range(halving_steps(p)):
        b /= 2
        t += s.step(b, q, b, q) + (halving_messages(b) - 1) * s.k.alpha + s.exchange
    return t


def _doubling(n, p, s: Pricing, echo: bool = False) -> float:
    """The recursive-doubling all-gather; with ``echo`` its first step is the echo of the
    last halving step (:mod:`pycomm.collectives.halving`): a message per segment, and still
    a step of its own, since each echoed segment waits for the partner's reduction of it.
    The overlap of the two phases is not priced, as the ring's is not."""
    q, t, b = pof2_floor(p), 0.0, n / pof2_floor(p)
    for i in range(halving_steps(p)):
        t += s.step(b, q) + s.exchange + ((halving_messages(b) - 1) * s.k.alpha
                                          if echo and i == 0 else 0.0)
        b *= 2
    return t


def _recursive_doubling_allreduce(n, p, s: Pricing):
    q = pof2_floor(p)
    fold_scratch = 2.0 * min(n, _halving_segment()) if q != p else 0.0
    return (_fold(n, p, s, True) + _fold(n, p, s, False) + (n + fold_scratch) * s.k.sigma
            + halving_steps(p) * (s.exchange + s.step(n, q, n, q)))


def _pipeline_at(n, p, s: Pricing, seg: float) -> float:
    """The chain broadcast in segments of ``seg`` bytes: ``S = ceil(n / seg)`` segments,
    ``S + p - 2`` steps. In step ``t``, ``min(p - 1, t + 1)`` ranks receive a segment; a
    middle rank also forwards one in every step, an exchange's second message call
    more than an end rank pays."""
    segs = max(1, math.ceil(n / seg))
    b = n / segs
    extra = s.exchange if p > 2 else 0.0
    ramp = sum(s.step(b, t + 1) for t in range(p - 2))
    return ramp + segs * s.step(b, p - 1) + (segs + p - 2) * extra


def pipeline_segment(n: float, p: int, s: Pricing) -> int:
    """The segment (bytes) among :func:`pipeline_candidates` that the step model prices
    lowest for a chain broadcast of ``n`` bytes: larger segments pay fewer messages,
    smaller ones fill the chain sooner (the optimum of the closed form is
    ``sqrt((p - 2) n β / α)`` bytes, as in Open MPI's and MPICH's segmented pipelines)."""
    return min(pipeline_candidates(n), key=lambda seg: _pipeline_at(n, p, s, seg))


def _linear(n, p, s: Pricing):
    # the root posts all p-1 transfers; the peers wake together, the root copies serially
    return s.step() + (p - 2) * s.k.alpha + n * ((p - 1) / p) * s.k.beta


def _log_steps(p: int, s: Pricing, copy: float, red: float = 0.0) -> float:
    """``ceil(log2 p)`` exchange steps of every rank, each copying ``copy`` bytes (and
    reducing ``red``)."""
    return ceil_log2(p) * (s.step(copy, p, red, p if red else 0) + s.exchange)


def _allgather_doubling(n, p, s: Pricing):
    # step i moves min(2^i, p - 2^i) blocks (Bruck's; recursive doubling's for a power of 2)
    return sum(s.step(n / p * min(2 ** i, p - 2 ** i), p) + s.exchange
               for i in range(ceil_log2(p)))


def _double_binary_tree(n, p, s: Pricing):
    # S + L + 1 steps (the schedule's lag is L + 1); per step an inner rank waits for two
    # children and a parent and sends about three segments of b bytes. Every step is a
    # synchronisation with tree neighbours, which is what makes it slow in Python. Priced
    # as a whole rather than step by step: every rank copies at once (β and γ shared by
    # all p ranks' copies), and when ranks outnumber cores each message wakes a sleeper.
    segs = max(1.0, math.ceil(n / 2 / float(forced_segment() or TREE_SEGMENT_BYTES)))
    b = n / 2 / segs  # bytes per segment per tree
    alpha, beta = s.protocol(b)
    f = crowding(p, min(s.cores, s.lanes))
    return (segs + ceil_log2(p) + 1) * (4 * (alpha + s.wake) + 3 * b * (beta * f)
                                        + 2 * b * (s.k.gamma * f))


Schedule = Callable[[float, int, Pricing], float]

# (collective, algorithm) -> f(n bytes, p >= 2 ranks, pricing) -> seconds
SCHEDULES: dict[tuple[str, str], Schedule] = {
    ("barrier", "dissemination"): lambda n, p, s: _log_steps(p, s, 0.0),
    ("barrier", "binomial"): lambda n, p, s: 2 * ceil_log2(p) * s.step(),
    ("bcast", "binomial"): _bcast_binomial,
    ("bcast", "scatter_allgather"):
        lambda n, p, s: _scatter_binomial(n, p, s) + _ring_steps(n, p, s, False),
    ("bcast", "pipeline"):
        lambda n, p, s: _pipeline_at(n, p, s, pipeline_segment(n, p, s)),
    ("reduce", "binomial"): _reduce_binomial,
    ("reduce", "rabenseifner"):
        lambda n, p, s: (_fold(n, p, s, True) + _halving(n, p, s)
                         + _gather_binomial(n, pof2_floor(p), s)
                         + halving_scratch(n, p) * s.k.sigma),
    ("allreduce", "ring"): _ring_allreduce,
    ("allreduce", "rabenseifner"):
        lambda n, p, s: (_fold(n, p, s, True) + _fold(n, p, s, False) + _halving(n, p, s)
                         + _doubling(n, p, s, echo=True) + halving_scratch(n, p) * s.k.sigma),
    ("allreduce", "recursive_doubling"): _recursive_doubling_allreduce,
    ("allreduce", "binomial"):
        lambda n, p, s: _reduce_binomial(n, p, s) + _bcast_binomial(n, p, s),
    ("allreduce", "double_binary_tree"): _double_binary_tree,
    ("allgather", "ring"): lambda n, p, s: _ring_steps(n, p, s, False),
    ("allgather", "recursive_doubling"): _allgather_doubling,
    ("allgather", "bruck"):   # + the rotation into place, a local copy of n
        lambda n, p, s: (_allgather_doubling(n, p, s)
                         + n * (s.k.beta * crowding(p, s.cores) + s.k.sigma)),
    ("allgatherv", "ring"): lambda n, p, s: _ring_steps(n, p, s, False),
    ("gather", "linear"): _linear,
    ("gather", "binomial"): lambda n, p, s: _gather_binomial(n, p, s) + n * s.k.sigma,
    ("gatherv", "linear"): _linear,
    ("scatter", "linear"): _linear,
    ("scatter", "binomial"): lambda n, p, s: _scatter_binomial(n, p, s) + n * s.k.sigma,
    ("scatterv", "linear"): _linear,
    ("alltoall", "pairwise"): lambda n, p, s: _ring_steps(n, p, s, False),
    ("alltoall", "bruck"): lambda n, p, s: _log_steps(p, s, n / 2) + 2 * n * s.k.sigma,
    ("alltoallv", "pairwise"): lambda n, p, s: _ring_steps(n, p, s, False),
    ("reduce_scatter", "ring"):
        lambda n, p, s: _ring_steps(n, p, s, True) + n / p * s.k.sigma,
    ("reduce_scatter", "pairwise"):
        lambda n, p, s: _ring_steps(n, p, s, True) + 2 * n / p * s.k.sigma,
    ("reduce_scatter", "recursive_halving"):
        lambda n, p, s: (_fold(n, p, s, True) + _halving(n, p, s)
                         + _fold(n / p, p, s, False)
                         + (n + halving_scratch(n, p)) * s.k.sigma),
    ("scan", "recursive_doubling"):
        lambda n, p, s: _log_steps(p, s, n, 2 * n) + 2 * n * s.k.sigma,
}
SCHEDULES[("exscan", "recursive_doubling")] = SCHEDULES[("scan", "recursive_doubling")]
for _alg in ("ring", "pairwise", "recursive_halving"):
    SCHEDULES[("reduce_scatter_block", _alg)] = SCHEDULES[("reduce_scatter", _alg)]
# The hierarchical schedules (pycomm.collectives.hierarchical) priced as on one host, i.e.
# their local steps alone: model_time has no host layout. On a communicator spanning
# hosts choose() prices them with pycomm.tuning.cost_hosts instead.
SCHEDULES.update({
    ("allreduce", "hierarchical"):
        lambda n, p, s: (SCHEDULES[("reduce_scatter", "ring")](n, p, s)
                         + _ring_steps(n, p, s, False)),
    ("reduce", "hierarchical"):
        lambda n, p, s: SCHEDULES[("reduce_scatter", "ring")](n, p, s) + _linear(n, p, s),
    ("bcast", "hierarchical"): _bcast_binomial,
    ("allgather", "hierarchical"): lambda n, p, s: _ring_steps(n, p, s, False),
    ("barrier", "hierarchical"): lambda n, p, s: 2 * (p - 1) * s.step(),
})


# The 2-D schedules' inner candidates (pycomm.collectives.twod, whose phases are picked
# among the same ones): every reduce-scatter; every flat all-reduce with a step model;
# every flat all-gather (recursive doubling only for a power-of-two group).
TWOD_ROW = ("ring", "pairwise", "recursive_halving")
TWOD_COLUMN = ("recursive_doubling", "rabenseifner", "ring", "binomial")
TWOD_GATHER = ("recursive_doubling", "ring", "bruck")


def twod_time(n: float, p: int, s: Pricing, collective: str = "allreduce") -> float:
    """Seconds of a 2-D schedule on the near-square grid ``R x C`` of ``p`` ranks, each
    phase at its best candidate in :data:`SCHEDULES`: a phase's ``R`` rows, or ``C``
    columns, run at once and share the cores and the memory's lanes
    (:meth:`Pricing.share`), so that a step's ``p`` concurrent copies share them as one
    flat step's do.

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
        sq = s.share(q, p)
        return min(SCHEDULES[(coll, a)](b, q, sq) for a in algs)
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
    SCHEDULES[(_coll, "2d")] = lambda n, p, s, _x=_coll: twod_time(n, p, s, _x)
