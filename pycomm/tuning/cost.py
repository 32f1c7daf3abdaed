"""The cost model the automatic choice minimises: every schedule's price, written once.

Each schedule in :data:`SCHEDULES` is priced as the sum of its steps in Hockney's α-β
model with a reduction term γ, as Thakur, Rabenseifner & Gropp use it ("Optimization of
collective communication operations in MPICH", IJHPCA 19(1), 2005): with a core per rank
and one protocol each sum is that paper's closed form (tests/test_tune_model.py checks them).
NCCL's tuner prices each (collective, algorithm, protocol) the same way, a latency per
step plus bytes over a bandwidth (``src/graph/tuning.cc``); our protocols are eager and
rendezvous. A step in which ``m`` ranks each send ``b`` bytes and reduce ``r`` costs::

    α + (b β + r γ) · max(1, m / min(cores, lanes)) + o · wake

* ``α``, ``β``: the eager figures up to ``PYCOMM_EAGER_LIMIT`` bytes, else the rendezvous
  ones (``alpha_rndv``, ``beta_rndv``); an *exchange* step, where every rank also
  receives (ring, halving, doubling, Bruck, dissemination), pays ``alpha_x`` for ``alpha``;
* ``cores``: those the call's ranks run on; ``lanes``: how many copies streaming through
  a working set the size of the call's vector the memory runs at full speed at once;
* ``o``: ranks per core when they outnumber the cores (else no such term): every step
  waits for each core to turn over ``o`` times, the waiting ranks' turns included (they
  poll with ``sched_yield``, :mod:`pycomm.waiting`), at ``wake`` per turn, or
  ``wake_x(o)`` for an exchange step.

Every constant is measured by ``python -m pycomm.tuning.tune`` (why each term is there:
benchmarks/README.md, "Measurements behind design choices in the code"). The shipped
table, ``tuned.json``, records its run under ``"source"``; ``PYCOMM_TUNE_FILE`` names a
table whose entries replace the shipped ones; a transport without one is priced as ``shm``.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from pycomm import config
from pycomm.topology import ceil_log2, grid_2d, pof2_floor
from pycomm.errors import ArgumentError

__all__ = ["Constants", "Pricing", "SCHEDULES", "DEFAULT_TRANSPORT", "NET", "SHIPPED_TABLE",
           "TREE_SEGMENT_BYTES", "constants", "cost", "forced_segment", "load_table",
           "model_transport", "pipeline_candidates", "pricing", "segment_bytes"]

DEFAULT_TRANSPORT = "shm"
NET = "net"      # the entry of the link between hosts (pycomm/tuning/tune_links.py)
SHIPPED_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned.json")
TREE_SEGMENT_BYTES = 65536     # the double binary tree's segment when PYCOMM_SEGMENT_BYTES=0
MIN_PIPELINE_SEGMENT = 4096    # the smallest segment the chain broadcast's model considers
# The 2-D schedules' inner candidates (pycomm.collectives.twod picks among the same).
TWOD_ROW = ("ring", "pairwise", "recursive_halving")
TWOD_COLUMN = ("recursive_doubling", "rabenseifner", "ring", "binomial")
TWOD_GATHER = ("recursive_doubling", "ring", "bruck")

Curve = tuple[tuple[float, float], ...]


def read_curve(points: Curve, x: float, empty: float, *, log: bool) -> float:
    """``points`` ((x, y), ... ascending) read at ``x``: linear between points (in ``log x``
    when ``log``), the end values beyond them, ``empty`` when there are none."""
    if not points:
        return empty
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0) if log else (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True)
class Constants:
    """One transport's measured constants (module docstring), in seconds and seconds per
    byte; a rendezvous or exchange figure left None is the eager one. ``lanes``: ``((bytes,
    copies), ...)``, empty: unlimited; ``wake_x``: ``((ranks per core, s), ...)``, empty:
    ``wake``."""

    alpha: float
    beta: float
    gamma: float
    wake: float = 0.0
    alpha_rndv: float | None = None
    beta_rndv: float | None = None
    alpha_x: float | None = None
    lanes: Curve = ()
    wake_x: Curve = ()

    def __post_init__(self):
        for name, eager in (("alpha_rndv", self.alpha), ("beta_rndv", self.beta),
                            ("alpha_x", self.alpha)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, eager)


# Used only when the shipped table cannot be read (a broken install).
FALLBACK = Constants(alpha=8e-6, beta=1 / 6e9, gamma=1 / 4e9)
_SCALARS = ("alpha", "beta", "gamma", "wake", "alpha_rndv", "beta_rndv", "alpha_x")
_CURVES = {"lanes": ("{bytes: concurrent copies >= 1}", lambda x, y: x > 0 and y >= 1),
           "wake_x": ("{ranks per core > 1: seconds >= 0}", lambda x, y: x > 1 and y >= 0)}
_tables: dict[str, dict[str, Constants]] = {}


def _entry(where: str, entry) -> Constants:
    """One table entry (a JSON object) as :class:`Constants`; other keys are ignored."""
    if not isinstance(entry, dict) or not {"alpha", "beta", "gamma"} <= set(entry):
        raise ArgumentError(f"{where} needs numeric alpha, beta and gamma")
    values: dict = {}
    for name in (n for n in _SCALARS if n in entry):
        try:
            values[name] = float(entry[name])
        except (TypeError, ValueError):
            raise ArgumentError(f"{where} has a non-numeric {name}") from None
        if not (math.isfinite(values[name]) and values[name] >= 0):
            raise ArgumentError(f"{where} has a negative or non-finite constant: "
                                f"{name} = {values[name]}")
    for name, (shape, valid) in _CURVES.items():
        try:
            points = tuple(sorted((float(x), float(y))
                                  for x, y in dict(entry.get(name) or {}).items()))
        except (TypeError, ValueError):
            points = ((math.nan, math.nan),)
        if not all(math.isfinite(x) and math.isfinite(y) and valid(x, y) for x, y in points):
            raise ArgumentError(f"{where} needs {name} as {shape}, got {entry.get(name)!r}")
        values[name] = points
    return Constants(**values)


def _read(path: str) -> dict[str, Constants]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"cost-model table {path!r} cannot be read: {exc}; write one "
                            "with python -m pycomm.tuning.tune --out FILE") from None
    return {transport: _entry(f"cost-model table {path!r}: entry {transport!r}", entry)
            for transport, entry in raw.items() if transport != "source"}


def load_table(path: str | None = None) -> dict[str, Constants]:
    """Return ``{transport: Constants}``: the table at ``path`` (None: ``PYCOMM_TUNE_FILE``,
    unset: none) over the shipped table, cached per path.

    Raises:
        ArgumentError: the file cannot be read or an entry is malformed (naming the file).
    """
    if path is None:
        path = config.get("PYCOMM_TUNE_FILE") or ""
    table = _tables.get(path)
    if table is None:
        try:
            table = _read(SHIPPED_TABLE)
        except ArgumentError:
            table = {}
        table.setdefault(DEFAULT_TRANSPORT, FALLBACK)
        table = _tables[path] = {**table, **(_read(path) if path else {})}
    return table


def constants(transport: str = DEFAULT_TRANSPORT) -> Constants:
    """The constants of ``transport`` (``shm``'s when the table has none for it)."""
    table = load_table()
    return table.get(transport) or table[DEFAULT_TRANSPORT]


def model_transport(transport_name: str | None, nhosts: int | None = None) -> str:
    """The table entry a communicator (its ``transport_name``, e.g. ``"shm+tcp"``, and
    the hosts it spans, None if unknown) is priced with, the slowest link its steps cross:
    ``shm`` on one host sharing memory, :data:`NET` across hosts when the table has it,
    else the slowest transport named (``tcp``, ``rdma``, ``shm``)."""
    name = transport_name or DEFAULT_TRANSPORT
    if nhosts == 1 and DEFAULT_TRANSPORT in name.split("+"):
        return DEFAULT_TRANSPORT
    if nhosts is not None and nhosts > 1 and NET in load_table():
        return NET
    return "tcp" if "tcp" in name else ("rdma" if "rdma" in name else DEFAULT_TRANSPORT)


@dataclass(frozen=True)
class Pricing:
    """What one call's steps are priced with (see the module docstring): the transport's
    constants ``k`` and the call's own terms, none of which is kept in ``k``."""

    k: Constants
    slots: float      # min(cores, lanes): concurrent copies that run at full speed
    turns: float      # ranks per core when they outnumber the cores, else 1
    eager: float      # bytes: larger messages go by rendezvous
    wake: float       # s a step pays per turn of the cores (0 with a core per rank)
    exchange: float   # s an exchange step pays over a one-way one

    def protocol(self, nbytes: float) -> tuple[float, float]:
        """``(α, β)`` of one message of ``nbytes``."""
        if nbytes > self.eager:
            return self.k.alpha_rndv, self.k.beta_rndv
        return self.k.alpha, self.k.beta

    def step(self, nbytes: float = 0.0, movers: float = 0, reduced: float = 0.0,
             exchange: bool = False) -> float:
        """Seconds of one step: ``movers`` ranks each send ``nbytes`` and reduce
        ``reduced`` bytes at once; ``exchange``: each also receives."""
        alpha, beta = self.protocol(nbytes)
        crowd = max(1.0, movers / self.slots)
        return (alpha + self.wake * self.turns + (self.exchange if exchange else 0.0)
                + (nbytes * beta + reduced * self.k.gamma) * crowd)

    def share(self, part: int, of: int) -> "Pricing":
        """The pricing of ``part`` of the call's ``of`` ranks running beside the others
        (a row or a column of a grid): their share of the cores and lanes."""
        return replace(self, slots=self.slots * part / of)


def pricing(transport: str, nbytes: float, size: int, oversubscription: float = 1.0) -> Pricing:
    """The :class:`Pricing` of a call of ``nbytes`` on ``size`` ranks at
    ``oversubscription`` ranks per core with ``transport``'s constants."""
    k = constants(transport)
    over = oversubscription > 1.0
    turns = oversubscription if over else 1.0
    exchange = k.alpha_x - k.alpha
    if over:
        exchange += max(0.0, read_curve(k.wake_x, turns, k.wake, log=False) - k.wake) * turns
    return Pricing(k, min(size / turns, read_curve(k.lanes, nbytes, math.inf, log=True)),
                   turns, float(config.get("PYCOMM_EAGER_LIMIT")), k.wake if over else 0.0,
                   max(0.0, exchange))


# -- the pieces schedules are made of ----------------------------------------------------

def binomial_rounds(p: int) -> list[int]:
    """Concurrent transfers in each round of a binomial tree on ``p`` ranks: 1, 2, 4, ..."""
    return [min(k, p - k) for k in (1 << i for i in range(ceil_log2(p)))]


def scatter_rounds(p: int) -> list[tuple[int, int]]:
    """``(senders, blocks of p)`` per round of a binomial scatter, the largest distance
    ``d`` first: the vranks ``0 mod 2d`` below ``p - d`` send, the root ``min(d, p - d)``."""
    distances = [1 << i for i in reversed(range(ceil_log2(p)))]
    return [(len(range(0, p - d, 2 * d)), min(d, p - d)) for d in distances]


def forced_segment() -> int:
    """``PYCOMM_SEGMENT_BYTES``, or 0 when the segment is left to the model (the default)."""
    return max(0, int(config.get("PYCOMM_SEGMENT_BYTES")))


def _messages(nbytes: float, variable: str) -> float:
    """Messages of a transfer of ``nbytes`` cut at ``variable``'s segment size."""
    return max(1.0, math.ceil(nbytes / max(1, config.get(variable))))


def _ring(n, p, s: Pricing, reduce: bool, messages: float = 1.0) -> float:
    """``p - 1`` exchange steps of ``n/p`` bytes, reduced when ``reduce``; a chunk sent as
    ``messages`` segments pays an α each but one wake-up (they arrive back to back)."""
    b = n / p
    return (p - 1) * (s.step(b, p, b if reduce else 0.0, True) + (messages - 1) * s.k.alpha)


def _fold(n, p, s: Pricing, reduce: bool) -> float:
    """A non-power-of-two ``p``'s fold into ``pof2_floor(p)`` ranks (``reduce``, in
    halving segments) or the result's copy out of it; 0 for a power of two."""
    extra = p - pof2_floor(p)
    if not extra:
        return 0.0
    if not reduce:
        return s.step(n, extra)
    return (s.step(n, extra, n)
            + (_messages(n, "PYCOMM_HALVING_SEGMENT_BYTES") - 1) * s.k.alpha)


def _halving(n, p, s: Pricing) -> float:
    """Recursive halving on the power-of-two group: ``log2 q`` exchanges of ``n/2``,
    ``n/4``, ... bytes, reduced, in segments (:mod:`pycomm.collectives.halving`)."""
    q, total = pof2_floor(p), 0.0
    for i in range(1, q.bit_length()):
        b = n / (1 << i)
        total += (s.step(b, q, b, True)
                  + (_messages(b, "PYCOMM_HALVING_SEGMENT_BYTES") - 1) * s.k.alpha)
    return total


def _doubling(n, p, s: Pricing, echo: bool = False) -> float:
    """Recursive doubling's all-gather on the power-of-two group, ``n/q`` bytes first;
    ``echo``: its first step echoes the last halving step segment by segment
    (:mod:`pycomm.collectives.halving`), a message per segment."""
    q, total = pof2_floor(p), 0.0
    for i in range(q.bit_length() - 1):
        b = n / q * (1 << i)
        total += s.step(b, q, exchange=True)
        if echo and i == 0:
            total += (_messages(b, "PYCOMM_HALVING_SEGMENT_BYTES") - 1) * s.k.alpha
    return total


def _tree(n, p, s: Pricing, reduce: bool = False) -> float:
    """Binomial broadcast of ``n`` bytes (``reduce``: the reduction, rounds reversed)."""
    return sum(s.step(n, m, n if reduce else 0.0) for m in binomial_rounds(p))


def _scatter(n, p, s: Pricing) -> float:
    """Binomial scatter (a gather costs the same, rounds reversed)."""
    return sum(s.step(n * blocks / p, m) for m, blocks in scatter_rounds(p))


def _linear(n, p, s: Pricing) -> float:
    """The root posts all ``p - 1`` transfers at once and copies them one after another."""
    return s.step() + (p - 2) * s.k.alpha + n * (p - 1) / p * s.k.beta


def _log_exchanges(p, s: Pricing, nbytes: float, reduced: float = 0.0) -> float:
    """``ceil(log2 p)`` exchange steps of every rank (dissemination, Bruck, scan)."""
    return ceil_log2(p) * s.step(nbytes, p, reduced, True)


def _bruck_allgather(n, p, s: Pricing) -> float:
    """Step ``i`` moves ``min(2^i, p - 2^i)`` blocks (recursive doubling's for a power
    of two, Bruck et al. 1997 for any ``p``)."""
    return sum(s.step(n / p * min(1 << i, p - (1 << i)), p, exchange=True)
               for i in range(ceil_log2(p)))


def _pipeline(n, p, s: Pricing, segment: float) -> float:
    """Chain broadcast in ``S = ceil(n / segment)`` segments, ``S + p - 2`` steps: in step
    ``t`` ``min(p - 1, t + 1)`` ranks receive; a middle rank sends and receives."""
    segments = max(1, math.ceil(n / segment))
    b = n / segments
    exchange = s.exchange if p > 2 else 0.0
    return (sum(s.step(b, t + 1) for t in range(p - 2)) + segments * s.step(b, p - 1)
            + (segments + p - 2) * exchange)


def pipeline_candidates(n: float) -> list[int]:
    """Segments a chain broadcast of ``n`` bytes may use: ``PYCOMM_SEGMENT_BYTES`` when
    set, else the powers of two from :data:`MIN_PIPELINE_SEGMENT` to the first holding ``n``."""
    forced = forced_segment()
    if forced:
        return [forced]
    out = [MIN_PIPELINE_SEGMENT]
    while out[-1] < n:
        out.append(2 * out[-1])
    return out


def _pipeline_segment(n, p, s: Pricing) -> int:
    """The candidate segment the model prices lowest: larger ones pay fewer messages,
    smaller ones fill the chain sooner (the closed form's optimum, ``sqrt((p-2) n β/α)``,
    is Open MPI's and MPICH's segmented pipelines' rule)."""
    return min(pipeline_candidates(n), key=lambda seg: _pipeline(n, p, s, seg))


def _double_binary_tree(n, p, s: Pricing) -> float:
    """NCCL's two trees, half the vector each, in segments: ``S + ceil(log2 p) + 1``
    steps, in each of which an inner rank waits for two children and a parent, sends
    about three segments and reduces two; every rank copies at once."""
    segment = forced_segment() or TREE_SEGMENT_BYTES
    segments = max(1.0, math.ceil(n / 2 / segment))
    b = n / 2 / segments
    alpha, beta = s.protocol(b)
    crowd = max(1.0, p / s.slots)
    return (segments + ceil_log2(p) + 1) * (4 * (alpha + s.wake)
                                            + (3 * b * beta + 2 * b * s.k.gamma) * crowd)


def _twod(n, p, s: Pricing, collective: str) -> float:
    """A 2-D schedule on the near-square grid ``R x C`` of ``p`` ranks
    (:mod:`pycomm.collectives.twod`), each phase at its cheapest candidate, a phase's
    rows (or columns) sharing the cores and lanes: the all-reduce's row reduce-scatter of
    ``n`` on ``C`` ranks, column all-reduce of ``n/C`` on ``R``, row all-gather; the
    all-gather's rows of ``n/R`` then columns of ``n``; the reduce-scatter's columns of
    ``n`` then rows of ``n/R``."""
    rows, cols = grid_2d(p)

    def best(coll, algorithms, b, q):
        if q <= 1:
            return 0.0
        if coll == "allgather" and q & (q - 1):
            algorithms = [a for a in algorithms if a != "recursive_doubling"]
        return min(SCHEDULES[(coll, a)](b, q, s.share(q, p)) for a in algorithms)
    if collective == "allgather":
        return (best("allgather", TWOD_GATHER, n / rows, cols)
                + best("allgather", TWOD_GATHER, n, rows))
    if collective != "allreduce":
        return (best("reduce_scatter", TWOD_ROW, n, rows)
                + best("reduce_scatter", TWOD_ROW, n / rows, cols))
    return (best("reduce_scatter", TWOD_ROW, n, cols)
            + best("allreduce", TWOD_COLUMN, n / cols, rows)
            + best("allgatherv", ("ring",), n, cols))


Schedule = Callable[[float, int, Pricing], float]

# (collective, algorithm) -> f(n bytes, p >= 2 ranks, pricing) -> seconds
SCHEDULES: dict[tuple[str, str], Schedule] = {
    ("barrier", "dissemination"): lambda n, p, s: _log_exchanges(p, s, 0.0),
    ("barrier", "binomial"): lambda n, p, s: 2 * ceil_log2(p) * s.step(),
    ("bcast", "binomial"): _tree,
    ("bcast", "scatter_allgather"): lambda n, p, s: _scatter(n, p, s) + _ring(n, p, s, False),
    ("bcast", "pipeline"): lambda n, p, s: _pipeline(n, p, s, _pipeline_segment(n, p, s)),
    ("reduce", "binomial"): lambda n, p, s: _tree(n, p, s, reduce=True),
    ("reduce", "rabenseifner"):
        lambda n, p, s: _fold(n, p, s, True) + _halving(n, p, s) + _scatter(n, pof2_floor(p), s),
    ("allreduce", "ring"):   # chunks in segments of PYCOMM_RING_SEGMENT_BYTES
        lambda n, p, s: (_ring(n, p, s, True, _messages(n / p, "PYCOMM_RING_SEGMENT_BYTES"))
                         + _ring(n, p, s, False, _messages(n / p, "PYCOMM_RING_SEGMENT_BYTES"))),
    ("allreduce", "rabenseifner"):
        lambda n, p, s: (_fold(n, p, s, True) + _halving(n, p, s) + _doubling(n, p, s, True)
                         + _fold(n, p, s, False)),
    ("allreduce", "recursive_doubling"):
        lambda n, p, s: (_fold(n, p, s, True) + _fold(n, p, s, False)
                         + (pof2_floor(p).bit_length() - 1) * s.step(n, pof2_floor(p), n, True)),
    ("allreduce", "binomial"): lambda n, p, s: _tree(n, p, s, reduce=True) + _tree(n, p, s),
    ("allreduce", "double_binary_tree"): _double_binary_tree,
    ("allgather", "ring"): lambda n, p, s: _ring(n, p, s, False),
    ("allgather", "recursive_doubling"): _bruck_allgather,
    ("allgather", "bruck"):   # + the rotation into place, a local copy of n
        lambda n, p, s: _bruck_allgather(n, p, s) + n * s.k.beta * max(1.0, p / s.slots),
    ("gather", "linear"): _linear,
    ("gather", "binomial"): _scatter,
    ("scatter", "linear"): _linear,
    ("scatter", "binomial"): _scatter,
    ("alltoall", "pairwise"): lambda n, p, s: _ring(n, p, s, False),
    ("alltoall", "bruck"): lambda n, p, s: _log_exchanges(p, s, n / 2),
    ("reduce_scatter", "ring"): lambda n, p, s: _ring(n, p, s, True),
    ("reduce_scatter", "pairwise"): lambda n, p, s: _ring(n, p, s, True),
    ("reduce_scatter", "recursive_halving"):
        lambda n, p, s: _fold(n, p, s, True) + _halving(n, p, s) + _fold(n / p, p, s, False),
    ("scan", "recursive_doubling"): lambda n, p, s: _log_exchanges(p, s, n, 2 * n),
    # the hierarchical schedules on one host (their local steps alone; across hosts
    # pycomm.tuning.cost_hosts prices them)
    ("allreduce", "hierarchical"): lambda n, p, s: _ring(n, p, s, True) + _ring(n, p, s, False),
    ("reduce", "hierarchical"): lambda n, p, s: _ring(n, p, s, True) + _linear(n, p, s),
    ("bcast", "hierarchical"): _tree,
    ("allgather", "hierarchical"): lambda n, p, s: _ring(n, p, s, False),
    ("barrier", "hierarchical"): lambda n, p, s: 2 * (p - 1) * s.step(),
}
# collectives priced as another: the v-variants, exscan, the equal-block reduce-scatter
for _twin, _of in (("allgatherv", "allgather"), ("gatherv", "gather"), ("scatterv", "scatter"),
                   ("alltoallv", "alltoall"), ("exscan", "scan"),
                   ("reduce_scatter_block", "reduce_scatter")):
    SCHEDULES.update({(_twin, a): f for (c, a), f in list(SCHEDULES.items()) if c == _of})
for _coll in ("allreduce", "allgather", "reduce_scatter", "reduce_scatter_block"):
    SCHEDULES[(_coll, "2d")] = lambda n, p, s, _c=_coll: _twod(n, p, s, _c)


def cost(collective: str, algorithm: str, nbytes: int, size: int,
         transport: str = DEFAULT_TRANSPORT, oversubscription: float = 1.0) -> float:
    """Modelled seconds of one call of ``nbytes`` (as :func:`pycomm.collectives.choose`
    counts them) on ``size`` ranks, ``oversubscription`` ranks per core (> 1: more ranks
    than cores), with ``transport``'s constants.

    Raises:
        KeyError: the model has no price for the pair.
    """
    schedule = SCHEDULES[(collective, algorithm)]
    if size <= 1:
        return 0.0
    return schedule(float(nbytes), size, pricing(transport, nbytes, size, oversubscription))


def segment_bytes(collective: str, algorithm: str, nbytes: int, size: int,
                  transport: str = DEFAULT_TRANSPORT,
                  oversubscription: float = 1.0) -> int | None:
    """The segment (bytes) the model prices the chain broadcast (``bcast``/``pipeline``)
    with, which :func:`pycomm.collectives.choose` binds to the schedule so that it runs
    what was priced; None for every other schedule. The same on every rank."""
    if (collective, algorithm) != ("bcast", "pipeline"):
        return None
    if size <= 1:
        return pipeline_candidates(float(nbytes))[0]
    return _pipeline_segment(float(nbytes), size,
                             pricing(transport, nbytes, size, oversubscription))
