"""The α-β-γ-σ cost model the automatic algorithm choice minimises.

Modelled time of one call = ``α`` per message on the critical path + ``β`` per byte moved
+ ``γ`` per byte reduced + ``σ`` per byte of freshly allocated scratch (the formulas are
those of Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", and of each algorithm's module docstring, plus the σ term; pipelined
schedules also read the segment size ``PYCOMM_SEGMENT_BYTES``). Each formula takes ``n``,
the bytes of the call as defined in :func:`pycomm.algorithms.choose`, ``p``, the number of
ranks, and the transport's :class:`Constants`, and returns seconds. Only the ranking
matters: constants shift the crossovers, not the shapes.

Why σ: numpy scratch buffers come from fresh pages whose first touch page-faults; it is
what separates Rabenseifner (scratch ``n/2``) from the ring (scratch ``n/p``) at large
``n``, where α-β-γ alone calls them even.

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
from dataclasses import dataclass
from collections.abc import Callable

from pycomm import config
from pycomm.algorithms.topology import ceil_log2, pof2_floor
from pycomm.errors import ArgumentError

__all__ = ["Constants", "FORMULAS", "DEFAULT_TRANSPORT", "SHIPPED_TABLE", "constants", "cost",
           "load_table"]

DEFAULT_TRANSPORT = "shm"
SHIPPED_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned.json")


@dataclass(frozen=True)
class Constants:
    """Cost-model constants of one transport (seconds, seconds per byte)."""

    alpha: float   # s per message (latency, incl. Python overhead per p2p call)
    beta: float    # s per byte moved between two ranks
    gamma: float   # s per byte combined by a reduction op
    sigma: float   # s per byte of newly allocated scratch (first-touch page faults)
    wake: float = 0.0  # extra s per message when ranks outnumber cores (waking a sleeper)


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
        except (TypeError, ValueError):
            raise ArgumentError(f"cost-model table {path!r}: entry {transport!r} has a "
                                "non-numeric wake") from None
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
    """Fold in and out for a non-power-of-two p (Thakur et al. 2005, 4.3); else 0."""
    return 2 * k.alpha + 2 * n * k.beta + n * k.gamma if _folds(p) else 0.0


def _pipeline(n: float, p: int, k: Constants) -> float:
    segs = max(1.0, math.ceil(n / _segment()))
    return (p - 2 + segs) * (k.alpha + n / segs * k.beta)


def _double_tree(n: float, p: int, k: Constants) -> float:
    # S + L + 1 steps (the schedule's lag is L + 1); per step an inner rank waits for two
    # children and a parent and sends about three segments of b bytes. Every step is a
    # synchronisation with tree neighbours, which is what makes it slow in Python.
    segs = max(1.0, math.ceil(n / 2 / _segment()))
    b = n / 2 / segs  # bytes per segment per tree
    return (segs + _lg(p) + 1) * (4 * k.alpha + 3 * b * k.beta + 2 * b * k.gamma)


def _reduce_binomial(n: float, p: int, k: Constants) -> float:
    return _lg(p) * (k.alpha + n * k.beta + n * k.gamma) + n * k.sigma


def _bcast_binomial(n: float, p: int, k: Constants) -> float:
    return _lg(p) * (k.alpha + n * k.beta)


def _halving(n: float, p: int, k: Constants) -> float:
    """Recursive-halving reduce-scatter over the power-of-two group."""
    return _lq(p) * k.alpha + n * _qfrac(p) * (k.beta + k.gamma)


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
                         + (n if _folds(p) else n / 2) * k.sigma
                         + (k.alpha + n * k.beta + n * k.gamma if _folds(p) else 0.0)),
    ("allreduce", "ring"):
        lambda n, p, k: (2 * (p - 1) * k.alpha + 2 * n * _frac(p) * k.beta
                         + n * _frac(p) * k.gamma + n / p * k.sigma),
    ("allreduce", "rabenseifner"):
        lambda n, p, k: (_halving(n, p, k) + _lq(p) * k.alpha + n * _qfrac(p) * k.beta
                         + (n if _folds(p) else n / 2) * k.sigma + _fold(n, p, k)),
    ("allreduce", "recursive_doubling"):
        lambda n, p, k: (_lq(p) * (k.alpha + n * k.beta + n * k.gamma) + n * k.sigma
                         + _fold(n, p, k)),
    ("allreduce", "binomial"):
        lambda n, p, k: _reduce_binomial(n, p, k) + _bcast_binomial(n, p, k),
    ("allreduce", "double_binary_tree"): _double_tree,
    ("allgather", "ring"): lambda n, p, k: (p - 1) * k.alpha + n * _frac(p) * k.beta,
    ("allgather", "recursive_doubling"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta,
    ("allgather", "bruck"):
        lambda n, p, k: _lg(p) * k.alpha + n * _frac(p) * k.beta + n * k.sigma,
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
        lambda n, p, k: (_halving(n, p, k) + (2 * n if _folds(p) else 1.5 * n) * k.sigma
                         + (2 * k.alpha + n * k.beta + n * k.gamma if _folds(p) else 0.0)),
    ("scan", "recursive_doubling"):
        lambda n, p, k: _lg(p) * (k.alpha + n * k.beta + 2 * n * k.gamma) + 2 * n * k.sigma,
    ("exscan", "recursive_doubling"):
        lambda n, p, k: _lg(p) * (k.alpha + n * k.beta + 2 * n * k.gamma) + 2 * n * k.sigma,
}
for _alg in ("ring", "pairwise", "recursive_halving"):
    FORMULAS[("reduce_scatter_block", _alg)] = FORMULAS[("reduce_scatter", _alg)]


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
            cores). Then every message also pays ``wake`` (its receiver must be woken and
            scheduled) and copies and reductions share cores, so β, γ and σ scale by it.

    Raises:
        KeyError: the model has no formula for the pair.
    """
    formula = FORMULAS[(collective, algorithm)]
    if size <= 1:
        return 0.0
    k = constants(transport)
    if oversubscription > 1.0:
        f = oversubscription
        k = Constants(alpha=k.alpha + k.wake, beta=k.beta * f, gamma=k.gamma * f,
                      sigma=k.sigma * f, wake=k.wake)
    return formula(float(nbytes), size, k)
