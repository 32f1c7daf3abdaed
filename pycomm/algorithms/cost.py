"""The α-β-γ-σ cost model the automatic algorithm choice minimises.

Modelled time of one call = ``α`` per message on the critical path + ``β`` per byte moved
+ ``γ`` per byte reduced + ``σ`` per byte of freshly allocated scratch, where a message
larger than the eager limit pays the rendezvous protocol's ``α_rndv`` and ``β_rndv``
instead (two regimes of one Hockney line, as NCCL's tuner keeps a latency and a bandwidth
per protocol in ``graph/tuning.cc``; the formulas are
those of Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", and of each algorithm's module docstring, plus the σ term; pipelined
schedules also read the segment size ``PYCOMM_SEGMENT_BYTES``). Each formula takes ``n``,
the bytes of the call as defined in :func:`pycomm.algorithms.choose`, ``p``, the number of
ranks, and the transport's :class:`Constants`, and returns seconds. Only the ranking
matters: constants shift the crossovers, not the shapes.

The closed forms (:data:`FORMULAS`) document each algorithm; the choice evaluates the
same schedules step by step (:data:`SCHEDULES`), which prices each message by its protocol
and, when ranks outnumber cores (``oversubscription > 1``), makes a step pay a measured
wake-up per turn of the cores it needs while concurrent copies and reductions share the
cores: see the comment above :data:`SCHEDULES`.

Why σ: numpy scratch buffers come from fresh pages whose first touch page-faults; it is
what separates recursive doubling (scratch ``n``) from the segmented schedules (ring,
Rabenseifner: scratch two segments) at large ``n``. (Scratch of 1 MiB and more is reused
between calls, :mod:`pycomm.algorithms.scratch`, so the measured σ is near 0.)

Constants: one :class:`Constants` per transport, measured by ``python -m pycomm.tune`` (see
:mod:`pycomm.tune`). The table shipped in ``pycomm/algorithms/tuned.json`` records the run
it came from under ``"source"``; ``PYCOMM_TUNE_FILE`` points to a user table instead (a
transport missing there falls back to the shipped table). Transports without an entry use
``shm``'s constants.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from collections.abc import Callable

from pycomm import config
from pycomm.algorithms.topology import ceil_log2, pof2_floor
from pycomm.errors import ArgumentError

__all__ = ["Constants", "FORMULAS", "SCHEDULES", "DEFAULT_TRANSPORT", "SHIPPED_TABLE",
           "constants", "cost", "load_table"]

DEFAULT_TRANSPORT = "shm"
SHIPPED_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned.json")


@dataclass(frozen=True)
class Constants:
    """Cost-model constants of one transport (seconds, seconds per byte).

    ``alpha`` and ``beta`` price a message sent eagerly (up to ``eager`` bytes);
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
    eager: float = math.inf  # bytes: larger messages go by rendezvous (PYCOMM_EAGER_LIMIT)


# Used only when the shipped table is missing or unreadable (e.g. a broken install):
# first estimates for shared memory on a 2-core machine.
FALLBACK = Constants(alpha=8e-6, beta=1 / 6e9, gamma=1 / 4e9, sigma=1 / 5e9)

_tables: dict[str, dict[str, Constants]] = {}


def _parse(path: str) -> dict[str, Constants]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"cost-model table {path!r} cannot be read: {exc}; write one "
                            "with python -m pycomm.tune --out FILE") from None
    table = {}
    for transport, entry in raw.items():
        if transport == "source":
            continue
        try:
            values = {k: float(entry[k]) for k in ("alpha", "beta", "gamma", "sigma")}
        except (TypeError, KeyError, ValueError):
            raise ArgumentError(f"cost-model table {path!r}: entry {transport!r} needs numeric "
                                "alpha, beta, gamma and sigma") from None
        if not all(math.isfinite(v) and v >= 0 for v in values.values()):
            raise ArgumentError(f"cost-model table {path!r}: entry {transport!r} has a "
                                f"negative or non-finite constant: {values}")
        try:
            values["wake"] = float(entry.get("wake", 0.0))
            for name in ("alpha_rndv", "beta_rndv"):  # tables from before: eager figures
                values[name] = float(entry.get(name, values[name.split("_")[0]]))
        except (TypeError, ValueError):
            raise ArgumentError(f"cost-model table {path!r}: entry {transport!r} has a "
                                "non-numeric wake, alpha_rndv or beta_rndv") from None
        if not all(math.isfinite(values[n]) and values[n] >= 0
                   for n in ("wake", "alpha_rndv", "beta_rndv")):
            raise ArgumentError(f"cost-model table {path!r}: entry {transport!r} has a "
                                f"negative or non-finite constant: {values}")
        table[transport] = Constants(**values)
    return table


def load_table(path: str | None = None) -> dict[str, Constants]:
    """Return ``{transport: Constants}`` from ``path`` merged over the shipped table.

    Args:
        path: a JSON table as written by ``python -m pycomm.tune``; None reads
            ``PYCOMM_TUNE_FILE`` (unset: the shipped table alone). Results are cached
            per path.

    Raises:
        ArgumentError: the file cannot be read or an entry is malformed (the message
            names the file).
    """
    if path is None:
        path = config.get("PYCOMM_TUNE_FILE") or ""
    hit = _tables.get(path)
    if hit is None:
        try:
            hit = _parse(SHIPPED_TABLE)
        except ArgumentError:
            hit = {}
        hit.setdefault(DEFAULT_TRANSPORT, FALLBACK)
        if path:
            hit = {**hit, **_parse(path)}
        _tables[path] = hit
    return hit


def constants(transport: str = DEFAULT_TRANSPORT) -> Constants:
    """Return the constants of ``transport`` (``shm``'s when the table has none for it)."""
    table = load_table()
    return table.get(transport) or table[DEFAULT_TRANSPORT]


def _segment() -> float:
    return float(max(1, config.get("PYCOMM_SEGMENT_BYTES")))


def _ring_segs(n: float, p: int) -> float:
    """Messages per chunk of the segmented ring all-reduce (``PYCOMM_RING_SEGMENT_BYTES``)."""
    return max(1.0, math.ceil(n / p / max(1, config.get("PYCOMM_RING_SEGMENT_BYTES"))))


def _ring_scratch(n: float, p: int) -> float:
    """Scratch bytes of the segmented ring all-reduce: two segments of a chunk."""
    return 2.0 * min(n / p, max(1, config.get("PYCOMM_RING_SEGMENT_BYTES")))


def _hsegs(b: float) -> float:
    """Messages of a segmented halving or fold exchange of ``b`` bytes
    (``PYCOMM_HALVING_SEGMENT_BYTES``)."""
    return max(1.0, math.ceil(b / max(1, config.get("PYCOMM_HALVING_SEGMENT_BYTES"))))


def _pipe_scratch(b: float) -> float:
    """Scratch bytes of the segmented halving exchanges receiving at most ``b`` bytes."""
    return 2.0 * min(b, max(1, config.get("PYCOMM_HALVING_SEGMENT_BYTES")))


def _halving_scratch(n: float, p: int) -> float:
    """Scratch of the halving schedules: the fold receives ``n``, the first halving ``n/2``."""
    return _pipe_scratch(n if _folds(p) else n / 2)


def _lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree."""
    return ceil_log2(p)


def _lq(p: int) -> int:
    """log2 of the power-of-two group left after the fold."""
    return pof2_floor(p).bit_length() - 1


def _frac(p: int) -> float:
    return (p - 1) / p


def _qfrac(p: int) -> float:
    q = pof2_floor(p)
    return (q - 1) / q


def _folds(p: int) -> bool:
    return pof2_floor(p) != p


def _fold(n: float, p: int, k: Constants) -> float:
    """Fold in (segmented) and out for a non-power-of-two p (Thakur et al. 2005, 4.3);
    else 0."""
    return (_hsegs(n) + 1) * k.alpha + 2 * n * k.beta + n * k.gamma if _folds(p) else 0.0


def _pipeline(n: float, p: int, k: Constants) -> float:
    segs = max(1.0, math.ceil(n / _segment()))
    return (p - 2 + segs) * (k.alpha + n / segs * k.beta)


def _protocol(k: Constants, nbytes: float) -> tuple[float, float]:
    """``(α, β)`` of one message of ``nbytes``: eager up to ``k.eager``, else rendezvous."""
    if nbytes > k.eager:
        return k.alpha_rndv, k.beta_rndv
    return k.alpha, k.beta


def _double_tree(n: float, p: int, k: Constants) -> float:
    # S + L + 1 steps (the schedule's lag is L + 1); per step an inner rank waits for two
    # children and a parent and sends about three segments of b bytes. Every step is a
    # synchronisation with tree neighbours, which is what makes it slow in Python.
    segs = max(1.0, math.ceil(n / 2 / _segment()))
    b = n / 2 / segs  # bytes per segment per tree
    alpha, beta = _protocol(k, b)
    return (segs + _lg(p) + 1) * (4 * alpha + 3 * b * beta + 2 * b * k.gamma)


def _reduce_binomial(n: float, p: int, k: Constants) -> float:
    return _lg(p) * (k.alpha + n * k.beta + n * k.gamma) + n * k.sigma


def _bcast_binomial(n: float, p: int, k: Constants) -> float:
    return _lg(p) * (k.alpha + n * k.beta)


def _halving(n: float, p: int, k: Constants) -> float:
    """Recursive-halving reduce-scatter over the power-of-two group, each exchange of
    ``b`` bytes sent as ``ceil(b / s)`` segments."""
    return (sum(_hsegs(n / 2 ** i) for i in range(1, _lq(p) + 1)) * k.alpha
            + n * _qfrac(p) * (k.beta + k.gamma))


Formula = Callable[[float, int, Constants], float]

# (collective, algorithm) -> f(n bytes, p ranks, constants) -> seconds, for p >= 2.
FORMULAS: dict[tuple[str, str], Formula] = {
    ("barrier", "dissemination"): lambda n, p, k: _lg(p) * k.alpha,
    ("barrier", "binomial"): lambda n, p, k: 2 * _lg(p) * k.alpha,
    ("bcast", "binomial"): _bcast_binomial,
    ("bcast", "scatter_allgather"):
        lambda n, p, k: (_lg(p) + p - 1) * k.alpha + 2 * n * _frac(p) * k.beta,
    ("bcast", "pipeline"): _pipeline,
    ("reduce", "binomial"): _reduce_binomial,
    ("reduce", "rabenseifner"):
        lambda n, p, k: (_halving(n, p, k) + _lq(p) * k.alpha + n * _qfrac(p) * k.beta
                         + _halving_scratch(n, p) * k.sigma
                         + (_hsegs(n) * k.alpha + n * k.beta + n * k.gamma if _folds(p)
                            else 0.0)),
    ("allreduce", "ring"):
        lambda n, p, k: (2 * (p - 1) * _ring_segs(n, p) * k.alpha + 2 * n * _frac(p) * k.beta
                         + n * _frac(p) * k.gamma + _ring_scratch(n, p) * k.sigma),
    ("allreduce", "rabenseifner"):
        lambda n, p, k: (_halving(n, p, k) + _lq(p) * k.alpha + n * _qfrac(p) * k.beta
                         + _halving_scratch(n, p) * k.sigma + _fold(n, p, k)),
    ("allreduce", "recursive_doubling"):
        lambda n, p, k: (_lq(p) * (k.alpha + n * k.beta + n * k.gamma)
                         + (n + (_pipe_scratch(n) if _folds(p) else 0.0)) * k.sigma
                         + _fold(n, p, k)),
    ("allreduce", "binomial"):
        lambda n, p, k: _reduce_binomial(n, p, k) + _bcast_binomial(n, p, k),
    ("allreduce", "double_binary_tree"): _double_tree,
    ("allgather", "ring"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("allgather", "recursive_doubling"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta,
    ("allgather", "bruck"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta + n * (k.beta + k.sigma),
    ("allgatherv", "ring"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("gather", "linear"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("gather", "binomial"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta + n * k.sigma,
    ("gatherv", "linear"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("scatter", "linear"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("scatter", "binomial"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta + n * k.sigma,
    ("scatterv", "linear"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("alltoall", "pairwise"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("alltoall", "bruck"):
        lambda n, p, k: _lg(p) * (k.alpha + n / 2 * k.beta) + 2 * n * k.sigma,
    ("alltoallv", "pairwise"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("reduce_scatter", "ring"):
        lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * (k.beta + k.gamma) + n / p * k.sigma,
    ("reduce_scatter", "pairwise"):
        lambda n, p, k: ((p - 1) * k.alpha + n * _frac(p) * (k.beta + k.gamma)
                         + 2 * n / p * k.sigma),
    ("reduce_scatter", "recursive_halving"):
        lambda n, p, k: (_halving(n, p, k) + (n + _halving_scratch(n, p)) * k.sigma
                         + ((_hsegs(n) + 1) * k.alpha + (n + n / p) * k.beta + n * k.gamma
                            if _folds(p) else 0.0)),
    ("scan", "recursive_doubling"):
        lambda n, p, k: _lg(p) * (k.alpha + n * k.beta + 2 * n * k.gamma) + 2 * n * k.sigma,
    ("exscan", "recursive_doubling"):
        lambda n, p, k: _lg(p) * (k.alpha + n * k.beta + 2 * n * k.gamma) + 2 * n * k.sigma,
}
for _alg in ("ring", "pairwise", "recursive_halving"):
    FORMULAS[("reduce_scatter_block", _alg)] = FORMULAS[("reduce_scatter", _alg)]



# ---------------------------------------------------------------------------------------
# Oversubscribed hosts: a step-by-step model.
#
# When ranks outnumber cores, the closed forms above mislead: they assume every rank runs
# whenever it has work. On ``c`` cores, a step of a schedule in which ``a`` ranks take part
# needs ``a / c`` turns of the cores to let each of them run, and ``m`` copies (or
# reductions) that would run side by side on ``m`` cores share ``c`` of them. A binomial
# tree, whose early rounds involve 2 or 4 ranks, therefore keeps whole cores to itself
# where a ring, in which all ``p`` ranks are busy at every step, shares them at every step.
# So each schedule is written out below as its sequence of steps; a step costs
#
#     α + wake · max(1, a / c)  +  b β · max(1, m / c)  +  r γ · max(1, m_r / c)
#
# for ``a`` ranks taking part, ``m`` concurrent copies of ``b`` bytes (a shared-memory
# rendezvous copies once, on the receiver's core) and ``m_r`` concurrent reductions of
# ``r`` bytes. ``wake`` is the measured cost of handing the core to a waiting rank
# (``pycomm.tune``'s token ring; the waiter yields its core, then sleeps: see
# :mod:`pycomm.waiting`). No fitted constant enters: α, β, γ, σ and wake are measured.
# ---------------------------------------------------------------------------------------


def _share(m: float, cores: float) -> float:
    return 1.0 if m <= cores else m / cores


def _step(k: Constants, c: float, active: float, copy: float = 0.0, copies: float = 0,
          red: float = 0.0, reducers: float = 0) -> float:
    """Seconds of one synchronous step on ``c`` cores (see the comment above)."""
    alpha, beta = _protocol(k, copy)
    return (alpha + k.wake * max(1.0, active / c) + copy * beta * _share(copies, c)
            + red * k.gamma * _share(reducers, c))


def _rounds(p: int) -> list[int]:
    """Concurrent transfers in each round of a binomial tree on ``p`` ranks (1, 2, 4, ...)."""
    out, k = [], 1
    while k < p:
        out.append(min(k, p - k))
        k *= 2
    return out


def _o_bcast_binomial(n, p, k, c):
    return sum(_step(k, c, 2 * m, n, m) for m in _rounds(p))


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
    return sum(_step(k, c, 2 * m, n * blocks / p, m) for m, blocks in _subtree_rounds(p))


def _o_ring_steps(n, p, k, c, reduce: bool, segs: float = 1.0) -> float:
    # A step moves a chunk as ``segs`` segments: a message overhead each, but one wake-up
    # per step, since a pipelined chunk's segments arrive back to back. (A wake-up per
    # segment ranked the segmented ring 25% behind Rabenseifner at 16-64 MiB on 4 ranks;
    # the sweep measured it 12-15% ahead.)
    b = n / p
    return (p - 1) * (_step(k, c, p, b, p, b if reduce else 0.0, p if reduce else 0)
                      + (segs - 1) * k.alpha)


def _o_fold(n, p, k, c, reduce: bool) -> float:
    r = p - pof2_floor(p)
    if not r:
        return 0.0
    if reduce:  # the fold in: segmented, one wake-up (see _o_ring_steps)
        return _step(k, c, 2 * r, n, r, n, r) + (_hsegs(n) - 1) * k.alpha
    return _step(k, c, 2 * r, n, r)


def _o_halving(n, p, k, c) -> float:
    q, t, b = pof2_floor(p), 0.0, float(n)
    for _ in range(_lq(p)):
        b /= 2
        t += _step(k, c, q, b, q, b, q) + (_hsegs(b) - 1) * k.alpha
    return t


def _o_doubling(n, p, k, c) -> float:
    q, t, b = pof2_floor(p), 0.0, n / pof2_floor(p)
    for _ in range(_lq(p)):
        t += _step(k, c, q, b, q)
        b *= 2
    return t


def _o_reduce_binomial(n, p, k, c):
    return sum(_step(k, c, 2 * m, n, m, n, m) for m in reversed(_rounds(p))) + n * k.sigma


def _o_gather_steps(n, p, k, c):
    # the scatter's rounds backwards: leaves first, the root's largest subtree last
    return sum(_step(k, c, 2 * m, n * blocks / p, m) for m, blocks in reversed(_subtree_rounds(p)))


def _o_gather_binomial(n, p, k, c):
    return _o_gather_steps(n, p, k, c) + n * k.sigma


def _o_linear(n, p, k, c):
    # the root posts all p-1 transfers; the peers wake together, the root copies serially
    return _step(k, c, p) + (p - 2) * k.alpha + n * _frac(p) * k.beta


SCHEDULES: dict[tuple[str, str], Callable[[float, int, Constants, float], float]] = {
    ("barrier", "dissemination"): lambda n, p, k, c: _lg(p) * _step(k, c, p),
    ("barrier", "binomial"): lambda n, p, k, c: 2 * sum(_step(k, c, 2 * m) for m in _rounds(p)),
    ("bcast", "binomial"): _o_bcast_binomial,
    ("bcast", "scatter_allgather"):
        lambda n, p, k, c: _o_scatter_binomial(n, p, k, c) + _o_ring_steps(n, p, k, c, False),
    ("bcast", "pipeline"):
        lambda n, p, k, c: sum(
            _step(k, c, min(p, s + 2), n / max(1.0, math.ceil(n / _segment())), min(p - 1, s + 1))
            for s in range(int(max(1.0, math.ceil(n / _segment()))) + p - 2)),
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
                            + _o_doubling(n, p, k, c) + _halving_scratch(n, p) * k.sigma),
    ("allreduce", "recursive_doubling"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_fold(n, p, k, c, False)
                            + (n + (_pipe_scratch(n) if _folds(p) else 0.0)) * k.sigma
                            + _lq(p) * _step(k, c, pof2_floor(p), n, pof2_floor(p), n,
                                             pof2_floor(p))),
    ("allreduce", "binomial"):
        lambda n, p, k, c: _o_reduce_binomial(n, p, k, c) + _o_bcast_binomial(n, p, k, c),
    ("allgather", "ring"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("allgather", "recursive_doubling"):
        lambda n, p, k, c: sum(_step(k, c, p, n / p * min(2 ** i, p - 2 ** i), p)
                               for i in range(_lg(p))),
    ("allgather", "bruck"):
        lambda n, p, k, c: (sum(_step(k, c, p, n / p * min(2 ** i, p - 2 ** i), p)
                                for i in range(_lg(p)))
                            + n * (k.beta * _share(p, c) + k.sigma)),
    ("allgatherv", "ring"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("gather", "linear"): _o_linear,
    ("gather", "binomial"): _o_gather_binomial,
    ("scatter", "linear"): _o_linear,
    ("scatter", "binomial"): lambda n, p, k, c: _o_scatter_binomial(n, p, k, c) + n * k.sigma,
    ("alltoall", "pairwise"): lambda n, p, k, c: _o_ring_steps(n, p, k, c, False),
    ("alltoall", "bruck"):
        lambda n, p, k, c: _lg(p) * _step(k, c, p, n / 2, p) + 2 * n * k.sigma,
    ("reduce_scatter", "ring"):
        lambda n, p, k, c: _o_ring_steps(n, p, k, c, True) + n / p * k.sigma,
    ("reduce_scatter", "pairwise"):
        lambda n, p, k, c: _o_ring_steps(n, p, k, c, True) + 2 * n / p * k.sigma,
    ("reduce_scatter", "recursive_halving"):
        lambda n, p, k, c: (_o_fold(n, p, k, c, True) + _o_halving(n, p, k, c)
                            + _o_fold(n / p, p, k, c, False)
                            + (n + _halving_scratch(n, p)) * k.sigma),
    ("scan", "recursive_doubling"):
        lambda n, p, k, c: _lg(p) * _step(k, c, p, n, p, 2 * n, p) + 2 * n * k.sigma,
    ("exscan", "recursive_doubling"):
        lambda n, p, k, c: _lg(p) * _step(k, c, p, n, p, 2 * n, p) + 2 * n * k.sigma,
}
for _alg in ("ring", "pairwise", "recursive_halving"):
    SCHEDULES[("reduce_scatter_block", _alg)] = SCHEDULES[("reduce_scatter", _alg)]


def cost(collective: str, algorithm: str, nbytes: int, size: int,
         transport: str = DEFAULT_TRANSPORT, oversubscription: float = 1.0) -> float:
    """Return the modelled seconds of one call.

    Args:
        collective: e.g. ``"allreduce"``.
        algorithm: e.g. ``"ring"``.
        nbytes: bytes of the call (see :func:`pycomm.algorithms.choose`), ``>= 0``.
        size: number of ranks, ``>= 1``.
        transport: whose constants to use (``"shm"``, ``"tcp"``; others use ``shm``'s).
        oversubscription: ranks per core on the busiest host (> 1: more ranks than
            cores, ``size / oversubscription`` cores in all). Then every step of the
            schedule pays ``wake`` once per turn of the cores its ranks need, and
            concurrent copies and reductions share the cores. Pairs without a step model
            scale β, γ and σ by ``oversubscription`` and add ``wake`` to every message.

    Pairs with a step model (:data:`SCHEDULES`) are always costed step by step, so that
    each message is priced by the protocol it goes by: ``alpha``/``beta`` up to
    ``PYCOMM_EAGER_LIMIT`` bytes, ``alpha_rndv``/``beta_rndv`` above. With a core per rank
    and one protocol that sum is the closed form of :data:`FORMULAS`.

    Raises:
        KeyError: the model has no formula for the pair.
    """
    formula = FORMULAS[(collective, algorithm)]
    if size <= 1:
        return 0.0
    k = constants(transport)
    if k.alpha_rndv is not None:  # each message priced by the protocol it goes by
        k = replace(k, eager=float(config.get("PYCOMM_EAGER_LIMIT")))
    schedule = SCHEDULES.get((collective, algorithm))
    if schedule is not None:
        if oversubscription > 1.0:
            return schedule(float(nbytes), size, k, size / oversubscription)
        return schedule(float(nbytes), size, replace(k, wake=0.0), float(size))
    if oversubscription > 1.0:
        # no step model (double_binary_tree, the v-variants' single algorithms): every
        # message wakes a sleeper and every byte shares a core
        f = oversubscription
        k = Constants(alpha=k.alpha + k.wake, beta=k.beta * f, gamma=k.gamma * f,
                      sigma=k.sigma * f, wake=k.wake)
    return formula(float(nbytes), size, k)
